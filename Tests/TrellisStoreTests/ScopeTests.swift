import Testing
import TrellisCore
import TrellisStore
import TrellisTestKit

/// Documents leaving a query subscription's scope (F20), and tombstones only for the query
/// subscribers that may hold the document (issue 8 item 17).
@Suite struct ScopeTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()

    func set(_ path: String, _ value: Value) throws -> DocumentMutation {
        .set(try FieldPath(parsing: path), value, isDefault: false)
    }

    /// The `_id`s of a change-log page of `spec` served to a peer, from the start.
    func served(_ store: DocumentStore, _ spec: SubscriptionSpec) throws -> [Value] {
        try store.changes(
            in: spec.collection, after: 0, limit: 10_000, maxBytes: .max, matching: Query(spec.query), args: spec.args,
            servedAs: spec
        ).records.map(\.id)
    }

    @Test func aRemovedDocumentReachesOnlyTheQuerySubscribersItMatched() throws {
        let store = try openStore(dir, "a.sqlite", clock: clock)
        let bob = SubscriptionSpec(collection: "messages", query: "to == 'bob'")
        _ = try served(store, bob)  // a peer subscribes before anything is written
        try store.upsert(
            [["_id": "m1", "to": "alice", "body": "secret"], ["_id": "m2", "to": "bob", "body": "hi"]],
            in: "messages")
        #expect(try served(store, bob) == ["m2"])
        try store.remove(id: "m1", in: "messages")
        try store.remove(id: "m2", in: "messages")
        // Bob's subscriber learns that m2, which it may hold, is gone; nothing about m1.
        #expect(try served(store, bob) == ["m2"])
        let query = try Query(bob.query)
        let page = try store.changes(
            in: "messages", after: 0, limit: 100, maxBytes: .max, matching: query, servedAs: bob)
        #expect(page.records.allSatisfy { $0.isDeleted })
        // A whole-collection subscriber may hold anything: it gets both tombstones.
        #expect(try served(store, .all("messages")).count == 2)
        // A subscription that starts after the removal never held them.
        let late = SubscriptionSpec(collection: "messages", query: "to == 'carol'")
        #expect(try served(store, late) == [])
    }

    @Test func aDocumentThatLeavesTheScopeIsStillSentUntilItComesBack() throws {
        let store = try openStore(dir, "b.sqlite", clock: clock)
        let open = SubscriptionSpec(collection: "items", query: "status == 'open'")
        try store.upsert(["_id": "X", "status": "open", "title": "draft"], in: "items")
        #expect(try served(store, open) == ["X"])
        _ = try store.update(
            id: "X", in: "items", operations: [try set("title", "final"), try set("status", "closed")])
        #expect(try served(store, open) == ["X"])  // the subscriber learns it closed
        _ = try store.update(id: "X", in: "items", operations: [try set("title", "archived")])
        #expect(try served(store, open) == ["X"])  // and keeps learning of a copy it holds
        try store.upsert(["_id": "Y", "status": "closed"], in: "items")
        #expect(try served(store, open) == ["X"])  // never in scope: never sent
        _ = try store.update(id: "X", in: "items", operations: [try set("status", "open")])
        #expect(try served(store, open) == ["X"])  // back in scope: sent because it matches
    }

    @Test func servedSubscriptionsAreRememberedAcrossRestarts() throws {
        let open = SubscriptionSpec(collection: "items", query: "status == 'open'")
        do {
            let store = try openStore(dir, "c.sqlite", clock: clock)
            try store.upsert(["_id": "X", "status": "open"], in: "items")
            _ = try served(store, open)
            store.close()
        }
        let store = try openStore(dir, "c.sqlite", clock: clock)
        _ = try store.update(id: "X", in: "items", operations: [try set("status", "closed")])
        #expect(try served(store, open) == ["X"])
    }
}

