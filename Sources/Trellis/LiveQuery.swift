public import Dispatch
import Foundation
import Synchronization
import TrellisStore

// MARK: - Token

/// A running local observer (Ditto's `DittoLiveQuery`). Keep it: `stop()`, or dropping the last
/// reference, ends the callbacks.
///
/// After ``stop()`` returns no callback of this observer runs any more: a callback already
/// queued on the delivery queue is skipped, and `stop()` called from another thread while a
/// callback runs waits for that callback to return (so do not call `stop()` while holding
/// something the callback waits for). `stop()` from inside the observer's own callback returns
/// at once.
public final class LiveQuery: Sendable {
    /// The queue callbacks run on when the caller names none: one dedicated serial queue shared
    /// by those live queries. It is not `DispatchQueue.main`, because on Linux nothing drains the
    /// main queue unless the program calls `dispatchMain()` (or runs a run loop).
    public static let defaultDeliveryQueue = DispatchQueue(label: "trellis.live-query.delivery")

    /// The collection observed.
    public let collectionName: String
    /// The query observed (`_id == …` for a single-document observer).
    public let query: String
    let observation: any LiveObservation

    init(collectionName: String, query: String, observation: any LiveObservation) {
        self.collectionName = collectionName
        self.query = query
        self.observation = observation
    }

    /// `true` once ``stop()`` ran (or the owning task was cancelled).
    public var isStopped: Bool { observation.isStopped }

    /// Ends the callbacks and unregisters the observer. Idempotent; safe from any thread.
    public func stop() { observation.stop() }

    deinit { observation.stop() }
}

// MARK: - Async sequences

/// One element of ``PendingCursorOperation/observeLocalUpdates()``: the results and the event
/// that produced them from the previous element's results.
public struct LiveQueryResults: Sendable {
    /// The results, sorted and windowed as the query asks.
    public let documents: [Document]
    /// How they differ from the previous element's results (`.initial` for the first).
    public let event: LiveQueryEvent
}

/// One element of ``PendingIDSpecificOperation/observeLocalUpdates()``.
public struct SingleDocumentLiveQueryResult: Sendable {
    /// The document, `nil` while it does not exist locally.
    public let document: Document?
    /// `isInitial` for the first element; `oldDocument` is the previous element's document.
    public let event: SingleDocumentLiveQueryEvent
}

/// An `AsyncSequence` of live query results, built on the next-signal observer: the next
/// (coalesced) change is computed only when the consumer asks for the next element, so a slow
/// consumer sees fewer, larger events and memory stays bounded (one element buffered).
///
/// The observer runs from creation until the consuming task is cancelled, the loop ends (the
/// iterator and the sequence are released), or ``stop()`` is called. Iterate it once.
public struct LiveQuerySequence<Element: Sendable>: AsyncSequence, Sendable {
    let stream: AsyncStream<Element>
    let control: LiveQueryStreamControl

    /// Stops the observer; the iteration then ends after any buffered element.
    public func stop() { control.stop() }

    /// The iterator; the observer already runs (it started with the sequence).
    public func makeAsyncIterator() -> Iterator {
        Iterator(base: stream.makeAsyncIterator(), control: control)
    }

    /// Iterates the results; each call to `next()` signals the observer for the following one.
    public struct Iterator: AsyncIteratorProtocol {
        var base: AsyncStream<Element>.Iterator
        let control: LiveQueryStreamControl

        /// The next results: the first carries `.initial`, each later one the change since the
        /// previous element (several commits coalesced when the consumer was slower than them).
        ///
        /// - Returns: `nil` once the observer stopped (task cancelled, ``LiveQuerySequence/stop()``).
        public mutating func next() async -> Element? {
            control.signal()
            return await base.next()
        }
    }

    static func make(
        start: (
            _ yield: @escaping @Sendable (Element, @escaping @Sendable () -> Void) -> Void
        ) throws -> LiveQuery
    ) throws -> LiveQuerySequence {
        let (stream, continuation) = AsyncStream<Element>.makeStream(bufferingPolicy: .unbounded)
        let control = LiveQueryStreamControl()
        let live = try start { [weak control] element, signalNext in
            control?.offer(signalNext)
            continuation.yield(element)
        }
        control.attach(live, continuation: { continuation.finish() })
        continuation.onTermination = { [weak control] _ in control?.stop() }
        return LiveQuerySequence(stream: stream, control: control)
    }
}

/// Owns the live query behind a ``LiveQuerySequence`` and its pending `signalNext`.
final class LiveQueryStreamControl: Sendable {
    private struct State {
        var live: LiveQuery?
        var signalNext: (@Sendable () -> Void)?
        var finish: (@Sendable () -> Void)?
    }
    private let state = Mutex(State())

