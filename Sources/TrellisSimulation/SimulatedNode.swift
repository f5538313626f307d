import Foundation
import Synchronization
public import Trellis
public import TrellisCore
public import TrellisStore
public import TrellisSync

/// One node of a ``Simulation``: a real ``DocumentStore`` (SQLite, in the simulation's
/// directory), the real ``Replicator`` and ``SyncHost``, the Ditto-shaped ``Store`` with its live
/// queries — everything a `TrellisNode` runs except sockets, threads and the wall clock, which
/// the simulation replaces.
///
/// Use ``store`` as an app would (`node.store.collection("items").upsert(…)`); after
/// ``Simulation/restart(_:wipe:)`` it is a new object, so fetch it again.
public final class SimulatedNode: @unchecked Sendable {
    // Invariant: used only from the thread running the simulation (which is single-threaded).
    /// The node's name, also its address for dialing (``Simulation/connect(_:_:)``).
    public let name: String
    /// Its index in ``Simulation/nodes``.
    public let index: Int
    /// Its static public key (derived from the simulation's seed).
    public let peerKey: [UInt8]
    unowned let simulation: Simulation
    let path: String
    /// The app-facing store; `nil` while the node is crashed.
    public private(set) var storeIfUp: Store?
    var host: SyncHost?
    /// Added to the simulation's wall clock for this node's store (clock skew), milliseconds.
    public internal(set) var clockOffset: Millis = 0
    /// Time passed for this node beyond the simulation's (``Simulation/passTime(_:by:)``), in
    /// milliseconds: added to its store's elapsed time.
    public internal(set) var elapsedOffset: Millis = 0
    /// Static peers it dials (node names).
    var staticPeers: [String] = []
    var links: [LinkID: Int] = [:]
    var nextLink: UInt64 = 0
    /// Collections committed since the last ``flushCommits()``, each with the served query
    /// subscriptions none of those commits concerned (``ScopeCheck/unconcerned``; empty: unknown).
    let commits = Mutex<[UTF8Key: Set<Int64>]>([:])
    /// Collections in which a local write created a document since the last flush
    /// (``StoreEvent/createdCollections``).
    let created = Mutex<Set<UTF8Key>>([])
    /// Documents written locally (not merged) since the last flush, and the documents evicted,
    /// by collection. Evicted keys are byte-wise: "é" (U+00E9) and "e" + U+0301 are two
    /// collections, and two documents.
    let localChanges = Mutex<(writes: [(String, String)], evicted: [UTF8Key: Set<UTF8Key>])>(([], [:]))
    var watches: [LiveResults] = []
    /// When each document first changed here (with ``Simulation/recordsArrivals``).
    var arrivals: [UTF8Key: Millis] = [:]
    var watchSpecs: [(String, String)] = []
    /// Contacts mirrors of this node's collections (``mirrorContacts(_:)``); like a vdir on disk
    /// they outlive crashes and restarts of the node.
    var contactMirrors: [SimulatedContactsMirror] = []
    var evictions: [(String, UInt32)] = []
    let service: NodeSubscriptions
    var observerToken: UInt64?
    /// Writes made through ``write(_:)`` and when (for the "acknowledged writes" invariant).
    var storeOptions: StoreOptions
    /// The node's authorization rules, kept across crashes and restarts (``setAuthorization(_:)``).
    public private(set) var authorization = Authorization.open
    /// The site pins the node saved, kept across crashes as its data directory would keep them.
    public private(set) var sitePins: [SitePin] = []

    init(simulation: Simulation, name: String, index: Int, peerKey: [UInt8], path: String, options: StoreOptions) {
        self.simulation = simulation
        self.name = name
        self.index = index
        self.peerKey = peerKey
        self.path = path
        self.storeOptions = options
        service = NodeSubscriptions()
        service.node = self
    }

    /// Replaces the node's authorization rules now (while it runs) and for its restarts
    /// (``Replicator/setAuthorization(_:now:)``).
    public func setAuthorization(_ rules: Authorization) {
        authorization = rules
        host?.setAuthorization(rules)
    }

    /// Whether the node is running.
    public var isUp: Bool { storeIfUp != nil }

    /// The app-facing store.
    ///
    /// - Precondition: the node is up.
    public var store: Store {
        guard let storeIfUp else { preconditionFailure("\(name) is crashed; restart it first") }
        return storeIfUp
    }

    /// The underlying document store.
    public var documents: DocumentStore { store.documents }

    /// This node's replicator, for inspection (status, subscriptions).
    public var replicator: Replicator? { host?.replicator }

    /// The mesh as this node knows it (``TrellisNode/presence``); `nil` while crashed.
    public var presence: PresenceGraph? { replicator.map { PresenceGraph($0.status) } }

