import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// A reviewer's attempts to break commit ac5ca93 (ReapedKeys: a node that asked a peer from 0
/// without `h` asks it again with `h` from its checkpoint once another peer brings live
/// documents). Two failed on ac5ca93 and pass since; they live on in ReapedKeysWantedTests (copies
/// kept aside for the clock, a relay that holds nothing). Three others measured costs
/// docs/DATA-MODEL.md names (a second subscription in the collection asks for the reaped keys
/// again; adding one asks from 0 with `h`) and are not kept. Every one here passed on ac5ca93. Base mesh as in ReapedKeysWantedTests: W (remover, subscribes to nothing, its
/// keeper gone), S (stale: holds the documents W removed and reaped while S was away), N (new,
/// syncs with W first).
@Suite struct ReapedKeysBreakTests {
    static let ttl: Millis = 120_000

    struct Mesh {
        let sim: Simulation
        let w: SimulatedNode
        let s: SimulatedNode
        let n: SimulatedNode
        var subscriptions: [Subscription]
        let removed: [String]
        let kept: [String]
    }

    static func ids(_ node: SimulatedNode, in collection: String = "items") throws -> [String] {
        try node.store.collection(collection).findAll().exec().map { JSON.string($0.id) }.sorted()
    }

    static func quoted(_ ids: [String]) -> [String] { ids.map { "\"\($0)\"" }.sorted() }

    /// W writes `count` documents d0… (v = i % 3); S holds them all; S is cut off; W removes
    /// every `every`-th one and reaps them. N subscribes (whole collection unless `nQuery`) and
    /// syncs with W alone (unless `connectNToW` is false).
    static func mesh(
        seed: UInt64, count: Int = 2, every: Int = 2, batchEntries: Int? = nil, nQuery: String? = nil,
        connectNToW: Bool = true
    ) throws -> Mesh {
        let sim = try Simulation(seed: seed)
        sim.storeOptions.tombstoneTTL = UInt64(ttl)
        if let batchEntries { sim.replicatorConfiguration = { $0.batchEntries = batchEntries } }
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(s, w)
        let (k, kept) = try sim.addKeeper(beside: w)
        var subs = [try s.store.collection("items").findAll().subscribe(), kept]
        try w.store.collection("items").upsert(
            (0..<count).map { ["_id": .string("d\($0)"), "v": .int(Int64($0 % 3))] })
        try sim.runUntilQuiet()
        #expect(try ids(s).count == count)
        sim.setLink(s, w, up: false)
        var removed: [String] = []
        var keptIDs: [String] = []
        for i in 0..<count {
            if i % every == 0 {
                try w.store.collection("items").findByID(.string("d\(i)")).remove()
                removed.append("d\(i)")
            } else {
                keptIDs.append("d\(i)")
            }
        }
        sim.run(for: ttl + 2 * 60_000)
        #expect(try w.documents.state(id: "d0", in: "items") == nil, "W reaped d0's tombstone")
        sim.crash(k)
        let n = try sim.addNode("n")
        subs.append(
            try nQuery.map { try n.store.collection("items").find($0).subscribe() }
                ?? n.store.collection("items").findAll().subscribe())
        if connectNToW {
            sim.connect(n, w)
            try sim.runUntilQuiet()
        }
        return Mesh(sim: sim, w: w, s: s, n: n, subscriptions: subs, removed: removed, kept: keptIDs)
    }

    /// `subs` lines from `from` to `to` with a non-refetch subscription that says `h`.
    static func asksWithH(_ sim: Simulation, from: String = "n", to: String = "w") -> Int {
        sim.trace.filter { line in
            guard line.contains(" \(from) -> \(to) subs "), let open = line.firstIndex(of: "[") else { return false }
            let entries = line[line.index(after: open)...].dropLast().components(separatedBy: "; ")
            return entries.contains { $0.hasSuffix(" h") && !$0.contains("trellisEvicted") }
        }.count
    }

    static func expectNoRemovedShown(_ m: Mesh, nodes: [SimulatedNode]) throws {
        for node in nodes {
            let shown = try ids(node)
            let back = m.removed.filter { shown.contains("\"\($0)\"") }
            #expect(back.isEmpty, "\(node.name) shows removed and reaped \(back)")
        }
    }

    // MARK: 1. Crash of N between the merge from S and the re-ask

