/// Milliseconds. The ``Replicator`` only compares differences of these, so a monotonic clock
/// (or a simulator's virtual clock) is the right source.
public typealias Millis = Int64

/// Names one connection (link) to a peer inside one node. Assigned by the shell; never reused.
public struct LinkID: Hashable, Comparable, Sendable, CustomStringConvertible {
    public var raw: UInt64
    public init(_ raw: UInt64) { self.raw = raw }
    public static func < (lhs: LinkID, rhs: LinkID) -> Bool { lhs.raw < rhs.raw }
    public var description: String { "link#\(raw)" }
}

/// The tombstones reaped at or below a peer's `since` still to send it (``ScanRequest/reapedBacklog``).
public struct ReapedBacklog: Sendable, Equatable {
    /// The `seq` of the last reaped key sent (0 before the first).
    public var after: Int64
    /// The peer's `since`: keys reaped above it reach the peer among the scan's pages.
    public var through: Int64

    public init(after: Int64, through: Int64) {
        self.after = after
        self.through = through
    }
}

/// How far a receiver has durably applied one peer's log for one subscription.
public struct Checkpoint: Sendable, Equatable, Hashable {
    /// The epoch of the peer's log the `seq` belongs to.
    public var epoch: [UInt8]
    public var seq: Int64
    /// Whether the tombstones the peer reaped at or below `seq` reached this node.
    public var reapedKeys: ReapedKeys

    public init(epoch: [UInt8], seq: Int64, reapedKeys: ReapedKeys = .received) {
        self.epoch = epoch
        self.seq = seq
        self.reapedKeys = reapedKeys
    }
}

/// Whether the tombstones a peer reaped at or below a checkpoint reached this node
/// (docs/PROTOCOL.md §2 step 5, `h`; docs/DATA-MODEL.md "A subscriber from 0 that holds rows").
/// A tombstone the peer reaped is in no row of its log: a subscriber gets it only among pages
/// asked for it, and needs it only for a document it may hold from another peer.
///
/// Stored with the checkpoint as its raw value (the `reaped` column of `checkpoints`; 0 in a
/// store written before it was kept).
public enum ReapedKeys: Int, Sendable, Hashable {
    /// They reached this node, or it needs none of them: the checkpoint's chain of requests began
    /// with `h` (this node held rows of the collection when it asked from 0), or resumed a chain
    /// that had them.
    case received = 0
    /// The chain began from 0 without `h` (this node held nothing of the collection) and, since,
    /// this node got live documents of the collection only from this peer, and created none by a
    /// local write: it needs none.
    case notAsked = 1
    /// As ``notAsked``, but another peer has since brought live documents of the collection, or a
    /// local write created one, which may be copies of documents this peer removed and reaped, or
    /// new documents with their `_id`s: this node asks the peer for them (`h` with its `since`)
    /// until a batch of that request moves past the checkpoint or ends.
    case wanted = 2
}

/// This node's change log as the replicator needs to know it: its identity and how far it goes.
public struct LocalLog: Sendable, Equatable {
    /// The random ID of this life of the log (16 bytes).
    public var epoch: [UInt8]
    /// The site ID stamping this node's writes.
    public var site: SiteID
    /// The highest `seq` committed.
    public var lastSeq: Int64

    public init(epoch: [UInt8], site: SiteID, lastSeq: Int64) {
        self.epoch = epoch
        self.site = site
        self.lastSeq = lastSeq
    }
}

/// One entry of the local change log, as a scan returns it.
public struct LogRecord: Sendable, Equatable {
    /// The entry's position in the log.
    public var seq: Int64
    /// The canonical key of the document's `_id` (its compact JSON text).
    public var key: String
    /// The document as it travels.
    public var document: WireDocument
    /// Whether the document holds a write of this node that no peer has acknowledged: once a
    /// peer acknowledges the batch that carries it, the replicator says so
    /// (``ReplicatorDirective/acknowledged(_:)``).
    public var holdsUnacknowledgedWrite: Bool
    /// Whether the entry is an evicted document's stub, sent whole while it holds such a write.
    public var isEvictionStub: Bool
    /// Whether the entry is a tombstone: one holding such a write is kept from the reaper until a
    /// peer acknowledges it (``AcknowledgedEntry/isTombstone``).
    public var isTombstone: Bool
    /// The delta of the local writes since the document's base (``StateDelta``, encoded), and the
    /// entry's `seq` when its state was that base, when the store has one: sent instead of the
    /// whole state to a peer that accepts deltas for the subscription and has acknowledged that
    /// `seq` (docs/PROTOCOL.md §2 step 5).
    public var delta: LogDelta?

