import Dispatch
import Foundation
import Synchronization
import Testing
import TrellisStore
import TrellisTestKit

@testable import Trellis

/// Collects what a live query delivers, checking every event against the previous results.
final class EventLog: Sendable {
    struct Entry: Sendable {
        var documents: [Document]
        var event: LiveQueryEvent
    }
    let entries = Mutex<[Entry]>([])
    let problems = Mutex<[String]>([])

    func record(_ documents: [Document], _ event: LiveQueryEvent) {
        entries.withLock { entries in
            let previous = entries.last?.documents
            if let problem = Self.check(previous: previous, documents, event) {
                problems.withLock { $0.append(problem) }
            }
            entries.append(Entry(documents: documents, event: event))
        }
    }

    var last: [Document]? { entries.withLock { $0.last?.documents } }
    var count: Int { entries.withLock { $0.count } }
    var all: [Entry] { entries.withLock { $0 } }

    /// The reference check: the event is `.initial` first and `.update` afterwards; its old
    /// documents are the previous results; deletions, insertions and updates are exactly the
    /// documents that left, arrived or changed (computed here by `_id`, independently of the
    /// implementation; `updates` may also list surviving documents rewritten unchanged); applying the event to the previous results gives the new results.
    static func check(previous: [Document]?, _ documents: [Document], _ event: LiveQueryEvent) -> String? {
        if Set(documents.map(\.id)).count != documents.count { return "a document appears twice: \(documents)" }
        guard let previous else { return event == .initial ? nil : "first event is \(event)" }
        guard case .update(let update) = event else { return "a later event is .initial" }
        if update.oldDocuments != previous { return "oldDocuments differ from the previous results" }
        let oldIDs = Dictionary(uniqueKeysWithValues: previous.map { ($0.id, $0) })
        let newIDs = Dictionary(uniqueKeysWithValues: documents.map { ($0.id, $0) })
        let deletions = previous.indices.filter { newIDs[previous[$0].id] == nil }
        let insertions = documents.indices.filter { oldIDs[documents[$0].id] == nil }
        let changed = documents.indices.filter { index in
            oldIDs[documents[index].id].map { $0.value != documents[index].value } ?? false
        }
        if update.deletions != deletions { return "deletions \(update.deletions), expected \(deletions)" }
        if update.insertions != insertions { return "insertions \(update.insertions), expected \(insertions)" }
        // A document rewritten with the same value is an update too (a commit wrote it).
        let survivors = documents.indices.filter { oldIDs[documents[$0].id] != nil }
        if !Set(update.updates).isSuperset(of: changed) || !Set(update.updates).isSubset(of: survivors)
            || update.updates != update.updates.sorted()
        {
            return "updates \(update.updates), expected \(changed) and perhaps other survivors"
        }
        guard let rebuilt = event.apply(to: previous, new: documents) else { return "the event does not apply" }
        if rebuilt != documents { return "applying \(event) gives \(rebuilt), not \(documents)" }
        if update.isEmpty { return "an empty update was delivered" }
        return nil
    }
}

@Suite struct LiveQueryTests {
    let dir = TemporaryDirectory("trellis-live")
    let node: TrellisNode
    var cars: TrellisCollection { node.store.collection("cars") }

    init() throws {
        node = try TrellisNode(directory: dir.url.appendingPathComponent("node"), meshKey: .generate())
    }

    /// An import larger than a commit event lists (``DocumentStore/maxListedKeys``) still
    /// reaches a live query: its collection is named without keys and the query runs again.
    @Test func aCommitTooLargeToListItsKeysReachesLiveQueries() throws {
        try cars.upsert(["_id": "first", "hp": 1])
        let log = EventLog()
        let live = try cars.find("hp >= 1").observeLocal { log.record($0, $1) }
        #expect(eventually { log.count == 1 })
        var n = 0
        let total = DocumentStore.maxListedKeys + 10
        _ = try node.store.documents.upsert(
            in: "cars",
            streaming: {
                n += 1
                return n <= total ? ["_id": .string("car-\(n)"), "hp": .int(Int64(n % 3))] : nil
            })
        let matching = 1 + (1...total).filter { $0 % 3 >= 1 }.count
        #expect(eventually(timeout: 60) { log.last?.count == matching })
        #expect(log.problems.withLock { $0 }.isEmpty)
        live.stop()
    }