    func attach(_ live: LiveQuery, continuation finish: @escaping @Sendable () -> Void) {
        state.withLock {
            $0.live = live
            $0.finish = finish
        }
    }

    func offer(_ signalNext: @escaping @Sendable () -> Void) {
        state.withLock { $0.signalNext = signalNext }
    }

    func signal() {
        let next = state.withLock { s in
            defer { s.signalNext = nil }
            return s.signalNext
        }
        next?()
    }

    func stop() {
        let (live, finish) = state.withLock { s in
            defer {
                s.live = nil
                s.finish = nil
                s.signalNext = nil
            }
            return (s.live, s.finish)
        }
        live?.stop()
        finish?()
    }

    deinit {
        let live = state.withLock { $0.live }
        live?.stop()
    }
}

// MARK: - Registry

/// What one commit tells an observer about its collection.
enum LiveChange {
    /// Unknown changes: re-run the query.
    case unknown
    /// The commit wrote these documents (canonical keys) but did not carry all their values:
    /// re-run the query, reading the store as it is now (docs/LIVE-QUERIES.md, step 2).
    case reread(Set<UTF8Key>)
    /// The changed documents by canonical key (compared byte-wise), with their value after the
    /// commit (`nil`: absent), all written by it.
    case documents([UTF8Key: Value?], written: Set<UTF8Key>)
}

/// What an evaluation gives: the results after one commit, and the `_id`s of documents in the
/// results before or after it that the commit wrote.
struct LiveStep<Results> {
    var results: Results
    var written: Set<Value>
}

/// Results a live query compares and delivers.
protocol LiveResults: Sendable, Equatable {
    /// Whether a document with one of these `_id`s is in the results.
    func containsAny(of ids: Set<Value>) -> Bool
}

extension Array: LiveResults where Element == Document {
    func containsAny(of ids: Set<Value>) -> Bool { contains { ids.contains($0.id) } }
}

/// A registered observer, driven by the registry's evaluation queue.
protocol LiveObservation: AnyObject, Sendable {
    var collection: String { get }
    /// Where its callbacks run.
    var queue: DispatchQueue { get }
    var isStopped: Bool { get }
    /// The store's ``DocumentStore/lastSeq`` its first results were read at: commits up to it are
    /// already in them. Evaluation queue only.
    var startSeq: Int64 { get }
    /// Evaluates one commit. Evaluation queue only.
    func refresh(_ change: LiveChange)
    func stop()
}

/// The live queries of one store: one store observer for all of them, one serial evaluation
/// queue, queries indexed by collection.
///
/// A commit costs the writer one lock and, when a live query watches a touched collection, one
/// `async` to the evaluation queue (none while a pass is already scheduled). A pass evaluates the
/// commits it finds one at a time, in commit order, each with the values that commit wrote
/// (``StoreEvent/changedValues``), so every observer sees the results after each commit.
final class LiveQueryRegistry: Sendable {
    /// What one commit changed in one observed collection.
    private enum CommitChange {
        /// Too many documents to list: re-run the queries.
        case all
        /// The changed keys, and the values the commit wrote (a key without one: read the store).
        case keys(Set<UTF8Key>, values: [UTF8Key: String?])
    }

    /// One commit waiting for evaluation.
    private struct Commit {
        var lastSeq: Int64
        /// Observed collections only, in byte order.
        var changes: [(UTF8Key, CommitChange)]
    }

    private struct State {
        var observations: [UInt64: any LiveObservation] = [:]
        /// Collection names compare byte-wise: "é" and "e" + U+0301 are two collections.
        var byCollection: [UTF8Key: Set<UInt64>] = [:]
        /// Commits heard and not yet evaluated, oldest first.
        var pending: [Commit] = []
        var scheduled = false
        var next: UInt64 = 0
    }

    /// The default of ``Store/liveQueryEventLimit``.
    static let defaultEventLimit = 1_024

    let documents: DocumentStore
    let evaluation = DispatchQueue(label: "trellis.live-query.evaluate")
    /// Counters for tests and diagnostics.
    let stats = LiveQueryStats()
    /// The queued-event limit given to plain observers when they start.
    let eventLimit = Atomic<Int>(LiveQueryRegistry.defaultEventLimit)
    private let state = Mutex(State())
    private let token = Mutex<UInt64?>(nil)

    init(documents: DocumentStore) {
        self.documents = documents
        let token = documents.addObserver { [weak self] event in self?.heard(event) }
        self.token.withLock { $0 = token }
    }

    deinit {
        if let token = token.withLock({ $0 }) { documents.removeObserver(token) }
    }

