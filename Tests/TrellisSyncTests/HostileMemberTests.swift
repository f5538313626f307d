import Foundation
import Testing
import Trellis
import TrellisCore
import TrellisNet
import TrellisTestKit

/// Mesh members that hold the mesh key and try to make a node spend memory or work
/// (scripts/hostile_peer.py, on PyPI's `noiseprotocol` and `cbor2`): each attack ends in a
/// bounded effect while the node keeps serving an honest member (docs/SECURITY.md, "Limits").
@Suite(.serialized) struct HostileMemberTests {
    let dir = TemporaryDirectory("trellis-hostile")

    /// Six sessions each announce an 8 MiB message, send all of it but its last byte, and wait. The node holds at most its
    /// 16 MiB inbound buffer: it closes the sessions holding the most as they would go above it
    /// (closed as over-limit), an honest member syncs meanwhile, and once the hostile sessions are
    /// gone nothing is held.
    @Test func unfinishedMessagesStayWithinTheInboundBuffer() throws {
        let limit = 16 << 20
        var options = NodeOptions()
        options.inboundBufferBytes = limit
        let (node, meshKey) = try makeNode("a", options: options)
        defer { node.close() }
        let items = node.store.collection("items")
        for n in 0..<50 { _ = try items.upsert(["_id": .string("d\(n)"), "n": .int(Int64(n))]) }
        let port = try node.listen(on: Endpoint(host: "127.0.0.1", port: 0))

        let hostile = try Hostile(
            port: port, meshKey: meshKey, ["--unfinished", "6", "--size", String(8 << 20), "--hold", "60"])
        defer { hostile.stop() }
        let ready = try #require(hostile.waitForReady(), "hostile_peer.py did not get ready: \(hostile.errors)")
        print("hostile: \(ready)")
        #expect(
            eventually { ((try? node.status().linkCloses[.overLimit]) ?? 0) >= 4 },
            "48 MiB sent against a 16 MiB buffer: at least 4 of the 6 sessions closed")
        let status = try node.status()
        print(status.inboundBuffer)
        #expect(status.inboundBuffer.peak <= limit)
        #expect(status.inboundBuffer.limit == limit)

        // An honest member still gets everything.
        let (honest, _) = try makeNode("b", meshKey: meshKey)
        defer { honest.close() }
        let subscription = try honest.store.collection("items").findAll().subscribe()
        defer { subscription.cancel() }
        honest.connect(to: Endpoint(host: "127.0.0.1", port: port))
        #expect(eventually(timeout: 30) { (try? honest.store.collection("items").find("true").count()) == 50 })