    @Test func eventsFollowDittoSemantics() throws {
        try cars.upsert([["_id": "a", "hp": 1], ["_id": "b", "hp": 2], ["_id": "c", "hp": 3]])
        let log = EventLog()
        let live = try cars.find("hp >= 2").sort("hp").observeLocal { log.record($0, $1) }
        #expect(eventually { log.count == 1 })
        #expect(log.all[0].event == .initial && log.last?.map(\.id) == ["b", "c"])
        try cars.upsert(["_id": "d", "hp": 0])  // does not match: no event
        try cars.upsert(["_id": "a", "hp": 9])  // enters at the end
        #expect(eventually { log.count == 2 })
        guard case .update(let u1) = log.all[1].event else { throw Failure("expected an update") }
        #expect(u1.insertions == [2] && u1.deletions.isEmpty && u1.updates.isEmpty && u1.moves.isEmpty)
        try cars.upsert(["_id": "b", "hp": 10])  // moves from 0 to 2 and changes
        #expect(eventually { log.count == 3 })
        guard case .update(let u2) = log.all[2].event else { throw Failure("expected an update") }
        #expect(log.last?.map(\.id) == ["c", "a", "b"])
        #expect(u2.updates == [2] && u2.moves == [LiveQueryMove(from: 0, to: 2)])
        try cars.findByID("c").remove()
        #expect(eventually { log.count == 4 })
        guard case .update(let u3) = log.all[3].event else { throw Failure("expected an update") }
        #expect(u3.deletions == [0] && u3.oldDocuments.map(\.id) == ["c", "a", "b"])
        live.stop()
        #expect(log.problems.withLock { $0 }.isEmpty)
    }

    @Test func aLimitedQueryRefillsAfterADeletion() throws {
        try cars.upsert((0..<6).map { ["_id": .string("c\($0)"), "hp": .int(Int64($0))] })
        let log = EventLog()
        let live = try cars.findAll().sort("hp", direction: .descending).limit(3).observeLocal { log.record($0, $1) }
        #expect(eventually { log.last?.map(\.id) == ["c5", "c4", "c3"] })
        try cars.findByID("c4").remove()
        #expect(eventually { log.last?.map(\.id) == ["c5", "c3", "c2"] })
        guard case .update(let update) = log.all.last?.event else { throw Failure("expected an update") }
        #expect(update.deletions == [1] && update.insertions == [2])
        try cars.upsert(["_id": "c0", "hp": -1])  // outside the window: no event
        try cars.findByID("c5").evict()
        #expect(eventually { log.last?.map(\.id) == ["c3", "c2", "c1"] })
        live.stop()
        #expect(log.problems.withLock { $0 }.isEmpty)
    }

    /// Random writes against several query shapes; every event is checked against the reference
    /// diff, and the final results against `exec()`.
    @Test(arguments: [0, 1, 2, 3])
    func randomWritesGiveExactEvents(shape: Int) throws {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("randomWritesGiveExactEvents shape \(shape) seed \(seed) (replay: TRELLIS_SEED=\(seed))")
        var operation = cars.find("hp >= 3 || color == 'red'")
        switch shape {
        case 1: operation = operation.sort("hp", direction: .descending).limit(5)
        case 2: operation = operation.sort("color").sort("hp").offset(2).limit(4)
        case 3: operation = cars.findAll().sort("hp")
        default: break
        }
        let log = EventLog()
        let live = try operation.observeLocal { log.record($0, $1) }
        let colors: [Value] = ["red", "blue", "green"]
        for step in 0..<300 {
            let id = Value.string("d\(Int.random(in: 0..<25, using: &rng))")
            switch Int.random(in: 0..<10, using: &rng) {
            case 0..<5:
                try cars.upsert([
                    "_id": id, "hp": .int(Int64.random(in: 0..<8, using: &rng)),
                    "color": colors[Int.random(in: 0..<3, using: &rng)],
                ])
            case 5..<7:
                try cars.findByID(id).update { $0?["hp"].set(.int(Int64.random(in: 0..<8, using: &rng))) }
            case 7:
                let batch = (0..<3).map { _ in
                    Value.map([
                        "_id": .string("d\(Int.random(in: 0..<25, using: &rng))"),
                        "hp": .int(Int64.random(in: 0..<8, using: &rng)),
                    ])
                }
                try cars.upsert(
                    Array(Dictionary(batch.map { ($0["_id"]!, $0) }, uniquingKeysWith: { a, _ in a }).values))
            case 8: try cars.findByID(id).remove()
            default: try cars.findByID(id).evict()
            }
            if step % 10 == 0 {
                let expected = try operation.exec()
                #expect(eventually { log.last == expected }, "seed \(seed) step \(step)")
            }
        }
        let expected = try operation.exec()
        #expect(eventually { log.last == expected }, "seed \(seed)")
        live.stop()
        let problems = log.problems.withLock { $0 }
        #expect(problems.isEmpty, "seed \(seed): \(problems.prefix(3))")
        #expect(log.count > 1)
    }