    /// The number of registered observers.
    var count: Int { state.withLock { $0.observations.count } }

    /// Waits until every commit made before the call is evaluated and the callbacks it caused
    /// have run (including the evaluations their signals trigger). Must not be called from a
    /// live query's delivery queue or the evaluation queue.
    func settle() {
        documents.waitForObservers()
        var lastPasses = -1
        var rounds = 0
        while rounds < 64 {
            rounds += 1
            evaluation.sync {}
            let queues = state.withLock { s -> [DispatchQueue] in
                var seen: Set<ObjectIdentifier> = []
                return s.observations.keys.sorted().compactMap { id in
                    let queue = s.observations[id]!.queue
                    return seen.insert(ObjectIdentifier(queue)).inserted ? queue : nil
                }
            }
            for queue in queues { queue.sync {} }
            evaluation.sync {}
            let passes = stats.passes.load(ordering: .relaxed) + stats.deliveries.load(ordering: .relaxed)
            let idle = state.withLock { !$0.scheduled && $0.pending.isEmpty }
            if idle, passes == lastPasses { return }
            lastPasses = passes
        }
    }

    func add(_ observation: any LiveObservation) -> UInt64 {
        state.withLock { s in
            s.next += 1
            s.observations[s.next] = observation
            s.byCollection[UTF8Key(observation.collection), default: []].insert(s.next)
            return s.next
        }
    }

    func remove(_ id: UInt64) {
        // Released outside the lock: dropping the last reference may run user deinit code.
        let removed = state.withLock { s -> (any LiveObservation)? in
            guard let observation = s.observations.removeValue(forKey: id) else { return nil }
            let collection = UTF8Key(observation.collection)
            s.byCollection[collection]?.remove(id)
            if s.byCollection[collection]?.isEmpty == true {
                s.byCollection.removeValue(forKey: collection)
            }
            return observation
        }
        _ = removed
    }

    /// Runs on the store's event queue, once per commit, in commit order.
    private func heard(_ event: StoreEvent) {
        let schedule = state.withLock { s -> Bool in
            var changes: [(UTF8Key, CommitChange)] = []
            for collection in event.collections.sorted() where s.byCollection[collection] != nil {
                if event.unlistedCollections.contains(collection) {
                    changes.append((collection, .all))  // too many changed to list: run the queries again
                } else if var keys = event.changedKeys[collection] {
                    // A row only renumbered (logged again for a peer) kept its value.
                    if let renumbered = event.renumberedKeys[collection] { keys.subtract(renumbered) }
                    guard !keys.isEmpty else { continue }
                    changes.append((collection, .keys(keys, values: event.changedValues[collection] ?? [:])))
                }
            }
            guard !changes.isEmpty else { return false }
            s.pending.append(Commit(lastSeq: event.lastSeq, changes: changes))
            guard !s.scheduled else { return false }
            s.scheduled = true
            return true
        }
        if schedule { evaluation.async { self.drain() } }
    }

    /// Evaluates every commit heard since the last pass, one at a time, in commit order.
    /// Evaluation queue only.
    private func drain() {
        stats.passes.add(1, ordering: .relaxed)
        let commits = state.withLock { s -> [Commit] in
            defer {
                s.pending = []
                s.scheduled = false
            }
            return s.pending
        }
        for commit in commits {
            for (collection, pending) in commit.changes {
                let observations = state.withLock { s in
                    (s.byCollection[collection] ?? []).sorted().compactMap { s.observations[$0] }
                }
                .filter { !$0.isStopped && $0.startSeq < commit.lastSeq }
                guard !observations.isEmpty else { continue }
                let change: LiveChange
                switch pending {
                case .all: change = .unknown
                case .keys(let keys, let values): change = fetch(keys, carried: values)
                }
                for observation in observations where !observation.isStopped { observation.refresh(change) }
            }
        }
    }

    /// The changed documents' values after the commit, as it carried them; `.reread` (re-run)
    /// when it did not carry one (over ``DocumentStore/maxEventValueBytes``, or a row only
    /// renumbered) or one cannot be read. Read from the store instead, such a value would be as
    /// the latest commit left it, and patched in beside this commit's values it would make
    /// results that never existed; a re-run reads one state that did (docs/LIVE-QUERIES.md).
    private func fetch(_ keys: Set<UTF8Key>, carried: [UTF8Key: String?]) -> LiveChange {
        var values: [UTF8Key: Value?] = [:]
        values.reserveCapacity(keys.count)
        for key in keys {
            guard let text = carried[key] else { return .reread(keys) }
            do { values[key] = .some(try text.map { try JSON.parse($0) }) } catch { return .reread(keys) }
        }
        return .documents(values, written: Set(keys))
    }
}

