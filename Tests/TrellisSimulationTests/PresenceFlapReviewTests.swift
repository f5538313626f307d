import Foundation
import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// Found by a reviewer of 48303f1: a session that comes up and goes down again before the
/// node's next announcement left the record the short-lived peer was sent (listing it) as the
/// newest in the mesh; the node did not announce again (its neighbours equalled the last
/// broadcast), and nobody else passes the peer a newer one (records are not passed on to a peer
/// they list). The mesh went quiet showing a connection that was gone. Now the node announces
/// again whenever its neighbours differ from its last record's.
@Suite struct PresenceFlapReviewTests {
    func established(_ a: SimulatedNode, with b: SimulatedNode) -> Bool {
        a.replicator?.status.peers.contains { $0.peerKey == b.peerKey && $0.phase == "established" } == true
    }

    @Test func aSessionThatFlapsBeforeTheNextAnnouncementLeavesNoPhantomConnection() throws {
        let sim = try Simulation(seed: 4811)
        let x = try sim.addNode("x")
        let q = try sim.addNode("q")
        let p = try sim.addNode("p")
        sim.connect(x, q)
        sim.connect(q, p)
        try sim.runUntilQuiet()
        #expect(p.presence?.connections.count == 2)
        // Just after a tick, x dials p; both ends establish within a few ms.
        sim.runUntil((sim.now / Simulation.tickInterval + 1) * Simulation.tickInterval + 1)
        sim.connect(x, p)
        var waited = 0
        while !(established(x, with: p) && established(p, with: x)) && waited < 60 {
            sim.run(for: 1)
            waited += 1
        }
        #expect(established(x, with: p) && established(p, with: x))
        // Each end's presence (sent on establishment) arrives, still before the next tick.
        sim.run(for: 10)
        #expect(sim.now % Simulation.tickInterval < 50)
        // The pair loses its connection and cannot reach each other again; both stay with q.
        sim.setLink(x, p, up: false)
        sim.resetConnections(between: x, and: p)
        try sim.runUntilQuiet()
        #expect(!established(x, with: p) && !established(p, with: x))
        // Every node's graph: x–q and q–p, nothing else.
        for node in [x, q, p] {
            #expect(node.presence?.connections.count == 2, "\(node.name): \(node.presence?.description ?? "-")")
        }
    }
}
