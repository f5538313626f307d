public import Dispatch
import Foundation
internal import Glibc
import Synchronization
public import TrellisCore
public import TrellisNet
public import TrellisStore

/// What this node knows about one connected peer.
public struct PeerInfo: Sendable, CustomStringConvertible {
    public var peerKey: [UInt8]
    public var address: String
    public var isInitiator: Bool
    public var siteID: SiteID?
    /// The session's phase: `established`, `awaiting hello`, `standby (duplicate)`.
    public var phase: String
    /// The peer's subscriptions this node serves.
    public var servedSubscriptions: [SubscriptionSpec]
    /// Subscriptions the peer said it cannot serve, with its reason.
    public var refusedSubscriptions: [(SubscriptionSpec, String)]

    public var keyHex: String { Self.hex(peerKey) }

    /// A peer key as lowercase hex digits.
    static func hex(_ key: [UInt8]) -> String { key.map { String(format: "%02x", $0) }.joined() }

    public var description: String {
        var text =
            "\(keyHex.prefix(16)) \(address) \(isInitiator ? "outbound" : "inbound"), serving \(servedSubscriptions.count) subscription(s)"
        if phase != "established" { text += " [\(phase)]" }
        for (spec, reason) in refusedSubscriptions { text += "\n  cannot serve '\(spec)': \(reason)" }
        return text
    }
}

/// Where a ``Store``'s subscriptions go: a node's ``SyncEngine``, or a simulated node.
public protocol SubscriptionService: AnyObject, Sendable {
    /// Asks peers for the documents matching `spec` while held (two holders share it).
    ///
    /// - Throws: when the query does not parse or bind, or the collection name cannot travel.
    func subscribe(_ spec: SubscriptionSpec) throws
    /// Releases one ``subscribe(_:)``.
    func unsubscribe(_ spec: SubscriptionSpec)
}

/// The sync engine over real links: one ``SyncHost`` (and so one ``Replicator``) driven on one
/// serial queue, with a 100 ms tick for keepalives, liveness, retries and dials.
///
/// Replication is background work: the queue runs at the quality of service given to ``init``
/// (`.background` by default), which libdispatch on Linux runs at a nice value of its own (10
/// for `.background`, 2 for `.utility`, 0 for `.default`), and the threads of the node's links,
/// dials, handshakes and discovery run at the same nice value (``threadNice``). The
/// application's own threads (nice 0) then go first when the cores are busy: its reads wait less
/// for a merge or a peer's scan, and replication still gets its share (docs/ARCHITECTURE.md,
/// "Threads").
///
/// Nothing on the queue blocks on a socket: links queue outbound messages and report
/// congestion; each link's reader waits (inbound backpressure) while more than
/// ``maxQueuedInbound`` of its messages wait for the queue. Public methods may be called from
/// any thread, including from callbacks running on the engine's queue.
public final class SyncEngine: SyncTransport, SubscriptionService, @unchecked Sendable {
    // Invariant: `host`, `links`, `scanScheduled`, `discovery` are touched only on `queue`.
    let queue: DispatchQueue
    /// The Linux nice value the engine's queue runs at (its quality of service as libdispatch maps
    /// it), which the node's link, dial, handshake and discovery threads take too
    /// (``adoptThreadNice()``).
    public let threadNice: Int32
    /// Marks the engine queues (one key for all engines: a key must outlive every queue it is
    /// set on), with the engine's identity as the value.
    private static let onQueue = DispatchSpecificKey<ObjectIdentifier>()
    public let store: DocumentStore
    public let peerKey: [UInt8]
    let log: @Sendable (String) -> Void
    private(set) var host: SyncHost!
    private var links: [LinkID: any MessageLink] = [:]
    private let nextLink = Atomic<UInt64>(0)
    /// Links closed since the engine started, per reason (links that classify their ends: TCP).
    public let linkCloses = LinkCloseCounters()
    private var scanScheduled = false
    private var timer: (any DispatchSourceTimer)?
    private var observerToken: UInt64 = 0
    private let dialer = Mutex<(@Sendable (String) -> Void)?>(nil)
    private var statusObservers: [UInt64: @Sendable (ReplicatorStatus) -> Void] = [:]
    private var nextStatusObserver: UInt64 = 0
    private var lastStatus: ReplicatorStatus?
    private var lastStatusCheck: Millis = 0
    /// Where status observers are called: one serial queue, in order, never on the engine's queue.
    private let statusQueue = DispatchQueue(label: "trellis.sync.status")
    /// How often observed status is compared with the last one delivered, in milliseconds.
    public static let statusInterval: Millis = 250
    /// LAN discovery, when started (SyncEngine+Discovery.swift).
    var discovery: DiscoveryState?
    /// Told the discovery cache after each change (``observeDiscovery(_:)``).
    var discoveryObserver: (@Sendable ([DiscoveredPeer]) -> Void)?
    /// Messages read from one link and not yet handled, before its reader waits.
    public static let maxQueuedInbound = 16
    /// Discovery datagrams waiting for the engine's queue, and those dropped because too many
    /// waited (SyncEngine+Discovery.swift).
    let discoveryBacklog = Atomic<Int>(0)
    let discoveryDropped = Atomic<Int>(0)
    /// Discovery datagrams that may wait for the engine's queue; more are dropped unread, so a
    /// flood on the discovery port cannot pile work on the queue sessions run on.
    public static let maxDiscoveryBacklog = 64