    public init(
        seq: Int64, key: String, document: WireDocument, holdsUnacknowledgedWrite: Bool = false,
        isEvictionStub: Bool = false, isTombstone: Bool = false, delta: LogDelta? = nil
    ) {
        self.seq = seq
        self.key = key
        self.document = document
        self.holdsUnacknowledgedWrite = holdsUnacknowledgedWrite
        self.isEvictionStub = isEvictionStub
        self.isTombstone = isTombstone
        self.delta = delta
    }
}

/// The delta a change-log entry keeps of the local writes since its base (docs/DELTAS.md).
public struct LogDelta: Sendable, Equatable {
    /// The encoded ``StateDelta``.
    public var bytes: [UInt8]
    /// The entry's `seq` when its state was the delta's base.
    public var baseSeq: Int64

    public init(bytes: [UInt8], baseSeq: Int64) {
        self.bytes = bytes
        self.baseSeq = baseSeq
    }
}

/// A change-log entry a peer acknowledged: the batch that carried the document at this `seq`
/// was durably applied there.
public struct AcknowledgedEntry: Sendable, Hashable {
    public var collection: String
    /// The canonical key of the document's `_id`.
    public var key: String
    /// The entry's position in this node's log.
    public var seq: Int64
    /// Whether the entry was an evicted document's stub (``LogRecord/isEvictionStub``).
    public var isEvictionStub: Bool
    /// Whether the entry was a tombstone (``LogRecord/isTombstone``): the store then records the
    /// acknowledgement in the row, and the reaper may take the tombstone once it expires.
    public var isTombstone: Bool

    public init(collection: String, key: String, seq: Int64, isEvictionStub: Bool = false, isTombstone: Bool = false) {
        self.collection = collection
        self.key = key
        self.seq = seq
        self.isEvictionStub = isEvictionStub
        self.isTombstone = isTombstone
    }
}

/// The result of a ``ReplicatorDirective/scan(_:_:)``.
public struct ScanPage: Sendable, Equatable {
    /// Matching entries (and the tombstones a subscriber may hold), in `seq` order.
    public var records: [LogRecord]
    /// The last `seq` examined: the cursor for the next page.
    public var upTo: Int64
    /// `true` when the scan reached the end of the log.
    public var exhausted: Bool
    /// When not exhausted, how many log entries of the collection follow `upTo` (an upper bound on
    /// what is still to send; `nil` when the store did not count).
    public var remaining: Int64?
    /// `true` when the cursor asked for was above 0 but below the lowest `seq` the log still
    /// answers for completely (tombstones after it were reaped): a peer resuming from its
    /// checkpoint there may have missed removes.
    public var belowFloor: Bool
    /// The collection's retained floor when the page was read (the highest `seq` of a tombstone
    /// reaped by then; 0 when none was): tombstones reaped later have a higher `seq` or were not
    /// reaped by then.
    public var floor: Int64
    /// For a page read with ``PageReader/sendsHeld`` for a peer that holds documents from a
    /// whole-collection service here: the position after which changes to them are sent (the
    /// peer holds the current state of those whose `seq` is at most this). `nil` when the page
    /// carries nothing of the kind.
    public var heldFrom: Int64?

    public init(
        records: [LogRecord], upTo: Int64, exhausted: Bool, remaining: Int64? = nil, belowFloor: Bool = false,
        floor: Int64 = 0, heldFrom: Int64? = nil
    ) {
        self.records = records
        self.upTo = upTo
        self.exhausted = exhausted
        self.remaining = remaining
        self.belowFloor = belowFloor
        self.floor = floor
        self.heldFrom = heldFrom
    }
}

