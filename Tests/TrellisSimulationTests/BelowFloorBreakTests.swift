import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// Attempts to break the service of a peer found below the retained floor (commit d18d7ca:
/// reaped keys keep their tombstone's `seq`, and a peer whose checkpoint is below the floor is
/// sent, with its subscription from 0, the tombstones reaped after its checkpoint;
/// docs/DATA-MODEL.md "A node below the floor", docs/PROTOCOL.md §2 step 5, docs/MESH.md
/// "Tombstones"). A reviewer's scenarios; each test says what it sets up, what the documentation
/// promises, and whether it failed on the code it was written against.
///
/// The TTL is two minutes (the sync host reaps every minute), so a node "away longer than the
/// TTL" is a partition of four minutes.
@Suite struct BelowFloorBreakTests {
    static let ttl: Millis = 120_000

    static func simulation(seed: UInt64) throws -> Simulation {
        let sim = try Simulation(seed: seed)
        sim.storeOptions.tombstoneTTL = UInt64(ttl)
        return sim
    }

    static func ids(_ node: SimulatedNode, in collection: String = "items") throws -> [String] {
        try node.store.collection(collection).findAll().exec().map { JSON.string($0.id) }.sorted()
    }

    static func passTheTTL(_ sim: Simulation) {
        sim.run(for: ttl + 2 * 60_000)
    }

    // MARK: A tombstone reaped while the peer's scan is on its way to it

    /// W writes y and subscribes to nothing; S subscribes to the whole collection and holds y.
    /// S is cut off; W writes 300 documents of 1 kB, then removes y (y's tombstone comes after
    /// them in W's log). The partition heals 30 s before y's tombstone is due for reaping, over a
    /// slow link (4 kB/s, pages of 10 entries), so S's catch-up scan from its checkpoint (not
    /// below W's floor: W has reaped nothing yet) takes over a minute and W's reaper takes y's
    /// tombstone while the scan is still below it.
    ///
    /// Promised (docs/MESH.md "Tombstones": a node away "still shows the removed documents until
    /// it syncs. Then they disappear there too"; DATA-MODEL.md: a reader below the floor "is
    /// never answered 'no changes'"): S stops showing y.
    ///
    /// Failed before (S showed y for good); passes now: the pages of a peer that resumed carry
    /// the tombstones reaped after its checkpoint from the first page on, not only after a
    /// restart below the floor (`ScanRequest.reapedAfter`). What it found: the scan's cursors are W's own from this session
    /// (`Served.floorChecked` is true from the first page, Replicator.swift about line 818), so
    /// the pages after the reap, which are below the new floor, are not restarted and carry no
    /// reaped tombstones (`reapedAfter` is only set at Replicator.swift:812, when the peer's
    /// `since` was found below the floor). y's `seq` is passed with no row, S's checkpoint ends
    /// above the floor, and nothing ever sends S the remove. (The gap predates d18d7ca: the
    /// floor check only ever looked at the peer's `since`.)
    @Test func aTombstoneReapedWhileAPeersScanIsBelowItStillReachesThePeer() throws {
        try Self.reapDuringScan(seed: 9301, slow: true)
    }

    /// Control: the same over a fast link (the scan passes y's tombstone before it is reaped).
    /// Passes.
    @Test func aTombstoneDueForReapingReachesAPeerWhoseScanIsFast() throws {
        try Self.reapDuringScan(seed: 9302, slow: false)
    }

    static func reapDuringScan(seed: UInt64, slow: Bool) throws {
        let sim = try simulation(seed: seed)
        sim.replicatorConfiguration = { $0.batchEntries = 10 }
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(s, w)
        let (k, kept) = try sim.addKeeper(beside: w)
        let subs = [try s.store.collection("items").findAll().subscribe(), kept]
        try w.store.collection("items").upsert(["_id": "y", "v": 0])
        try sim.runUntilQuiet()
        #expect(try ids(s) == ["\"y\""])
        sim.partition([[w, k], [s]])
        let filler = String(repeating: "x", count: 1_000)
        for chunk in 0..<10 {
            try w.store.collection("items").upsert(
                (0..<30).map { i in ["_id": .string("f\(chunk * 30 + i)"), "pad": .string(filler)] })
        }
        try w.store.collection("items").findByID("y").remove()
        sim.run(for: ttl - 30_000)
        #expect(try w.documents.state(id: "y", in: "items") != nil, "W still holds y's tombstone at the heal")
        if slow { sim.setProfile(LinkProfile(bytesPerSecond: 4_000), between: s, and: w) }
        sim.heal()
        sim.run(for: 3 * 60_000)
        #expect(try w.documents.state(id: "y", in: "items") == nil, "W reaped y's tombstone")
        try sim.runUntilQuiet(timeout: 60 * 60_000)
        #expect(try ids(s).filter { $0 != "\"y\"" }.count == 300, "S got every filler document")
        #expect(!sim.trace.contains { $0.contains("gets the subscription again from the start") }, "no restart")
        #expect(try !ids(s).contains("\"y\""), "S still shows y, which W removed and reaped during S's catch-up")
        _ = subs
    }

