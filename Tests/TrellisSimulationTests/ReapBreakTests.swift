import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// Attempts to break tombstone expiry (reaping, docs/DATA-MODEL.md "Tombstones and reaping"),
/// eviction and refetch around it, under partitions, restarts and clock trouble. A reviewer's
/// scenarios; every test says what it sets up and what the documentation promises. Those that
/// fail on the code they were written against say why on the test.
///
/// The TTL is two minutes in these meshes (the sync host reaps every minute), so a node "away
/// longer than the TTL" is a partition of four minutes.
@Suite struct ReapBreakTests {
    static let ttl: Millis = 120_000

    /// A simulation whose stores keep tombstones for ``ttl``.
    static func simulation(seed: UInt64) throws -> Simulation {
        let sim = try Simulation(seed: seed)
        sim.storeOptions.tombstoneTTL = UInt64(ttl)
        return sim
    }

    static func get(_ node: SimulatedNode, _ id: String, in collection: String = "items") throws -> Value? {
        try node.store.collection(collection).findByID(.string(id)).exec()?.value
    }

    static func ids(_ node: SimulatedNode, in collection: String = "items") throws -> [String] {
        try node.store.collection(collection).findAll().exec().map { JSON.string($0.id) }.sorted()
    }

    /// Longer than the TTL plus a reaper tick: every node that holds a tombstone of before reaps it.
    static func passTheTTL(_ sim: Simulation) {
        sim.run(for: ttl + 2 * 60_000)
    }

    // MARK: A remover that asks nothing of the stale node

    /// W writes d1 and d2 and subscribes to nothing (a writer, a server that owns the data); S
    /// subscribes to the whole collection and holds both. S is cut off; W removes d1; four
    /// minutes later (TTL two) W has reaped the tombstone. The partition heals.
    ///
    /// Promised (docs/MESH.md, "Tombstones"): "A node that was away longer than the TTL still
    /// shows the removed documents until it syncs. Then they disappear there too". Without
    /// reaping S receives the tombstone (the control below).
    ///
    /// Failed before (S showed d1 for good): W found S's checkpoint below its floor and sent S
    /// its subscription again from 0, where d1 has no row, and asked S again for W's own
    /// subscriptions in `items`, which are none, so S's stale copy never came back to W either.
    /// Now the pages from 0 carry the tombstones W reaped after S's checkpoint (PROTOCOL.md §2
    /// step 5), d1's among them.
    @Test func aRemoverThatSubscribesToNothingStillRemovesAReapedDocumentFromAStaleSubscriber() throws {
        let (sim, w, s, k, subs) = try Self.writerAndSubscriber(seed: 9101, writerQuery: nil)
        sim.partition([[w, k], [s]])
        try w.store.collection("items").findByID("d1").remove()
        Self.passTheTTL(sim)
        #expect(try w.documents.state(id: "d1", in: "items") == nil, "W reaped d1's tombstone")
        sim.heal()
        try sim.runUntilQuiet()
        #expect(try Self.ids(w) == ["\"d2\""])
        #expect(try Self.ids(s) == ["\"d2\""], "S still shows the document W removed and reaped")
        try sim.check()
        _ = subs
    }

