import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// Attempts to break cc17e20 (a peer served a query subscription that sends an older state gets
/// the row logged again whenever the document is recorded in that scope) and 1a1d477 (the
/// evicted documents are asked for again after a restart, read back from the stubs). A
/// reviewer's scenarios; the failing ones are described on each test, the others are controls.
@Suite struct RestartRefetchBreakTests {
    typealias Mesh = FieldCaseSimulationTests.Mesh
    typealias Held = HeldDocumentsSimulationTests

    /// Batches sent in the mesh during `window` ms of virtual time, after `settle` ms.
    static func batchesAfter(_ sim: Simulation, settle: Millis = 30_000, window: Millis = 10_000) -> Int {
        sim.run(for: settle)
        let before = sim.messageCounts["batch"] ?? 0
        sim.run(for: window)
        return (sim.messageCounts["batch"] ?? 0) - before
    }

    /// A and B (tombstone TTL two minutes) subscribe to `keep == true`, so each serves the other
    /// a query subscription. A writes d {x: 1, keep: true} and removes x: both hold x's remove
    /// context. Then, unless `pastTTL` is false, three minutes pass (x's remove is past the TTL).
    static func removedFieldOnTwoQueryPeers(seed: UInt64, pastTTL: Bool = true) throws -> (
        sim: Simulation, a: SimulatedNode, b: SimulatedNode, subs: [Subscription]
    ) {
        let sim = try Simulation(seed: seed)
        sim.storeOptions.tombstoneTTL = 120_000
        let a = try sim.addNode("a")
        let b = try sim.addNode("b")
        sim.connect(b, a)
        let subs = [try Held.subscribe(a, "keep == true"), try Held.subscribe(b, "keep == true")]
        try a.store.collection("items").upsert(["_id": "d", "x": 1, "keep": true])
        try sim.runUntilQuiet()
        _ = try a.store.collection("items").findByID("d").update { doc in doc?["x"].remove() }
        try sim.runUntilQuiet()
        #expect(try b.documents.state(id: "d", in: "items")?.root.entries["x"] != nil)
        if pastTTL { sim.run(for: 180_000) }
        return (sim, a, b, subs)
    }

    // MARK: Relog ping-pong: states that differ only by reaped remove contexts

    /// FieldCaseSimulationTests.f04 with query subscriptions both ways instead of whole
    /// collections: A's clock is past the TTL of x's remove, B's short of it. A writes d (and
    /// reaps x's remove context); B applies it and keeps the context. Each then merges the
    /// other's state as no change (A: what B adds is reaped again; B: A adds nothing), but
    /// `.unchanged(behind: doc != incoming)` says "behind" on both sides, and since cc17e20 the
    /// row is logged again on every such merge while the sender holds a query subscription in
    /// the collection (DocumentStore+Merge.swift:158, `held` is true for every bound spec). So A
    /// and B log d again and send it to each other forever (observed: ~200 batches per second,
    /// both `lastSeq`s climbing); before cc17e20 only the merge that made the scope record
    /// logged it again, once. Expected: nothing moves once settled.
    @Test func nodesThatReapedAndNotYetDoNotPingPongThroughQuerySubscriptions() throws {
        let mesh = try Mesh(seed: 801_001, nodes: 0)
        let a = try mesh.sim.addNode("a")
        let b = try mesh.sim.addNode("b")
        mesh.sim.connect(a, b)
        try mesh.subscribe(a, "items", query: "keep == true")
        try mesh.subscribe(b, "items", query: "keep == true")
        try a.store.collection("items").upsert(["_id": "d", "x": 1, "keep": true])
        try mesh.sim.runUntilQuiet()
        let written = try #require(try a.documents.state(id: "d", in: "items")?.stamp(at: .key("x"))).time.millis
        _ = try a.store.collection("items").findByID("d").update { doc in doc?["x"].remove() }
        try mesh.sim.runUntilQuiet()
        let ttl = Millis(mesh.sim.storeOptions.tombstoneTTL)
        let atTTL = Millis(written) + ttl - Simulation.startWallClock - mesh.sim.now
        mesh.sim.setClockOffset(a, atTTL + 20_000)
        mesh.sim.setClockOffset(b, atTTL - 30_000)
        try a.store.collection("items").upsert(["_id": "d", "n": 1])  // A reaps
        mesh.sim.run(for: 30_000)
        let (lastA, lastB) = (a.documents.lastSeq, b.documents.lastSeq)
        let batches = mesh.sim.messageCounts["batch"] ?? 0
        mesh.sim.run(for: 10_000)
        #expect(mesh.sim.messageCounts["batch"] ?? 0 == batches)
        #expect(a.documents.lastSeq == lastA)
        #expect(b.documents.lastSeq == lastB)
    }

