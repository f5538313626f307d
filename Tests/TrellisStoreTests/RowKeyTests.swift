import Foundation
import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// The `documents` table's row key `k` (docs/ARCHITECTURE.md, "The row key"): one text column made of
/// the collection's length, the collection and the `_id` key, so that SQLite tells rows apart by
/// their first key column. Collections and keys that share bytes stay apart, each collection reads
/// in `_id` key order, and a store keyed by `(collection, id)` is rebuilt when it is opened.
@Suite struct RowKeyTests {
    let dir = TemporaryDirectory("trellis-row-key")

    /// Rewrites `store`'s `documents` table in the layout every version before the row key wrote,
    /// keyed by `(collection, id)`, with the unused `source` column and the change log's index,
    /// then runs `then` (more SQL on the old table).
    static func keyByCollectionAndID(_ store: DocumentStore, then: String = "") throws {
        try store.withState { s in
            try s.db.execute(
                """
                CREATE TABLE earlier(
                    collection TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL, deleted INTEGER NOT NULL,
                    state BLOB NOT NULL, value TEXT, removed_at INTEGER, delta BLOB, delta_seq INTEGER,
                    age INTEGER, unacked INTEGER, source BLOB, PRIMARY KEY(collection, id)
                ) WITHOUT ROWID;
                INSERT INTO earlier SELECT collection, id, seq, deleted, state, value, removed_at, delta,
                    delta_seq, age, unacked, NULL FROM documents;
                DROP TABLE documents;
                ALTER TABLE earlier RENAME TO documents;
                CREATE INDEX documents_by_collection_seq ON documents(collection, seq);
                \(then)
                """)
        }
    }

    /// What SQLite's `trellis_key` and `trellis_key_end` give, read through a store's connection.
    func keys(_ store: DocumentStore, _ collection: String, _ id: String) throws -> (key: [UInt8], end: [UInt8]) {
        try store.withState { s in
            let st = try s.db.prepare("SELECT CAST(trellis_key(?, ?) AS BLOB), CAST(trellis_key_end(?) AS BLOB)")
            st.bind(1, collection)
            st.bind(2, id)
            st.bind(3, collection)
            defer { st.reset() }
            _ = try st.step()
            return (st.bytes(0) ?? [], st.bytes(1) ?? [])
        }
    }

    @Test func theKeyIsTheLengthTheCollectionAndTheID() throws {
        let store = try DocumentStore(path: dir.path("functions.sqlite"))
        #expect(try keys(store, "cars", "\"a\"") == (Array("4:cars:\"a\"".utf8), Array("4:cars;".utf8)))
        // The length counts bytes: é is two, U+0000 is one.
        #expect(try keys(store, "\u{E9}", "x").key == Array("2:\u{E9}:x".utf8))
        #expect(try keys(store, "a\u{0}b", "").key == [UInt8(ascii: "3"), 58, 97, 0, 98, 58])
        #expect(try keys(store, "", "x") == (Array("0::x".utf8), Array("0:;".utf8)))
        try store.withState { s in
            let st = try s.db.prepare(
                "SELECT trellis_key(NULL, 'x') IS NULL, trellis_key_end(NULL) IS NULL, trellis_key(X'6162', 1) = '2:ab:1'"
            )
            defer { st.reset() }
            _ = try st.step()
            // NULL stays NULL; a blob or a number counts as its text (a damaged row of an earlier store).
            #expect(st.int64(0) == 1 && st.int64(1) == 1 && st.int64(2) == 1)
        }
    }

