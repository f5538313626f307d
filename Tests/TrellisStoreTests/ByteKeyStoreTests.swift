import Foundation
import Synchronization
import Testing
import Trellis
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// Precomposed "é" (U+00E9) and "e" + U+0301: one text, two byte strings. Keys are byte strings
/// in every layer (docs/DATA-MODEL.md), so these are two field names, two collections, two `_id`s.
private let nfc = "\u{E9}"
private let nfd = "e\u{301}"

/// Byte-exact keys through the store: collection names, `_id` keys, field names in queries (SQL
/// push-down and in-memory evaluation), live queries, and field names written by upserts.
@Suite struct ByteKeyStoreTests {
    let dir = TemporaryDirectory("trellis-bytekeys")

    func open() throws -> DocumentStore { try DocumentStore(path: dir.path("store.sqlite")) }

    @Test func twoSpellingsAreTwoCollections() throws {
        let store = try open()
        let heard = Mutex<[Set<UTF8Key>]>([])
        let token = store.addObserver { event in heard.withLock { $0.append(event.collections) } }
        defer { store.removeObserver(token) }
        try store.upsert([["_id": "a", "n": 1], ["_id": "b", "n": 2]], in: nfc)
        try store.upsert(["_id": "c", "n": 3], in: nfd)
        // Queries inline the collection name into their SQL: each spelling reads its own rows.
        #expect(try store.documents(in: nfc, matching: .all).compactMap { $0["_id"] } == ["a", "b"])
        #expect(try store.documents(in: nfd, matching: .all).compactMap { $0["_id"] } == ["c"])
        #expect(try store.count(in: nfc, matching: try Query("n >= 1")) == 2)
        #expect(try store.count(in: nfd, matching: try Query("n >= 1")) == 1)
        #expect(try store.documents(in: nfd, matching: try Query("n >= 1")).compactMap { $0["_id"] } == ["c"])
        #expect(try store.document(id: "c", in: nfc) == nil)
        #expect(try store.changes(in: nfd, after: 0, limit: 100, maxBytes: .max).records.map(\.id) == ["c"])
        store.waitForObservers()
        #expect(heard.withLock { $0 } == [[UTF8Key(nfc)], [UTF8Key(nfd)]])
        // Removing by query in one leaves the other alone.
        #expect(try store.remove(in: nfc, matching: .all).count == 2)
        #expect(try store.count(in: nfd, matching: .all) == 1)
    }

    @Test func twoSpellingsAreTwoIDs() throws {
        let store = try open()
        let changed = Mutex<[UTF8Key: Set<UTF8Key>]>([:])
        let token = store.addObserver { event in
            changed.withLock { $0.merge(event.changedKeys) { $0.union($1) } }
        }
        defer { store.removeObserver(token) }
        try store.upsert(["_id": .string(nfc), "v": 1], in: "c")
        try store.upsert(["_id": .string(nfd), "v": 2], in: "c")
        try store.upsert(["_id": ["k": .string(nfd)], "v": 3], in: "c")
        #expect(try store.count(in: "c", matching: .all) == 3)
        #expect(try store.document(id: .string(nfc), in: "c")?["v"] == 1)
        #expect(try store.document(id: .string(nfd), in: "c")?["v"] == 2)
        #expect(try store.document(id: ["k": .string(nfc)], in: "c") == nil)
        #expect(!UTF8Key.equal(try DocumentStore.key(for: .string(nfc)), try DocumentStore.key(for: .string(nfd))))
        store.waitForObservers()
        let keys = changed.withLock { $0[UTF8Key("c")] ?? [] }
        #expect(keys.count == 3)
        #expect(try store.remove(id: .string(nfd), in: "c"))
        #expect(try store.document(id: .string(nfc), in: "c")?["v"] == 1)
        #expect(try store.document(id: .string(nfd), in: "c") == nil)
        #expect(try store.evict(id: .string(nfc), in: "c"))
        #expect(try store.document(id: ["k": .string(nfd)], in: "c")?["v"] == 3)
    }

