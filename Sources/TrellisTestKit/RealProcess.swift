internal import CSQLite
import Foundation
import Glibc
import TrellisStore

/// Reads an SQLite database file from outside the process that owns it, as an operator would
/// after a crash.
public enum SQLiteFile {
    /// `PRAGMA integrity_check` on `path` (opened as ``query(_:_:_:)`` does): `"ok"` for a sound
    /// file, otherwise SQLite's findings, one per line.
    ///
    /// - Throws: when the file cannot be opened or the pragma fails.
    public static func integrityCheck(_ path: String) throws -> String {
        try query(path, "PRAGMA integrity_check").map { $0.first.flatMap { $0 } ?? "" }.joined(separator: "\n")
    }

    /// Runs one read-only statement on `path` and returns every row, each column as text (`NULL`
    /// as `nil`).
    ///
    /// The file is opened read-only (also while another process writes it, as WAL allows). A WAL
    /// database whose `-shm` file is missing (left by a process killed while it set the file up)
    /// cannot be read that way; it is then opened read-write, which recovers it as the next node
    /// to open it would.
    ///
    /// - Parameter bindings: text values for the statement's `?` parameters, in order.
    /// - Throws: an error naming the file, the statement and SQLite's message.
    public static func query(_ path: String, _ sql: String, _ bindings: [String] = []) throws -> [[String?]] {
        do {
            return try query(path, sql, bindings, flags: SQLITE_OPEN_READONLY)
        } catch let error as SQLiteFailure where [SQLITE_READONLY, SQLITE_CANTOPEN].contains(error.code & 0xFF) {
            return try query(path, sql, bindings, flags: SQLITE_OPEN_READWRITE)
        }
    }

    struct SQLiteFailure: Error, CustomStringConvertible {
        var code: Int32
        var description: String
    }

    static func query(_ path: String, _ sql: String, _ bindings: [String], flags: Int32) throws -> [[String?]] {
        DocumentStore.configureSQLite()  // as a store would, whichever opens SQLite first
        var db: OpaquePointer?
        defer { sqlite3_close_v2(db) }
        let opened = sqlite3_open_v2(path, &db, flags, nil)
        guard opened == SQLITE_OK, let db else {
            throw SQLiteFailure(
                code: opened,
                description: "cannot open \(path): \(db.map { String(cString: sqlite3_errmsg($0)) } ?? "no memory")")
        }
        sqlite3_busy_timeout(db, 10_000)
        func failure(_ code: Int32) -> SQLiteFailure {
            SQLiteFailure(code: code, description: "\(sql) on \(path): \(String(cString: sqlite3_errmsg(db)))")
        }
        var statement: OpaquePointer?
        defer { sqlite3_finalize(statement) }
        let prepared = sqlite3_prepare_v2(db, sql, -1, &statement, nil)
        guard prepared == SQLITE_OK else { throw failure(prepared) }
        for (index, value) in bindings.enumerated() {
            trellis_sqlite3_bind_text_transient(statement, Int32(index + 1), value, -1)
        }
        var rows: [[String?]] = []
        while true {
            let rc = sqlite3_step(statement)
            if rc == SQLITE_DONE { break }
            guard rc == SQLITE_ROW else { throw failure(rc) }
            rows.append(
                (0..<sqlite3_column_count(statement)).map { column in
                    sqlite3_column_text(statement, column).map { String(cString: $0) }
                })
        }
        return rows
    }
}

/// A clock for one `trellis` process, set from outside while it runs: libfaketime (Debian package
/// `faketime`) preloaded, reading its offset from a file on every call (`FAKETIME_NO_CACHE=1`).
///
/// Only the wall clock moves (`CLOCK_REALTIME`: `Date()`, the store's clock and HLC); the
/// monotonic clock that paces timers, keepalives and retries stays true
/// (`FAKETIME_DONT_FAKE_MONOTONIC=1`). Two libfaketime 0.9.10 behaviours need working around:
/// - It shifts the absolute deadline of every `timerfd_settime` by the wall-clock offset, also on
///   `CLOCK_MONOTONIC` timers, so libdispatch's timers (the engine's tick) never fire: a small
///   library preloaded before it, compiled here with the toolchain's C compiler, passes
///   `timerfd_settime` and `timerfd_gettime` straight to the kernel.
/// - Without `FAKETIME_SHARED` it adds that variable to the environment while the process
///   starts, which moves `environ` off the initial stack, and the Swift runtime, which finds
///   `argv` on Linux by walking back from `environ`, then sees no arguments at all. Given the name
///   of a semaphore that does not exist, libfaketime replaces the variable in place instead.
public final class FakeClock: Sendable {
    /// The timestamp file libfaketime reads.
    public let file: String
    /// The `LD_PRELOAD` list: the timerfd pass-through, then libfaketime.
    let preload: String