    /// Same clocks everywhere: after x's remove is past the TTL, B crashes and restarts with a
    /// wiped store and subscribes again. The state it gets from A is written whole there, which
    /// reaps x's remove context (DocumentStore.persist), while A never wrote d since and keeps
    /// it. B sends its copy to A (A's `keep == true` at B), A's merge is no change but "behind",
    /// A logs d again, B's merge of A's state brings the context back, reaps it, no change,
    /// "behind", B logs d again: a sync loop (runUntilQuiet: "still sending after 60 s").
    /// Passes on ed2ee34.
    @Test func aNodeRestartedWithAWipedStorePastAFieldRemovalsTTLDoesNotPingPong() throws {
        let (sim, _, b, subs) = try Self.removedFieldOnTwoQueryPeers(seed: 801_002)
        sim.crash(b)
        try sim.restart(b, wipe: true)
        let bSub = try Held.subscribe(b, "keep == true")
        try sim.runUntilQuiet(timeout: 60_000)
        #expect(Self.batchesAfter(sim) == 0)
        try sim.check()
        _ = (subs, bSub)
    }

    /// As above with a new node N joining A after the TTL (any node that first stores the
    /// document past the TTL): A and N log d again and again. Passes on ed2ee34.
    @Test func aNodeJoiningPastAFieldRemovalsTTLDoesNotPingPong() throws {
        let (sim, a, _, subs) = try Self.removedFieldOnTwoQueryPeers(seed: 801_003)
        let n = try sim.addNode("n")
        sim.connect(n, a)
        let nSub = try Held.subscribe(n, "keep == true")
        try sim.runUntilQuiet(timeout: 60_000)
        #expect(Self.batchesAfter(sim) == 0)
        try sim.check()
        _ = (subs, nSub)
    }

    /// Through the two changes together: B evicts d past the TTL, crashes and restarts; the
    /// refetch read back from its stubs (1a1d477) brings d back from A, and the merge into the
    /// stub writes it whole, reaping x's remove context that A keeps. Then A and B log d again
    /// and again (cc17e20). Passes on ed2ee34.
    @Test func aDocumentRefetchedAfterARestartPastTheTTLDoesNotPingPong() throws {
        let (sim, _, b, subs) = try Self.removedFieldOnTwoQueryPeers(seed: 801_004)
        #expect(try b.store.collection("items").findByID("d").evict())
        sim.crash(b)
        try sim.restart(b)
        let bSub = try Held.subscribe(b, "keep == true")
        try sim.runUntilQuiet(timeout: 60_000)
        #expect(try Held.get(b, "d")?["keep"] == true)
        #expect(Self.batchesAfter(sim) == 0)
        try sim.check()
        _ = (subs, bSub)
    }

    /// Control: the same join before the TTL (both keep x's remove context): nothing loops.
    @Test func aNodeJoiningBeforeAFieldRemovalsTTLSettles() throws {
        let (sim, a, _, subs) = try Self.removedFieldOnTwoQueryPeers(seed: 801_007, pastTTL: false)
        let n = try sim.addNode("n")
        sim.connect(n, a)
        let nSub = try Held.subscribe(n, "keep == true")
        try sim.runUntilQuiet(timeout: 60_000)
        #expect(Self.batchesAfter(sim) == 0)
        try sim.check()
        _ = (subs, nSub)
    }

    // MARK: Cost: a redundant delta logs the row again

