import CSQLite
import Synchronization

// Going back to a saved state in memory, for tests and fuzzing: cheaper than opening a new store,
// which parses the schema and prepares every statement again.

/// The content of a store's database and its in-memory position at ``DocumentStore/saveSnapshot()``.
struct StoreSnapshot {
    var state: DocumentStore.State
    /// Every table (SQLite's own `sqlite_sequence` too, when present) with its stored columns
    /// (generated ones, such as `documents.id`, are computed again) and its rows. Each table is
    /// `WITHOUT ROWID` or has an `INTEGER PRIMARY KEY`, so the stored columns carry every row's
    /// identity and the restored rows are the saved ones exactly.
    var tables: [(name: String, columns: [String], rows: [[SQLiteCell]])]
}

/// One value of a row as SQLite stores it (text kept as its bytes, so nothing is re-encoded).
enum SQLiteCell {
    case null
    case integer(Int64)
    case real(Double)
    case text([UInt8])
    case blob([UInt8])
}

extension DocumentStore {
    /// Remembers everything the store holds (documents, tombstones, checkpoints, deferred
    /// documents, served subscriptions, the log's identity) and its position (next `seq`, HLC), in
    /// memory, for ``restoreSnapshot()``. A later call replaces what an earlier one remembered.
    ///
    /// Meant for tests and fuzzing that run many cases from one starting state: going back costs a
    /// few statements, where opening a store costs its schema and every statement prepared again.
    ///
    /// - Throws: ``StoreError/closed`` after ``close()``, ``StoreError/invalidValue(_:)`` for a
    ///   read-only store, ``StoreError/sqlite(_:)`` when reading fails.
    /// - Complexity: O(n) time and memory in the rows of the database.
    public func saveSnapshot() throws(StoreError) {
        guard !options.readOnly else { throw .invalidValue("a read-only store has nothing to restore") }
        let box = try withState { s -> SnapshotBox in
            let tables = try s.db.transaction(readOnly: true) {
                () throws -> [(name: String, columns: [String], rows: [[SQLiteCell]])] in
                var tables: [(name: String, columns: [String], rows: [[SQLiteCell]])] = []
                let names = try s.db.prepare(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                        + "AND (name NOT LIKE 'sqlite%' OR name = 'sqlite_sequence') ORDER BY name")
                var list: [String] = []
                while try names.step() { list.append(names.string(0) ?? "") }
                names.reset()
                for name in list {
                    let stored = try s.db.prepare("SELECT name FROM pragma_table_xinfo(?) WHERE hidden = 0")
                    stored.bind(1, name)
                    var columns: [String] = []
                    while try stored.step() { columns.append(stored.string(0) ?? "") }
                    stored.reset()
                    let rows = try s.db.prepare("SELECT \(Self.columnList(columns)) FROM \"\(name)\"")
                    var cells: [[SQLiteCell]] = []
                    while try rows.step() { cells.append((0..<Int32(columns.count)).map { rows.cell($0) }) }
                    rows.reset()
                    tables.append((name, columns, cells))
                }
                return tables
            }
            return SnapshotBox(StoreSnapshot(state: s, tables: tables))
        }
        savedSnapshot.withLock { $0 = box }
    }

    /// Puts the store back as it was at the last ``saveSnapshot()``: every table's rows, the log's
    /// identity (epoch, site ID), the next `seq` and the HLC, in one transaction. The snapshot is
    /// kept, so the store can go back to it again.
    ///
    /// The store then issues again the `seq`s and stamps it issued after the snapshot, under the
    /// same epoch and site ID: only for a store no peer has read from since the snapshot (a test,
    /// a fuzzed session), never for one whose log left the process. Observers are not told, so it
    /// refuses while any are registered.
    ///
    /// - Throws: ``StoreError/invalidValue(_:)`` with no snapshot saved or while observers are
    ///   registered, ``StoreError/closed`` after ``close()``, ``StoreError/sqlite(_:)`` when
    ///   writing fails (nothing changes then).
    /// - Complexity: O(n) in the rows of the database now and in the snapshot.
    public func restoreSnapshot() throws(StoreError) {
        guard let snapshot = savedSnapshot.withLock({ $0 }) else {
            throw .invalidValue("no snapshot was saved (saveSnapshot())")
        }
        guard observerCount == 0 else {
            throw .invalidValue("\(observerCount) observers are registered; they would not learn of the restore")
        }
        try withState { s in
            try s.db.transaction {
                for table in snapshot.snapshot.tables {
                    let delete = try s.db.prepare("DELETE FROM \"\(table.name)\"")
                    try delete.run()
                    delete.reset()
                    guard !table.rows.isEmpty else { continue }
                    let marks = Array(repeating: "?", count: table.columns.count).joined(separator: ",")
                    let insert = try s.db.prepare(
                        "INSERT INTO \"\(table.name)\"(\(Self.columnList(table.columns))) VALUES (\(marks))")
                    for row in table.rows {
                        insert.reset()
                        for (i, cell) in row.enumerated() { insert.bind(Int32(i + 1), cell: cell) }
                        try insert.run()
                    }
                    insert.reset()
                }
            }
            s = snapshot.snapshot.state
        }
    }
}

extension DocumentStore {
    /// Column names quoted for SQL, separated by commas.
    static func columnList(_ columns: [String]) -> String {
        columns.map { "\"" + $0.replacingOccurrences(of: "\"", with: "\"\"") + "\"" }.joined(separator: ", ")
    }
}

/// A snapshot as ``DocumentStore`` keeps it: the state it holds names the store's connection,
/// which only the store uses, under its lock.
final class SnapshotBox: @unchecked Sendable {
    let snapshot: StoreSnapshot
    init(_ snapshot: StoreSnapshot) { self.snapshot = snapshot }
}

extension Statement {
    /// The value in `column` of the current row, as SQLite stores it.
    func cell(_ column: Int32) -> SQLiteCell {
        switch sqlite3_column_type(stmt, column) {
        case SQLITE_INTEGER: return .integer(sqlite3_column_int64(stmt, column))
        case SQLITE_FLOAT: return .real(sqlite3_column_double(stmt, column))
        case SQLITE_TEXT:
            let n = Int(sqlite3_column_bytes(stmt, column))
            guard n > 0, let p = sqlite3_column_text(stmt, column) else { return .text([]) }
            return .text([UInt8](UnsafeBufferPointer(start: p, count: n)))
        case SQLITE_BLOB: return .blob(bytes(column) ?? [])
        default: return .null
        }
    }

    func bind(_ index: Int32, cell: SQLiteCell) {
        switch cell {
        case .null: sqlite3_bind_null(stmt, index)
        case .integer(let value): sqlite3_bind_int64(stmt, index, value)
        case .real(let value): sqlite3_bind_double(stmt, index, value)
        case .text(let bytes) where bytes.isEmpty: trellis_sqlite3_bind_text_transient(stmt, index, "", 0)
        case .text(let bytes):
            bytes.withUnsafeBytes { buffer in
                buffer.withMemoryRebound(to: CChar.self) {
                    trellis_sqlite3_bind_text_transient(stmt, index, $0.baseAddress, Int32($0.count))
                }
            }
        case .blob(let bytes) where bytes.isEmpty: sqlite3_bind_zeroblob(stmt, index, 0)
        case .blob(let bytes): bind(index, bytes)
        }
    }
}