    @Test func oneCommitIsOneEventAndOtherCollectionsAreIgnored() throws {
        let log = EventLog()
        let live = try cars.findAll().observeLocal { log.record($0, $1) }
        #expect(eventually { log.count == 1 })
        try cars.upsert((0..<10).map { ["_id": .string("c\($0)")] })
        #expect(eventually { log.last?.count == 10 })
        try node.store.collection("boats").upsert(["_id": "b1"])
        usleep(100_000)
        #expect(log.count == 2)
        guard case .update(let update) = log.all[1].event else { throw Failure("expected an update") }
        #expect(update.insertions == Array(0..<10))
        live.stop()
    }

    /// Only live queries on a touched collection are evaluated; a query without offset patches
    /// its results from the changed documents without running SQL (a limited one cuts its window
    /// back); it re-runs only when a document leaves its full window.
    @Test func evaluationIsIncremental() throws {
        let stats = node.store.liveQueries.stats
        try cars.upsert((0..<20).map { ["_id": .string("c\($0)"), "hp": .int(Int64($0))] })
        // The commit's event reaches the live queries before they start (else it may count as a rerun).
        node.store.documents.waitForObservers()
        let all = EventLog()
        let top = EventLog()
        let live1 = try cars.find("hp >= 10").sort("hp").observeLocal { all.record($0, $1) }
        let live2 = try cars.findAll().sort("hp", direction: .descending).limit(3).observeLocal { top.record($0, $1) }
        #expect(eventually { all.count == 1 && top.count == 1 })
        node.store.flushLiveQueries()
        let passes = stats.passes.load(ordering: .relaxed)
        let reruns = stats.reruns.load(ordering: .relaxed)
        for i in 0..<50 { try node.store.collection("boats").upsert(["_id": .string("b\(i)")]) }
        usleep(100_000)
        #expect(stats.passes.load(ordering: .relaxed) == passes)  // no live query on boats
        try cars.upsert(["_id": "c15", "hp": 16])  // inside both
        #expect(eventually { all.count == 2 })
        try cars.upsert(["_id": "c2", "hp": 3])  // outside both: no event, no query run
        try cars.upsert(["_id": "new", "hp": 100])  // enters both
        #expect(eventually { all.last?.last?.id == "new" && top.last?.first?.id == "new" })
        #expect(stats.reruns.load(ordering: .relaxed) == reruns)  // "new" entering a window is a patch
        #expect(stats.patches.load(ordering: .relaxed) >= 3)
        #expect(all.count == 3 && top.count == 2)
        try cars.findByID("new").remove()  // leaves the full window: the next one is read from the store
        #expect(eventually { top.last?.map(\.id) == ["c19", "c18", "c17"] })
        #expect(stats.reruns.load(ordering: .relaxed) - reruns == 1)
        #expect(all.count == 4 && top.count == 3)
        live1.stop()
        live2.stop()
        #expect(all.problems.withLock { $0 }.isEmpty && top.problems.withLock { $0 }.isEmpty)
    }