    /// N is connected to W and S at once; N crashes a few milliseconds after S's first batch
    /// reached it (before W answers the re-ask), and restarts.
    @Test(arguments: [1, 5, 10, 20] as [Millis])
    func aCrashRightAfterTheMergeFromTheSecondPeer(delay: Millis) throws {
        let m = try Self.mesh(seed: 9510 + UInt64(delay), count: 20, every: 2, batchEntries: 2)
        m.sim.connect(m.n, m.s)
        // Step until N holds a stale document from S.
        var steps = 0
        while try !Self.ids(m.n).contains("\"d0\""), steps < 20_000 {
            m.sim.run(for: 1)
            steps += 1
        }
        m.sim.run(for: delay)
        m.sim.crash(m.n)
        try m.sim.restart(m.n)
        try m.sim.runUntilQuiet()
        try Self.expectNoRemovedShown(m, nodes: [m.w, m.s, m.n])
        #expect(try Self.ids(m.n) == Self.quoted(m.kept))
        try m.sim.check()
        _ = m.subscriptions
    }

    // MARK: 2. The connection to W drops in the middle of the backlog

    /// 60 documents, 40 removed and reaped at W; batches of 2 entries; N — W at 300 B/s. N meets
    /// S while connected to W; the re-ask's backlog crosses slowly; the link N — W goes down
    /// several times (and once N crashes) in the middle.
    @Test(arguments: [false, true])
    func theLinkToTheRemoverDropsDuringTheBacklog(crash: Bool) throws {
        let m = try Self.mesh(seed: crash ? 9521 : 9520, count: 60, every: 3, batchEntries: 2)
        #expect(try Self.ids(m.n).count == 40)
        m.sim.setProfile(LinkProfile(bytesPerSecond: 300), between: m.n, and: m.w)
        m.sim.connect(m.n, m.s)
        m.sim.run(for: 3_000)
        for round in 0..<4 {
            if crash && round == 2 {
                m.sim.crash(m.n)
                try m.sim.restart(m.n)
            } else {
                m.sim.setLink(m.n, m.w, up: false)
                m.sim.run(for: 5_000)
                m.sim.setLink(m.n, m.w, up: true)
            }
            m.sim.run(for: 2_500)
        }
        m.sim.resetProfiles()
        try m.sim.runUntilQuiet()
        try Self.expectNoRemovedShown(m, nodes: [m.w, m.s, m.n])
        #expect(try Self.ids(m.n) == Self.quoted(m.kept))
        #expect(try Self.ids(m.s) == Self.quoted(m.kept))
        let asked = Self.asksWithH(m.sim)
        // After the end, later sessions ask without `h`.
        m.sim.setLink(m.n, m.w, up: false)
        m.sim.run(for: 30_000)
        m.sim.setLink(m.n, m.w, up: true)
        try m.sim.runUntilQuiet()
        #expect(Self.asksWithH(m.sim) == asked, "N asked W with h again after the backlog ended (\(asked) before)")
        m.sim.note("asks with h: \(asked)")
        try m.sim.check()
        _ = m.subscriptions
    }

    // MARK: 3. W reaps more while the backlog is being sent

    /// As 3 (slow link, small batches), but after N's first sync W removes more documents (which
    /// N and S hold) while N is away from W; N meets S, comes back to W over the slow link, and
    /// W's reaper takes the second removes while the backlog / scan runs.
    @Test func theRemoverReapsMoreDuringTheBacklog() throws {
        var m = try Self.mesh(seed: 9530, count: 60, every: 3, batchEntries: 2)
        m.sim.setLink(m.n, m.w, up: false)
        var more: [String] = []
        for i in stride(from: 1, to: 60, by: 6) {
            try m.w.store.collection("items").findByID(.string("d\(i)")).remove()
            more.append("d\(i)")
        }
        m.sim.connect(m.n, m.s)
        try m.sim.runUntilQuiet()
        m.sim.run(for: Self.ttl - 60_000)
        m.sim.setProfile(LinkProfile(bytesPerSecond: 300), between: m.n, and: m.w)
        m.sim.setLink(m.n, m.w, up: true)
        m.sim.run(for: 3 * 60_000)
        #expect(try m.w.documents.state(id: "d1", in: "items") == nil, "W reaped d1 during the backlog")
        m.sim.resetProfiles()
        try m.sim.runUntilQuiet()
        m = Mesh(
            sim: m.sim, w: m.w, s: m.s, n: m.n, subscriptions: m.subscriptions, removed: m.removed + more,
            kept: m.kept.filter { !more.contains($0) })
        try Self.expectNoRemovedShown(m, nodes: [m.w, m.s, m.n])
        #expect(try Self.ids(m.n) == Self.quoted(m.kept))
        #expect(try Self.ids(m.s) == Self.quoted(m.kept))
        try m.sim.check()
        _ = m.subscriptions
    }