extension ScopeTests {
    /// A peer holds what it sent: a document it wrote outside its own query still reaches it when
    /// it changes here (a removal included).
    @Test func aDocumentAPeerSentReachesItWhateverItsQuery() throws {
        let store = try openStore(dir, "d.sqlite", clock: clock)
        let source = try openStore(dir, "e.sqlite", clock: clock)
        let mine = SubscriptionSpec(collection: "tasks", query: "assignee == 'me'")
        try source.upsert(["_id": "t1", "assignee": "you"], in: "tasks")
        _ = try store.merge(try batch(of: source, "tasks"), from: [7], checkpoint: nil, heldBy: [mine])
        #expect(try served(store, mine) == ["t1"])
        try store.remove(id: "t1", in: "tasks")
        #expect(try served(store, mine) == ["t1"])
    }
}

extension ScopeTests {
    /// A peer served no query subscription in a collection when it sent documents there: the
    /// store notes it once (not per document), from the checkpoint the first such batch moved on
    /// from, keeps the note across a restart, and hands it over once, with the checkpoints on
    /// that peer's log for the collection moved back there and the others left alone.
    @Test func aPeerThatSentWhileServedNothingIsNotedOnce() throws {
        let source = try openStore(dir, "h.sqlite", clock: clock)
        try source.upsert(["_id": "t1", "assignee": "you"], in: "tasks")
        let (tasks, notes) = (SubscriptionSpec.all("tasks").key, SubscriptionSpec.all("notes").key)
        let mine = SubscriptionSpec(collection: "tasks", query: "assignee == 'me'")
        let epoch = source.epoch
        do {
            let store = try openStore(dir, "i.sqlite", clock: clock)
            _ = try store.merge([], from: [7], checkpoint: (subscription: tasks, Checkpoint(epoch: epoch, seq: 3)))
            _ = try store.merge(
                try batch(of: source, "tasks"), from: [7],
                checkpoint: (subscription: tasks, Checkpoint(epoch: epoch, seq: 5)),
                unserved: true)
            _ = try store.merge(
                try batch(of: source, "tasks"), from: [7],
                checkpoint: (subscription: tasks, Checkpoint(epoch: epoch, seq: 9)),
                unserved: true)
            _ = try store.merge([], from: [7], checkpoint: (subscription: notes, Checkpoint(epoch: epoch, seq: 1)))
            _ = try store.merge(try batch(of: source, "tasks"), from: [8], checkpoint: nil)
            #expect(try store.servedQueries(peer: [8], subscriptions: [mine], askAgain: true) == nil)  // it was served
            store.close()
        }
        let store = try openStore(dir, "i.sqlite", clock: clock)
        #expect(
            try store.servedQueries(
                peer: [7], subscriptions: [SubscriptionSpec(collection: "notes", query: "x == 1")], askAgain: true)
                == nil)
        #expect(try store.servedQueries(peer: [7], subscriptions: [mine], askAgain: true) == 3)
        #expect(try store.checkpoint(peer: [7], subscription: tasks)?.seq == 3)
        #expect(try store.checkpoint(peer: [7], subscription: notes)?.seq == 1)
        #expect(try store.servedQueries(peer: [7], subscriptions: [mine], askAgain: true) == nil)  // handed over once
    }

    /// What a peer held through a query subscription it is no longer served, the ones it is
    /// served instead hold too, on this connection or a later one: the records are copied once.
    @Test func heldDocumentsPassToTheNextSubscriptionsServed() throws {
        let store = try openStore(dir, "j.sqlite", clock: clock)
        let source = try openStore(dir, "k.sqlite", clock: clock)
        let (mine, theirs) = (
            SubscriptionSpec(collection: "tasks", query: "assignee == 'me'"),
            SubscriptionSpec(collection: "tasks", query: "assignee == 'them'")
        )
        try source.upsert(["_id": "t1", "assignee": "you"], in: "tasks")
        #expect(try store.servedQueries(peer: [7], subscriptions: [mine], askAgain: false) == nil)
        _ = try store.merge(try batch(of: source, "tasks"), from: [7], checkpoint: nil, heldBy: [mine])
        #expect(try served(store, theirs).isEmpty)
        store.close()
        let reopened = try openStore(dir, "j.sqlite", clock: clock)
        #expect(try reopened.servedQueries(peer: [7], subscriptions: [theirs], askAgain: true) == nil)
        #expect(try served(reopened, theirs) == ["t1"])
        #expect(try reopened.servedQueries(peer: [8], subscriptions: [mine], askAgain: false) == nil)
    }
}