    func start() throws {
        var options = storeOptions
        let sim = simulation
        let index = self.index
        options.now = { [weak sim] in UInt64(max(0, sim?.wallClock(of: index) ?? 0)) }
        options.elapsed = { [weak sim, weak self] in UInt64(max(0, (sim?.now ?? 0) + (self?.elapsedOffset ?? 0))) }
        let seed = simulation.nextRandom()
        let random = Mutex(SplitMix64(seed: seed))
        options.random = { random.withLock { $0.next() } }
        options.log = { [weak sim] message in sim?.record("\(sim?.nodes[index].name ?? "?") warning: \(message)") }
        let documents = try DocumentStore(path: path, options: options)
        observerToken = documents.addObserver { [weak self] event in
            guard let self else { return }
            if !event.createdCollections.isEmpty { self.created.withLock { $0.formUnion(event.createdCollections) } }
            self.commits.withLock { commits in
                for collection in event.collections {
                    let unconcerned = event.scopeChecks[collection]?.unconcerned ?? []
                    // Skipped only when no commit since the last flush concerned it.
                    commits[collection] = commits[collection].map { $0.intersection(unconcerned) } ?? unconcerned
                }
            }
            if self.simulation.recordsArrivals {
                for (collection, keys) in event.changedKeys {
                    for key in keys where self.arrivals[History.id(collection.string, key.string)] == nil {
                        self.arrivals[History.id(collection.string, key.string)] = self.simulation.now
                    }
                }
            }
            guard event.origin == nil else { return }
            self.localChanges.withLock { changes in
                if event.evicted {
                    for (collection, keys) in event.changedKeys {
                        changes.evicted[collection, default: []].formUnion(keys)
                    }
                } else {
                    for (collection, keys) in event.changedKeys.sorted(by: { $0.key < $1.key }) {
                        for key in keys.sorted() { changes.writes.append((collection.string, key.string)) }
                    }
                }
            }
        }
        let store = Store(documents: documents, subscriptions: service)
        var configuration = ReplicatorConfiguration(peerKey: peerKey)
        configuration.authorization = authorization
        configuration.sitePins = sitePins
        simulation.configure(&configuration)
        let host = try SyncHost(
            configuration: configuration, store: documents, transport: self, seed: simulation.nextRandom(),
            now: { [weak sim] in sim?.now ?? 0 },
            log: { [weak sim] message in sim?.record("\(sim?.nodes[index].name ?? "?") \(message)") })
        storeIfUp = store
        host.saveSitePins = { [weak self] pins in self?.sitePins = pins }
        self.host = host
        for spec in service.held { try host.subscribe(spec) }
        for peer in staticPeers { host.addPeer(peer) }
        let specs = watchSpecs
        watchSpecs = []
        for (collection, query) in specs { try watch(collection, query: query) }
    }

    func stop() {
        if let token = observerToken { storeIfUp?.documents.removeObserver(token) }
        observerToken = nil
        for watch in watches { watch.liveQuery?.stop() }
        watches = []
        host = nil
        storeIfUp = nil
        links.removeAll()
        commits.withLock { $0.removeAll() }
        created.withLock { $0.removeAll() }
    }

    /// Hands commits made since the last call to the replicator, and records local writes.
    func flushCommits() {
        guard let host, let documents = storeIfUp?.documents else { return }
        // Store events arrive on the store's own queue: take every one committed so far.
        documents.waitForObservers()
        let changes = localChanges.withLock { c -> (writes: [(String, String)], evicted: [UTF8Key: Set<UTF8Key>]) in
            defer { c = ([], [:]) }
            return c
        }
        for collection in changes.evicted.keys.sorted() {
            simulation.history.evictions[index, default: [:]][collection] = simulation.now
            let keys = changes.evicted[collection]!.sorted()
            for key in keys {
                simulation.history.evictedDocuments[History.id(collection.string, key.string), default: []].append(
                    (index, simulation.now))
            }
            host.evicted(collection.string, keys: keys.map(\.string))
        }
        let site = documents.siteID
        for (collection, key) in changes.writes {
            guard let id = try? JSON.parse(key), let state = try? documents.state(id: id, in: collection) else {
                continue
            }
            let stamp = max(state.writes[site] ?? .zero, state.removed[site] ?? .zero)
            simulation.history.writes.append(
                History.Write(
                    node: index, collection: collection, key: key, site: site, stamp: stamp, time: simulation.now))
            simulation.history.lastWrite[History.id(collection, key)] = simulation.now
        }
        let committed = commits.withLock { c -> [UTF8Key: Set<Int64>] in
            defer { c.removeAll() }
            return c
        }
        let created = created.withLock { c -> Set<UTF8Key> in
            defer { c.removeAll() }
            return c
        }
        if !committed.isEmpty {
            host.committed(
                collections: Set(committed.keys), unconcerned: committed.filter { !$0.value.isEmpty }, created: created)
        }
    }
}

extension SimulatedNode: SyncTransport {
    public func send(_ bytes: [UInt8], on link: LinkID) -> Bool {
        simulation.transmit(bytes, from: self, on: link)
    }

    public func close(_ link: LinkID, reason: String) {
        simulation.closeConnection(from: self, link: link, reason: reason)
    }

    public func dial(_ endpoint: String) {
        simulation.dial(from: self, to: endpoint)
    }
}

/// The subscriptions a simulated node's app holds: kept across crashes (the app makes them again
/// when it starts) and handed to the node's current replicator.
final class NodeSubscriptions: SubscriptionService, @unchecked Sendable {
    // Invariant: used only from the simulation's thread.
    weak var node: SimulatedNode?
    private var counts: [String: (spec: SubscriptionSpec, count: Int)] = [:]

    var held: [SubscriptionSpec] { counts.keys.sorted().map { counts[$0]!.spec } }

    func subscribe(_ spec: SubscriptionSpec) throws {
        try node?.host?.subscribe(spec)
        counts[spec.key, default: (spec, 0)].count += 1
    }

    func unsubscribe(_ spec: SubscriptionSpec) {
        guard let held = counts[spec.key] else { return }
        if held.count > 1 {
            counts[spec.key]!.count -= 1
        } else {
            counts.removeValue(forKey: spec.key)
        }
        node?.host?.unsubscribe(spec)
    }
}