    /// - Parameters:
    ///   - store: the local store.
    ///   - peerKey: this node's static public key.
    ///   - configuration: replication limits and timings (its `peerKey` is replaced by `peerKey`).
    ///   - log: where session events go.
    ///   - saveSitePins: persists the site pins when they change (``SyncHost/saveSitePins``).
    ///   - qos: the quality of service of replication work (the engine's queue; its threads take
    ///     the same nice value): `.background` by default, `.default` to run it as the
    ///     application's own work.
    /// - Throws: ``StoreError`` reading the store's rescan generations.
    public init(
        store: DocumentStore, peerKey: [UInt8], configuration: ReplicatorConfiguration? = nil,
        log: @escaping @Sendable (String) -> Void = { _ in },
        saveSitePins: (@Sendable ([SitePin]) throws -> Void)? = nil,
        qos: DispatchQoS = .background
    ) throws {
        queue = DispatchQueue(label: "trellis.sync", qos: qos)
        // Asked on the queue's own thread: `sync` would run the block on the caller's.
        let asked = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var nice: Int32 = 0
        queue.async {
            nice = Self.currentThreadNice()
            asked.signal()
        }
        asked.wait()
        threadNice = nice
        self.store = store
        self.peerKey = peerKey
        self.log = log
        queue.setSpecific(key: Self.onQueue, value: ObjectIdentifier(self))
        var config = configuration ?? ReplicatorConfiguration(peerKey: peerKey)
        config.peerKey = peerKey
        let seed = UInt64.random(in: .min ... .max)
        let host = try SyncHost(
            configuration: config, store: store, transport: self, seed: seed, now: Self.monotonicMillis, log: log)
        host.saveSitePins = saveSitePins
        // Scan time is shared fairly among peers by wall time on this queue, which it blocks.
        host.scanClock = { DispatchTime.now().uptimeNanoseconds }
        queue.sync { self.host = host }
        let token = store.addObserver { [weak self] event in
            guard let self else { return }
            self.queue.async { self.storeChanged(event) }
        }
        let timer = DispatchSource.makeTimerSource(queue: queue)
        timer.schedule(deadline: .now() + .milliseconds(100), repeating: .milliseconds(100))
        timer.setEventHandler { [weak self] in
            guard let self else { return }
            self.host.tick()
            self.discoveryTick()
            self.scheduleScans()
            self.pushStatus()
        }
        timer.resume()
        queue.sync {
            observerToken = token
            self.timer = timer
        }
    }

    deinit {
        timer?.cancel()
        store.removeObserver(observerToken)
    }

