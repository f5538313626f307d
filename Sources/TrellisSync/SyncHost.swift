public import TrellisCore
import TrellisStore

/// What a ``SyncHost`` needs from the local store. ``DocumentStore`` provides it; the protocol
/// keeps the host's contract in one place.
public protocol SyncStore: AnyObject, Sendable {
    /// The log's identity and extent now.
    var localLog: LocalLog { get }
    /// The rescan generation of every collection that has one (raised by evictions).
    var rescanGenerations: [UTF8Key: UInt32] { get }
    /// The rescan generation of one collection (0 when never evicted in).
    func rescanGeneration(collection: String) -> UInt32
    /// The collections that hold rows (documents, tombstones, eviction stubs), each once by its bytes.
    func collectionsHoldingRows() throws -> [String]
    /// The checkpoints stored for one peer, by subscription key.
    func checkpoints(peer: [UInt8]) throws -> [UTF8Key: Checkpoint]
    /// Reads one page of the change log (``ScanRequest``).
    func scan(_ request: ScanRequest) throws -> ScanPage
    /// Merges a batch and, when asked, stores its checkpoint, in one transaction.
    ///
    /// - Returns: how many documents were kept aside to retry, the refusals to report, the
    ///   `_id`s of documents applied that still withhold a value (``MergeOutcome/withholding``),
    ///   how many documents the sender holds older states of that its subscriptions' scans
    ///   will send (``MergeOutcome/heldBehind``), how many applied documents may be live
    ///   (``MergeOutcome/live``), and what the checkpoint stored says of the peer's reaped
    ///   tombstones (``MergeOutcome/storedReapedKeys``; `nil`: none stored).
    func apply(_ request: ApplyRequest) throws -> (
        deferred: Int, refusals: [String], withholding: [Value], heldBehind: Int, live: Int, reapedKeys: ReapedKeys?
    )
    /// Records that a peer acknowledged these entries (``ReplicatorDirective/acknowledged(_:)``).
    func acknowledge(_ entries: [AcknowledgedEntry]) throws
    /// Records that a peer holds the tombstones of a collection up to a `seq`
    /// (``ReplicatorDirective/peerHolds(collection:through:)``).
    func acknowledgeTombstones(in collection: String, through seq: Int64) throws
    /// Records where what a peer holds from a whole-collection service stands
    /// (``ReplicatorDirective/heldAcknowledged(peer:collection:upTo:carriedFrom:)``).
    func heldAcknowledged(peer: [UInt8], collection: String, upTo: Int64, carriedFrom: Int64?) throws
    /// Records that this node's ``ReapedKeys/notAsked`` checkpoints in `collection` on peers
    /// other than `peer` want their reaped tombstones (``ReplicatorDirective/wantReapedKeys(collection:besides:)``).
    func wantReapedKeys(in collection: String, besides peer: [UInt8]) throws
    /// Re-merges deferred documents whose condition cleared.
    ///
    /// - Returns: how many remain deferred, and the documents applied that still withhold a
    ///   value (``MergeOutcome/withholding``).
    func retryDeferredDocuments() throws -> (remaining: Int, withholding: [(collection: String, id: Value)])
    /// The `_id`s of evicted documents of a collection, most recently evicted first, at most `limit`.
    func evictedIDs(in collection: String, limit: Int) throws -> [Value]
    /// The collections that hold evicted documents.
    func evictedCollections() throws -> [String]
    /// Reaps up to `limit` tombstones older than the store's TTL, in one bounded transaction.
    ///
    /// - Returns: whether more are waiting.
    func reapTombstones(limit: Int) throws -> Bool
    /// Keeps what `peer` holds recorded in the scopes of the query subscriptions it is now
    /// served in their collection, and with `askAgain` takes the note of what it sent unrecorded
    /// (``ReplicatorDirective/servedQueries(_:peer:subscriptions:askAgain:)``).
    ///
    /// - Returns: the `seq` of the peer's log to ask it again from, if it sent documents no
    ///   scope recorded and `askAgain` is set.
    func servedQueries(peer: [UInt8], subscriptions: [SubscriptionSpec], askAgain: Bool) throws -> Int64?
    /// Starts a new epoch and site ID (the store's log rotation).
    ///
    /// - Returns: the log after the rotation.
    func rotatedLog(reason: String) throws -> LocalLog
}

