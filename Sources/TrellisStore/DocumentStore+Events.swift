import Dispatch
import Glibc
import Synchronization
import TrellisCore

// Commit events for observers. User code never runs under the store lock or on the thread that
// committed (for a merge, the sync engine's queue): each commit's event is queued, under the lock
// so events keep commit order, on the store's own serial event queue, which calls the observers.

/// The registered observers of one store, and which thread is delivering to them.
final class ObserverList: Sendable {
    private let callbacks = Mutex<[UInt64: @Sendable (StoreEvent) -> Void]>([:])
    private let next = Atomic<UInt64>(0)
    /// The thread running observers right now, if any (so ``DocumentStore/waitForObservers()``
    /// called from an observer does not wait for itself).
    private let delivering = Mutex<pthread_t?>(nil)
    /// Events delivered, handed back for the committing thread to release (``takeDelivered()``).
    private let delivered = Mutex<StoreEvent?>(nil)

    func add(_ callback: @escaping @Sendable (StoreEvent) -> Void) -> UInt64 {
        let token = next.add(1, ordering: .relaxed).newValue
        callbacks.withLock { $0[token] = callback }
        return token
    }

    func remove(_ token: UInt64) { _ = callbacks.withLock { $0.removeValue(forKey: token) } }

    var count: Int { callbacks.withLock { $0.count } }

    /// Calls every observer registered now, in the order they were added.
    func deliver(_ event: StoreEvent) {
        let current = callbacks.withLock { $0.sorted { $0.key < $1.key }.map(\.value) }
        delivering.withLock { $0 = pthread_self() }
        defer { delivering.withLock { $0 = nil } }
        for callback in current { callback(event) }
    }

    /// Delivers `event`, then hands it back (``takeDelivered()``) instead of releasing it here.
    ///
    /// An event's values (up to ``DocumentStore/maxEventValueBytes``) were allocated by the
    /// committing thread. Released here, each of them locked the committing thread's malloc arena
    /// while that thread allocated the next batch's documents: 7 % of a merge's samples waited
    /// on that lock (docs/BENCHMARKS.md). The committing thread releases them after its next
    /// commit, outside the store lock, so the last event's values stay in memory until then; one
    /// not taken by the time the next is handed back is released here.
    func deliverAndHandBack(_ event: StoreEvent) {
        deliver(event)
        var untaken: StoreEvent? = event
        delivered.withLock { swap(&untaken, &$0) }
        _ = untaken  // released here, outside the lock
    }

    /// The event delivered and not yet taken, for the caller to release.
    func takeDelivered() -> StoreEvent? {
        delivered.withLock { held in
            var taken: StoreEvent?
            swap(&taken, &held)
            return taken
        }
    }

    var isDeliveringOnThisThread: Bool {
        delivering.withLock { thread in thread.map { pthread_equal($0, pthread_self()) != 0 } ?? false }
    }
}

extension DocumentStore {
    /// Registers a callback run after every commit that changed documents.
    ///
    /// Callbacks run on the store's own serial event queue, one commit's event at a time, in
    /// commit order, never under the store lock and never on the thread that committed, so they
    /// may call the store and the sync engine (a merge commits on the engine's queue). Several
    /// observers run in the order they were added.
    ///
    /// - Returns: a token for ``removeObserver(_:)``.
    @discardableResult
    public func addObserver(_ callback: @escaping @Sendable (StoreEvent) -> Void) -> UInt64 {
        observers.add(callback)
    }

    /// Stops calling an observer: after this returns it is not called again (except by a delivery
    /// already running on the event queue).
    public func removeObserver(_ token: UInt64) { observers.remove(token) }

    /// The number of registered observers (for leak tests).
    public var observerCount: Int { observers.count }

    /// Waits until the observers were called for every commit that returned before this call
    /// (tests, and tools that must see their own writes' events). Called from an observer, it
    /// returns at once.
    public func waitForObservers() {
        guard !observers.isDeliveringOnThisThread else { return }
        events.sync {}
    }

    /// The scope checks of the collections whose every changed key was checked (listed ones only).
    static func completeScopeChecks(_ s: State) -> [UTF8Key: ScopeCheck] {
        var checks: [UTF8Key: ScopeCheck] = [:]
        for (collection, checked) in s.scopeChecked where !s.unlistedCollections.contains(collection) {
            guard let keys = s.changedKeys[collection], keys.isSubset(of: checked.keys) else { continue }
            checks[collection] = checked.check
        }
        return checks
    }

    /// Queues the event of the transaction that just committed (called under the store lock).
    func queueEvent(_ s: inout State, origin: [UInt8]?) {
        defer {
            s.changedKeys = [:]
            s.unlistedCollections = []
            s.renumberedKeys = [:]
            s.changedValues = [:]
            s.changedValueBytes = 0
            s.evictedInCommit = false
            s.scopeChecked = [:]
            s.createdIn = []
        }
        guard !s.changedKeys.isEmpty || !s.unlistedCollections.isEmpty else { return }
        let event = StoreEvent(
            collections: Set(s.changedKeys.keys).union(s.unlistedCollections), origin: origin,
            evicted: s.evictedInCommit, changedKeys: s.changedKeys, unlistedCollections: s.unlistedCollections,
            changedValues: s.changedValues, lastSeq: s.nextSeq - 1,
            scopeChecks: Self.completeScopeChecks(s), renumberedKeys: s.renumberedKeys.filter { !$0.value.isEmpty },
            createdCollections: Set(s.createdIn.map { UTF8Key($0) }))
        let observers = self.observers
        events.async { observers.deliverAndHandBack(event) }
    }
}
