import Foundation
import Synchronization
import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// One damaged row never blocks the others (issue 8 item 18): it is skipped by the change log,
/// reads, queries and the log entries, named in an error, and repaired by a good state from a peer.
@Suite struct DamagedRowTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()
    let log = LogLines()

    func open(_ name: String) throws -> DocumentStore { try openStore(dir, name, clock: clock, log: log) }

    /// 20 documents written by one upsert (compact rows, as an import writes them).
    func seeded(_ name: String) throws -> DocumentStore {
        let store = try open(name)
        try store.upsert((0..<20).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] }, in: "c")
        return store
    }

    func damage(_ store: DocumentStore, _ sql: String) throws {
        try store.withState { s in try s.db.execute(sql) }
    }

    @Test func aRowWhoseJSONIsCutShortIsSkippedEverywhereAndNamed() throws {
        let store = try seeded("s.sqlite")
        let source = try open("source.sqlite")  // a peer holding the same states
        _ = try source.merge(try batch(of: store), from: [2], checkpoint: nil)
        // As break_corrupt_store.py does: the row's JSON loses its last three bytes.
        try damage(store, "UPDATE documents SET value = substr(value, 1, length(value) - 3) WHERE id = '\"d5\"'")
        let others = Set((0..<20).filter { $0 != 5 }.map { Value.string("d\($0)") })
        // Reads and queries: the other 19, by every path (SQL, in memory, windows, counts).
        #expect(Set(try store.documents(in: "c").compactMap { $0["_id"] }) == others)
        #expect(Set(try store.documents(in: "c", matching: Query("n >= 0")).compactMap { $0["_id"] }) == others)
        #expect(try store.count(in: "c", matching: Query("n >= 0")) == 19)
        #expect(try store.count(in: "c", matching: Query("contains([5, 6], n)")) == 1)  // in memory
        let window = try store.documents(in: "c", matching: Query("n >= 4 && n <= 6"), sort: [], limit: 2)
        #expect(window.compactMap { $0["_id"] } == ["d4", "d6"])
        let sorted = try store.documents(in: "c", matching: .all, sort: [SortKey(.key("n"), .descending)], limit: 16)
        #expect(sorted.count == 16 && sorted.last?["_id"] == "d3")
        // Results that parse when read (what `find` returns) leave it out too.
        let stored = try store.storedDocuments(in: "c", matching: Query("n >= 0"), sort: [])
        #expect(Set(stored.compactMap { $0.json.member("_id") }) == others)
        let error = #expect(throws: StoreError.self) { try store.document(id: "d5", in: "c") }
        #expect(error?.description.contains("\"d5\"") == true)
        // The change log: the rest flows, the damaged row is reported skipped.
        for query in [Query.all, try Query("n >= 0"), try Query("contains([5, 6], n)")] {
            let page = try store.changes(in: "c", after: 0, limit: 1_000, maxBytes: .max, matching: query)
            #expect(!page.records.contains { $0.id == "d5" } && page.exhausted)
            #expect(page.skipped.map(\.key) == ["\"d5\""])
        }
        #expect(try store.changes(in: "c", after: 0, limit: 1_000, maxBytes: .max).records.count == 19)
        // Log entries (the contacts enumerator) fill their pages past it.
        var cursor: Int64 = 0
        var listed: [Value] = []
        while true {
            let page = try store.entries(in: "c", after: cursor, limit: 4, includeDeleted: true)
            listed += page.map(\.id)
            guard page.count == 4, let last = page.last else { break }
            cursor = last.seq
        }
        #expect(Set(listed) == others && listed.count == 19)
        // Named once in the log, listed for status.
        #expect(store.damagedDocuments().map(\.key) == ["\"d5\""])
        #expect(log.lines.filter { $0.contains("\"d5\"") && $0.contains("damaged") }.count == 1)
        // A good state from a peer repairs it, though it adds nothing to what the row held.
        let outcome = try store.merge(try batch(of: source), from: [1], checkpoint: nil)
        #expect(outcome.applied == 1 && outcome.deferred.isEmpty)
        #expect(try store.document(id: "d5", in: "c") == ["_id": "d5", "n": 5])
        #expect(store.damagedDocuments().isEmpty)
        #expect(try store.documents(in: "c").count == 20)
    }

    /// A row whose JSON the one-pass check of query results declines (an exponent, spaces) but
    /// that parses is a result like any other, parsed at once.
    @Test func aRowTheQuickCheckDeclinesButThatParsesIsAResult() throws {
        let store = try seeded("s.sqlite")
        try damage(store, #"UPDATE documents SET value = '{"_id": "d5", "n": 5e0}' WHERE id = '"d5"'"#)
        let rows = try store.storedDocuments(in: "c", matching: Query("n == 5"), sort: [])
        #expect(rows.count == 1 && rows.first?.json.isParsed == true)
        #expect(rows.first?.json.value == ["_id": "d5", "n": 5.0])
        #expect(store.damagedDocuments().isEmpty)
    }

    /// Query results are checked from SQLite's bytes: a row whose text holds ill-formed UTF-8
    /// inside a string reads as that text with each bad sequence replaced by U+FFFD, as every
    /// other read of it does; one with a bad byte outside strings is left out and named.
    @Test func aRowWithIllFormedUTF8ReadsRepairedOrIsLeftOut() throws {
        let store = try seeded("s.sqlite")
        try damage(
            store, #"UPDATE documents SET value = '{"_id":"d5","n":5,"s":"a' || X'FFC3' || 'b"}' WHERE id = '"d5"'"#)
        try damage(store, #"UPDATE documents SET value = '{"_id":"d6","n":' || X'FF' || '6}' WHERE id = '"d6"'"#)
        let rows = try store.storedDocuments(in: "c", matching: Query("n >= 5 && n <= 7"), sort: [])
        #expect(rows.map(\.key) == ["\"d5\"", "\"d7\""])
        let d5 = try #require(rows.first?.json)
        #expect(d5.member("s") == "a\u{FFFD}\u{FFFD}b")
        #expect(d5.value == ["_id": "d5", "n": 5, "s": "a\u{FFFD}\u{FFFD}b"])
        #expect(d5.text == #"{"_id":"d5","n":5,"s":"a"# + "\u{FFFD}\u{FFFD}" + #"b"}"#)
        #expect(try store.document(id: "d5", in: "c") == d5.value)
        #expect(store.damagedDocuments().map(\.key) == ["\"d6\""])
    }

    @Test func aRowWhoseStateIsCutShortIsSkippedAndRepaired() throws {
        let store = try seeded("s.sqlite")
        clock.advance(by: 1)
        try store.upsert(["_id": "d7", "m": "second write"], in: "c")  // a whole state, not compact
        let source = try open("source.sqlite")
        _ = try source.merge(try batch(of: store), from: [2], checkpoint: nil)
        try damage(store, "UPDATE documents SET state = substr(state, 1, length(state) - 5) WHERE id = '\"d7\"'")
        let page = try store.changes(in: "c", after: 0, limit: 1_000, maxBytes: .max)
        #expect(page.records.count == 19 && page.skipped.map(\.key) == ["\"d7\""])
        #expect(page.skipped.first?.reason.contains("state does not decode") == true)
        #expect(store.damagedDocuments().map(\.key) == ["\"d7\""])
        // Its JSON still reads; a write to it fails naming it; the others take writes.
        #expect(try store.document(id: "d7", in: "c")?["m"] == "second write")
        let error = #expect(throws: StoreError.self) { try store.upsert(["_id": "d7", "x": 1], in: "c") }
        #expect(error?.description.contains("\"d7\"") == true)
        try store.upsert(["_id": "d8", "x": 1], in: "c")
        // Repaired by the peer's state.
        #expect(try store.merge(try batch(of: source), from: [1], checkpoint: nil).applied == 1)
        #expect(store.damagedDocuments().isEmpty)
        #expect(try store.changes(in: "c", after: 0, limit: 1_000, maxBytes: .max).skipped.isEmpty)
        try store.upsert(["_id": "d7", "x": 1], in: "c")
        #expect(try store.document(id: "d7", in: "c") == ["_id": "d7", "n": 7, "m": "second write", "x": 1])
    }

    @Test func aStateAboveTheSizeLimitIsNotSentButListed() throws {
        do {
            let store = try open("s.sqlite")
            try store.upsert(
                [["_id": "big", "s": .string(String(repeating: "x", count: 3_000))], ["_id": "small"]], in: "c")
        }
        let store = try openStore(dir, "s.sqlite", clock: clock) {
            $0.maxDocumentBytes = 2_000
            $0.maxMergedDocumentBytes = 2_000
        }
        let page = try store.changes(in: "c", after: 0, limit: 10, maxBytes: .max)
        #expect(page.records.map(\.id) == ["small"] && page.skipped.map(\.key) == ["\"big\""])
        #expect(page.skipped.first?.reason.contains("above the limit of 2000 bytes") == true)
        #expect(store.damagedDocuments().isEmpty)  // not damaged: still read locally
        #expect(try store.document(id: "big", in: "c") != nil)
    }
}
