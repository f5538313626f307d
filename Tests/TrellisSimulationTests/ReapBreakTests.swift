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
    /// FAILS today: S shows d1 for good. W finds S's checkpoint below its floor and sends S its
    /// subscription again from 0 (d1 is not in it: no row), and "asks the subscriber again for
    /// its own subscriptions in c from since 0" (Replicator, PROTOCOL.md §2 step 5) — but W asks
    /// S nothing in `items`, so S never sends its stale copy of d1, W never removes it again,
    /// and no remove ever reaches S. With a query of W's in `items` that d1 does not match, S
    /// sends d1 back anyway (the next test, which passes).
    @Test func aRemoverThatSubscribesToNothingLeavesAStaleSubscriberShowingAReapedDocument() throws {
        let (sim, w, s, subs) = try Self.writerAndSubscriber(seed: 9101, writerQuery: nil)
        sim.partition([[w], [s]])
        try w.store.collection("items").findByID("d1").remove()
        Self.passTheTTL(sim)
        #expect(try w.documents.state(id: "d1", in: "items") == nil, "W reaped d1's tombstone")
        sim.heal()
        try sim.runUntilQuiet()
        #expect(try Self.ids(w) == ["\"d2\""])
        #expect(try Self.ids(s) == ["\"d2\""], "S still shows the document W removed and reaped")
        _ = subs
    }

    /// As above, but W subscribes to `v == 2` (it asks S for something in `items`: d2, not d1).
    /// Passes: W asks S again from 0 for `v == 2`, and S sends d1 with it although d1 does not
    /// match (as far as I can tell, as a document W itself sent S: PROTOCOL.md §2 step 5); W
    /// removes it again and S receives the remove.
    @Test func aRemoverWithANarrowQueryStillRemovesAReapedDocumentFromAStaleSubscriber() throws {
        let (sim, w, s, subs) = try Self.writerAndSubscriber(seed: 9102, writerQuery: "v == 2")
        sim.partition([[w], [s]])
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
        let (sim, w, s, subs) = try Self.writerAndSubscriber(seed: 9103, writerQuery: nil)
        sim.partition([[w], [s]])
        try w.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl / 2)
        sim.heal()
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"d2\""])
        _ = subs
    }

    /// W writes d1 {v: 1} and d2 {v: 2}; S subscribes to the whole collection, dials W, and
    /// holds both. W subscribes to `writerQuery` if any.
    static func writerAndSubscriber(seed: UInt64, writerQuery: String?) throws -> (
        Simulation, SimulatedNode, SimulatedNode, [Subscription]
    ) {
        let sim = try simulation(seed: seed)
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(s, w)
        var subs = [try s.store.collection("items").findAll().subscribe()]
        if let writerQuery { subs.append(try w.store.collection("items").find(writerQuery).subscribe()) }
        try w.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try ids(s) == ["\"d1\"", "\"d2\""])
        return (sim, w, s, subs)
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
    /// FAILS today: every node shows {a: 1, b: 2, c: 3}, the removed fields come back. A holds no
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
        let subs = [
            try a.store.collection("items").findAll().subscribe(),
            try s.store.collection("items").findAll().subscribe(),
        ]
        try a.store.collection("items").upsert(["_id": "d", "a": 1, "b": 2])
        try sim.runUntilQuiet()
        sim.partition([[a], [s]])
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
    /// FAILS today: A and S both end with {old: 1, new: 2}. A's recreated d has no remove
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
        let subs = [
            try a.store.collection("items").findAll().subscribe(),
            try s.store.collection("items").findAll().subscribe(),
        ]
        try (oldWrittenByStaleNode ? s : a).store.collection("items").upsert(["_id": "d", "old": 1])
        try sim.runUntilQuiet()
        sim.partition([[a], [s]])
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
}
