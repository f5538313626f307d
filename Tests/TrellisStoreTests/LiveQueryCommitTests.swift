import Dispatch
import Foundation
import Synchronization
import Testing
import TrellisStore
import TrellisTestKit

@testable import Trellis

extension TrellisNode {
    /// Runs `writes` while `queue` is held busy, then frees the queue and waits for the
    /// callbacks. A delivery queue: the live queries evaluate the commits meanwhile, and their
    /// events pile up behind it. The live queries' evaluation queue: the commits pile up
    /// unevaluated, as behind a busy evaluation pass.
    func whileHeld(_ queue: DispatchQueue, _ writes: () throws -> Void) rethrows {
        let gate = DispatchSemaphore(value: 0)
        let entered = DispatchSemaphore(value: 0)
        queue.async {
            entered.signal()
            gate.wait()
        }
        entered.wait()
        defer {
            gate.signal()
            store.flushLiveQueries()
        }
        try writes()
        store.documents.waitForObservers()
        if queue !== store.liveQueries.evaluation { store.liveQueries.evaluation.sync {} }
    }
}

// One live-query event per committed transaction (Ditto's `observeLocal`: "every time there is a
// transaction committed to the store that involves a modification"), coalescing only in the
// next-signal forms and past the queued-event limit.
extension LiveQueryTests {
    /// Five quick commits while the delivery queue is busy: five events, each with the document
    /// as its commit left it, in order (with the default queue and with `deliverOn:`).
    @Test(arguments: [false, true])
    func fiveQuickCommitsAreFiveSingleDocumentEvents(customQueue: Bool) throws {
        let queue = customQueue ? DispatchQueue(label: "test.delivery") : LiveQuery.defaultDeliveryQueue
        try cars.upsert(["_id": "u", "age": 40])
        let events = Mutex<[(Int64?, SingleDocumentLiveQueryEvent)]>([])
        let live = try cars.findByID("u").observeLocal(deliverOn: queue) { doc, event in
            events.withLock { $0.append((doc?["age"]?.intValue, event)) }
        }
        #expect(eventually { events.withLock { $0.count } == 1 })
        try node.whileHeld(queue) {
            for age in 41...45 { try cars.upsert(["_id": "u", "age": .int(Int64(age))]) }
        }
        let seen = events.withLock { $0 }
        #expect(seen.map(\.0) == [40, 41, 42, 43, 44, 45])
        #expect(seen.dropFirst().map { $0.1.oldDocument?["age"]?.intValue } == [40, 41, 42, 43, 44])
        #expect(seen.map(\.1.commitCount) == [0, 1, 1, 1, 1, 1])
        live.stop()
    }

    /// The same for a query: five commits give five events with the five intermediate results.
    @Test(arguments: [false, true])
    func fiveQuickCommitsAreFiveQueryEvents(customQueue: Bool) throws {
        let queue = customQueue ? DispatchQueue(label: "test.delivery") : LiveQuery.defaultDeliveryQueue
        let log = EventLog()
        let live = try cars.find("hp > 0").sort("hp").observeLocal(deliverOn: queue) { log.record($0, $1) }
        #expect(eventually { log.count == 1 })
        try node.whileHeld(queue) {
            try cars.upsert(["_id": "a", "hp": 10])
            try cars.upsert(["_id": "b", "hp": 5])
            try cars.upsert(["_id": "a", "hp": 1])
            try cars.findByID("b").remove()
            try cars.upsert(["_id": "c", "hp": 0])  // does not match: no event
            try cars.upsert(["_id": "a", "hp": 2])
        }
        let results = log.all.map { $0.documents.map { "\($0.id.stringValue ?? "?")=\($0["hp"]?.intValue ?? -1)" } }
        #expect(results == [[], ["a=10"], ["b=5", "a=10"], ["a=1", "b=5"], ["a=1"], ["a=2"]])
        #expect(log.problems.withLock { $0 }.isEmpty)
        live.stop()
    }

    /// A commit that writes a document with the value it already has is still a commit that
    /// modifies it: one event, the document listed in `updates`.
    @Test func rewritingTheSameValueIsAnEvent() throws {
        try cars.upsert(["_id": "u", "age": 44])
        let single = Mutex<[Int64?]>([])
        let log = EventLog()
        let one = try cars.findByID("u").observeLocal { doc, _ in single.withLock { $0.append(doc?["age"]?.intValue) } }
        let all = try cars.findAll().observeLocal { log.record($0, $1) }
        node.store.flushLiveQueries()
        try cars.upsert(["_id": "u", "age": 44])
        try cars.findByID("u").update { $0?["age"].set(44) }
        node.store.flushLiveQueries()
        #expect(single.withLock { $0 } == [44, 44, 44])
        #expect(log.count == 3)
        for entry in log.all.dropFirst() {
            guard case .update(let update) = entry.event else { throw Failure("expected an update") }
            #expect(update.updates == [0] && update.insertions.isEmpty && update.deletions.isEmpty)
        }
        #expect(log.problems.withLock { $0 }.isEmpty)
        one.stop()
        all.stop()
    }

