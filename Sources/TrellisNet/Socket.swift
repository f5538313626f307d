internal import Glibc
import Synchronization

/// A failed system call: the call's name, `errno` and its text.
public struct SocketError: Error, Sendable, CustomStringConvertible {
    public var call: String
    public var code: Int32
    public var message: String

    init(_ call: String, code: Int32 = errno) {
        self.call = call
        self.code = code
        self.message = String(cString: strerror(code))
    }

    public init(_ call: String, message: String) {
        self.call = call
        self.code = 0
        self.message = message
    }

    public var description: String { "\(call): \(message)" }
}

/// Runs a system call, retrying on `EINTR`, turning `-1` into a ``SocketError``.
@discardableResult
func syscall<T: FixedWidthInteger>(_ name: String, _ body: () -> T) throws(SocketError) -> T {
    while true {
        let result = body()
        if result == -1 {
            if errno == EINTR { continue }
            throw SocketError(name)
        }
        return result
    }
}

/// A `host:port` endpoint (IPv4 literal or name resolved with `getaddrinfo`).
public struct Endpoint: Hashable, Sendable, CustomStringConvertible {
    public var host: String
    public var port: UInt16

    public init(host: String, port: UInt16) {
        self.host = host
        self.port = port
    }

    /// Parses `HOST:PORT` (`[v6]:PORT` for IPv6 literals).
    ///
    /// - Throws: ``SocketError`` naming the problem.
    public init(parsing text: String) throws(SocketError) {
        guard let colon = text.lastIndex(of: ":") else {
            throw SocketError("address", message: "'\(text)' is not HOST:PORT")
        }
        var host = String(text[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty, let port = UInt16(text[text.index(after: colon)...]) else {
            throw SocketError("address", message: "'\(text)' is not HOST:PORT with a port from 0 to 65535")
        }
        self.init(host: host, port: port)
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// A TCP socket file descriptor with one owner; closed on `deinit`.
public final class TCPSocket: Sendable {
    // The descriptor is closed only in `deinit`, so it cannot be reused while a reader or writer
    // still holds this object; `close()` only shuts the connection down, waking a blocked reader.
    private let fd: Int32

    init(fd: Int32) {
        self.fd = fd
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, socklen_t(MemoryLayout<Int32>.size))
        // Keepalive: a peer that vanishes without a FIN (power loss, cable pulled) is detected
        // after about 15 s idle + 3 probes 5 s apart, so the dialer reconnects.
        var idle: Int32 = 15
        var interval: Int32 = 5
        var count: Int32 = 3
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_KEEPIDLE, &idle, socklen_t(MemoryLayout<Int32>.size))
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_KEEPINTVL, &interval, socklen_t(MemoryLayout<Int32>.size))
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_KEEPCNT, &count, socklen_t(MemoryLayout<Int32>.size))
        // Keepalive does not run while sent data is unacknowledged; TCP_USER_TIMEOUT covers that
        // case (and a peer that keeps its receive window closed): the kernel ends the connection
        // when data stays unacknowledged for this long.
        var userTimeout = UInt32(TCPSocket.userTimeoutMilliseconds)
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_USER_TIMEOUT, &userTimeout, socklen_t(MemoryLayout<UInt32>.size))
    }

    /// How long, in milliseconds, sent data may stay unacknowledged before the kernel ends the
    /// connection (`TCP_USER_TIMEOUT`, RFC 5482): 30 000.
    public static let userTimeoutMilliseconds = 30_000

    /// The remote address as `host:port`, or `"unknown"`.
    public var peerAddress: String {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &length) }
        }
        guard rc == 0 else { return "unknown" }
        var host = [CChar](repeating: 0, count: Int(NI_MAXHOST))
        var service = [CChar](repeating: 0, count: Int(NI_MAXSERV))
        let ok = withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                getnameinfo(
                    $0, length, &host, socklen_t(host.count), &service, socklen_t(service.count),
                    NI_NUMERICHOST | NI_NUMERICSERV)
            }
        }
        guard ok == 0 else { return "unknown" }
        func text(_ chars: [CChar]) -> String {
            String(decoding: chars.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        }
        let h = text(host)
        let p = text(service)
        return h.contains(":") ? "[\(h)]:\(p)" : "\(h):\(p)"
    }

    deinit { Glibc.close(fd) }

    /// Connects to an endpoint.
    ///
    /// - Throws: ``SocketError`` from name resolution or `connect`.
    public static func connect(to endpoint: Endpoint) throws(SocketError) -> TCPSocket {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var result: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(endpoint.host, String(endpoint.port), &hints, &result)
        guard rc == 0, let first = result else {
            throw SocketError(
                "getaddrinfo", message: "cannot resolve '\(endpoint.host)': \(String(cString: gai_strerror(rc)))")
        }
        defer { freeaddrinfo(result) }
        var lastError = SocketError("connect", message: "no address for \(endpoint)")
        var info: UnsafeMutablePointer<addrinfo>? = first
        while let ai = info {
            info = ai.pointee.ai_next
            let fd = socket(ai.pointee.ai_family, Int32(SOCK_STREAM.rawValue), 0)
            if fd < 0 {
                lastError = SocketError("socket")
                continue
            }
            do {
                try syscall("connect") { Glibc.connect(fd, ai.pointee.ai_addr, ai.pointee.ai_addrlen) }
                return TCPSocket(fd: fd)
            } catch {
                lastError = error
                Glibc.close(fd)
            }
        }
        throw lastError
    }

    /// Writes all bytes (with `MSG_NOSIGNAL`).
    public func write(_ bytes: [UInt8]) throws(SocketError) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { buffer in
                send(fd, buffer.baseAddress! + offset, buffer.count - offset, Int32(MSG_NOSIGNAL))
            }
            if n < 0 {
                if errno == EINTR { continue }
                throw SocketError("send")
            }
            offset += n
        }
    }

    /// Reads exactly `count` bytes.
    ///
    /// - Throws: ``SocketError`` on error or when the peer closes first (`call` is "recv").
    public func read(exactly count: Int) throws(SocketError) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        var offset = 0
        while offset < count {
            let n = out.withUnsafeMutableBytes { buffer in
                recv(fd, buffer.baseAddress! + offset, count - offset, 0)
            }
            if n < 0 {
                if errno == EINTR { continue }
                if errno == EAGAIN || errno == EWOULDBLOCK { throw SocketError("recv", message: "timed out") }
                throw SocketError("recv")
            }
            if n == 0 { throw SocketError("recv", message: "connection closed by peer") }
            offset += n
        }
        return out
    }

    /// Reads exactly `count` bytes, giving up at `deadline`.
    ///
    /// - Throws: ``SocketError`` on error, when the peer closes first, or with code `ETIMEDOUT`
    ///   when `deadline` passes first (a peer sending one byte at a time cannot extend it).
    public func read(exactly count: Int, deadline: ContinuousClock.Instant) throws(SocketError) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        var offset = 0
        while offset < count {
            try wait(for: Int16(POLLIN), until: deadline)
            let n = out.withUnsafeMutableBytes { buffer in
                recv(fd, buffer.baseAddress! + offset, count - offset, Int32(MSG_DONTWAIT))
            }
            if n < 0 {
                if errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK { continue }
                throw SocketError("recv")
            }
            if n == 0 { throw SocketError("recv", message: "connection closed by peer") }
            offset += n
        }
        return out
    }

    /// Writes all bytes (with `MSG_NOSIGNAL`), giving up at `deadline`.
    ///
    /// - Throws: ``SocketError`` on error, or with code `ETIMEDOUT` when `deadline` passes first.
    public func write(_ bytes: [UInt8], deadline: ContinuousClock.Instant) throws(SocketError) {
        var offset = 0
        while offset < bytes.count {
            try wait(for: Int16(POLLOUT), until: deadline)
            let n = bytes.withUnsafeBytes { buffer in
                send(fd, buffer.baseAddress! + offset, buffer.count - offset, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
            }
            if n < 0 {
                if errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK { continue }
                throw SocketError("send")
            }
            offset += n
        }
    }

    /// Receives what is available, at most `buffer.count` bytes, waiting until something is.
    ///
    /// - Returns: the number of bytes received; 0 when the peer has closed its side (or this side
    ///   was shut down).
    /// - Throws: ``SocketError`` on error (for example `ETIMEDOUT` from `TCP_USER_TIMEOUT`).
    func receive(into buffer: UnsafeMutableRawBufferPointer) throws(SocketError) -> Int {
        while true {
            let n = recv(fd, buffer.baseAddress!, buffer.count, 0)
            if n >= 0 { return n }
            if errno == EINTR { continue }
            throw SocketError("recv")
        }
    }

    /// Sends as much of `bytes` as the socket takes without waiting.
    ///
    /// - Returns: the number of bytes sent: 0 when the socket's send buffer is full.
    /// - Throws: ``SocketError`` on error (`EPIPE` after a shutdown, `ETIMEDOUT`, `ECONNRESET`).
    func sendWithoutWaiting(_ bytes: UnsafeRawBufferPointer) throws(SocketError) -> Int {
        while true {
            let n = send(fd, bytes.baseAddress!, bytes.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
            if n >= 0 { return n }
            if errno == EINTR { continue }
            if errno == EAGAIN || errno == EWOULDBLOCK { return 0 }
            throw SocketError("send")
        }
    }

    /// Waits until the socket can take more bytes, has failed, or was shut down (the next send then
    /// reports which). Never times out by itself: `TCP_USER_TIMEOUT` or ``close()`` ends the wait.
    func waitUntilWritable() {
        var pfd = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
        while poll(&pfd, 1, -1) < 0 && errno == EINTR {}
    }

    /// Waits for `events` until `deadline`.
    ///
    /// - Throws: ``SocketError`` with code `ETIMEDOUT` when the deadline passes first.
    private func wait(for events: Int16, until deadline: ContinuousClock.Instant) throws(SocketError) {
        while true {
            let remaining = deadline - ContinuousClock.now
            guard remaining > .zero else { throw SocketError("poll", code: ETIMEDOUT) }
            let (seconds, attoseconds) = remaining.components
            let milliseconds = Int32(clamping: seconds * 1000 + attoseconds / 1_000_000_000_000_000 + 1)
            var pfd = pollfd(fd: fd, events: events, revents: 0)
            let rc = poll(&pfd, 1, milliseconds)
            if rc > 0 { return }  // ready, failed or shut down: the call that follows reports which
            if rc < 0 && errno != EINTR { throw SocketError("poll") }
        }
    }

    /// Shuts the connection down in both directions: a blocked `read` returns and later calls
    /// fail. The descriptor itself is released when the last reference goes.
    public func close() {
        shutdown(fd, Int32(SHUT_RDWR))
    }

    /// Aborts the connection with a TCP RST instead of a FIN (`connect` with `AF_UNSPEC`, which
    /// Linux turns into a disconnect); the descriptor stays open until the socket is released.
    /// For tests that play a third party forging a reset.
    func reset() {
        var address = sockaddr()
        address.sa_family = sa_family_t(AF_UNSPEC)
        _ = Glibc.connect(fd, &address, socklen_t(MemoryLayout<sockaddr>.size))
    }
}

/// A listening TCP socket.
public final class TCPListener: Sendable {
    // As for TCPSocket: closed in `deinit`, shut down by `close()` to wake the accept thread.
    private let fd: Int32
    private let closed = Atomic<Bool>(false)
    /// The bound port (useful after binding port 0).
    public let port: UInt16

    /// Binds and listens on `endpoint` (`SO_REUSEADDR`).
    ///
    /// - Throws: ``SocketError`` naming the failing call (address in use, permission, bad host).
    public init(endpoint: Endpoint, backlog: Int32 = 64) throws(SocketError) {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_PASSIVE
        var result: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(endpoint.host, String(endpoint.port), &hints, &result)
        guard rc == 0, let ai = result else {
            throw SocketError(
                "getaddrinfo", message: "cannot resolve '\(endpoint.host)': \(String(cString: gai_strerror(rc)))")
        }
        defer { freeaddrinfo(result) }
        let fd = socket(ai.pointee.ai_family, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw SocketError("socket") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        do {
            try syscall("bind \(endpoint)") { bind(fd, ai.pointee.ai_addr, ai.pointee.ai_addrlen) }
            try syscall("listen") { listen(fd, backlog) }
        } catch {
            Glibc.close(fd)
            throw error
        }
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        let port: UInt16 = withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin_port) }
        }
        self.fd = fd
        self.port = port
    }

    deinit { Glibc.close(fd) }

    /// Blocks until a connection arrives.
    ///
    /// - Throws: ``SocketError`` once the listener is closed.
    public func accept() throws(SocketError) -> TCPSocket {
        while true {
            guard !closed.load(ordering: .acquiring) else { throw SocketError("accept", message: "listener closed") }
            let client = Glibc.accept(fd, nil, nil)
            if client >= 0 { return TCPSocket(fd: client) }
            let code = errno
            // Transient: interrupted, aborted handshakes, or out of descriptors (back off briefly).
            if code == EINTR || code == ECONNABORTED { continue }
            if code == EMFILE || code == ENFILE {
                usleep(100_000)
                continue
            }
            throw SocketError("accept", code: code)
        }
    }

    /// Stops accepting; a blocked ``accept()`` throws.
    public func close() {
        closed.store(true, ordering: .releasing)
        shutdown(fd, Int32(SHUT_RDWR))
    }
}

/// Ignores `SIGPIPE` process-wide (writes use `MSG_NOSIGNAL` too).
public func ignoreSIGPIPE() {
    signal(SIGPIPE, SIG_IGN)
}
