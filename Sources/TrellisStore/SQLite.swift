internal import CSQLite
import Glibc
import TrellisCore

/// An SQLite error: the result code, SQLite's message and what Trellis was doing.
public struct SQLiteError: Error, Sendable, CustomStringConvertible {
    public var code: Int32
    public var message: String
    public var context: String

    public var description: String {
        let what = context.split(whereSeparator: \.isNewline).joined(separator: " ")
        return "SQLite error \(code) (\(message)) while \(what.prefix(80))"
    }
}

extension DocumentStore {
    /// SQLite's process-wide settings, made once, before SQLite's first use in the process:
    /// its memory statistics off (`SQLITE_CONFIG_MEMSTATUS`, https://sqlite.org/c3ref/c_config_covering_index_scan.html).
    /// With them on, SQLite's default, every allocation and free of every connection takes one
    /// process-wide mutex, so a store's writer, its readers and the WAL checkpointer (and the
    /// stores of every node in the process) contend on it. Trellis reads no SQLite memory
    /// statistics and sets no heap limit, which are all the setting serves.
    ///
    /// Every store calls it before opening a connection. A program that uses SQLite itself
    /// before opening a store calls it first to run with the same setting; once SQLite has
    /// started, the setting can no longer change and the call does nothing.
    ///
    /// - Complexity: O(1); the first call only does anything.
    public static func configureSQLite() { _ = sqliteConfigured }

    private static let sqliteConfigured: Int32 = trellis_sqlite3_config_memstatus(0)
}

/// One SQLite connection. Not `Sendable`: it is owned by one serial owner (``DocumentStore``).
final class Connection {
    let handle: OpaquePointer
    /// Prepared statements by SQL text, compared byte-wise: SQL that inlines a collection name or
    /// a JSON path differs from another only in Unicode form ("é" against "e" + U+0301) is
    /// another statement.
    private var cache: [UTF8Key: Statement] = [:]