/// How often live queries were evaluated, and how.
final class LiveQueryStats: Sendable {
    /// Evaluation passes (each evaluates the commits heard since the previous one).
    let passes = Atomic<Int>(0)
    /// Cursor evaluations that patched cached results from the changed documents.
    let patches = Atomic<Int>(0)
    /// Cursor evaluations that ran the query (registration, windowed queries, unknown changes).
    let reruns = Atomic<Int>(0)
    /// Callbacks queued for delivery.
    let deliveries = Atomic<Int>(0)
}

// MARK: - Observation

/// One queued callback: the results, those of the previous callback (`nil` for the first), the
/// `_id`s the covered commits wrote, and how many commits it covers.
struct LiveDelivery<Results: Sendable>: Sendable {
    var results: Results
    var previous: Results?
    var written: Set<Value>
    var commitCount: Int
    var number: UInt64
}

/// The delivery state machine shared by every kind of observer: evaluate on the registry's queue,
/// deliver on the app's queue, in commit order, at most `window` deliveries outstanding.
///
/// A plain observer (`autoSignal`) queues one delivery per commit that touches its results and
/// signals itself when each callback returns; its window is ``Store/liveQueryEventLimit``, and
/// while it is full, commits only update `current` and are delivered as one event when a
/// callback returns. A next-signal observer has a window of 1: between a delivery and its
/// `signalNext`, commits coalesce the same way.

/// Reads of a live query's initial results tried while commits land, before one is taken as is.
let liveQueryStartAttempts = 200
final class Observation<Results: LiveResults>: LiveObservation, @unchecked Sendable {
    // Invariant: `current`, `delivered`, `held*`, `outstanding`, `lastDelivery` and `startSeq`
    // are only touched on `registry.evaluation`; `evaluate` only runs there. `handler` only runs
    // on `queue` while holding `gate`, and `mailbox` is emptied only under `gate`, so callbacks
    // run one at a time and in order even on a concurrent queue.
    let collection: String
    let registry: LiveQueryRegistry
    let queue: DispatchQueue
    let autoSignal: Bool
    /// Deliveries that may be queued or running before their signal: the event limit for a
    /// plain observer, 1 for a next-signal one.
    let window: Int
    let evaluate: (LiveChange) throws -> LiveStep<Results>?
    /// The app's callback; released by ``stop()``, so a callback that captures the object
    /// holding the live query forms no lasting cycle. Read and cleared under `gate`.
    private var handler: (@Sendable (LiveDelivery<Results>, @escaping @Sendable () -> Void) -> Void)?
    private var current: Results?
    private var delivered: Results?
    /// Commits evaluated since the last delivery, and the `_id`s they wrote.
    private var heldCommits = 0
    private var heldWritten: Set<Value> = []
    /// Deliveries not signalled yet, by number.
    private var outstanding: Set<UInt64> = []
    private var lastDelivery: UInt64 = 0
    private(set) var startSeq: Int64 = 0
    private var id: UInt64 = 0
    private let gate = NSRecursiveLock()
    private let mailbox = Mutex<[LiveDelivery<Results>]>([])
    private let stopped = Atomic<Bool>(false)

    init(
        collection: String, registry: LiveQueryRegistry, queue: DispatchQueue, autoSignal: Bool,
        evaluate: @escaping (LiveChange) throws -> LiveStep<Results>?,
        handler: @escaping @Sendable (LiveDelivery<Results>, @escaping @Sendable () -> Void) -> Void
    ) {
        self.collection = collection
        self.registry = registry
        self.queue = queue
        self.autoSignal = autoSignal
        self.window = autoSignal ? max(1, registry.eventLimit.load(ordering: .relaxed)) : 1
        self.evaluate = evaluate
        self.handler = handler
    }

    var isStopped: Bool { stopped.load(ordering: .acquiring) }

    /// Registers, computes the initial results and queues the initial callback. The results are
    /// read between two equal readings of the store's `lastSeq` (retried, with a pause that grows
    /// to 1 ms, while commits land), so exactly the commits after them are evaluated afterwards:
    /// none missed, none applied twice. Only when all ``liveQueryStartAttempts`` race a commit (a writer
    /// committing without pause for about 0.2 s) may the commits that raced the last read be
    /// applied again; none is ever missed.
    ///
    /// - Throws: whatever the first evaluation throws (bad query, missing `$args`, bad sort).
    func start() throws {
        try registry.evaluation.sync {
            id = registry.add(self)
            do {
                for attempt in 1...liveQueryStartAttempts {
                    let before = registry.documents.lastSeq
                    current = try evaluate(.unknown)?.results
                    let after = registry.documents.lastSeq
                    // After every attempt raced a commit, commits in before...after may be applied
                    // again (they were possibly read); none is missed.
                    startSeq = before
                    if before == after || attempt == liveQueryStartAttempts { break }
                    // A writer is busy: let it get ahead, a little longer each time (at most about
                    // 0.2 s in all), so that one read falls between two commits.
                    usleep(UInt32(min(attempt, 10) * 100))
                }
            } catch {
                stopped.store(true, ordering: .releasing)
                registry.remove(id)
                throw error
            }
            deliver()
        }
    }

