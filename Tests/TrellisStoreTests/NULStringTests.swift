import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// Strings holding U+0000 through the store's SQL paths. SQLite 3.40's JSON functions cut a
/// string at its first NUL (`json_extract('{"a":"x\u0000y"}', '$.a')` is `'x'`), so a query
/// pushed down to SQLite would see `"x\u{0}y"` as `"x"`: `a == 'x'` would select it (and a
/// remove by that query would delete it), `a > 'x'` and `a != 'x'` would miss it. Every query
/// path must answer as in-memory evaluation does.
@Suite struct NULStringTests {
    let dir = TemporaryDirectory("trellis-nul")

    func open() throws -> DocumentStore { try DocumentStore(path: dir.path("store.sqlite")) }

    static let documents: [Value] = [
        ["_id": "plain", "a": "x", "tags": ["x"]],
        ["_id": "nul", "a": "x\u{0}y", "tags": ["x\u{0}y"]],
        ["_id": "lead", "a": "\u{0}", "tags": ["\u{0}"]],
        ["_id": "other", "a": "w", "tags": ["w"]],
    ]

    static let cases: [(String, [Value])] = [
        ("a == 'x'", ["plain"]),
        ("a != 'x'", ["lead", "nul", "other"]),
        ("a > 'x'", ["nul"]),
        ("a >= 'x'", ["nul", "plain"]),
        ("a < 'x'", ["lead", "other"]),
        ("a == ''", []),
        ("a IN ['x', 'w']", ["other", "plain"]),
        ("contains(tags, 'x')", ["plain"]),
        ("!(a == 'x')", ["lead", "nul", "other"]),
        ("a == 'x' || a == 'w'", ["other", "plain"]),
    ]

    func check(_ store: DocumentStore, _ label: String) throws {
        for (text, expected) in Self.cases {
            let query = try Query(text)
            let inMemory = try store.documents(in: "c") { try query.matches($0) }.compactMap { $0["_id"] }
            #expect(inMemory == expected, "\(label) memory: \(text)")
            let found = try store.documents(in: "c", matching: query).compactMap { $0["_id"] }
            #expect(found == expected, "\(label) find: \(text)")
            #expect(try store.count(in: "c", matching: query) == expected.count, "\(label) count: \(text)")
            let windowed = try store.documents(in: "c", matching: query, sort: [], limit: 1, offset: 1)
            #expect(
                windowed.compactMap { $0["_id"] } == Array(expected.dropFirst().prefix(1)), "\(label) window: \(text)")
            let logged = try store.changes(in: "c", after: 0, limit: 100, maxBytes: .max, matching: query)
            #expect(Set(logged.records.map(\.id)) == Set(expected), "\(label) changes: \(text)")
        }
    }

    @Test func queriesAnswerAsInMemory() throws {
        let store = try open()
        try store.upsert(Self.documents, in: "c")
        try check(store, "no index")
        try store.createIndex(path: FieldPath(parsing: "a"), in: "c")
        try check(store, "indexed")
        store.close()
        // Reopened: the store still knows the collection holds such strings.
        let again = try open()
        try check(again, "reopened")
    }

    /// A remove by query deletes only what the query selects.
    @Test func removeByQueryRemovesOnlyMatches() throws {
        let store = try open()
        try store.upsert(Self.documents, in: "c")
        let removed = try store.remove(in: "c", matching: try Query("a == 'x'"))
        #expect(removed == ["plain"])
        #expect(try store.document(id: "nul", in: "c")?["a"] == "x\u{0}y")
    }

    /// Strings with NUL that arrive in a peer's states are seen as such too.
    @Test func mergedStatesAnswerAsInMemory() throws {
        let source = try DocumentStore(path: dir.path("source.sqlite"))
        try source.upsert(Self.documents, in: "c")
        let records = try source.changes(in: "c", after: 0, limit: 100, maxBytes: .max).records
        let store = try open()
        _ = try store.merge(
            records.map { RemoteDocument(collection: $0.collection, id: $0.id, state: $0.state) },
            from: Array(repeating: 7, count: 32), checkpoint: nil)
        try check(store, "merged")
    }

    /// A store written before the store tracked such strings finds them when opened.
    @Test func aStoreFromBeforeIsScannedOnOpen() throws {
        let store = try open()
        try store.upsert(Self.documents, in: "c")
        store.close()
        try forgetNULMarkers(dir.path("store.sqlite"))
        let again = try open()
        try check(again, "upgraded")
    }
}

/// Strings with U+0000 that the collection's mark does not cover: in a query's `IN` list, and
/// in a store another process writes.
@Suite struct NULStringListAndReaderTests {
    let dir = TemporaryDirectory("trellis-nul-lists")

    static let plain: [Value] = [
        ["_id": "plain", "a": "x"],
        ["_id": "other", "a": "w"],
    ]

