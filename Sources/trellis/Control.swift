import Foundation
import Synchronization
import Trellis

/// The control socket of a running node (docs/PROTOCOL.md, "Control socket"): `DIR/control.sock`,
/// a Unix-domain stream socket, mode 0600, serving only the node's own user.
///
/// A client sends one hello line (a JSON object naming the protocol version and the operation),
/// then what the operation takes: command lines (`attach`), framed file bytes (`import`), nothing
/// (`status`). The node answers with frames: one type byte, a 4-byte big-endian length, that many
/// bytes. The last frame is `exit` with the status the client exits with.
enum Control {
    /// The control protocol's version; a hello naming another is refused with a clear error.
    static let version = 1
    /// The socket's name in the data directory.
    static let socketName = "control.sock"
    /// The longest hello line, in bytes without the newline.
    static let maxHelloBytes = 4_096
    /// The longest frame payload: longer pieces are split.
    static let maxFramePayload = 1 << 20
    /// How long the node waits for a hello, and at most for a client to take output before it
    /// drops the connection, in seconds.
    static let helloTimeout = 10
    static let sendTimeout = 30

    /// The frame types (one ASCII letter each).
    enum Frame: UInt8 {
        /// Node → client: command output, for standard output.
        case output = 0x6F  // o
        /// Node → client: error text, for standard error.
        case error = 0x65  // e
        /// Node → client: a live query event, for standard output.
        case event = 0x76  // v
        /// Node → client: the prompt; the node waits for a line.
        case prompt = 0x70  // p
        /// Node → client: import progress, `COUNT BYTES` in ASCII.
        case progress = 0x67  // g
        /// Node → client: the exit status in ASCII; the last frame.
        case exit = 0x78  // x
        /// Client → node: file bytes of an import; an empty one ends the file.
        case data = 0x64  // d
    }

    static func socketPath(_ directory: String) -> String {
        (directory as NSString).appendingPathComponent(socketName)
    }

    /// The Unix socket address of `path`.
    ///
    /// - Throws: ``ControlError`` when the path does not fit `sun_path` (107 bytes).
    static func address(_ path: String) throws -> sockaddr_un {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard bytes.count < capacity else {
            throw ControlError(
                "the control socket path \(path) is \(bytes.count) bytes, longer than a Unix socket takes "
                    + "(\(capacity - 1)); use a shorter data directory path")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        return address
    }

    /// The frame `type` with `payload` (at most ``maxFramePayload`` bytes).
    static func frame(_ type: Frame, _ payload: some Collection<UInt8>) -> [UInt8] {
        let n = UInt32(payload.count)
        return [type.rawValue, UInt8(n >> 24), UInt8(n >> 16 & 0xFF), UInt8(n >> 8 & 0xFF), UInt8(n & 0xFF)]
            + payload
    }

    /// Sends `bytes` in full. - Returns: `false` when the peer is gone or took nothing for
    /// ``sendTimeout`` seconds.
    static func sendAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let n = send(fd, buffer.baseAddress! + offset, buffer.count - offset, Int32(MSG_NOSIGNAL))
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return false }
                offset += n
            }
            return true
        }
    }

    /// Reads exactly `count` bytes. - Returns: `nil` at the end of the stream, on an error or
    /// a receive timeout.
    static func receive(_ fd: Int32, _ count: Int) -> [UInt8]? {
        var bytes = [UInt8](repeating: 0, count: count)
        var offset = 0
        while offset < count {
            let n = bytes.withUnsafeMutableBytes { recv(fd, $0.baseAddress! + offset, count - offset, 0) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return nil }
            offset += n
        }
        return bytes
    }

    /// Reads one frame. - Returns: `nil` at the end of the stream or on an error.
    /// - Throws: ``ControlError`` for an unknown type or a payload above ``maxFramePayload``.
    static func receiveFrame(_ fd: Int32) throws -> (Frame, [UInt8])? {
        guard let header = receive(fd, 5) else { return nil }
        guard let type = Frame(rawValue: header[0]) else {
            throw ControlError("unknown control frame type \(header[0])")
        }
        let length = header[1...].reduce(0) { $0 << 8 | Int($1) }
        guard length <= maxFramePayload else {
            throw ControlError("a control frame of \(length) bytes, above the \(maxFramePayload) allowed")
        }
        guard let payload = receive(fd, length) else { return nil }
        return (type, payload)
    }

    /// Sets the receive (`SO_RCVTIMEO`) or send (`SO_SNDTIMEO`) timeout; 0 waits forever.
    static func setTimeout(_ fd: Int32, _ option: Int32, seconds: Int) {
        var time = timeval(tv_sec: seconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, option, &time, socklen_t(MemoryLayout<timeval>.size))
    }

    /// The user ID of the process at the other end (`SO_PEERCRED`), `nil` when it cannot be read.
    static func peerUID(_ fd: Int32) -> uid_t? {
        // struct ucred { pid_t pid; uid_t uid; gid_t gid; }: three 32-bit words on Linux.
        var words: [UInt32] = [0, 0, 0]
        var length = socklen_t(12)
        guard getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &words, &length) == 0, length == 12 else { return nil }
        return words[1]
    }

    /// The line `main` prints for a failed command (and the node sends a client for a failed
    /// operation): `trellis: error: TEXT` on one line.
    static func errorLine(_ error: any Error) -> String {
        let text = "\(error)".split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }
            .joined(separator: " ")
        return "trellis: error: \(text)\n"
    }
}