    // MARK: 4. Query subscriptions

    /// N subscribes to `v <= 1` only: d0 (v 0) is removed and reaped, d1 (v 1) kept. S holds d0
    /// stale; N gets it from S (its query matches it).
    @Test func aQuerySubscriberGetsTheReapedRemove() throws {
        let m = try Self.mesh(seed: 9540, count: 2, every: 2, nQuery: "v <= 1")
        #expect(try Self.ids(m.n) == ["\"d1\""])
        m.sim.connect(m.n, m.s)
        try m.sim.runUntilQuiet()
        try Self.expectNoRemovedShown(m, nodes: [m.w, m.s, m.n])
        try m.sim.check()
        _ = m.subscriptions
    }

    /// N has a query and a whole-collection subscription in the same collection: how many times
    /// is W asked with `h`, and how many reaped tombstones does W send (cost).
    @Test func twoSubscriptionsInTheCollectionAskOnceEach() throws {
        let m = try Self.mesh(seed: 9541, count: 30, every: 3, nQuery: "v == 1")
        var subs = m.subscriptions
        subs.append(try m.n.store.collection("items").findAll().subscribe())
        try m.sim.runUntilQuiet()
        m.sim.connect(m.n, m.s)
        try m.sim.runUntilQuiet()
        try Self.expectNoRemovedShown(m, nodes: [m.w, m.s, m.n])
        #expect(Self.asksWithH(m.sim) <= 1)
        try m.sim.check()
        _ = subs
    }

    // MARK: 5. More than two peers

    /// Two removers W and W2 (W2 writes e0…e3 and removes e0, e2 while S is away, reaps them);
    /// N syncs with W and W2 first (from 0 without h on each), then meets S.
    @Test func twoRemoversAreBothAskedAgain() throws {
        let sim = try Simulation(seed: 9550)
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let w = try sim.addNode("w")
        let w2 = try sim.addNode("w2")
        let s = try sim.addNode("s")
        sim.connect(s, w)
        sim.connect(s, w2)
        let (k, kept) = try sim.addKeeper(beside: w)
        let (k2, kept2) = try sim.addKeeper(beside: w2, name: "k2")
        var subs = [try s.store.collection("items").findAll().subscribe(), kept, kept2]
        try w.store.collection("items").upsert([["_id": "d0", "v": 0], ["_id": "d1", "v": 1]])
        try w2.store.collection("items").upsert([["_id": "e0", "v": 0], ["_id": "e1", "v": 1]])
        try sim.runUntilQuiet()
        sim.setLink(s, w, up: false)
        sim.setLink(s, w2, up: false)
        try w.store.collection("items").findByID("d0").remove()
        try w2.store.collection("items").findByID("e0").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        #expect(try w.documents.state(id: "d0", in: "items") == nil)
        #expect(try w2.documents.state(id: "e0", in: "items") == nil)
        sim.crash(k)
        sim.crash(k2)
        // W and W2 do not sync with each other (neither subscribes): W holds d*, W2 e*.
        let n = try sim.addNode("n")
        subs.append(try n.store.collection("items").findAll().subscribe())
        sim.connect(n, w)
        try sim.runUntilQuiet()
        sim.connect(n, w2)
        try sim.runUntilQuiet()
        sim.connect(n, s)
        try sim.runUntilQuiet()
        // (W and W2 keep each other's removed document: each relayed the other's documents to its
        // keeper through S before the partition and asks nobody for anything; not this change's.)
        for node in [s, n] {
            let shown = try Self.ids(node)
            #expect(!shown.contains("\"d0\"") && !shown.contains("\"e0\""), "\(node.name) shows \(shown)")
        }
        try sim.check()
        _ = subs
    }

    // MARK: 6. Relays