    /// Opens `path`.
    ///
    /// - Parameters:
    ///   - readOnly: open for reading only.
    ///   - immutable: with `readOnly`, read the file as one that cannot change (SQLite's
    ///     `immutable=1`): no lock, no write-ahead log index, so nothing is created beside it.
    ///     Only right when no write-ahead log holds commits and nothing writes meanwhile.
    init(path: String, readOnly: Bool = false, immutable: Bool = false) throws(SQLiteError) {
        DocumentStore.configureSQLite()
        var db: OpaquePointer?
        var flags = (readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) | SQLITE_OPEN_NOMUTEX
        var name = path
        if immutable {
            // A URI: `%`, `?` and `#` in the path are escaped, so it still names the same file.
            var escaped = ""
            for scalar in path.unicodeScalars {
                switch scalar {
                case "%": escaped += "%25"
                case "?": escaped += "%3f"
                case "#": escaped += "%23"
                default: escaped.unicodeScalars.append(scalar)
                }
            }
            name = "file:\(escaped)?immutable=1"
            flags |= SQLITE_OPEN_URI
        }
        let rc = sqlite3_open_v2(name, &db, flags, nil)
        guard rc == SQLITE_OK, let db else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            sqlite3_close(db)
            throw SQLiteError(code: rc, message: message, context: "opening \(path)")
        }
        // The row key's functions (`trellis_key`, `trellis_key_end`), which every statement on
        // `documents` uses; a connection without them could not read or write a row.
        let registered = trellis_register_key_functions(db)
        guard registered == SQLITE_OK else {
            let message = String(cString: sqlite3_errmsg(db))
            sqlite3_close(db)
            throw SQLiteError(code: registered, message: message, context: "registering the row key functions")
        }
        handle = db
        sqlite3_busy_timeout(db, 5_000)
    }

    deinit {
        recent.removeAll()
        cache.removeAll()
        sqlite3_close_v2(handle)
    }

    func error(_ rc: Int32, _ context: String) -> SQLiteError {
        SQLiteError(code: rc, message: String(cString: sqlite3_errmsg(handle)), context: context)
    }

    /// Runs one or more statements without results.
    func execute(_ sql: String) throws(SQLiteError) {
        var errmsg: UnsafeMutablePointer<CChar>?
        let rc = sqlite3_exec(handle, sql, nil, nil, &errmsg)
        if rc != SQLITE_OK {
            let message = errmsg.map { String(cString: $0) } ?? "unknown"
            sqlite3_free(errmsg)
            throw SQLiteError(code: rc, message: message, context: "executing \(sql)")
        }
    }

    /// A cached prepared statement, reset and with bindings cleared.
    func prepare(_ sql: String) throws(SQLiteError) -> Statement {
        // SQL from a constant has the same bytes at the same address every time: found by its
        // address, confirmed by its bytes (an address a freed string had may hold other text).
        let found =
            sql.utf8.withContiguousStorageIfAvailable { text -> (address: UnsafeRawPointer, statement: Statement?)? in
                guard let base = text.baseAddress, !text.isEmpty else { return nil }
                let address = UnsafeRawPointer(base)
                guard let known = recent[address], known.sql.count == text.count,
                    known.sql.withUnsafeBufferPointer({ memcmp($0.baseAddress!, base, text.count) == 0 })
                else { return (address, nil) }
                return (address, known.statement)
            } ?? nil
        if let statement = found?.statement {
            statement.reset()
            return statement
        }
        let key = UTF8Key(sql)
        let statement: Statement
        if let cached = cache[key] {
            cached.reset()
            statement = cached
        } else {
            var stmt: OpaquePointer?
            let rc = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &stmt, nil)
            guard rc == SQLITE_OK, let stmt else { throw error(rc, "preparing \(sql.prefix(60))") }
            statement = Statement(stmt, connection: self)
            cache[key] = statement
        }
        if let address = found?.address {
            if recent.count >= Self.recentLimit { recent.removeAll(keepingCapacity: true) }
            recent[address] = (Array(sql.utf8), statement)
        }
        return statement
    }

    /// Statements by the address of their SQL text's bytes, with those bytes.
    private var recent: [UnsafeRawPointer: (sql: [UInt8], statement: Statement)] = [:]
    private static let recentLimit = 256

    /// Runs `body` inside `BEGIN IMMEDIATE … COMMIT`, rolling back when it throws.
    func transaction<R>(readOnly: Bool = false, _ body: () throws -> R) throws -> R {
        try execute(readOnly ? "BEGIN" : "BEGIN IMMEDIATE")
        do {
            let result = try body()
            try execute("COMMIT")
            return result
        } catch {
            try? execute("ROLLBACK")
            throw error
        }
    }

    var changes: Int { Int(sqlite3_changes(handle)) }
}

/// A prepared statement owned by one ``Connection``; finalized in `deinit`.
final class Statement {
    let stmt: OpaquePointer
    unowned let connection: Connection

    init(_ stmt: OpaquePointer, connection: Connection) {
        self.stmt = stmt
        self.connection = connection
    }

    deinit { sqlite3_finalize(stmt) }

    func reset() {
        sqlite3_reset(stmt)
        sqlite3_clear_bindings(stmt)
    }

    func bind(_ index: Int32, _ value: Int64) { sqlite3_bind_int64(stmt, index, value) }

    func bind(_ index: Int32, _ value: String) {
        var value = value
        value.withUTF8 { buffer in
            buffer.withMemoryRebound(to: CChar.self) {
                trellis_sqlite3_bind_text_transient(stmt, index, $0.baseAddress, Int32($0.count))
            }
        }
    }