/// What the shell must read from the local log: up to `limit` entries of `spec.collection` after
/// `after` whose document matches `query` (plus tombstones), stopping once `maxBytes` of state
/// is reached (always at least one entry), then call ``Replicator/scanned(_:_:page:now:)``
/// or ``Replicator/scanFailed(_:_:error:now:)``.
public struct ScanRequest: Sendable, Equatable {
    public var subscription: String
    public var spec: SubscriptionSpec
    /// The query with its arguments bound.
    public var query: Query
    public var after: Int64
    public var limit: Int
    public var maxBytes: Int
    /// Whether to count, when the page is not the last, the log entries of the collection after
    /// it (``ScanPage/remaining``): asked on a subscription's first page and every 16th after, so
    /// the count costs little on a long catch-up.
    public var countRemaining = false
    /// The peer the page is for and where it stands (``PageReader``): what it holds from a
    /// whole-collection service (docs/MESH.md, "Leaving a subscription's scope").
    public var reader: PageReader?
    /// The page also carries, in `seq` order, the tombstones reaped here whose `seq` is above
    /// both this and `after`, whatever the subscription's query (docs/PROTOCOL.md §2 step 5): the
    /// peer may hold any of those documents. The peer's checkpoint for a peer that resumed (found
    /// below the retained floor or not), the floor of its first page for one served from 0.
    /// `nil` for a refetch.
    public var reapedAfter: Int64?
    /// Read instead of the log: the tombstones reaped here in the request's collection whose
    /// `seq` is above `after` and at most `through`, in `seq` order, at most `limit` of them, each
    /// as the state its reaped key kept (for a peer that asked with `h` from a checkpoint,
    /// docs/PROTOCOL.md §2 step 5). The page's `upTo` is then the `seq` of the last one read,
    /// or `through` once none is left up to it, and it is then `exhausted`.
    public var reapedBacklog: ReapedBacklog?
}

/// The peer a change-log page is read for, with its position in the page's subscription: the
/// page of a whole-collection subscription records how far the peer was served it
/// (`WholeHeld` in TrellisStore), and, with `sendsHeld`, the page of a query subscription also returns the
/// documents the peer may hold from such service whose state moved on.
public struct PageReader: Equatable, Sendable {
    /// The peer's public key.
    public var peer: [UInt8]
    /// The highest `upTo` of this subscription the peer acknowledged.
    public var acknowledgedUpTo: Int64
    /// For a query subscription: the peer is served no whole-collection subscription in its
    /// collection now, so what it holds from earlier such service goes with this one.
    public var sendsHeld: Bool

    public init(peer: [UInt8], acknowledgedUpTo: Int64, sendsHeld: Bool) {
        self.peer = peer
        self.acknowledgedUpTo = acknowledgedUpTo
        self.sendsHeld = sendsHeld
    }
}

/// Where the scan of a query subscription served to a peer stands in the current session
/// (``ApplyRequest/heldScans``).
public struct HeldScan: Sendable, Equatable {
    /// The `seq` this session serves the subscription from (the peer's checkpoint, or 0): rows
    /// above it and at most ``cursor`` were read in this session.
    public var since: Int64
    /// The last `seq` read.
    public var cursor: Int64

    public init(since: Int64, cursor: Int64) {
        self.since = since
        self.cursor = cursor
    }
}

