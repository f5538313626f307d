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
        try withState { s -> [LogEntry] in
            let st = try s.db.prepare(
                "SELECT seq, id, value FROM documents WHERE collection = ? AND seq > ? AND seq <= ?"
                    + (includeDeleted ? "" : " AND deleted = 0") + " ORDER BY seq LIMIT ?")
            let wanted = max(0, limit)
            var result: [LogEntry] = []
            var cursor = after
            // A damaged row is skipped (and remembered); read on so the page still holds `limit`
            // entries when the log has them, which is how readers tell that more are coming.
            while result.count < wanted {
                let need = wanted - result.count
                st.reset()
                st.bind(1, collection)
                st.bind(2, cursor)
                st.bind(3, through ?? Int64.max)
                st.bind(4, Int64(need))
                var rows = 0
                while try st.step() {
                    rows += 1
                    cursor = st.int64(0)
                    let key = st.string(1) ?? ""
                    guard let id = try? JSON.parse(key) else {
                        noteDamaged(&s, collection, key, "its _id key is not JSON")
                        continue
                    }
                    var value: Value?
                    if let text = st.string(2) {
                        guard let parsed = try? JSON.parse(text) else {
                            noteDamaged(&s, collection, key, "its JSON value does not parse")
                            continue
                        }
                        value = parsed
                    }
                    result.append(LogEntry(seq: cursor, key: key, id: id, value: value))
                }
                if rows < need { break }  // the end of the range
            }
            st.reset()
            return result
        }
    }
}