    func refresh(_ change: LiveChange) {
        guard !isStopped, let step = try? evaluate(change) else { return }
        guard step.results != current || !step.written.isEmpty else { return }
        current = step.results
        heldCommits += 1
        heldWritten.formUnion(step.written)
        if outstanding.count < window { deliver() }
    }

    private func deliver() {
        guard let current else { return }
        registry.stats.deliveries.add(1, ordering: .relaxed)
        lastDelivery &+= 1
        let item = LiveDelivery(
            results: current, previous: delivered, written: heldWritten, commitCount: heldCommits,
            number: lastDelivery)
        outstanding.insert(lastDelivery)
        delivered = current
        heldCommits = 0
        heldWritten = []
        mailbox.withLock { $0.append(item) }
        queue.async { [self] in
            gate.lock()
            defer { gate.unlock() }
            guard let item = mailbox.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) else { return }
            guard !isStopped, let handler else { return }
            let signal: @Sendable () -> Void = { [weak self] in self?.signalled(item.number) }
            handler(item, signal)
            if autoSignal { signal() }
        }
    }

    private func signalled(_ number: UInt64) {
        registry.evaluation.async { [self] in
            guard !isStopped, outstanding.remove(number) != nil, heldCommits > 0 else { return }
            guard let current, let delivered, current == delivered, !current.containsAny(of: heldWritten) else {
                deliver()
                return
            }
            // The commits held back left the results as delivered: nothing to show.
            heldCommits = 0
            heldWritten = []
        }
    }

    func stop() {
        gate.lock()
        let wasStopped = stopped.exchange(true, ordering: .acquiringAndReleasing)
        let released = handler
        handler = nil
        let dropped = mailbox.withLock { queued in
            defer { queued = [] }
            return queued
        }
        gate.unlock()
        if !wasStopped { registry.remove(id) }
        _ = (released, dropped)  // released here, outside the lock (they may hold the app's objects)
    }
}

/// The cached results of a cursor live query, patched from the changed documents when the query
/// has no offset (a limited window is cut back to its limit), re-run when it has one or when a
/// document left a full window (the next ones are only in the store). Evaluation queue only.
final class CursorEvaluator: @unchecked Sendable {
    typealias Row = (key: String, document: Document)
    // Invariant: used only on the registry's evaluation queue (after construction).
    let documents: DocumentStore
    let stats: LiveQueryStats
    let collection: String
    let query: Query
    let bound: Query
    let args: UTF8Map<Value>
    let sort: [SortKey]
    let limit: Int?
    let offset: Int
    private var rows: [Row] = []
    /// The keys of `rows`, compared byte-wise.
    private var keys: Set<UTF8Key> = []

    init(
        documents: DocumentStore, stats: LiveQueryStats, collection: String, query: Query, args: UTF8Map<Value>,
        sort: [SortKey],
        limit: Int?, offset: Int
    ) throws {
        self.documents = documents
        self.stats = stats
        self.collection = collection
        self.query = query
        self.bound = try query.bind(args: args)
        self.args = args
        self.sort = sort
        self.limit = limit
        self.offset = offset
    }

    /// The results after `change`, with the `_id`s of documents the commit wrote that were in
    /// the results before or are now; `nil` when it cannot have changed them.
    func evaluate(_ change: LiveChange) throws -> LiveStep<[Document]>? {
        switch change {
        case .unknown:
            try rerun()
            return LiveStep(results: rows.map(\.document), written: [])
        case .reread(let written):
            let before = keys
            try rerun()
            return LiveStep(results: rows.map(\.document), written: ids(of: written, before: before))
        case .documents(let values, let written):
            let relevant = values.contains { key, value in isRelevant(key, value) }
            guard relevant else { return nil }
            let before = keys
            if offset == 0 {
                // Documents of the store outside a full window, unchanged, sort after its last one.
                let boundary = limit.flatMap { rows.count >= $0 ? rows.last : nil }
                stats.patches.add(1, ordering: .relaxed)
                patch(values)
                if let limit {
                    let known = boundary.map { last in rows.prefix { !less(last, $0) }.count } ?? rows.count
                    if known >= limit {
                        for row in rows[limit...] { keys.remove(UTF8Key(row.key)) }
                        rows.removeLast(rows.count - limit)
                    } else if boundary != nil {
                        try rerun()  // a document left a full window: the next ones are only in the store
                    }
                }
            } else {
                try rerun()
            }
            return LiveStep(results: rows.map(\.document), written: ids(of: written, before: before))
        }
    }