    /// As above, with S subscribed to a query (`v >= 1`) that d1 matches, and a document d3 that
    /// W wrote and removed while S was away (S never held it). S stops showing d1; d3 never
    /// shows anywhere. A reaped tombstone matches no query, and W no longer knows what S held:
    /// every tombstone reaped after S's checkpoint goes with the query's pages.
    @Test func aRemoverThatSubscribesToNothingStillRemovesAReapedDocumentFromAStaleQuerySubscriber() throws {
        let sim = try Self.simulation(seed: 9104)
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(s, w)
        let (k, kept) = try sim.addKeeper(beside: w)
        let subs = [try s.store.collection("items").find("v >= 1").subscribe(), kept]
        try w.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"d1\"", "\"d2\""])
        sim.partition([[w, k], [s]])
        try w.store.collection("items").findByID("d1").remove()
        try w.store.collection("items").upsert(["_id": "d3", "v": 3])
        try w.store.collection("items").findByID("d3").remove()
        Self.passTheTTL(sim)
        sim.heal()
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"d2\""], "S still shows the document W removed and reaped")
        #expect(try Self.ids(w) == ["\"d2\""])
        _ = subs
    }

    /// As above, but W subscribes to `v == 2` (it asks S for something in `items`: d2, not d1).
    /// Passes: W asks S again from 0 for `v == 2`, and S sends d1 with it although d1 does not
    /// match (as far as I can tell, as a document W itself sent S: PROTOCOL.md §2 step 5); W
    /// removes it again and S receives the remove.
    @Test func aRemoverWithANarrowQueryStillRemovesAReapedDocumentFromAStaleSubscriber() throws {
        let (sim, w, s, k, subs) = try Self.writerAndSubscriber(seed: 9102, writerQuery: "v == 2")
        sim.partition([[w, k], [s]])
        try w.store.collection("items").findByID("d1").remove()
        Self.passTheTTL(sim)
        #expect(try w.documents.state(id: "d1", in: "items") == nil, "W reaped d1's tombstone")
        sim.heal()
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"d2\""], "S still shows the document W removed and reaped")
        _ = subs
    }

    /// Control: the same partition, shorter than the TTL. S receives the tombstone. Passes.
    @Test func aRemoverThatSubscribesToNothingReachesAStaleSubscriberWithinTheTTL() throws {
        let (sim, w, s, k, subs) = try Self.writerAndSubscriber(seed: 9103, writerQuery: nil)
        sim.partition([[w, k], [s]])
        try w.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl / 2)
        sim.heal()
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"d2\""])
        _ = subs
    }

    /// W writes d1 {v: 1} and d2 {v: 2}; S subscribes to the whole collection, dials W, and
    /// holds both; so does K, W's keeper (`Simulation.addKeeper`). W subscribes to `writerQuery` if any.
    static func writerAndSubscriber(seed: UInt64, writerQuery: String?) throws -> (
        Simulation, SimulatedNode, SimulatedNode, SimulatedNode, [Subscription]
    ) {
        let sim = try simulation(seed: seed)
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(s, w)
        let (k, kept) = try sim.addKeeper(beside: w)
        var subs = [try s.store.collection("items").findAll().subscribe(), kept]
        if let writerQuery { subs.append(try w.store.collection("items").find(writerQuery).subscribe()) }
        try w.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try ids(s) == ["\"d1\"", "\"d2\""])
        return (sim, w, s, k, subs)
    }

    // MARK: The remove context is reaped with the tombstone

    /// A and S subscribe to the whole collection and hold d {a: 1, b: 2}. S is cut off; A
    /// removes d; then S, which has not seen the remove, sets `c = 3`. Four minutes later (TTL
    /// two) A has reaped the tombstone. The partition heals.
    ///
    /// Promised (docs/DATA-MODEL.md rule 6, and "Tombstones and reaping": "A state carrying a
    /// newer stamp ... is merged as usual and brings the document back, as rule 6 says it would
    /// have against the tombstone"; MESH.md: "comes back with that edit (add-wins, as without
    /// reaping)"): d comes back with just the write the remover had not seen, {c: 3}. That is
    /// what happens within the TTL (the control below).
    ///
    /// Failed before reaped keys kept their tombstone's state: every node shows {a: 1, b: 2, c: 3}, the removed fields come back. A holds no
    /// row and the reaped key only keeps the remove's time, so DocumentStore+Merge.swift
    /// `mergeState` (the `reapedRemoval` branch, about line 265) sees a stamp newer than it and
    /// merges S's state into an empty `DocumentState()`: the remove context that covered `a` and
    /// `b` is gone.
    @Test func anEditConcurrentWithAReapedRemoveBringsBackOnlyTheEdit() throws {
        try Self.editConcurrentWithARemove(seed: 9104, reap: true)
    }

    /// Control: the same within the TTL. Both show {c: 3}. Passes.
    @Test func anEditConcurrentWithARemoveBringsBackOnlyTheEditWithinTheTTL() throws {
        try Self.editConcurrentWithARemove(seed: 9105, reap: false)
    }

    static func editConcurrentWithARemove(seed: UInt64, reap: Bool) throws {
        let sim = try simulation(seed: seed)
        let a = try sim.addNode("a")
        let s = try sim.addNode("s")
        sim.connect(s, a)
        let (k, kept) = try sim.addKeeper(beside: a)
        let subs = [
            kept,
            try a.store.collection("items").findAll().subscribe(),
            try s.store.collection("items").findAll().subscribe(),
        ]
        try a.store.collection("items").upsert(["_id": "d", "a": 1, "b": 2])
        try sim.runUntilQuiet()
        sim.partition([[a, k], [s]])
        try a.store.collection("items").findByID("d").remove()
        sim.run(for: 1_000)
        _ = try s.store.collection("items").findByID("d").update { $0?["c"].set(3) }
        if reap {
            passTheTTL(sim)
            #expect(try a.documents.state(id: "d", in: "items") == nil, "A reaped d's tombstone")
        } else {
            sim.run(for: ttl / 2)
        }
        sim.heal()
        try sim.runUntilQuiet()
        for node in [a, s] {
            let shown = try get(node, "d")
            #expect(shown == ["_id": "d", "c": 3], "\(node.name) shows \(shown.map(JSON.string) ?? "nothing")")
        }
        try sim.check()
        _ = subs
    }

    /// S writes d {old: 1}; A (whole collection, like S) holds it, and S is cut off. A removes
    /// d, reaps the tombstone after the TTL, and writes d again as {new: 2} (F01: "a recreated ID
    /// is new everywhere"). The partition heals.
    ///
    /// Promised: S's copy of before the remove is a stale copy (docs/DATA-MODEL.md: removed
    /// documents "never appear on the nodes that had removed them"); d is {new: 2} everywhere,
    /// as it is when the tombstone is still there (the control below).
    ///
    /// Failed before reaped keys kept their tombstone's state: A and S both end with {old: 1, new: 2}. A's recreated d has no remove
    /// context (a local write to an `_id` with no row starts from an empty state; nothing looks
    /// at the reaped key), and the reaped-key check of DocumentStore+Merge.swift `mergeState`
    /// (about line 265) runs only when `stored == nil`: with a row present, S's stale state is
    /// joined as usual, and `old`, written by S (so not covered by A's new write vector), comes
    /// back on A; S merges A's {new: 2} into {old: 1} alike.
    @Test func aDocumentRecreatedAfterItsTombstoneWasReapedDoesNotTakeBackTheOldFields() throws {
        try Self.recreateAfterRemove(seed: 9106, reap: true, oldWrittenByStaleNode: true)
    }

    /// Control: the same within the TTL. Both show {new: 2}. Passes.
    @Test func aDocumentRecreatedWithinTheTTLDoesNotTakeBackTheOldFields() throws {
        try Self.recreateAfterRemove(seed: 9107, reap: false, oldWrittenByStaleNode: true)
    }

    /// As the failing one, but A wrote {old: 1} itself. Passes: A's new write vector covers its
    /// own earlier stamp, so the join drops `old` from S's stale state (DATA-MODEL.md, the
    /// dot-store rule), reaped tombstone or not.
    @Test func aDocumentItsOwnWriterRecreatedAfterTheReapDoesNotTakeBackTheOldFields() throws {
        try Self.recreateAfterRemove(seed: 9108, reap: true, oldWrittenByStaleNode: false)
    }

    static func recreateAfterRemove(seed: UInt64, reap: Bool, oldWrittenByStaleNode: Bool) throws {
        let sim = try simulation(seed: seed)
        let a = try sim.addNode("a")
        let s = try sim.addNode("s")
        sim.connect(s, a)
        let (k, kept) = try sim.addKeeper(beside: a)
        let subs = [
            kept,
            try a.store.collection("items").findAll().subscribe(),
            try s.store.collection("items").findAll().subscribe(),
        ]
        try (oldWrittenByStaleNode ? s : a).store.collection("items").upsert(["_id": "d", "old": 1])
        try sim.runUntilQuiet()
        sim.partition([[a, k], [s]])
        try a.store.collection("items").findByID("d").remove()
        if reap {
            passTheTTL(sim)
            #expect(try a.documents.state(id: "d", in: "items") == nil, "A reaped d's tombstone")
        } else {
            sim.run(for: ttl / 2)
        }
        try a.store.collection("items").upsert(["_id": "d", "new": 2])
        sim.heal()
        try sim.runUntilQuiet()
        for node in [a, s] {
            let shown = try get(node, "d")
            #expect(shown == ["_id": "d", "new": 2], "\(node.name) shows \(shown.map(JSON.string) ?? "nothing")")
        }
        try sim.check()
        _ = subs
    }

    // MARK: Eviction stubs and reaped tombstones

    /// A and S subscribe to the whole collection and hold d {a: 1, b: 2} (written by A). S is
    /// cut off and evicts d (A acknowledged A's own writes, so the stub drops their values; the
    /// refetch waits for the heal). A removes d and, after the TTL, reaps the tombstone. Still
    /// cut off, S writes `c = 3` to d (an upsert of `c` alone, which starts from the stub). The
    /// partition heals.
    ///
    /// Promised: as against the tombstone (the control below), d comes back with the write A
    /// had not seen, {c: 3}, on both, and `check()` holds (no value withheld that no node holds:
    /// docs/SIMULATION.md; DATA-MODEL.md rule 8).
    ///
    /// Failed before reaped keys kept their tombstone's state: both show {c: 3}, but both hold d with `a` and `b` withheld for good (values
    /// no node holds: `check()` reports it), so d stays on the withholding list and is asked of
    /// every peer once per connection, and after every restart, for as long as the nodes run.
    /// Same cause as `anEditConcurrentWithAReapedRemoveBringsBackOnlyTheEdit`: A merges S's
    /// state (the stub's withheld entries plus `c`) into an empty state, because the reaped key
    /// keeps only the remove's time, not its context; the tombstone's context covered `a` and
    /// `b` and dropped the withheld entries (the control).
    @Test func aWriteToAStubOfADocumentRemovedAndReapedElsewhereBringsBackOnlyThatWrite() throws {
        try Self.writeToAStub(seed: 9111, reap: true)
    }

    /// Control: the same within the TTL.
    @Test func aWriteToAStubOfADocumentRemovedElsewhereBringsBackOnlyThatWrite() throws {
        try Self.writeToAStub(seed: 9112, reap: false)
    }

    static func writeToAStub(seed: UInt64, reap: Bool) throws {
        let sim = try simulation(seed: seed)
        let a = try sim.addNode("a")
        let s = try sim.addNode("s")
        sim.connect(s, a)
        let (k, kept) = try sim.addKeeper(beside: a)
        let subs = [
            kept,
            try a.store.collection("items").findAll().subscribe(),
            try s.store.collection("items").findAll().subscribe(),
        ]
        try a.store.collection("items").upsert(["_id": "d", "a": 1, "b": 2])
        try sim.runUntilQuiet()
        sim.partition([[a, k], [s]])
        #expect(try s.store.collection("items").findByID("d").evict())
        try a.store.collection("items").findByID("d").remove()
        if reap {
            passTheTTL(sim)
            #expect(try a.documents.state(id: "d", in: "items") == nil, "A reaped d's tombstone")
        } else {
            sim.run(for: ttl / 2)
        }
        try s.store.collection("items").upsert(["_id": "d", "c": 3])
        sim.heal()
        try sim.runUntilQuiet()
        for node in [a, s] {
            let shown = try get(node, "d")
            #expect(shown == ["_id": "d", "c": 3], "\(node.name) shows \(shown.map(JSON.string) ?? "nothing")")
            let withheld = try node.documents.state(id: "d", in: "items")?.withheldEntryCount ?? 0
            #expect(withheld == 0, "\(node.name) withholds \(withheld) entries of d")
        }
        try sim.check()
        _ = subs
    }

    /// S evicts d while cut off (its refetch waits); A removes d and reaps the tombstone. The
    /// partition heals: S's refetch of d is answered by a peer that has nothing of d any more.
    ///
    /// Promised: d shows nowhere (S keeps a stub, which shows nothing), the mesh goes quiet (no
    /// refetch loop), and `check()` holds.
    @Test func aRefetchAnsweredByAPeerThatReapedTheDocumentEnds() throws {
        let sim = try Self.simulation(seed: 9113)
        let a = try sim.addNode("a")
        let s = try sim.addNode("s")
        sim.connect(s, a)
        let (k, kept) = try sim.addKeeper(beside: a)
        let subs = [
            kept,
            try a.store.collection("items").findAll().subscribe(),
            try s.store.collection("items").findAll().subscribe(),
        ]
        try a.store.collection("items").upsert([["_id": "d", "a": 1], ["_id": "e", "a": 2]])
        try sim.runUntilQuiet()
        sim.partition([[a, k], [s]])
        #expect(try s.store.collection("items").findByID("d").evict())
        #expect(try s.store.collection("items").findByID("e").evict())
        try a.store.collection("items").findByID("d").remove()
        Self.passTheTTL(sim)
        sim.heal()
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"e\""])
        #expect(try Self.ids(a) == ["\"e\""])
        // A restart reads the stubs back and asks for d again: still nothing loops.
        sim.crash(s)
        try sim.restart(s)
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"e\""])
        try sim.check()
        _ = subs
    }

    // MARK: Relays and restored stores

    /// A chain S — R — A. A writes d1 and d2 and subscribes to nothing; R relays (no subscription
    /// of its own); S subscribes to the whole collection. S is cut off from R; A removes d1; R,
    /// which holds what it relays, receives the tombstone; after the TTL both reap it. The link
    /// heals.
    ///
    /// Promised (docs/MESH.md, "Tombstones"): S stops showing d1 at its first sync.
    ///
    /// Failed before, as `aRemoverThatSubscribesToNothing...` did: R found S's checkpoint below
    /// its floor and asked S again for what R asks of S in `items`, which is nothing (no
    /// subscription of R's, none relayed from A), so S's stale d1 never reached a node that
    /// remembers the reaped key. Now R's pages from 0 carry the tombstones it reaped.
    @Test func aRelayThatReapedAndAsksNothingStillRemovesAReapedDocumentFromAStaleSubscriber() throws {
        let sim = try Self.simulation(seed: 9114)
        let a = try sim.addNode("a")
        let r = try sim.addNode("r")
        let s = try sim.addNode("s")
        sim.connect(r, a)
        sim.connect(s, r)
        let subs = [try s.store.collection("items").findAll().subscribe()]
        try a.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"d1\"", "\"d2\""])
        sim.setLink(s, r, up: false)
        try a.store.collection("items").findByID("d1").remove()
        Self.passTheTTL(sim)
        for node in [a, r] {
            #expect(try node.documents.state(id: "d1", in: "items") == nil, "\(node.name) reaped d1's tombstone")
        }
        sim.setLink(s, r, up: true)
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"d2\""], "S still shows the document A removed and R and A reaped")
        try sim.check()
        _ = subs
    }

    /// A chain S — R — A, all three subscribed to the whole collection. S is cut off from R; A
    /// removes d1; R receives the tombstone; both reap it after the TTL. The link heals.
    /// Promised: S stops showing d1 (R removes S's stale copy again). Control for the one above.
    @Test func aRelayThatReapedRemovesAStaleCopyAgain() throws {
        let sim = try Self.simulation(seed: 9115)
        let a = try sim.addNode("a")
        let r = try sim.addNode("r")
        let s = try sim.addNode("s")
        sim.connect(r, a)
        sim.connect(s, r)
        let subs = try [a, r, s].map { (node: SimulatedNode) in try node.store.collection("items").findAll().subscribe()
        }
        try a.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        sim.setLink(s, r, up: false)
        try a.store.collection("items").findByID("d1").remove()
        Self.passTheTTL(sim)
        sim.setLink(s, r, up: true)
        try sim.runUntilQuiet()
        for node in [a, r, s] { #expect(try Self.ids(node) == ["\"d2\""], "\(node.name)") }
        try sim.check()
        _ = subs
    }

    /// A and S subscribe to the whole collection and hold d1 and d2. A backup of A is taken. A
    /// removes d1, S receives the remove, and both reap the tombstone after the TTL. Then A is
    /// restored from its backup (its log goes back: d1 live again, no reaped key).
    ///
    /// Promised: d1 does not come back (DATA-MODEL.md: stale copies meet the reaped key on S and
    /// are removed again); d2 and a write A makes after the restore reach S.
    @Test func aRemoverRestoredFromABackupOfBeforeTheRemoveDoesNotBringTheDocumentBack() throws {
        let sim = try Self.simulation(seed: 9116)
        let a = try sim.addNode("a")
        let s = try sim.addNode("s")
        sim.connect(s, a)
        let subs = try [a, s].map { (node: SimulatedNode) in try node.store.collection("items").findAll().subscribe() }
        try a.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        let backup = try sim.snapshot(a)
        try a.store.collection("items").findByID("d1").remove()
        try sim.runUntilQuiet()
        Self.passTheTTL(sim)
        for node in [a, s] { #expect(try node.documents.state(id: "d1", in: "items") == nil, "\(node.name) reaped") }
        try sim.restore(a, from: backup)
        try a.store.collection("items").upsert(["_id": "d3", "v": 3])
        try sim.runUntilQuiet()
        for node in [a, s] { #expect(try Self.ids(node) == ["\"d2\"", "\"d3\""], "\(node.name)") }
        try sim.check()
        _ = subs
    }

    /// As above, but the stale node S is restored from a backup of before the remove, after both
    /// reaped. Promised: d1 does not come back; S's restored copy is removed again.
    @Test func aSubscriberRestoredFromABackupOfBeforeTheRemoveDoesNotBringTheDocumentBack() throws {
        let sim = try Self.simulation(seed: 9117)
        let a = try sim.addNode("a")
        let s = try sim.addNode("s")
        sim.connect(s, a)
        let subs = try [a, s].map { (node: SimulatedNode) in try node.store.collection("items").findAll().subscribe() }
        try a.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        let backup = try sim.snapshot(s)
        try a.store.collection("items").findByID("d1").remove()
        try sim.runUntilQuiet()
        Self.passTheTTL(sim)
        try sim.restore(s, from: backup)
        try sim.runUntilQuiet()
        for node in [a, s] { #expect(try Self.ids(node) == ["\"d2\""], "\(node.name)") }
        try sim.check()
        _ = subs
    }

    // MARK: A tombstone made again is weaker than the one reaped

    /// Four nodes, all subscribed to the whole collection, all linked: A, B, S1, S2. A writes
    /// d {v: 1}; everyone holds it. S1 is cut off. B sets `x = 5` on d; A and S2 receive it. B
    /// and S2 are cut off, each alone. A removes d and, after the TTL, reaps the tombstone. S1
    /// comes back (to A alone) with its stale copy {v: 1}: A removes it again with a new stamp
    /// (DocumentStore+Merge.swift, `.revived`), and S1 receives that tombstone. Then S2 comes
    /// back with its stale copy {v: 1, x: 5}, also from before the remove; last, B.
    ///
    /// Promised (docs/DATA-MODEL.md, "No resurrection", and MESH.md: removed documents "never
    /// appear on the nodes that had removed them"; the reaped keys are kept 180 days): d shows
    /// nowhere.
    ///
    /// Failed before reaped keys kept their tombstone's state: d comes back as {x: 5} on every node. The tombstone made again for S1's copy
    /// is S1's stale state plus a remove with A's new stamp: its context covers what S1 had
    /// seen and A's own writes, not B's `x`, which S1 never received. A now holds that tombstone
    /// as a row, so when S2's copy arrives the reaped-key check (DocumentStore+Merge.swift
    /// `mergeState`, about line 265, only when `stored == nil`) is skipped, and the join keeps
    /// `x`, which the weaker context does not cover. The original tombstone covered it.
    @Test func aSecondStaleCopyDoesNotComeBackThroughATombstoneMadeAgainForTheFirst() throws {
        let sim = try Self.simulation(seed: 9118)
        let a = try sim.addNode("a")
        let b = try sim.addNode("b")
        let s1 = try sim.addNode("s1")
        let s2 = try sim.addNode("s2")
        sim.connectAll()
        let subs = try sim.nodes.map { (node: SimulatedNode) in try node.store.collection("items").findAll().subscribe()
        }
        let (k, kept) = try sim.addKeeper(beside: a)
        try a.store.collection("items").upsert(["_id": "d", "v": 1])
        try sim.runUntilQuiet()
        sim.partition([[a, k, b, s2], [s1]])
        _ = try b.store.collection("items").findByID("d").update { $0?["x"].set(5) }
        try sim.runUntilQuiet()
        #expect(try Self.get(s2, "d") == ["_id": "d", "v": 1, "x": 5])
        sim.partition([[a, k], [b], [s1], [s2]])
        try a.store.collection("items").findByID("d").remove()
        Self.passTheTTL(sim)
        #expect(try a.documents.state(id: "d", in: "items") == nil, "a reaped")
        sim.partition([[a, k, s1], [b], [s2]])
        try sim.runUntilQuiet()
        for node in [a, s1] { #expect(try Self.get(node, "d") == nil, "\(node.name) after S1 came back") }
        sim.partition([[a, k, s1, s2], [b]])
        try sim.runUntilQuiet()
        sim.heal()
        try sim.runUntilQuiet()
        for node in sim.nodes {
            let shown = try Self.get(node, "d")
            #expect(shown == nil, "\(node.name) shows \(shown.map(JSON.string) ?? "nothing")")
        }
        _ = (subs, kept)
    }

    // MARK: Clock trouble

    /// A and S subscribe to the whole collection and hold d1 and d2; reaped keys are kept ten
    /// minutes (`reapedKeyRetention`; TTL two). S is cut off. A removes d1 and, after the TTL,
    /// reaps the tombstone (the key is remembered). A minute later A's wall clock jumps an hour
    /// ahead for two minutes (a bad NTP answer, a wrong RTC at boot), then is right again; A
    /// writes nothing meanwhile. Seven minutes after the remove S comes back, well within TTL
    /// plus retention (twelve minutes).
    ///
    /// Promised (docs/MESH.md, "Tombstones": only "a node away longer than the TTL plus the
    /// retention ... can bring documents back"; DATA-MODEL.md: a node whose clock runs ahead
    /// reaps early, and "what it reaped is still covered by the reaped keys"): d1 stays removed.
    ///
    /// Failed before the reaper kept its own clock (StoreOptions.elapsed): d1 is back on A and S. While its clock was an hour ahead, A's reaper
    /// (DocumentStore+Tombstones.swift `reapExpiredTombstones`, the `DELETE FROM reaped WHERE
    /// reaped_at <= now - retention`) forgot the reaped key, judging its age by the wrong clock;
    /// nothing brings it back when the clock is right again, so S's stale copy is taken as new.
    @Test func aClockThatJumpedAheadForAMomentDoesNotForgetReapedKeys() throws {
        let sim = try Self.simulation(seed: 9121)
        sim.storeOptions.reapedKeyRetention = 600_000
        let a = try sim.addNode("a")
        let s = try sim.addNode("s")
        sim.connect(s, a)
        let (k, kept) = try sim.addKeeper(beside: a)
        let subs = try [a, s].map { (node: SimulatedNode) in try node.store.collection("items").findAll().subscribe() }
        try a.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        sim.partition([[a, k], [s]])
        try a.store.collection("items").findByID("d1").remove()
        Self.passTheTTL(sim)  // four minutes
        #expect(try a.documents.state(id: "d1", in: "items") == nil, "A reaped d1's tombstone")
        #expect(a.documents.reapedKeyCount == 1)
        sim.setClockOffset(a, 3_600_000)
        sim.run(for: 120_000)
        sim.setClockOffset(a, 0)
        sim.run(for: 30_000)
        #expect(a.documents.reapedKeyCount == 1, "A forgot d1's reaped key while its clock was ahead")
        sim.heal()
        try sim.runUntilQuiet()
        for node in [a, s] { #expect(try Self.ids(node) == ["\"d2\""], "\(node.name)") }
        _ = (subs, kept)
    }

    /// A chain S — R — A, all subscribed to the whole collection; R's clock runs three minutes
    /// ahead (TTL two), the others' are right. A writes d {a: 1, b: 2}. S is cut off from R for
    /// 90 s only (less than the TTL), while A removes d and, later, S sets `c = 3` on its copy.
    /// R reaps the tombstone at its next tick (to R's clock it is already three minutes old).
    ///
    /// Promised: a partition shorter than the TTL is the ordinary case: the edit comes back
    /// alone, {c: 3}, everywhere (A still holds the tombstone). Passes today (A's tombstone
    /// later covers `a` and `b` on R too), but R shows {a: 1, b: 2, c: 3} for a round trip: the
    /// early reap makes `anEditConcurrentWithAReapedRemove...` reachable without any long
    /// partition, and permanent if A is gone.
    @Test func aRelayWhoseClockRunsAheadReapsEarlyButTheEditComesBackAlone() throws {
        let sim = try Self.simulation(seed: 9122)
        let a = try sim.addNode("a")
        let r = try sim.addNode("r")
        let s = try sim.addNode("s")
        sim.connect(r, a)
        sim.connect(s, r)
        sim.setClockOffset(r, 180_000)
        let subs = try [a, r, s].map { (node: SimulatedNode) in try node.store.collection("items").findAll().subscribe()
        }
        try a.store.collection("items").upsert(["_id": "d", "a": 1, "b": 2])
        try sim.runUntilQuiet()
        sim.setLink(s, r, up: false)
        try a.store.collection("items").findByID("d").remove()
        sim.run(for: 10_000)
        _ = try s.store.collection("items").findByID("d").update { $0?["c"].set(3) }
        sim.run(for: 80_000)
        #expect(try r.documents.state(id: "d", in: "items") == nil, "R reaped d's tombstone early")
        #expect(try a.documents.state(id: "d", in: "items")?.isDeleted == true, "A still holds it")
        sim.setLink(s, r, up: true)
        try sim.runUntilQuiet()
        for node in [a, r, s] {
            let shown = try Self.get(node, "d")
            #expect(shown == ["_id": "d", "c": 3], "\(node.name) shows \(shown.map(JSON.string) ?? "nothing")")
        }
        _ = subs
    }

    /// As above, but A is gone for good (crashed, never restarted) once R holds the tombstone.
    ///
    /// Failed before reaped keys kept their tombstone's state, as `anEditConcurrentWithAReapedRemoveBringsBackOnlyTheEdit`, after a 90 s
    /// partition: R and S show {a: 1, b: 2, c: 3}. R reaped early (its clock), and merged S's
    /// edit into an empty state.
    @Test func aRelayWhoseClockRunsAheadBringsBackRemovedFieldsAfterAShortPartition() throws {
        let sim = try Self.simulation(seed: 9123)
        let a = try sim.addNode("a")
        let r = try sim.addNode("r")
        let s = try sim.addNode("s")
        sim.connect(r, a)
        sim.connect(s, r)
        sim.setClockOffset(r, 180_000)
        let subs = try [a, r, s].map { (node: SimulatedNode) in try node.store.collection("items").findAll().subscribe()
        }
        try a.store.collection("items").upsert(["_id": "d", "a": 1, "b": 2])
        try sim.runUntilQuiet()
        sim.setLink(s, r, up: false)
        try a.store.collection("items").findByID("d").remove()
        sim.run(for: 5_000)
        sim.crash(a)
        sim.run(for: 5_000)
        _ = try s.store.collection("items").findByID("d").update { $0?["c"].set(3) }
        sim.run(for: 80_000)
        #expect(try r.documents.state(id: "d", in: "items") == nil, "R reaped d's tombstone early")
        sim.setLink(s, r, up: true)
        try sim.runUntilQuiet()
        for node in [r, s] {
            let shown = try Self.get(node, "d")
            #expect(shown == ["_id": "d", "c": 3], "\(node.name) shows \(shown.map(JSON.string) ?? "nothing")")
        }
        _ = subs
    }

    // MARK: Eviction of an unacknowledged write

    /// A and S subscribe to the whole collection and hold d {a: 1, b: 2}. S is cut off. A
    /// removes d; then S, which has not seen the remove, sets `c = 3` and at once evicts d: the
    /// stub keeps the whole state, as no peer acknowledged `c` (DATA-MODEL.md rule 8). A reaps
    /// the tombstone after the TTL. The partition heals; S's stub goes to A whole.
    ///
    /// Promised: the eviction loses nothing ("evicting right after writing offline is safe",
    /// MESH.md), and the write comes back alone, {c: 3}, on both (S's refetch brings it back).
    ///
    /// Failed before reaped keys kept their tombstone's state: both show {a: 1, b: 2, c: 3}: the write is kept, but A merges the stub into
    /// an empty state (same cause as `anEditConcurrentWithAReapedRemoveBringsBackOnlyTheEdit`).
    @Test func anUnacknowledgedWriteEvictedOfflineComesBackAloneAfterAReapedRemove() throws {
        let sim = try Self.simulation(seed: 9131)
        let a = try sim.addNode("a")
        let s = try sim.addNode("s")
        sim.connect(s, a)
        let (k, kept) = try sim.addKeeper(beside: a)
        let subs = try [a, s].map { (node: SimulatedNode) in try node.store.collection("items").findAll().subscribe() }
        try a.store.collection("items").upsert(["_id": "d", "a": 1, "b": 2])
        try sim.runUntilQuiet()
        sim.partition([[a, k], [s]])
        try a.store.collection("items").findByID("d").remove()
        sim.run(for: 1_000)
        _ = try s.store.collection("items").findByID("d").update { $0?["c"].set(3) }
        #expect(try s.store.collection("items").findByID("d").evict())
        Self.passTheTTL(sim)
        #expect(try a.documents.state(id: "d", in: "items") == nil, "A reaped d's tombstone")
        sim.heal()
        try sim.runUntilQuiet()
        for node in [a, s] {
            let shown = try Self.get(node, "d")
            #expect(shown == ["_id": "d", "c": 3], "\(node.name) shows \(shown.map(JSON.string) ?? "nothing")")
        }
        _ = (subs, kept)
    }
}