/// A control-socket failure, described for the user.
struct ControlError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// One client connection, on the node's side: the sink of its shell's output, and the writer of
/// its frames. A client that takes nothing for ``Control/sendTimeout`` seconds is dropped: what
/// is written after is discarded, and its shell sees the end of its input.
final class ControlConnection: ShellSink {
    let fd: Int32
    private let gone = Mutex(false)

    init(fd: Int32) { self.fd = fd }

    func write(_ bytes: [UInt8], to stream: ShellStream) {
        let type: Control.Frame =
            switch stream {
            case .output: .output
            case .error: .error
            case .event: .event
            case .prompt: .prompt
            }
        send(type, bytes)
    }

    /// Sends `payload` as frames of `type` (split at ``Control/maxFramePayload`` bytes).
    func send(_ type: Control.Frame, _ payload: [UInt8]) {
        gone.withLock { gone in
            guard !gone else { return }
            var start = 0
            repeat {
                let end = min(payload.count, start + Control.maxFramePayload)
                if !Control.sendAll(fd, Control.frame(type, payload[start..<end])) {
                    gone = true
                    // The shell reading this connection sees the end of its input.
                    shutdown(fd, Int32(SHUT_RDWR))
                    return
                }
                start = end
            } while start < payload.count
        }
    }

    func send(_ type: Control.Frame, _ text: String) { send(type, Array(text.utf8)) }

    /// Sends the exit status, then closes: the sending side first, then (after the client has
    /// read everything and closed, or after a few seconds) the connection. Reading until the
    /// client closes keeps unread client bytes from turning the close into a reset that could
    /// lose the last frames.
    func finish(status: Int32) {
        send(.exit, "\(status)")
        gone.withLock { $0 = true }  // events still queued for it are dropped
        shutdown(fd, Int32(SHUT_WR))
        Control.setTimeout(fd, SO_RCVTIMEO, seconds: 2)
        let deadline = ContinuousClock.now + .seconds(5)
        var scratch = [UInt8](repeating: 0, count: 65_536)
        while ContinuousClock.now < deadline {
            let n = scratch.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
        }
    }
}

/// The node's side of the control socket: accepts clients of the same user and serves each on a
/// thread of its own, so a client that sends nothing, or garbage, holds up no one.
final class ControlServer: Sendable {
    /// The most clients served at once; more are told so and closed.
    static let maxClients = 64

