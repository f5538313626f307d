import Foundation
import Synchronization
import Testing
import Trellis
import TrellisNet
import TrellisSync
import TrellisTestKit

/// Admission (docs/SECURITY.md, "Admission"): by allowlist, a node given peer keys has sessions
/// with those peers only, whoever dials, and says whom it refused and how to admit them; by trust
/// on first use, it pins keys to device names and refuses a changed key; a connection-request
/// handler decides within a timeout; refused peers may wait for the user's `trust`.
@Suite struct AdmissionTests {
    final class Lines: Sendable { let lines = Mutex<[String]>([]) }

    let dir = TemporaryDirectory("trellis-admission")
    let meshKey = MeshKey.generate()

    func node(
        _ name: String, log: Lines? = nil, _ configure: (inout NodeOptions) -> Void = { _ in }
    ) throws -> TrellisNode {
        var options = NodeOptions()
        if let log { options.log = { line in log.lines.withLock { $0.append(line) } } }
        configure(&options)
        return try TrellisNode(directory: dir.url.appendingPathComponent(name), meshKey: meshKey, options: options)
    }

    @Test func onlyAllowedPeersGetASessionInboundAndOutbound() throws {
        let b = try node("b")
        defer { b.close() }
        let c = try node("c")
        defer { c.close() }
        let log = Lines()
        func logged(_ text: String) -> Bool { log.lines.withLock { $0.contains { $0.contains(text) } } }
        let a = try node("a", log: log) { $0.admission = .allowlist([b.identity.publicKey]) }
        defer { a.close() }
        try a.store.collection("items").upsert(["_id": "x"])
        let port = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        var subscriptions: [Subscription] = []
        for peer in [b, c] {
            subscriptions.append(try peer.store.collection("items").findAll().subscribe())
            peer.connect(to: Endpoint(host: "127.0.0.1", port: port))
        }
        #expect(eventually { (try? b.store.collection("items").findByID("x").exec()) != nil })
        #expect(eventually { logged("refused peer \(c.peerKeyHex)") && logged("not on the allowlist") })
        #expect(try c.store.collection("items").findByID("x").exec() == nil)
        #expect(a.peers.map { $0.keyHex } == [b.peerKeyHex])

        // Dialing out: a peer not on the list is refused as well.
        let d = try node("d")
        defer { d.close() }
        let dPort = try d.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        a.connect(to: Endpoint(host: "127.0.0.1", port: dPort))
        #expect(eventually { logged("refused peer \(d.peerKeyHex)") })
        #expect(!a.peers.contains { $0.keyHex == d.peerKeyHex })

        // Admitting C: its next dial gets a session and the data.
        a.setAllowedPeers([b.identity.publicKey, c.identity.publicKey])
        #expect(eventually(timeout: 60) { (try? c.store.collection("items").findByID("x").exec()) != nil })
        subscriptions.forEach { $0.cancel() }
    }

    /// Opens a node on a directory a closed node used, once that node has let it go.
    func reopen(
        _ name: String, log: Lines? = nil, _ configure: @escaping (inout NodeOptions) -> Void = { _ in }
    ) throws -> TrellisNode {
        var opened: TrellisNode?
        var failure = ""
        _ = eventually {
            do { opened = try node(name, log: log, configure) } catch { failure = "\(error)" }
            return opened != nil
        }
        return try #require(opened, "\(failure)")
    }

    func has(_ node: TrellisNode, _ id: String) -> Bool {
        (try? node.store.collection("items").findByID(.string(id)).exec()) != nil
    }

    @Test func trustOnFirstUsePinsANameRefusesAChangedKeyAndSurvivesRestart() throws {
        let log = Lines()
        func logged(_ text: String) -> Bool { log.lines.withLock { $0.contains { $0.contains(text) } } }
        var a: TrellisNode? = try node("a", log: log) { $0.admission = .trustOnFirstUse }
        try a!.store.collection("items").upsert(["_id": "x"])
        let port = try a!.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let endpoint = Endpoint(host: "127.0.0.1", port: port)

        // First sight: "laptop" is pinned to B's key, and B syncs.
        var b: TrellisNode? = try node("b") { $0.deviceName = "laptop" }
        let bKey = b!.identity.publicKey
        var bSubscription: Subscription? = try b!.store.collection("items").findAll().subscribe()
        b!.connect(to: endpoint)
        #expect(eventually { has(b!, "x") })
        #expect(a!.pins == [PeerPin(name: "laptop", peerKey: bKey)])
        #expect(a!.deviceName(of: bKey) == "laptop")
        let pinsFile = dir.url.appendingPathComponent("a/known-peers").path
        let text = try String(contentsOfFile: pinsFile, encoding: .utf8)
        #expect(text.contains("\(b!.peerKeyHex) laptop\n"))
        var info = stat()
        #expect(stat(pinsFile, &info) == 0 && info.st_mode & 0o777 == 0o600)

        // Another key presenting "laptop" is refused, the log naming both keys and the fix.
        let c = try node("c") { $0.deviceName = "laptop" }
        defer { c.close() }
        let cSubscription = try c.store.collection("items").findAll().subscribe()
        defer { cSubscription.cancel() }
        c.connect(to: endpoint)
        #expect(
            eventually {
                logged("refused peer \(c.peerKeyHex)") && logged("pinned to key \(b!.peerKeyHex)")
                    && logged("`trust \(c.peerKeyHex)`") && logged("distrust laptop")
            })
        #expect(!has(c, "x"))

