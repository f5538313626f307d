import Foundation
import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// A reviewer's attempts to break the row key (ea38744, 3ec0b6f, f83bb22). The first two and
/// the last failed there: an old store holding a BLOB `_id` or collection could not be rebuilt
/// (nor opened), and the reaper cut a key short for a collection name of ill-formed UTF-8.
@Suite struct RowKeyReviewTests {
    let dir = TemporaryDirectory("trellis-row-key-review")

    /// The old layout (``RowKeyTests/keyByCollectionAndID(_:then:)``), then `extra`.
    func makeOld(_ store: DocumentStore, extra: String = "") throws {
        try RowKeyTests.keyByCollectionAndID(store, then: extra)
    }

    /// An old-layout store with one damaged row whose `_id` or `collection` column holds a BLOB
    /// (TEXT affinity keeps blobs as they are). Such a store opened before the row key; the first
    /// rebuild computed `trellis_key(collection, <blob>)` = NULL into `k NOT NULL`, failed, and
    /// left a store neither a writable nor a read-only open could read.
    @Test(arguments: [
        "('c', X'22626c6f6222', 1000, 0, X'00', '{\"_id\":\"blob\"}')",
        "(X'63', '\"zz\"', 1000, 0, X'00', '{\"_id\":\"zz\"}')",
    ])
    func oldStoreWithABlobIDOrCollectionStillOpens(row: String) throws {
        let path = dir.path(row.hasPrefix("(X") ? "blob-collection.sqlite" : "blob-id.sqlite")
        do {
            let store = try DocumentStore(path: path)
            try store.upsert((0..<5).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] }, in: "c")
            try makeOld(store)
            try store.withState { s in
                try s.db.execute("INSERT INTO documents(collection, id, seq, deleted, state, value) VALUES \(row)")
            }
            store.close()
        }
        var opened: DocumentStore?
        #expect(throws: Never.self) { opened = try DocumentStore(path: path) }
        if let store = opened {
            #expect(try store.documents(in: "c").count >= 5)
        } else {
            // Nor can it be read: a read-only open refuses the old layout.
            var readOnly = StoreOptions()
            readOnly.readOnly = true
            #expect(throws: Never.self) { _ = try DocumentStore(path: path, options: readOnly) }
        }
    }

    /// An old-layout store with a collection whose name holds U+0000 beside collections it is a
    /// prefix of: rebuilt, each reads its own documents (find, count, window, change log, entries).
    @Test func oldStoreWithNULCollection() throws {
        let path = dir.path("nul-old.sqlite")
        let collections = ["a", "a\u{0}", "a\u{0}b", "a\u{0}:"]
        do {
            let store = try DocumentStore(path: path)
            for (n, c) in collections.enumerated() {
                try store.upsert(
                    (0..<12).map { ["_id": .string("d\($0)"), "n": .int(Int64(n)), "i": .int(Int64($0))] }, in: c)
            }
            try store.remove(id: "d3", in: "a\u{0}")
            try makeOld(store)
            store.close()
        }
        let store = try DocumentStore(path: path)
        for (n, c) in collections.enumerated() {
            let live = c == "a\u{0}" ? 11 : 12
            let docs = try store.documents(in: c)
            #expect(docs.count == live, "\(c.debugDescription)")
            #expect(docs.allSatisfy { $0["n"] == .int(Int64(n)) }, "\(c.debugDescription)")
            #expect(try store.count(in: c, matching: try Query("i >= 6")) == 6, "\(c.debugDescription)")
            let window = try store.documents(in: c, matching: try Query("i >= 0"), sort: [], limit: 3, offset: 2)
            #expect(
                window.map { $0["_id"] } == ["d10", "d11", "d2"].map { Value.string($0) } || c == "a\u{0}",
                "\(c.debugDescription)")
            let page = try store.changes(in: c, after: 0, limit: 100, maxBytes: .max, keys: ["\"d1\"", "\"d3\""])
            #expect(Set(page.records.map(\.id)) == ["d1", "d3"], "\(c.debugDescription)")
            let entries = try store.entries(in: c, after: 0, limit: 100, includeDeleted: true)
            #expect(entries.count == 12, "\(c.debugDescription)")
        }
        #expect(try store.reapTombstones(in: "a\u{0}", through: store.lastSeq) == 1)
        #expect(try store.reapedState(id: "d3", in: "a\u{0}") != nil)
        #expect(try store.document(id: "d3", in: "a") != nil)
    }

    /// Collection names whose byte length crosses a digit boundary (9/10, 99/100, 999/1000),
    /// multi-byte, each a prefix of the next: every path that drops the key prefix in Swift.
    @Test func longCollectionNamesAcrossDigitBoundaries() throws {
        let store = try DocumentStore(path: dir.path("long.sqlite"))
        // é is 2 bytes: 4×é + "x" = 9 bytes, + "y" = 10 bytes.
        var collections = ["\u{E9}\u{E9}\u{E9}\u{E9}x", "\u{E9}\u{E9}\u{E9}\u{E9}xy"]
        collections.append(String(repeating: "\u{1F600}", count: 24) + "abc")  // 99 bytes
        collections.append(String(repeating: "\u{1F600}", count: 24) + "abcd")  // 100 bytes
        collections.append(String(repeating: "z", count: 999))
        collections.append(String(repeating: "z", count: 1000))
        collections.append("9:a")
        collections.append("1")
        collections.append("")
        let ids: [Value] = ["x", "10:a:x", ";", ":", "\u{0}", "3", ["o": 1], "\u{E9}"]
        for (n, c) in collections.enumerated() {
            try store.upsert(ids.map { ["_id": $0, "n": .int(Int64(n))] }, in: c)
        }
        for (n, c) in collections.enumerated() {
            let label = "\(c.utf8.count) bytes"
            let docs = try store.documents(in: c)
            #expect(docs.count == ids.count, "\(label)")
            #expect(docs.allSatisfy { $0["n"] == .int(Int64(n)) }, "\(label)")
            #expect(
                Set(docs.compactMap { $0["_id"] }.map { JSON.string($0) }) == Set(ids.map { JSON.string($0) }),
                "\(label)")
            let found = try store.documents(in: c, matching: try Query("n == \(n)"), sort: [], limit: 100, offset: 1)
            #expect(found.count == ids.count - 1, "\(label)")
            for id in ids {
                #expect(try store.document(id: id, in: c)?["n"] == .int(Int64(n)), "\(label) \(id)")
            }
            let page = try store.changes(in: c, after: 0, limit: 100, maxBytes: .max, keys: ids.map { JSON.string($0) })
            #expect(page.records.count == ids.count, "\(label)")
            #expect(Set(page.records.map(\.key)) == Set(ids.map { JSON.string($0) }), "\(label)")
            let entries = try store.entries(in: c, after: 0, limit: 100, includeDeleted: true)
            #expect(Set(entries.map(\.key)) == Set(ids.map { JSON.string($0) }), "\(label)")
        }
        // Remove and reap in each; the reaped keys are the right ones.
        for c in collections { try store.remove(id: ":", in: c) }
        for c in collections {
            #expect(try store.reapTombstones(in: c, through: store.lastSeq) == 1, "\(c.utf8.count) bytes")
            #expect(try store.reapedState(id: ":", in: c) != nil, "\(c.utf8.count) bytes")
            #expect(try store.count(in: c) == ids.count - 1)
        }
        // documents.id read on the store's connection equals the key.
        try store.withState { s in
            let st = try s.db.prepare("SELECT count(*) FROM documents WHERE k != trellis_key(collection, id)")
            defer { st.reset() }
            _ = try st.step()
            #expect(st.int64(0) == 0)
        }
    }

    /// `documents.id` read from a raw connection (no trellis functions), as the CLI tests do.
    @Test func rawConnectionReadsID() throws {
        let path = dir.path("raw.sqlite")
        let store = try DocumentStore(path: path)
        let long = String(repeating: "q", count: 10)
        try store.upsert(["_id": "a:b", "v": 1], in: long)
        try store.upsert(["_id": "x", "v": 2], in: "a\u{0}")
        try store.checkpointWAL()
        let rows = try SQLiteFile.query(path, "SELECT id FROM documents WHERE collection = ? ORDER BY id", [long])
        #expect(rows.map { $0[0] } == ["\"a:b\""])
        #expect(try SQLiteFile.integrityCheck(path) == "ok")
    }

    /// saveSnapshot / restoreSnapshot keep every row and key, NUL collections included.
    @Test func snapshotRoundTrip() throws {
        let store = try DocumentStore(path: dir.path("snap.sqlite"))
        try store.upsert(["_id": "a", "v": 1], in: "a\u{0}b")
        try store.upsert(["_id": "b", "v": 1], in: String(repeating: "w", count: 10))
        try store.createIndex(path: .key("v"), in: "c")
        try store.upsert(["_id": "c", "v": 1], in: "c")
        try store.saveSnapshot()
        try store.upsert(["_id": "a2", "v": 2], in: "a\u{0}b")
        try store.remove(id: "c", in: "c")
        try store.restoreSnapshot()
        #expect(try store.documents(in: "a\u{0}b").map { $0["_id"] } == ["a"])
        #expect(try store.document(id: "b", in: String(repeating: "w", count: 10)) != nil)
        #expect(try store.documents(in: "c", matching: try Query("v == 1")).count == 1)
        try store.withState { s in
            let st = try s.db.prepare(
                "SELECT count(*) FROM documents WHERE id IS NULL OR k != trellis_key(collection, id)")
            defer { st.reset() }
            _ = try st.step()
            #expect(st.int64(0) == 0)
        }
    }

    /// Query results in `_id` key byte order, on an indexed field (range and IN, which leave the key
    /// range to the planner) and unindexed.
    @Test func resultsInKeyOrder() throws {
        let store = try DocumentStore(path: dir.path("order.sqlite"))
        let ids: [Value] = (0..<300).map { i in i % 3 == 0 ? ["m": .int(Int64(i))] : .string("k\(i)\u{E9}") }
        try store.upsert(ids.enumerated().map { ["_id": $1, "n": .int(Int64($0 % 5))] }, in: "c")
        try store.upsert(ids.map { ["_id": $0, "n": 1] }, in: "cc")
        func ordered(_ docs: [Value]) -> Bool {
            let keys = docs.compactMap { $0["_id"] }.map { Array(JSON.string($0).utf8) }
            return keys == keys.sorted { $0.lexicographicallyPrecedes($1) }
        }
        for indexed in [false, true] {
            if indexed { try store.createIndex(path: .key("n"), in: "c") }
            for q in ["n == 1", "n > 2", "n IN [1, 3]", "n == 1 || n == 4"] {
                let docs = try store.documents(in: "c", matching: try Query(q), sort: [])
                #expect(ordered(docs), "\(q) indexed \(indexed)")
                #expect(docs.allSatisfy { $0["_id"] != nil })
                let window = try store.documents(in: "c", matching: try Query(q), sort: [], limit: 7, offset: 5)
                #expect(window == Array(docs.dropFirst(5).prefix(7)), "\(q) indexed \(indexed)")
                #expect(try store.count(in: "c", matching: try Query(q)) == docs.count, "\(q)")
            }
        }
    }

    /// A filtered change page refetched by keys in a collection whose name holds U+0000 (bound
    /// collection term, pushed bindings, keys' json_each).
    @Test func filteredRefetchInNULCollection() throws {
        let store = try DocumentStore(path: dir.path("nul-refetch.sqlite"))
        for c in ["p\u{0}", "p", "p\u{0}q"] {
            try store.upsert((0..<10).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] }, in: c)
        }
        for c in ["p\u{0}", "p", "p\u{0}q"] {
            let page = try store.changes(
                in: c, after: 0, limit: 100, maxBytes: .max, matching: try Query("n > 4"),
                keys: ["\"d1\"", "\"d7\"", "\"d9\"", "\"zz\""])
            #expect(Set(page.records.map(\.key)) == ["\"d7\"", "\"d9\""], "\(c.debugDescription)")
            let docs = try store.documents(
                in: c, matching: try Query("n > 4"), sort: [SortKey(.key("n"), .descending)], limit: 2, offset: 1)
            #expect(docs.map { $0["n"] } == [8, 7], "\(c.debugDescription)")
        }
    }

    /// A tombstone row whose collection name is ill-formed UTF-8 (a damaged row): the reaper
    /// reads its key by dropping keyPrefixLength of the *repaired* name.
    @Test func reaperWithIllFormedCollection() throws {
        var options = StoreOptions()
        options.tombstoneTTL = 0
        let store = try DocumentStore(path: dir.path("illformed.sqlite"), options: options)
        try store.upsert(["_id": "x"], in: "a")
        try store.remove(id: "x", in: "a")
        try store.withState { s in
            try s.db.execute(
                "UPDATE documents SET unacked = NULL, collection = CAST(X'61ff' AS TEXT), "
                    + "k = trellis_key(CAST(X'61ff' AS TEXT), '\"x\"')")
        }
        let first = try store.reapExpiredTombstones()
        let second = try store.reapExpiredTombstones()
        let reaped = try store.withState { s -> [String] in
            let st = try s.db.prepare("SELECT id FROM reaped")
            defer { st.reset() }
            var ids: [String] = []
            while try st.step() { ids.append(st.string(0) ?? "") }
            return ids
        }
        #expect(reaped.allSatisfy { $0 == "\"x\"" }, "\(reaped) \(first) \(second)")
        #expect(second.reaped == 0, "\(first) \(second)")
    }
}
