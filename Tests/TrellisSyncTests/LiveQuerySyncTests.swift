import Foundation
import Synchronization
import Testing
import TrellisCore
import TrellisStore
import TrellisSync
import TrellisTestKit

@testable import Trellis

/// Live queries see remote merges as well as local writes (F11 in FAILURES.md).
@Suite struct LiveQuerySyncTests {
    let dir = TemporaryDirectory()

    /// The Ditto-shaped store over a test node's document store and engine.
    func store(_ node: TestNode) -> Store { Store(documents: node.store, subscriptions: node.engine) }

    /// F11: B is offline while A inserts 100 matching documents; B registers a live query, then
    /// connects: the live query fires and ends with the 100 documents.
    @Test func aLiveQueryFiresDuringCatchUp() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        let japan = (0..<100).map { i -> Value in ["_id": .string("j\(i)"), "Origin": "Japan", "n": .int(Int64(i))] }
        try a.store.upsert(japan + cars(30), in: "cars")
        let cars = store(b).collection("cars")
        let results = Mutex<(count: Int, events: Int, duplicates: Bool)>((0, 0, false))
        let live = try cars.find("Origin == 'Japan'").observeLocal { docs, _ in
            results.withLock {
                $0.count = docs.count
                $0.events += 1
                if Set(docs.map(\.id)).count != docs.count { $0.duplicates = true }
            }
        }
        #expect(eventually { results.withLock { $0.events } == 1 })
        let subscription = try cars.find("Origin == 'Japan'").subscribe()
        _ = b.connect(a)
        #expect(eventually { results.withLock { $0.count } == 100 + 10 })  // cars(30) holds 10 from Japan
        #expect(results.withLock { $0.events } >= 2 && !results.withLock { $0.duplicates })
        live.stop()
        subscription.cancel()
    }

    /// F11 variant: B writes d1; A sees the write, then, partitioned from B, removes d1. The remove
    /// covers B's write (add-wins keeps only writes the remover had not seen), so when B
    /// reconnects d1 is gone and B's live query reports its deletion.
    @Test func aLiveQueryReportsARemoteRemoveThatWins() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        try a.engine.subscribe(SubscriptionSpec(collection: "cars"))
        try b.engine.subscribe(SubscriptionSpec(collection: "cars"))
        let cars = store(b).collection("cars")
        let log = Mutex<[([Document], LiveQueryEvent)]>([])
        let live = try cars.findAll().observeLocal { docs, event in log.withLock { $0.append((docs, event)) } }
        let (link, _) = b.connect(a)
        try cars.upsert(["_id": "d1", "Origin": "Japan"])
        try cars.upsert(["_id": "d2", "Origin": "USA"])
        #expect(eventually { (try? a.ids("cars")) == ["d1", "d2"] })
        #expect(eventually { log.withLock { $0.last?.0.map(\.id) } == ["d1", "d2"] })
        link.close()
        #expect(eventually { b.engine.peers.isEmpty && a.engine.peers.isEmpty })
        #expect(try a.store.remove(id: "d1", in: "cars"))
        _ = b.connect(a)
        #expect(eventually { log.withLock { $0.last?.0.map(\.id) } == ["d2"] })
        let (docs, event) = try #require(log.withLock { $0.last })
        guard case .update(let update) = event else { throw Failure("expected an update") }
        #expect(update.oldDocuments.map(\.id) == ["d1", "d2"] && update.deletions == [0])
        #expect(update.insertions.isEmpty && docs.map(\.id) == ["d2"])
        #expect(try b.store.state(id: "d1", in: "cars")?.isDeleted == true)
        live.stop()
    }

    /// A single-document observer sees a remote change.
    @Test func aSingleDocumentObserverSeesRemoteWrites() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        try b.engine.subscribe(SubscriptionSpec(collection: "cars"))
        let seen = Mutex<[Value?]>([])
        let live = try store(b).collection("cars").findByID("c1").observeLocal { doc, _ in
            seen.withLock { $0.append(doc?["hp"]) }
        }
        _ = b.connect(a)
        try a.store.upsert(["_id": "c1", "hp": 7], in: "cars")
        #expect(eventually { seen.withLock { $0.last } == .some(.some(7)) })
        #expect(seen.withLock { $0.first } == .some(nil))
        live.stop()
    }
}

extension LiveQuerySyncTests {
    /// `findByID(…).subscribe()` replicates exactly that document, live, until cancelled, and a
    /// `findByID(…).observeLocal` on the subscriber sees it arrive and change.
    @Test func aSubscriptionByIDReplicatesThatDocumentOnly() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        try a.store.upsert([["_id": "s1", "n": 1], ["_id": "s2", "n": 1]], in: "cars")
        let cars = store(b).collection("cars")
        let seen = Mutex<[Value?]>([])
        let live = try cars.findByID("s2").observeLocal { doc, _ in seen.withLock { $0.append(doc?["n"]) } }
        let subscription = try cars.findByID("s2").subscribe()
        _ = b.connect(a)
        #expect(eventually { (try? b.ids("cars")) == ["s2"] })
        try a.store.upsert(["_id": "s2", "n": 2], in: "cars")
        try a.store.upsert(["_id": "s1", "n": 2], in: "cars")
        #expect(eventually { seen.withLock { $0.last } == .some(.some(2)) })
        #expect(seen.withLock { $0.first } == .some(nil))
        subscription.cancel()
        #expect(eventually { a.engine.peers.allSatisfy(\.servedSubscriptions.isEmpty) })
        try a.store.upsert(["_id": "s2", "n": 3], in: "cars")
        usleep(300_000)
        #expect(try b.store.document(id: "s2", in: "cars")?["n"] == 2)
        #expect(try b.ids("cars") == ["s2"])
        live.stop()
    }
}

struct Failure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