    /// N relays A's subscription and subscribes to nothing itself: A — N — W and N — S.
    @Test func aRelayForAnotherNode() throws {
        let m = try Self.mesh(seed: 9560, connectNToW: false)
        // Replace N's own subscription by A's, relayed through N.
        var subs = m.subscriptions
        subs.removeLast().cancel()
        let a = try m.sim.addNode("a")
        subs.append(try a.store.collection("items").findAll().subscribe())
        m.sim.connect(a, m.n)
        m.sim.connect(m.n, m.w)
        try m.sim.runUntilQuiet()
        #expect(try Self.ids(a) == ["\"d1\""])
        m.sim.connect(m.n, m.s)
        try m.sim.runUntilQuiet()
        try Self.expectNoRemovedShown(m, nodes: [m.w, m.s, m.n, a])
        try m.sim.check()
        _ = subs
    }

    // MARK: 7. Evictions at N

    /// N evicts d1 (from W) before it meets S; S's answer brings live documents.
    @Test func nEvictsThenMeetsTheStalePeer() throws {
        let m = try Self.mesh(seed: 9570, count: 4, every: 2)
        #expect(try m.n.store.collection("items").findByID("d1").evict())
        try m.sim.runUntilQuiet()
        m.sim.connect(m.n, m.s)
        try m.sim.runUntilQuiet()
        try Self.expectNoRemovedShown(m, nodes: [m.w, m.s, m.n])
        #expect(try Self.ids(m.n) == Self.quoted(m.kept))
        try m.sim.check()
        _ = m.subscriptions
    }

    // MARK: 8. W's log wiped / rotated

    /// After N's first sync W restarts wiped (new epoch, no reaped keys); then N meets S.
    @Test func theRemoverIsWipedAfterNsFirstSync() throws {
        let m = try Self.mesh(seed: 9580, count: 2, every: 2)
        m.sim.crash(m.w)
        try m.sim.restart(m.w, wipe: true)
        try m.sim.runUntilQuiet()
        m.sim.connect(m.n, m.s)
        try m.sim.runUntilQuiet()
        // Nothing remembers d0's remove any more: d0 may legitimately come back; only check
        // convergence and quiet.
        m.sim.note("n shows \(try Self.ids(m.n)), s \(try Self.ids(m.s)), w \(try Self.ids(m.w))")
        try m.sim.check()
        _ = m.subscriptions
    }

    // MARK: 9. Cost: one peer

    /// N with only W: a long life with restarts, link drops, evictions, local writes (a new
    /// document whose `_id` the store makes, an update of one from W); W is never asked with `h`
    /// and sends no reaped tombstone. A new document with an `_id` N gives would ask W once
    /// (`WipedWriterReapedRemoveTests`): W may have removed and reaped a document with it.
    @Test func aNodeWithOnePeerIsNeverAskedWithH() throws {
        let m = try Self.mesh(seed: 9590, count: 10, every: 2)
        try m.n.store.collection("items").upsert(["v": 1])
        #expect(try !m.n.store.collection("items").findByID("d3").update { $0?["n"].set(1) }.isEmpty)
        try m.sim.runUntilQuiet()
        #expect(try m.n.store.collection("items").findByID("d1").evict())
        try m.sim.runUntilQuiet()
        m.sim.setLink(m.n, m.w, up: false)
        m.sim.run(for: 30_000)
        m.sim.crash(m.n)
        try m.sim.restart(m.n)
        m.sim.setLink(m.n, m.w, up: true)
        try m.sim.runUntilQuiet()
        try m.w.store.collection("items").upsert(["_id": "w9", "v": 1])
        try m.sim.runUntilQuiet()
        #expect(Self.asksWithH(m.sim) == 0)
        for id in m.removed {
            #expect(try m.n.documents.state(id: .string(id), in: "items") == nil, "\(id)'s reaped tombstone reached N")
        }
        _ = m.subscriptions
    }

    /// Cost: S keeps sending N new documents while N's `h` request to W runs; N asks W with `h`
    /// once.
    @Test func manyBatchesFromTheSecondPeerAskOnce() throws {
        let m = try Self.mesh(seed: 9591, count: 30, every: 3, batchEntries: 2)
        m.sim.setProfile(LinkProfile(bytesPerSecond: 300), between: m.n, and: m.w)
        m.sim.connect(m.n, m.s)
        for i in 0..<10 {
            try m.s.store.collection("items").upsert(["_id": .string("s\(i)"), "v": .int(1)])
            m.sim.run(for: 700)
        }
        m.sim.resetProfiles()
        try m.sim.runUntilQuiet()
        #expect(Self.asksWithH(m.sim) == 1)
        try Self.expectNoRemovedShown(m, nodes: [m.w, m.s, m.n])
        try m.sim.check()
        _ = m.subscriptions
    }