/// What the shell must merge: `documents` from peer `peerKey`, and, when `storeCheckpoint`, the
/// checkpoint (`peerEpoch`, `upTo`) for `subscription`, in one transaction; then call
/// ``Replicator/applied(_:subscription:upTo:checkpointStored:deferred:now:)`` when it committed
/// (documents the store could not apply yet, for their clock, size, validity or decoding, are
/// kept aside and counted as deferred),
/// ``Replicator/applyPostponed(_:subscription:reason:now:)`` when the store took nothing because
/// the peer's deferred documents would exceed their bound, or
/// ``Replicator/applyFailed(_:subscription:error:now:)`` for any other failure.
public struct ApplyRequest: Sendable, Equatable {
    public var subscription: String
    public var collection: String
    public var peerKey: [UInt8]
    public var peerEpoch: [UInt8]
    public var documents: [WireDocument]
    public var upTo: Int64
    /// `false` for a batch whose generation is not the one this node asks for now (sent before
    /// an eviction or a postponed batch made it ask again from an earlier point): its documents
    /// merge, but its `upTo` must not move the checkpoint past documents not applied.
    public var storeCheckpoint: Bool
    /// What the checkpoint stored with the batch says of the peer's reaped tombstones.
    public var reapedKeys: ReapedKeys = .received
    /// The batch ends its request's scan of the peer's log (`left: 0`) in the generation asked
    /// for now: once applied with its checkpoint, the request reached the end of the log.
    public var endsScan = false
    /// The query subscriptions this node serves to the sender in the batch's collection: the
    /// sender holds every document it sent, so later changes to them must reach it.
    public var heldBy: [SubscriptionSpec] = []
    /// Where the scans of `heldBy` for the sender stand in this session, by
    /// ``SubscriptionSpec/key``: only those counted on to send what the sender holds (a query,
    /// not a refetch, scanning without a failure; ``Replicator/heldScans(_:)``). The store logs
    /// again the row of a document the sender holds an older state of unless every one of
    /// `heldBy` carries it (`DocumentStore.merge(_:from:checkpoint:heldBy:heldScans:unserved:)`).
    public var heldScans: [String: HeldScan] = [:]
    /// This node serves the sender no query subscription in the batch's collection: no scope
    /// records that the sender holds these documents, so the store notes that it sent some there,
    /// and from which of its checkpoints (``ReplicatorDirective/servedQueries(_:peer:subscriptions:askAgain:)``).
    public var unserved = false
}

/// What the shell must do, in order.
public enum ReplicatorDirective: Sendable, Equatable {
    /// Send this message on the link.
    case send(LinkID, WireMessage)
    /// Close the link (its `linkClosed` follows).
    case close(LinkID, reason: String)
    /// Read the change log (see ``ScanRequest``).
    case scan(LinkID, ScanRequest)
    /// Merge a batch (see ``ApplyRequest``).
    case apply(LinkID, ApplyRequest)
    /// Call ``Replicator/takeHeld(_:now:)`` once every directive before this one was carried out
    /// (the directives that call returns first, before the rest of this list): the next message
    /// the peer sent before the hello this node asked for is taken then, as if it had just
    /// arrived (docs/PROTOCOL.md §2 step 1, "Resumed sessions").
    case takeHeld(LinkID)
    /// Connect to this static peer address, then call ``Replicator/linkOpened(_:peerKey:initiator:address:endpoint:checkpoints:now:)``
    /// or ``Replicator/dialFailed(_:reason:now:)``.
    case dial(String)
    /// This node's log went back in time (a peer holds a checkpoint beyond its last `seq`): start
    /// a new epoch and site ID, then call ``Replicator/logRotated(_:now:)``.
    case rotateLog(reason: String)
    /// A peer acknowledged batches carrying these entries, which held writes of this node no peer
    /// had acknowledged before: record it in the store (an eviction may then drop those values;
    /// docs/DATA-MODEL.md rule 8). Failing to record it only keeps more on an eviction.
    case acknowledged([AcknowledgedEntry])
    /// A peer asked this node's whole `collection` from `through` (a checkpoint on this log,
    /// this epoch): it holds every state the log carried of the collection up to there, tombstones
    /// included. Record the tombstones up to it as acknowledged, as if their acks had come (they
    /// may have been lost with a connection): the reaper may then take them
    /// (``AcknowledgedEntry/isTombstone``). Failing to record it only keeps them longer.
    case peerHolds(collection: String, through: Int64)
    /// A peer acknowledged `upTo` of a subscription to `collection` that tells where what it holds
    /// from a whole-collection service here stands (docs/MESH.md, "Leaving a subscription's
    /// scope"): its whole-collection subscription (`carriedFrom` `nil`), or a query subscription
    /// every batch of which, from `carriedFrom` on, carried the changes to those documents (record
    /// it only if `carriedFrom` is not after the position recorded). Failing to record it only
    /// sends more later.
    case heldAcknowledged(peer: [UInt8], collection: String, upTo: Int64, carriedFrom: Int64?)
    /// A peer (key `besides`) asked this node with `h` in `collection`: it may hold documents
    /// that the other peers removed and reaped. Record in the store that this node's
    /// ``ReapedKeys/notAsked`` checkpoints in the collection on the other peers now want their
    /// reaped tombstones (``ReapedKeys/wanted``), so that it asks them with `h` after a restart
    /// too. Failing to record it loses that at a restart only.
    case wantReapedKeys(collection: String, besides: [UInt8])
    /// Re-merge the documents the store deferred, then call ``Replicator/deferredRetried(remaining:now:)``.
    case retryDeferred
    /// Report this event in the node's log.
    case log(String)
    /// Every listed evicted document of the collection came back, and more were evicted than
    /// the list held: read the collection's evicted documents from the store again (the most
    /// recent ``Refetch/maxPerCollection`` and one) and hand them to
    /// ``Replicator/refetch(_:ids:now:)``.
    case refetchEvicted(String)
    /// The peer on the link (key `peer`) is served the query subscriptions `subscriptions` in
    /// their collection (all of one collection; on a new connection, or its set there changed).
    /// Keep in the store what it holds recorded in their scopes: what the scopes of the query
    /// subscriptions it was served there before hold goes to theirs. With `askAgain` (no
    /// whole-collection subscription of the peer's is served there, and this node asks it for
    /// something there), also take the note that it sent documents no scope recorded
    /// (``ApplyRequest/unserved``): move this node's checkpoints on its log for the collection back
    /// to where that began and call ``Replicator/askAgain(_:collection:from:now:)`` from there,
    /// so what it sent since comes again and is recorded.
    case servedQueries(LinkID, peer: [UInt8], subscriptions: [SubscriptionSpec], askAgain: Bool)
    /// The site pins changed (a site ID was pinned to a peer key, or old pins were dropped):
    /// persist them, in this order (oldest first), as ``ReplicatorConfiguration/sitePins`` takes
    /// them back at the next start.
    case saveSitePins([SitePin])
}

