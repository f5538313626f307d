import Foundation
import TrellisCore

// Strings holding U+0000, and SQLite's JSON functions.
//
// SQLite 3.40's JSON functions cut a string at its first NUL: `json_extract('{"a":"x\u0000y"}',
// '$.a')` is `'x'`, and so are `json_each`'s values and an expression index on the path. A query
// pushed down to SQLite would then take `"x\u0000y"` for `"x"`: `a == 'x'` would select it (a
// remove by that query would delete it, and the change log would send it to a peer subscribed to
// `a == 'x'`), while `a > 'x'` and `a != 'x'` would miss it. In-memory evaluation (the query
// language's definition) compares the whole string.
//
// So the store remembers which collections hold such a string: the materialised JSON of a live
// row holds the escape `\u0000` (JSON text cannot carry a raw NUL). In those collections a pushed
// down query also returns every row whose JSON holds the escape, and those rows are evaluated in
// memory (`instr(value, '\u0000') > 0 OR (query)`, which no index serves); other collections are
// untouched. The mark is per collection, kept in `meta` (`nul:<collection>`) in the transaction of
// the write that made it true, and never cleared: a collection that once held such a string
// answers correctly, only without its indexes. A store from before this mark existed is scanned
// once when it is opened for writing (`nul-scanned` in `meta` records it); a read-only open of
// such a store scans without writing.

extension DocumentStore {
    /// The SQL condition true for a row whose materialised JSON holds the escape of U+0000 (or the
    /// text `\u0000` itself, escaped as `\\u0000`: evaluated in memory too, which is only slower).
    static let nulEscapeSQL = "instr(documents.value, '\\u0000') > 0"

    /// Whether JSON text holds the escape `\u0000` (see the file's header).
    ///
    /// - Complexity: O(n) in the text's bytes.
    static func holdsNULEscape(_ json: String) -> Bool {
        if let found = json.utf8.withContiguousStorageIfAvailable(holdsNULEscape) { return found }
        return Array(json.utf8).withUnsafeBufferPointer(holdsNULEscape)
    }

    /// ``holdsNULEscape(_:)-(String)`` on the text's UTF-8.
    static func holdsNULEscape(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        // `\u0000`: a backslash, `u`, four `0`. Backslashes are found by `memchr` (most JSON has
        // none), and only what follows one is compared.
        guard let base = bytes.baseAddress, bytes.count >= 6 else { return false }
        var i = 0
        while i <= bytes.count - 6 {
            guard let found = memchr(base + i, 0x5C, bytes.count - 5 - i) else { return false }
            i = base.distance(to: found.assumingMemoryBound(to: UInt8.self))
            if bytes[i + 1] == 0x75, bytes[i + 2] == 0x30, bytes[i + 3] == 0x30, bytes[i + 4] == 0x30,
                bytes[i + 5] == 0x30
            {
                return true
            }
            i += 1
        }
        return false
    }

    /// Whether a collection may hold a string with U+0000 (its pushed-down queries then evaluate
    /// such rows in memory).
    ///
    /// A read-only store watches a log another process writes, so it reads the writer's mark
    /// again each time (one primary-key look-up in `meta`); a store no writer of this version has
    /// scanned yet (no `nul-scanned`) may hold such strings anywhere. Marks only ever appear, in the
    /// transaction of the write that made them true: a reader that finds a collection unmarked
    /// asks again after reading its rows and reads them again if it is marked now
    /// (``answeredWithoutNULRows(_:_:)``).
    func mayHoldNUL(_ s: inout State, _ collection: String) throws -> Bool {
        let name = UTF8Key(collection)
        if !s.nulCollections.isEmpty, s.nulCollections.contains(name) { return true }
        guard options.readOnly else { return false }
        guard try Self.meta(s.db, Self.nulMetaPrefix + collection) != nil || Self.meta(s.db, "nul-scanned") == nil
        else { return false }
        s.nulCollections.insert(name)
        return true
    }

    /// Whether rows read without the in-memory step for strings with U+0000 must be read again
    /// with it: in a read-only store, a writer marked the collection meanwhile (``mayHoldNUL(_:_:)``).
    func answeredWithoutNULRows(_ s: inout State, _ collection: String) throws -> Bool {
        options.readOnly ? try mayHoldNUL(&s, collection) : false
    }

    /// Marks `collection` as holding a string with U+0000 when the JSON just written holds one
    /// (inside the write's transaction).
    static func noteNULStrings(_ s: inout State, _ collection: String, _ json: String) throws {
        guard holdsNULEscape(json) else { return }
        let name = UTF8Key(collection)
        guard !s.nulCollections.contains(name) else { return }
        try setMeta(s.db, nulMetaPrefix + collection, [])
        s.nulCollections.insert(name)
    }

    static let nulMetaPrefix = "nul:"

    /// The collections marked as holding strings with U+0000; a store not yet scanned for them
    /// (written by an earlier version) is scanned and the result recorded, unless `readOnly`
    /// (then ``mayHoldNUL(_:_:)`` counts every collection as marked).
    ///
    /// - Complexity: O(collections marked), or one scan of the documents table the first time.
    static func loadNULCollections(_ db: Connection, readOnly: Bool) throws -> Set<UTF8Key> {
        var marked: Set<UTF8Key> = []
        if try meta(db, "nul-scanned") == nil {
            // Read-only: every collection counts as marked until a writer has scanned the store.
            if readOnly { return [] }
            let scan = try db.prepare(
                "SELECT DISTINCT collection FROM documents WHERE deleted = 0 AND \(nulEscapeSQL)")
            var found: [String] = []
            while try scan.step() { found.append(scan.string(0) ?? "") }
            scan.reset()
            try db.transaction {
                for collection in found { try setMeta(db, nulMetaPrefix + collection, []) }
                try setMeta(db, "nul-scanned", [1])
            }
            for collection in found { marked.insert(UTF8Key(collection)) }
            return marked
        }
        let st = try db.prepare("SELECT key FROM meta WHERE key >= 'nul:' AND key < 'nul;'")
        defer { st.reset() }
        while try st.step() {
            let key = st.string(0) ?? ""
            marked.insert(UTF8Key(String(decoding: key.utf8.dropFirst(nulMetaPrefix.utf8.count), as: UTF8.self)))
        }
        return marked
    }
}