    // MARK: 10. More

    /// W crashes and restarts in the middle of the backlog (slow link, small batches).
    @Test func theRemoverCrashesDuringTheBacklog() throws {
        let m = try Self.mesh(seed: 9600, count: 60, every: 3, batchEntries: 2)
        m.sim.setProfile(LinkProfile(bytesPerSecond: 300), between: m.n, and: m.w)
        m.sim.connect(m.n, m.s)
        m.sim.run(for: 4_000)
        m.sim.crash(m.w)
        try m.sim.restart(m.w)
        m.sim.run(for: 3_000)
        m.sim.resetProfiles()
        try m.sim.runUntilQuiet()
        try Self.expectNoRemovedShown(m, nodes: [m.w, m.s, m.n])
        #expect(try Self.ids(m.n) == Self.quoted(m.kept))
        try m.sim.check()
        _ = m.subscriptions
    }

    /// After N got W's reaped tombstones (and its own reaper took them after the TTL), a second
    /// stale node S2 that held d0 meets N alone.
    @Test func aSecondStaleNodeMeetsNAfterNReapedTheBacklog() throws {
        let sim = try Simulation(seed: 9601)
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        let s2 = try sim.addNode("s2")
        sim.connect(s, w)
        sim.connect(s2, w)
        let (k, kept) = try sim.addKeeper(beside: w)
        var subs = [try s.store.collection("items").findAll().subscribe(), kept]
        subs.append(try s2.store.collection("items").findAll().subscribe())
        try w.store.collection("items").upsert([["_id": "d0", "v": 0], ["_id": "d1", "v": 1]])
        try sim.runUntilQuiet()
        sim.setLink(s, w, up: false)
        sim.setLink(s2, w, up: false)
        try w.store.collection("items").findByID("d0").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        sim.crash(k)
        let n = try sim.addNode("n")
        subs.append(try n.store.collection("items").findAll().subscribe())
        sim.connect(n, w)
        try sim.runUntilQuiet()
        sim.connect(n, s)
        try sim.runUntilQuiet()
        #expect(try !Self.ids(n).contains("\"d0\""))
        // N's reaper takes the tombstones (TTL passed for them long ago).
        sim.setLink(n, s, up: false)
        sim.run(for: Self.ttl + 2 * 60_000)
        sim.setLink(n, w, up: false)
        sim.connect(n, s2)
        try sim.runUntilQuiet()
        for node in [n, s2, w] {
            #expect(try !Self.ids(node).contains("\"d0\""), "\(node.name) shows d0")
        }
        _ = subs
    }

    /// N's only peer is W; S (stale) comes back to W, which relays N's subscription to S.
    @Test func theRemoverRelaysTheStaleCopyToItsOnlyPeer() throws {
        let m = try Self.mesh(seed: 9603, count: 6, every: 2)
        m.sim.setLink(m.s, m.w, up: true)
        try m.sim.runUntilQuiet()
        try Self.expectNoRemovedShown(m, nodes: [m.w, m.s, m.n])
        #expect(Self.asksWithH(m.sim) == 0)
        try m.sim.check()
        _ = m.subscriptions
    }

    /// N meets S while N — W is slow; N evicts every document while the re-ask of W runs.
    @Test func nEvictsEverythingWhileTheReAskRuns() throws {
        let m = try Self.mesh(seed: 9604, count: 30, every: 3, batchEntries: 2)
        m.sim.setProfile(LinkProfile(bytesPerSecond: 300), between: m.n, and: m.w)
        m.sim.connect(m.n, m.s)
        m.sim.run(for: 2_000)
        _ = try m.n.store.collection("items").findAll().evict()
        m.sim.run(for: 2_000)
        m.sim.resetProfiles()
        try m.sim.runUntilQuiet()
        try Self.expectNoRemovedShown(m, nodes: [m.w, m.s, m.n])
        m.sim.note("h asks \(Self.asksWithH(m.sim))")
        try m.sim.check()
        _ = m.subscriptions
    }

}
