import Foundation
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
            MeshNetwork(engine: engine, identity: identity, meshKey: meshKey, handshakeTimeout: handshakeTimeout), store
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
}