    /// The nice value of the calling thread (Linux keeps one per thread).
    static func currentThreadNice() -> Int32 {
        getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)
    }

    /// Runs the calling thread at ``threadNice``, as replication work; a thread started by one
    /// that did takes it too (Linux copies a thread's nice value to the threads it creates). A
    /// thread may not be allowed to lower its nice value (raise its priority): it then keeps the
    /// one it had.
    func adoptThreadNice() {
        guard Self.currentThreadNice() != threadNice else { return }
        _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, threadNice)
    }

    static func monotonicMillis() -> Millis { Millis(DispatchTime.now().uptimeNanoseconds / 1_000_000) }

    /// Runs `body` on the engine's queue and returns its result (inline when already there).
    func onEngine<R>(_ body: () throws -> R) rethrows -> R {
        if DispatchQueue.getSpecific(key: Self.onQueue) == ObjectIdentifier(self) { return try body() }
        return try queue.sync(execute: body)
    }

    /// Runs `body` on the engine queue after everything queued before it (for tests and tools).
    public func sync<R: Sendable>(_ body: @Sendable () -> R) -> R { onEngine(body) }

    // MARK: Subscriptions

    /// Asks peers for the documents matching `spec` (replicated to this store while connected).
    ///
    /// - Throws: ``QueryParseError`` or ``QueryEvaluationError`` when the query does not parse
    ///   or bind, ``WireError`` for a collection name that cannot travel.
    public func subscribe(_ spec: SubscriptionSpec) throws {
        try onEngine {
            try host.subscribe(spec)
            scheduleScans()
        }
    }

    /// Releases one ``subscribe(_:)`` of `spec`; peers stop being asked for it when none is left.
    public func unsubscribe(_ spec: SubscriptionSpec) {
        onEngine {
            host.unsubscribe(spec)
            scheduleScans()
        }
    }

    /// This node's own subscriptions.
    public var subscriptions: [SubscriptionSpec] { onEngine { host.replicator.subscriptions } }

    // MARK: Authorization

    /// Who may read and write which collection (``Replicator/authorization``).
    public var authorization: Authorization { onEngine { host.replicator.authorization } }

    /// Replaces the authorization rules at once, sessions staying open
    /// (``Replicator/setAuthorization(_:now:)``).
    public func setAuthorization(_ rules: Authorization) {
        onEngine {
            host.setAuthorization(rules)
            scheduleScans()
        }
    }

    /// What the rules and site pins refused since the engine started.
    public var authorizationRefusals: AuthorizationRefusals { onEngine { host.replicator.refusals } }

    /// The site pins, least recently seen first.
    public var sitePins: [SitePin] { onEngine { host.replicator.sitePins } }

    /// The peers with a session (established, or waiting for a duplicate to be resolved).
    public var peers: [PeerInfo] {
        onEngine {
            host.replicator.status.peers.filter { $0.phase != "awaiting hello" && $0.phase != "closed" }.map { p in
                PeerInfo(
                    peerKey: p.peerKey, address: p.address, isInitiator: p.initiator, siteID: p.siteID,
                    phase: p.phase, servedSubscriptions: p.served.map(\.spec),
                    refusedSubscriptions: p.asked.compactMap { s in s.error.map { (s.spec, $0) } })
            }
        }
    }

    /// Every session and static peer as the replicator sees them.
    public var status: ReplicatorStatus { onEngine { fullStatus } }

    /// The replicator's status with the discovery cache.
    private var fullStatus: ReplicatorStatus {
        var status = host.replicator.status
        status.discovered = discovery?.machine.peers ?? []
        return status
    }

    /// Calls `handler` with the replicator's status now and then whenever it changed, checked
    /// every ``statusInterval`` ms; calls come in order on one serial queue of the engine's
    /// (never the engine's own queue, so a handler may call the engine).
    ///
    /// - Returns: a token for ``removeStatusObserver(_:)``.
    public func addStatusObserver(_ handler: @escaping @Sendable (ReplicatorStatus) -> Void) -> UInt64 {
        onEngine {
            nextStatusObserver += 1
            statusObservers[nextStatusObserver] = handler
            let current = fullStatus
            statusQueue.async { handler(current) }
            return nextStatusObserver
        }
    }

    /// Stops calling an observer; a call already queued may still run.
    public func removeStatusObserver(_ token: UInt64) {
        onEngine {
            statusObservers[token] = nil
            if statusObservers.isEmpty { lastStatus = nil }
        }
    }

    /// The engine's clock, monotonic milliseconds (the one ``SyncProgress/lastReceived`` uses).
    public static func now() -> Millis { monotonicMillis() }

    private func pushStatus() {
        guard !statusObservers.isEmpty else { return }
        let now = Self.monotonicMillis()
        guard now - lastStatusCheck >= Self.statusInterval else { return }
        lastStatusCheck = now
        let current = fullStatus
        // A beacon that only refreshes when a discovered peer was last seen is not a change.
        var comparable = current
        for i in comparable.discovered.indices { comparable.discovered[i].lastSeen = 0 }
        guard comparable != lastStatus else { return }
        lastStatus = comparable
        let handlers = statusObservers.keys.sorted().map { statusObservers[$0]! }
        statusQueue.async { for handler in handlers { handler(current) } }
    }

    // MARK: Links

    /// Sets how ``ReplicatorDirective/dial(_:)`` connects (``MeshNetwork`` does).
    public func setDialer(_ dial: @escaping @Sendable (String) -> Void) {
        dialer.withLock { $0 = dial }
    }

    /// Keeps a connection to a static peer address (`host:port`), dialed by the replicator's schedule.
    public func addPeer(_ endpoint: String) {
        onEngine { host.addPeer(endpoint) }
    }

    /// Starts a session over a new link.
    ///
    /// - Parameter endpoint: the static peer address this link was dialed for; `nil` for inbound.
    public func attach(_ link: any MessageLink, endpoint: String? = nil) {
        let id = LinkID(nextLink.add(1, ordering: .relaxed).newValue)
        let room = DispatchSemaphore(value: Self.maxQueuedInbound)
        queue.async { [self] in
            links[id] = link
            link.onPartialMessage { [weak self] in
                guard let self else { return }
                self.queue.async { self.host.linkActive(id) }
            }
            link.start(
                onMessage: { [weak self] bytes in
                    guard let self else { return }
                    // Decoded on the link's reader thread, while the queue merges what came before.
                    let message = SyncHost.decode(bytes)
                    let size = bytes.count
                    room.wait()
                    self.queue.async {
                        room.signal()
                        self.host.received(message, on: id)
                        link.consumed(size)
                        self.scheduleScans()
                    }
                },
                onDrain: { [weak self] in
                    guard let self else { return }
                    self.queue.async {
                        self.host.linkDrained(id)
                        self.scheduleScans()
                    }
                },
                onClose: { [weak self] reason in
                    guard let self else { return }
                    if let kind = link.closeReason { self.linkCloses.record(kind) }
                    self.queue.async {
                        guard self.links.removeValue(forKey: id) != nil else { return }
                        self.host.linkClosed(id, reason: reason)
                        self.scheduleScans()
                    }
                })
            host.linkOpened(
                id, peerKey: link.remotePeerKey, initiator: link.isInitiator, address: link.remoteAddress,
                endpoint: endpoint, channelNonce: link.channelNonce)
            scheduleScans()
        }
    }

    /// Closes every link with a peer key (``MeshNetwork/distrust(peerKey:)``).
    ///
    /// - Parameter peerKey: the 32-byte peer key.
    /// - Returns: how many links were closed.
    @discardableResult
    public func closeLinks(to peerKey: [UInt8]) -> Int {
        let matching = onEngine { links.values.filter { $0.remotePeerKey == peerKey } }
        for link in matching { link.close() }
        return matching.count
    }

    /// A dial the replicator asked for failed.
    public func dialFailed(_ endpoint: String, reason: String) {
        queue.async { [self] in host.dialFailed(endpoint, reason: reason) }
    }

    /// Closes every link and stops dialing; subscriptions, static peers and the timer (deferred
    /// retries) stay. Repeatable: ``start()`` resumes.
    public func stop() {
        let open = onEngine { () -> [any MessageLink] in
            host.stop()
            return Array(links.values)
        }
        for link in open { link.close() }
    }

    /// Resumes after ``stop()``: static peers are dialed again.
    public func start() {
        onEngine {
            host.start()
            scheduleScans()
        }
    }

    /// Whether sessions may run (not stopped).
    public var isActive: Bool { onEngine { !host.replicator.isStopped } }

    /// Stops for good: ``stop()``, and the timer ends.
    public func close() {
        stop()
        onEngine { timer?.cancel() }
    }

    // MARK: SyncTransport

    public func send(_ bytes: [UInt8], on link: LinkID) -> Bool {
        guard let target = links[link] else { return false }
        do {
            return try target.send(bytes) >= target.highWater
        } catch {
            log("send to \(target.remoteAddress) failed: \(error)")
            target.close()
            return false
        }
    }

    public func close(_ link: LinkID, reason: String) {
        links[link]?.close()
    }

    public func dial(_ endpoint: String) {
        guard let dial = dialer.withLock({ $0 }) else {
            queue.async { [self] in host.dialFailed(endpoint, reason: "this node has no network") }
            return
        }
        dial(endpoint)
    }

    // MARK: Internals

    private func storeChanged(_ event: StoreEvent) {
        if event.evicted {
            for collection in event.collections.sorted() {
                host.evicted(collection.string, keys: (event.changedKeys[collection] ?? []).map(\.string).sorted())
            }
        }
        host.committed(event)
        scheduleScans()
    }

    /// Serves queued scans one at a time, each as its own work item, so messages and commits
    /// from other peers interleave with a long catch-up.
    func scheduleScans() {
        guard !scanScheduled, host.hasPendingScans else { return }
        scanScheduled = true
        queue.async { [self] in
            scanScheduled = false
            host.runScans(limit: 1)
            scheduleScans()
        }
    }
}
