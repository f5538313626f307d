import Foundation
import Synchronization
import Testing
import TrellisCore
import TrellisStore
import TrellisSync
import TrellisTestKit

/// One in-process node: a store and its sync engine.
final class TestNode: Sendable {
    let store: DocumentStore
    let engine: SyncEngine
    let key: [UInt8]

    init(_ dir: TemporaryDirectory, _ name: String) throws {
        store = try DocumentStore(path: dir.path("\(name).sqlite"))
        key = Array(name.utf8) + Array(repeating: 0, count: 32 - name.utf8.count)
        engine = try SyncEngine(store: store, peerKey: key)
    }

    /// Connects two nodes with an in-memory link; `self` dials.
    func connect(_ other: TestNode) -> (MemoryLink, MemoryLink) {
        let (a, b) = MemoryLink.pair(initiatorKey: key, responderKey: other.key)
        engine.attach(a)
        other.engine.attach(b)
        return (a, b)
    }

    func ids(_ collection: String) throws -> Set<Value> {
        Set(try store.documents(in: collection).compactMap { $0["_id"] })
    }
}

func cars(_ n: Int) -> [Value] {
    let origins = ["USA", "Europe", "Japan"]
    return (0..<n).map { i in
        [
            "_id": .string("car\(i)"), "Origin": .string(origins[i % 3]), "Cylinders": .int(Int64(4 + i % 5)),
            "mpg": .double(Double(i) / 3),
        ]
    }
}

@Suite struct SyncEngineTests {
    let dir = TemporaryDirectory()