    // MARK: A first sync with a node that reaped

    /// A chain A — R — W: W writes d1 and d2 and subscribes to nothing; R relays A's
    /// whole-collection subscription (R subscribes to nothing itself). A holds d1 and d2. A is cut
    /// off; W removes d1 and reaps it after the TTL. R is gone for good (crashed, never
    /// restarted), and A is then connected directly to W for the first time.
    ///
    /// Promised (docs/MESH.md "Tombstones": a node away longer than the TTL "still shows the
    /// removed documents until it syncs. Then they disappear there too ... also from a node that
    /// asks that peer for nothing"): A stops showing d1 once it syncs with W, which removed it.
    ///
    /// Failed before subscriptions said `h` (DATA-MODEL.md "A subscriber from 0 that holds
    /// rows"): A showed d1 for good. A has no checkpoint on W's log, so it asks from 0; a `since`
    /// of 0 is never "below the floor", so W's pages carried no reaped tombstones, and W asks A
    /// for nothing. Now A's subscription says it holds rows of `items`, and W's pages from 0
    /// carry every tombstone W reaped.
    @Test func aStaleNodesFirstSyncWithTheRemoverRemovesTheReapedDocument() throws {
        let sim = try Self.simulation(seed: 9303)
        let w = try sim.addNode("w")
        let r = try sim.addNode("r")
        let a = try sim.addNode("a")
        sim.connect(r, w)
        sim.connect(a, r)
        let subs = [try a.store.collection("items").findAll().subscribe()]
        try w.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try Self.ids(a) == ["\"d1\"", "\"d2\""])
        sim.partition([[w, r], [a]])
        try w.store.collection("items").findByID("d1").remove()
        Self.passTheTTL(sim)
        #expect(try w.documents.state(id: "d1", in: "items") == nil, "W reaped d1's tombstone")
        sim.crash(r)
        sim.heal()
        sim.connect(a, w)
        try sim.runUntilQuiet()
        #expect(try Self.ids(w) == ["\"d2\""])
        let shown = try Self.ids(a)
        #expect(shown == ["\"d2\""], "A still shows d1, which W removed and reaped")
        _ = subs
    }

    // MARK: A query subscription replaced while away

    /// W writes d1 {v: 1} and d2 {v: 2} and subscribes to nothing. A subscribes to `v == 1` and
    /// holds d1. A is cut off; W removes d1. While away, A replaces its subscription with
    /// `v >= 1` (cancels the old one). With `reap`, W reaps d1's tombstone before the heal.
    ///
    /// Promised (MESH.md "Tombstones", as above): A stops showing d1.
    ///
    /// With `reap` it failed before subscriptions said `h`, as the one above: the new
    /// subscription has no checkpoint (since 0), so it is never found below the floor, and the
    /// old subscription, which was below it, is no longer asked for. Now the new one says A holds
    /// rows of `items`, and W's pages carry d1's reaped tombstone. Within the TTL (the control)
    /// W's scope for A carries the tombstone row to the new subscription.
    @Test func aQuerySubscriptionReplacedWhileAwayStillLosesAReapedDocument() throws {
        try Self.replacedQuery(seed: 9304, reap: true)
    }

    /// Control of the above within the TTL. Passes.
    @Test func aQuerySubscriptionReplacedWhileAwayLosesARemovedDocumentWithinTheTTL() throws {
        try Self.replacedQuery(seed: 9305, reap: false)
    }

    static func replacedQuery(seed: UInt64, reap: Bool) throws {
        let sim = try simulation(seed: seed)
        let w = try sim.addNode("w")
        let a = try sim.addNode("a")
        sim.connect(a, w)
        let (k, kept) = try sim.addKeeper(beside: w)
        var sub = try a.store.collection("items").find("v == 1").subscribe()
        try w.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try ids(a) == ["\"d1\""])
        sim.partition([[w, k], [a]])
        try w.store.collection("items").findByID("d1").remove()
        if reap {
            passTheTTL(sim)
            #expect(try w.documents.state(id: "d1", in: "items") == nil, "W reaped d1's tombstone")
        } else {
            sim.run(for: ttl / 4)
        }
        sub.cancel()
        sub = try a.store.collection("items").find("v >= 1").subscribe()
        sim.heal()
        try sim.runUntilQuiet()
        let shown = try ids(a)
        #expect(shown == ["\"d2\""], "A still shows d1, which W removed\(reap ? " and reaped" : "")")
        _ = (sub, kept)
    }

    // MARK: Restarts in the middle of the resync

    /// W writes 60 documents and subscribes to nothing; S subscribes to the whole collection and
    /// holds them. S is cut off; W removes every third document and reaps them. The link heals
    /// with pages of 4 entries over a slow link; S (or W) crashes in the middle of the resync
    /// from 0 and restarts.
    ///
    /// Promised: S ends with exactly the 40 documents W shows; the mesh goes quiet. Passes.
    @Test(arguments: ["s", "w"])
    func aCrashInTheMiddleOfTheResyncLosesNoReapedRemove(crashing: String) throws {
        let sim = try Self.simulation(seed: crashing == "s" ? 9306 : 9307)
        sim.replicatorConfiguration = { $0.batchEntries = 4 }
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(s, w)
        let (k, kept) = try sim.addKeeper(beside: w)
        let subs = [try s.store.collection("items").findAll().subscribe(), kept]
        try w.store.collection("items").upsert((0..<60).map { ["_id": .string("d\($0)"), "v": .int($0)] })
        try sim.runUntilQuiet()
        #expect(try Self.ids(s).count == 60)
        sim.partition([[w, k], [s]])
        var removed: [String] = []
        for i in stride(from: 0, to: 60, by: 3) {
            try w.store.collection("items").findByID(.string("d\(i)")).remove()
            removed.append("d\(i)")
        }
        Self.passTheTTL(sim)
        #expect(try w.documents.state(id: "d0", in: "items") == nil, "W reaped the tombstones")
        sim.setProfile(LinkProfile(bytesPerSecond: 300), between: s, and: w)
        sim.heal()
        sim.run(for: 2_000)
        for _ in 0..<3 {
            sim.crash(crashing == "s" ? s : w)
            try sim.restart(crashing == "s" ? s : w)
            sim.run(for: 1_500)
        }
        sim.resetProfiles()
        try sim.runUntilQuiet()
        #expect(try Self.ids(w).count == 40)
        #expect(try Self.ids(s) == Self.ids(w))
        try sim.check()
        _ = subs
    }

    // MARK: Relays

    /// A chain A — R — W: W writes d1, d2 and subscribes to nothing; R relays A's
    /// whole-collection subscription to W and subscribes to nothing itself. A and R hold d1. A is
    /// cut off from R; W removes d1 and reaps it. The link heals.
    ///
    /// Promised: d1 shows nowhere. Passes.
    @Test func aRelayThatRelaysNothingWhileTheStaleNodeIsAwayStillRemovesTheDocument() throws {
        let sim = try Self.simulation(seed: 9308)
        let w = try sim.addNode("w")
        let r = try sim.addNode("r")
        let a = try sim.addNode("a")
        sim.connect(r, w)
        sim.connect(a, r)
        let subs = [try a.store.collection("items").findAll().subscribe()]
        try w.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try Self.ids(a) == ["\"d1\"", "\"d2\""])
        sim.setLink(a, r, up: false)
        try w.store.collection("items").findByID("d1").remove()
        Self.passTheTTL(sim)
        sim.setLink(a, r, up: true)
        try sim.runUntilQuiet()
        for node in [w, r, a] { #expect(try !Self.ids(node).contains("\"d1\""), "\(node.name) shows d1") }
        _ = subs
    }

    /// A chain S — R — A, all subscribed to `v >= 1`. S and R hold d {v: 1}. S is cut off; A
    /// removes d; then S, which has not seen the remove, sets `c = 3`. A and R reap the tombstone
    /// after the TTL. The link heals.
    ///
    /// Promised (MESH.md: "A document edited on the away node after it was removed elsewhere
    /// comes back with that edit (add-wins, as without reaping)"; DATA-MODEL.md: "a concurrent
    /// edit comes back alone"): every node ends with d = {c: 3} only (d no longer matches
    /// `v >= 1`, so the query subscribers may not show it; none shows v). Passes.
    @Test func aStaleEditThroughARelayComesBackAloneAfterTheBelowFloorResync() throws {
        let sim = try Self.simulation(seed: 9309)
        let s = try sim.addNode("s")
        let r = try sim.addNode("r")
        let a = try sim.addNode("a")
        sim.connect(s, r)
        sim.connect(r, a)
        let subs = try [s, r, a].map { try $0.store.collection("items").findAll().subscribe() }
        try a.store.collection("items").upsert([["_id": "d", "v": 1, "b": 2], ["_id": "e", "v": 2]])
        try sim.runUntilQuiet()
        sim.setLink(s, r, up: false)
        try a.store.collection("items").findByID("d").remove()
        sim.run(for: 1_000)
        _ = try s.store.collection("items").findByID("d").update { $0?["c"].set(3) }
        Self.passTheTTL(sim)
        sim.setLink(s, r, up: true)
        try sim.runUntilQuiet()
        for node in [s, r, a] {
            let d = try node.store.collection("items").findByID("d").exec()?.value
            #expect(d == ["_id": "d", "c": 3], "\(node.name): \(String(describing: d))")
        }
        _ = subs
    }

    // MARK: Evictions

    /// W writes d1 and d2 and subscribes to nothing; S subscribes to the whole collection and
    /// holds both. S is cut off and evicts d1 (a stub, a refetch waiting); W removes d1 and reaps
    /// it. The partition heals: S's refetch of d1 finds no row at W (a refetch page carries no
    /// reaped tombstones), and S's subscription, below W's floor, is served again from 0 with
    /// d1's reaped tombstone, which merges into the stub.
    ///
    /// Promised: d1 shows nowhere, the mesh goes quiet (no refetch loop), also after S restarts.
    /// Passes.
    @Test func aStubOfADocumentReapedByARemoverThatAsksNothingEndsQuietly() throws {
        let sim = try Self.simulation(seed: 9313)
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(s, w)
        let (k, kept) = try sim.addKeeper(beside: w)
        let subs = [try s.store.collection("items").findAll().subscribe(), kept]
        try w.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        sim.partition([[w, k], [s]])
        #expect(try s.store.collection("items").findByID("d1").evict())
        try w.store.collection("items").findByID("d1").remove()
        Self.passTheTTL(sim)
        #expect(try w.documents.state(id: "d1", in: "items") == nil, "W reaped d1's tombstone")
        sim.heal()
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"d2\""])
        sim.crash(s)
        try sim.restart(s)
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"d2\""])
        #expect(try Self.ids(w) == ["\"d2\""])
        _ = subs
    }

    // MARK: Random meshes

    /// Five nodes, all connected, each subscribed to the whole collection or to a query, write
    /// and remove documents; two of them are cut off for longer than the TTL while the others
    /// keep removing; then everything heals.
    ///
    /// Promised: the mesh goes quiet; no node shows a document that was removed and not written
    /// again afterwards; the whole-collection subscribers agree. Passes for the three seeds.
    @Test(arguments: [9310, 9311, 9312] as [UInt64])
    func aRandomMeshWithPartitionsLongerThanTheTTLConverges(seed: UInt64) throws {
        let sim = try Self.simulation(seed: seed)
        sim.replicatorConfiguration = { $0.batchEntries = 3 }
        let nodes = try (0..<5).map { try sim.addNode("n\($0)") }
        sim.connectAll()
        var subs: [Subscription] = []
        for (i, node) in nodes.enumerated() {
            subs.append(
                i % 2 == 0
                    ? try node.store.collection("items").findAll().subscribe()
                    : try node.store.collection("items").find("v >= \(i)").subscribe())
        }
        var rng = BelowFloorRandom(seed: seed)
        var removedForGood: Set<String> = []
        func write(_ node: SimulatedNode, _ n: Int) throws {
            for _ in 0..<n {
                let id = "d\(rng.next() % 40)"
                if rng.next() % 3 == 0 {
                    try node.store.collection("items").findByID(.string(id)).remove()
                    removedForGood.insert(id)
                } else {
                    try node.store.collection("items").upsert(["_id": .string(id), "v": .int(Int64(rng.next() % 5))])
                    removedForGood.remove(id)
                }
            }
        }
        // One node writes at a time and the others see it before the next writes: no write is
        // concurrent with another, so the last one in program order wins.
        for node in nodes {
            try write(node, 10)
            try sim.runUntilQuiet()
        }
        sim.partition([[nodes[0], nodes[1], nodes[2]], [nodes[3]], [nodes[4]]])
        for node in [nodes[0], nodes[2], nodes[1]] {
            try write(node, 12)
            sim.run(for: 20_000)
        }
        Self.passTheTTL(sim)
        sim.heal()
        try sim.runUntilQuiet()
        // Only writes made while connected count as "for good": those of the away nodes were
        // made before the partition and are older than every later remove.
        for node in nodes {
            let shown = Set(try Self.ids(node))
            let back = removedForGood.filter { shown.contains("\"\($0)\"") }
            #expect(back.isEmpty, "\(node.name) shows removed documents \(back.sorted())")
        }
        #expect(try Self.ids(nodes[0]) == Self.ids(nodes[2]))
        #expect(try Self.ids(nodes[0]) == Self.ids(nodes[4]))
        _ = subs
    }
}

/// A small deterministic generator for the random workloads.
struct BelowFloorRandom {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
