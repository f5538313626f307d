import Testing
import Trellis
import TrellisSimulation

/// Attempts to break b2c81e1 (a refetch sends the subscription set once every refetch
/// subscription asked of the peer is answered or refused, and no `ack` goes for a subscription
/// no longer asked) and f6f4150 (a page of listed `_id`s through the primary key). Passing ones
/// are controls. Failing at b2c81e1 (both pass at 672bd62):
/// `aRefetchHeldForADocumentNoPeerHoldsKeepsTheOthersAsked` and
/// `aNodeThatEvictsItsOwnWriteOutsideItsQuery`: a refetch subscription whose answer does not
/// count for an `_id` this node sent the peer waits for good, so every answered one stays asked
/// (until some other change to the set); with a peer serving fewer subscriptions than asked, the
/// base subscription stays refused (`limit`) and B misses later writes. Both pass since
/// 64ae708, which counts a refetch subscription as answered by its last batch, not by its `_id`s.
@Suite struct RefetchCostBreakTests {
    typealias Held = HeldDocumentsSimulationTests

    /// Refetch subscriptions `node` still asks of its peers.
    static func askedRefetches(_ node: SimulatedNode) -> [(peer: String, spec: SubscriptionSpec, error: String?)] {
        guard let status = node.replicator?.status else { return [] }
        return status.peers.flatMap { peer in
            peer.asked.filter { Refetch.ids(of: $0.spec) != nil }.map { (peer.address, $0.spec, $0.error) }
        }
    }

    static func write(_ node: SimulatedNode, _ range: Range<Int>, prefix: String = "d") throws {
        try node.store.collection("items").upsert(
            range.map { ["_id": .string("\(prefix)\($0)"), "n": .int(Int64($0))] })
    }

    static func count(_ node: SimulatedNode) throws -> Int { try node.store.collection("items").findAll().count() }

