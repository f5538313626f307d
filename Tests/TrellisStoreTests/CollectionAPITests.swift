import Foundation
import Synchronization
import Testing
import Trellis
import TrellisTestKit

@testable import TrellisStore

/// The Ditto-shaped public API (Sources/Trellis): write strategies, the update closure, cursor
/// sort / limit / offset, evict versus remove, createIndex, composite `_id`s.
@Suite struct CollectionAPITests {
    let dir = TemporaryDirectory("trellis-api")
    let node: TrellisNode
    /// The store's last `seq` when it was opened (seqs start above physical time × 1024).
    let start: Int64
    var cars: TrellisCollection { node.store.collection("cars") }

    init() throws {
        node = try TrellisNode(directory: dir.url.appendingPathComponent("node"), meshKey: .generate())
        start = node.store.documents.lastSeq
    }

    func seed() throws {
        try cars.upsert([
            ["_id": "corolla", "Name": "toyota corolla", "Origin": "Japan", "Cylinders": 4, "Horsepower": 75],
            ["_id": "civic", "Name": "honda civic", "Origin": "Japan", "Cylinders": 4, "Horsepower": 67],
            ["_id": "mustang", "Name": "ford mustang", "Origin": "USA", "Cylinders": 8, "Horsepower": 140],
            ["_id": "beetle", "Name": "vw beetle", "Origin": "Europe", "Cylinders": 4],
            ["_id": "rx7", "Name": "mazda rx-7", "Origin": "Japan", "Cylinders": 0, "Horsepower": 100.5],
        ])
    }