/// Moves bytes between a ``MessageLink``-like transport and the store for one node.
public protocol SyncTransport: AnyObject {
    /// Queues a message on a link.
    ///
    /// - Returns: `true` when the link's outbound queue is now above its high-water mark.
    func send(_ bytes: [UInt8], on link: LinkID) -> Bool
    /// Closes a link; the transport reports ``SyncHost/linkClosed(_:reason:)`` later.
    func close(_ link: LinkID, reason: String)
    /// Connects to a static peer address; the transport reports ``SyncHost/linkOpened(_:peerKey:initiator:address:endpoint:)``
    /// or ``SyncHost/dialFailed(_:reason:)`` later.
    func dial(_ endpoint: String)
}

/// Carries out a ``Replicator``'s directives: store work (scans, merges, deferred retries, log
/// rotation) against a ``SyncStore``, link work against a ``SyncTransport``. The same host runs
/// over real sockets (``SyncEngine``) and in the deterministic simulator.
///
/// Not thread-safe: its owner serialises every call (the engine's queue, the simulator's loop).
/// Scans wait in per-link queues served one scan at a time by ``runScans(limit:)``. The next scan
/// is always one of the link that has used the least scan time while it had scans waiting
/// (``scanClock``), round-robin among equals: a peer whose subscriptions are expensive to scan
/// (queries evaluated row by row, many subscriptions) gets the same share of scan time as any
/// other peer with scans waiting, not more, so it cannot starve them; alone it may use all of it.
public final class SyncHost {
    public private(set) var replicator: Replicator
    public let store: any SyncStore
    private unowned let transport: any SyncTransport
    private let now: () -> Millis
    private let log: (String) -> Void
    private var scans: [LinkID: [ScanRequest]] = [:]
    private var scanOrder: [LinkID] = []
    /// Scan time each link has used (``scanClock`` units) while it had scans waiting; a link that
    /// starts waiting again starts from the least of the waiting links' values, so time spent
    /// idle earns it no credit (start-time fair queueing).
    private var scanSpent: [LinkID: UInt64] = [:]
    /// The link whose scan's directives are running (its next page is not a new wait).
    private var continuing: LinkID?
    /// The clock scan time is measured on, in any increasing unit (the engine: monotonic
    /// nanoseconds). The default reads 0 always, so scans go round-robin across links, one at a
    /// time (the simulator, which must not depend on how long a scan takes).
    public var scanClock: () -> UInt64 = { 0 }
    /// How often the store's expired tombstones are reaped (milliseconds); the first tick reaps.
    /// While a run leaves more waiting, every tick reaps one more bounded batch.
    public var tombstoneReapInterval: Millis = 60_000
    /// Rows per reaping transaction.
    public var tombstoneReapBatch = 1000
    private var nextReap: Millis = 0
    private var reapError: String?
    /// Persists the site pins when they change (``ReplicatorDirective/saveSitePins(_:)``); `nil`
    /// keeps them in memory only. A failure is logged, and the pins hold in memory.
    public var saveSitePins: (([SitePin]) throws -> Void)?

    /// - Parameters:
    ///   - configuration: the replicator's limits.
    ///   - seed: fixes the replicator's random choices.
    ///   - now: the clock the replicator's timers run on (monotonic milliseconds).
    /// - Throws: the store's errors reading generations and the collections that hold rows.
    public init(
        configuration: ReplicatorConfiguration, store: any SyncStore, transport: any SyncTransport, seed: UInt64,
        now: @escaping () -> Millis, log: @escaping (String) -> Void
    ) throws {
        self.store = store
        self.transport = transport
        self.now = now
        self.log = log
        replicator = Replicator(
            configuration: configuration, local: store.localLog, generations: store.rescanGenerations,
            heldCollections: try store.collectionsHoldingRows(), seed: seed)
        // The documents evicted before a restart are asked for again, as they were before it: a
        // relay's checkpoints at its peers are past them, and a later subscriber through it
        // would never get them (docs/MESH.md, "Eviction").
        do {
            for collection in try store.evictedCollections() { run(refetchEvicted(in: collection)) }
        } catch {
            log("reading the evicted documents failed: \(error)")
        }
    }

    /// Whether scans are waiting for ``runScans(limit:)``.
    public var hasPendingScans: Bool { !scanOrder.isEmpty }

    // MARK: Events

    /// Subscribes, and asks peers again for the documents of the collection evicted here (they
    /// come back when the subscription matches them).
    public func subscribe(_ spec: SubscriptionSpec) throws {
        run(try replicator.subscribe(spec, now: now()))
        run(refetchEvicted(in: spec.collection))
    }

