import Foundation
public import TrellisCore

/// One entry of a collection's change log with the document's materialised value (read from the
/// stored JSON, no CRDT state decoded): what enumerators over the log need.
public struct LogEntry: Sendable, Equatable {
    /// The entry's position in the change log.
    public var seq: Int64
    /// The canonical key of the `_id` (``DocumentStore/key(for:)``).
    public var key: String
    /// The document's `_id`.
    public var id: Value
    /// The live value; `nil` for a removed or evicted document.
    public var value: Value?

    public init(seq: Int64, key: String, id: Value, value: Value?) {
        self.seq = seq
        self.key = key
        self.id = id
        self.value = value
    }
}

/// One entry of a collection's change log with the document as the caller decoded it from its
/// stored JSON text (``DocumentStore/entries(in:after:through:limit:includeDeleted:decodingJSON:)``).
public struct DecodedLogEntry<Document: Sendable>: Sendable {
    /// The entry's position in the change log.
    public var seq: Int64
    /// The canonical key of the `_id` (``DocumentStore/key(for:)``).
    public var key: String
    /// The document's `_id`.
    public var id: Value
    /// The live document as decoded; `nil` for a removed or evicted document.
    public var document: Document?

    @inlinable
    public init(seq: Int64, key: String, id: Value, document: Document?) {
        self.seq = seq
        self.key = key
        self.id = id
        self.document = document
    }
}

extension DocumentStore {
    /// Log entries of a collection with `after < seq <= through`, in `seq` order (each document
    /// once, at its latest `seq`).
    ///
    /// A damaged row (its `_id` key or JSON value does not parse) is skipped, logged once and
    /// listed by ``damagedDocuments()``; the page is filled from the rows after it.
    ///
    /// - Parameters:
    ///   - after: exclusive lower bound (a cursor: the last `seq` already seen).
    ///   - through: inclusive upper bound, or `nil` for the end of the log.
    ///   - limit: at most this many entries are returned.
    ///   - includeDeleted: whether removed and evicted documents are returned (with a `nil` value):
    ///     to a reader of the log, an evicted document is deleted.
    /// - Throws: ``StoreError`` for SQLite errors.
    /// - Complexity: O(limit · log n) through the `(collection, seq)` index when tombstones are
    ///   included; without them, also O(tombstones skipped in the range).
    public func entries(
        in collection: String, after: Int64, through: Int64? = nil, limit: Int, includeDeleted: Bool
    ) throws(StoreError) -> [LogEntry] {
        try entries(
            in: collection, after: after, through: through, limit: limit, includeDeleted: includeDeleted,
            decodingJSON: { try? JSON.parse(String(decoding: $0, as: UTF8.self)) }
        ).map { LogEntry(seq: $0.seq, key: $0.key, id: $0.id, value: $0.document) }
    }

    /// Log entries as ``entries(in:after:through:limit:includeDeleted:)`` lists them, each live
    /// document read by `decode` from its stored JSON text instead of parsed into a ``Value``:
    /// for readers that decode the text straight into their own type.
    ///
    /// `collection`, `after`, `through`, `limit` and `includeDeleted` are those of
    /// ``entries(in:after:through:limit:includeDeleted:)``.
    ///
    /// - Parameter decode: reads a live document's JSON text, given as the UTF-8 bytes SQLite
    ///   holds (valid during the call only), and answers `nil` when, and only when, the text is
    ///   not JSON: the row is then damaged, skipped, logged and listed as
    ///   ``entries(in:after:through:limit:includeDeleted:)`` does. The text is compact JSON as
    ///   the store writes it unless the row was changed behind the store's back; then it may
    ///   even be ill-formed UTF-8, which the store's own readers take as
    ///   `String(decoding: bytes, as: UTF8.self)` does (each ill-formed sequence read as U+FFFD)
    ///   before parsing it, and so should `decode`. It runs while the store is held, once per
    ///   live row.
    /// - Returns: at most `limit` entries in `seq` order; a removed or evicted document (when
    ///   included) has a `nil` document and is not passed to `decode`.
    /// - Throws: ``StoreError`` for SQLite errors.
    /// - Complexity: as ``entries(in:after:through:limit:includeDeleted:)``, plus the cost of
    ///   `decode` for each live row read.
    @inlinable
    public func entries<Document: Sendable>(
        in collection: String, after: Int64, through: Int64? = nil, limit: Int, includeDeleted: Bool,
        decodingJSON decode: (UnsafeBufferPointer<UInt8>) -> Document?
    ) throws(StoreError) -> [DecodedLogEntry<Document>] {
        // Inlined into the caller, so the per-row work is specialised for its `Document`.
        var result: [DecodedLogEntry<Document>] = []
        result.reserveCapacity(min(max(limit, 0), 1_024))
        try readEntries(in: collection, after: after, through: through, limit: limit, includeDeleted: includeDeleted) {
            seq, key, id, json in
            guard let json else {
                result.append(DecodedLogEntry(seq: seq, key: key, id: id, document: nil))
                return true
            }
            guard let document = decode(json) else { return false }
            result.append(DecodedLogEntry(seq: seq, key: key, id: id, document: document))
            return true
        }
        return result
    }