    /// The NUL is in the query, not in a document: an `IN` list of two strings or more would be
    /// bound as one JSON array read by `json_each`, which cuts `'x\u0000y'` to `'x'`, so
    /// `a IN ['x\u0000y', 'q']` would select a document whose `a` is `"x"`. No document holds a
    /// NUL (the collection is not marked): such a list is evaluated in memory.
    @Test func inListLiteralWithNULMatchesWholeStringsOnly() throws {
        let store = try DocumentStore(path: dir.path("store.sqlite"))
        try store.upsert(Self.plain, in: "c")
        let query = try Query("a IN ['x\\u0000y', 'q']")
        #expect(try query.matches(["_id": "plain", "a": "x"]) == false)
        let inMemory = try store.documents(in: "c") { try query.matches($0) }.compactMap { $0["_id"] }
        #expect(inMemory == [])
        #expect(try store.documents(in: "c", matching: query).compactMap { $0["_id"] } == [])
        #expect(try store.count(in: "c", matching: query) == 0)
        let logged = try store.changes(in: "c", after: 0, limit: 100, maxBytes: .max, matching: query)
        #expect(logged.records.map(\.id) == [])
        // A remove by that query removes only what it selects.
        #expect(try store.remove(in: "c", matching: query) == [])
        #expect(try store.document(id: "plain", in: "c") != nil)
    }

    /// The same with the list given as `$args`, and `contains` written with the list first.
    @Test func inListArgumentWithNULMatchesWholeStringsOnly() throws {
        let store = try DocumentStore(path: dir.path("store.sqlite"))
        try store.upsert(Self.plain, in: "c")
        let args: UTF8Map<Value> = ["list": ["x\u{0}y", "q"]]
        for text in ["a IN $args.list", "contains($args.list, a)"] {
            let query = try Query(text)
            #expect(try store.documents(in: "c", matching: query, args: args).compactMap { $0["_id"] } == [], "\(text)")
            #expect(try store.count(in: "c", matching: query, args: args) == 0, "\(text)")
        }
        #expect(try store.evict(in: "c", matching: try Query("a IN $args.list"), args: args) == [])
        #expect(try store.document(id: "plain", in: "c") != nil)
    }

    /// In a collection marked as holding NUL strings, its rows without the escape are answered
    /// by SQLite: the list must not be cut there either.
    @Test func inListLiteralWithNULInAMarkedCollection() throws {
        let store = try DocumentStore(path: dir.path("store.sqlite"))
        try store.upsert(Self.plain + [["_id": "nul", "a": "x\u{0}y"]], in: "c")
        let query = try Query("a IN ['x\\u0000y', 'q']")
        #expect(try store.documents(in: "c", matching: query).compactMap { $0["_id"] } == ["nul"])
        #expect(try store.count(in: "c", matching: query) == 1)
    }

    /// A read-only store watching the log of a node that writes the same file (what `lastSeq`
    /// re-reads the database for) sees the marks the writer made after it opened.
    @Test func readOnlyStoreSeesNULStringsWrittenAfterItOpened() throws {
        let writer = try DocumentStore(path: dir.path("store.sqlite"))
        try writer.upsert([["_id": "other", "a": "w"]], in: "c")
        var options = StoreOptions()
        options.readOnly = true
        let reader = try DocumentStore(path: dir.path("store.sqlite"), options: options)
        try writer.upsert([["_id": "plain", "a": "x"], ["_id": "nul", "a": "x\u{0}y"]], in: "c")
        #expect(reader.lastSeq == writer.lastSeq)
        let query = try Query("a == 'x'")
        #expect(try writer.documents(in: "c", matching: query).compactMap { $0["_id"] } == ["plain"])
        #expect(try reader.documents(in: "c", matching: query).compactMap { $0["_id"] } == ["plain"])
        #expect(try reader.count(in: "c", matching: query) == 1)
        let logged = try reader.changes(in: "c", after: 0, limit: 100, maxBytes: .max, matching: query)
        #expect(logged.records.map(\.id) == ["plain"])
        let greater = try Query("a > 'x'")
        #expect(try reader.documents(in: "c", matching: greater).compactMap { $0["_id"] } == ["nul"])
    }

    /// The escape is found wherever it is, and only the whole escape counts: random texts of
    /// backslashes, `u`, `0` and other bytes, against a byte-by-byte search.
    @Test func theEscapeIsFoundWhereverItIs() {
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        print("NULStringTests seed=\(seed) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        let pieces = ["\\", "u", "0", "000", "\\u000", "\\u0000", "a", "é", "\""]
        var found = 0
        for round in 0..<5_000 {
            let text = (0..<Int.random(in: 0...12, using: &random)).map { _ in pieces.randomElement(using: &random)! }
                .joined()
            let bytes = Array(text.utf8)
            let expected =
                bytes.count >= 6
                && (0...(bytes.count - 6)).contains { bytes[$0..<$0 + 6].elementsEqual("\\u0000".utf8) }
            if expected { found += 1 }
            #expect(DocumentStore.holdsNULEscape(text) == expected, "round \(round): \(text), seed \(seed)")
        }
        #expect(found > 100, "seed \(seed)")
    }
}

/// Deletes the store's records of which collections hold strings with NUL, and of having looked,
/// as a store written by an earlier version has neither.
private func forgetNULMarkers(_ path: String) throws {
    let db = try Connection(path: path)
    try db.execute("DELETE FROM meta WHERE key LIKE 'nul%'")
}
