import Synchronization
import Testing
import TrellisCore
import TrellisStore
import TrellisTestKit

/// What a commit's event says about the query subscriptions a store serves
/// (``StoreEvent/scopeChecks``): the sync engine scans only those a change concerns.
@Suite struct ScopeCheckTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()

    /// Registers `spec` as served (a first change-log page for it, as a peer's scan does).
    func serve(_ store: DocumentStore, _ spec: SubscriptionSpec) throws {
        _ = try store.changes(
            in: spec.collection, after: 0, limit: 10, maxBytes: .max, matching: Query(spec.query), args: spec.args,
            servedAs: spec)
    }

    /// The scope check of the next commit's event in `collection`, after `body`.
    func check(_ store: DocumentStore, _ collection: String, _ body: () throws -> Void) throws -> ScopeCheck? {
        let events = Mutex<[StoreEvent]>([])
        let token = store.addObserver { event in events.withLock { $0.append(event) } }
        defer { store.removeObserver(token) }
        try body()
        store.waitForObservers()
        return events.withLock { $0.last?.scopeChecks[UTF8Key(collection)] }
    }

    /// A write concerns the subscriptions its document matches now or matched before, and those
    /// that hold it; the others are checked and unconcerned. `==` subscriptions are found through
    /// their index: `4 == 4.0`, `-0.0 == 0.0`, and a missing field equals nothing.
    @Test func aCommitNamesTheSubscriptionsItConcerns() throws {
        let store = try openStore(dir, "a.sqlite", clock: clock)
        let specs = [
            "n == 1", "n == 4.0", "n == 0", "s == 'x'", "n > 3", "t == null", "s == 'y' || n == 1",
        ].map { SubscriptionSpec(collection: "c", query: $0) }
        for spec in specs { try serve(store, spec) }
        func hashes(_ queries: [String]) -> Set<Int64> {
            Set(queries.map { SubscriptionSpec(collection: "c", query: $0).scopeHash })
        }
        let all = hashes(specs.map(\.query))

        let first = try #require(try check(store, "c") { try store.upsert(["_id": "d", "n": 4, "s": "x"], in: "c") })
        #expect(first.checked == all)
        #expect(first.concerned == hashes(["n == 4.0", "s == 'x'", "n > 3"]))

        // n from 4 to 1: it left n == 4.0 and n > 3 (concerned: they must hear of it) and entered n == 1.
        let second = try #require(try check(store, "c") { try store.upsert(["_id": "d", "n": 1], in: "c") })
        #expect(second.concerned == hashes(["n == 4.0", "s == 'x'", "n > 3", "n == 1", "s == 'y' || n == 1"]))

        // -0.0 equals 0 and t null matches t == null (entered); n == 1, s == 'x' and the `||` one
        // are left (concerned); n == 4.0 and n > 3, left before, hold it still (recorded).
        let third = try #require(
            try check(store, "c") { try store.upsert(["_id": "d", "n": -0.0, "t": nil, "s": "z"], in: "c") })
        #expect(third.concerned == all)

        // A document none of them ever matched concerns none.
        let fourth = try #require(try check(store, "c") { try store.upsert(["_id": "e", "n": 99.5], in: "c") })
        #expect(fourth.concerned == hashes(["n > 3"]))
        #expect(fourth.unconcerned == all.subtracting(hashes(["n > 3"])))
    }

    /// A document merged from a query subscriber enters its subscription's scope (the sender holds
    /// it): when the merged state does not match the query and is not the one the sender holds,
    /// the commit concerns that subscription, else the sync engine would not scan for it and the
    /// sender would keep its older state (found by the simulator's sweep: a subscriber to
    /// `v >= 5` kept showing `v: 6` after reconnecting; the mesh had `v: []`).
    @Test func aDocumentMergedFromASubscriberConcernsItsSubscription() throws {
        let store = try openStore(dir, "c.sqlite", clock: clock)
        let subscriber = try openStore(dir, "d.sqlite", clock: clock)
        let high = SubscriptionSpec(collection: "items", query: "v >= 5")
        try serve(store, high)
        try subscriber.upsert(["_id": "d9", "v": 6], in: "items")  // written apart
        clock.advance(by: 1_000)
        try store.upsert(["_id": "d9", "v": 2], in: "items")  // later: wins over v: 6
        let merged = try #require(
            try check(store, "items") {
                _ = try store.merge(try batch(of: subscriber, "items"), from: [9], checkpoint: nil, heldBy: [high])
            })
        #expect(try store.document(id: "d9", in: "items")?["v"] == 2)
        #expect(merged.concerned.contains(high.scopeHash))
        #expect(!merged.unconcerned.contains(high.scopeHash))
    }

    /// Collections without served query subscriptions, and commits not every change of which was
    /// checked (a store that has served nothing), carry no check: everything scans. An eviction is
    /// checked: the document leaves the scope of the subscriptions its value matched.
    @Test func uncheckedCommitsCarryNoCheck() throws {
        let store = try openStore(dir, "b.sqlite", clock: clock)
        #expect(try check(store, "c") { try store.upsert(["_id": "d", "n": 1], in: "c") } == nil)
        try serve(store, .all("c"))  // a whole-collection subscription needs no check
        #expect(try check(store, "c") { try store.upsert(["_id": "d", "n": 2], in: "c") } == nil)
        try serve(store, SubscriptionSpec(collection: "c", query: "n == 2"))
        #expect(try check(store, "c") { try store.upsert(["_id": "d", "n": 3], in: "c") } != nil)
        let evicted = try check(store, "c") { _ = try store.evict(id: "d", in: "c") }
        #expect(evicted != nil)
    }
}