        // The pin survives a restart: C is still refused, B still admitted.
        a!.close()
        a = nil
        log.lines.withLock { $0.removeAll() }
        a = try reopen("a", log: log) { $0.admission = .trustOnFirstUse }
        #expect(a!.pins == [PeerPin(name: "laptop", peerKey: bKey)])
        try a!.listen(on: endpoint)
        #expect(eventually(timeout: 60) { logged("refused peer \(c.peerKeyHex)") })
        #expect(!has(c, "x"))

        // `trust` re-pins the name to C's key (the name it was seen with); C syncs.
        let result = try a!.trust(peerKey: c.identity.publicKey)
        #expect(result.contains("pinned \"laptop\""))
        #expect(a!.pins == [PeerPin(name: "laptop", peerKey: c.identity.publicKey)])
        #expect(eventually(timeout: 60) { has(c, "x") })

        // `distrust laptop` forgets the pin and closes C's session; the next key presenting
        // "laptop" is pinned: B, restarted, gets it back (C is stopped first).
        c.stopSync()
        let done = try a!.distrust(name: "laptop")
        #expect(done.contains("forgot the pins"))
        #expect(a!.pins.isEmpty)
        bSubscription?.cancel()
        bSubscription = nil
        b!.close()
        b = nil
        b = try reopen("b") { $0.deviceName = "laptop" }
        bSubscription = try b!.store.collection("items").findAll().subscribe()
        b!.connect(to: endpoint)
        #expect(eventually(timeout: 60) { a!.pins == [PeerPin(name: "laptop", peerKey: bKey)] })
        #expect(eventually { a!.peers.contains { $0.peerKey == bKey } })
        bSubscription?.cancel()
        b?.close()
        a?.close()
    }

    @Test func trustOnFirstUseRefusesAPeerWithoutANameUnlessTrustedByKey() throws {
        let log = Lines()
        func logged(_ text: String) -> Bool { log.lines.withLock { $0.contains { $0.contains(text) } } }
        let a = try node("a", log: log) { $0.admission = .trustOnFirstUse }
        defer { a.close() }
        try a.store.collection("items").upsert(["_id": "x"])
        let port = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let b = try node("b")
        defer { b.close() }
        let subscription = try b.store.collection("items").findAll().subscribe()
        defer { subscription.cancel() }
        b.connect(to: Endpoint(host: "127.0.0.1", port: port))
        #expect(eventually { logged("refused peer \(b.peerKeyHex)") && logged("advertises no device name") })
        #expect(try a.trust(peerKey: b.identity.publicKey).contains("trusted \(b.peerKeyHex) by key"))
        #expect(eventually(timeout: 60) { has(b, "x") })
    }

    @Test func deviceNamesAreChecked() throws {
        #expect(throws: DeviceNameError.self) { try node("bad") { $0.deviceName = "two\nlines" } }
        #expect(throws: DeviceNameError.self) { try node("long") { $0.deviceName = String(repeating: "é", count: 33) } }
        #expect(throws: DeviceNameError.self) { try node("space") { $0.deviceName = " laptop" } }
        #expect(throws: DeviceNameError.self) {
            try HandshakePayload.decodeDeviceName([0xA1, 0x64] + Array("name".utf8) + [0x01])
        }
        #expect(throws: DeviceNameError.self) { try HandshakePayload.decodeDeviceName([0x01]) }
        #expect(throws: DeviceNameError.self) {
            try HandshakePayload.decodeDeviceName([UInt8](repeating: 0x60, count: 2000))
        }
        #expect(try HandshakePayload.decodeDeviceName([]) == nil)
        #expect(
            try HandshakePayload.decodeDeviceName(HandshakePayload.encode(deviceName: "Ada's phone")) == "Ada's phone")
        // Unknown fields are ignored, for later versions.
        #expect(try HandshakePayload.decodeDeviceName([0xA1, 0x61, 0x7A, 0x01]) == nil)
        // A pins file with a bad line is refused with its path and line.
        #expect(throws: DeviceNameError.self) { try PinFile.parse("# c\nnot-a-key laptop\n", path: "p") }
        let key = String(repeating: "ab", count: 32)
        #expect(throws: DeviceNameError.self) { try PinFile.parse("\(key) x\n\(key) x\n", path: "p") }
        #expect(try PinFile.parse("\(key) my laptop\n\n\(key)\n", path: "p").map(\.name) == ["my laptop", nil])
    }

    /// Random and mutated handshake payloads: never a trap, and a name accepted obeys the rules.
    @Test func randomHandshakePayloadsAreRefusedOrGiveAValidName() throws {
        var (random, seed) = SeededRandom.fromEnvironment(default: 0x7472_7573_7421)
        print("AdmissionTests.randomHandshakePayloads: seed \(seed) (replay with TRELLIS_SEED=\(seed))")
        let genuine = HandshakePayload.encode(deviceName: "kitchen tablet")
        var accepted = 0
        for round in 0..<20_000 {
            var bytes: [UInt8]
            if round % 2 == 0 {
                bytes = genuine
                for _ in 0..<Int.random(in: 1...4, using: &random) {
                    let index = Int.random(in: 0..<bytes.count, using: &random)
                    bytes[index] = UInt8.random(in: 0...255, using: &random)
                }
            } else {
                bytes = (0..<Int.random(in: 0...40, using: &random)).map { _ in
                    UInt8.random(in: 0...255, using: &random)
                }
            }
            guard let name = try? HandshakePayload.decodeDeviceName(bytes) else { continue }
            accepted += 1
            try DeviceName.check(name)
        }
        #expect(accepted > 0)
    }

    /// Answers held back until the test lets them go: a handler that "never" answers.
    final class Held: Sendable {
        let continuations = Mutex<[CheckedContinuation<ConnectionDecision, Never>]>([])
        func wait() async -> ConnectionDecision {
            await withCheckedContinuation { continuation in continuations.withLock { $0.append(continuation) } }
        }
        func release() {
            continuations.withLock {
                $0.forEach { $0.resume(returning: .deny) }
                $0.removeAll()
            }
        }
    }

    @Test func connectionRequestHandlerAllowsDeniesAndSeesTheRequest() throws {
        let log = Lines()
        func logged(_ text: String) -> Bool { log.lines.withLock { $0.contains { $0.contains(text) } } }
        let seen = Mutex<[ConnectionRequest]>([])
        let a = try node("a", log: log) {
            $0.connectionRequestHandler = { request in
                seen.withLock { $0.append(request) }
                return request.deviceName == "friend" ? .allow : .deny
            }
        }
        defer { a.close() }
        try a.store.collection("items").upsert(["_id": "x"])
        let port = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let b = try node("b") { $0.deviceName = "friend" }
        defer { b.close() }
        let c = try node("c") { $0.deviceName = "stranger" }
        defer { c.close() }
        var subscriptions: [Subscription] = []
        for peer in [b, c] {
            subscriptions.append(try peer.store.collection("items").findAll().subscribe())
            peer.connect(to: Endpoint(host: "127.0.0.1", port: port))
        }
        #expect(eventually { has(b, "x") })
        #expect(
            eventually { logged("refused peer \(c.peerKeyHex)") && logged("denied by the connection-request handler") })
        #expect(!has(c, "x"))
        let first = try #require(seen.withLock { $0.first { $0.peerKey == b.identity.publicKey } })
        #expect(first.direction == .inbound && first.deviceName == "friend" && first.address.hasPrefix("127.0.0.1:"))

        // Outbound too, and the handler composes with the mode: the mode refuses first.
        let d = try node("d") { $0.deviceName = "friend" }
        defer { d.close() }
        let dPort = try d.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        a.admissionMode = .allowlist([b.identity.publicKey])
        a.connect(to: Endpoint(host: "127.0.0.1", port: dPort))
        #expect(eventually { logged("refused peer \(d.peerKeyHex)") && logged("not on the allowlist") })
        #expect(!seen.withLock { $0.contains { $0.peerKey == d.identity.publicKey } })
        a.admissionMode = .meshKey
        #expect(
            eventually(timeout: 60) {
                seen.withLock { $0.contains { $0.peerKey == d.identity.publicKey && $0.direction == .outbound } }
                    && a.peers.contains { $0.peerKey == d.identity.publicKey }
            })
        subscriptions.forEach { $0.cancel() }
    }

    @Test func aHandlerThatNeverAnswersCostsOnePendingPlaceUntilTheTimeout() throws {
        let log = Lines()
        func logged(_ text: String) -> Bool { log.lines.withLock { $0.contains { $0.contains(text) } } }
        let held = Held()
        defer { held.release() }
        let a = try node("a", log: log) {
            $0.admissionPolicy.decisionTimeout = .seconds(3)
            $0.connectionRequestHandler = { request in
                request.deviceName == "silent" ? await held.wait() : .allow
            }
        }
        defer { a.close() }
        try a.store.collection("items").upsert(["_id": "x"])
        let port = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let silent = try node("silent") { $0.deviceName = "silent" }
        defer { silent.close() }
        silent.connect(to: Endpoint(host: "127.0.0.1", port: port))
        #expect(
            eventually {
                a.pendingConnections.contains {
                    $0.request.peerKey == silent.identity.publicKey && $0.awaiting == .handler && $0.secondsLeft <= 3
                }
            })
        #expect(a.presence.pendingConnections.contains { $0.request.deviceName == "silent" })

        // Meanwhile another peer connects and syncs.
        let b = try node("b") { $0.deviceName = "b" }
        defer { b.close() }
        let subscription = try b.store.collection("items").findAll().subscribe()
        defer { subscription.cancel() }
        b.connect(to: Endpoint(host: "127.0.0.1", port: port))
        #expect(eventually { has(b, "x") })

        // The silent handler's peer is denied at the timeout and never gets a session.
        #expect(eventually { logged("refused peer \(silent.peerKeyHex)") && logged("did not answer within") })
        #expect(!a.peers.contains { $0.peerKey == silent.identity.publicKey })
    }

    @Test func aNameIsPinnedOnlyWhenTheHandlerAdmitsThePeer() throws {
        let log = Lines()
        func logged(_ text: String) -> Bool { log.lines.withLock { $0.contains { $0.contains(text) } } }
        let a = try node("a", log: log) {
            $0.admission = .trustOnFirstUse
            $0.connectionRequestHandler = { _ in .deny }
        }
        defer { a.close() }
        let port = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let b = try node("b") { $0.deviceName = "laptop" }
        defer { b.close() }
        b.connect(to: Endpoint(host: "127.0.0.1", port: port))
        #expect(
            eventually { logged("refused peer \(b.peerKeyHex)") && logged("denied by the connection-request handler") })
        #expect(a.pins.isEmpty)
        a.presence.connectionRequestHandler = nil
        #expect(eventually(timeout: 60) { a.pins == [PeerPin(name: "laptop", peerKey: b.identity.publicKey)] })
        #expect(eventually { a.peers.contains { $0.peerKey == b.identity.publicKey } })
    }

    @Test func connectionsBeyondThePendingLimitAreDeniedAtOnce() throws {
        let log = Lines()
        func logged(_ text: String) -> Bool { log.lines.withLock { $0.contains { $0.contains(text) } } }
        let asked = Mutex(0)
        let a = try node("a", log: log) {
            $0.admissionPolicy.maxPending = 0
            $0.connectionRequestHandler = { _ in
                asked.withLock { $0 += 1 }
                return .allow
            }
        }
        defer { a.close() }
        let port = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let b = try node("b")
        defer { b.close() }
        b.connect(to: Endpoint(host: "127.0.0.1", port: port))
        #expect(eventually { logged("refused peer \(b.peerKeyHex)") && logged("0 connections already wait") })
        #expect(asked.withLock { $0 } == 0)
        #expect(a.peers.isEmpty)
    }

    @Test func aRefusedPeerParkedAsPendingIsAdmittedByTrust() throws {
        let log = Lines()
        func logged(_ text: String) -> Bool { log.lines.withLock { $0.contains { $0.contains(text) } } }
        let a = try node("a", log: log) {
            $0.admission = .allowlist([])
            $0.admissionPolicy.parkRefused = true
            $0.admissionPolicy.decisionTimeout = .seconds(10)
        }
        defer { a.close() }
        try a.store.collection("items").upsert(["_id": "x"])
        let port = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let c = try node("c") { $0.deviceName = "tablet" }
        defer { c.close() }
        let subscription = try c.store.collection("items").findAll().subscribe()
        defer { subscription.cancel() }
        c.connect(to: Endpoint(host: "127.0.0.1", port: port))
        #expect(
            eventually { a.pendingConnections.contains { $0.request.deviceName == "tablet" && $0.awaiting == .user } })
        #expect(logged("waiting") && logged("trust \(c.peerKeyHex)"))
        let result = try a.trust(name: "tablet")
        #expect(result.contains("added \(c.peerKeyHex) to the allowlist"))
        #expect(a.admissionMode == .allowlist([c.identity.publicKey]))
        #expect(eventually(timeout: 60) { has(c, "x") })
        #expect(a.pendingConnections.isEmpty)

        // `distrust` removes it and closes its session.
        let done = try a.distrust(peerKey: c.identity.publicKey)
        #expect(done.contains("removed") && done.contains("closed 1 session"))
        #expect(eventually { !a.peers.contains { $0.peerKey == c.identity.publicKey } })
    }
}