    /// A query on the precomposed path does not match the decomposed key, whether SQLite runs it
    /// or it is evaluated in memory, with and without an index on the path.
    @Test func sqlAndInMemoryAgreeOnByteKeys() throws {
        let store = try open()
        try store.upsert(
            [
                ["_id": "p", nfc: 1, "m": [nfc: "x"]],
                ["_id": "d", nfd: 1, "m": [nfd: "x"]],
                ["_id": "s", "s": .string(nfc)],
                ["_id": "t", "s": .string(nfd)],
            ], in: "c")
        let cases: [(String, [Value])] = [
            ("`\(nfc)` == 1", ["p"]),
            ("`\(nfd)` == 1", ["d"]),
            ("m.`\(nfc)` == 'x'", ["p"]),
            ("m.`\(nfd)` == 'x'", ["d"]),
            ("s == '\(nfc)'", ["s"]),
            ("s == '\(nfd)'", ["t"]),
            ("s IN ['\(nfd)']", ["t"]),
            ("contains(s, '\u{301}')", ["t"]),
            ("s > 'f'", ["s"]),  // c3 a9 > 66 > 65 cc 81
        ]
        func check(_ label: String) throws {
            for (text, expected) in cases {
                let query = try Query(text)
                #expect(query.sqlWhere(column: "documents.value") != nil, "\(text) is pushed down")
                let inSQL = try store.documents(in: "c", matching: query).compactMap { $0["_id"] }
                let inMemory = try store.documents(in: "c") { try query.matches($0) }.compactMap { $0["_id"] }
                #expect(inSQL == expected, "\(label) SQL: \(text)")
                #expect(inMemory == expected, "\(label) memory: \(text)")
            }
        }
        try check("no index")
        let precomposed = try store.createIndex(path: .key(nfc), in: "c")
        let decomposed = try store.createIndex(path: .key(nfd), in: "c")
        #expect(precomposed != decomposed)
        try check("indexed")
        #expect(try store.queryPlan(in: "c", matching: try Query("`\(nfd)` == 1")).joined().contains(decomposed))
    }

    /// Upserting the decomposed key after the precomposed one keeps two fields.
    @Test func writesKeepBothSpellings() throws {
        let store = try open()
        try store.upsert(["_id": "d1", nfc: 1], in: "items")
        try store.upsert(["_id": "d1", nfd: 2], in: "items")
        let document = try #require(try store.document(id: "d1", in: "items"))
        #expect(document.mapValue?.count == 3)
        #expect(document[nfc] == 1 && document[nfd] == 2)
    }
}

/// Live queries and collections through the public API.
@Suite struct ByteKeyLiveQueryTests {
    let dir = TemporaryDirectory("trellis-bytekeys-live")
    let node: TrellisNode

    init() throws {
        node = try TrellisNode(directory: dir.url.appendingPathComponent("node"), meshKey: .generate())
    }

    @Test func liveQueriesSeeOnlyTheirSpelling() throws {
        let precomposed = node.store.collection(nfc)
        let decomposed = node.store.collection(nfd)
        let log = EventLog()
        let live = try precomposed.find("`\(nfc)` >= 1").observeLocal { log.record($0, $1) }
        #expect(eventually { log.count == 1 })
        // Writes to the other collection, and to the other field name, change nothing.
        try decomposed.upsert(["_id": "a", nfc: 5])
        try precomposed.upsert(["_id": "b", nfd: 5])
        try precomposed.upsert(["_id": "c", nfc: 7])
        #expect(eventually { log.last?.map(\.id) == ["c"] })
        #expect(log.count == 2)
        // The single-document observer keys `_id`s byte-wise too.
        let idLog = Mutex<[Value?]>([])
        let byID = try precomposed.findByID(.string(nfc)).observeLocal { document, _ in
            idLog.withLock { $0.append(document?["n"]) }
        }
        #expect(eventually { idLog.withLock { $0 } == [nil] })
        try precomposed.upsert(["_id": .string(nfd), "n": 1])
        try precomposed.upsert(["_id": .string(nfc), "n": 2])
        #expect(eventually { idLog.withLock { $0 } == [nil, 2] })
        #expect(try precomposed.find("true").exec().map(\.id).contains(.string(nfd)))
        live.stop()
        byID.stop()
        #expect(log.problems.withLock { $0 }.isEmpty)
        #expect(idLog.withLock { $0 } == [nil, 2])
    }
}