    /// Hands the replicator the collection's evicted documents, to ask peers for again
    /// (``Replicator/refetch(_:ids:now:)``), and returns its directives: the most recent
    /// ``Refetch/maxPerCollection`` and one, so that the list knows whether it holds them all
    /// (``ReplicatorDirective/refetchEvicted(_:)``).
    private func refetchEvicted(in collection: String) -> [ReplicatorDirective] {
        do {
            let ids = try store.evictedIDs(in: collection, limit: Refetch.maxPerCollection + 1)
            return replicator.refetch(collection, ids: ids, now: now())
        } catch {
            log("reading the evicted documents of \(collection) failed: \(error)")
            return []
        }
    }

    public func unsubscribe(_ spec: SubscriptionSpec) {
        run(replicator.unsubscribe(spec, now: now()))
    }

    public func addPeer(_ endpoint: String) {
        run(replicator.addPeer(endpoint, now: now()))
    }

    public func removePeer(_ endpoint: String) {
        replicator.removePeer(endpoint)
    }

    /// Replaces the authorization rules (``Replicator/setAuthorization(_:now:)``).
    public func setAuthorization(_ rules: Authorization) {
        run(replicator.setAuthorization(rules, now: now()))
    }

    /// Discovery found a peer or it announces something new (``Replicator/discovered(_:grace:now:)``).
    public func discovered(_ peer: DiscoveredPeer, grace: Millis, sameCollections: Bool = false) {
        run(replicator.discovered(peer, grace: grace, sameCollections: sameCollections, now: now()))
    }

    /// A discovered peer's cache entry expired (``Replicator/discoveredPeerExpired(_:)``).
    public func discoveredPeerExpired(_ peerKey: [UInt8]) {
        replicator.discoveredPeerExpired(peerKey)
    }

    /// - Parameter channelNonce: a number both ends of the connection hold
    ///   (``Replicator/linkOpened(_:peerKey:initiator:address:endpoint:checkpoints:channelNonce:now:)``).
    public func linkOpened(
        _ link: LinkID, peerKey: [UInt8], initiator: Bool, address: String, endpoint: String?,
        channelNonce: UInt64? = nil
    ) {
        let checkpoints: [UTF8Key: Checkpoint]
        do {
            checkpoints = try store.checkpoints(peer: peerKey)
        } catch {
            log("reading checkpoints for \(address) failed: \(error); starting from 0")
            checkpoints = [:]
        }
        run(
            replicator.linkOpened(
                link, peerKey: peerKey, initiator: initiator, address: address, endpoint: endpoint,
                checkpoints: checkpoints, channelNonce: channelNonce, now: now()))
    }

    public func dialFailed(_ endpoint: String, reason: String) {
        run(replicator.dialFailed(endpoint, reason: reason, now: now()))
    }

    /// One message arrived: decoded here, so the simulator exercises the codec too.
    public func received(_ bytes: [UInt8], on link: LinkID) {
        received(Self.decode(bytes), on: link)
    }

    /// One message arrived, decoded by ``decode(_:)`` (a running node does that on the link's
    /// reader thread, so decoding overlaps the work of this host's queue).
    public func received(_ message: Result<WireMessage, WireError>, on link: LinkID) {
        switch message {
        case .success(let message): run(replicator.received(message, on: link, now: now()))
        case .failure(let error): run(replicator.receiveFailed(on: link, error: "\(error)", now: now()))
        }
    }

    /// Decodes a message and, for a batch, the states of its documents (``WireMessage/decodingStates()``).
    /// Needs no host: any thread may call it.
    ///
    /// - Complexity: O(size of the message).
    public static func decode(_ bytes: [UInt8]) -> Result<WireMessage, WireError> {
        do { return .success(try WireMessage(serialized: bytes).decodingStates()) } catch { return .failure(error) }
    }

    public func linkClosed(_ link: LinkID, reason: String) {
        if scans.removeValue(forKey: link) != nil { scanOrder.removeAll { $0 == link } }
        scanSpent.removeValue(forKey: link)
        run(replicator.linkClosed(link, reason: reason, now: now()))
    }

    public func linkDrained(_ link: LinkID) {
        run(replicator.linkDrained(link, now: now()))
    }

