import Foundation
import Synchronization
import Testing
import TrellisCore
import TrellisCrypto
import TrellisNet
import TrellisStore
import TrellisSync
import TrellisTestKit

@Suite struct NetworkTests {
    let dir = TemporaryDirectory()

    func network(_ name: String, meshKey: SecretBytes, handshakeTimeout: Int = 10) throws -> (
        MeshNetwork, DocumentStore
    ) {
        let store = try DocumentStore(path: dir.path("\(name).sqlite"))
        let identity = KeyPair.generate()
        let engine = try SyncEngine(store: store, peerKey: identity.publicKey)
        return (
            MeshNetwork(
                engine: engine, identity: identity, meshKey: meshKey, handshakeTimeout: handshakeTimeout,
                log: { message in
                    if message.contains("accept") || message.contains("too many") { print("server: \(message)") }
                }), store
        )
    }

    /// A client that drips one byte at a time is cut off when the whole handshake's time is up,
    /// and a real peer still connects meanwhile.
    @Test func aSlowHandshakeIsCutOffAtItsDeadline() throws {
        Sodium.initialize()
        let key = SecretBytes.random(count: 32)
        let (server, serverStore) = try network("server", meshKey: key, handshakeTimeout: 1)
        defer { server.stop() }
        let port = try server.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let slow = try TCPSocket.connect(to: Endpoint(host: "127.0.0.1", port: port))
        try slow.write([0xFF, 0xFF])  // announces a 65535-byte first message
        let started = Date()
        var cutOff = false
        for _ in 0..<40 {  // at most ~8 s
            do {
                try slow.write([0])
                usleep(200_000)
            } catch {
                cutOff = true
                break
            }
        }
        #expect(cutOff)
        #expect(Date().timeIntervalSince(started) < 6)
        // A legitimate peer replicates.
        try serverStore.upsert(["_id": "x"], in: "c")
        let (client, clientStore) = try network("client", meshKey: key)
        defer { client.stop() }
        try client.engine.subscribe(SubscriptionSpec(collection: "c"))
        client.dial(Endpoint(host: "127.0.0.1", port: port))
        #expect(eventually { (try? clientStore.count(in: "c")) == 1 })
    }

    /// Every inbound connection that fails its handshake gives its descriptor back at once: 200
    /// clients that connect and hang up leave nothing held, long before the 10 s handshake
    /// deadline.
    @Test func abandonedHandshakesReleaseTheirDescriptors() throws {
        Sodium.initialize()
        let (server, _) = try network("server", meshKey: SecretBytes.random(count: 32))
        defer { server.stop() }
        let port = try server.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        // 10 rounds of 20 clients: each round notes the server-side sockets once accepted (their
        // inodes), then the clients hang up.
        var accepted: Set<String> = []
        for _ in 0..<10 {
            let clients = try (0..<20).map { _ in try TCPSocket.connect(to: Endpoint(host: "127.0.0.1", port: port)) }
            // A round whose server-side sockets are never seen open (once, on a loaded CI machine,
            // all 20 were already gone) has nothing to check; the rounds that were seen must
            // give every descriptor back, and at least one round must be seen.
            if !eventually({ !acceptedSocketInodes(localPort: port).isEmpty }) {
                print("no accepted socket seen this round; sockets on port \(port): \(socketStates(port: port))")
            }
            let round = acceptedSocketInodes(localPort: port)
            accepted.formUnion(round)
            for client in clients { client.close() }
            // Each round waits for the last one's descriptors, so that the server's limit on
            // handshakes in progress (32) never refuses a whole round.
            #expect(
                eventually(timeout: 5) { descriptors(of: round) == 0 },
                "\(descriptors(of: round)) accepted connections still hold a descriptor")
        }
        #expect(!accepted.isEmpty)
        #expect(descriptors(of: accepted) == 0)
    }

    /// A peer holding the mesh key that stops reading (here: its reader blocks after the first
    /// message, as a frozen process would) while a batch of 5 MB is due to it: another peer
    /// still syncs in full, and `stop()` returns.
    @Test func aPeerThatStopsReadingStallsNeitherOtherPeersNorStop() throws {
        Sodium.initialize()
        let key = SecretBytes.random(count: 32)
        let (a, aStore) = try network("a", meshKey: key)
        let port = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let pad = Value.string(String(repeating: "x", count: 20_000))
        _ = try aStore.upsert((0..<300).map { ["_id": .string("d\($0)"), "pad": pad] }, in: "big")

        let stalledStore = try DocumentStore(path: dir.path("stalled.sqlite"))
        let stalledIdentity = KeyPair.generate()
        let stalledEngine = try SyncEngine(store: stalledStore, peerKey: stalledIdentity.publicKey)
        try stalledEngine.subscribe(SubscriptionSpec(collection: "big"))
        let socket = try TCPSocket.connect(to: Endpoint(host: "127.0.0.1", port: port))
        let stalled = StallingLink(
            try SecureLink.handshake(
                socket: socket, initiator: true, identity: stalledIdentity, meshKey: key, address: "a"))
        stalledEngine.attach(stalled)
        #expect(eventually { stalled.isStalled })
        usleep(500_000)  // let `a` start its first batch to the stalled peer

        let (b, bStore) = try network("b", meshKey: key)
        defer { b.stop() }
        try b.engine.subscribe(SubscriptionSpec(collection: "big"))
        b.dial(Endpoint(host: "127.0.0.1", port: port))
        #expect(eventually(timeout: 60) { (try? bStore.count(in: "big")) == 300 })
        #expect(finishes(within: 10) { a.stop() } != nil, "stop() hung behind a peer that stopped reading")
        stalled.resume()
        stalledEngine.close()
    }
}