        hostile.stop()
        #expect(eventually { (try? node.status().inboundBuffer.held) ?? 1 < 1 << 20 })
        #expect(try node.status().inboundBuffer.peak <= limit)
    }

    /// 1,024 subscriptions (the most a peer may have served) whose queries compare two fields, so
    /// every scan evaluates them row by row: an honest member's slice still arrives, as the
    /// node shares scan time among peers (docs/SECURITY.md, "Limits").
    @Test func expensiveSubscriptionsDoNotStarveAnHonestMember() throws {
        let (node, meshKey) = try makeNode("a")
        defer { node.close() }
        let documents: [Value] = (0..<5_000).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] }
        _ = try node.store.documents.upsert(documents, in: "items", writeStrategy: .merge)
        let port = try node.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let hostile = try Hostile(
            port: port, meshKey: meshKey, ["--subs", "1024", "--collection", "items", "--hold", "120"])
        defer { hostile.stop() }
        let ready = try #require(hostile.waitForReady(), "hostile_peer.py did not get ready: \(hostile.errors)")
        #expect(ready.contains("\"sessions\": 1"))

        let (honest, _) = try makeNode("b", meshKey: meshKey)
        defer { honest.close() }
        let subscription = try honest.store.collection("items").find("n < 100").subscribe()
        defer { subscription.cancel() }
        honest.connect(to: Endpoint(host: "127.0.0.1", port: port))
        #expect(eventually(timeout: 60) { (try? honest.store.collection("items").find("true").count()) == 100 })
        #expect(node.peers.count == 2, "the hostile member's session is kept: its load is shared, not refused")
    }

    /// 40 members dial a node that allows 8 sessions: the node's threads stay within two per
    /// session allowed (a reader and a writer) plus the handshakes in progress, however many dial.
    @Test func sessionsBeyondTheLimitDoNotGrowThreads() throws {
        var options = NodeOptions()
        options.maxSessions = 8
        let (node, meshKey) = try makeNode("a", options: options)
        defer { node.close() }
        let port = try node.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let before = threadCount()
        let hostile = try Hostile(port: port, meshKey: meshKey, ["--sessions", "40", "--hold", "60"])
        defer { hostile.stop() }
        let ready = try #require(hostile.waitForReady(), "hostile_peer.py did not get ready: \(hostile.errors)")
        print("hostile: \(ready)")
        #expect(eventually { node.peers.count <= 8 })
        #expect(eventually { threadCount() <= before + 2 * 8 + 4 }, "threads: \(before) before, \(threadCount()) now")
    }

    /// The attacks of a hostile LAN, one after the other, against a node serving an honest member
    /// throughout: random bytes on its TCP port, random datagrams on its discovery port, dialers
    /// under another mesh key, members announcing a newer protocol version, a member asking for
    /// 5,000 subscriptions, members holding unfinished messages. Each ends in refusal or a bounded
    /// effect (the node's counters show which), and while it lasts a document written on the
    /// node reaches the honest member.
    @Test func aNodeKeepsServingAnHonestMemberThroughEveryAttack() throws {
        let meshKey = MeshKey.generate()
        let discoveryPort = try TrellisProcess.freePort()
        var options = NodeOptions()
        options.discovery = DiscoveryOptions(port: discoveryPort, scope: .loopback)
        options.inboundBufferBytes = 32 << 20
        let (node, _) = try makeNode("a", meshKey: meshKey, options: options)
        defer { node.close() }
        let port = try node.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let (honest, _) = try makeNode("b", meshKey: meshKey)
        defer { honest.close() }
        let subscription = try honest.store.collection("items").findAll().subscribe()
        defer { subscription.cancel() }
        honest.connect(to: Endpoint(host: "127.0.0.1", port: port))

        var written = 0
        func served(during attack: String) {
            written += 1
            let id = Value.string("during-\(written)")
            _ = try? node.store.collection("items").upsert(["_id": id, "attack": .string(attack)])
            #expect(
                eventually(timeout: 30) { (try? honest.store.collection("items").findByID(id).exec()) != nil },
                "the honest member did not get a document written during: \(attack)")
        }
        served(during: "no attack")
        let attacks: [(name: String, key: MeshKey, arguments: [String])] = [
            ("random bytes on the TCP port", meshKey, ["--raw", "20"]),
            ("random datagrams on the discovery port", meshKey, ["--udp", "500", "--udp-port", "\(discoveryPort)"]),
            ("dialers under another mesh key", MeshKey.generate(), ["--sessions", "5"]),
            ("members announcing protocol version 99", meshKey, ["--sessions", "3", "--hello-version", "99"]),
            ("a member asking for 5,000 subscriptions", meshKey, ["--subs", "5000", "--collection", "items"]),
            ("members holding unfinished messages", meshKey, ["--unfinished", "6", "--size", String(16 << 20)]),
        ]
        for attack in attacks {
            let hostile = try Hostile(port: port, meshKey: attack.key, attack.arguments + ["--hold", "60"])
            let ready = hostile.waitForReady()
            print("\(attack.name): \(ready ?? "no ready line: \(hostile.errors)")")
            #expect(ready != nil, "\(attack.name): hostile_peer.py did not get ready")
            served(during: attack.name)
            hostile.stop()
        }
        served(during: "nothing, after every attack")

        let status = try node.status()
        print(status.description)
        #expect(status.handshakes.wrongKey >= 5, "dialers under another mesh key are counted")
        #expect(status.linkCloses[.overLimit, default: 0] >= 1, "unfinished messages beyond the buffer are cut")
        #expect(status.inboundBuffer.peak <= 32 << 20)
        let discovery = try #require(node.discoveryStatistics)
        // Loopback drops some of a burst of 500; those read are refused, none taken for a beacon.
        #expect(discovery.rejected + discovery.dropped >= 50, "random datagrams are counted: \(discovery)")
        #expect(discovery.accepted == 0, "no random datagram is taken for a beacon: \(discovery)")
        // The last attacker was just stopped: its session ends when the node reads the close.
        #expect(
            eventually(timeout: 30) { node.peers.map(\.peerKey) == [honest.identity.publicKey] },
            "only the honest member is left: \(node.peers.map(\.address))")
    }

    /// The threads of this process (Linux: /proc/self/status).
    func threadCount() -> Int {
        let status = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("Threads:") } ?? ""
        return Int(line.split(separator: "\t").last?.trimmingCharacters(in: .whitespaces) ?? "") ?? 0
    }

    /// A node and its mesh key (a new key unless given).
    func makeNode(_ name: String, meshKey: MeshKey? = nil, options: NodeOptions = NodeOptions()) throws -> (
        TrellisNode, MeshKey
    ) {
        let key = meshKey ?? MeshKey.generate()
        return (try TrellisNode(directory: dir.url.appendingPathComponent(name), meshKey: key, options: options), key)
    }
}

/// scripts/hostile_peer.py running against a node, its standard output read as it comes.
private final class Hostile: @unchecked Sendable {
    let process: Process
    private let output = Pipe()
    private let errorPipe = Pipe()
    private var received = ""

    init(port: UInt16, meshKey: MeshKey, _ arguments: [String]) throws {
        let keyFile = FileManager.default.temporaryDirectory.appendingPathComponent("hostile-\(UUID()).key")
        try meshKey.write(to: keyFile)
        defer { try? FileManager.default.removeItem(at: keyFile) }
        let hex = try String(contentsOf: keyFile, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        process = pythonScript("hostile_peer.py", ["--port", String(port), "--psk", hex] + arguments)
        process.standardOutput = output
        process.standardError = errorPipe
        try process.run()
    }

    /// The `ready` line, or `nil` when the script ended or 60 s passed first.
    func waitForReady() -> String? {
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            if let line = received.split(separator: "\n").first(where: { $0.contains("\"ready\"") }) {
                return String(line)
            }
            let data = output.fileHandleForReading.availableData
            if data.isEmpty { return nil }
            received += String(decoding: data, as: UTF8.self)
        }
        return nil
    }

    /// Its standard error so far (after it ended).
    var errors: String {
        process.isRunning ? "" : String(decoding: errorPipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    }

    /// Kills it (its sockets close without the authenticated close) and waits for it.
    func stop() {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }
}
