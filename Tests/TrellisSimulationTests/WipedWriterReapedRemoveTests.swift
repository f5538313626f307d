import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// Simulator seed 9100335 (`trellis simulate --replay 9100335 --nodes 3-8 --steps 120 --queries 3
/// --ttl 120000 --widen --two-queries`), found on 2026-12-06: a node that re-creates by a local
/// write an `_id` removed and reaped elsewhere must still get the reaped remove
/// (docs/DATA-MODEL.md, "A subscriber from 0 that holds rows").
///
/// W — S — N: N subscribes to the whole collection through S, which asks only `v >= 5` for
/// itself. W removes d1; every node reaps its tombstone after the TTL. N comes back with a wiped
/// store and asks S from 0 without `h` (it holds nothing), and its checkpoint on S says so
/// (`notAsked`). Then N upserts d1 as a new document. What N shows is right either way (its
/// write is newer than the remove); before the fix its state lacked the remove, so a stale copy
/// of the old d1 arriving later would have shown the removed fields on N.
@Suite struct WipedWriterReapedRemoveTests: StaleCopyChecks {
    static let ttl: Millis = 120_000

    enum Write: CaseIterable, Sendable {
        /// N creates d1 while connected to S.
        case createdConnected
        /// N creates d1 while cut off from S, then restarts before it meets S again: the mark
        /// on its checkpoint is in the store, not only in the sync engine's memory.
        case createdAwayThenRestarted
        /// N updates d2, which it holds from S: nothing new, so its request stays without `h`.
        case updatedHeld
    }

    struct Mesh {
        let sim: Simulation
        let w: SimulatedNode
        let s: SimulatedNode
        let n: SimulatedNode
        var subs: [Subscription]
    }

    /// Everything up to N's wiped restart, synced again with S (holding d2 only); without
    /// `settled`, returned right after the restart, before N asked S anything.
    static func wipedN(settled: Bool = true) throws -> Mesh {
        let sim = try Simulation(seed: 9_100_335)
        sim.storeOptions.tombstoneTTL = UInt64(ttl)
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        let n = try sim.addNode("n")
        sim.connect(s, w)
        sim.connect(n, s)
        let sQuery = try s.store.collection("items").find("v >= 5").subscribe()
        let nWhole = try n.store.collection("items").findAll().subscribe()
        try w.store.collection("items").upsert([["_id": "d1", "v": 1, "m": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try ids(n) == ["\"d1\"", "\"d2\""])
        try w.store.collection("items").findByID("d1").remove()
        try sim.runUntilQuiet()
        sim.run(for: ttl + 2 * 60_000)
        for node in [w, s, n] {
            #expect(try node.documents.state(id: "d1", in: "items") == nil, "\(node.name) reaped d1's tombstone")
        }
        sim.crash(n)
        try sim.restart(n, wipe: true)
        let mesh = Mesh(sim: sim, w: w, s: s, n: n, subs: [sQuery, nWhole])
        guard settled else { return mesh }
        try sim.runUntilQuiet()
        #expect(try ids(n) == ["\"d2\""])
        return mesh
    }

    @Test(arguments: Write.allCases) func aWipedNodeThatWritesGetsWhatItNeeds(_ write: Write) throws {
        let m = try Self.wipedN()
        let before = m.sim.trace.count
        let items = m.n.store.collection("items")
        switch write {
        case .createdConnected:
            try items.upsert(["_id": "d1", "s": "x"])
        case .createdAwayThenRestarted:
            m.sim.partition([[m.n], [m.w, m.s]])
            try m.sim.runUntilQuiet()
            try items.upsert(["_id": "d1", "s": "x"])
            m.sim.crash(m.n)
            try m.sim.restart(m.n)
            m.sim.heal()
        case .updatedHeld:
            _ = try items.findByID("d2").update { $0?["s"].set("x") }
        }
        try m.sim.runUntilQuiet()
        let after = m.sim.trace[before...]
        let asksWithH = after.filter { $0.contains(" n -> s subs ") && $0.contains(" h") }
        let reapedSent = after.filter { $0.contains(" s -> n batch") && $0.contains("\"d1\"") }
        switch write {
        case .createdConnected, .createdAwayThenRestarted:
            #expect(try Self.ids(m.n) == ["\"d1\"", "\"d2\""], "\(write): N's own write is newer than the remove")
            #expect(!asksWithH.isEmpty, "\(write): N asks S again with h")
            #expect(!reapedSent.isEmpty, "\(write): S sends N d1's reaped tombstone")
        case .updatedHeld:
            #expect(try Self.ids(m.n) == ["\"d2\""])
            #expect(asksWithH.isEmpty, "an update of a document held from S asks nothing again: \(asksWithH)")
        }
        try m.sim.check()
        _ = m.subs
    }
}
