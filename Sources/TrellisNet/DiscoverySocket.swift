internal import Glibc
import Synchronization

/// Where discovery beacons go.
public enum DiscoveryScope: Sendable, Equatable, CustomStringConvertible {
    /// Every interface that is up: IPv4 broadcast to each interface's broadcast address (and
    /// 127.255.255.255 on loopback), IPv6 multicast to the link-local all-nodes group `ff02::1` on
    /// each interface with a link-local address; each sent from that interface's own address.
    case allInterfaces
    /// Loopback only: IPv4 broadcast to 127.255.255.255 on `lo`, received only from there. Nothing
    /// leaves the host; several nodes on it still find each other (tests use this).
    case loopback

    public var description: String {
        switch self {
        case .allInterfaces: return "all interfaces"
        case .loopback: return "loopback only"
        }
    }
}

/// The UDP side of LAN discovery: one IPv4 socket (and, for ``DiscoveryScope/allInterfaces``, one
/// IPv6 socket) bound to the discovery port with `SO_REUSEADDR` and `SO_REUSEPORT`, so that
/// several nodes on one host share the port (broadcast and multicast datagrams reach every socket
/// bound to it).
///
/// Sends are non-blocking: a datagram the kernel cannot take now is dropped (the next beacon
/// follows). An interface that cannot send is reported once through `log`, not per beacon, and
/// again only after it has worked in between.
public final class DiscoverySocket: Sendable {
    private let fd4: Int32
    private let fd6: Int32?
    /// The discovery port.
    public let port: UInt16
    public let scope: DiscoveryScope
    private let closed = Atomic<Bool>(false)
    private let failing = Mutex<Set<String>>([])
    private let log: @Sendable (String) -> Void

    /// The IPv4 address loopback beacons go to.
    public static let loopbackBroadcast = "127.255.255.255"
    /// The IPv6 link-local all-nodes group.
    public static let allNodes = "ff02::1"

