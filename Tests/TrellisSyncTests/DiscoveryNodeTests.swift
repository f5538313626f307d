import Foundation
import Synchronization
import Testing
import Trellis
import TrellisTestKit

/// Library nodes with discovery confined to loopback: they find each other without addresses,
/// expose what they found (`discoveredPeers`), and follow `stopSync()` / `startSync()`.
@Suite(.serialized) struct DiscoveryNodeTests {
    let dir = TemporaryDirectory("trellis-discovery-nodes")

    @Test func twoNodesFindEachOtherAndStopSyncPausesDiscovery() throws {
        let key = MeshKey.generate()
        var options = NodeOptions()
        options.discovery = DiscoveryOptions(port: try TrellisProcess.freePort(), scope: .loopback)
        let a = try TrellisNode(directory: dir.url.appendingPathComponent("a"), meshKey: key, options: options)
        let b = try TrellisNode(directory: dir.url.appendingPathComponent("b"), meshKey: key, options: options)
        let notified = Notifications()
        a.observeDiscovery { peers in notified.counts.withLock { $0.append(peers.count) } }
        // Discovery started before either listened: their first beacons say port 0 (not
        // dialable); listening puts the port in the next beacons.
        let portB = try b.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        _ = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        #expect(eventually { a.discoveredPeers.first?.endpoint == "127.0.0.1:\(portB)" }, "\(a.discoveredPeers)")
        let found = try #require(a.discoveredPeers.first)
        #expect(found.peerKey == b.identity.publicKey)
        #expect(found.isCompatible)
        #expect(found.addresses == ["127.0.0.1"])
        #expect(eventually { a.peers.count == 1 && b.peers.count == 1 }, "a: \(a.peers), b: \(b.peers)")

        try a.store.collection("notes").upsert(["_id": "n1", "text": "hello"])
        let subscription = try b.store.collection("notes").find("true").subscribe()
        #expect(eventually { (try? b.store.collection("notes").findByID("n1").exec()) != nil })

        #expect(notified.counts.withLock { $0.last } == 1)
        a.stopSync()
        #expect(notified.counts.withLock { $0.last } == 0, "stopping discovery empties the cache")
        #expect(a.discoveredPeers.isEmpty)
        #expect(a.discoveryStatistics == nil)
        #expect(eventually { b.peers.isEmpty })
        try a.startSync()
        #expect(a.discoveryStatistics != nil)
        #expect(eventually { a.peers.count == 1 && b.peers.count == 1 })
        withExtendedLifetime(subscription) {}
        a.close()
        b.close()
    }
}

/// What a discovery observer was told: the cache size each time.
final class Notifications: Sendable {
    let counts = Mutex<[Int]>([])
}
