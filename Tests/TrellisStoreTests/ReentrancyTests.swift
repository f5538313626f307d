import Foundation
import Synchronization
import Testing
import Trellis
import TrellisCore
import TrellisStore
import TrellisTestKit

/// User code never runs under the store lock or on the engine's queue, and the data directory's
/// lock lives as long as anything can write (issue 8 item 16).
@Suite struct ReentrancyTests {
    let dir = TemporaryDirectory("trellis-reentrancy")
    let key = MeshKey.generate()

    func node(_ name: String) throws -> TrellisNode {
        try TrellisNode(directory: dir.url.appendingPathComponent(name), meshKey: key)
    }

    final class Calls: Sendable {
        let count = Atomic<Int>(0)
        let peersSeen = Atomic<Int>(0)
    }

    /// A store observer that calls back into the store and the sync engine while a remote batch
    /// is merged on the engine's queue does not deadlock: observers run on the store's own queue.
    @Test func anObserverMayCallTheStoreAndTheEngine() throws {
        let a = try node("a")
        let b = try node("b")
        let port = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let subscription = try b.store.collection("c").findAll().subscribe()
        let calls = Calls()
        let token = b.store.documents.addObserver { [weak b] _ in
            guard let b else { return }
            calls.peersSeen.store(b.peers.count, ordering: .relaxed)  // waits on the engine's queue
            _ = try? b.store.documents.count(in: "c")  // takes the store lock
            _ = b.subscriptions
            calls.count.add(1, ordering: .relaxed)
        }
        defer { b.store.documents.removeObserver(token) }
        b.connect(to: Endpoint(host: "127.0.0.1", port: port))
        try a.store.collection("c").upsert(["_id": "x", "v": 1])
        #expect(eventually { (try? b.store.collection("c").findByID("x").exec()) != nil })
        #expect(eventually { calls.count.load(ordering: .relaxed) > 0 })
        #expect(calls.peersSeen.load(ordering: .relaxed) == 1)
        // And the node still answers afterwards.
        try a.store.collection("c").upsert(["_id": "y", "v": 2])
        #expect(eventually { (try? b.store.documents.count(in: "c")) == 2 })
        withExtendedLifetime(subscription) {}
        a.stop()
        b.stop()
    }

    /// The filter of `documents(in:where:)` runs outside the store lock, so it may read the store.
    @Test func aFilterMayReadTheStore() throws {
        let store = try node("s").store.documents
        try store.upsert([["_id": "a", "ref": "b"], ["_id": "b"], ["_id": "c", "ref": "zz"]], in: "c")
        let withTarget = try store.documents(in: "c") { doc in
            guard let ref = doc["ref"] else { return false }
            return try store.document(id: ref, in: "c") != nil
        }
        #expect(withTarget.compactMap { $0["_id"] } == ["a"])
    }

    /// A node dropped without `stop()` keeps the directory locked while anything can still write
    /// through its store: a second node on the directory is refused until the first store is
    /// gone, never opened beside it.
    @Test func aDroppedNodeNeverLeavesTwoWriters() throws {
        let peer = try node("peer")
        let port = try peer.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        weak var firstStore: DocumentStore?
        do {
            let first = try node("shared")
            firstStore = first.store.documents
            _ = try first.listen(on: Endpoint(host: "127.0.0.1", port: 0))
            first.connect(to: Endpoint(host: "127.0.0.1", port: port))
            try first.store.collection("c").upsert(["_id": "x"])
            #expect(eventually { !first.peers.isEmpty })
            // Dropped here, without stop().
        }
        var second: TrellisNode?
        var refusals: [String] = []
        let opened = eventually {
            do {
                second = try node("shared")
                return true
            } catch {
                refusals.append("\(error)")
                return false
            }
        }
        #expect(opened && second != nil)
        #expect(refusals.allSatisfy { $0.contains("in use") }, "\(refusals)")
        #expect(firstStore == nil)  // the lock was released only once the first store was gone
        #expect(try second?.store.collection("c").findByID("x").exec() != nil)
        peer.stop()
    }
}
