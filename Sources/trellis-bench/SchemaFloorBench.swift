// The schema floor (docs/BENCHMARKS.md, "Fair baselines", the schema floor): the rows a
// Trellis store holds after the batched upserts, inserted again by hand into an empty store of the
// same schema, in one transaction with one prepared statement, as the raw baseline inserts its
// JSON rows. It is what SQLite alone costs for Trellis's rows (the state next to the JSON, the row
// key, the `seq` index and the partial indexes), without any of Trellis's own work.
import CSQLite
import Foundation
import TrellisStore

/// Copies every row of `documents` in the store file `source` into a new store at `file` (its
/// schema made by opening a ``DocumentStore`` there), timing only the inserts: the rows are read
/// into memory before the clock starts.
///
/// - Returns: the seconds taken and the number of rows inserted.
func schemaFloorSeconds(from source: String, into file: String) throws -> (seconds: Double, rows: Int) {
    let empty = try DocumentStore(path: file)
    empty.close()
    let columns = "k, collection, seq, deleted, state, value, removed_at, delta, delta_seq, age, unacked"
    var rows: [[OpaquePointer?]] = []
    var readDB: OpaquePointer?
    sqlite3_open_v2(source, &readDB, SQLITE_OPEN_READONLY, nil)
    var read: OpaquePointer?
    sqlite3_prepare_v2(readDB, "SELECT \(columns) FROM documents ORDER BY seq", -1, &read, nil)
    while sqlite3_step(read) == SQLITE_ROW {
        rows.append((0..<11).map { sqlite3_value_dup(sqlite3_column_value(read, Int32($0))) })
    }
    sqlite3_finalize(read)
    sqlite3_close(readDB)
    defer { for row in rows { for value in row { sqlite3_value_free(value) } } }

    var db: OpaquePointer?
    sqlite3_open_v2(file, &db, rawOpenFlags, nil)
    defer { sqlite3_close(db) }
    sqlite3_exec(db, rawWriteSettings(), nil, nil, nil)  // the raw baseline's (`rawInsert`)
    var insert: OpaquePointer?
    sqlite3_prepare_v2(
        db, "INSERT INTO documents(\(columns)) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)", -1, &insert, nil)
    defer { sqlite3_finalize(insert) }
    var inserted = 0
    let time = seconds {
        sqlite3_exec(db, "BEGIN", nil, nil, nil)
        for row in rows {
            for (n, value) in row.enumerated() { sqlite3_bind_value(insert, Int32(n + 1), value) }
            if sqlite3_step(insert) == SQLITE_DONE { inserted += 1 }
            sqlite3_reset(insert)
        }
        sqlite3_exec(db, "COMMIT", nil, nil, nil)
    }
    precondition(inserted == rows.count, "schema floor: \(inserted) of \(rows.count) rows inserted")
    return (time, inserted)
}
