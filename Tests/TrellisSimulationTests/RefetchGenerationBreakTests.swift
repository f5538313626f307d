import Testing
import Trellis
import TrellisSimulation
import TrellisStore

/// Attempts to break 64ae708 (a refetch subscription counts as answered once its last batch, or
/// a caught-up batch, of the generation asked arrives; the set goes again once none still
/// waits). Passing ones are controls. Failing at 64ae708, passing at 672bd62:
/// `aCaughtUpRefetchDroppedInStandbyIsNeverAnsweredAgain` (all three arguments: three refetch
/// subscriptions stay asked of A instead of one; with A's limit 3 the base is refused and A's
/// later write never reaches B). Root cause predates 64ae708: a served subscription whose
/// generation changes keeps `reachedEnd`, so a refetch first answered by a caught-up batch gets
/// no answer at all for its new generation; 64ae708 waits for that answer by generation, and
/// meanwhile keeps every answered refetch subscription on the link asked. Passes since a8dfd87:
/// a new generation's end is told again, and answered refetches wait at most 1 s for another.
@Suite struct RefetchGenerationBreakTests {
    typealias Held = HeldDocumentsSimulationTests
    typealias Cost = RefetchCostBreakTests

    static func write(_ node: SimulatedNode, _ ids: [String]) throws {
        try node.store.collection("items").upsert(
            ids.enumerated().map { ["_id": .string($0.element), "n": .int(Int64($0.offset))] })
    }

    static func count(_ node: SimulatedNode) throws -> Int { try node.store.collection("items").findAll().count() }

