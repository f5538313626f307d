import Foundation
import Synchronization
import Trellis

/// The client side of a node's control socket: `trellis attach`, `trellis status`, and
/// `trellis import` into a running node.
final class ControlClient: Sendable {
    let fd: Int32
    let directory: String

    private init(fd: Int32, directory: String) {
        self.fd = fd
        self.directory = directory
    }

    deinit { close(fd) }

    /// Connects to the node running on `directory`.
    ///
    /// - Parameter ifRunning: return `nil` when no node runs there (no socket, or a stale one)
    ///   instead of throwing.
    /// - Throws: ``NoNodeRunning`` (`no node is running on DIR (…)`) unless `ifRunning`;
    ///   ``ControlError`` when the socket cannot be reached for another reason.
    static func connect(_ directory: String, ifRunning: Bool = false) throws -> ControlClient? {
        let path = Control.socketPath(directory)
        var address: sockaddr_un
        do { address = try Control.address(path) } catch {
            // A node there could not have made its socket either.
            if ifRunning { return nil }
            throw error
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw ControlError("cannot create a socket: \(String(cString: strerror(errno)))") }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard connected == 0 else {
            let code = errno
            close(fd)
            let why: String
            switch code {
            case ENOENT, ENOTDIR: why = "no control socket"
            case ECONNREFUSED: why = "its control socket \(path) is stale: the last node did not stop cleanly"
            default: throw ControlError("cannot connect to \(path): \(String(cString: strerror(code)))")
            }
            if ifRunning { return nil }
            throw NoNodeRunning(description: "no node is running on \(directory) (\(why))")
        }
        return ControlClient(fd: fd, directory: directory)
    }

    /// Sends the hello line: `fields` plus the protocol version and the operation.
    func hello(_ operation: String, _ fields: [String: Any] = [:]) throws {
        var object = fields
        object["trellis-control"] = Control.version
        object["operation"] = operation
        let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
        guard Control.sendAll(fd, Array(data) + [0x0A]) else { throw lost() }
    }

    /// The error for a connection the node closed before its exit frame.
    func lost() -> ControlError {
        ControlError("the node on \(directory) closed the control connection (it stopped?)")
    }

    /// Writes the node's frames to standard output and error until its exit frame.
    ///
    /// - Parameters:
    ///   - prompt: takes each prompt frame (the node waits for a line).
    ///   - progress: takes each progress frame's payload.
    ///   - before: runs before anything is written (to clear a progress line).
    ///   - screen: where output, events and errors go (standard output and error by default; the
    ///     line editor's output at a terminal, which shows them above the line being typed).
    /// - Returns: the node's exit status.
    /// - Throws: ``ControlError`` when the connection ends without one or a frame is bad.
    func relay(
        prompt: (String) -> Void = { _ in }, progress: (String) -> Void = { _ in }, before: () -> Void = {},
        screen: ShellOutput = ShellOutput()
    ) throws -> Int32 {
        while let (type, payload) = try Control.receiveFrame(fd) {
            switch type {
            case .output, .event:
                before()
                screen.show(payload, on: .output)
            case .error:
                before()
                screen.show(payload, on: .error)
            case .prompt: prompt(String(decoding: payload, as: UTF8.self))
            case .progress: progress(String(decoding: payload, as: UTF8.self))
            case .exit:
                before()
                guard let status = Int32(String(decoding: payload, as: UTF8.self)) else {
                    throw ControlError("a bad exit frame from the node")
                }
                return status
            case .data: throw ControlError("a data frame from the node")
            }
        }
        throw lost()
    }