    /// The `_id`s of the `written` documents that were in the results (`before`, their keys) or
    /// are now.
    private func ids(of written: Set<UTF8Key>, before: Set<UTF8Key>) -> Set<Value> {
        var ids: Set<Value> = []
        for key in written where before.contains(key) || keys.contains(key) {
            if let id = try? JSON.parse(key.string) { ids.insert(id) }
        }
        return ids
    }

    /// Whether a changed document can change the results.
    private func isRelevant(_ key: UTF8Key, _ value: Value?) -> Bool {
        if keys.contains(key) { return true }
        // With an offset, a document that left the query may have been before the window.
        if offset > 0 { return true }
        guard let value, (try? bound.matches(value)) == true else { return false }
        if let limit, rows.count >= limit, let last = rows.last {
            // A new match sorting after a full window stays outside it.
            return less((key.string, Document(value: value)), last)
        }
        return true
    }

    /// Takes the changed documents out of the results and merges those that match back in at
    /// their sorted positions: O(k + c log c) for k results and c changed documents.
    private func patch(_ values: [UTF8Key: Value?]) {
        let changed = Set(values.keys)
        if !keys.isDisjoint(with: changed) {
            rows.removeAll { changed.contains(UTF8Key($0.key)) }
            keys.subtract(changed)
        }
        var added: [Row] = []
        for (key, value) in values {
            guard let value, (try? bound.matches(value)) == true else { continue }
            added.append((key: key.string, document: Document(value: value)))
            keys.insert(key)
        }
        guard !added.isEmpty else { return }
        added.sort(by: less)
        if added.count == 1 {
            var low = 0
            var high = rows.count
            while low < high {
                let mid = (low + high) / 2
                if less(rows[mid], added[0]) { low = mid + 1 } else { high = mid }
            }
            rows.insert(added[0], at: low)
            return
        }
        var merged: [Row] = []
        merged.reserveCapacity(rows.count + added.count)
        var (i, j) = (0, 0)
        while i < rows.count || j < added.count {
            if j == added.count || (i < rows.count && less(rows[i], added[j])) {
                merged.append(rows[i])
                i += 1
            } else {
                merged.append(added[j])
                j += 1
            }
        }
        rows = merged
    }

    private func rerun() throws {
        stats.reruns.add(1, ordering: .relaxed)
        let stored = try documents.storedDocuments(
            in: collection, matching: query, args: args, sort: sort, limit: limit, offset: offset)
        rows = stored.map { (key: $0.key, document: Document(key: $0.key, json: $0.json)) }
        keys = Set(rows.map { UTF8Key($0.key) })
    }

    /// The store's result order: the sort keys, then `_id` key byte-wise.
    private func less(_ a: Row, _ b: Row) -> Bool {
        for key in sort {
            var order = Value.sortOrder(a.document.value.value(at: key.path), b.document.value.value(at: key.path))
            if key.direction == .descending { order = order.reversed }
            if order != .equal { return order == .less }
        }
        return UTF8Key.compare(a.key, b.key) < 0
    }
}

/// The single-document result compared between evaluations.
struct SingleDocumentResult: LiveResults {
    var document: Document?

    func containsAny(of ids: Set<Value>) -> Bool { document.map { ids.contains($0.id) } ?? false }
}

// MARK: - Cursor observers

