public import Foundation
import Glibc
import Synchronization

/// A running `trellis` process for multi-process tests: its output is collected, and it is
/// terminated when dropped (continued first if stopped, killed if it does not exit within 10 s).
public final class TrellisProcess: Sendable {
    public let process: Process
    private let output = TextBuffer()
    private let errors = TextBuffer()
    private let input: Pipe

    /// Starts `trellis ARGS…` (the binary from ``Repository/trellisBinary``), or another built
    /// program of the package (``Repository/example(_:)``).
    ///
    /// A `node` or `shell` never runs LAN discovery beyond loopback from a test: unless the
    /// arguments say `--discovery-loopback` or `--no-discovery`, `--no-discovery` is added
    /// (``confined(_:)``).
    ///
    /// - Parameters:
    ///   - environment: variables added to (or replacing) this process's environment, such as
    ///     ``FakeClock/environment``.
    ///   - directory: the working directory (default: this process's).
    ///   - binary: the executable; `trellis` by default.
    public init(
        _ arguments: [String], environment: [String: String] = [:], directory: String? = nil,
        binary: URL = Repository.trellisBinary
    ) throws {
        let arguments = binary == Repository.trellisBinary ? Self.confined(arguments) : arguments
        guard FileManager.default.isExecutableFile(atPath: binary.path) else {
            throw ProcessError(
                "no \(binary.lastPathComponent) binary at \(binary.path); run `swift build` (scripts/test.sh does)")
        }
        // A child that exits before reading what a test writes to it must fail that test, not
        // end the whole test process with SIGPIPE: the write then fails with EPIPE instead.
        _ = Glibc.signal(SIGPIPE, SIG_IGN)
        process = Process()
        process.executableURL = binary
        process.arguments = arguments
        if let directory { process.currentDirectoryURL = URL(fileURLWithPath: directory) }
        if !environment.isEmpty {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
        }
        let out = Pipe()
        let err = Pipe()
        input = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = input
        try process.run()
        // Each pipe is drained by a blocking read loop on its own thread, which ends at the end of
        // the stream (the child's write ends are closed in this process by `run()`). Not
        // `readabilityHandler`: tearing down its dispatch read source races the descriptor's close
        // and can crash libdispatch's event loop on Linux (swift-corelibs-libdispatch #949).
        Self.drain(out.fileHandleForReading, into: output)
        Self.drain(err.fileHandleForReading, into: errors)
    }

    private static func drain(_ handle: FileHandle, into buffer: TextBuffer) {
        let thread = Thread {
            let descriptor = handle.fileDescriptor
            var chunk = [UInt8](repeating: 0, count: 65_536)
            while true {
                let count = chunk.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
                if count > 0 {
                    buffer.append(Data(chunk[..<count]))
                } else if count < 0 && errno == EINTR {
                    continue
                } else {
                    break
                }
            }
            try? handle.close()
            buffer.end()
        }
        thread.start()
    }

    /// Everything written to standard output so far.
    public var stdout: String { output.text }
    /// Everything written to standard error so far.
    public var stderr: String { errors.text }

    /// Writes a line to standard input (dropped when the process no longer reads it: the test's
    /// expectations on its output then say what went wrong).
    public func send(_ line: String) {
        try? input.fileHandleForWriting.write(contentsOf: Data((line + "\n").utf8))
    }

    /// Writes raw bytes to standard input (dropped when the process no longer reads it).
    public func sendBytes(_ bytes: [UInt8]) {
        try? input.fileHandleForWriting.write(contentsOf: Data(bytes))
    }

    /// Closes standard input (a shell then quits).
    public func closeInput() {
        try? input.fileHandleForWriting.close()
    }

    /// Whether the process is still running (a stopped process is running).
    public var isRunning: Bool { process.isRunning }

    /// Sends a signal (SIGSTOP, SIGCONT, …) without waiting.
    public func signal(_ signal: Int32) {
        if process.isRunning { Glibc.kill(process.processIdentifier, signal) }
    }

    /// Sends SIGTERM (then SIGCONT, so a stopped process handles it) and waits for the exit status.
    @discardableResult
    public func terminate() -> Int32 {
        if process.isRunning {
            process.terminate()
            signal(SIGCONT)
        }
        process.waitUntilExit()
        waitForOutput()
        return process.terminationStatus
    }

    /// Kills the process with SIGKILL (it gets no chance to clean up) and waits until it is gone.
    public func kill() {
        signal(SIGKILL)
        process.waitUntilExit()
        waitForOutput()
    }

    /// Waits for the process to exit by itself (up to `timeout` seconds, then SIGKILL).
    @discardableResult
    public func wait(timeout: Double = 30) -> Int32 {
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning { Glibc.kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        waitForOutput()
        return process.terminationStatus
    }

    /// Waits until both output pipes have reached their end (the process and any child holding
    /// them have exited), up to `timeout` seconds.
    public func waitForOutput(timeout: Double = 5) {
        let deadline = Date().addingTimeInterval(timeout)
        while !(output.ended && errors.ended) && Date() < deadline { usleep(2_000) }
    }

    /// The port from the node's "listening on HOST:PORT" log line, once it appears.
    public func listeningPort(timeout: Double = 20) -> UInt16? {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            let text = stderr
            if let range = text.range(of: "listening on ") {
                let rest = text[range.upperBound...]
                if let colon = rest.firstIndex(of: ","), let lastColon = rest[..<colon].lastIndex(of: ":") {
                    return UInt16(rest[rest.index(after: lastColon)..<colon])
                }
            }
            usleep(10_000)
        }
        return nil
    }

    /// `arguments` with `--no-discovery` added after a `node` or `shell` command that has neither
    /// `--discovery-loopback` nor `--no-discovery`: tests send traffic only to loopback.
    public static func confined(_ arguments: [String]) -> [String] {
        guard let command = arguments.first, command == "node" || command == "shell",
            !arguments.contains("--discovery-loopback"), !arguments.contains("--no-discovery")
        else { return arguments }
        return [command, "--no-discovery"] + arguments.dropFirst()
    }

    /// Runs `trellis ARGS…` (or `binary ARGS…`) to completion, killing it after `timeout` seconds.
    ///
    /// - Returns: exit status, standard output and standard error.
    public static func run(
        _ arguments: [String], input: String? = nil, timeout: Double = 60, directory: String? = nil,
        binary: URL = Repository.trellisBinary
    ) throws -> (status: Int32, stdout: String, stderr: String) {
        let p = try TrellisProcess(arguments, directory: directory, binary: binary)
        if let input { p.send(input) }
        p.closeInput()
        let status = p.wait(timeout: timeout)
        return (status, p.stdout, p.stderr)
    }

    deinit {
        if process.isRunning {
            Glibc.kill(process.processIdentifier, SIGCONT)  // a stopped process cannot handle SIGTERM
            process.terminate()
            wait(timeout: 10)
        }
        closeInput()
    }
}

/// A test-harness failure (not a product error).
public struct ProcessError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Text collected from a pipe on another thread; decoded as UTF-8 when read, so that a character
/// split between two reads is kept whole.
final class TextBuffer: Sendable {
    private let storage = Mutex<(bytes: [UInt8], ended: Bool)>(([], false))
    func append(_ data: Data) { storage.withLock { $0.bytes += data } }
    func end() { storage.withLock { $0.ended = true } }
    var text: String { storage.withLock { String(decoding: $0.bytes, as: UTF8.self) } }
    var ended: Bool { storage.withLock { $0.ended } }
}