    /// `trellis import FILE` through the node: the file is read here (with this user's
    /// permissions, relative to this directory) and streamed to the node, which imports it.
    ///
    /// - Returns: the exit status, as a direct import's.
    func importFile(_ file: String, into collection: String, allOrNothing: Bool) throws -> Int32 {
        // The file is opened (and checked) here, as a direct import does, before the node hears of it.
        let (input, size) = try Files.openForReading(file)
        defer { close(input) }
        let showProgress = isatty(STDERR_FILENO) == 1
        try hello(
            "import", ["collection": collection, "file": file, "allOrNothing": allOrNothing, "progress": showProgress])
        var chunk = [UInt8](repeating: 0, count: Control.maxFramePayload)
        var sent = true
        while sent {
            let n = chunk.withUnsafeMutableBytes { read(input, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n < 0 { throw ControlError("cannot read \(file): \(String(cString: strerror(errno)))") }
            // An empty data frame ends the file. A node that stopped listening has said why.
            sent = Control.sendAll(fd, Control.frame(.data, chunk[..<n]))
            if n == 0 { break }
        }
        let progress = ProgressLine(total: size)
        return try relay(
            progress: { text in
                let parts = text.split(separator: " ")
                guard parts.count == 2, let count = Int(parts[0]), let bytes = Int(parts[1]) else { return }
                progress.show("importing: \(count) documents", done: bytes)
            }, before: { progress.clear() })
    }
}

/// No node runs on the data directory: exit status 1.
struct NoNodeRunning: Error, CustomStringConvertible {
    var description: String
}

/// `trellis attach`: a shell on a running node.
enum AttachCommand {
    static let help = """
        trellis attach --data DIR [--keep-going | --bail] [--no-history]
          Opens a shell on the node running on DIR (`trellis node` or `trellis shell`), through
          its control socket DIR/control.sock. The commands are the shell's (`help` lists them)
          and run in the node: their effects are the node's, subscriptions made here stay after
          you leave, observers end with the attach. `quit` or the end of input leaves; the node
          keeps running. From a pipe, standard input goes to the node unchanged and the exit
          status follows the piped shell's rules (1 once a command failed; --keep-going: 0;
          --bail: end at the first error). Ctrl-C ends the attach, not the node. A file a
          command names (`rules FILE`) is opened by the node, relative to its working directory.
          At a terminal, lines are edited as in `trellis shell` (history shared with it;
          --no-history keeps none); Tab completes commands only. Exit status 1, with
          `no node is running on DIR`, when none is.
        """

    static func run(_ args: [String]) throws {
        let parsed = try Arguments(args, valueFlags: ["data"], switchFlags: ["keep-going", "bail", "no-history"])
        if parsed.switches.contains("help") {
            print(help)
            return
        }
        guard parsed.positional.isEmpty else {
            throw UsageError("unexpected argument '\(parsed.positional[0])'; see `trellis attach --help`")
        }
        if parsed.switches.contains("keep-going"), parsed.switches.contains("bail") {
            throw UsageError("--keep-going and --bail contradict each other: give one")
        }
        let data = try parsed.require("data")
        let client = try ControlClient.connect(data)!
        let interactive = isatty(0) != 0
        // At a terminal, lines are edited as in `trellis shell` (commands complete with Tab; the
        // node's collections and paths do not, they are the node's), and what the node sends
        // while a line is typed is shown above it.
        let screen = ShellOutput()
        var editor: LineEditor?
        if interactive && isatty(1) != 0 {
            let history = LineEditor.historyFile(
                environment: ProcessInfo.processInfo.environment, disabled: parsed.switches.contains("no-history"))
            if let made = try? LineEditor(
                prompt: "trellis> ", historyFile: history, output: screen, complete: Shell.commandCompletion)
            {
                editor = made
            }
        }
        try client.hello(
            "attach",
            [
                "interactive": interactive, "keepGoing": parsed.switches.contains("keep-going"),
                "bail": parsed.switches.contains("bail"), "lineEditing": editor != nil,
            ])
        let prompts = PromptQueue()
        let fd = client.fd
        let lineEditor = editor.map(SendableBox.init)
        Thread.detachNewThread {
            if !interactive {
                forwardBytes(to: fd)
            } else if let lineEditor {
                forwardEditedLines(to: fd, prompts: prompts, editor: lineEditor.value)
            } else {
                forwardLines(to: fd, prompts: prompts)
            }
        }
        exit(try client.relay(prompt: { prompts.put($0) }, screen: screen))
    }

    /// At a terminal with the line editor: after each prompt the node sends, one edited line goes
    /// to the node; Ctrl-D on an empty line ends the attach.
    static func forwardEditedLines(to fd: Int32, prompts: PromptQueue, editor: LineEditor) {
        while true {
            _ = prompts.take()
            guard let line = editor.readLine() else {
                shutdown(fd, Int32(SHUT_WR))
                return
            }
            guard Control.sendAll(fd, Array(line.utf8) + [0x0A]) else { return }
        }
    }

    /// From a pipe: standard input to the node, byte for byte, then the end of input. The node
    /// reads it with the shell's own line reader (its limits, its messages).
    static func forwardBytes(to fd: Int32) {
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(0, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 || !Control.sendAll(fd, Array(chunk[..<n])) { break }
        }
        shutdown(fd, Int32(SHUT_WR))
    }

    /// At a terminal: after each prompt the node sends, one line read with ``readLine(prompt:)``
    /// goes to the node; the end of input (Ctrl-D) ends the attach.
    static func forwardLines(to fd: Int32, prompts: PromptQueue) {
        var input = LineReader(fd: 0)
        while true {
            let prompt = prompts.take()
            var sent = false
            while !sent {
                switch readLine(prompt: prompt, from: &input) {
                case nil:
                    shutdown(fd, Int32(SHUT_WR))
                    return
                case .line(let text):
                    guard Control.sendAll(fd, Array(text.utf8) + [0x0A]) else { return }
                    sent = true
                case .invalid(let number):
                    // As the interactive shell: reported, ignored, the prompt again.
                    FileSink.writeAll(
                        Array("error: line \(number) is not valid UTF-8; ignored\n".utf8), to: STDERR_FILENO)
                case .tooLong(let number):
                    FileSink.writeAll(
                        Array(
                            ("error: line \(number) is longer than \(LineReader.maxLineBytes) bytes, the longest line "
                                + "the shell takes; ignored\n").utf8), to: STDERR_FILENO)
                }
            }
        }
    }

    /// Shows `prompt` and reads one line of standard input (`nil`: the end of input). The one
    /// place a line editor would take over.
    static func readLine(prompt: String, from input: inout LineReader) -> LineReader.Line? {
        FileSink.writeAll(Array(prompt.utf8), to: STDOUT_FILENO)
        return input.next()
    }
}

/// A value handed to the one thread that uses it from then on.
struct SendableBox<Value>: @unchecked Sendable {
    let value: Value
}

/// The prompts the node sent, handed from the thread reading frames to the one reading lines.
final class PromptQueue: Sendable {
    private let prompts = Mutex<[String]>([])
    private let ready = DispatchSemaphore(value: 0)

    func put(_ prompt: String) {
        prompts.withLock { $0.append(prompt) }
        ready.signal()
    }

    /// Waits for the next prompt.
    func take() -> String {
        ready.wait()
        return prompts.withLock { $0.removeFirst() }
    }
}

/// `trellis status`: what a running node knows.
enum StatusCommand {
    static let help = """
        trellis status --data DIR [--json]
          Prints the status of the node running on DIR, as the shell's `status`: identity, log
          and clocks, inbound buffer, connected peers (key prefix, address, direction, subscriptions
          served), subscriptions, sync state per peer and subscription, links closed, documents
          held back; then when each peer connected, or was last seen (peers gone, up to 64).
          --json prints one JSON object instead (docs/PROTOCOL.md §6). Exit status 1, with
          `no node is running on DIR`, when none is.
        """

    static func run(_ args: [String]) throws {
        let parsed = try Arguments(args, valueFlags: ["data"], switchFlags: ["json"])
        if parsed.switches.contains("help") {
            print(help)
            return
        }
        guard parsed.positional.isEmpty else {
            throw UsageError("unexpected argument '\(parsed.positional[0])'; see `trellis status --help`")
        }
        let client = try ControlClient.connect(try parsed.require("data"))!
        try client.hello("status", ["json": parsed.switches.contains("json")])
        exit(try client.relay())
    }
}
