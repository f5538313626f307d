internal import CSQLite
public import TrellisCore

/// Documents brought back from eviction that still withhold a value (docs/MESH.md, "Eviction").
///
/// A copy older than the evicted one, merged into the stub, makes the document live again with
/// its newest value withheld. The node asks its other peers for such documents again; the
/// `withholding` table keeps their keys so that a restart, which rebuilds the list of documents
/// to ask for again from the store, asks for them too (``evictedIDs(in:limit:)``). Rows are added
/// by the merge that leaves a document withholding, cleared by a later merge that makes it whole,
/// and checked at open (a local write may have filled the field, an eviction made it a stub).
extension DocumentStore {
    /// Counts the `withholding` rows at open, and drops those whose document no longer withholds
    /// a value (unless the store is read-only).
    ///
    /// - Complexity: O(rows · size of their states): the table is empty but for documents whose
    ///   newest value no peer has sent back yet.
    static func loadWithholding(_ db: Connection, into state: inout State, readOnly: Bool) throws {
        guard try hasTable(db, "withholding") else { return }
        let st = try db.prepare(
            "SELECT w.collection, w.id, d.state, d.value, d.deleted FROM withholding w "
                + "LEFT JOIN documents d ON d.k = trellis_key(w.collection, w.id)")
        var count = 0
        var done: [(String, String)] = []
        while try st.step() {
            let withholds =
                st.int64(4) == RowKind.live.rawValue
                && ((try? StoredState.decode(st.bytes(2) ?? [], value: st.string(3)))?.withheldEntryCount ?? 0) > 0
            if withholds { count += 1 } else { done.append((st.string(0) ?? "", st.string(1) ?? "")) }
        }
        st.reset()
        // A read-only store keeps its rows, and lists them all (``evictedIDs(in:limit:)``).
        guard !readOnly else {
            state.withholdingRows = count + done.count
            return
        }
        state.withholdingRows = count
        let delete = try db.prepare("DELETE FROM withholding WHERE collection = ? AND id = ?")
        for (collection, key) in done {
            delete.bind(1, collection)
            delete.bind(2, key)
            try delete.run()
            delete.reset()
        }
    }

    /// Records whether a document just merged withholds a value (inside the merge's transaction).
    func noteWithholding(_ s: inout State, _ collection: String, _ key: String, _ withholds: Bool) throws {
        guard withholds || s.withholdingRows > 0 else { return }
        let st = try s.db.prepare(
            withholds
                ? "INSERT OR IGNORE INTO withholding(collection, id) VALUES (?, ?)"
                : "DELETE FROM withholding WHERE collection = ? AND id = ?")
        st.bind(1, collection)
        st.bind(2, key)
        try st.run()
        s.withholdingRows += Int(s.db.changes) * (withholds ? 1 : -1)
    }
}