    /// A ring of `count` nodes, each subscribed to the whole collection (when `whole`) and to
    /// `price >= 0`; node 0 writes ten 20-field cars, each node updates one, then three rounds
    /// of ten one-field updates from nodes 0, 1, 2. Returns the documents sent during the rounds.
    static func ringCost(seed: UInt64, nodes count: Int, whole: Bool = true, deltas: Bool = true) throws -> Int {
        let sim = try Simulation(seed: seed)
        sim.replicatorConfiguration = { $0.deltas = deltas }
        var nodes: [SimulatedNode] = []
        for i in 0..<count { nodes.append(try sim.addNode("n\(i)")) }
        for i in 0..<count { sim.connect(nodes[i], nodes[(i + 1) % count]) }
        var subs: [Subscription] = []
        for node in nodes {
            if whole { subs.append(try node.store.collection("cars").findAll().subscribe()) }
            subs.append(try node.store.collection("cars").find("price >= 0").subscribe())
        }
        for i in 0..<10 {
            try nodes[0].store.collection("cars").upsert(
                .map(UTF8Map(uniqueKeysWithValues: DeltaSimulationTests.car(i).map { ($0, $1) })))
        }
        try sim.runUntilQuiet()
        // Each node got its first documents from one peer, asking the others from 0 without `h`:
        // the first live document another peer brings makes it ask those again, once, for their
        // reaped tombstones (ReapedKeysWantedTests), and the batches then in flight are sent
        // again. One write from each node first, so that the rounds below measure ordinary sync.
        for node in nodes {
            try node.store.collection("cars").findByID("car0").update { $0?["year"].set(.int(1_999)) }
            try sim.runUntilQuiet(timeout: 120_000)
        }
        let documents = sim.documentsSent
        for round in 0..<3 {
            for i in 0..<10 {
                try nodes[round % count].store.collection("cars").findByID(.string("car\(i)")).update {
                    $0?["price"].set(.int(Int64(2_000 + round)))
                }
            }
            try sim.runUntilQuiet(timeout: 120_000)
        }
        try sim.check()
        _ = subs
        return sim.documentsSent - documents
    }

    /// Cost regression of cc17e20 in an ordinary sync: a ring of 3 (and 4) nodes, each
    /// subscribed to the whole collection and to a query. A change reaches a node twice around
    /// the ring; the second copy is a delta that adds nothing, and `mergeDelta` answers
    /// `.unchanged(behind: true)` for it although the stored state equals the sender's
    /// (DocumentStore+Merge.swift:336). Since cc17e20 that logs the row again whenever the sender
    /// holds any query subscription here, and the new `seq` goes to every peer again. Observed:
    /// 360 documents with deltas against 240 without (3 nodes; 420 against 300 with 4). On
    /// ed2ee34 both are 240 (300). Expected: deltas never cost more documents than whole states.
    @Test func aDeltaThatAddsNothingIsNotLoggedAgain() throws {
        for count in [3, 4] {
            let withDeltas = try Self.ringCost(seed: 801_100, nodes: count, deltas: true)
            let without = try Self.ringCost(seed: 801_100, nodes: count, deltas: false)
            #expect(withDeltas <= without, "\(count) nodes: \(withDeltas) documents with deltas, \(without) without")
        }
    }

    /// Control: the same ring with query subscriptions only (no deltas go): 120 documents for
    /// the 30 changes, as on ed2ee34.
    @Test func aQueryOnlyRingCostsWhatItDidBefore() throws {
        #expect(try Self.ringCost(seed: 801_100, nodes: 3, whole: false) <= 120)
    }

    // MARK: Stale states reviving a stub

    /// P — R — M; P writes and subscribes to nothing (a source). R and M subscribe to `v >= 0`;
    /// P writes d9 {v: 1}, which reaches both. M–R down, P sets v: 2, R gets it (and acks). P–R
    /// down; R evicts d9 (an ordinary stub: v's winning entry withheld). M–R up: R's refetch is
    /// answered by M with the stale v: 1 state; merging it into the stub makes d9 live with v's
    /// entry still withheld. P–R up: R's checkpoint at P is past d9, and P, subscribing to
    /// nothing, receives nothing, so only a refetch brings v: 2 back. Before, the refetch ended
    /// when M's copy arrived (d9 "arrived"), and R and M showed `{"_id": "d9"}` for good while P
    /// held v: 2. Now the store reports d9 as still withholding (MergeOutcome.withholding), and R
    /// asks its other peers for it again, P included once P–R is up. Keeping such a document on the
    /// refetch list was first tried with refetch subscriptions relayed like any other, and their
    /// copies circulated around a triangle of nodes (seed 690453, `--queries 2`); they are relayed
    /// one hop now.
    @Test func aStubRevivedByAStaleCopyGetsTheWritersValue() throws {
        try staleCopyRevivesAStub(seed: 801_006, restartBeforeTheWriterReturns: false)
    }

