import Foundation
import Synchronization
import Testing
import TrellisCore
import TrellisStore
import TrellisSync
import TrellisTestKit

/// Failure scenarios from the field (F01, F02, F03, F13), with the expected values they name.
@Suite struct FieldCaseTests {
    let dir = TemporaryDirectory()

    /// The remote form of a document's current state on `node`.
    func snapshot(_ node: TestNode, _ id: Value, _ collection: String = "items") throws -> RemoteDocument {
        let record = try #require(
            try node.store.changes(in: collection, after: 0, limit: 1_000_000, maxBytes: .max).records.first {
                $0.id == id
            })
        return RemoteDocument(collection: collection, id: id, state: record.state)
    }

    @Test func f01RecreatedID() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        try b.engine.subscribe(SubscriptionSpec(collection: "items"))
        _ = b.connect(a)
        try a.store.upsert(["_id": "d1", "v": "one"], in: "items")
        var changes = [try snapshot(a, "d1")]
        #expect(eventually { (try? b.store.document(id: "d1", in: "items"))??["v"] == "one" })
        let anchor = b.store.lastSeq  // B's anchor, taken before the remove
        try a.store.remove(id: "d1", in: "items")
        changes.append(try snapshot(a, "d1"))
        #expect(eventually { (try? b.ids("items")) == [] })
        try a.store.upsert(["_id": "d1", "v": "new"], in: "items")
        changes.append(try snapshot(a, "d1"))
        #expect(eventually { (try? b.store.document(id: "d1", in: "items"))??["v"] == "new" })

        // A fresh C receives the three changes in every order.
        let expected: Value = ["_id": "d1", "v": "new"]
        for order in [[0, 1, 2], [2, 1, 0], [1, 0, 2], [1, 2, 0], [2, 0, 1], [0, 2, 1]] {
            let c = try DocumentStore(path: dir.path("c-\(order.map(String.init).joined()).sqlite"))
            for i in order { _ = try c.merge([changes[i]], from: a.key, checkpoint: nil) }
            #expect(try c.document(id: "d1", in: "items") == expected, "order \(order)")
            #expect(try c.documents(in: "items").count == 1)  // listed once
        }
        #expect(try a.store.document(id: "d1", in: "items") == expected)
        #expect(try b.store.document(id: "d1", in: "items") == expected)
        // B's change enumeration from the anchor ends with d1 present.
        let page = try b.store.changes(in: "items", after: anchor, limit: 100, maxBytes: .max)
        #expect(page.records.map(\.id) == ["d1"])
        #expect(page.records.last?.isDeleted == false)
    }

    @Test func f02OfflineEditAgainstADelete() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        for node in [a, b] { try node.engine.subscribe(SubscriptionSpec(collection: "items")) }
        let (link, _) = b.connect(a)
        try a.store.upsert(["_id": "d1", "n": 1], in: "items")
        #expect(eventually { (try? b.store.document(id: "d1", in: "items"))??["n"] == 1 })
        link.close()  // partition
        #expect(eventually { a.engine.peers.isEmpty && b.engine.peers.isEmpty })
        let anchorA = a.store.lastSeq
        let anchorB = b.store.lastSeq
        try a.store.remove(id: "d1", in: "items")
        try b.store.upsert(["_id": "d1", "n": 2], in: "items")
        _ = b.connect(a)  // heal
        // Add-wins: d1 is present with what the remover had not seen.
        let expected: Value = ["_id": "d1", "n": 2]
        #expect(eventually { (try? a.store.document(id: "d1", in: "items")) == .some(expected) })
        #expect(try b.store.document(id: "d1", in: "items") == expected)
        let c = try TestNode(dir, "c")
        try c.engine.subscribe(SubscriptionSpec(collection: "items"))
        _ = c.connect(a)
        #expect(eventually { (try? c.store.document(id: "d1", in: "items")) == .some(expected) })
        #expect(try c.store.documents(in: "items") == [expected])
        // Every node's state is the same, and each change enumeration shows one net change for d1.
        let states = try [a, b, c].map { try #require(try $0.store.state(id: "d1", in: "items")) }
        #expect(states.allSatisfy { $0 == states[0] })
        for (node, anchor) in [(a, anchorA), (b, anchorB), (c, 0)] {
            let page = try node.store.changes(in: "items", after: anchor, limit: 100, maxBytes: .max)
            #expect(page.records.filter { $0.id == "d1" }.count == 1)
            #expect(page.records.last?.isDeleted == false)
        }
    }

    @Test func f03CreatedAndRemovedInsideOneBatch() throws {
        let a = try TestNode(dir, "a")
        try a.store.upsert(["_id": "d1", "v": 1], in: "items")
        try a.store.remove(id: "d1", in: "items")
        try a.store.upsert(["_id": "d2", "v": 2], in: "items")
        let c = try TestNode(dir, "c")
        let sawD1 = Mutex(false)
        let token = c.store.addObserver { _ in
            if (try? c.store.document(id: "d1", in: "items")) != nil { sawD1.withLock { $0 = true } }
        }
        try c.engine.subscribe(SubscriptionSpec(collection: "items"))
        _ = c.connect(a)
        #expect(eventually { (try? c.ids("items")) == ["d2"] })
        c.store.removeObserver(token)
        #expect(!sawD1.withLock { $0 })  // C never showed d1 live
        #expect(try c.store.state(id: "d1", in: "items")?.isDeleted == true)  // it holds the tombstone
        // A's content omits d1; its change enumeration from the start reports at most a deletion.
        #expect(try a.ids("items") == ["d2"])
        let d1 = try a.store.changes(in: "items", after: 0, limit: 100, maxBytes: .max).records.filter { $0.id == "d1" }
        #expect(d1.count == 1 && d1[0].isDeleted)
    }

    @Test func f13OddFieldNamesReplicateByteForByte() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        try b.engine.subscribe(SubscriptionSpec(collection: "items"))
        _ = b.connect(a)
        let odd: Value = [
            "_id": "d1", "": 1, "_x": 2, "a.b": 3, "$c": 4, "e\u{301}": 5, "a b": ["x.y": 7],
        ]
        try a.store.upsert(odd, in: "items")
        try a.store.upsert(["_id": "d2", "v": "normal"], in: "items")
        #expect(eventually { (try? b.store.count(in: "items")) == 2 })
        let onB = try #require(try b.store.document(id: "d1", in: "items"))
        #expect(onB == odd)
        #expect(onB.mapValue?.count == 7)  // no field dropped
        #expect(onB.mapValue?.keys.contains { Array($0.utf8) == [0x65, 0xCC, 0x81] } == true)  // bytes kept
        // Queries reach odd names through backticks.
        #expect(try b.store.documents(in: "items", matching: Query("`a.b` == 3")).count == 1)
        // The one spelling that JSON reserves for bytes is refused with a clear error.
        let reserved = #expect(throws: StoreError.self) {
            try a.store.upsert(["_id": "d3", "m": ["$bytes": 1, "x": 2]], in: "items")
        }
        #expect(reserved?.description.contains("$bytes") == true)
    }
}