    /// Where libfaketime is installed, or `nil` when it is not.
    public static let library: String? = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1", "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1", "/usr/local/lib/faketime/libfaketime.so.1",
    ].first { FileManager.default.fileExists(atPath: $0) }

    /// A C compiler on `PATH` (the Swift toolchain's `clang`, or the system's `cc`).
    static let compiler: String? = {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        for name in ["clang", "cc", "gcc"] {
            for directory in path.split(separator: ":")
            where FileManager.default.isExecutableFile(atPath: "\(directory)/\(name)") {
                return "\(directory)/\(name)"
            }
        }
        return nil
    }()

    /// Whether libfaketime and a C compiler are installed (scripts/setup.sh installs libfaketime).
    public static var isAvailable: Bool { library != nil && compiler != nil }

    static let passThrough = """
        #define _GNU_SOURCE
        #include <sys/syscall.h>
        #include <unistd.h>
        struct itimerspec;
        int timerfd_settime(int fd, int flags, const struct itimerspec *value, struct itimerspec *old) {
            return (int)syscall(SYS_timerfd_settime, fd, flags, value, old);
        }
        int timerfd_gettime(int fd, struct itimerspec *value) {
            return (int)syscall(SYS_timerfd_gettime, fd, value);
        }
        """

    /// A clock named `name` in `directory` (its timestamp file, and the pass-through library
    /// built there once), starting `offset` seconds from the true time.
    ///
    /// - Throws: ``ProcessError`` when libfaketime or a C compiler is missing or the build fails.
    public init(in directory: TemporaryDirectory, name: String, offset: Int) throws {
        guard let library = Self.library, let compiler = Self.compiler else {
            throw ProcessError("libfaketime or a C compiler is missing (scripts/setup.sh installs faketime)")
        }
        file = directory.path("\(name).clock")
        let shared = directory.path("timerfd-passthrough.so")
        if !FileManager.default.fileExists(atPath: shared) {
            let source = directory.path("timerfd-passthrough.c")
            try Self.passThrough.write(toFile: source, atomically: true, encoding: .utf8)
            let build = Process()
            build.executableURL = URL(fileURLWithPath: compiler)
            build.arguments = ["-shared", "-fPIC", "-O2", "-o", shared, source]
            try build.run()
            build.waitUntilExit()
            guard build.terminationStatus == 0 else { throw ProcessError("\(compiler) could not build \(source)") }
        }
        preload = "\(shared):\(library)"
        try set(offset: offset)
    }

    /// Moves the clock to `offset` seconds from the true time (negative: behind). Processes
    /// started with ``environment`` see it at their next clock read. The file is replaced
    /// atomically, so a reader never sees half of it.
    public func set(offset: Int) throws {
        let text = offset >= 0 ? "+\(offset)\n" : "\(offset)\n"
        try text.write(toFile: file, atomically: true, encoding: .utf8)
    }

    /// The variables that run a process on this clock (for ``TrellisProcess/init(_:environment:)``).
    public var environment: [String: String] {
        [
            "LD_PRELOAD": preload, "FAKETIME_TIMESTAMP_FILE": file, "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_SHARED": "/trellis_faketime_no_sem /trellis_faketime_no_shm",
        ]
    }
}

extension TrellisProcess {
    /// A loopback port that was free a moment ago (bound to port 0 and released), for nodes that
    /// must listen on the same port across restarts.
    public static func freePort() throws -> UInt16 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw ProcessError("socket: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { raw in
                bind(fd, raw, length) == 0 && getsockname(fd, raw, &length) == 0
            }
        }
        guard bound else { throw ProcessError("bind: \(String(cString: strerror(errno)))") }
        return UInt16(bigEndian: address.sin_port)
    }

    /// The peer key from the node's "listening on HOST:PORT, peer key HEX" log line, once it
    /// appears.
    public func peerKey(timeout: Double = 20) -> [UInt8]? {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if let range = stderr.range(of: "peer key ") {
                let hex = stderr[range.upperBound...].prefix { $0.isHexDigit }
                if hex.count == 64 {
                    var bytes: [UInt8] = []
                    var index = hex.startIndex
                    while index < hex.endIndex {
                        let next = hex.index(index, offsetBy: 2)
                        bytes.append(UInt8(hex[index..<next], radix: 16)!)
                        index = next
                    }
                    return bytes
                }
            }
            usleep(10_000)
        }
        return nil
    }

    /// How many times `text` occurs in standard error so far.
    public func stderrCount(of text: String) -> Int {
        stderr.components(separatedBy: text).count - 1
    }
}