extension PendingCursorOperation {
    /// Calls `handler` with the results now (event `.initial`) and after every committed change
    /// to them, local or merged from a peer (event `.update`, see ``LiveQueryUpdate``).
    ///
    /// ```swift
    /// let live = try cars.find("Origin == 'Japan'").sort("hp", direction: .descending).limit(10)
    ///     .observeLocal { docs, event in
    ///         if case .update(let update) = event { print(update.insertions, update.deletions) }
    ///     }
    /// // … later
    /// live.stop()
    /// ```
    ///
    /// Sort, limit and offset shape the results (a limited query refills after a deletion).
    /// **One callback per committed transaction** that touches the results (changes which
    /// documents they hold or their order, or writes a document in them, even with the same
    /// value), in commit order, each with the results after that commit; applying each event to
    /// the previous results gives the new ones. A commit that touches nothing in the results
    /// delivers nothing. One callback runs at a time. At most ``Store/liveQueryEventLimit``
    /// events wait for the queue; beyond it commits are merged into one event whose
    /// ``LiveQueryUpdate/commitCount`` says how many it covers.
    ///
    /// - Parameters:
    ///   - queue: where callbacks run; by default ``LiveQuery/defaultDeliveryQueue``, a dedicated
    ///     serial queue (not `.main`: on Linux nothing drains the main queue unless the program
    ///     calls `dispatchMain()`).
    ///   - handler: `(documents, event)`.
    /// - Returns: a ``LiveQuery``; keep it, `stop()` or dropping it ends the callbacks.
    /// - Throws: as ``exec()`` (bad query, missing `$args`, bad sort path, negative window).
    /// - Complexity: registering runs the query once. After a commit touching the collection, a
    ///   query without offset re-checks only the changed documents (O(k + c log c) for c changed
    ///   documents and k results); a query with an offset, or a full window a document leaves,
    ///   re-runs.
    public func observeLocal(
        deliverOn queue: DispatchQueue = LiveQuery.defaultDeliveryQueue,
        _ handler: @escaping @Sendable ([Document], LiveQueryEvent) -> Void
    ) throws -> LiveQuery {
        try startObserving(queue: queue, autoSignal: true) { documents, event, _ in handler(documents, event) }
    }

    /// Like ``observeLocal(deliverOn:_:)``, but no further callback runs until the app calls the
    /// `signalNext` closure it was handed (from any thread, once). Changes committed meanwhile
    /// coalesce into one event computed against the results of the last callback
    /// (``LiveQueryUpdate/commitCount`` commits; nothing when they left the results as delivered).
    ///
    /// ```swift
    /// let live = try cars.findAll().observeLocalWithNextSignal { docs, event, signalNext in
    ///     render(docs) { signalNext() }
    /// }
    /// ```
    ///
    /// - Parameters:
    ///   - queue: where callbacks run; by default ``LiveQuery/defaultDeliveryQueue``.
    ///   - handler: `(documents, event, signalNext)`.
    /// - Returns: a ``LiveQuery``; keep it, `stop()` or dropping it ends the callbacks.
    /// - Throws: as ``exec()``.
    public func observeLocalWithNextSignal(
        deliverOn queue: DispatchQueue = LiveQuery.defaultDeliveryQueue,
        _ handler: @escaping @Sendable ([Document], LiveQueryEvent, @escaping @Sendable () -> Void) -> Void
    ) throws -> LiveQuery {
        try startObserving(queue: queue, autoSignal: false, handler)
    }

    /// The results and events of ``observeLocalWithNextSignal(deliverOn:_:)`` as an
    /// `AsyncSequence`: the first element carries `.initial`; asking for the next element is the
    /// signal, so a slow consumer gets one coalesced event per element.
    ///
    /// ```swift
    /// for await results in try cars.find("sold == false").observeLocalUpdates() {
    ///     print(results.documents.count, results.event)
    /// }   // leaving the loop or cancelling the task stops the observer
    /// ```
    ///
    /// - Throws: as ``exec()``.
    public func observeLocalUpdates() throws -> LiveQuerySequence<LiveQueryResults> {
        try LiveQuerySequence.make { yield in
            try startObserving(queue: LiveQuery.defaultDeliveryQueue, autoSignal: false) { documents, event, signal in
                yield(LiveQueryResults(documents: documents, event: event), signal)
            }
        }
    }

    private func startObserving(
        queue: DispatchQueue, autoSignal: Bool,
        _ handler: @escaping @Sendable ([Document], LiveQueryEvent, @escaping @Sendable () -> Void) -> Void
    ) throws -> LiveQuery {
        let (parsed, keys) = try resolved()
        let store = collection.store
        let evaluator = try CursorEvaluator(
            documents: store.documents, stats: store.liveQueries.stats, collection: collection.name, query: parsed,
            args: args, sort: keys,
            limit: limitCount, offset: offsetCount)
        let observation = Observation<[Document]>(
            collection: collection.name, registry: store.liveQueries, queue: queue, autoSignal: autoSignal,
            evaluate: { try evaluator.evaluate($0) },
            handler: { delivery, signal in
                let event: LiveQueryEvent =
                    delivery.previous.map {
                        .update(
                            LiveQueryUpdate.diff(
                                from: $0, to: delivery.results, rewritten: delivery.written,
                                commitCount: delivery.commitCount))
                    } ?? .initial
                handler(delivery.results, event, signal)
            })
        try observation.start()
        return LiveQuery(collectionName: collection.name, query: query, observation: observation)
    }
}

// MARK: - Single-document observers