    @Test func singleDocumentEvents() throws {
        let events = Mutex<[(Document?, SingleDocumentLiveQueryEvent)]>([])
        let live = try cars.findByID("c1").observeLocal { doc, event in events.withLock { $0.append((doc, event)) } }
        #expect(eventually { events.withLock { $0.count } == 1 })
        try cars.upsert(["_id": "other"])  // another document: no event
        try cars.upsert(["_id": "c1", "hp": 1])
        try? awaitCount(events, 2)
        try cars.findByID("c1").update { $0?["hp"].set(2) }
        try? awaitCount(events, 3)
        try cars.findByID("c1").remove()
        try? awaitCount(events, 4)
        usleep(50_000)
        let seen = events.withLock { $0 }
        #expect(seen.count == 4)
        #expect(seen[0].0 == nil && seen[0].1 == SingleDocumentLiveQueryEvent(isInitial: true, oldDocument: nil))
        #expect(seen[1].0?["hp"] == 1 && !seen[1].1.isInitial && seen[1].1.oldDocument == nil)
        #expect(seen[2].0?["hp"] == 2 && seen[2].1.oldDocument?["hp"] == 1)
        #expect(seen[3].0 == nil && seen[3].1.oldDocument?["hp"] == 2)
        live.stop()
    }

    func awaitCount<T>(_ events: borrowing Mutex<[T]>, _ n: Int) throws {
        #expect(eventually { events.withLock { $0.count } >= n })
    }

    @Test func nextSignalCoalescesAgainstTheLastDeliveredResults() throws {
        try cars.upsert([["_id": "keep", "n": 0], ["_id": "gone", "n": 0]])
        let log = EventLog()
        let signal = Mutex<(@Sendable () -> Void)?>(nil)
        let live = try cars.findAll().observeLocalWithNextSignal { docs, event, next in
            log.record(docs, event)
            signal.withLock { $0 = next }
        }
        #expect(eventually { log.count == 1 })
        for i in 0..<50 { try cars.upsert(["_id": .string("n\(i)"), "n": .int(Int64(i))]) }
        try cars.findByID("gone").remove()
        try cars.findByID("keep").update { $0?["n"].set(1) }
        usleep(200_000)
        #expect(log.count == 1)  // nothing until signalled
        let next = try #require(signal.withLock { $0 })
        next()
        next()  // a second call of the same signal does nothing more
        #expect(eventually { log.count == 2 })
        usleep(200_000)
        #expect(log.count == 2)
        guard case .update(let update) = log.all[1].event else { throw Failure("expected an update") }
        #expect(update.oldDocuments.map(\.id) == ["gone", "keep"])
        #expect(update.insertions.count == 50 && update.deletions == [0] && update.updates.count == 1)
        #expect(log.problems.withLock { $0 }.isEmpty)
        live.stop()
    }

    @Test func singleDocumentNextSignalCoalesces() throws {
        try cars.upsert(["_id": "c1", "n": 0])
        let events = Mutex<[(Document?, SingleDocumentLiveQueryEvent)]>([])
        let signal = Mutex<(@Sendable () -> Void)?>(nil)
        let live = try cars.findByID("c1").observeLocalWithNextSignal { doc, event, next in
            events.withLock { $0.append((doc, event)) }
            signal.withLock { $0 = next }
        }
        #expect(eventually { events.withLock { $0.count } == 1 })
        for n in 1...20 { try cars.upsert(["_id": "c1", "n": .int(Int64(n))]) }
        usleep(100_000)
        #expect(events.withLock { $0.count } == 1)
        let next = try #require(signal.withLock { $0 })
        next()
        #expect(eventually { events.withLock { $0.count } == 2 })
        let (doc, event) = try #require(events.withLock { $0.last })
        #expect(doc?["n"] == 20 && event.oldDocument?["n"] == 0 && !event.isInitial)
        live.stop()
    }

