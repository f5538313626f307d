import Foundation
import Synchronization
import Testing
import Trellis
import TrellisCore
import TrellisTestKit

/// `startSync()` / `stopSync()`, as in Ditto: repeatable, on either side of a session.
@Suite struct LifecycleTests {
    let dir = TemporaryDirectory()

    func node(_ name: String, _ key: MeshKey) throws -> TrellisNode {
        try TrellisNode(directory: dir.url.appendingPathComponent(name), meshKey: key)
    }

    func has(_ node: TrellisNode, _ id: String) -> Bool {
        (try? node.store.collection("c").findByID(.string(id)).exec()) != nil
    }

    /// The receiver stops and starts three times; the sender stops and starts (listening again
    /// on its port) twice. Writes made while stopped arrive after the next start, nothing arrives
    /// while stopped, and each stop closes every session.
    @Test func syncStopsAndStartsAgainOnEitherSide() throws {
        let key = MeshKey.generate()
        let a = try node("a", key)
        let b = try node("b", key)
        defer {
            a.close()
            b.close()
        }
        let port = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let subscription = try b.store.collection("c").findAll().subscribe()
        defer { subscription.cancel() }
        b.connect(to: Endpoint(host: "127.0.0.1", port: port))
        #expect(a.isSyncActive && b.isSyncActive)
        try a.store.collection("c").upsert(["_id": "first"])
        #expect(eventually { has(b, "first") })

        for round in 0..<3 {
            b.stopSync()
            #expect(!b.isSyncActive)
            #expect(b.peers.isEmpty)
            #expect(eventually { a.peers.isEmpty }, "round \(round): A still has a session after B stopped")
            try a.store.collection("c").upsert(["_id": .string("while-b-stopped-\(round)")])
            try b.startSync()
            try b.startSync()  // harmless when active
            #expect(b.isSyncActive)
            #expect(eventually { has(b, "while-b-stopped-\(round)") }, "round \(round)")
        }
        for round in 0..<2 {
            a.stopSync()
            #expect(eventually { b.peers.isEmpty })
            try a.store.collection("c").upsert(["_id": .string("while-a-stopped-\(round)")])
            try a.startSync()  // listens on the same port again; B's dials find it
            #expect(eventually(timeout: 30) { has(b, "while-a-stopped-\(round)") }, "round \(round)")
        }
    }

    /// A static peer added while sync is stopped is dialed at the next start, not before.
    @Test func aPeerAddedWhileStoppedIsDialedAtStart() throws {
        let key = MeshKey.generate()
        let a = try node("a", key)
        let b = try node("b", key)
        defer {
            a.close()
            b.close()
        }
        let port = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        try a.store.collection("c").upsert(["_id": "x"])
        b.stopSync()
        let subscription = try b.store.collection("c").findAll().subscribe()
        defer { subscription.cancel() }
        b.connect(to: Endpoint(host: "127.0.0.1", port: port))
        #expect(b.peers.isEmpty && a.peers.isEmpty)
        try b.startSync()
        #expect(eventually { has(b, "x") })
    }

    /// A closed node cannot be started again: the error says so.
    @Test func aClosedNodeSaysItCannotStart() throws {
        let a = try node("a", .generate())
        a.close()
        #expect(throws: (any Error).self) { try a.startSync() }
        #expect(!a.isSyncActive)
    }
}

/// `node.sync.status` and its observer over real sockets.
@Suite struct NodeSyncStatusTests {
    let dir = TemporaryDirectory()

    /// An observer registered when the node starts sees a peer connect and leave, also when
    /// neither side subscribes to anything (a node that only serves).
    @Test func theObserverSeesAPeerWithoutSubscriptionsComeAndGo() throws {
        let key = MeshKey.generate()
        let a = try TrellisNode(directory: dir.url.appendingPathComponent("a2"), meshKey: key)
        let b = try TrellisNode(directory: dir.url.appendingPathComponent("b2"), meshKey: key)
        defer { a.close() }
        let seen = Mutex<[Int]>([])
        let observer = a.sync.observeStatus { status in seen.withLock { $0.append(status.peers.count) } }
        defer { observer.stop() }
        let port = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        b.connect(to: Endpoint(host: "127.0.0.1", port: port))
        #expect(eventually { a.sync.status.peers.count == 1 })
        #expect(eventually { seen.withLock { $0.last == 1 } }, "\(seen.withLock { $0 })")
        b.close()
        #expect(eventually { seen.withLock { $0.last == 0 } }, "\(seen.withLock { $0 })")
    }

    @Test func statusShowsTheInitialSyncCompleteAndTheObserverSeesIt() throws {
        let key = MeshKey.generate()
        let a = try TrellisNode(directory: dir.url.appendingPathComponent("a"), meshKey: key)
        let b = try TrellisNode(directory: dir.url.appendingPathComponent("b"), meshKey: key)
        defer {
            a.close()
            b.close()
        }
        try a.store.collection("c").upsert((0..<200).map { ["_id": .string("d\($0)")] })
        let seen = Mutex<[SyncStatus]>([])
        let observer = b.sync.observeStatus { status in seen.withLock { $0.append(status) } }
        defer { observer.stop() }
        #expect(b.sync.status.peers.isEmpty)
        #expect(b.sync.status.description == "no peer connected")
        let subscription = try b.store.collection("c").findAll().subscribe()
        defer { subscription.cancel() }
        let port = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        b.connect(to: Endpoint(host: "127.0.0.1", port: port))
        #expect(
            eventually {
                b.sync.status.peers.first?.subscriptions.first.map {
                    $0.isInitialSyncComplete && $0.documentsReceived == 200
                } ?? false
            })
        let status = b.sync.status
        let sub = try #require(status.peers.first?.subscriptions.first)
        #expect(sub.documentsBehind == 0)
        #expect(sub.progress == 1)
        #expect(sub.lastReceived.map { abs($0.timeIntervalSinceNow) < 60 } ?? false)
        #expect(status.isInitialSyncComplete)
        #expect(status.description.contains("up to date (200 document(s) received)"))
        #expect(eventually { seen.withLock { $0.last?.isInitialSyncComplete == true && $0.last?.peers.count == 1 } })
        #expect(seen.withLock { $0.first?.peers.isEmpty == true })
        // A's side: it asks B for nothing, so its peer entry lists no subscription.
        #expect(eventually { a.sync.status.peers.first?.subscriptions.isEmpty == true })
    }
}