    /// Next-signal observers (here with `deliverOn:`) coalesce the commits made before the
    /// signal into one event that counts them, and run on the queue given.
    @Test func nextSignalWithDeliverOnCoalesces() throws {
        let queue = DispatchQueue(label: "test.next-signal")
        let key = DispatchSpecificKey<String>()
        queue.setSpecific(key: key, value: "mine")
        try cars.upsert(["_id": "u", "age": 40])
        let single = Mutex<[(Int64?, SingleDocumentLiveQueryEvent, Bool)]>([])
        let singleSignal = Mutex<(@Sendable () -> Void)?>(nil)
        let one = try cars.findByID("u").observeLocalWithNextSignal(deliverOn: queue) { doc, event, next in
            single.withLock { $0.append((doc?["age"]?.intValue, event, DispatchQueue.getSpecific(key: key) == "mine")) }
            singleSignal.withLock { $0 = next }
        }
        let log = EventLog()
        let querySignal = Mutex<(@Sendable () -> Void)?>(nil)
        let all = try cars.findAll().observeLocalWithNextSignal(deliverOn: queue) { docs, event, next in
            log.record(docs, event)
            querySignal.withLock { $0 = next }
        }
        node.store.flushLiveQueries()
        for age in 41...45 { try cars.upsert(["_id": "u", "age": .int(Int64(age))]) }
        node.store.flushLiveQueries()
        #expect(single.withLock { $0.count } == 1 && log.count == 1)  // nothing before the signal
        let signalSingle = try #require(singleSignal.withLock { $0 })
        let signalQuery = try #require(querySignal.withLock { $0 })
        signalSingle()
        signalQuery()
        node.store.flushLiveQueries()
        let seen = single.withLock { $0 }
        #expect(seen.map(\.0) == [40, 45] && seen.allSatisfy(\.2))
        #expect(seen.last?.1.oldDocument?["age"] == 40 && seen.last?.1.commitCount == 5)
        guard case .update(let update) = log.all.last?.event else { throw Failure("expected an update") }
        #expect(update.commitCount == 5 && update.updates == [0] && log.count == 2)
        #expect(log.problems.withLock { $0 }.isEmpty)
        one.stop()
        all.stop()
    }

    /// Past the queued-event limit, the commits after it arrive as one event that counts them;
    /// the results stay exact.
    @Test func theQueuedEventLimitMergesTheRest() throws {
        node.store.liveQueryEventLimit = 3
        #expect(node.store.liveQueryEventLimit == 3)
        let queue = DispatchQueue(label: "test.limit")
        let log = EventLog()
        let single = Mutex<[(Int64?, Int)]>([])
        let all = try cars.findAll().observeLocal(deliverOn: queue) { log.record($0, $1) }
        let one = try cars.findByID("u").observeLocal(deliverOn: queue) { doc, event in
            single.withLock { $0.append((doc?["n"]?.intValue, event.commitCount)) }
        }
        node.store.flushLiveQueries()
        try node.whileHeld(queue) {
            for n in 1...10 { try cars.upsert(["_id": "u", "n": .int(Int64(n))]) }
        }
        let counts = log.all.dropFirst().map { entry -> Int in
            if case .update(let update) = entry.event { return update.commitCount }
            return -1
        }
        #expect(counts == [1, 1, 1, 7])
        #expect(log.all.map { $0.documents.first?["n"]?.intValue } == [nil, 1, 2, 3, 10])
        #expect(single.withLock { $0 }.map(\.0) == [nil, 1, 2, 3, 10])
        #expect(single.withLock { $0 }.map(\.1) == [0, 1, 1, 1, 7])
        #expect(log.problems.withLock { $0 }.isEmpty)
        // Below the limit again: one event per commit.
        try cars.upsert(["_id": "u", "n": 11])
        node.store.flushLiveQueries()
        #expect(single.withLock { $0.last?.1 } == 1 && log.count == 6)
        all.stop()
        one.stop()
    }

    /// An observer registered while another thread commits sees every commit after its initial
    /// results exactly once, in order: a counter's values go up by one from event to event.
    @Test func anObserverStartedDuringWritesMissesAndRepeatsNothing() throws {
        var (random, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        print("anObserverStartedDuringWritesMissesAndRepeatsNothing seed:", seed)
        try cars.upsert(["_id": "u", "n": 0])
        let writer = Thread { [cars] in
            for n in 1...300 { _ = try? cars.upsert(["_id": "u", "n": .int(Int64(n))]) }
        }
        writer.start()
        usleep(UInt32(random.next() % 20_000))
        let seen = Mutex<[Int64]>([])
        let live = try cars.findByID("u").observeLocal { doc, _ in
            if let n = doc?["n"]?.intValue { seen.withLock { $0.append(n) } }
        }
        #expect(eventually(timeout: 60) { seen.withLock { $0.last } == 300 })
        node.store.flushLiveQueries()
        let values = seen.withLock { $0 }
        #expect(zip(values, values.dropFirst()).allSatisfy { $1 == $0 + 1 }, "\(values)")
        live.stop()
    }
}