    /// Binds a scalar query value (`.int`, `.double`, `.string`; booleans as 0/1, anything else NULL).
    func bind(_ index: Int32, value: Value) {
        switch value {
        case .int(let i): sqlite3_bind_int64(stmt, index, i)
        case .double(let d): sqlite3_bind_double(stmt, index, d)
        case .string(let s): bind(index, s)
        case .bool(let b): sqlite3_bind_int64(stmt, index, b ? 1 : 0)
        default: sqlite3_bind_null(stmt, index)
        }
    }

    func bind(_ index: Int32, _ value: String?) {
        if let value { bind(index, value) } else { sqlite3_bind_null(stmt, index) }
    }

    func bind(_ index: Int32, _ bytes: [UInt8]?) {
        guard let bytes else {
            sqlite3_bind_null(stmt, index)
            return
        }
        bytes.withUnsafeBytes { trellis_sqlite3_bind_blob_transient(stmt, index, $0.baseAddress, Int32($0.count)) }
    }

    /// Steps once. - Returns: `true` when a row is available.
    func step() throws(SQLiteError) -> Bool {
        let rc = sqlite3_step(stmt)
        switch rc {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        default: throw connection.error(rc, "running \(String(cString: sqlite3_sql(stmt)).prefix(60))")
        }
    }

    /// Steps to completion, ignoring rows.
    func run() throws(SQLiteError) {
        while try step() {}
    }

    func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(stmt, column) }

    func isNull(_ column: Int32) -> Bool { sqlite3_column_type(stmt, column) == SQLITE_NULL }

    /// The integer of a column, `nil` for `NULL`.
    func optionalInt64(_ column: Int32) -> Int64? { isNull(column) ? nil : int64(column) }

    func string(_ column: Int32) -> String? {
        guard let p = sqlite3_column_text(stmt, column) else { return nil }
        let n = Int(sqlite3_column_bytes(stmt, column))
        return String(decoding: UnsafeBufferPointer(start: p, count: n), as: UTF8.self)
    }

    /// The text of a column after its first `prefix` bytes (a row key `k` read as its `_id`
    /// key: ``DocumentStore/keyPrefixLength(_:)``); `nil` for `NULL`.
    func string(_ column: Int32, dropping prefix: Int) -> String? {
        guard let p = sqlite3_column_text(stmt, column) else { return nil }
        let n = Int(sqlite3_column_bytes(stmt, column))
        let start = min(prefix, n)
        return String(decoding: UnsafeBufferPointer(start: p + start, count: n - start), as: UTF8.self)
    }

    /// The text of a column as SQLite holds it (not checked or repaired as UTF-8), `nil` for
    /// `NULL`; the bytes are valid until the statement steps, resets or reads the column again.
    func textBytes(_ column: Int32) -> UnsafeBufferPointer<UInt8>? {
        guard let p = sqlite3_column_text(stmt, column) else { return nil }
        return UnsafeBufferPointer(start: p, count: Int(sqlite3_column_bytes(stmt, column)))
    }

    /// The text of a column after its first `prefix` bytes, as SQLite holds it (a row key `k`
    /// read as its `_id` key: ``DocumentStore/keyPrefixLength(_:)``); empty for `NULL`. Valid as
    /// ``textBytes(_:)``'s bytes are.
    func textBytes(_ column: Int32, dropping prefix: Int) -> UnsafeBufferPointer<UInt8> {
        guard let p = sqlite3_column_text(stmt, column) else { return UnsafeBufferPointer(start: nil, count: 0) }
        let n = Int(sqlite3_column_bytes(stmt, column))
        let start = min(prefix, n)
        return UnsafeBufferPointer(start: p + start, count: n - start)
    }

    func bytes(_ column: Int32) -> [UInt8]? {
        guard sqlite3_column_type(stmt, column) != SQLITE_NULL else { return nil }
        let n = Int(sqlite3_column_bytes(stmt, column))
        guard n > 0, let p = sqlite3_column_blob(stmt, column) else { return [] }
        return [UInt8](UnsafeRawBufferPointer(start: p, count: n))
    }
}
