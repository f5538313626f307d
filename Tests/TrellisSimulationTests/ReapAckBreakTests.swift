import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// A reviewer's attempts to make the reaper keep a tombstone for good now that it keeps one
/// holding a write of this node no peer has acknowledged (docs/DATA-MODEL.md, "A remove no peer
/// has is kept"). TTL two minutes, as in `ReapBreakTests`.
@Suite struct ReapAckSimulationBreakTests {
    static let ttl: Millis = 120_000

    static func simulation(seed: UInt64) throws -> Simulation {
        let sim = try Simulation(seed: seed)
        sim.storeOptions.tombstoneTTL = UInt64(ttl)
        return sim
    }

    static func present(_ node: SimulatedNode, _ id: String) throws -> Bool {
        try node.store.collection("items").findByID(.string(id)).exec() != nil
    }

    /// Runs until `node` no longer shows `id`, one millisecond at a time (at most a minute).
    static func runUntilRemoved(_ sim: Simulation, at node: SimulatedNode, _ id: String) throws {
        for _ in 0..<60_000 where try present(node, id) { sim.run(for: 1) }
    }

    /// W writes d1 and d2; S subscribes to the whole collection and holds both (W asks S for
    /// `items` too when `mutual`). W removes d1; S merges the batch and acknowledges it, and the
    /// connection resets while the ack is on its way (one latency). S reconnects at once; its
    /// checkpoint is past the remove. Then ten TTLs pass, everyone connected.
    ///
    /// Promised (DATA-MODEL.md): the reaper keeps a tombstone "until one of them has it"; the
    /// cost named is "an acknowledgement lost to a restart between the batch and its ack". S has
    /// the remove here, and no node restarted.
    ///
    /// Failed (both) on the first version of the change: W kept d1's tombstone for good. Nothing
    /// offered it again (S's checkpoint is past it; the replicator remembers acks of one session
    /// only), and S's copy of the tombstone, when W subscribes to S too, came back unchanged and
    /// the merge wrote nothing. Now S's whole-collection subscription from past the tombstone
    /// marks it acknowledged (`ReplicatorDirective.peerHolds`), and so does an unchanged merge of
    /// the sender's identical tombstone.
    @Test(arguments: [false, true]) func aRemoveWhoseAckWasLostToAResetIsReapedOnceThePeerHasIt(mutual: Bool) throws {
        let sim = try Self.simulation(seed: mutual ? 7_200_002 : 7_200_001)
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(s, w)
        var subs = [try s.store.collection("items").findAll().subscribe()]
        if mutual { subs.append(try w.store.collection("items").findAll().subscribe()) }
        try w.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try Self.present(s, "d1"))
        try w.store.collection("items").findByID("d1").remove()
        try Self.runUntilRemoved(sim, at: s, "d1")
        #expect(try !Self.present(s, "d1"), "S has W's remove")
        sim.resetConnections(between: w, and: s)
        try sim.runUntilQuiet()
        sim.run(for: 10 * Self.ttl)
        try sim.runUntilQuiet()
        #expect(try !Self.present(s, "d1") && !Self.present(w, "d1"))
        #expect(
            try w.documents.state(id: "d1", in: "items") == nil,
            "W keeps d1's tombstone ten TTLs on, though S holds the remove")
        _ = subs
    }

    /// Control: the same without the reset. S's ack arrives, and W reaps the tombstone. Passes.
    @Test func aRemoveThePeerAcknowledgedIsReaped() throws {
        let sim = try Self.simulation(seed: 7_200_003)
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(s, w)
        let subs = [try s.store.collection("items").findAll().subscribe()]
        try w.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        try w.store.collection("items").findByID("d1").remove()
        try sim.runUntilQuiet()
        sim.run(for: 3 * Self.ttl)
        #expect(try w.documents.state(id: "d1", in: "items") == nil)
        _ = subs
    }

    /// W and S, linked; S subscribes to `v >= 1` in `items` (`configure` set up the simulation
    /// first). W writes d0 {v: 0}, which S never holds, and d1 {v: 1}, which it does.
    static func writerAndQuerySubscriber(seed: UInt64, configure: (Simulation) -> Void = { _ in }) throws -> (
        Simulation, SimulatedNode, SimulatedNode, [Subscription]
    ) {
        let sim = try simulation(seed: seed)
        configure(sim)
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(s, w)
        let subs = [try s.store.collection("items").find("v >= 1").subscribe()]
        try w.store.collection("items").upsert([["_id": "d0", "v": 0], ["_id": "d1", "v": 1]])
        try sim.runUntilQuiet()
        #expect(try !present(s, "d0") && present(s, "d1"))
        return (sim, w, s, subs)
    }

    /// W's only peer S subscribes to `v >= 1` in `items`. W writes d0 {v: 0}, which S never
    /// holds, and removes it. No node other than W ever held d0 here, but W cannot know that: a
    /// node it has not met, or one away, may hold d0 (seed 4500046).
    ///
    /// A reviewer's test: it failed when W kept such a tombstone for good (no subscription ever
    /// carries it, so no ack ever marks it: a server whose clients all hold narrow queries kept
    /// every remove of a document outside them). Now W keeps it past the TTL, and no longer than
    /// the TTL and `reapedKeyRetention` together (ten minutes here), when the reaped key it
    /// leaves would be forgotten as well (DATA-MODEL.md, "A remove no peer has is kept").
    @Test func aRemoveOfADocumentNoQueryPeerHeldIsReapedWithinTheRetention() throws {
        let (sim, w, _, subs) = try Self.writerAndQuerySubscriber(seed: 7_200_004) {
            $0.storeOptions.reapedKeyRetention = 600_000
        }
        try w.store.collection("items").findByID("d0").remove()
        try sim.runUntilQuiet()
        sim.run(for: 3 * Self.ttl)
        #expect(try w.documents.state(id: "d0", in: "items")?.isDeleted == true, "kept past the TTL")
        sim.run(for: 600_000)
        #expect(
            try w.documents.state(id: "d0", in: "items") == nil,
            "W keeps the tombstone of a document no peer ever held past the TTL and the retention")
        _ = subs
    }

    /// As above, but d1 matched S's query (S held it) and W removes it: the query subscription
    /// carries the remove of a document S held, S acknowledges it, and W reaps it. Passes if the
    /// change holds.
    @Test func aRemoveOfADocumentAQueryPeerHeldIsReaped() throws {
        let (sim, w, s, subs) = try Self.writerAndQuerySubscriber(seed: 7_200_005)
        try w.store.collection("items").findByID("d1").remove()
        try sim.runUntilQuiet()
        #expect(try !Self.present(s, "d1"))
        sim.run(for: 3 * Self.ttl)
        #expect(try w.documents.state(id: "d1", in: "items") == nil)
        _ = subs
    }
}
