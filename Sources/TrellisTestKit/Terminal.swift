import Foundation

/// A program running in a pseudo-terminal, for tests of what a user sees and types: it runs in a
/// detached tmux session of a private tmux server (its socket in a temporary directory, no
/// configuration file), keys go in with `send-keys` and the screen comes out with `capture-pane`.
/// The server is killed when the value is dropped.
public final class Terminal: Sendable {
    /// The tmux executable, when one is on `PATH` (`scripts/setup.sh` installs Debian's `tmux`).
    public static let tmux: String? = (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
        .split(separator: ":").map { "\($0)/tmux" }.first { FileManager.default.isExecutableFile(atPath: $0) }

    public static var isAvailable: Bool { tmux != nil }

    private typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>?, Int32) -> Int32
    private static let closeFrom: CloseFrom? = dlsym(
        UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np"
    )
    .map { unsafeBitCast($0, to: CloseFrom.self) }

    private let socket: String
    private let session = "test"

    /// Starts `arguments` (the executable first) in a terminal of `columns` × `rows` cells.
    ///
    /// - Parameters:
    ///   - environment: variables set for the program (beside tmux's own, such as `TERM=screen`).
    ///   - directory: where the tmux server's socket goes.
    /// - Throws: ``ProcessError`` when tmux is missing or cannot start the session.
    public init(
        _ arguments: [String], environment: [String: String] = [:], in directory: TemporaryDirectory,
        columns: Int = 120, rows: Int = 40
    ) throws {
        socket = directory.path("tmux-\(UUID().uuidString.prefix(8)).sock")
        let command = arguments.map(Self.quoted).joined(separator: " ")
        var options = ["new-session", "-d", "-s", session, "-x", "\(columns)", "-y", "\(rows)"]
        for (name, value) in environment.sorted(by: { $0.key < $1.key }) { options += ["-e", "\(name)=\(value)"] }
        // The server this starts keeps the descriptors it was given: no pipes, which would never end.
        let status = try execute(options + [command], capturing: false).status
        guard status == 0 else { throw ProcessError("tmux new-session failed with status \(status)") }
    }

    deinit { _ = try? run(["kill-server"]) }

    /// Types `text` literally (no key names).
    public func type(_ text: String) { _ = try? run(["send-keys", "-t", session, "-l", text]) }

    /// Presses keys by tmux's names: `Enter`, `Tab`, `Left`, `Up`, `C-r` (Ctrl-R), `C-d`.
    public func press(_ keys: String...) { _ = try? run(["send-keys", "-t", session] + keys) }

    /// The screen's lines, trailing spaces and trailing empty lines removed (empty when the
    /// program has ended).
    public func screen() -> [String] {
        guard let text = try? capture(["capture-pane", "-p", "-t", session]) else { return [] }
        var lines = text.split(separator: "\n", omittingEmptySubsequences: false).map {
            String($0.reversed().drop(while: { $0 == " " }).reversed())
        }
        while lines.last?.isEmpty == true { lines.removeLast() }
        return lines
    }

    /// The last line of the screen that is not empty (where a prompt waits).
    public var lastLine: String? { screen().last }

    /// Whether the program still runs (its session exists).
    public var isRunning: Bool { (try? run(["has-session", "-t", session]))?.status == 0 }

    /// Waits up to `timeout` seconds for the screen to satisfy `condition`.
    ///
    /// - Returns: whether it did (tests `#expect` on it; no timing goal is asserted).
    public func waitForScreen(timeout: Double = 20, _ condition: ([String]) -> Bool) -> Bool {
        eventually(timeout: timeout) { condition(screen()) }
    }

    /// `text` quoted for the POSIX shell tmux runs the command with.
    static func quoted(_ text: String) -> String { "'" + text.replacing("'", with: #"'\''"#) + "'" }

    @discardableResult
    private func run(_ arguments: [String]) throws -> (status: Int32, errors: String) {
        let result = try execute(arguments)
        return (result.status, result.errors)
    }

    private func capture(_ arguments: [String]) throws -> String? {
        let result = try execute(arguments)
        return result.status == 0 ? result.output : nil
    }

    /// Runs `tmux ARGS…` on this terminal's server and waits for it; with `capturing`, collects
    /// its output (standard error into standard output). Not `Process`: the first command forks
    /// the tmux server, and Foundation's `Process` was seen never to notice that command's exit.
    private func execute(_ arguments: [String], capturing: Bool = true) throws -> (
        status: Int32, output: String, errors: String
    ) {
        guard let tmux = Self.tmux else { throw ProcessError("tmux is not installed (scripts/setup.sh installs it)") }
        var fds: [Int32] = [-1, -1]
        if capturing {
            guard pipe(&fds) == 0 else { throw ProcessError("pipe: \(String(cString: strerror(errno)))") }
        }
        defer { if capturing { close(fds[0]) } }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        if capturing {
            posix_spawn_file_actions_adddup2(&actions, fds[1], 1)
            posix_spawn_file_actions_adddup2(&actions, fds[1], 2)
            posix_spawn_file_actions_addclose(&actions, fds[0])
            posix_spawn_file_actions_addclose(&actions, fds[1])
        } else {
            // The server it may start keeps these: a pipe here would never reach its end.
            posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
            posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        }
        // Nothing else of this process's (other tests' pipes) goes to the server tmux may start.
        // (glibc 2.34's posix_spawn_file_actions_addclosefrom_np, which Swift's Glibc does not import.)
        if let closeFrom = Self.closeFrom { _ = closeFrom(&actions, 3) }
        let argv = [tmux, "-S", socket, "-f", "/dev/null"] + arguments
        var cArguments = argv.map { strdup($0) } + [nil]
        defer { for pointer in cArguments { free(pointer) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, tmux, &actions, nil, &cArguments, environ)
        if capturing { close(fds[1]) }
        guard spawned == 0 else { throw ProcessError("cannot run tmux: \(String(cString: strerror(spawned)))") }
        var output: [UInt8] = []
        if capturing {
            var chunk = [UInt8](repeating: 0, count: 65_536)
            while true {
                let n = read(fds[0], &chunk, chunk.count)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                output += chunk[..<n]
            }
        }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        let exitStatus = (status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
        let text = String(decoding: output, as: UTF8.self)
        return (exitStatus, text, exitStatus == 0 ? "" : text)
    }
}
