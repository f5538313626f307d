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

        // Presence: B is a direct, discovered, compatible peer of A.
        #expect(
            eventually {
                a.presence.graph.remotePeers.map { "\($0.peerKeyString) \($0.hops ?? -1) \($0.isDiscovered)" }
                    == ["\(b.peerKeyHex) 1 true"]
            }, "\(a.presence.graph)")
        #expect(a.presence.graph.remotePeers.first?.isCompatible == true)

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

    /// A peer heard by discovery with no session (here: it does not listen, so it cannot be
    /// dialed) is in the presence graph all the same, and it stays there while its beacons
    /// arrive: no flapping.
    @Test func aDiscoveredPeerWithoutASessionIsPresent() throws {
        let key = MeshKey.generate()
        var options = NodeOptions()
        options.discovery = DiscoveryOptions(port: try TrellisProcess.freePort(), scope: .loopback)
        let a = try TrellisNode(directory: dir.url.appendingPathComponent("pa"), meshKey: key, options: options)
        let b = try TrellisNode(directory: dir.url.appendingPathComponent("pb"), meshKey: key, options: options)
        defer {
            a.close()
            b.close()
        }
        let seen = Mutex<[Int]>([])
        let observer = a.presence.observe { graph in seen.withLock { $0.append(graph.remotePeers.count) } }
        defer { observer.stop() }
        #expect(
            eventually {
                a.presence.graph.remotePeers.map { "\($0.peerKeyString) \($0.hops == nil) \($0.isDiscovered)" }
                    == ["\(b.peerKeyHex) true true"]
            }, "\(a.presence.graph)")
        #expect(a.presence.graph.description.contains("discovered, no session"))
        #expect(a.peers.isEmpty)
        // Several beacon intervals later it is still there, and the observer was not told of
        // any change in between (a refreshed beacon is not a change).
        usleep(2_500_000)
        #expect(a.presence.graph.remotePeers.count == 1)
        let told = seen.withLock { $0 }
        #expect(told.last == 1 && told.filter { $0 == 1 }.count == 1, "\(told)")
    }
}

/// What a discovery observer was told: the cache size each time.
final class Notifications: Sendable {
    let counts = Mutex<[Int]>([])
}