    @Test func callbacksRunOnTheDeliveryQueue() throws {
        let key = DispatchSpecificKey<String>()
        let mine = DispatchQueue(label: "mine")
        mine.setSpecific(key: key, value: "mine")
        LiveQuery.defaultDeliveryQueue.setSpecific(key: key, value: "default")
        let seen = Mutex<[String?]>([])
        let a = try cars.findAll().observeLocal { _, _ in
            seen.withLock { $0.append(DispatchQueue.getSpecific(key: key)) }
        }
        let b = try cars.findByID("x").observeLocal(deliverOn: mine) { _, _ in
            seen.withLock { $0.append(DispatchQueue.getSpecific(key: key)) }
        }
        #expect(eventually { seen.withLock { $0.count } == 2 })
        #expect(Set(seen.withLock { $0 }) == ["default", "mine"])
        a.stop()
        b.stop()
    }

    @Test func asyncSequenceDeliversAndCancellationStops() async throws {
        let baseline = node.store.liveQueryCount
        try cars.upsert(["_id": "a", "hp": 1])
        let updates = try cars.find("hp > 0").observeLocalUpdates()
        #expect(node.store.liveQueryCount == baseline + 1)
        let collection = cars
        let task = Task {
            var seen: [LiveQueryResults] = []
            for await results in updates {
                seen.append(results)
                if seen.count == 1 { _ = try? collection.upsert(["_id": "b", "hp": 2]) }
                if seen.count == 2 { break }
            }
            return seen
        }
        let seen = await task.value
        #expect(seen.count == 2 && seen[0].event == .initial && seen[1].documents.map(\.id) == ["a", "b"])
        // The loop ended; the iterator is gone but the sequence value still exists here.
        updates.stop()
        #expect(eventually { node.store.liveQueryCount == baseline })

        // Cancelling the consuming task ends the observer.
        let single = try cars.findByID("a").observeLocalUpdates()
        let waiting = Task {
            var count = 0
            for await _ in single { count += 1 }
            return count
        }
        #expect(eventually { node.store.liveQueryCount == baseline + 1 })
        try await Task.sleep(for: .milliseconds(50))
        waiting.cancel()
        #expect(await waiting.value >= 1)
        #expect(eventually { node.store.liveQueryCount == baseline })
    }

    @Test func droppingASequenceStopsItsObserver() async throws {
        let baseline = node.store.liveQueryCount
        do {
            let updates = try cars.findAll().observeLocalUpdates()
            for await results in updates {
                #expect(results.event == .initial)
                break
            }
        }
        #expect(eventually { node.store.liveQueryCount == baseline })
    }

    /// F12: changing a live query's arguments 10,000 times and 10,000 short-lived live queries
    /// leave no observer behind.
    @Test func observersDoNotLeak() throws {
        try cars.upsert((0..<20).map { ["_id": .string("c\($0)"), "hp": .int(Int64($0))] })
        let storeObservers = node.store.documents.observerCount
        let baseline = node.store.liveQueryCount
        let delivered = Atomic<Int>(0)
        var live: LiveQuery?
        for i in 0..<10_000 {
            live?.stop()
            live = try cars.find("hp >= $args.min", args: ["min": .int(Int64(i % 20))]).observeLocal { _, _ in
                delivered.add(1, ordering: .relaxed)
            }
        }
        #expect(node.store.liveQueryCount == baseline + 1)
        live = nil
        #expect(node.store.liveQueryCount == baseline)
        for i in 0..<10_000 {
            if i % 2 == 0 {
                let query = try cars.findByID(.string("c\(i % 20)")).observeLocal { _, _ in }
                query.stop()
            } else {
                _ = try cars.find("hp == \(i % 20)").observeLocal { _, _ in }  // dropped at once
            }
        }
        #expect(node.store.liveQueryCount == baseline)
        #expect(node.store.documents.observerCount == storeObservers)
        // Writes still work and reach a fresh observer.
        let log = EventLog()
        let last = try cars.findAll().observeLocal { log.record($0, $1) }
        try cars.upsert(["_id": "new"])
        #expect(eventually { log.last?.count == 21 })
        last.stop()
        #expect(delivered.load(ordering: .relaxed) <= 10_000)
    }