    /// A result's `_id` is read from its stored key: a string without escapes in its key
    /// without a parse, any other through the parser; either way it is the `_id` written.
    @Test func findResultsHaveTheIDsTheyWereWrittenWith() throws {
        let ids: [Value] = [
            "plain", "with \"quotes\"", "back\\slash", "tab\tand\nline", "\u{1}", "é€😀", "\u{7F}",
            "slash/ed", ["vin": "A1", "plant": 3], ["k": "with \"quotes\""], "\u{301}combining mark first",
            "a long string id of more than fifteen bytes", ["n": 7],
        ]
        for (n, id) in ids.enumerated() { try cars.upsert(["_id": id, "n": .int(Int64(n))]) }
        let found = try cars.findAll().exec()
        #expect(Set(found.map(\.id)) == Set(ids))
        for document in found { #expect(document.id == document.value["_id"]) }
    }

    /// `find` results keep their stored JSON and parse it when read (docs/API.md): what they
    /// show, how they compare and hash, and composite `_id`s, are as for documents made from values.
    @Test func findResultsReadTheirStoredJSONWhenAsked() throws {
        try seed()
        try cars.upsert(["_id": ["vin": "A1", "plant": 3], "Name": "composite", "Origin": "Japan", "Note": "a\u{1}b"])
        let found = try cars.find("Origin == 'Japan'").exec()
        #expect(found.map(\.id) == ["civic", "corolla", "rx7", ["plant": 3, "vin": "A1"]])
        #expect(found.map { $0["Name"] } == ["honda civic", "toyota corolla", "mazda rx-7", "composite"])
        #expect(found[2]["Horsepower"] == 100.5 && found[2]["Missing"] == nil)
        #expect(found[3]["Note"] == "a\u{1}b")  // a \u escape: parsed at once, read the same way
        let expected: Value = [
            "_id": "corolla", "Name": "toyota corolla", "Origin": "Japan", "Cylinders": 4, "Horsepower": 75,
        ]
        #expect(found[1].value == expected)
        #expect(found[1] == Document(value: expected) && Document(value: expected) == found[1])
        #expect(found[1].hashValue == Document(value: expected).hashValue)
        #expect(found[1].json == JSON.string(expected))
        let again = try cars.find("Origin == 'Japan'").exec()
        #expect(again == found && Set(again) == Set(found))
        #expect(found[0] != found[1])
        // Sorted and windowed results too.
        let sorted = try cars.find("Origin == 'Japan'").sort("Horsepower", direction: .descending).limit(2).exec()
        #expect(sorted.map { $0["Name"] } == ["mazda rx-7", "toyota corolla"])
    }

    @Test func upsertTakesAWriteStrategy() throws {
        try cars.upsert(["_id": "c", "Name": "real", "Seats": 4])
        let strategy: WriteStrategy = .insertIfAbsent
        try cars.upsert(["_id": "c", "Name": "ignored"], writeStrategy: strategy)
        try cars.upsert(["_id": "c", "Name": "real", "Seats": 5], writeStrategy: .updateDifferentValues)
        try cars.upsert(["_id": "d", "Name": "default"], writeStrategy: .insertDefaultIfAbsent)
        #expect(try cars.findByID("c").exec()?.value == ["_id": "c", "Name": "real", "Seats": 5])
        #expect(try cars.findByID("d").exec()?["Name"] == "default")
        #expect(node.store.documents.lastSeq == start + 3)  // insertIfAbsent wrote nothing
    }

    @Test func updateClosureRecordsMutationsAndReturnsResults() throws {
        try cars.upsert(["_id": "c", "Name": "car", "Tags": ["a", "b"], "Specs": ["hp": 90], "Old": true])
        let before = node.store.documents.lastSeq
        let results = try cars.findByID("c").update { doc in
            let doc = try #require(doc)
            #expect(doc.id == "c")
            doc["Name"].set("renamed")
            #expect(doc["Name"].string == "renamed")  // reads see recorded changes
            doc["Specs"]["engine"]["cylinders"].set(6)
            doc["Tags"][1].set("B")
            doc["Sold"].increment(by: 2)
            doc["Sold"].increment(by: 1)
            #expect(doc["Sold"].double == 3)
            doc["Old"].remove()
            doc["Missing"].remove()
            #expect(doc["Specs"]["hp"].int == 90 && doc["Old"].value == nil && doc["Nope"].bool == nil)
        }
        #expect(
            results == [
                .set(docID: "c", path: "Name", value: "renamed"),
                .set(docID: "c", path: "Specs.engine.cylinders", value: 6),
                .set(docID: "c", path: "Tags[1]", value: "B"),
                .incremented(docID: "c", path: "Sold", amount: 2),
                .incremented(docID: "c", path: "Sold", amount: 1),
                .removed(docID: "c", path: "Old"),
            ])
        #expect(
            try cars.findByID("c").exec()?.value
                == [
                    "_id": "c", "Name": "renamed", "Tags": ["a", "B"], "Specs": ["hp": 90, "engine": ["cylinders": 6]],
                    "Sold": 3,
                ])
        #expect(node.store.documents.lastSeq == before + 1)  // one transaction, one seq
    }

    @Test func updateRefusesIDChangesAndBadIndexesAndWritesNothing() throws {
        try cars.upsert(["_id": "c", "Tags": ["a"], "n": 1])
        let before = try cars.findByID("c").exec()
        #expect(throws: StoreError.idChanged) {
            try cars.findByID("c").update { doc in
                doc?["n"].set(2)
                doc?["_id"].set("other")
            }
        }
        #expect(throws: StoreError.self) { try cars.findByID("c").update { $0?["Tags"][3].set("x") } }
        #expect(throws: StoreError.self) { try cars.findByID("c").update { $0?["Tags"].increment(by: 1) } }
        #expect(throws: StoreError.self) { try cars.findByID("c").update { $0?["n"].set(.double(.nan)) } }
        struct Stop: Error {}
        #expect(throws: Stop.self) {
            try cars.findByID("c").update { doc in
                doc?["n"].set(3)
                throw Stop()
            }
        }
        #expect(try cars.findByID("c").exec() == before)
    }

    @Test func updatingAMissingDocumentGetsNilAndWritesNothing() throws {
        var saw: MutableDocument?? = .none
        let results = try cars.findByID("ghost").update { doc in
            saw = .some(doc)
            doc?["x"].set(1)
        }
        #expect(results.isEmpty)
        #expect(saw != nil && saw! == nil)
        #expect(try cars.findByID("ghost").exec() == nil)
        #expect(node.store.documents.lastSeq == start)
    }

    @Test func cursorUpdateChangesEveryMatchInOneTransaction() throws {
        try seed()
        node.store.documents.waitForObservers()  // the seed's event is not counted
        let events = Atomic<Int>(0)
        let token = node.store.documents.addObserver { _ in events.add(1, ordering: .relaxed) }
        defer { node.store.documents.removeObserver(token) }
        let results = try cars.find("Origin == 'Japan'").sort("Horsepower", direction: .descending).limit(2).update {
            docs in
            #expect(docs.map(\.id) == ["rx7", "corolla"])
            for doc in docs { doc["Checked"].set(true) }
        }
        #expect(results.count == 2)
        #expect(results["rx7"] == [.set(docID: "rx7", path: "Checked", value: true)])
        #expect(results["corolla"] == [.set(docID: "corolla", path: "Checked", value: true)])
        node.store.documents.waitForObservers()
        #expect(events.load(ordering: .relaxed) == 1)
        #expect(try cars.find("Checked == true").exec().map(\.id) == ["corolla", "rx7"])
    }

    @Test func sortLimitAndOffsetChain() throws {
        try seed()
        let byPower = try cars.findAll().sort("Horsepower", direction: .descending).exec().map(\.id)
        #expect(byPower == ["mustang", "rx7", "corolla", "civic", "beetle"])  // missing last, descending
        let byCylindersThenName = try cars.findAll().sort("Cylinders").sort("Name", direction: .descending).exec()
        #expect(byCylindersThenName.map(\.id) == ["rx7", "beetle", "corolla", "civic", "mustang"])
        let page = cars.find("Cylinders == 4").sort("Name").offset(1).limit(1)
        #expect(try page.exec().map(\.id) == ["corolla"])
        #expect(try page.count() == 1)
        #expect(try cars.find("Cylinders == 4").count() == 3)
        #expect(try cars.find("Cylinders == 4").offset(5).count() == 0)
        #expect(try cars.findAll().limit(0).exec().isEmpty)
        #expect(page.sortKeys.map(\.path) == ["Name"] && page.limitCount == 1 && page.offsetCount == 1)
        #expect(throws: StoreError.self) { try cars.findAll().sort("a..b").exec() }
        #expect(throws: StoreError.self) { try cars.findAll().limit(-1).exec() }
        #expect(throws: StoreError.self) { try cars.findAll().offset(-1).count() }
        #expect(throws: QueryParseError.self) { try cars.find("Cylinders ==").sort("Name").exec() }
        // Backtick-quoted keys name fields that are not identifiers.
        try cars.upsert([["_id": "q1", "odd key": 2], ["_id": "q2", "odd key": 1]])
        #expect(try cars.find("`odd key` > 0").sort("`odd key`").exec().map(\.id) == ["q2", "q1"])
    }

    @Test func evictDropsTheLocalCopyWhileRemoveLeavesATombstone() throws {
        try seed()
        let documents = node.store.documents
        try acknowledgeAll(documents, "cars")  // a peer holds them: the stubs are local
        #expect(try cars.findByID("beetle").evict())
        #expect(try !cars.findByID("beetle").evict())
        #expect(try cars.findByID("civic").remove())
        let log = try documents.changes(in: "cars", after: 0, limit: 100, maxBytes: .max).records
        #expect(!log.contains { $0.id == "beetle" })
        #expect(log.contains { $0.id == "civic" && $0.isDeleted })
        #expect(try cars.find("Origin == 'Japan'").sort("Name").limit(1).evict() == ["rx7"])
        #expect(try cars.find("Cylinders >= 4").remove() == ["corolla", "mustang"])
        #expect(try cars.findAll().exec().isEmpty)
        #expect(
            try documents.changes(in: "cars", after: 0, limit: 100, maxBytes: .max).records.filter(\.isDeleted).count
                == 3)
    }

    @Test func compositeIDsWorkEverywhere() throws {
        let id: Value = ["vin": "A1", "plant": 3]
        let other: Value = ["vin": "B2", "plant": 1]
        try cars.upsert(["_id": id, "n": 1])
        try cars.upsert(["_id": other, "n": 2], writeStrategy: .insertIfAbsent)
        #expect(try cars.findByID(["plant": 3, "vin": "A1"]).exec()?["n"] == 1)
        let results = try cars.findByID(id).update { $0?["n"].increment(by: 1) }
        #expect(results == [.incremented(docID: id, path: "n", amount: 1)])
        let cursor = try cars.find("_id.plant >= 1").sort("_id.plant").update { docs in
            for doc in docs { doc["seen"].set(true) }
        }
        #expect(Set(cursor.keys) == [id, other])
        #expect(try cars.find("_id.vin == 'B2'").exec().map(\.id) == [other])
        #expect(throws: StoreError.idChanged) { try cars.findByID(id).update { $0?["_id"]["vin"].set("X") } }
        #expect(try cars.findByID(other).evict())
        #expect(try cars.findAll().exec().map(\.id) == [id])
    }

    @Test func createIndexServesFindAndRefusesBadPaths() throws {
        try seed()
        let name = try cars.createIndex("Origin")
        let plan = try node.store.documents.queryPlan(in: "cars", matching: try Query("Origin == 'Japan'"))
        #expect(plan.joined().contains(name))
        #expect(try cars.find("Origin == 'Japan'").exec().map(\.id) == ["civic", "corolla", "rx7"])
        try cars.createIndex("Specs.engine.`odd key`")
        #expect(throws: StoreError.self) { try cars.createIndex("") }
        #expect(throws: StoreError.self) { try cars.createIndex("a == 1") }
        #expect(throws: StoreError.self) { try cars.createIndex("$args.x") }
        #expect(throws: StoreError.self) { try cars.createIndex("`$bytes`") }
    }
}
