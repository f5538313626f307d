import Foundation
import Synchronization
import Testing
import TrellisCore
import TrellisStore
import TrellisSync
import TrellisTestKit

@testable import Trellis

/// Live queries on a subscriber while its peer writes without pause and the subscriber evicts
/// the observed document (so the sync engine refetches it) at random points.
@Suite struct LiveQuerySyncBreakTests {
    let dir = TemporaryDirectory("trellis-live-sync-break")

    func store(_ node: TestNode) -> Store { Store(documents: node.store, subscriptions: node.engine) }

    /// A writes `x` with `n` = 1, 2, 3, … (sometimes removing it first and writing it again);
    /// B subscribes to the collection, observes `x` (single document) and `n >= 0` sorted by `n`
    /// (cursor), and evicts `x` at random points. Whatever B holds comes from A's history, so
    /// the non-nil `n` B's observers see never go down (an evicted document comes back with A's
    /// current state, never an older one), a cursor event never holds `x` twice, and both
    /// observers end with A's last `n`.
    ///
    /// Replay: `TRELLIS_SEED=<seed printed>`.
    @Test func evictionsDuringRemoteWritesNeverShowAnOlderState() throws {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("evictionsDuringRemoteWritesNeverShowAnOlderState seed \(seed) (replay: TRELLIS_SEED=\(seed))")
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        let cars = store(b).collection("cars")
        let single = Mutex<[Int64?]>([])
        let cursor = Mutex<(values: [Int64], duplicates: Bool, last: [Int64])>(([], false, []))
        let one = try cars.findByID("x").observeLocal { doc, _ in
            single.withLock { $0.append(doc?["n"]?.intValue) }
        }
        let many = try cars.find("n >= 0").sort("n").observeLocal { docs, _ in
            cursor.withLock { c in
                if Set(docs.map(\.id)).count != docs.count { c.duplicates = true }
                c.last = docs.compactMap { $0["n"]?.intValue }
                c.values += docs.filter { $0.id == "x" }.compactMap { $0["n"]?.intValue }
            }
        }
        let subscription = try cars.findAll().subscribe()
        _ = b.connect(a)
        var n: Int64 = 0
        for _ in 0..<200 {
            switch Int.random(in: 0..<10, using: &rng) {
            case 0:
                _ = try a.store.remove(id: "x", in: "cars")
                n += 1
                try a.store.upsert(["_id": "x", "n": .int(n)], in: "cars")
            case 1..<3:
                _ = try b.store.evict(id: "x", in: "cars")
            default:
                n += 1
                try a.store.upsert(["_id": "x", "n": .int(n)], in: "cars")
            }
            if Int.random(in: 0..<4, using: &rng) == 0 { usleep(UInt32.random(in: 0..<3_000, using: &rng)) }
        }
        let last = n
        #expect(eventually(timeout: 60) { single.withLock { $0.last } == .some(last) }, "seed \(seed)")
        #expect(eventually(timeout: 60) { cursor.withLock { $0.last } == [last] }, "seed \(seed)")
        let events = single.withLock { $0 }
        print("seed \(seed): \(events.count) single-document events, \(events.filter { $0 == nil }.count) absent")
        let seen = events.compactMap { $0 }
        let listed = cursor.withLock { $0.values }
        #expect(seen == seen.sorted(), "seed \(seed): single-document values went down: \(seen)")
        #expect(listed == listed.sorted(), "seed \(seed): cursor values went down: \(listed)")
        #expect(!cursor.withLock { $0.duplicates }, "seed \(seed)")
        one.stop()
        many.stop()
        subscription.cancel()
    }
}
