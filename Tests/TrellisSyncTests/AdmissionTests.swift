import Foundation
import Synchronization
import Testing
import Trellis
import TrellisNet
import TrellisTestKit

/// Admission by allowlist (docs/SECURITY.md, "Admission"): a node given peer keys has sessions
/// with those peers only, whoever dials, and says whom it refused and how to admit them.
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
        let a = try node("a", log: log) { $0.allowedPeers = [b.identity.publicKey] }
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
}