    /// After `stop()` returns no callback runs, even with writes racing on other threads and
    /// callbacks already queued.
    @Test func noCallbackAfterStopReturns() throws {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("noCallbackAfterStopReturns seed \(seed)")
        let writing = Atomic<Bool>(true)
        let collection = cars
        let writer = Thread {
            var i = 0
            while writing.load(ordering: .relaxed) {
                _ = try? collection.upsert(["_id": .string("w\(i % 50)"), "i": .int(Int64(i))])
                i += 1
            }
        }
        writer.start()
        defer { writing.store(false, ordering: .relaxed) }
        let late = Atomic<Int>(0)
        let slowQueue = DispatchQueue(label: "slow")
        for round in 0..<100 {
            let stopped = Atomic<Bool>(false)
            let queue = round % 2 == 0 ? slowQueue : LiveQuery.defaultDeliveryQueue
            let live = try cars.findAll().observeLocal(deliverOn: queue) { _, _ in
                if stopped.load(ordering: .acquiring) { late.add(1, ordering: .relaxed) }
                if round % 2 == 0 { usleep(200) }
            }
            usleep(UInt32.random(in: 0..<3_000, using: &rng))
            let stopper = DispatchQueue.global()
            stopper.sync {
                live.stop()
                stopped.store(true, ordering: .releasing)
            }
        }
        usleep(100_000)
        #expect(late.load(ordering: .relaxed) == 0, "seed \(seed)")
    }

    @Test func stoppingFromInsideTheCallbackDoesNotDeadlock() throws {
        let holder = Mutex<LiveQuery?>(nil)
        let calls = Atomic<Int>(0)
        let live = try cars.findAll().observeLocal { _, _ in
            calls.add(1, ordering: .relaxed)
            holder.withLock { $0 }?.stop()
        }
        holder.withLock { $0 = live }
        #expect(eventually { calls.load(ordering: .relaxed) >= 1 })
        try cars.upsert(["_id": "x"])  // its callback, if the initial one ran too early, stops
        #expect(eventually { live.isStopped })
        let seen = calls.load(ordering: .relaxed)
        try cars.upsert(["_id": "y"])
        usleep(100_000)
        #expect(calls.load(ordering: .relaxed) == seen && seen <= 2)
    }

    @Test func badQueriesThrowAtRegistration() throws {
        let baseline = node.store.liveQueryCount
        #expect(throws: (any Error).self) { try cars.find("hp >").observeLocal { _, _ in } }
        #expect(throws: (any Error).self) { try cars.find("hp > $args.x").observeLocal { _, _ in } }
        #expect(throws: (any Error).self) { try cars.findAll().limit(-1).observeLocal { _, _ in } }
        #expect(throws: (any Error).self) { try cars.findByID("").observeLocal { _, _ in } }
        #expect(node.store.liveQueryCount == baseline)
    }

    @Test func applyRebuildsTheNewResults() {
        func docs(_ ids: [String], _ v: Int = 0) -> [Document] {
            ids.map { Document(value: ["_id": .string($0), "v": .int(Int64(v))]) }
        }
        let old = docs(["a", "b", "c", "d", "e"])
        let new = docs(["e", "c", "x", "a"]) + docs(["d"], 1)
        let update = LiveQueryUpdate.diff(from: old, to: new)
        #expect(update.deletions == [1] && update.insertions == [2] && update.updates == [4])
        #expect(LiveQueryEvent.update(update).apply(to: old, new: new) == new)
        #expect(update.moves.count == 2)  // the fewest: a, c, d keep their order is impossible; c, d do
    }
}

struct Failure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

extension LiveQueryTests {
    /// `stop()` releases the callback: an object that holds its live query and is captured by
    /// the callback (the usual view-model shape) is freed once the query is stopped.
    @Test func stopReleasesTheCallback() throws {
        final class Owner: @unchecked Sendable { var live: LiveQuery? }
        weak var released: Owner?
        do {
            let owner = Owner()
            released = owner
            owner.live = try cars.findAll().observeLocal { _, _ in _ = owner.live }
            owner.live?.stop()
        }
        node.store.flushLiveQueries()
        #expect(eventually(timeout: 5) { released == nil })
    }
}
