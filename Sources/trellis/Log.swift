import Foundation
import Synchronization

/// How much a node logs: each level includes the ones before it.
enum LogLevel: Int, Comparable, Sendable {
    case error, warn, info, debug

    /// `error`, `warn`, `info` or `debug` (`--log-level`).
    init(flag text: String) throws {
        switch text {
        case "error": self = .error
        case "warn", "warning": self = .warn
        case "info": self = .info
        case "debug": self = .debug
        default: throw UsageError("--log-level takes error, warn, info or debug, not '\(text)'")
        }
    }

    var word: String {
        switch self {
        case .error: "error"
        case .warn: "warn"
        case .info: "info"
        case .debug: "debug"
        }
    }

    static func < (a: LogLevel, b: LogLevel) -> Bool { a.rawValue < b.rawValue }

    /// The level of a message from the library, which logs plain text: one saying that something
    /// failed or cannot be done is a warning, the others (sessions, discovery, pins) are news.
    static func of(libraryMessage message: String) -> LogLevel {
        message.contains(" failed") || message.contains("cannot ") || message.contains("refused") ? .warn : .info
    }
}

/// A node's log: one line per message, `TIME LEVEL [NAME] MESSAGE`, the time in ISO 8601 UTC
/// with milliseconds (`2026-12-02T07:04:38.123Z`), written whole with one `write` to standard
/// error or, with `--log-file`, appended to that file.
final class Log: Sendable {
    let level: LogLevel
    private let name: String
    private let fd: Int32
    /// Where lines for standard error go instead, while the shell edits a line at a terminal.
    private let diverted = Mutex<(@Sendable ([UInt8]) -> Void)?>(nil)

    /// - Parameters:
    ///   - file: the file to append to (created with mode 0644); `nil`: standard error.
    /// - Throws: ``UsageError`` naming the file when it cannot be opened.
    init(level: LogLevel, name: String, file: String?) throws {
        self.level = level
        self.name = name
        if let file {
            let fd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
            guard fd >= 0 else {
                throw UsageError("--log-file: cannot open \(file): \(String(cString: strerror(errno)))")
            }
            self.fd = fd
        } else {
            fd = STDERR_FILENO
        }
    }

    deinit { if fd != STDERR_FILENO { close(fd) } }

    /// Hands lines bound for standard error to `sink` instead (`nil`: write them again): the
    /// shell's line editor shows them above the line being typed. A `--log-file` is not affected.
    func divert(to sink: (@Sendable ([UInt8]) -> Void)?) {
        diverted.withLock { $0 = sink }
    }

    /// Writes `message` when `level` is at or below the log's level.
    func callAsFunction(_ level: LogLevel, _ message: String) {
        guard level <= self.level else { return }
        let text = message.split(whereSeparator: \.isNewline).joined(separator: " ")
        let line = Array("\(Self.timestamp()) \(level.word) [\(name)] \(text)\n".utf8)
        if fd == STDERR_FILENO, let sink = diverted.withLock({ $0 }) {
            sink(line)
            return
        }
        FileSink.writeAll(line, to: fd)
    }

    /// Now as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
    static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var parts = tm()
        var seconds = now.tv_sec
        gmtime_r(&seconds, &parts)
        return String(
            format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1,
            Int(parts.tm_mday), Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec), now.tv_nsec / 1_000_000)
    }
}