    /// Bytes of a message are arriving on `link`, not yet whole (``Replicator/linkActive(_:now:)``).
    public func linkActive(_ link: LinkID) {
        replicator.linkActive(link, now: now())
    }

    /// The store committed changes in `collections` (any origin).
    ///
    /// - Parameters:
    ///   - unconcerned: per collection, the served query subscriptions no change concerns
    ///     (``ScopeCheck/unconcerned``, from ``StoreEvent/scopeChecks``): they do not scan for it.
    ///   - created: collections in which a local write created a document
    ///     (``StoreEvent/createdCollections``).
    public func committed(
        collections: Set<UTF8Key>, unconcerned: [UTF8Key: Set<Int64>] = [:], created: Set<UTF8Key> = []
    ) {
        run(
            replicator.committed(
                collections: collections, lastSeq: store.localLog.lastSeq, unconcerned: unconcerned, created: created,
                now: now()))
    }

    /// ``committed(collections:unconcerned:created:)`` for one store event.
    func committed(_ event: StoreEvent) {
        committed(
            collections: event.collections, unconcerned: event.scopeChecks.mapValues(\.unconcerned),
            created: event.createdCollections)
    }

    /// Documents of `collection` were evicted: peers are asked for exactly those again while a
    /// subscription in the collection is active (``Replicator/refetch(_:ids:now:)``).
    ///
    /// - Parameter keys: the canonical `_id` keys of the evicted documents (``StoreEvent/changedKeys``).
    public func evicted(_ collection: String, keys: [String]) {
        let ids = keys.compactMap { try? JSON.parse($0) }
        run(replicator.refetch(collection, ids: ids, now: now()))
    }

    public func tick() {
        run(replicator.tick(now: now()))
        reapIfDue()
    }

    /// Reaps one bounded batch of expired tombstones when due (at the first tick, then every
    /// ``tombstoneReapInterval``, and at every tick while a batch leaves more waiting).
    private func reapIfDue() {
        let time = now()
        guard time >= nextReap else { return }
        do {
            let more = try store.reapTombstones(limit: tombstoneReapBatch)
            nextReap = more ? time : time + tombstoneReapInterval
            reapError = nil
        } catch {
            nextReap = time + tombstoneReapInterval
            let message = "reaping tombstones failed: \(error)"
            if reapError != message { log(message) }  // once, not every interval
            reapError = message
        }
    }

    /// Closes every session and stops dialing (``Replicator/stop()``); ``start()`` resumes.
    public func stop() {
        run(replicator.stop())
        scans.removeAll()
        scanOrder.removeAll()
        scanSpent.removeAll()
    }

    /// Resumes after ``stop()`` (``Replicator/start(now:)``).
    public func start() {
        run(replicator.start(now: now()))
    }

    /// Runs up to `limit` queued scans, each of the link with scans waiting that has used the least
    /// scan time so far (round-robin when ``scanClock`` reads 0).
    ///
    /// - Complexity: O(links with scans waiting) to choose each scan, plus the scan.
    public func runScans(limit: Int = .max) {
        var done = 0
        while done < limit, !scanOrder.isEmpty {
            // The link that has used the least scan time; the first of equals (round-robin).
            var position = scanOrder.startIndex
            for index in scanOrder.indices.dropFirst()
            where scanSpent[scanOrder[index], default: 0] < scanSpent[scanOrder[position], default: 0] {
                position = index
            }
            let link = scanOrder.remove(at: position)
            guard var queue = scans[link], !queue.isEmpty else {
                scans.removeValue(forKey: link)
                continue
            }
            let request = queue.removeFirst()
            if queue.isEmpty {
                scans.removeValue(forKey: link)
            } else {
                scans[link] = queue
                scanOrder.append(link)
            }
            done += 1
            let started = scanClock()
            let directives: [ReplicatorDirective]
            do {
                let page = try store.scan(request)
                directives = replicator.scanned(link, request, page: page, now: now())
            } catch {
                directives = replicator.scanFailed(link, request, error: "\(error)", now: now())
            }
            scanSpent[link, default: 0] &+= scanClock() &- started
            // Its next page, asked for now, continues this turn of waiting.
            continuing = link
            run(directives)
            continuing = nil
        }
    }

    // MARK: Directives

