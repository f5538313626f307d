import Foundation
import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// A peer that joins holding older copies of documents its new peers changed since (it was away,
/// or it got them from a node that lags). Found by the resource-growth probe: 50 shells in a
/// full mesh, each observing a 200-document query, and a new peer every second that had just
/// copied 1,000 documents from the busiest node. Every shell found the newcomer behind on about
/// 100 documents and logged each again so that the newer state would reach it: every other
/// shell then received those 100 documents from every shell (about 250,000 states a second for
/// nothing), the shells' live queries reported each as updated with the same value, and the
/// shells fell 15 s behind the writes they observed.
@Suite struct StalePeerRelogTests {
    /// `a` holds 100 documents; six nodes in a full mesh with `a` observe the 20 with `n < 20`;
    /// `c` copies `n < 100` from `a` alone, leaves, misses a change to the 20, and comes back
    /// connected to every node. Its old copies reach each of the six (they ask it for `n < 20`),
    /// and each holds newer states of all 20.
    @Test func aPeerBehindIsAnsweredByItsOwnScansNotByRelogsEveryPeerReceives() throws {
        let sim = try Simulation(seed: 9300)
        sim.tracing = false
        // No relays: only what each node asks for itself moves, so what is counted is the answer to c.
        sim.replicatorConfiguration = { $0.maxHops = 0 }
        let a = try sim.addNode("a")
        let observers = try (1...6).map { try sim.addNode("o\($0)") }
        let c = try sim.addNode("c")
        try a.store.collection("items").upsert((0..<100).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] })
        let subscriptions =
            [try a.store.collection("items").findAll().subscribe()]
            + (try observers.map { try $0.store.collection("items").find("n < 20").subscribe() })
            + [try c.store.collection("items").find("n < 100").subscribe()]
        defer { subscriptions.forEach { $0.cancel() } }
        let mesh = [a] + observers
        for (i, x) in mesh.enumerated() { for y in mesh[(i + 1)...] { sim.connect(x, y) } }
        sim.connect(c, a)
        try sim.runUntilQuiet()
        #expect(try c.store.collection("items").findAll().count() == 100)

        sim.setLink(c, a, up: false)
        for i in 0..<20 { try observers[0].store.collection("items").upsert(["_id": .string("d\(i)"), "tick": 1]) }
        try sim.runUntilQuiet()

        let sentBefore = sim.documentsSent
        for node in observers { sim.connect(c, node) }
        sim.setLink(c, a, up: true)
        try sim.runUntilQuiet()
        for i in 0..<20 {
            let tick = try c.store.collection("items").findByID(.string("d\(i)")).exec()?["tick"]
            #expect(tick == 1, "c holds d\(i) with tick \(String(describing: tick))")
        }
        for node in mesh {
            let ticks = try node.store.collection("items").find("tick == 1").count()
            #expect(ticks == 20, "\(node.name) holds \(ticks) with tick 1")
        }
        // What the rejoin must send: c's copies to the six (20 each) and to `a` (what its
        // whole-collection subscription finds after its checkpoint), the six's and `a`'s answers
        // to c's `n < 100`, and what c then passes on of what it merged: 380 documents. When each
        // of the seven logged the 20 again for c, every other of them read them again: 620.
        let sent = sim.documentsSent - sentBefore
        #expect(sent <= 400, "\(sent) documents sent when c came back")
    }
}