extension PendingIDSpecificOperation {
    /// Calls `handler` with the document now (`isInitial`) and once after every committed
    /// transaction that writes it (even with the same value), local or merged from a peer, in
    /// commit order, with the document as that commit left it; the document is `nil` while it
    /// does not exist locally (never written, removed or evicted). `oldDocument` is the document
    /// of the previous callback.
    ///
    /// ```swift
    /// let live = try cars.findByID("c1").observeLocal { doc, event in
    ///     print(event.isInitial, event.oldDocument?.json ?? "-", doc?.json ?? "absent")
    /// }
    /// ```
    ///
    /// Threading, the queued-event limit and lifetime as
    /// ``PendingCursorOperation/observeLocal(deliverOn:_:)``.
    ///
    /// - Parameters:
    ///   - queue: where callbacks run; by default ``LiveQuery/defaultDeliveryQueue``.
    ///   - handler: `(document, event)`.
    /// - Returns: a ``LiveQuery``; keep it, `stop()` or dropping it ends the callbacks.
    /// - Throws: ``StoreError/invalidID(_:)`` for a bad `_id`.
    /// - Complexity: one indexed read per commit that changes this document.
    public func observeLocal(
        deliverOn queue: DispatchQueue = LiveQuery.defaultDeliveryQueue,
        _ handler: @escaping @Sendable (Document?, SingleDocumentLiveQueryEvent) -> Void
    ) throws -> LiveQuery {
        try startObserving(queue: queue, autoSignal: true) { document, event, _ in handler(document, event) }
    }

    /// Like ``observeLocal(deliverOn:_:)``, with next-signal backpressure as
    /// ``PendingCursorOperation/observeLocalWithNextSignal(deliverOn:_:)``: commits made before
    /// the signal coalesce into one event (``SingleDocumentLiveQueryEvent/commitCount``).
    ///
    /// - Parameters:
    ///   - queue: where callbacks run; by default ``LiveQuery/defaultDeliveryQueue``.
    ///   - handler: `(document, event, signalNext)`.
    /// - Returns: a ``LiveQuery``; keep it, `stop()` or dropping it ends the callbacks.
    /// - Throws: ``StoreError/invalidID(_:)`` for a bad `_id`.
    public func observeLocalWithNextSignal(
        deliverOn queue: DispatchQueue = LiveQuery.defaultDeliveryQueue,
        _ handler:
            @escaping @Sendable (Document?, SingleDocumentLiveQueryEvent, @escaping @Sendable () -> Void) ->
            Void
    ) throws -> LiveQuery {
        try startObserving(queue: queue, autoSignal: false, handler)
    }

    /// The document and its events as an `AsyncSequence`, as
    /// ``PendingCursorOperation/observeLocalUpdates()``.
    public func observeLocalUpdates() throws -> LiveQuerySequence<SingleDocumentLiveQueryResult> {
        try LiveQuerySequence.make { yield in
            try startObserving(queue: LiveQuery.defaultDeliveryQueue, autoSignal: false) { document, event, signal in
                yield(SingleDocumentLiveQueryResult(document: document, event: event), signal)
            }
        }
    }

    private func startObserving(
        queue: DispatchQueue, autoSignal: Bool,
        _ handler: @escaping @Sendable (Document?, SingleDocumentLiveQueryEvent, @escaping @Sendable () -> Void) -> Void
    ) throws -> LiveQuery {
        let key = UTF8Key(try DocumentStore.key(for: id))
        let store = collection.store
        let (id, name) = (id, collection.name)
        /// The document as the store holds it now.
        @Sendable func stored(written: Set<Value>) throws -> LiveStep<SingleDocumentResult> {
            LiveStep(
                results: SingleDocumentResult(
                    document: try store.documents.document(id: id, in: name).map(Document.init(value:))),
                written: written)
        }
        let observation = Observation<SingleDocumentResult>(
            collection: name, registry: store.liveQueries, queue: queue, autoSignal: autoSignal,
            evaluate: { change in
                switch change {
                case .documents(let values, let written):
                    guard let value = values[key] else { return nil }  // not changed
                    return LiveStep(
                        results: SingleDocumentResult(document: value.map(Document.init(value:))),
                        written: written.contains(key) ? [id] : [])
                case .unknown:
                    return try stored(written: [])
                case .reread(let written):
                    guard written.contains(key) else { return nil }  // not changed
                    return try stored(written: [id])
                }
            },
            handler: { delivery, signal in
                let event = SingleDocumentLiveQueryEvent(
                    isInitial: delivery.previous == nil, oldDocument: delivery.previous?.document,
                    commitCount: delivery.commitCount)
                handler(delivery.results.document, event, signal)
            })
        try observation.start()
        return LiveQuery(collectionName: name, query: "_id == \(JSON.string(id))", observation: observation)
    }
}
