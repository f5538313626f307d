import Foundation
import Synchronization
import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// Review of ccbea99 and 78d70ea: a delivered commit event is handed back and released by the
/// committing thread after its next commit. Observers still see every event once, in commit
/// order, with the commit's own values, whoever writes; nothing deadlocks, and a store closed or
/// released with an event held goes away.
@Suite struct SpeedReviewEventTests {
    let dir = TemporaryDirectory("trellis-review-events")

    /// What observers saw: each event's lastSeq, keys and values.
    final class Seen: Sendable {
        let events = Mutex<[StoreEvent]>([])
        var all: [StoreEvent] { events.withLock { $0 } }
        func add(_ event: StoreEvent) { events.withLock { $0.append(event) } }
    }

    /// Writers on several threads, and an observer that writes too (each of its commits takes the
    /// event handed back while the next is being delivered): every commit's event arrives once,
    /// in increasing `lastSeq`, carrying the value that commit wrote.
    @Test func everyEventArrivesOnceInOrderWithItsValues() throws {
        let store = try DocumentStore(path: dir.path("order.sqlite"))
        let seen = Seen()
        let echoes = Atomic<Int>(0)
        let token = store.addObserver { event in
            seen.add(event)
            // Echo each write of `c` into `echo`, from inside the observer.
            guard event.collections.contains("c"), echoes.add(1, ordering: .relaxed).newValue <= 200 else { return }
            store.waitForObservers()  // returns at once from an observer
            _ = try? store.upsert(["_id": .string("e\(event.lastSeq)"), "seq": .int(event.lastSeq)], in: "echo")
        }
        defer { store.removeObserver(token) }
        let threads = 4
        let perThread = 150
        DispatchQueue.concurrentPerform(iterations: threads) { t in
            for n in 0..<perThread {
                _ = try? store.upsert(["_id": .string("t\(t)-\(n)"), "n": .int(Int64(n))], in: "c")
            }
        }
        // Let the echoes land, then wait for their events.
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline, (try? store.count(in: "echo")) ?? 0 < 200 { Thread.sleep(forTimeInterval: 0.01) }
        store.waitForObservers()
        let events = seen.all
        let seqs = events.map(\.lastSeq)
        #expect(seqs == seqs.sorted() && Set(seqs).count == seqs.count, "events out of order or repeated")
        #expect(events.filter { $0.collections.contains("c") }.count == threads * perThread)
        #expect(events.filter { $0.collections.contains("echo") }.count == 200)
        #expect(store.lastSeq == seqs.last)
        // Each event carries the value its commit wrote.
        for event in events where event.collections.contains("c") {
            let keys = event.changedKeys["c"] ?? []
            #expect(keys.count == 1)
            for key in keys {
                let value = event.changedValues["c"]?[key] ?? nil
                #expect(
                    value != nil && value!.contains("\"_id\":\(key.description)"),
                    "\(key.description): \(String(describing: value))")
            }
        }
    }

    /// A store written once and then only read holds its last event until it goes; closed or
    /// released with the event held (and observers registered), it is released, and no write on
    /// a read-only store is attempted.
    @Test func aStoreWithAnEventHeldIsReleased() throws {
        let path = dir.path("released.sqlite")
        weak var released: DocumentStore?
        let seen = Seen()
        do {
            let store = try DocumentStore(path: path)
            released = store
            store.addObserver { seen.add($0) }
            let big = String(repeating: "x", count: 1 << 20)
            try store.upsert((0..<8).map { ["_id": .string("d\($0)"), "s": .string(big)] }, in: "c")
            store.waitForObservers()
            #expect(seen.all.count == 1)
            store.close()
            #expect(throws: StoreError.self) { try store.upsert(["_id": "late"], in: "c") }
            store.waitForObservers()
        }
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline, released != nil { Thread.sleep(forTimeInterval: 0.01) }
        #expect(released == nil, "the store outlived its last reference")

        var options = StoreOptions()
        options.readOnly = true
        let reader = try DocumentStore(path: path, options: options)
        let readerSeen = Seen()
        reader.addObserver { readerSeen.add($0) }
        #expect(throws: StoreError.self) { try reader.upsert(["_id": "x"], in: "c") }
        reader.waitForObservers()
        #expect(readerSeen.all.isEmpty)
        #expect(try reader.count(in: "c") == 8)
    }

    /// An observer that waits for the observers of another store, which writes back into the
    /// first from its own observer: both chains end, nothing deadlocks.
    @Test func observersOfTwoStoresWritingToEachOtherEnd() throws {
        let a = try DocumentStore(path: dir.path("a.sqlite"))
        let b = try DocumentStore(path: dir.path("b.sqlite"))
        let hops = Atomic<Int>(0)
        a.addObserver { event in
            guard hops.add(1, ordering: .relaxed).newValue < 100 else { return }
            _ = try? b.upsert(["_id": .string("a\(event.lastSeq)")], in: "from-a")
            b.waitForObservers()
        }
        b.addObserver { event in
            guard hops.add(1, ordering: .relaxed).newValue < 100 else { return }
            _ = try? a.upsert(["_id": .string("b\(event.lastSeq)")], in: "from-b")
        }
        try a.upsert(["_id": "start"], in: "c")
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline, hops.load(ordering: .relaxed) < 100 { Thread.sleep(forTimeInterval: 0.01) }
        a.waitForObservers()
        b.waitForObservers()
        #expect(hops.load(ordering: .relaxed) >= 100)
        #expect(try a.count(in: "from-b") + b.count(in: "from-a") >= 98)
    }
}