extension ScopeTests {
    /// A peer that sends an older state of a document this node already changed (here: removed)
    /// gets the newer state, even when its subscription's cursor passed the document's row before
    /// the document entered its scope (a sweep seed found it: a wiped relay had the tombstone
    /// before a query subscriber sent its stale copy).
    @Test func aPeerThatSendsAnOlderStateGetsTheNewerOne() throws {
        let store = try openStore(dir, "f.sqlite", clock: clock)
        let source = try openStore(dir, "g.sqlite", clock: clock)
        let high = SubscriptionSpec(collection: "items", query: "v >= 5")
        try source.upsert(["_id": "d6", "v": 3], in: "items")
        let stale = try batch(of: source, "items")
        _ = try store.merge(stale, from: [1], checkpoint: nil)
        try store.remove(id: "d6", in: "items")
        let query = try Query(high.query)
        let first = try store.changes(
            in: "items", after: 0, limit: 100, maxBytes: .max, matching: query, servedAs: high)
        #expect(first.records.isEmpty)  // never in scope: the tombstone is not sent
        _ = try store.merge(stale, from: [7], checkpoint: nil, heldBy: [high])
        let next = try store.changes(
            in: "items", after: first.scannedUpTo, limit: 100, maxBytes: .max, matching: query, servedAs: high)
        #expect(next.records.map(\.id) == ["d6"])
        #expect(next.records.allSatisfy { $0.isDeleted })
        // The newer state, sent back, adds nothing: the row is not logged again.
        let newer = try store.changes(in: "items", after: 0, limit: 100, maxBytes: .max).records.map {
            RemoteDocument(collection: $0.collection, id: $0.id, state: $0.state)
        }
        _ = try store.merge(newer, from: [7], checkpoint: nil, heldBy: [high])
        let after = try store.changes(
            in: "items", after: next.scannedUpTo, limit: 100, maxBytes: .max, matching: query, servedAs: high)
        #expect(after.records.isEmpty)
    }

    /// Scope records are kept per subscription, not per peer: when one peer's copy put a document
    /// in the scope of `v >= 5`, another peer served the same subscription whose cursor had passed
    /// the row, and that sends an older state, still gets the newer one (seeds 560094 and 530723
    /// with `--queries 2`: a relay passed on a query subscriber's subscription, and sent the
    /// document before the subscriber's stale copy came).
    @Test func aSecondPeerOfTheSameSubscriptionThatSendsAnOlderStateGetsTheNewerOne() throws {
        let store = try openStore(dir, "h.sqlite", clock: clock)
        let source = try openStore(dir, "i.sqlite", clock: clock)
        let high = SubscriptionSpec(collection: "items", query: "v >= 5")
        let query = try Query(high.query)
        try source.upsert(["_id": "d6", "v": 7], in: "items")
        let stale = try batch(of: source, "items")
        _ = try store.merge(stale, from: [1], checkpoint: nil)
        try store.update(id: "d6", in: "items", operations: [try set("v", 1)])
        // Peer 7 subscribes to `v >= 5`; its cursor passes d6's row, which does not match.
        let first = try store.changes(
            in: "items", after: 0, limit: 100, maxBytes: .max, matching: query, servedAs: high)
        #expect(first.records.isEmpty)
        // Peer 8 relays the same subscription and sends the newer state: d6 enters the scope, unchanged.
        let current = try store.changes(in: "items", after: 0, limit: 100, maxBytes: .max).records.map {
            RemoteDocument(collection: $0.collection, id: $0.id, state: $0.state)
        }
        _ = try store.merge(current, from: [8], checkpoint: nil, heldBy: [high])
        // Peer 7 wrote d6 itself and sends its older state: the newer one must reach it.
        _ = try store.merge(stale, from: [7], checkpoint: nil, heldBy: [high])
        let next = try store.changes(
            in: "items", after: first.scannedUpTo, limit: 100, maxBytes: .max, matching: query, servedAs: high)
        #expect(next.records.map(\.id) == ["d6"])
    }
}