    let directory: String
    let path: String
    private let node: TrellisNode
    private let subscriptions: SubscriptionBook
    private let times: PeerTimes
    private let listener: Int32
    /// The most of them that may be attach or import sessions (which may last long): the rest
    /// stay for `status` and for clients still sending their hello (cut after
    /// ``Control/helloTimeout`` seconds).
    static let maxSessions = 56

    private struct State {
        var clients: Set<Int32> = []
        var sessions = 0
        var stopped = false
    }
    private let state = Mutex(State())

    /// Creates `DIR/control.sock` and starts accepting. A socket left there by a node that did
    /// not stop cleanly is replaced: the caller holds the data directory's lock, so no live node
    /// owns it. Files left by an import through a killed node (`.import-*.spool`) are removed.
    ///
    /// - Throws: ``ControlError`` when the socket cannot be created (path too long, a file that
    ///   is not a socket in the way, a system error).
    init(directory: String, node: TrellisNode, subscriptions: SubscriptionBook) throws {
        self.directory = directory
        self.path = Control.socketPath(directory)
        self.node = node
        self.subscriptions = subscriptions
        var address = try Control.address(path)
        var info = stat()
        if lstat(path, &info) == 0 {
            guard info.st_mode & S_IFMT == S_IFSOCK else {
                throw ControlError(
                    "\(path) exists and is not a socket; move it away (the node creates its control socket there)")
            }
            unlink(path)
        }
        for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        where name.hasPrefix(".import-") && name.hasSuffix(".spool") {
            unlink((directory as NSString).appendingPathComponent(name))
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else {
            throw ControlError("cannot create the control socket: \(String(cString: strerror(errno)))")
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        // Mode 0600 before `listen`: until then no one can connect, whatever the umask made it.
        guard bound == 0, chmod(path, 0o600) == 0, Glibc.listen(fd, 16) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            unlink(path)
            throw ControlError("cannot create the control socket \(path): \(reason)")
        }
        listener = fd
        times = PeerTimes(node: node)
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    /// Stops accepting, removes the socket file and closes every client connection (their
    /// clients see the node stop).
    func stop() {
        times.stop()
        unlink(path)
        shutdown(listener, Int32(SHUT_RDWR))
        state.withLock { s in
            s.stopped = true
            for fd in s.clients { shutdown(fd, Int32(SHUT_RDWR)) }
        }
    }

    private func acceptLoop() {
        while true {
            let fd = accept(listener, nil, nil)
            if fd < 0 {
                if errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE {
                    if errno == EMFILE || errno == ENFILE { usleep(100_000) }
                    continue
                }
                close(listener)  // stopped
                return
            }
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            Control.setTimeout(fd, SO_SNDTIMEO, seconds: Control.sendTimeout)
            let admitted = state.withLock { s in
                guard !s.stopped, s.clients.count < Self.maxClients else { return false }
                s.clients.insert(fd)
                return true
            }
            guard admitted else {
                // The client's hello is likely unread: drain it before closing (a close with
                // unread bytes resets the connection and the client would miss the reason).
                let connection = ControlConnection(fd: fd)
                connection.send(
                    .error,
                    "trellis: error: the node serves \(Self.maxClients) control clients at once; try again later\n")
                connection.send(.exit, "1")
                shutdown(fd, Int32(SHUT_WR))
                _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
                var scratch = [UInt8](repeating: 0, count: 8_192)
                while scratch.withUnsafeMutableBytes({ recv(fd, $0.baseAddress, $0.count, 0) }) > 0 {}
                close(fd)
                continue
            }
            Thread.detachNewThread { [self] in
                serve(ControlConnection(fd: fd))
                state.withLock {
                    _ = $0.clients.remove(fd)
                    close(fd)  // under the lock: `stop()` never shuts down a reused descriptor
                }
            }
        }
    }

    /// Serves one client: checks its user, reads its hello, runs the operation.
    private func serve(_ connection: ControlConnection) {
        let fd = connection.fd
        let me = geteuid()
        guard let uid = Control.peerUID(fd), uid == me else {
            connection.send(.error, "trellis: error: this node's control socket serves only user \(me)\n")
            connection.finish(status: 1)
            return
        }
        Control.setTimeout(fd, SO_RCVTIMEO, seconds: Control.helloTimeout)
        let hello: Hello
        do {
            guard let parsed = try Hello(readingFrom: fd) else { return }  // closed or silent: nothing to say
            hello = parsed
        } catch {
            connection.send(.error, Control.errorLine(error))
            connection.finish(status: 1)
            return
        }
        Control.setTimeout(fd, SO_RCVTIMEO, seconds: 0)
        if hello.operation == "attach" || hello.operation == "import" {
            let admitted = state.withLock { s in
                guard s.sessions < Self.maxSessions else { return false }
                s.sessions += 1
                return true
            }
            guard admitted else {
                connection.send(
                    .error,
                    "trellis: error: the node serves \(Self.maxSessions) attach and import sessions at once; try "
                        + "again later\n")
                connection.finish(status: 1)
                return
            }
        }
        defer {
            if hello.operation == "attach" || hello.operation == "import" { state.withLock { $0.sessions -= 1 } }
        }
        switch hello.operation {
        case "attach":
            let shell = Shell(
                node: node, interactive: hello.bool("interactive"), keepGoing: hello.bool("keepGoing"),
                bail: hello.bool("bail"), input: LineReader(fd: fd),
                output: ShellOutput(sink: connection, redrawsPrompt: !hello.bool("lineEditing")),
                subscriptions: subscriptions, ownsSubscriptions: false,
                deliveryQueue: DispatchQueue(label: "trellis.control.attach"),
                banner: "trellis attach — node \(node.peerKeyHex.prefix(16))… on \(directory); type `help`, "
                    + "`quit` to detach (the node keeps running)")
            connection.finish(status: shell.run())
        case "status":
            do {
                let status = try node.status()
                connection.send(
                    .output,
                    hello.bool("json") ? try StatusReport.json(status, times) : StatusReport.text(status, times))
                connection.finish(status: 0)
            } catch {
                connection.send(.error, Control.errorLine(error))
                connection.finish(status: 1)
            }
        case "import":
            connection.finish(status: importDocuments(hello, connection))
        case let other:
            connection.send(
                .error, "trellis: error: unknown control operation '\(other)' (attach, status or import)\n")
            connection.finish(status: 1)
        }
    }

    /// `import`: spools the file's bytes to a file of mode 0600 in the data directory (so the
    /// import's one transaction never waits on the client), then imports it as `trellis import`
    /// does, reporting through `connection`. - Returns: the exit status.
    private func importDocuments(_ hello: Hello, _ connection: ControlConnection) -> Int32 {
        guard let collection = hello.string("collection"), let file = hello.string("file") else {
            connection.send(.error, "trellis: error: an import hello needs `collection` and `file`\n")
            return 1
        }
        let spool = (directory as NSString).appendingPathComponent(".import-\(UUID().uuidString).spool")
        let out = open(spool, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        defer { unlink(spool) }
        var failure: String?
        if out < 0 { failure = "cannot create \(spool): \(String(cString: strerror(errno)))" }
        var spooled = 0
        var checkedAt = 0
        // Read every data frame, also after a failure, so the client hears why.
        reading: while true {
            let next: (Control.Frame, [UInt8])?
            do { next = try Control.receiveFrame(connection.fd) } catch {
                failure = failure ?? "\(error)"
                break reading
            }
            guard let (type, payload) = next else {
                if out >= 0 { close(out) }
                return 1  // the client went away before the end of the file: nothing is imported
            }
            guard type == .data else {
                failure = failure ?? "an import takes data frames, not '\(Character(Unicode.Scalar(type.rawValue)))'"
                break reading
            }
            if payload.isEmpty { break }
            // An endless source (`/dev/zero`) must not fill the disk with the spool: every 64 MiB
            // the file system must keep at least 1 GiB or 5 % free, as SQLite needs room too.
            spooled += payload.count
            if failure == nil, spooled - checkedAt >= 64 << 20 {
                checkedAt = spooled
                var fs = statvfs()
                if statvfs(directory, &fs) == 0 {
                    let free = Int(fs.f_bavail) * Int(fs.f_frsize)
                    let total = Int(fs.f_blocks) * Int(fs.f_frsize)
                    if free < max(1 << 30, total / 20) {
                        failure =
                            "\(file) is too large to take here: after \(spooled >> 20) MiB the data directory's "
                            + "file system has \(free >> 20) MiB free"
                    }
                }
            }
            if failure == nil, out >= 0 {
                if !FileSink.writeAll(payload, to: out) {
                    failure = "cannot write \(spool): \(String(cString: strerror(errno)))"
                }
            }
        }
        if out >= 0 { close(out) }
        if let failure {
            connection.send(.error, "trellis: error: \(failure); nothing was imported\n")
            return 1
        }
        do {
            let reader = DocumentReadAhead(try DocumentFileReader(path: spool, name: file), preparingUpserts: true)
            let progress = hello.bool("progress")
            try ImportCommand.perform(
                into: node.store.documents, collection: collection, reader: reader, file: file,
                allOrNothing: hello.bool("allOrNothing"),
                print: { connection.send(.output, $0 + "\n") },
                skipped: { connection.send(.error, "trellis: skipped \($0)\n") },
                progress: { count in
                    if progress { connection.send(.progress, "\(count) \(reader.bytesRead)") }
                }, clearProgress: {})
            return 0
        } catch {
            connection.send(.error, Control.errorLine(error))
            return error is UsageError ? 2 : 1
        }
    }
}

/// A client's first line: a JSON object with `trellis-control` (the protocol version) and
/// `operation`, and the operation's fields.
struct Hello {
    let fields: [String: Any]
    var operation: String { fields["operation"] as? String ?? "" }

    /// Reads the hello line byte by byte (nothing after it is consumed).
    ///
    /// - Returns: `nil` when the client closes or sends nothing within the receive timeout.
    /// - Throws: ``ControlError`` for a line above ``Control/maxHelloBytes``, not a JSON object,
    ///   or naming another protocol version.
    init?(readingFrom fd: Int32) throws {
        var line: [UInt8] = []
        // The whole line within the hello timeout, not each byte: a client dripping its hello
        // byte by byte does not hold a slot for hours.
        let deadline = ContinuousClock.now + .seconds(Control.helloTimeout)
        while true {
            guard ContinuousClock.now < deadline else { return nil }
            guard let byte = Control.receive(fd, 1) else { return nil }
            if byte[0] == 0x0A { break }
            line.append(byte[0])
            guard line.count <= Control.maxHelloBytes else {
                throw ControlError(
                    "the control hello is longer than \(Control.maxHelloBytes) bytes: not a trellis client?")
            }
        }
        guard let object = try? JSONSerialization.jsonObject(with: Data(line)) as? [String: Any] else {
            throw ControlError("the control hello is not a JSON object: not a trellis client?")
        }
        guard let version = object["trellis-control"] as? Int else {
            throw ControlError("the control hello names no protocol version (`trellis-control`): not a trellis client?")
        }
        guard version == Control.version else {
            throw ControlError(
                "the client speaks control protocol \(version), this node \(Control.version): use the node's own "
                    + "trellis binary")
        }
        fields = object
    }

    func bool(_ key: String) -> Bool { fields[key] as? Bool ?? false }
    func string(_ key: String) -> String? { fields[key] as? String }
}