    @Test func aSubscriberReceivesExactlyWhatItsQueryMatches() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        try a.store.upsert(cars(600), in: "cars")  // more than one batch
        try b.engine.subscribe(SubscriptionSpec(collection: "cars", query: "Origin == 'Japan'"))
        _ = b.connect(a)
        let expected = Set(cars(600).filter { $0["Origin"] == "Japan" }.compactMap { $0["_id"] })
        #expect(eventually { (try? b.ids("cars")) == expected })
        #expect(try b.store.count(in: "cars") == 200)
    }

    /// Other collections' entries in the log (more than a batch of them) do not stall a subscription.
    @Test func aSubscriptionIsServedWhateverOtherCollectionsHold() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        try a.store.upsert(["_id": "t1", "Name": "truck"], in: "trucks")
        try a.store.upsert(cars(700), in: "cars")
        try a.store.upsert(["_id": "t2", "Name": "lorry"], in: "trucks")
        try b.engine.subscribe(SubscriptionSpec(collection: "trucks"))
        _ = b.connect(a)
        #expect(eventually { (try? b.ids("trucks")) == ["t1", "t2"] })
        try a.store.upsert(cars(300), in: "cars")
        try a.store.upsert(["_id": "t3"], in: "trucks")
        #expect(eventually { (try? b.ids("trucks")) == ["t1", "t2", "t3"] })
        #expect(try b.store.count(in: "cars") == 0)
    }

    /// A peer (here driven by hand) cannot write into a collection the batch is not for.
    @Test func aBatchCannotWriteIntoAnotherCollection() throws {
        let a = try TestNode(dir, "a")
        let spec = SubscriptionSpec(collection: "cars")
        try a.engine.subscribe(spec)
        let evilKey = [UInt8](repeating: 0xEE, count: 32)
        let (mine, theirs) = MemoryLink.pair(initiatorKey: evilKey, responderKey: a.key)
        let received = Mutex<[WireMessage]>([])
        mine.start(
            onMessage: { bytes in
                if let m = try? WireMessage(serialized: bytes) { received.withLock { $0.append(m) } }
            }, onDrain: {}, onClose: { _ in })
        a.engine.attach(theirs)
        try mine.send(
            WireMessage.hello(
                Hello(
                    version: WireMessage.protocolVersion, peerKey: evilKey, site: 9,
                    epoch: Array(repeating: 1, count: 16))
            )
            .serialized())
        #expect(
            eventually { received.withLock { $0.contains { if case .subscriptions = $0 { true } else { false } } } })
        let source = try DocumentStore(path: dir.path("evil.sqlite"))
        try source.upsert(["_id": "c1", "v": 1], in: "cars")
        try source.upsert(["_id": "s1", "v": 2], in: "secret")
        let docs = try ["cars", "secret"].flatMap { collection in
            try source.changes(in: collection, after: 0, limit: 10, maxBytes: .max).records.map {
                WireDocument(collection: collection, id: $0.id, state: $0.state)
            }
        }
        try mine.send(
            WireMessage.batch(subscription: .key(spec.key), documents: docs, upTo: 2, generation: 0).serialized())
        #expect(eventually { received.withLock { $0.contains(.ack(subscription: .key(spec.key), upTo: 2)) } })
        #expect(try a.ids("cars") == ["c1"])
        #expect(try a.store.count(in: "secret") == 0)
    }

    /// F10: evicting documents a subscription still matches brings them back from peers, once:
    /// no evict/re-fetch loop.
    @Test func evictedDocumentsComeBackWhileASubscriptionMatches() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        try a.store.upsert(cars(50), in: "cars")
        let spec = SubscriptionSpec(collection: "cars")
        try b.engine.subscribe(spec)
        _ = b.connect(a)
        #expect(eventually { (try? b.store.count(in: "cars")) == 50 })
        let evicted = try b.store.evict(ids: (0..<10).map { .string("car\($0)") }, in: "cars")
        #expect(evicted.count == 10)
        #expect(eventually { (try? b.store.count(in: "cars")) == 50 })
        let settled = b.store.lastSeq
        usleep(300_000)
        #expect(b.store.lastSeq == settled)  // nothing is evicted or fetched again by itself
        // (b) cancel, evict, subscribe again, with no change on A: the documents come back too.
        b.engine.unsubscribe(spec)
        try b.store.evict(ids: ["car20", "car21"], in: "cars")
        #expect(try b.store.count(in: "cars") == 48)
        try b.engine.subscribe(spec)
        #expect(eventually { (try? b.store.count(in: "cars")) == 50 })
    }

    /// A subscription whose `$args` are missing is refused locally; sent by a peer, it gets a
    /// per-subscription error and the session goes on serving the others.
    @Test func subscriptionsWithMissingArgumentsAreRefusedAndDoNotBreakSessions() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        #expect(throws: (any Error).self) {
            try b.engine.subscribe(SubscriptionSpec(collection: "cars", query: "Cylinders == $args.x"))
        }
        try a.store.upsert(cars(6), in: "cars")
        // Forwarded through a middle node without its own check, a bad one reaches A; A carries on.
        let (mine, theirs) = MemoryLink.pair(initiatorKey: b.key, responderKey: a.key)
        a.engine.attach(theirs)
        let received = Mutex<[WireMessage]>([])
        mine.start(
            onMessage: { bytes in
                if let m = try? WireMessage(serialized: bytes) { received.withLock { $0.append(m) } }
            }, onDrain: {}, onClose: { _ in })
        try mine.send(
            WireMessage.hello(
                Hello(
                    version: WireMessage.protocolVersion, peerKey: b.key, site: 9, epoch: Array(repeating: 1, count: 16)
                )
            )
            .serialized())
        let bad = SubscriptionSpec(collection: "cars", query: "Cylinders == $args.x")
        let good = SubscriptionSpec(collection: "cars", query: "Origin == 'Japan'")
        try mine.send(
            WireMessage.subscriptions([
                WireSubscription(spec: bad, since: 0, hops: 0), WireSubscription(spec: good, since: 0, hops: 0),
            ]).serialized())
        #expect(
            eventually {
                received.withLock { messages in
                    messages.contains {
                        if case .batch(good.key, let docs, _, _, _) = $0 { docs.count == 2 } else { false }
                    }
                }
            })
        #expect(
            received.withLock { messages in
                messages.contains { if case .subscriptionError(bad.key, "query", _) = $0 { true } else { false } }
            })
        #expect(a.engine.peers.count == 1)  // still connected
    }

    @Test func liveChangesAndRemovesFlowWhileConnected() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        try a.store.upsert(cars(9), in: "cars")
        try b.engine.subscribe(SubscriptionSpec(collection: "cars", query: "Origin == 'Japan'"))
        try a.engine.subscribe(SubscriptionSpec(collection: "cars"))
        _ = b.connect(a)
        #expect(eventually { (try? b.store.count(in: "cars")) == 3 })
        // A change on B reaches A; a remove on A reaches B even though a tombstone matches no query.
        try b.store.upsert(["_id": "car2", "Cylinders": 12], in: "cars")
        #expect(eventually { (try? a.store.document(id: "car2", in: "cars"))??["Cylinders"] == 12 })
        try a.store.remove(id: "car5", in: "cars")
        #expect(eventually { (try? b.ids("cars"))?.contains("car5") == false })
        #expect(try b.store.state(id: "car5", in: "cars")?.isDeleted == true)  // a tombstone, not an eviction
        try a.store.upsert(["_id": "new", "Origin": "Japan"], in: "cars")
        #expect(eventually { (try? b.ids("cars")) == ["car2", "car8", "new"] })
        // A's value of car2 is B's: the change came back once, not echoed again and again.
        let seq = a.store.lastSeq
        usleep(200_000)
        #expect(a.store.lastSeq == seq)
    }

    @Test func subscriptionsAreForwardedAcrossAMiddleNode() throws {
        // C — A — B: C subscribes to all cars; data written on B reaches C through A, which stores it.
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        let c = try TestNode(dir, "c")
        try b.store.upsert(cars(30), in: "cars")
        try c.engine.subscribe(SubscriptionSpec(collection: "cars"))
        _ = b.connect(a)
        _ = c.connect(a)
        #expect(eventually { (try? c.store.count(in: "cars")) == 30 })
        #expect(try a.store.count(in: "cars") == 30)
        try b.store.upsert(["_id": "car1", "mpg": 99.5], in: "cars")
        #expect(eventually { (try? c.store.document(id: "car1", in: "cars"))??["mpg"] == 99.5 })
    }

    @Test func reconnectingResumesFromTheCheckpoint() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        try a.store.upsert(cars(50), in: "cars")
        let spec = SubscriptionSpec(collection: "cars")
        try b.engine.subscribe(spec)
        let (link, _) = b.connect(a)
        #expect(eventually { (try? b.store.count(in: "cars")) == 50 })
        link.close()
        #expect(eventually { b.engine.peers.isEmpty && a.engine.peers.isEmpty })
        let checkpoint = try #require(try b.store.checkpoint(peer: a.key, subscription: spec.key))
        #expect(checkpoint.seq == a.store.lastSeq && checkpoint.epoch == a.store.epoch)
        try a.store.upsert(["_id": "late", "Origin": "USA"], in: "cars")
        let before = b.store.lastSeq
        _ = b.connect(a)
        #expect(eventually { (try? b.store.count(in: "cars")) == 51 })
        #expect(b.store.lastSeq == before + 1)  // only the new document was applied
    }

    @Test func aSubscriptionLastsWhileAnyHolderKeepsIt() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        let spec = SubscriptionSpec(collection: "cars", query: "Cylinders > 5")
        try b.engine.subscribe(spec)
        try b.engine.subscribe(spec)
        _ = b.connect(a)
        func served() -> [SubscriptionSpec] { a.engine.peers.first?.servedSubscriptions ?? [] }
        #expect(eventually { served() == [spec] })
        b.engine.unsubscribe(spec)
        usleep(100_000)
        #expect(served() == [spec])
        b.engine.unsubscribe(spec)
        #expect(eventually { a.engine.peers.count == 1 && served().isEmpty })
    }

    @Test func aSecondLinkBetweenTheSamePeersIsClosed() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        _ = b.connect(a)
        _ = a.connect(b)
        #expect(eventually { a.engine.peers.count == 1 && b.engine.peers.count == 1 })
        usleep(100_000)
        #expect(a.engine.peers.count == 1 && b.engine.peers.count == 1)
    }

    /// F21 across a restart: documents an earlier run deferred (their stamps were ahead of this
    /// node's clock) are applied once the node starts again with its clock right, although no
    /// peer sends them again (the checkpoint covers them) and nothing new is deferred.
    @Test func documentsDeferredByAnEarlierRunAreRetriedWhenTheEngineStarts() throws {
        let clock = ManualClock()
        var options = StoreOptions()
        options.now = clock.source
        options.elapsed = clock.source
        options.log = { _ in }
        var ahead = options
        ahead.now = ManualClock(startingAt: clock.now + 7_200_000).source
        let peer = try DocumentStore(path: dir.path("peer.sqlite"), options: ahead)
        try peer.upsert(["_id": "d1", "v": 1], in: "c")
        let documents = try peer.changes(in: "c", after: 0, limit: 10, maxBytes: .max).records.map {
            RemoteDocument(collection: $0.collection, id: $0.id, state: $0.state)
        }
        let before = try DocumentStore(path: dir.path("local.sqlite"), options: options)
        let outcome = try before.merge(
            documents, from: [1], checkpoint: (subscription: "c true", Checkpoint(epoch: peer.epoch, seq: 1)))
        #expect(outcome.deferred.count == 1)
        before.close()

        clock.advance(by: 7_200_000)  // the clock was fixed while the node was down
        let store = try DocumentStore(path: dir.path("local.sqlite"), options: options)
        let engine = try SyncEngine(store: store, peerKey: Array(repeating: 7, count: 32))
        defer { engine.close() }
        #expect(eventually(timeout: 10) { (try? store.document(id: "d1", in: "c")) == ["_id": "d1", "v": 1] })
        #expect(try store.deferredDocuments().isEmpty)
    }
}