/// Wraps a link so that its reader stops after the first message (it blocks in `onMessage`, so
/// the link stops reading its socket) until ``resume()``.
private final class StallingLink: MessageLink {
    let base: any MessageLink
    private let delivered = Atomic<Int>(0)
    private let stalled = Atomic<Bool>(false)
    private let gate = DispatchSemaphore(value: 0)

    init(_ base: any MessageLink) { self.base = base }

    var remotePeerKey: [UInt8] { base.remotePeerKey }
    var isInitiator: Bool { base.isInitiator }
    var remoteAddress: String { base.remoteAddress }
    var queuedBytes: Int { base.queuedBytes }
    /// Whether the reader is blocked.
    var isStalled: Bool { stalled.load(ordering: .acquiring) }

    func start(
        onMessage: @escaping @Sendable ([UInt8]) -> Void, onDrain: @escaping @Sendable () -> Void,
        onClose: @escaping @Sendable (String) -> Void
    ) {
        base.start(
            onMessage: { [self] message in
                if delivered.add(1, ordering: .relaxed).newValue > 1 {
                    stalled.store(true, ordering: .releasing)
                    gate.wait()
                    gate.signal()
                }
                onMessage(message)
            }, onDrain: onDrain, onClose: onClose)
    }

    func resume() { gate.signal() }
    func send(_ message: [UInt8]) throws -> Int { try base.send(message) }
    func close() { base.close() }
}

/// The socket inodes of accepted TCP connections on `localPort` (not the listener), from
/// /proc/net/tcp{,6}: a connection is listed there until both sides have closed it.
func acceptedSocketInodes(localPort: UInt16) -> Set<String> {
    var inodes: Set<String> = []
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        guard let text = try? String(contentsOfFile: table, encoding: .utf8) else { continue }
        for line in text.split(separator: "\n").dropFirst() {
            let fields = line.split(separator: " ")
            guard fields.count > 9, let colon = fields[1].lastIndex(of: ":"),
                UInt16(fields[1][fields[1].index(after: colon)...], radix: 16) == localPort,
                fields[3] != "0A", fields[9] != "0"
            else { continue }
            inodes.insert(String(fields[9]))
        }
    }
    return inodes
}

/// The sockets whose local or remote port is `port`: (local?, state, inode) counts, for failure
/// messages.
func socketStates(port: UInt16) -> [String: Int] {
    var counts: [String: Int] = [:]
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        guard let text = try? String(contentsOfFile: table, encoding: .utf8) else { continue }
        for line in text.split(separator: "\n").dropFirst() {
            let fields = line.split(separator: " ")
            guard fields.count > 9 else { continue }
            func portOf(_ field: Substring) -> UInt16? {
                field.lastIndex(of: ":").flatMap { UInt16(field[field.index(after: $0)...], radix: 16) }
            }
            let side = portOf(fields[1]) == port ? "local" : portOf(fields[2]) == port ? "remote" : nil
            guard let side else { continue }
            counts["\(side) st=\(fields[3]) inode=\(fields[9] == "0" ? "0" : "set")", default: 0] += 1
        }
    }
    return counts
}

/// How many of this process's descriptors (/proc/self/fd) refer to one of these socket inodes.
func descriptors(of inodes: Set<String>) -> Int {
    let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
    return descriptors.filter { fd in
        guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(fd)"),
            target.hasPrefix("socket:[")
        else { return false }
        return inodes.contains(String(target.dropFirst(8).dropLast()))
    }.count
}
