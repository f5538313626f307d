import Testing
import TrellisCore
import TrellisStore
import TrellisTestKit

/// What a peer holds because this node served it a whole collection (`whole_held`,
/// DocumentStore+Scope.swift): a later query subscription of that peer's is also sent the
/// changes to those documents, and nothing born after the service.
@Suite struct WholeHeldTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()
    let peer: [UInt8] = Array(repeating: 7, count: 32)
    let high = SubscriptionSpec(collection: "items", query: "v >= 5")

    /// The `_id`s of a page of `spec` read for the peer from `after`.
    func page(
        _ store: DocumentStore, _ spec: SubscriptionSpec, after: Int64 = 0, acknowledged: Int64 = 0,
        sendsHeld: Bool = true
    ) throws -> ChangePage {
        try store.changes(
            in: spec.collection, after: after, limit: 10_000, maxBytes: .max, matching: Query(spec.query),
            args: spec.args, servedAs: spec,
            reader: PageReader(peer: peer, acknowledgedUpTo: acknowledged, sendsHeld: sendsHeld))
    }

    @Test func aQueryPageCarriesTheChangesToWhatAWholeServiceSent() throws {
        let store = try openStore(dir, "a.sqlite", clock: clock)
        for (n, v): (String, Int64) in [("d1", 2), ("d2", 3), ("d3", 6)] {
            try store.upsert(["_id": .string(n), "v": .int(v)], in: "items")
        }
        // The peer is served the whole collection: three documents, acknowledged later.
        let whole = try page(store, .all("items"))
        let end = whole.scannedUpTo
        #expect(whole.records.count == 3)
        #expect(store.wholeHeld(by: peer, in: "items") == WholeHeld(bornUpTo: end, changedAfter: 0))
        _ = try page(store, .all("items"), after: end, acknowledged: end)
        #expect(store.wholeHeld(by: peer, in: "items") == WholeHeld(bornUpTo: end, changedAfter: end))
        // A page asked for before an acknowledgement was recorded does not take it back.
        _ = try page(store, .all("items"), after: end, acknowledged: end - 1)
        #expect(store.wholeHeld(by: peer, in: "items") == WholeHeld(bornUpTo: end, changedAfter: end))
        // It now asks `v >= 5` only. d1 changes outside the query, d2 is removed, d4 is born.
        try store.upsert(["_id": "d1", "v": 4], in: "items")
        _ = try store.remove(id: "d2", in: "items")
        try store.upsert(["_id": "d4", "v": 1], in: "items")
        let narrowed = try page(store, high)
        #expect(narrowed.records.map(\.key).sorted() == ["\"d1\"", "\"d2\"", "\"d3\""])
        #expect(narrowed.records.first { $0.key == "\"d2\"" }?.isDeleted == true)
        // While the peer is still served the whole collection, its query pages carry nothing more.
        #expect(try page(store, high, sendsHeld: false).records.map(\.key) == ["\"d3\""])
        // Another peer, never served the whole collection, gets only what matches.
        let other = try store.changes(
            in: "items", after: 0, limit: 100, maxBytes: .max, matching: Query(high.query), servedAs: high,
            reader: PageReader(peer: [9], acknowledgedUpTo: 0, sendsHeld: true))
        #expect(other.records.map(\.key) == ["\"d3\""])
    }

    @Test func everyWriteKeepsTheBirthOfTheDocument() throws {
        let store = try openStore(dir, "b.sqlite", clock: clock)
        try store.upsert(["_id": "d1", "v": 1], in: "items")
        let end = try page(store, .all("items")).scannedUpTo
        try store.heldAcknowledged(peer: peer, collection: "items", upTo: end, carriedFrom: nil)
        #expect(store.wholeHeld(by: peer, in: "items") == WholeHeld(bornUpTo: end, changedAfter: end))
        // A local write, an update, a merged state, a removal and an eviction each move the
        // document's `seq` on; it still counts as born at 1.
        try store.upsert(["_id": "d1", "v": 2], in: "items")
        _ = try store.update(
            id: "d1", in: "items", operations: [.set(try FieldPath(parsing: "v"), .int(3), isDefault: false)])
        let other = try openStore(dir, "other.sqlite", clock: clock)
        try other.upsert(["_id": "d1", "w": 1], in: "items")
        _ = try store.merge(try batch(of: other, "items"), from: [1], checkpoint: nil)
        #expect(try page(store, high).records.map(\.key) == ["\"d1\""])
        _ = try store.remove(id: "d1", in: "items")
        #expect(try page(store, high).records.first?.isDeleted == true)
        try store.upsert(["_id": "d1", "v": 0], in: "items")
        #expect(try store.evict(id: "d1", in: "items"))
        try store.upsert(["_id": "d1", "v": 1], in: "items")
        #expect(try page(store, high).records.map(\.key) == ["\"d1\""])
    }

    @Test func carriedAcknowledgementsMoveThePositionOnlyWhenTheyCoverIt() throws {
        let store = try openStore(dir, "d.sqlite", clock: clock)
        try store.upsert(["_id": "d1", "v": 1], in: "items")
        let end = try page(store, .all("items")).scannedUpTo
        try store.heldAcknowledged(peer: peer, collection: "items", upTo: end, carriedFrom: nil)
        try store.upsert(["_id": "d1", "v": 2], in: "items")
        try store.upsert(["_id": "d2", "v": 2], in: "items")
        let narrowed = try page(store, high)
        #expect(narrowed.heldFrom == end)
        #expect(narrowed.records.map(\.key) == ["\"d1\""])
        // A query subscription that carried them only from after the position says nothing of
        // what came between; one that carried them from it moves the position on.
        try store.heldAcknowledged(peer: peer, collection: "items", upTo: end + 2, carriedFrom: end + 1)
        #expect(store.wholeHeld(by: peer, in: "items")?.changedAfter == end)
        try store.heldAcknowledged(peer: peer, collection: "items", upTo: end + 2, carriedFrom: end)
        #expect(store.wholeHeld(by: peer, in: "items")?.changedAfter == end + 2)
        #expect(try page(store, high).records.isEmpty)
        // Never behind: an older acknowledgement changes nothing.
        try store.heldAcknowledged(peer: peer, collection: "items", upTo: end + 1, carriedFrom: 0)
        #expect(store.wholeHeld(by: peer, in: "items")?.changedAfter == end + 2)
        // Without a whole-collection service, a query page carries nothing and says so.
        #expect(try page(store, high, sendsHeld: false).heldFrom == nil)
    }

    @Test func theRecordOutlivesARestart() throws {
        let path = "c.sqlite"
        do {
            let store = try openStore(dir, path, clock: clock)
            try store.upsert(["_id": "d1", "v": 1], in: "items")
            let end = try page(store, .all("items")).scannedUpTo
            try store.heldAcknowledged(peer: peer, collection: "items", upTo: end, carriedFrom: nil)
        }
        let store = try openStore(dir, path, clock: clock)
        let held = try #require(store.wholeHeld(by: peer, in: "items"))
        #expect(held.changedAfter == held.bornUpTo)
        try store.upsert(["_id": "d1", "v": 2], in: "items")
        #expect(try page(store, high).records.map(\.key) == ["\"d1\""])
    }
}