    /// Binds the discovery port.
    ///
    /// - Parameters:
    ///   - port: the UDP port shared by every node of the LAN (default 4041).
    ///   - scope: where beacons go and come from.
    ///   - log: where interfaces that cannot send are reported.
    /// - Throws: ``SocketError`` naming the failing call when the port cannot be bound.
    public init(port: UInt16, scope: DiscoveryScope, log: @escaping @Sendable (String) -> Void) throws(SocketError) {
        self.port = port
        self.scope = scope
        self.log = log
        let fd4 = try Self.socket(family: AF_INET)
        do {
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = port.bigEndian
            address.sin_addr.s_addr = scope == .loopback ? inet_addr(Self.loopbackBroadcast) : INADDR_ANY
            try syscall("bind UDP port \(port)") {
                withUnsafePointer(to: &address) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        bind(fd4, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                    }
                }
            }
        } catch {
            Glibc.close(fd4)
            throw error
        }
        self.fd4 = fd4
        guard scope == .allInterfaces else {
            fd6 = nil
            return
        }
        // IPv6 is optional: a host without it still discovers over IPv4.
        do {
            let fd6 = try Self.socket(family: AF_INET6)
            var one: Int32 = 1
            setsockopt(fd6, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &one, socklen_t(MemoryLayout<Int32>.size))
            setsockopt(fd6, Int32(IPPROTO_IPV6), IPV6_MULTICAST_LOOP, &one, socklen_t(MemoryLayout<Int32>.size))
            var address = sockaddr_in6()
            address.sin6_family = sa_family_t(AF_INET6)
            address.sin6_port = port.bigEndian
            do {
                try syscall("bind UDP [::]:\(port)") {
                    withUnsafePointer(to: &address) {
                        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                            bind(fd6, $0, socklen_t(MemoryLayout<sockaddr_in6>.size))
                        }
                    }
                }
                self.fd6 = fd6
            } catch {
                Glibc.close(fd6)
                throw error
            }
        } catch {
            log("discovery: no IPv6 (\(error)); using IPv4 only")
            fd6 = nil
        }
    }

    deinit {
        Glibc.close(fd4)
        if let fd6 { Glibc.close(fd6) }
    }

    private static func socket(family: Int32) throws(SocketError) -> Int32 {
        let fd = Glibc.socket(family, Int32(SOCK_DGRAM.rawValue), 0)
        guard fd >= 0 else { throw SocketError("socket") }
        var one: Int32 = 1
        let size = socklen_t(MemoryLayout<Int32>.size)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, size)
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, size)
        setsockopt(fd, SOL_SOCKET, SO_BROADCAST, &one, size)
        return fd
    }

    /// Stops ``receive()`` (within its poll interval). Sends are ignored afterwards.
    public func close() {
        closed.store(true, ordering: .releasing)
    }

    // MARK: Sending

    /// Sends `datagram` on every interface of the scope, each from that interface's own address.
    ///
    /// - Returns: how many interfaces took it.
    @discardableResult
    public func send(_ datagram: [UInt8]) -> Int {
        guard !closed.load(ordering: .acquiring) else { return 0 }
        var sent = 0
        for target in targets() {
            let error = target.family == AF_INET ? send4(datagram, target) : send6(datagram, target)
            let name = "\(target.interface) (\(target.family == AF_INET ? "IPv4" : "IPv6"))"
            if let error {
                let first = failing.withLock { $0.insert(name).inserted }
                let hint =
                    target.family == AF_INET6
                    ? " (normal for a second or two after the interface comes up, while its link-local address is tentative)"
                    : ""
                if first { log("discovery: cannot send beacons on \(name): \(error)\(hint)") }
            } else {
                sent += 1
                let recovered = failing.withLock { $0.remove(name) != nil }
                if recovered { log("discovery: sending beacons on \(name) again") }
            }
        }
        return sent
    }

    /// One interface address beacons go out from.
    struct Target {
        var interface: String
        var index: UInt32
        var family: Int32
        var source: [UInt8]
        var destination: [UInt8]
    }

    /// The interfaces and addresses to send from now (read with `getifaddrs` for every beacon, so
    /// interfaces that appear later are used).
    func targets() -> [Target] {
        if scope == .loopback {
            let lo = if_nametoindex("lo")
            return [
                Target(
                    interface: "lo", index: lo, family: AF_INET, source: [127, 0, 0, 1],
                    destination: [127, 255, 255, 255])
            ]
        }
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0, let first = list else {
            let first = failing.withLock { $0.insert("getifaddrs").inserted }
            if first { log("discovery: cannot list interfaces: \(String(cString: strerror(errno)))") }
            return []
        }
        defer { freeifaddrs(list) }
        var targets: [Target] = []
        var seen: Set<String> = []
        var entry: UnsafeMutablePointer<ifaddrs>? = first
        while let ifa = entry {
            entry = ifa.pointee.ifa_next
            let flags = Int32(bitPattern: ifa.pointee.ifa_flags)
            guard let addr = ifa.pointee.ifa_addr, flags & Int32(IFF_UP) != 0 else { continue }
            let name = String(cString: ifa.pointee.ifa_name)
            let index = if_nametoindex(ifa.pointee.ifa_name)
            let loopback = flags & Int32(IFF_LOOPBACK) != 0
            switch Int32(addr.pointee.sa_family) {
            case AF_INET:
                let source = addr.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
                    Self.bytes(of: $0.pointee.sin_addr)
                }
                var destination: [UInt8]
                if loopback {
                    guard source.first == 127 else { continue }
                    destination = [127, 255, 255, 255]
                } else {
                    guard flags & Int32(IFF_BROADCAST) != 0 else { continue }
                    destination = [0, 0, 0, 0]
                    if let broadcast = ifa.pointee.ifa_ifu.ifu_broadaddr {
                        destination = broadcast.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
                            Self.bytes(of: $0.pointee.sin_addr)
                        }
                    }
                    // An address added without a broadcast address (`ip addr add A/24`, no `brd +`)
                    // reports itself (or 0.0.0.0): use the subnet's, from the netmask.
                    if destination == [0, 0, 0, 0] || destination == source, let mask = ifa.pointee.ifa_netmask {
                        let netmask = mask.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
                            Self.bytes(of: $0.pointee.sin_addr)
                        }
                        destination = zip(source, netmask).map { $0 | ~$1 }
                    }
                    guard destination != source else { continue }  // a /32 address: no neighbours
                }
                guard seen.insert("\(name) \(destination)").inserted else { continue }
                targets.append(
                    Target(interface: name, index: index, family: AF_INET, source: source, destination: destination))
            case AF_INET6:
                guard fd6 != nil, !loopback, flags & Int32(IFF_MULTICAST) != 0 else { continue }
                let source = addr.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
                    Self.bytes(of: $0.pointee.sin6_addr)
                }
                // Link-local (fe80::/10) only: one beacon per link.
                guard source[0] == 0xFE, source[1] & 0xC0 == 0x80, seen.insert("\(name) v6").inserted else { continue }
                var group = [UInt8](repeating: 0, count: 16)
                group[0] = 0xFF
                group[1] = 0x02
                group[15] = 1
                targets.append(
                    Target(interface: name, index: index, family: AF_INET6, source: source, destination: group))
            default:
                continue
            }
        }
        return targets
    }

    private static func bytes<T>(of value: T) -> [UInt8] {
        withUnsafeBytes(of: value) { Array($0) }
    }

    /// `struct in_pktinfo` (ip(7)), declared here because Glibc exposes it only under `_GNU_SOURCE`.
    private struct InPacketInfo {
        var ifindex: Int32
        var specificDestination: UInt32
        var address: UInt32
    }

    /// `struct in6_pktinfo` (ipv6(7)).
    private struct In6PacketInfo {
        var address: (UInt64, UInt64)
        var ifindex: UInt32
    }

    private func send4(_ datagram: [UInt8], _ target: Target) -> String? {
        var destination = sockaddr_in()
        destination.sin_family = sa_family_t(AF_INET)
        destination.sin_port = port.bigEndian
        withUnsafeMutableBytes(of: &destination.sin_addr) { $0.copyBytes(from: target.destination) }
        var info = InPacketInfo(ifindex: Int32(bitPattern: target.index), specificDestination: 0, address: 0)
        withUnsafeMutableBytes(of: &info.specificDestination) { $0.copyBytes(from: target.source) }
        return sendMessage(
            fd4, datagram, &destination, socklen_t(MemoryLayout<sockaddr_in>.size), level: Int32(IPPROTO_IP),
            type: Int32(IP_PKTINFO), info: info)
    }

    private func send6(_ datagram: [UInt8], _ target: Target) -> String? {
        guard let fd6 else { return "no IPv6 socket" }
        var destination = sockaddr_in6()
        destination.sin6_family = sa_family_t(AF_INET6)
        destination.sin6_port = port.bigEndian
        destination.sin6_scope_id = target.index
        withUnsafeMutableBytes(of: &destination.sin6_addr) { $0.copyBytes(from: target.destination) }
        var index = target.index
        setsockopt(fd6, Int32(IPPROTO_IPV6), IPV6_MULTICAST_IF, &index, socklen_t(MemoryLayout<UInt32>.size))
        var info = In6PacketInfo(address: (0, 0), ifindex: target.index)
        withUnsafeMutableBytes(of: &info.address) { $0.copyBytes(from: target.source) }
        return sendMessage(
            fd6, datagram, &destination, socklen_t(MemoryLayout<sockaddr_in6>.size), level: Int32(IPPROTO_IPV6),
            type: Int32(IPV6_PKTINFO), info: info)
    }

    /// `sendmsg` with one control message (the packet-info structure choosing the interface and
    /// source address), without blocking.
    ///
    /// - Returns: `nil` when sent, else the error's text.
    private func sendMessage<Address, Info>(
        _ fd: Int32, _ datagram: [UInt8], _ destination: inout Address, _ length: socklen_t, level: Int32,
        type: Int32, info: Info
    ) -> String? {
        // CMSG_SPACE / CMSG_LEN by hand (Glibc's are macros): header, then the data aligned to size_t.
        let align = MemoryLayout<Int>.size
        func aligned(_ n: Int) -> Int { (n + align - 1) & ~(align - 1) }
        let header = aligned(MemoryLayout<cmsghdr>.size)
        let dataLength = MemoryLayout<Info>.size
        var control = [UInt8](repeating: 0, count: header + aligned(dataLength))
        control.withUnsafeMutableBytes { raw in
            var cmsg = cmsghdr()
            cmsg.cmsg_len = header + dataLength
            cmsg.cmsg_level = level
            cmsg.cmsg_type = type
            withUnsafeBytes(of: &cmsg) { raw.copyMemory(from: $0) }
            withUnsafeBytes(of: info) {
                (raw.baseAddress! + header).copyMemory(from: $0.baseAddress!, byteCount: $0.count)
            }
        }
        var datagram = datagram
        let sent = datagram.withUnsafeMutableBytes { payload in
            control.withUnsafeMutableBytes { controlBytes in
                withUnsafeMutablePointer(to: &destination) { address in
                    var vector = iovec(iov_base: payload.baseAddress, iov_len: payload.count)
                    return withUnsafeMutablePointer(to: &vector) { vectorPointer in
                        var message = msghdr()
                        message.msg_name = UnsafeMutableRawPointer(address)
                        message.msg_namelen = length
                        message.msg_iov = vectorPointer
                        message.msg_iovlen = 1
                        message.msg_control = controlBytes.baseAddress
                        message.msg_controllen = controlBytes.count
                        while true {
                            let n = sendmsg(fd, &message, Int32(MSG_DONTWAIT | MSG_NOSIGNAL))
                            if n < 0, errno == EINTR { continue }
                            return n < 0 ? errno : 0
                        }
                    }
                }
            }
        }
        if sent == 0 || sent == EAGAIN || sent == EWOULDBLOCK { return nil }
        return String(cString: strerror(sent))
    }

    // MARK: Receiving

    /// Waits for the next datagram on either socket.
    ///
    /// - Returns: its bytes (at most 2048) and its numeric source host (an IPv6 link-local source
    ///   with its `%interface` zone), or `nil` once ``close()`` was called.
    /// - Throws: ``SocketError`` when polling or receiving fails for another reason than an interrupt.
    public func receive() throws(SocketError) -> (bytes: [UInt8], host: String)? {
        var fds = [pollfd(fd: fd4, events: Int16(POLLIN), revents: 0)]
        if let fd6 { fds.append(pollfd(fd: fd6, events: Int16(POLLIN), revents: 0)) }
        while !closed.load(ordering: .acquiring) {
            let ready = poll(&fds, nfds_t(fds.count), 250)
            if ready < 0 {
                if errno == EINTR { continue }
                throw SocketError("poll")
            }
            for item in fds where item.revents & Int16(POLLIN) != 0 {
                if let received = try receive(item.fd) { return received }
            }
        }
        return nil
    }

    private func receive(_ fd: Int32) throws(SocketError) -> (bytes: [UInt8], host: String)? {
        var buffer = [UInt8](repeating: 0, count: 2048)
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let n = buffer.withUnsafeMutableBytes { raw in
            withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    recvfrom(fd, raw.baseAddress, raw.count, Int32(MSG_DONTWAIT), $0, &length)
                }
            }
        }
        if n < 0 {
            if errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK { return nil }
            throw SocketError("recvfrom")
        }
        var host = [CChar](repeating: 0, count: Int(NI_MAXHOST))
        let rc = withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                getnameinfo($0, length, &host, socklen_t(host.count), nil, 0, NI_NUMERICHOST)
            }
        }
        let text =
            rc == 0 ? String(decoding: host.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) : "unknown"
        return (Array(buffer.prefix(n)), text)
    }
}
