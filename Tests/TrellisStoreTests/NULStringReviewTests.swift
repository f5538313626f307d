import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// Review of 261a303 (queries on strings holding U+0000): paths where SQLite still sees a string
/// cut at its first NUL although the collection's mark says nothing about it.
@Suite struct NULStringReviewTests {
    let dir = TemporaryDirectory("trellis-nul-review")

    static let plain: [Value] = [
        ["_id": "plain", "a": "x"],
        ["_id": "other", "a": "w"],
    ]

    /// The NUL is in the query, not in a document: an `IN` list of two strings or more is bound
    /// as one JSON array read by `json_each`, which cuts `'x\u0000y'` to `'x'`, so
    /// `a IN ['x\u0000y', 'q']` selects a document whose `a` is `"x"` (in memory it does not).
    /// No document holds a NUL, so the collection is not marked; the store answers from SQLite.
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
        // A remove by that query deletes a document it does not select.
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

    /// A collection marked as holding NUL strings does not help either: its rows without the
    /// escape are still answered by SQLite.
    @Test func inListLiteralWithNULInAMarkedCollection() throws {
        let store = try DocumentStore(path: dir.path("store.sqlite"))
        try store.upsert(Self.plain + [["_id": "nul", "a": "x\u{0}y"]], in: "c")
        let query = try Query("a IN ['x\\u0000y', 'q']")
        #expect(try store.documents(in: "c", matching: query).compactMap { $0["_id"] } == ["nul"])
        #expect(try store.count(in: "c", matching: query) == 1)
    }

    /// A read-only store watching the log of a node that writes the same file (what `lastSeq`
    /// re-reads the database for) loads the marks once, at open: strings with NUL written after
    /// that are answered by SQLite, cut at the NUL.
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
}