    /// Hands each log entry ``entries(in:after:through:limit:includeDeleted:)`` would list to
    /// `read`, in `seq` order, with the live document's JSON text as stored (not parsed).
    ///
    /// `collection`, `after`, `through`, `limit` and `includeDeleted` are those of
    /// ``entries(in:after:through:limit:includeDeleted:)``.
    ///
    /// - Parameter read: takes the entry's `seq`, canonical `_id` key, `_id` and the bytes of its
    ///   JSON text as
    ///   ``entries(in:after:through:limit:includeDeleted:decodingJSON:)`` passes them to its
    ///   `decode` (`nil` for a removed or evicted document), and answers `false` when, and only
    ///   when, the text is not JSON: the row is then damaged, skipped (it does not count towards
    ///   `limit`), logged once and listed by ``damagedDocuments()``. It runs while the store is
    ///   held.
    /// - Throws: ``StoreError`` for SQLite errors.
    /// - Complexity: as ``entries(in:after:through:limit:includeDeleted:)``, plus the cost of
    ///   `read` for each row.
    public func readEntries(
        in collection: String, after: Int64, through: Int64? = nil, limit: Int, includeDeleted: Bool,
        _ read: (_ seq: Int64, _ key: String, _ id: Value, _ json: UnsafeBufferPointer<UInt8>?) -> Bool
    ) throws(StoreError) {
        try readLogRows(
            in: collection, after: after, through: through, limit: limit, includeDeleted: includeDeleted
        ) { seq, key, id, json in
            read(seq, String(decoding: key, as: UTF8.self), id.value, json)
        }
    }

    /// Hands each log entry ``entries(in:after:through:limit:includeDeleted:)`` would list to
    /// `read` as ``readEntries(in:after:through:limit:includeDeleted:_:)`` does, with the `_id`
    /// key as the bytes SQLite holds and a string `_id` as its bytes: for readers that make of
    /// the `_id` only what they need (the contacts enumerator, one identifier string per row).
    ///
    /// `collection`, `after`, `through`, `limit` and `includeDeleted` are those of
    /// ``entries(in:after:through:limit:includeDeleted:)``.
    ///
    /// - Parameter read: takes the entry's `seq`, the bytes of its canonical `_id` key
    ///   (`String(decoding: key, as: UTF8.self)` is the key
    ///   ``readEntries(in:after:through:limit:includeDeleted:_:)`` gives), its `_id`
    ///   (``LogRowID``), and the bytes of its JSON text (`nil` for a removed or evicted
    ///   document); the bytes are valid during the call only. It answers as
    ///   ``readEntries(in:after:through:limit:includeDeleted:_:)``'s `read` does. A row whose
    ///   `_id` key is not JSON is skipped, logged and listed before `read` would see it.
    /// - Throws: ``StoreError`` for SQLite errors.
    /// - Complexity: as ``entries(in:after:through:limit:includeDeleted:)``, plus the cost of
    ///   `read` for each row; a string `_id` key is read without allocation.
    public func readLogRows(
        in collection: String, after: Int64, through: Int64? = nil, limit: Int, includeDeleted: Bool,
        _ read: (
            _ seq: Int64, _ key: UnsafeBufferPointer<UInt8>, _ id: LogRowID, _ json: UnsafeBufferPointer<UInt8>?
        ) -> Bool
    ) throws(StoreError) {
        try withState { s in
            let st = try s.db.prepare(
                "SELECT seq, k, value FROM documents WHERE collection = ? AND seq > ? AND seq <= ?"
                    + (includeDeleted ? "" : " AND deleted = 0") + " ORDER BY seq LIMIT ?")
            let wanted = max(0, limit)
            let prefix = Self.keyPrefixLength(collection)
            var count = 0
            var cursor = after
            // A damaged row is skipped (and remembered); read on so the page still holds `limit`
            // entries when the log has them, which is how readers tell that more are coming.
            while count < wanted {
                let need = wanted - count
                st.reset()
                st.bind(1, collection)
                st.bind(2, cursor)
                st.bind(3, through ?? Int64.max)
                st.bind(4, Int64(need))
                var rows = 0
                while try st.step() {
                    rows += 1
                    cursor = st.int64(0)
                    let key = st.textBytes(1, dropping: prefix)
                    let id: LogRowID
                    if let content = JSON.plainStringContent(UnsafeRawBufferPointer(key)) {
                        id = .string(content.assumingMemoryBound(to: UInt8.self))
                    } else if let parsed = try? JSON.parse(String(decoding: key, as: UTF8.self)) {
                        id = .parsed(parsed)
                    } else {
                        noteDamaged(&s, collection, String(decoding: key, as: UTF8.self), "its _id key is not JSON")
                        continue
                    }
                    guard read(cursor, key, id, st.textBytes(2)) else {
                        noteDamaged(
                            &s, collection, String(decoding: key, as: UTF8.self), "its JSON value does not parse")
                        continue
                    }
                    count += 1
                }
                if rows < need { break }  // the end of the range
            }
            st.reset()
        }
    }
}

/// The `_id` of a change-log row as ``DocumentStore/readLogRows(in:after:through:limit:includeDeleted:_:)``
/// hands it to its reader.
public enum LogRowID {
    /// A string `_id` whose key is a JSON string literal without escapes (as the store writes
    /// every string `_id` without control characters, `"` or `\`), well-formed: the string's
    /// UTF-8 bytes as SQLite holds them, valid during the reader's call only.
    case string(UnsafeBufferPointer<UInt8>)
    /// Any other `_id`, parsed from its key.
    case parsed(Value)

    /// The `_id` as a value.
    public var value: Value {
        switch self {
        case .string(let bytes): return .string(String(decoding: bytes, as: UTF8.self))
        case .parsed(let value): return value
        }
    }
}