    /// B subscribes to everything of A and C; A holds only its own 512 documents (it subscribes
    /// to nothing), C 256 others. With C down, B evicts everything: A answers the refetch
    /// subscriptions of its documents with batches, and the one of C's documents (none held there)
    /// with a caught-up batch. Then A crashes while the A–B link is down and dials B again: B
    /// holds the new link in standby (its old session still looks alive) and drops what A
    /// answered there; once chosen it asks everything again under a new generation. A already
    /// sent its caught-up batch for the refetch of C's documents (`reachedEnd`), so it sends
    /// nothing for the new generation: that refetch subscription waits for good. Under 64ae708
    /// every answered one on the link then stays asked too; with A serving at most 3
    /// subscriptions per peer, B's base subscription is refused and B misses A's writes for as
    /// long as C stays away.
    @Test(arguments: [nil, 2, 3] as [Int?]) func aCaughtUpRefetchDroppedInStandbyIsNeverAnsweredAgain(limit: Int?)
        throws
    {
        let sim = try Simulation(seed: 8001)
        if let limit { sim.replicatorConfiguration = { $0.maxServedSubscriptions = limit } }
        let a = try sim.addNode("a")
        sim.replicatorConfiguration = { _ in }
        let b = try sim.addNode("b")
        let c = try sim.addNode("c")
        sim.connect(a, b)  // A dials B
        sim.connect(b, c)
        let subB = try Held.subscribe(b)
        try Self.write(a, (0..<512).map { "a\(1000 + $0)" })
        try Self.write(c, (0..<256).map { "c\(1000 + $0)" })
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 768)
        #expect(try Self.count(a) == 512)
        sim.setLink(b, c, up: false)
        sim.run(for: 60_000)
        #expect(try b.store.collection("items").findAll().evict().count == 768)
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 512)
        let before = Cost.askedRefetches(b)
        sim.note(
            "asked refetches before the standby: \(before.map { "\($0.peer) \(Refetch.ids(of: $0.spec)?.count ?? 0)" })"
        )
        // A's old session vanishes unseen by B; A dials again at once.
        sim.setLink(a, b, up: false)
        sim.crash(a)
        sim.run(for: 100)
        if let limit { sim.replicatorConfiguration = { $0.maxServedSubscriptions = limit } }
        try sim.restart(a)
        sim.replicatorConfiguration = { _ in }
        sim.setLink(a, b, up: true)
        try sim.runUntilQuiet()
        let held = Cost.askedRefetches(b).filter { $0.peer.contains("a") }
        let ids = held.map { Refetch.ids(of: $0.spec)?.count ?? 0 }
        sim.note("asked refetches of a after the standby: \(ids) \(held.map { $0.error ?? "-" })")
        #expect(held.count <= 1, "refetch subscriptions still asked of a: \(ids) \(held.map { $0.error ?? "-" })")
        let asked = b.replicator?.status.peers.flatMap { p in
            p.asked.map { "\(p.address) \(Refetch.ids(of: $0.spec)?.count ?? -1) \($0.error ?? "-")" }
        }
        sim.note("asked by b: \(asked ?? [])")
        // A later write on A reaches B while C is away.
        try Self.write(a, ["late"])
        try sim.runUntilQuiet()
        #expect(try Held.get(b, "late") != nil)
        sim.setLink(b, c, up: true)
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 769)
        #expect(Cost.askedRefetches(b).isEmpty)
        subB.cancel()
    }

    /// Control: as above without the standby (plain link drop and reconnect): A answers every
    /// generation asked.
    @Test func aCaughtUpRefetchAfterAPlainReconnect() throws {
        let sim = try Simulation(seed: 8002)
        sim.replicatorConfiguration = { $0.maxServedSubscriptions = 3 }
        let a = try sim.addNode("a")
        sim.replicatorConfiguration = { _ in }
        let b = try sim.addNode("b")
        let c = try sim.addNode("c")
        sim.connect(a, b)
        sim.connect(b, c)
        let subB = try Held.subscribe(b)
        try Self.write(a, (0..<512).map { "a\(1000 + $0)" })
        try Self.write(c, (0..<256).map { "c\(1000 + $0)" })
        try sim.runUntilQuiet()
        sim.setLink(b, c, up: false)
        sim.run(for: 60_000)
        #expect(try b.store.collection("items").findAll().evict().count == 768)
        try sim.runUntilQuiet()
        sim.resetConnections(between: a, and: b)
        try sim.runUntilQuiet()
        #expect(Cost.askedRefetches(b).filter { $0.peer.contains("a") }.count <= 1)
        try Self.write(a, ["late"])
        try sim.runUntilQuiet()
        #expect(try Held.get(b, "late") != nil)
        sim.setLink(b, c, up: true)
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 769)
        #expect(Cost.askedRefetches(b).isEmpty)
        subB.cancel()
    }

    /// B's refetch batches are postponed (A's writes come from B's future and B keeps at most 50
    /// of A's documents aside): a postponed batch of a refetch subscription counted as answered on
    /// arrival would leave its documents stubs on this connection.
    @Test func postponedRefetchBatches() throws {
        let (sim, b) = try Self.postponing(evicting: true)
        #expect(try Self.count(b) == 700)
        #expect(Cost.askedRefetches(b).isEmpty)
        try sim.check()
    }

    /// As ``postponedRefetchBatches()`` without an eviction: whether the loop needs a refetch.
    @Test func postponedBatchesWithoutEviction() throws {
        let (sim, b) = try Self.postponing(evicting: false)
        defer { withExtendedLifetime(sim) {} }  // the nodes live as long as their simulation
        #expect(try b.store.collection("items").find("n < 0").count() == 699)  // d0's n is -0
    }

    /// A, whose clock then runs an hour ahead, writes 700 documents B subscribes to and (after B
    /// evicted them, when `evicting`) writes them all again; B, keeping at most 50 of A's
    /// documents aside, postpones batches until the clock is back and the mesh is quiet.
    static func postponing(evicting: Bool) throws -> (Simulation, SimulatedNode) {
        let sim = try Simulation(seed: 8003)
        let a = try sim.addNode("a")
        sim.storeOptions.maxDeferredDocumentsPerPeer = 50
        let b = try sim.addNode("b")
        sim.storeOptions = StoreOptions()
        sim.connect(b, a)
        let subB = try Held.subscribe(b)
        defer { subB.cancel() }
        try Self.write(a, (0..<700).map { "d\($0)" })
        try sim.runUntilQuiet()
        if evicting { #expect(try b.store.collection("items").findAll().evict().count == 700) }
        sim.setClockOffset(a, 3_600_000)
        try a.store.collection("items").upsert((0..<700).map { ["_id": .string("d\($0)"), "n": .int(Int64(-$0))] })
        sim.run(for: 20_000)  // B postpones and asks again every interval while A's writes are in its future
        sim.setClockOffset(a, 0)
        sim.run(for: 4_000_000)
        try sim.runUntilQuiet()
        return (sim, b)
    }

    /// The base subscription is cancelled and made again on the same connection while refetch
    /// batches are in flight: the refetch subscriptions come back with the same key and the same
    /// generation, and a stale last batch of the old request could count as the answer of the
    /// new one. Several timings.
    @Test(arguments: [(3, 2), (6, 2), (10, 1), (15, 3), (20, 5), (30, 1), (40, 10)] as [(Int, Int)])
    func cancelAndResubscribeMidRefetch(first: Int, gap: Int) throws {
        let sim = try Simulation(seed: 8004 + UInt64(first))
        sim.replicatorConfiguration = { $0.maxInFlight = 1 }
        let a = try sim.addNode("a")
        let b = try sim.addNode("b")
        sim.connect(b, a)
        var subB = try Held.subscribe(b)
        try Self.write(a, (0..<1200).map { "d\($0)" })
        try sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().evict().count == 1200)
        sim.run(for: Millis(first))
        subB.cancel()
        sim.run(for: Millis(gap))
        subB = try Held.subscribe(b)
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 1200)
        #expect(Cost.askedRefetches(b).isEmpty)
        subB.cancel()
    }

    /// A serves at most 2 subscriptions per peer; B asks its base and six refetch subscriptions:
    /// refused ones (`limit`) are asked again once room is made; the set must not stall.
    @Test func aTightLimitThenRoom() throws {
        let sim = try Simulation(seed: 8005)
        sim.replicatorConfiguration = { $0.maxServedSubscriptions = 2 }
        let a = try sim.addNode("a")
        sim.replicatorConfiguration = { _ in }
        let b = try sim.addNode("b")
        sim.connect(b, a)
        let subB = try Held.subscribe(b)
        try Self.write(a, (0..<1500).map { "d\($0)" })
        try sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().evict().count == 1500)
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 1500)
        #expect(Cost.askedRefetches(b).isEmpty)
        try Self.write(a, ["late"])
        try sim.runUntilQuiet()
        #expect(try Held.get(b, "late") != nil)
        subB.cancel()
    }

    /// Two holders, 5,000 evicted (two rounds); the A–B link is so slow that A's answers trail
    /// C's by far: C's answers end each round, nothing stays asked of A.
    @Test func aSlowPeerBeyondTheList() throws {
        let sim = try Simulation(seed: 8006)
        let a = try sim.addNode("a")
        let b = try sim.addNode("b")
        let c = try sim.addNode("c")
        sim.connectAll()
        let subs = try [a, b, c].map { try Held.subscribe($0) }
        try Self.write(a, (0..<5000).map { "d\($0)" })
        try sim.runUntilQuiet()
        var slow = LinkProfile()
        slow.bytesPerSecond = 20_000
        sim.setProfile(slow, between: a, and: b)
        #expect(try b.store.collection("items").findAll().evict().count == 5000)
        try sim.runUntilQuiet()
        sim.resetProfiles()
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 5000)
        #expect(Cost.askedRefetches(b).isEmpty)
        try sim.check()
        subs.forEach { $0.cancel() }
    }
}
