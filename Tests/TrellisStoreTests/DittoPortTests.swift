import Dispatch
import Foundation
import Synchronization
import Testing
import Trellis
import TrellisTestKit

// Code written against DittoSwift ports with renames only (`ditto.store` → `node.store`): the
// calls below are DittoSwift's, with Swift variables where Ditto users have them.

/// A Codable document as Swift users write one: `_id` through CodingKeys.
private struct Car: Codable, Equatable {
    var id: String
    var make: String
    var year: Int
    var tags: [String]
    var mileage: Double?

    enum CodingKeys: String, CodingKey {
        case id = "_id"
        case make, year, tags, mileage
    }
}

@Suite struct DittoPortTests {
    let dir = TemporaryDirectory("trellis-ditto-port")

    func makeNode() throws -> TrellisNode {
        try TrellisNode(directory: dir.url.appendingPathComponent("node"), meshKey: MeshKey.generate())
    }

    /// `upsert` of `[String: Any]` with variables, `findByID` with a `String` variable,
    /// `doc?["age"]?.intValue`, `mutableDoc?["name"] = "Frank"`.
    @Test func dittoStyleCodeWithSwiftVariables() throws {
        let node = try makeNode()
        defer { node.close() }
        let collection = node.store.collection("people")
        let docID: String = "123abc"
        let name = "Susan"
        let age = 31
        let address: [String: Any] = ["city": "Oslo", "zip": 150]
        try collection.upsert(["_id": docID, "name": name, "age": age, "address": address, "nickname": nil])
        let doc = try collection.findByID(docID).exec()
        #expect(doc?["age"]?.intValue == 31)
        #expect(doc?["name"]?.stringValue == "Susan")
        #expect(doc?["address"]?["city"]?.stringValue == "Oslo")
        #expect(doc?["nickname"] == .null)

        try collection.findByID(docID).update { mutableDoc in
            mutableDoc?["name"] = "Frank"
            mutableDoc?["address"]["city"] = "Bergen"
            mutableDoc?["age"] = age + 1
        }
        let updated = try #require(try collection.findByID(docID).exec())
        #expect(updated["name"] == "Frank")
        #expect(updated["address"]?["city"] == "Bergen")
        #expect(updated["age"] == 32)
        #expect(updated.value["address"]?["zip"] == 150)

        // A map `_id` (a composite key) from Swift values.
        let key: [String: Any] = ["shop": "oslo", "n": 7]
        let mapID = try collection.upsert(["_id": key, "name": "seven"])
        #expect(try collection.findByID(mapID).exec()?["name"] == "seven")
    }

    /// A value a document cannot hold is refused with its path, and nothing is written.
    @Test func unsupportedSwiftValuesAreRefusedByPath() throws {
        let node = try makeNode()
        defer { node.close() }
        let collection = node.store.collection("people")
        #expect(throws: ValueConversionError(path: "when", problem: "a Date")) {
            try collection.upsert(["_id": "x", "when": Date()])
        }
        #expect(throws: ValueConversionError(path: "n[1]", problem: "UInt64 18446744073709551615 above Int64.max")) {
            try collection.upsert(["_id": "x", "n": [1, UInt64.max] as [Any]])
        }
        #expect(try collection.findByID("x").exec() == nil)
        try collection.upsert(["_id": "y", "v": 1])
        #expect(throws: ValueConversionError.self) {
            try collection.findByID("y").update { $0?["v"] = URL(fileURLWithPath: "/") }
        }
        #expect(try collection.findByID("y").exec()?["v"] == 1)
        let message = "\(ValueConversionError(path: "a.b", problem: "a URL"))"
        #expect(message.hasPrefix("value at a.b cannot be stored: a URL"))
    }

    /// Codable documents: upsert an `Encodable`, read back with `typed(as:)`.
    @Test func codableDocumentsRoundTrip() throws {
        let node = try makeNode()
        defer { node.close() }
        let cars = node.store.collection("cars")
        let car = Car(id: "c1", make: "Volvo", year: 1999, tags: ["red", "estate"], mileage: nil)
        let id = try cars.upsert(car)
        #expect(id == "c1")
        let stored = try #require(try cars.findByID("c1").exec())
        #expect(try stored.typed(as: Car.self) == car)
        #expect(stored["year"] == 1999)
        let all = try cars.findAll().exec().map { try $0.typed(as: Car.self) }
        #expect(all == [car])
        #expect(throws: DecodingError.self) { try stored.typed(as: [Int].self) }
    }

    /// `observeLocal(deliverOn:eventHandler:)` with DittoSwift's label, for one document and a
    /// query, and the next-signal form.
    @Test func observeLocalTakesTheEventHandlerLabel() throws {
        let node = try makeNode()
        defer { node.close() }
        let collection = node.store.collection("people")
        let docID = "p1"
        let queue = DispatchQueue(label: "ditto-port")
        let names = Mutex<[String]>([])
        let counts = Mutex<[Int]>([])
        let single = try collection.findByID(docID).observeLocal(
            deliverOn: queue,
            eventHandler: { doc, _ in
                if let name = doc?["name"]?.stringValue { names.withLock { $0.append(name) } }
            })
        let cursor = try collection.findAll().observeLocal(
            deliverOn: queue, eventHandler: { docs, _ in counts.withLock { $0.append(docs.count) } })
        let signalled = try collection.findAll().observeLocalWithNextSignal(
            deliverOn: queue, eventHandler: { _, _, signalNext in signalNext() })
        try collection.upsert(["_id": docID, "name": "Susan"])
        #expect(eventually { names.withLock { $0 } == ["Susan"] })
        #expect(eventually { counts.withLock { $0.last } == 1 })
        withExtendedLifetime((single, cursor, signalled)) {}
    }

    /// `Value(converting:)` and `anyValue` agree on every kind of value.
    @Test func swiftValuesConvertBothWays() throws {
        let any: [String: Any?] = [
            "b": true, "i": 3, "i8": Int8(-2), "u32": UInt32(7), "d": 2.5, "f": Float(0.5), "s": "x",
            "sub": "abc".dropFirst(), "data": Data([1, 2]), "bytes": [UInt8]([3]), "nil": nil, "null": NSNull(),
            "array": [1, "two", nil] as [Any?], "map": ["k": ["deep": 1]], "value": Value.int(9),
        ]
        let value = try Value(converting: any)
        #expect(value["b"] == true)
        #expect(value["i8"] == -2)
        #expect(value["u32"] == 7)
        #expect(value["f"] == 0.5)
        #expect(value["sub"] == "bc")
        #expect(value["data"] == .bytes([1, 2]))
        #expect(value["bytes"] == .bytes([3]))
        #expect(value["nil"] == .null)
        #expect(value["null"] == .null)
        #expect(value["array"] == [1, "two", nil])
        #expect(value["map"]?["k"]?["deep"] == 1)
        #expect(value["value"] == 9)
        let back = try #require(value.anyValue as? [String: Any?])
        #expect(back["i"] as? Int == 3)
        #expect(back["s"] as? String == "x")
        #expect(try Value(converting: back) == value)
    }
}