    /// Collections whose names are prefixes of each other, or hold `:`, `;` or U+0000, and `_id`s
    /// that would make one collection's key another's if the key had no length: every read of one
    /// collection returns its documents alone, in `_id` key order.
    @Test func collectionsThatShareBytesStayApart() throws {
        let store = try DocumentStore(path: dir.path("apart.sqlite"))
        let collections = ["a", "a:b", "a:", "a;", "a\u{0}b", "ab", "", "b", "10:a"]
        let ids = ["b:x", "x", ":", ";", "b\u{0}x", "\u{0}", "a:b:x", "\u{10FFFF}", "\u{E9}", "10:a"]
        for (n, collection) in collections.enumerated() {
            try store.upsert(ids.map { ["_id": .string($0), "c": .int(Int64(n))] }, in: collection)
        }
        for (n, collection) in collections.enumerated() {
            let documents = try store.documents(in: collection)
            #expect(documents.count == ids.count, "\(collection.debugDescription)")
            #expect(documents.allSatisfy { $0["c"] == .int(Int64(n)) }, "\(collection.debugDescription)")
            // In `_id` key order: the keys are the `_id`s as JSON, compared byte-wise.
            let keys = documents.compactMap { $0["_id"] }.map { JSON.string($0) }
            #expect(
                keys.map { Array($0.utf8) } == keys.map { Array($0.utf8) }.sorted { $0.lexicographicallyPrecedes($1) })
            #expect(try store.documents(in: collection, matching: try Query("c == \(n)")).count == ids.count)
            #expect(try store.count(in: collection, matching: .all) == ids.count)
            for id in ids {
                #expect(try store.document(id: .string(id), in: collection)?["c"] == .int(Int64(n)))
            }
        }
        // One removal touches one collection only.
        try store.remove(id: "x", in: "a")
        #expect(try store.document(id: "x", in: "a") == nil)
        for collection in collections.dropFirst() {
            #expect(try store.document(id: "x", in: collection) != nil, "\(collection.debugDescription)")
        }
        #expect(
            try store.collectionCounts().map(\.name).sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
                == collections.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) })
    }

    /// A query on fields no index serves reads the collection's key range in order: no other
    /// collection's rows, no lookup from the change log's index, no sort. One on an indexed field
    /// seeks its index, whose entries of one value are in key order.
    @Test func scansReadTheKeyRangeAndIndexesServeTheirFields() throws {
        let store = try DocumentStore(path: dir.path("plans.sqlite"))
        try store.upsert((0..<200).map { ["_id": .string("d\($0)"), "n": .int(Int64($0 % 7))] }, in: "c")
        try store.upsert((0..<200).map { ["_id": .string("e\($0)"), "n": .int(1)] }, in: "other")
        for query in [try Query("n == 3"), try Query("n > 3 && n < 6"), Query.all] {
            let plan = try store.queryPlan(in: "c", matching: query).joined(separator: "; ")
            #expect(plan.contains("USING PRIMARY KEY (k>? AND k<?)"), "\(plan)")
            #expect(!plan.contains("TEMP B-TREE"), "\(plan)")
        }
        let index = try store.createIndex(path: .key("n"), in: "c")
        let plan = try store.queryPlan(in: "c", matching: try Query("n == 3")).joined(separator: "; ")
        #expect(plan.contains("USING INDEX \(index)") && !plan.contains("TEMP B-TREE"), "\(plan)")
        let found = try store.documents(in: "c", matching: try Query("n == 3"), sort: [])
        #expect(found.count == 29)
        let keys = found.compactMap { $0["_id"] }.map { Array(JSON.string($0).utf8) }
        #expect(keys == keys.sorted { $0.lexicographicallyPrecedes($1) })
        #expect(try store.count(in: "c", matching: try Query("n == 3")) == 29)
        #expect(try store.count(in: "c", matching: try Query("n > 3")) == 84)
    }

    /// A store whose `documents` table is keyed by `(collection, id)`, as every version before the
    /// row key wrote it, with a live document, a tombstone and an expression index: opened for
    /// reading it says to open it for writing once; opened for writing it is rebuilt with every
    /// row, and its index is made again as this version makes it.
    @Test func aStoreKeyedByCollectionAndIDIsRebuiltWhenOpened() throws {
        let path = dir.path("earlier.sqlite")
        var before: [Value] = []
        do {
            let store = try DocumentStore(path: path)
            try store.upsert((0..<50).map { ["_id": .string("d\($0)"), "n": .int(Int64($0 % 5))] }, in: "c")
            try store.upsert(["_id": "x", "n": 1], in: "other")
            try store.remove(id: "d7", in: "c")
            let index = try store.createIndex(path: .key("n"), in: "c")
            before = try store.documents(in: "c")
            try Self.keyByCollectionAndID(
                store,
                then: #"CREATE INDEX "\#(index)" ON documents(json_extract(value, '$.n')) WHERE collection = 'c';"#)
            store.close()
        }
        var readOnly = StoreOptions()
        readOnly.readOnly = true
        #expect(throws: StoreError.self) { _ = try DocumentStore(path: path, options: readOnly) }
        do {
            _ = try DocumentStore(path: path, options: readOnly)
        } catch {
            #expect("\(error)".contains("open it for writing once"), "\(error)")
        }
        let store = try DocumentStore(path: path)
        #expect(try store.withState { s in try DocumentStore.hasRowKey(s.db) })
        #expect(try store.documents(in: "c") == before)
        #expect(try store.documents(in: "other").count == 1)
        #expect(try store.state(id: "d7", in: "c")?.isDeleted == true)
        let query = try Query("n == 3")
        #expect(try store.documents(in: "c", matching: query).count == 10)
        let plan = try store.queryPlan(in: "c", matching: query)
        #expect(plan.joined().contains("collection=?"), "the index is made again with its collection column: \(plan)")
        // Writes and the change log work on the rebuilt table.
        try store.upsert(["_id": "d1", "n": 9], in: "c")
        #expect(try store.document(id: "d1", in: "c")?["n"] == 9)
        let entries = try store.entries(in: "c", after: 0, limit: 100, includeDeleted: true)
        #expect(entries.count == 50)
        #expect(entries.last?.id == "d1")
    }
}