    /// Control: B evicts 600 documents (three refetch subscriptions) while subscribed to the whole
    /// collection; all come back, nothing stays asked.
    @Test func control600() throws {
        let sim = try Simulation(seed: 7001)
        let a = try sim.addNode("a")
        let b = try sim.addNode("b")
        sim.connect(b, a)
        let subA = try Held.subscribe(a)
        let subB = try Held.subscribe(b)
        try Self.write(a, 0..<600)
        try sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().evict().count == 600)
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 600)
        #expect(Self.askedRefetches(b).isEmpty)
        try sim.check()
        subA.cancel()
        subB.cancel()
    }

    /// The peer refuses some refetch subscriptions (`limit`: it serves at most 3 per peer, B asks
    /// its base and four refetch subscriptions). The refused ones do not hold the set back; once
    /// the accepted ones are answered the set shrinks and the rest are served.
    @Test func aPeerRefusesSomeRefetchesForTheLimit() throws {
        let sim = try Simulation(seed: 7002)
        sim.replicatorConfiguration = { $0.maxServedSubscriptions = 3 }
        let a = try sim.addNode("a")
        sim.replicatorConfiguration = { _ in }
        let b = try sim.addNode("b")
        sim.connect(b, a)
        let subB = try Held.subscribe(b)
        try Self.write(a, 0..<1000)
        try sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().evict().count == 1000)
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 1000)
        #expect(Self.askedRefetches(b).isEmpty, "\(Self.askedRefetches(b).map { "\($0.peer) \($0.error ?? "")" })")
        // The base subscription is served again: a later write reaches B.
        try Self.write(a, 1000..<1001)
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 1001)
        subB.cancel()
    }

    /// The link drops in the middle of the refetch (several times) and comes back.
    @Test func theLinkDropsMidRefetch() throws {
        let sim = try Simulation(seed: 7003)
        let a = try sim.addNode("a")
        let b = try sim.addNode("b")
        sim.connect(b, a)
        let subB = try Held.subscribe(b)
        try Self.write(a, 0..<2000)
        try sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().evict().count == 2000)
        for wait in [15, 40, 90] as [Millis] {
            sim.run(for: wait)
            sim.setLink(a, b, up: false)
            sim.run(for: 2_000)
            sim.setLink(a, b, up: true)
        }
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 2000)
        #expect(Self.askedRefetches(b).isEmpty)
        subB.cancel()
    }

    /// B evicts again while its refetch runs: some already back, some still stubs.
    @Test func evictAgainWhileRefetching() throws {
        let sim = try Simulation(seed: 7004)
        let a = try sim.addNode("a")
        let b = try sim.addNode("b")
        sim.connect(b, a)
        let subB = try Held.subscribe(b)
        try Self.write(a, 0..<1500)
        try sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().evict().count == 1500)
        for wait in [10, 20, 30, 60] as [Millis] {
            sim.run(for: wait)
            _ = try b.store.collection("items").find("n >= 200 && n < 700").evict()
        }
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 1500)
        #expect(Self.askedRefetches(b).isEmpty)
        subB.cancel()
    }

    /// The base subscription is cancelled while refetch batches are in flight, then made again:
    /// no `ack` goes for the batches of subscriptions no longer asked; the peer must not wait for
    /// them (later writes flow), and every document comes back.
    @Test func cancelWhileRefetchBatchesAreInFlight() throws {
        let sim = try Simulation(seed: 7005)
        sim.replicatorConfiguration = { $0.maxInFlight = 1 }
        let a = try sim.addNode("a")
        let b = try sim.addNode("b")
        sim.connect(b, a)
        var subB = try Held.subscribe(b)
        try Self.write(a, 0..<1200)
        try sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().evict().count == 1200)
        sim.run(for: 25)
        subB.cancel()
        sim.run(for: 8)
        subB = try Held.subscribe(b)
        sim.run(for: 12)
        subB.cancel()
        subB = try Held.subscribe(b)
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 1200)
        #expect(Self.askedRefetches(b).isEmpty)
        try Self.write(a, 5000..<5300, prefix: "late")
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 1500)
        subB.cancel()
    }

    /// Three peers all holding the collection, B evicts 5,000 (beyond one list), A–B link lossy.
    @Test func severalPeersBeyondTheListWithAnUnreliableLink() throws {
        let sim = try Simulation(seed: 7006)
        let a = try sim.addNode("a")
        let b = try sim.addNode("b")
        let c = try sim.addNode("c")
        sim.connectAll()
        let subs = try [a, b, c].map { try Held.subscribe($0) }
        try Self.write(a, 0..<2500)
        try Self.write(c, 2500..<5000)
        try sim.runUntilQuiet()
        sim.setProfile(LinkProfile(loss: 0.02, duplicate: 0.02, reorder: 0.02), between: a, and: b)
        #expect(try b.store.collection("items").findAll().evict().count == 5000)
        try sim.runUntilQuiet()
        sim.resetProfiles()
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 5000)
        #expect(Self.askedRefetches(b).isEmpty)
        try sim.check()
        subs.forEach { $0.cancel() }
    }

    /// B — R — P: R relays B's refetch one hop; R and B both evict.
    @Test func relayAndSubscriberEvict() throws {
        let sim = try Simulation(seed: 7007)
        let p = try sim.addNode("p")
        let r = try sim.addNode("r")
        let b = try sim.addNode("b")
        sim.connect(r, p)
        sim.connect(b, r)
        let subB = try Held.subscribe(b, "n < 900")
        try Self.write(p, 0..<1000)
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 900)
        _ = try r.store.collection("items").findAll().evict()
        sim.run(for: 10)
        _ = try b.store.collection("items").findAll().evict()
        try sim.runUntilQuiet()
        #expect(try b.store.collection("items").find("n < 900").count() == 900)
        #expect(Self.askedRefetches(b).isEmpty)
        #expect(Self.askedRefetches(r).isEmpty)
        subB.cancel()
    }

    /// C — A — B. C writes 299 documents, B writes d9 (so B sent d9 to A on this connection). C
    /// cancels; with A–C down, A evicts d9 (a stub it cannot refill) and B evicts all 300: two
    /// refetch subscriptions; A answers both to the end without d9, which B does not count as
    /// answered (it sent it). The one without d9 is answered: it should no longer be asked.
    /// With A serving at most 2 subscriptions per peer, three asked (the base last by key)
    /// leave the base refused: a later write on A must still reach B.
    @Test(arguments: [nil, 2] as [Int?]) func aRefetchHeldForADocumentNoPeerHoldsKeepsTheOthersAsked(limit: Int?)
        throws
    {
        let sim = try Simulation(seed: 7008)
        let c = try sim.addNode("c")
        if let limit { sim.replicatorConfiguration = { $0.maxServedSubscriptions = limit } }
        let a = try sim.addNode("a")
        sim.replicatorConfiguration = { _ in }
        let b = try sim.addNode("b")
        sim.connect(a, c)
        sim.connect(b, a)
        let cSub = try Held.subscribe(c)
        let bSub = try Held.subscribe(b)
        try sim.runUntilQuiet()
        try c.store.collection("items").upsert(
            (0..<300).filter { $0 != 9 }.map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] })
        try b.store.collection("items").upsert(["_id": "d9", "n": 9])
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 300)
        #expect(try Self.count(a) == 300)
        cSub.cancel()
        try sim.runUntilQuiet()
        sim.setLink(a, c, up: false)
        sim.run(for: 60_000)
        #expect(try a.store.collection("items").findByID("d9").evict())
        sim.run(for: 5_000)
        #expect(try b.store.collection("items").findAll().evict().count == 300)
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 299)
        let held = Self.askedRefetches(b)
        let ids = held.map { Refetch.ids(of: $0.spec)?.count ?? 0 }
        sim.note("asked refetches \(ids)")
        #expect(held.count <= 1, "refetch subscriptions still asked: \(ids) \(held.map { $0.error ?? "-" })")
        // A later write on A reaches B (its base subscription must be served).
        try Self.write(a, 1000..<1001)
        try sim.runUntilQuiet()
        #expect(try Held.get(b, "d1000") != nil)
        sim.setLink(a, c, up: true)
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 301)
        #expect(Self.askedRefetches(b).isEmpty)
        bSub.cancel()
    }

    /// Control for the `ack`s left out: B's refetch batches are deferred (B's clock far behind A's: A's writes
    /// are from the future there) while B evicts; nothing stays in flight forever.
    @Test func deferredBatchesOfARefetch() throws {
        let sim = try Simulation(seed: 7009)
        let a = try sim.addNode("a")
        let b = try sim.addNode("b")
        sim.connect(b, a)
        let subB = try Held.subscribe(b)
        try Self.write(a, 0..<700)
        try sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().evict().count == 700)
        sim.setClockOffset(a, 3_600_000)
        try Self.write(a, 0..<700, prefix: "d")  // newer states, from A's future
        try sim.runUntilQuiet()
        sim.setClockOffset(a, 0)
        sim.run(for: 4_000_000)
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 700)
        #expect(Self.askedRefetches(b).isEmpty)
        subB.cancel()
    }

    /// Two collections: one's refetch is answered while the other's is still asked.
    @Test func twoCollections() throws {
        let sim = try Simulation(seed: 7010)
        let a = try sim.addNode("a")
        let b = try sim.addNode("b")
        sim.connect(b, a)
        let s1 = try b.store.collection("items").findAll().subscribe()
        let s2 = try b.store.collection("other").findAll().subscribe()
        try Self.write(a, 0..<300)
        try a.store.collection("other").upsert((0..<3000).map { ["_id": .string("o\($0)")] })
        try sim.runUntilQuiet()
        _ = try b.store.collection("other").findAll().evict()
        _ = try b.store.collection("items").findAll().evict()
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 300)
        #expect(try b.store.collection("other").findAll().count() == 3000)
        #expect(Self.askedRefetches(b).isEmpty)
        s1.cancel()
        s2.cancel()
    }

    /// Two nodes, no fault. B subscribes to `n >= 5` of A; A subscribes to the whole collection.
    /// A writes d0–d299 (n 10), B writes `e` (n 1, outside B's own query; it goes to A on this
    /// connection). B evicts everything: two refetch subscriptions; A answers both to the end, `e`
    /// not in them (it does not match there), and B does not count `e` as answered (it sent it).
    /// The refetch subscription without `e` is answered: it should no longer be asked. With A
    /// serving at most 2 subscriptions per peer, the base subscription (last by key) is refused
    /// while three are asked: a later write on A must still reach B.
    @Test(arguments: [nil, 2] as [Int?]) func aNodeThatEvictsItsOwnWriteOutsideItsQuery(limit: Int?) throws {
        let sim = try Simulation(seed: 7011)
        if let limit { sim.replicatorConfiguration = { $0.maxServedSubscriptions = limit } }
        let a = try sim.addNode("a")
        sim.replicatorConfiguration = { _ in }
        let b = try sim.addNode("b")
        sim.connect(b, a)
        let aSub = try Held.subscribe(a)
        let bSub = try Held.subscribe(b, "n >= 5")
        try a.store.collection("items").upsert((0..<300).map { ["_id": .string("d\($0)"), "n": 10] })
        try b.store.collection("items").upsert(["_id": "e", "n": 1])
        try sim.runUntilQuiet()
        #expect(try Self.count(b) == 301)
        #expect(try Self.count(a) == 301)
        #expect(try b.store.collection("items").findAll().evict().count == 301)
        try sim.runUntilQuiet()
        #expect(try b.store.collection("items").find("n >= 5").count() == 300)
        let held = Self.askedRefetches(b)
        let ids = held.map { Refetch.ids(of: $0.spec)?.count ?? 0 }
        #expect(held.count <= 1, "refetch subscriptions still asked: \(ids) \(held.map { $0.error ?? "-" })")
        try a.store.collection("items").upsert(["_id": "late", "n": 10])
        try sim.runUntilQuiet()
        #expect(try Held.get(b, "late") != nil)
        try sim.check()
        aSub.cancel()
        bSub.cancel()
    }
}