/// A site ID bound to the peer key that first presented it in an authenticated `hello`
/// (docs/SECURITY.md, "Site IDs"): no other key may present it afterwards.
public struct SitePin: Sendable, Hashable {
    public var site: SiteID
    /// The 32-byte peer key.
    public var peerKey: [UInt8]

    public init(site: SiteID, peerKey: [UInt8]) {
        self.site = site
        self.peerKey = peerKey
    }
}

/// What the authorization rules and site pins refused since the replicator started.
public struct AuthorizationRefusals: Sendable, Equatable {
    /// Subscriptions of peers to collections they may not read (answered `suberr forbidden`).
    public var subscriptions = 0
    /// Batches from peers for collections they may not write (nothing of them merged).
    public var batches = 0
    /// The documents those batches carried.
    public var documents = 0
    /// Sessions refused because the peer presented a site ID bound to another peer key.
    public var sites = 0

    public init() {}
}

/// Limits and timings of a ``Replicator``. Durations in milliseconds. Defaults are documented in
/// docs/PROTOCOL.md §4.
public struct ReplicatorConfiguration: Sendable {
    /// This node's peer key (32 bytes).
    public var peerKey: [UInt8]
    /// Change-log entries examined per scan.
    public var batchEntries = 1024
    /// A batch stops after the document that reaches this many bytes of state.
    public var batchBytes = 4 << 20
    /// A document state larger than this is never sent (it could not travel in one message).
    public var maxStateBytes = (64 << 20) - (64 << 10)
    /// Batches sent and not yet acknowledged, per served subscription.
    public var maxInFlight = 8
    /// Subscriptions one peer may ask this node to serve; beyond it each gets `suberr limit`.
    public var maxServedSubscriptions = 1024
    /// Peers whose last subscription set this node remembers (in memory) to take it resumed by
    /// digest (docs/PROTOCOL.md §2, step 3); the least recently remembered is forgotten first.
    public var maxRememberedSubscriptionSets = 64
    /// A peer's set is remembered only when its `subs` encodes to at most this many bytes, so the
    /// memory stays below ``maxRememberedSubscriptionSets`` times this (4 MiB by default).
    public var maxRememberedSubscriptionBytes = 64 << 10
    /// Subscriptions this node asks one peer for at most; beyond it those of the busiest
    /// collection collapse into the whole collection.
    public var maxAskedSubscriptions = 1024
    /// Forwarded subscriptions travel at most this many hops.
    public var maxHops = 4
    /// A `ping` goes out on a link that sent nothing for this long.
    public var keepaliveInterval: Millis = 5_000
    /// Most sessions at once. A new session beyond it is refused with `error {code: "busy"}`,
    /// unless it was dialed to a static peer (those are always kept); discovered peers are not
    /// dialed while the slots are taken, and those subscribing to the same collections as this
    /// node are dialed first.
    public var maxSessions = 64
    /// A link that received nothing for this long is closed as dead.
    public var livenessTimeout: Millis = 15_000
    /// How long an older link to a peer may take to answer a probe before a newer one replaces it.
    public var duplicateProbeTimeout: Millis = 3_000
    /// Batches unacknowledged this long are sent again from the last acknowledged point.
    public var ackTimeout: Millis = 30_000
    /// Whether this node asks peers for deltas (``StateDelta``: the fields local writes changed,
    /// for documents it holds) on its whole-collection subscriptions; it serves them whenever a
    /// peer asks (docs/PROTOCOL.md §2 step 5).
    public var deltas = true
    /// First and largest delay between attempts to dial a static peer (jittered ×0.5…1.5).
    public var dialBackoffInitial: Millis = 250
    public var dialBackoffMax: Millis = 30_000
    /// A session that lasted this long resets its dialer's backoff.
    public var stableSession: Millis = 10_000
    /// First and largest delay before retrying a subscription whose scan failed.
    public var scanRetryInitial: Millis = 5_000
    public var scanRetryMax: Millis = 300_000
    /// Deferred documents are retried this often while there are some.
    public var deferredRetryInterval: Millis = 5_000
    /// Received states remembered per session for echo suppression; the memory is cleared when full.
    public var echoMemory = 200_000
    /// A regressed log rotates its epoch at most this often.
    public var minLogRotationInterval: Millis = 600_000
    /// Who may read and write which collection (``Authorization``); ``Replicator/setAuthorization(_:now:)``
    /// changes it at run time.
    public var authorization = Authorization.open
    /// The site pins kept from an earlier run, oldest first (``ReplicatorDirective/saveSitePins(_:)``).
    public var sitePins: [SitePin] = []
    /// Site IDs pinned per peer key at most (a key gets a new site ID when its log rotates); beyond,
    /// the key's least recently seen pin is dropped.
    public var maxSitesPerPeer = 8
    /// Site pins kept at most; beyond, the least recently seen pin is dropped.
    public var maxSitePins = 10_000

    public init(peerKey: [UInt8]) { self.peerKey = peerKey }
}

/// What arrived from one peer for one subscription during one session: the receiving side of
/// sync status (``ReplicatorStatus/Subscription/progress``).
public struct SyncProgress: Sendable, Equatable {
    /// Documents received (including tombstones and documents refused or deferred by the store).
    public var documents: Int = 0
    /// Batches received.
    public var batches: Int = 0
    /// When the last batch arrived, on the replicator's clock (monotonic milliseconds).
    public var lastReceived: Millis?
    /// The peer's count of log entries still to send after its last batch (an upper bound on
    /// the documents still to come); `nil` before the first batch or when the peer did not say.
    public var left: Int64?
    /// Whether the peer has sent everything it held for this subscription at least once in this
    /// session (a batch with `left` 0). Later changes keep flowing as they happen.
    public var initialSyncComplete = false

    public init() {}

    /// Fraction of the initial sync done, 0...1: documents received against documents received
    /// plus `left`; 1 once complete; `nil` before the first batch.
    public var fraction: Double? {
        if initialSyncComplete { return 1 }
        guard let left, batches > 0 else { return nil }
        let total = Double(documents) + Double(left)
        return total == 0 ? 1 : Double(documents) / total
    }
}