    /// As aStubRevivedByAStaleCopyGetsTheWritersValue, and R restarts after the stale copy
    /// brought d9 back and before P returns. The list of documents to ask for again is read
    /// back from the store at start; d9 is no stub any more, so the store keeps it in its
    /// `withholding` table. (Without it, R asked nobody for d9 after the restart.)
    @Test func aStubRevivedByAStaleCopyGetsTheWritersValueAfterARestart() throws {
        try staleCopyRevivesAStub(seed: 801_007, restartBeforeTheWriterReturns: true)
    }

    private func staleCopyRevivesAStub(seed: UInt64, restartBeforeTheWriterReturns restart: Bool) throws {
        var (sim, p, r, m, subs) = try WithholdingBreakTests.revived(seed: seed)
        if restart {
            sim.crash(r)
            try sim.restart(r)
            subs[0] = try Held.subscribe(r, "v >= 0")
            sim.run(for: 60_000)
        }
        try WithholdingBreakTests.writerReturns(sim, p: p, r: r, m: m)
        _ = subs
    }

    // MARK: Restart refetch controls

    /// Control: R (a relay) evicts 4,097 documents oldest first, restarts (its list is read back
    /// newest first), evicts one more, and a whole subscriber N joins through it: the most
    /// recently evicted ones come back (the list's trim drops from its front, which after a
    /// restart is the newest; this held up all the same).
    @Test func aRestartedRelayKeepsTheMostRecentEvictionsAsked() throws {
        let sim = try Simulation(seed: 801_005)
        let p = try sim.addNode("p")
        let r = try sim.addNode("r")
        let m = try sim.addNode("m")
        sim.connect(r, p)
        sim.connect(m, r)
        let total = Refetch.maxPerCollection + 2
        func id(_ i: Int) -> String { "d" + String(String(i + 100_000).dropFirst()) }
        try p.store.collection("items").upsert((0..<total).map { ["_id": .string(id($0)), "v": .int(Int64($0))] })
        let first = try Held.subscribe(m)
        try sim.runUntilQuiet()
        #expect(try Held.get(m, id(total - 1)) != nil)
        first.cancel()
        try sim.runUntilQuiet()
        let evicted = try r.documents.evict(ids: (0..<(total - 1)).map { .string(id($0)) }, in: "items")
        #expect(evicted.count == total - 1)
        try sim.runUntilQuiet()
        sim.crash(r)
        try sim.restart(r)
        try sim.runUntilQuiet()
        #expect(try r.store.collection("items").findByID(.string(id(total - 1))).evict())
        try sim.runUntilQuiet()
        let n = try sim.addNode("n")
        sim.connect(n, r)
        let second = try Held.subscribe(n)
        try sim.runUntilQuiet()
        #expect(try Held.get(n, id(total - 1)) != nil)
        #expect(try Held.get(n, id(total - 2)) != nil)
        #expect(try Held.get(n, id(2)) != nil)
        second.cancel()
    }

    /// Control: f10ARelayThatEvictedAndRestartedFetchesForALaterSubscriber with a query
    /// subscriber: P — R — M, M subscribes to `v >= 5` and cancels; R and M evict d9; R
    /// crashes and restarts; N subscribes to `v >= 5` through R and gets d9.
    @Test func aRestartedRelayFetchesForALaterQuerySubscriber() throws {
        try Self.evictRestartAndSubscribeLater(seed: 801_008, query: "v >= 5")
    }

    /// P — R — M, P and R with no subscription of their own: M subscribes to `query` through R,
    /// gets d9 {v: 9} and cancels; R and M evict d9 (only P holds it); R crashes and restarts;
    /// N then subscribes to `query` through R and must get d9, which R asks P for again.
    static func evictRestartAndSubscribeLater(seed: UInt64, query: String) throws {
        let sim = try Simulation(seed: seed)
        let p = try sim.addNode("p")
        let r = try sim.addNode("r")
        let m = try sim.addNode("m")
        sim.connect(r, p)
        sim.connect(m, r)
        try p.store.collection("items").upsert(["_id": "d9", "v": 9])
        let first = try Held.subscribe(m, query)
        try sim.runUntilQuiet()
        #expect(try Held.get(m, "d9")?["v"] == 9)
        first.cancel()
        try sim.runUntilQuiet()
        #expect(try r.store.collection("items").findByID("d9").evict())
        #expect(try m.store.collection("items").findByID("d9").evict())
        sim.crash(r)
        try sim.restart(r)
        try sim.runUntilQuiet()
        let n = try sim.addNode("n")
        sim.connect(n, r)
        let second = try Held.subscribe(n, query)
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d9")?["v"] == 9)
        try sim.check()
        second.cancel()
    }