    private func run(_ directives: [ReplicatorDirective]) {
        var work = directives[...]
        while let directive = work.popFirst() {
            var more: [ReplicatorDirective] = []
            switch directive {
            case .send(let link, let message):
                if transport.send(message.serialized(), on: link) { replicator.linkCongested(link) }
            case .close(let link, let reason):
                transport.close(link, reason: reason)
            case .scan(let link, let request):
                if scans[link] == nil {
                    // Waiting again: no credit for the time it waited for nothing.
                    let least = scanOrder.lazy.compactMap { self.scanSpent[$0] }.min() ?? 0
                    if link != continuing { scanSpent[link] = max(scanSpent[link] ?? 0, least) }
                    scanOrder.append(link)
                }
                scans[link, default: []].append(request)
            case .apply(let link, let request):
                do {
                    let outcome = try store.apply(request)
                    for refusal in outcome.refusals { log(refusal) }
                    more = replicator.applied(
                        link, subscription: request.subscription, upTo: request.upTo,
                        checkpointStored: request.storeCheckpoint,
                        reapedKeys: outcome.reapedKeys ?? request.reapedKeys,
                        endsScan: request.endsScan, deferred: outcome.deferred, withholding: outcome.withholding,
                        heldBehind: outcome.heldBehind > 0, broughtLive: outcome.live > 0, now: now())
                } catch StoreError.deferredLimit(let reason) {
                    // Too much of this peer's data waits already: the batch stays unacknowledged,
                    // and the replicator asks the peer for the subscription again from its stored
                    // checkpoint (the retries make room meanwhile).
                    more = replicator.applyPostponed(
                        link, subscription: request.subscription, reason: reason, now: now())
                } catch StoreError.needsWholeState(let reason) {
                    // A delta the store cannot apply: asked again, whole.
                    more = replicator.applyNeedsWholeStates(
                        link, subscription: request.subscription, reason: reason, now: now())
                } catch {
                    more = replicator.applyFailed(
                        link, subscription: request.subscription, error: "\(error)", now: now())
                }
            case .dial(let endpoint):
                transport.dial(endpoint)
            case .rotateLog(let reason):
                do {
                    more = replicator.logRotated(try store.rotatedLog(reason: reason), now: now())
                } catch {
                    log("rotating the log failed: \(error)")
                }
            case .acknowledged(let entries):
                do { try store.acknowledge(entries) } catch { log("recording acknowledged writes failed: \(error)") }
            case .peerHolds(let collection, let through):
                do {
                    try store.acknowledgeTombstones(in: collection, through: through)
                } catch {
                    log("recording the tombstones a peer holds in '\(collection)' failed: \(error)")
                }
            case .heldAcknowledged(let peer, let collection, let upTo, let carriedFrom):
                do {
                    try store.heldAcknowledged(peer: peer, collection: collection, upTo: upTo, carriedFrom: carriedFrom)
                } catch {
                    log("recording where a peer stands in '\(collection)' failed: \(error)")
                }
            case .retryDeferred:
                do {
                    let outcome = try store.retryDeferredDocuments()
                    replicator.deferredRetried(remaining: outcome.remaining, now: now())
                    let byCollection = Dictionary(grouping: outcome.withholding, by: \.collection)
                    for (collection, documents) in byCollection.sorted(by: { $0.key < $1.key }) {
                        more += replicator.stillWithholding(documents.map(\.id), in: collection, now: now())
                    }
                } catch {
                    log("retrying deferred documents failed: \(error)")
                }
            case .log(let message):
                log(message)
            case .refetchEvicted(let collection):
                more = refetchEvicted(in: collection)
            case .wantReapedKeys(let collection, let peer):
                // Failing loses the mark at a restart only: the sync engine holds it meanwhile.
                do { try store.wantReapedKeys(in: collection, besides: peer) } catch {
                    log("recording that checkpoints in '\(collection)' want reaped tombstones failed: \(error)")
                }
            case .takeHeld(let link):
                more = replicator.takeHeld(link, now: now())
            case .servedQueries(let link, let peer, let subscriptions, let askAgain):
                let collection = subscriptions.first?.collection ?? ""
                do {
                    let since = try store.servedQueries(peer: peer, subscriptions: subscriptions, askAgain: askAgain)
                    if let since { more = replicator.askAgain(link, collection: collection, from: since, now: now()) }
                } catch {
                    log("recording what a peer holds in '\(collection)' failed: \(error)")
                }
            case .saveSitePins(let pins):
                do { try saveSitePins?(pins) } catch { log("saving the site pins failed: \(error)") }
            }
            if !more.isEmpty { work = more[...] + work }
        }
    }
}
