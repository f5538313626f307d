import Foundation
import Glibc
import Synchronization
import Testing
import TrellisCore
import TrellisCrypto
import TrellisNet
import TrellisStore
import TrellisTestKit

@testable import TrellisSync

/// Inbound connections before authentication: per-source and total limits, the first-message
/// deadline, refusal of a wrong mesh key before any static-key work, and the mesh-key changeover.
@Suite struct PreAuthTests {
    let dir = TemporaryDirectory()

    func network(
        _ name: String, meshKey: SecretBytes, nextMeshKey: SecretBytes? = nil, handshakeTimeout: Int = 10,
        limits: PreAuthLimits = PreAuthLimits(), log: @escaping @Sendable (String) -> Void = { _ in }
    ) throws -> (MeshNetwork, DocumentStore) {
        let store = try DocumentStore(path: dir.path("\(name).sqlite"))
        let identity = KeyPair.generate()
        let engine = try SyncEngine(store: store, peerKey: identity.publicKey)
        let network = MeshNetwork(
            engine: engine, identity: identity, meshKey: meshKey, nextMeshKey: nextMeshKey,
            handshakeTimeout: handshakeTimeout, preAuthLimits: limits, log: log)
        return (network, store)
    }

    /// A plain TCP connection from `source` (any 127.0.0.0/8 address is loopback on Linux).
    static func rawConnect(from source: String, to port: UInt16) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        try #require(fd >= 0)
        var local = sockaddr_in()
        local.sin_family = sa_family_t(AF_INET)
        inet_pton(AF_INET, source, &local.sin_addr)
        var remote = sockaddr_in()
        remote.sin_family = sa_family_t(AF_INET)
        remote.sin_port = port.bigEndian
        inet_pton(AF_INET, "127.0.0.1", &remote.sin_addr)
        let bound = withUnsafePointer(to: &local) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        try #require(bound == 0, "bind \(source): \(String(cString: strerror(errno)))")
        let connected = withUnsafePointer(to: &remote) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        try #require(connected == 0, "connect: \(String(cString: strerror(errno)))")
        return fd
    }

    /// Reads until end of stream or `limit` seconds; returns the bytes read and whether the peer
    /// closed.
    static func readUntilClosed(_ fd: Int32, limit: Int32 = 30) -> (bytes: Int, closed: Bool) {
        var total = 0
        var buffer = [UInt8](repeating: 0, count: 4096)
        var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        while poll(&poller, 1, limit * 1000) > 0 {
            let n = recv(fd, &buffer, buffer.count, 0)
            if n <= 0 { return (total, true) }
            total += n
        }
        return (total, false)
    }

    /// Runs one initiator handshake against `port` with `key`.
    static func dial(_ port: UInt16, key: SecretBytes) throws -> SecureLink {
        let socket = try TCPSocket.connect(to: Endpoint(host: "127.0.0.1", port: port))
        return try SecureLink.handshake(
            socket: socket, initiator: true, identity: .generate(), meshKey: key, address: "server")
    }

    // MARK: The table

    @Test func aSourceAtItsLimitLosesItsOldestUnprovedConnection() {
        var limits = PreAuthLimits()
        limits.perSource = 3
        limits.total = 100
        var table = PreAuthTable(limits: limits)
        let ids = (0..<3).map { _ in table.admit(source: "10.0.0.9") }
        #expect(ids.allSatisfy { $0.evict == nil })
        let other = table.admit(source: "10.0.0.7")
        #expect(other.evict == nil)
        let fourth = table.admit(source: "10.0.0.9")
        #expect(fourth.evict == ids[0].id)
        #expect(table.unproved(from: "10.0.0.9") == 3)
        // A connection that proved a key no longer counts against its source.
        #expect(table.prove(ids[1].id) == .proved)
        #expect(table.unproved(from: "10.0.0.9") == 2)
        #expect(table.admit(source: "10.0.0.9").evict == nil)
        // An evicted connection cannot prove a key afterwards.
        #expect(table.prove(ids[0].id) == .evicted)
    }

    @Test func atTheTotalLimitTheSourceHoldingTheMostLosesItsOldest() {
        var limits = PreAuthLimits()
        limits.perSource = 10
        limits.total = 6
        var table = PreAuthTable(limits: limits)
        let first = table.admit(source: "a")
        let attacker = (0..<4).map { _ in table.admit(source: "b") }
        _ = table.admit(source: "c")
        let honest = table.admit(source: "d")
        #expect(honest.evict == attacker[0].id, "not the oldest overall (\(first.id)) but the biggest source's")
        #expect(table.unprovedTotal == 6)
        #expect(table.isUnproved(first.id))
    }

    @Test func theProvedLimitRefusesBeyondIt() {
        var limits = PreAuthLimits()
        limits.proved = 1
        var table = PreAuthTable(limits: limits)
        let a = table.admit(source: "x").id
        let b = table.admit(source: "y").id
        #expect(table.prove(a) == .proved)
        #expect(table.prove(b) == .overLimit)
        table.finish(a, proved: true)
        #expect(table.provedCount == 0)
    }

    @Test(arguments: [
        ("127.0.0.1", "127.0.0.1"), ("::ffff:10.1.2.3", "10.1.2.3"),
        ("fe80::1%eth0", "fe80:0:0:0::/64"), ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb:cccc:dddd:eeee", "2001:db8:1:2::/64"), ("::1", "0:0:0:0::/64"),
    ])
    func sourcesAreIPv4AddressesAndIPv6Slash64s(host: String, source: String) {
        #expect(PreAuthTable.source(of: host) == source)
    }

    // MARK: Over TCP

    /// A stranger holding 40 idle connections (more than the old global limit of 32) keeps no peer
    /// out: not one on another address (127.0.0.2 against 127.0.0.1), whose connection only
    /// counts against the total, nor one on the stranger's own address, since the newest
    /// connection from a source takes the place of its oldest unproved one.
    @Test(arguments: ["127.0.0.2", "127.0.0.1"])
    func idleConnectionsFromOneAddressKeepNoPeerOut(stranger: String) throws {
        Sodium.initialize()
        let key = SecretBytes.random(count: 32)
        let (server, _) = try network("server", meshKey: key)
        defer { server.stop() }
        let port = try server.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let idle = try (0..<40).map { _ in try Self.rawConnect(from: stranger, to: port) }
        defer { for fd in idle { close(fd) } }
        #expect(eventually { server.preAuthCounters.accepted >= 40 })
        let link = try Self.dial(port, key: key)
        #expect(eventually { server.preAuthCounters.completed == 1 })
        link.close()
        #expect(server.preAuthCounters.evicted >= 40 - PreAuthLimits().perSource)
    }

    /// A stranger dripping message 1 is cut at the first-message deadline, not the whole
    /// handshake's (60 s here).
    @Test func aSlowFirstMessageIsCutAtTheFirstMessageDeadline() throws {
        Sodium.initialize()
        var limits = PreAuthLimits()
        limits.firstMessageTimeout = .milliseconds(500)
        let (server, _) = try network(
            "server", meshKey: SecretBytes.random(count: 32), handshakeTimeout: 60, limits: limits)
        defer { server.stop() }
        let port = try server.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let fd = try Self.rawConnect(from: "127.0.0.1", to: port)
        defer { close(fd) }
        var header: [UInt8] = [0, 48]
        _ = send(fd, &header, 2, Int32(MSG_NOSIGNAL))
        var cut = false
        for _ in 0..<100 {  // one byte every 0.2 s: message 1 would take 9.6 s
            var byte: UInt8 = 0
            if send(fd, &byte, 1, Int32(MSG_NOSIGNAL)) < 0 {
                cut = true
                break
            }
            if server.preAuthCounters.firstMessageTimeouts == 1 {
                cut = true
                break
            }
            usleep(200_000)
        }
        #expect(cut)
        #expect(Self.readUntilClosed(fd).closed)
        #expect(server.preAuthCounters.firstMessageTimeouts == 1)
        #expect(server.preAuthCounters.failed == 0)
    }

    /// A message 1 under another mesh key is refused before message 2: the node sends nothing,
    /// so it has done no DH with its static key and revealed no key.
    @Test func aWrongMeshKeyIsRefusedBeforeMessage2() throws {
        Sodium.initialize()
        let (server, _) = try network("server", meshKey: SecretBytes.random(count: 32))
        defer { server.stop() }
        let port = try server.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        var stranger = try HandshakeState(
            pattern: .xxpsk0, role: .initiator, prologue: SecureLink.prologue, staticKeyPair: .generate(),
            psk: SecretBytes.random(count: 32))
        let message1 = try stranger.writeMessage()
        let fd = try Self.rawConnect(from: "127.0.0.1", to: port)
        defer { close(fd) }
        var frame = [UInt8(message1.count >> 8), UInt8(message1.count & 0xFF)] + message1
        #expect(send(fd, &frame, frame.count, Int32(MSG_NOSIGNAL)) == frame.count)
        let answer = Self.readUntilClosed(fd)
        #expect(answer.closed)
        #expect(answer.bytes == 0, "the node answered a stranger with \(answer.bytes) bytes")
        #expect(eventually { server.preAuthCounters.wrongKey == 1 })
    }

    /// A dialer speaking the older handshake (XXpsk3, protocol 2) is told so.
    @Test func anOlderProtocolsFirstMessageIsNamedAsSuch() throws {
        Sodium.initialize()
        let key = SecretBytes.random(count: 32)
        let lines = Mutex<[String]>([])
        let (server, _) = try network("server", meshKey: key) { line in lines.withLock { $0.append(line) } }
        defer { server.stop() }
        let port = try server.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        var old = try HandshakeState(
            pattern: .xxpsk3, role: .initiator, prologue: Array("trellis/1".utf8), staticKeyPair: .generate(), psk: key)
        let socket = try TCPSocket.connect(to: Endpoint(host: "127.0.0.1", port: port))
        let message1 = try old.writeMessage()
        try socket.write([UInt8(message1.count >> 8), UInt8(message1.count & 0xFF)] + message1)
        #expect(throws: SocketError.self) { _ = try socket.read(exactly: 2) }
        #expect(eventually { lines.withLock { $0.contains { $0.contains("older protocol version") } } })
        #expect(server.preAuthCounters.wrongKey == 1)
    }

    // MARK: Mesh-key changeover

    /// A holds K1 and next K2, B only K2, C only K1: all three connect to A; once A promotes K2,
    /// C is refused with a message naming the mesh key.
    @Test func aChangeoverAcceptsBothKeysUntilPromotion() throws {
        Sodium.initialize()
        let k1 = SecretBytes.random(count: 32)
        let k2 = SecretBytes.random(count: 32)
        let (a, aStore) = try network("a", meshKey: k1, nextMeshKey: k2)
        defer { a.stop() }
        let port = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        try aStore.upsert(["_id": "x"], in: "c")
        let (b, bStore) = try network("b", meshKey: k2)
        defer { b.stop() }
        let (c, cStore) = try network("c", meshKey: k1)
        defer { c.stop() }
        for (node, _) in [(b, bStore), (c, cStore)] {
            try node.engine.subscribe(SubscriptionSpec(collection: "c"))
            node.dial(Endpoint(host: "127.0.0.1", port: port))
        }
        #expect(eventually { (try? bStore.count(in: "c")) == 1 && (try? cStore.count(in: "c")) == 1 })
        #expect(eventually { a.preAuthCounters.completed == 2 })

        // A dials out too: to a K2-only node it retries with K2 once refused under K1.
        let (d, _) = try network("d", meshKey: k2)
        defer { d.stop() }
        let dPort = try d.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        a.dial(Endpoint(host: "127.0.0.1", port: dPort))
        #expect(eventually { d.preAuthCounters.completed == 1 })
        #expect(d.preAuthCounters.wrongKey == 1, "A tried K1 first")

        #expect(a.promoteNextMeshKey())
        #expect(!a.promoteNextMeshKey(), "nothing left to promote")
        let refusal = #expect(throws: HandshakeError.self) { _ = try Self.dial(port, key: k1) }
        #expect(refusal?.reason == .refusedByPeer)
        #expect(refusal?.description.contains("another mesh key") == true)
        let link = try Self.dial(port, key: k2)
        link.close()
    }
}