    /// Control: as aStubRevivedByAStaleCopyGetsTheWritersValue, but P subscribes to the whole
    /// collection: R's revived state (withheld v) reaches P, which logs d9 again, and v: 2
    /// comes back to R and M.
    @Test func aStubRevivedByAStaleCopyNextToASubscribedWriterGetsTheValue() throws {
        let sim = try Simulation(seed: 801_009)
        let p = try sim.addNode("p")
        let r = try sim.addNode("r")
        let m = try sim.addNode("m")
        sim.connect(r, p)
        sim.connect(m, r)
        let pSub = try Held.subscribe(p)
        let rSub = try Held.subscribe(r, "v >= 0")
        let mSub = try Held.subscribe(m, "v >= 0")
        try p.store.collection("items").upsert(["_id": "d9", "v": 1])
        try sim.runUntilQuiet()
        sim.setLink(m, r, up: false)
        sim.run(for: 60_000)
        try Held.set(p, "d9", 2)
        sim.run(for: 60_000)
        sim.setLink(r, p, up: false)
        sim.run(for: 60_000)
        #expect(try r.store.collection("items").findByID("d9").evict())
        sim.setLink(m, r, up: true)
        sim.run(for: 60_000)
        try WithholdingBreakTests.writerReturns(sim, p: p, r: r, m: m)
        _ = (pSub, rSub, mSub)
    }
}

/// Refetches that last: documents every node evicted, which no peer holds whole.
@Suite struct LastingRefetchTests {
    /// A triangle of nodes subscribing to `v >= 0`; d1..d4 reach all three, and then every node
    /// evicts them: each node's refetch lasts (no peer holds them), asked of each peer once per
    /// connection. Each node relays only its neighbours' own refetches (hops 0). Before, a
    /// refetch came back around the triangle: A kept asking B, which had answered it, for the
    /// copy C relayed (`hops 2`), for as long as the nodes ran, so a refetch no peer can answer
    /// never left the sets, and each reconnect scanned it again on every link.
    @Test func aRefetchNoPeerCanAnswerIsNotRelayedBackAroundARing() throws {
        let sim = try Simulation(seed: 801_200)
        let nodes = try ["a", "b", "c"].map { try sim.addNode($0) }
        sim.connect(nodes[0], nodes[1])
        sim.connect(nodes[1], nodes[2])
        sim.connect(nodes[2], nodes[0])
        let subs = try nodes.map { try HeldDocumentsSimulationTests.subscribe($0, "v >= 0") }
        try nodes[0].store.collection("items").upsert((1...4).map { ["_id": .string("d\($0)"), "v": .int(Int64($0))] })
        try sim.runUntilQuiet()
        for node in nodes {
            for i in 1...4 { #expect(try node.store.collection("items").findByID(.string("d\(i)")).evict()) }
        }
        try sim.runUntilQuiet()
        var rounds: [Int] = []
        for _ in 0..<3 {
            let before = sim.messageCounts["subs", default: 0]
            sim.setLink(nodes[0], nodes[1], up: false)
            sim.run(for: 60_000)
            sim.setLink(nodes[0], nodes[1], up: true)
            try sim.runUntilQuiet()
            rounds.append(sim.messageCounts["subs", default: 0] - before)
        }
        #expect(Set(rounds).count == 1, "subs messages per reconnect: \(rounds)")
        let relayedBack = sim.trace.filter { $0.contains(" subs ") && $0.contains("trellisEvicted") }
            .filter { line in
                (2...9).contains { line.contains("trellisEvicted\":[\"d1\",\"d2\",\"d3\",\"d4\"]} since 0 hops \($0)") }
            }
        #expect(relayedBack.isEmpty, "\(relayedBack.prefix(3))")
        try sim.check()
        _ = subs
    }
}
