internal import CSQLite
import Foundation
import Synchronization
public import TrellisCore

/// Options for opening a ``DocumentStore``.
public struct StoreOptions: Sendable {
    /// Documents whose stored size (value and CRDT metadata) exceeds this are rejected: a local
    /// write that would take a document above it, or further above it, is refused. Bytes.
    public var maxDocumentBytes: Int = 5 * 1024 * 1024
    /// The largest document a merge of peers' states may make, bytes (`nil`: four times
    /// ``maxDocumentBytes``, 20 MiB by default). Writes made apart, each within
    /// ``maxDocumentBytes``, can merge into a larger document, and every node must keep that
    /// merge to converge: a merge is applied up to this ceiling, and only a document above it is
    /// deferred (kept and retried). Peers are sent states up to it too. See docs/DATA-MODEL.md,
    /// "Size limits".
    public var maxMergedDocumentBytes: Int?
    /// ``maxMergedDocumentBytes``, or its default.
    public var mergedDocumentCeiling: Int { maxMergedDocumentBytes ?? 4 * maxDocumentBytes }
    /// Documents above this size are accepted with a warning. Bytes.
    public var warnDocumentBytes: Int = 256 * 1024
    /// How far a remote document's latest stamp may lead this node's time, milliseconds: the
    /// later of its physical clock and the latest stamp its hybrid logical clock has issued or
    /// seen. A document further ahead is deferred (kept, and applied once the clock has caught
    /// up); see docs/DATA-MODEL.md, "Stamps and the clock".
    public var maxClockDrift: UInt64 = 60_000
    /// At most this many deferred documents are kept per peer; a batch that would keep more is
    /// refused whole (``StoreError/deferredLimit(_:)``), its checkpoint not stored.
    public var maxDeferredDocumentsPerPeer = 10_000
    /// At most this many bytes of deferred states are kept per peer; beyond, as
    /// ``maxDeferredDocumentsPerPeer``.
    public var maxDeferredBytesPerPeer = 64 * 1024 * 1024
    /// How commits reach the disk; see ``Durability``.
    public var durability = Durability.normal
    /// How long a tombstone (a removed document) is kept before it is reaped: milliseconds since
    /// its newest stamp (the remove, or a later write it covers). 7 days by default, the order
    /// that Ditto and Couchbase Lite users expect: a node away for a long weekend or a holiday
    /// week still receives the removes as tombstones; one away longer gets them back through the
    /// reaped keys (``reapedKeyRetention``; see docs/DATA-MODEL.md, "Tombstones and reaping").
    /// Reaping runs from the sync host (at start, then every minute) in bounded transactions
    /// (``DocumentStore/reapExpiredTombstones(limit:)``).
    public var tombstoneTTL: UInt64 = 7 * 24 * 3_600_000
    /// How long the key and remove time of a reaped tombstone are remembered, milliseconds after
    /// it was reaped, so that a stale copy of the document (from a node that was away longer than
    /// ``tombstoneTTL``) is removed again instead of coming back; `nil` keeps them for the life
    /// of the store. 180 days by default: a row of a few dozen bytes per removed document, outside
    /// the change log. A node away longer than TTL plus this can bring reaped documents back.
    public var reapedKeyRetention: UInt64? = 180 * 24 * 3_600_000
    /// The file holding the system's boot ID (Linux: `/proc/sys/kernel/random/boot_id`), read at
    /// open to tell a restart of the process from a restart of the system. Unreadable means
    /// unknown: an unclean shutdown is then always treated as one across a restart of the system.
    public var bootIDPath = "/proc/sys/kernel/random/boot_id"
    /// Open without writing anything (inspecting a store a running node owns); writes then fail.
    public var readOnly = false
    /// Where the store draws a new store's site ID and epoch, and the `_id`s of documents given
    /// without one, from: the system's random source by default; a simulation passes a seeded one
    /// so that a seed fixes every identity.
    public var random: @Sendable () -> UInt64 = { UInt64.random(in: .min ... .max) }
    /// Physical time in milliseconds since the Unix epoch; injected so tests control the clock.
    public var now: @Sendable () -> UInt64 = { UInt64(Date().timeIntervalSince1970 * 1000) }
    /// Milliseconds since a fixed point of this process (the system's uptime by default): a clock
    /// that setting the wall clock does not move. The reaper goes by ``now`` but never further
    /// than this says passed since its previous run (``DocumentStore/reapExpiredTombstones(limit:)``);
    /// a simulation passes its own time without the node's clock offset.
    public var elapsed: @Sendable () -> UInt64 = { DispatchTime.now().uptimeNanoseconds / 1_000_000 }
    /// Where warnings go (oversized documents, far-future remote stamps).
    public var log: @Sendable (String) -> Void = { message in
        FileHandle.standardError.write(Data("trellis: warning: \(message)\n".utf8))
    }

    /// WAL pages at which a background checkpoint starts, and at which a commit checkpoints
    /// itself (``WALCheckpointer``); small values let tests reach both.
    var walCheckpointPages = (threshold: WALCheckpointer.defaultThreshold, limit: WALCheckpointer.defaultLimit)
    /// The size a rewound WAL file is cut back to (`PRAGMA journal_size_limit`): the threshold's
    /// pages of 4 KiB, 4 MiB by default, about what SQLite's automatic checkpoint kept it at.
    var walSizeLimitBytes: Int { Int(walCheckpointPages.threshold) * 4_096 }

    public init() {}
}

/// How commits reach the disk.
public enum Durability: Sendable, Hashable {
    /// SQLite's `synchronous=NORMAL` in WAL mode (the default): a commit survives a crash of the
    /// process, but a power loss or a crash of the system may take back the last commits, after
    /// peers may have received them. The store detects that case when it is next opened (it was
    /// not closed, and the system restarted since) and rotates its log (``DocumentStore/rotateLog(reason:)``),
    /// so peers resync and no `seq` or stamp is issued twice.
    case normal
    /// SQLite's `synchronous=FULL`: every commit is on disk before it returns (an `fsync` per
    /// commit), so no commit is ever taken back. Slower for small transactions; see
    /// docs/BENCHMARKS.md.
    case full
}

/// Errors from the document store.
public enum StoreError: Error, Sendable, CustomStringConvertible, Equatable {
    case notAMap(String)
    case invalidID(String)
    case idChanged
    case documentTooLarge(id: String, bytes: Int, limit: Int)
    case invalidValue(String)
    case corrupt(String)
    case sqlite(String)
    /// A remote batch was refused whole because the documents deferred from its peer would exceed
    /// the bounds of ``StoreOptions``; nothing of it was applied and its checkpoint was not stored.
    case deferredLimit(String)
    /// A remote batch carried a delta (``StateDelta``) this store cannot apply (it does not hold
    /// the state the delta is based on, or would not apply the state now); nothing of the piece
    /// under way was applied and the checkpoint was not stored: the peer is asked for the whole
    /// states again.
    case needsWholeState(String)
    /// The store was closed (``DocumentStore/close()``).
    case closed

    /// Whether the error refuses one document for what it holds (the store and the other
    /// documents are fine): not a map, a bad `_id`, a value the store cannot hold, too large.
    public var refusesOneDocument: Bool {
        switch self {
        case .notAMap, .invalidID, .invalidValue, .documentTooLarge: return true
        default: return false
        }
    }

    public var description: String {
        switch self {
        case .notAMap(let what): return "a document must be a JSON object, got \(what)"
        case .invalidID(let why): return "invalid _id: \(why)"
        case .idChanged: return "_id cannot change"
        case .documentTooLarge(let id, let bytes, let limit):
            return "document \(id) is \(bytes) bytes with metadata, above the limit of \(limit) bytes"
        case .invalidValue(let why): return why
        case .corrupt(let why): return "corrupt store: \(why)"
        case .sqlite(let why): return why
        case .deferredLimit(let why): return why
        case .needsWholeState(let why): return why
        case .closed: return "the store is closed"
        }
    }
}

/// A document checked and encoded for a streamed upsert by ``DocumentStore/prepareUpsert(_:)``,
/// or the error the store refuses it with.
public struct PreparedUpsert: Sendable {
    struct Checked: Sendable {
        /// `nil`: the document has no `_id`; the store draws one.
        var id: Value?
        var key: String?
        var fields: UTF8Map<Value>
        /// The JSON the document is stored as when new, when its `_id` is known.
        var json: String?
    }

    let checked: Result<Checked, StoreError>
}

/// One entry of the change log: a document's latest state at its `seq`.
public struct ChangeRecord: Sendable, Equatable {
    /// The entry's position in this store's change log.
    public var seq: Int64
    public var collection: String
    /// The document's `_id`.
    public var id: Value
    /// The canonical key of the `_id` (``DocumentStore/key(for:)``).
    public var key: String
    /// The whole CRDT state, CBOR-encoded (``DocumentState/cbor()``), as peers receive it.
    public var state: [UInt8]
    /// `true` for a tombstone.
    public var isDeleted: Bool
    /// `true` when the document holds a write of this node that no peer has acknowledged yet
    /// (``DocumentStore/acknowledge(_:)``).
    public var holdsUnacknowledgedWrite: Bool
    /// `true` for an evicted document's stub, offered whole while it holds such a write
    /// (``DocumentStore/evict(id:in:)``).
    public var isEvictionStub: Bool
    /// The delta of the local writes since the row's base (``StateDelta``, encoded) and the row's
    /// `seq` when its state was that base, or `nil`: what a peer holding that base may be sent
    /// instead of `state` (docs/DELTAS.md).
    public var delta: LogDelta?

    public init(
        seq: Int64, collection: String, id: Value, key: String, state: [UInt8], isDeleted: Bool,
        holdsUnacknowledgedWrite: Bool = false, isEvictionStub: Bool = false,
        delta: LogDelta? = nil
    ) {
        self.seq = seq
        self.collection = collection
        self.id = id
        self.key = key
        self.state = state
        self.isDeleted = isDeleted
        self.holdsUnacknowledgedWrite = holdsUnacknowledgedWrite
        self.isEvictionStub = isEvictionStub
        self.delta = delta
    }
}

/// A change-log entry that a page passed over without returning it: a damaged row (its state or
/// JSON does not decode) or a state above this store's size limit.
public struct SkippedRecord: Sendable, Equatable {
    public var seq: Int64
    public var collection: String
    /// The canonical key of the document's `_id`.
    public var key: String
    /// Why it was skipped, naming the problem.
    public var reason: String

    public init(seq: Int64, collection: String, key: String, reason: String) {
        self.seq = seq
        self.collection = collection
        self.key = key
        self.reason = reason
    }
}

/// A page of one collection's change log (``DocumentStore/changes(in:after:limit:maxBytes:matching:args:)``).
public struct ChangePage: Sendable {
    /// The entries that match (plus every tombstone), in `seq` order.
    public var records: [ChangeRecord]
    /// The last `seq` examined: the cursor for the next page.
    public var scannedUpTo: Int64
    /// `true` when the page reached the end of the log.
    public var exhausted: Bool
    /// Entries examined but not returned (damaged rows, states above the size limit), in `seq` order.
    public var skipped: [SkippedRecord]
    /// `true` when the cursor asked for was above 0 but below the collection's retained floor
    /// (``DocumentStore/retainedFloor(in:)``): tombstones after it were reaped, so a reader that
    /// resumed from a stored cursor must start over from 0.
    public var belowFloor = false
    /// The collection's retained floor when the page was read (``DocumentStore/retainedFloor(in:)``).
    public var floor: Int64 = 0
    /// For a page read with ``PageReader/sendsHeld`` for a peer that holds documents from a
    /// whole-collection service: ``WholeHeld/changedAfter``, after which changes to them were
    /// looked for. `nil` otherwise.
    public var heldFrom: Int64?

    public init(records: [ChangeRecord], scannedUpTo: Int64, exhausted: Bool, skipped: [SkippedRecord] = []) {
        self.records = records
        self.scannedUpTo = scannedUpTo
        self.exhausted = exhausted
        self.skipped = skipped
    }
}

/// A selected document: its key (``DocumentStore/key(for:)``, the canonical JSON of its `_id`)
/// and its stored JSON, parsed when read.
public typealias StoredRow = (key: String, json: StoredJSON)

/// A document received from a peer, to be merged: its collection, `_id` and CBOR state.
public typealias RemoteDocument = WireDocument

/// What a commit changed, delivered to observers after the transaction commits, on the store's
/// event queue (see ``DocumentStore/addObserver(_:)``).
public struct StoreEvent: Sendable {
    /// Collections with at least one changed document. Names compare byte-wise (``UTF8Key``):
    /// "é" and "e" + U+0301 are two collections.
    public var collections: Set<UTF8Key>
    /// The peer whose batch caused the change; `nil` for local writes.
    public var origin: [UInt8]?
    /// `true` when documents were evicted: ``changedKeys`` names them, and the sync engine asks
    /// peers for exactly those again while a subscription matches them.
    public var evicted = false
    /// The canonical keys (``DocumentStore/key(for:)``) of the changed documents, by collection:
    /// exactly the document rows this commit changed (write, remove, merge, evict). Collection
    /// names and keys compare byte-wise (``UTF8Key``). A collection in which one commit changed
    /// more than ``DocumentStore/maxListedKeys`` documents (a large import) is in
    /// ``unlistedCollections`` instead, so that a transaction's memory does not grow with its size.
    public var changedKeys: [UTF8Key: Set<UTF8Key>] = [:]
    /// Collections in which this commit changed too many documents to list them: any of their
    /// documents may have changed (evictions are always listed).
    public var unlistedCollections: Set<UTF8Key> = []
    /// The value each document this commit wrote has after it, by collection and canonical key:
    /// its JSON text, or `nil` when it is absent (removed or evicted). It lets an observer see
    /// this commit's state even when later commits have already landed. A listed key without an
    /// entry here was not rewritten (only its `seq` moved) or its value was not kept: the values
    /// a commit carries are capped at ``DocumentStore/maxEventValueBytes`` bytes in all (read
    /// the store for the others).
    public var changedValues: [UTF8Key: [UTF8Key: String?]] = [:]
    /// The store's last `seq` once this commit is in (``DocumentStore/lastSeq``): events come in
    /// increasing order of it, and a read that saw this `lastSeq` already includes this commit.
    public var lastSeq: Int64 = 0
    /// For each collection in which every changed document was checked against the query
    /// subscriptions this store serves (scope tracking), which were checked and which a change
    /// concerns. A collection absent was not fully checked: any subscription may be concerned.
    public var scopeChecks: [UTF8Key: ScopeCheck] = [:]
    /// The listed keys (in ``changedKeys``) whose row this commit only renumbered, by collection:
    /// their `seq` moved so that a peer's scan reads them again, and their value did not change
    /// (the commit did not write them). Live queries pass over them.
    public var renumberedKeys: [UTF8Key: Set<UTF8Key>] = [:]
    /// Collections in which this commit, a local write, created a document with an `_id` the
    /// caller gave (not a UUID made for the write): one that had no row here, nor a reaped
    /// tombstone kept with its state. A peer may have removed and reaped a document with that
    /// `_id` before this node asked it, so the sync engine asks the peers it
    /// asked without `h` in the collection again with it (docs/DATA-MODEL.md, "A subscriber from
    /// 0 that holds rows"); the store already marked their checkpoints (``ReapedKeys/wanted``).
    public var createdCollections: Set<UTF8Key> = []
}

/// The served query subscriptions one commit was checked against in one collection
/// (``StoreEvent/scopeChecks``), by ``SubscriptionSpec/scopeHash``.
public struct ScopeCheck: Sendable, Equatable {
    /// The subscriptions every changed document of the collection was checked against.
    public var checked: Set<Int64>
    /// Those a changed document concerns: it matches the query now, matched it before the commit,
    /// or is recorded in the subscription's scope (the subscriber holds it).
    public var concerned: Set<Int64>

    public init(checked: Set<Int64>, concerned: Set<Int64>) {
        self.checked = checked
        self.concerned = concerned
    }

    /// The checked subscriptions no change concerns: their scans may wait for a later commit.
    public var unconcerned: Set<Int64> { checked.subtracting(concerned) }
}

/// The per-document outcome of merging a remote batch (``DocumentStore/merge(_:from:checkpoint:)``).
///
/// Every document of the batch is counted in exactly one place: applied (or already known),
/// `deferred` (kept in the store and retried), or `rejected` (it cannot even be named).
public struct MergeOutcome: Sendable {
    /// Documents whose local state changed.
    public var applied: Int
    /// Documents kept in the deferred table instead of being applied: their canonical `_id` key
    /// and why (see ``DocumentStore/deferredDocuments()``).
    public var deferred: [(key: String, reason: String)]
    /// Documents that cannot be kept because they cannot be named (a bad `_id`): the `_id` as JSON
    /// text and why.
    public var rejected: [(id: String, reason: String)]
    /// Documents applied as removed again: stale copies of documents removed here whose tombstone
    /// was reaped (their canonical `_id` keys; counted in ``applied`` too). See
    /// ``DocumentStore/reapExpiredTombstones(limit:)``.
    public var revived: [String] = []
    /// The `_id`s of documents applied that still withhold a value: an evicted document's stub
    /// brought back by a copy older than the one evicted, or a document that withheld one before
    /// and took a change without it (docs/MESH.md, "Eviction"). The replicator asks its other
    /// peers for them again (``Replicator/applied(_:subscription:upTo:checkpointStored:deferred:withholding:now:)``).
    public var withholding: [Value] = []
    /// Documents the sender holds an older state of, left to the scans of its query
    /// subscriptions, some of which have yet to read their rows (the others sent them in this
    /// session, ``DocumentStore/merge(_:from:checkpoint:heldBy:heldScans:unserved:)``): the
    /// sync engine makes those scans run, and they send the newer states.
    public var heldBehind = 0
    /// What the checkpoint stored with the batch says of the peer's reaped tombstones, when one
    /// was stored: the one asked for, or ``ReapedKeys/wanted`` where that was
    /// ``ReapedKeys/notAsked`` and a local write created a document of the collection since the
    /// store was opened (``DocumentStore/checkpointReapedKeys(_:_:_:)``).
    public var storedReapedKeys: ReapedKeys?
    /// Documents applied or deferred whose arriving state may hold a live document (not a
    /// tombstone's whole state): each of this node's checkpoints in the collection on another
    /// peer that was ``ReapedKeys/notAsked`` becomes ``ReapedKeys/wanted`` in the same transaction.
    public var live = 0

    public init(
        applied: Int = 0, deferred: [(key: String, reason: String)] = [], rejected: [(id: String, reason: String)] = []
    ) {
        self.applied = applied
        self.deferred = deferred
        self.rejected = rejected
    }
}

/// A remote document state kept because it could not be applied yet
/// (``DocumentStore/deferredDocuments()``).
public struct DeferredDocument: Sendable, Equatable {
    public var collection: String
    /// The canonical key of the `_id` (``DocumentStore/key(for:)``).
    public var key: String
    /// The peer key of the peer that sent it.
    public var peer: [UInt8]
    /// Why it is not applied yet (the latest attempt's reason).
    public var reason: String
    /// When it was first deferred: milliseconds since the Unix epoch, by this store's clock.
    public var since: UInt64
    /// How many times ``DocumentStore/retryDeferred()`` tried it again.
    public var attempts: Int

    public init(collection: String, key: String, peer: [UInt8], reason: String, since: UInt64, attempts: Int) {
        self.collection = collection
        self.key = key
        self.peer = peer
        self.reason = reason
        self.since = since
        self.attempts = attempts
    }
}

/// The local document store: SQLite in WAL mode holding every document's CRDT state, its
/// materialised JSON value (so SQLite's JSON functions can serve queries), and the per-store
/// change log ordered by `seq`.
///
/// All access goes through one lock that owns the connection (the single writer), except a lookup
/// by `_id` (``document(id:in:)``), which in WAL mode reads on a second, read-only connection and
/// so never waits for a write in progress. Observers are
/// called after commit on the store's own serial event queue, never under the lock and never on
/// the thread that committed.
public final class DocumentStore: Sendable {
    struct State {
        let db: Connection
        var clock: HybridLogicalClock
        /// The clock's ceiling saved in `meta` (`hlc`): at or above every stamp issued or adopted,
        /// so a commit whose clock stays at or below it saves nothing (``saveClock(_:)``).
        var savedClock: HLCTimestamp = .zero
        var nextSeq: Int64
        /// The site ID stamping this store's writes; changes only when the log is rotated.
        var siteID: SiteID
        /// The random ID of this life of the log; changes only when the log is rotated.
        var epoch: [UInt8]
        /// Documents changed by the transaction under way, by collection.
        var changedKeys: [UTF8Key: Set<UTF8Key>] = [:]
        /// Collections with more changed documents in the transaction under way than are listed.
        var unlistedCollections: Set<UTF8Key> = []
        /// Listed keys the transaction under way only renumbered (``StoreEvent/renumberedKeys``).
        var renumberedKeys: [UTF8Key: Set<UTF8Key>] = [:]
        /// The values the transaction under way wrote, for its event (``StoreEvent/changedValues``).
        var changedValues: [UTF8Key: [UTF8Key: String?]] = [:]
        /// The bytes of JSON text in ``changedValues``, within ``DocumentStore/maxEventValueBytes``.
        var changedValueBytes = 0
        /// Whether the transaction under way evicted documents.
        var evictedInCommit = false
        /// Collections in which the transaction under way created a document by a local write
        /// (``StoreEvent/createdCollections``, ``DocumentStore/noteCreated(_:_:)``); few, so a list.
        var createdIn: [String] = []
        /// Collections in which a committed local write created a document since the store was
        /// opened: a checkpoint stored later in one of them is never ``ReapedKeys/notAsked``
        /// (``DocumentStore/checkpointReapedKeys(_:_:_:)``).
        var createdSinceOpen: Set<String> = []
        /// Per document, the latest `seq` of this node's log a peer acknowledged, since open
        /// (``DocumentStore/acknowledge(_:)``); at most ``DocumentStore/maxAcknowledgedWrites``.
        var acknowledged: [DocumentKey: Int64] = [:]
        /// The number of rows in the `deferred` table (0 lets merges skip looking there).
        var deferredRows = 0
        /// Set by ``DocumentStore/close()``: every later access throws ``StoreError/closed``.
        var closed = false
        /// Damaged rows met since open, with the reason (``DocumentStore/damagedDocuments()``).
        var damaged: [DocumentKey: String] = [:]
        /// Whether the last local upsert found no row for its document (the next one then tries
        /// to insert first, ``DocumentStore/upsert(_:in:)``).
        var upsertsFindNoRow = true
        /// The reaper's last time and the ``StoreOptions/elapsed`` reading it was taken at
        /// (``DocumentStore/reaperNow(_:)``).
        var reaperClock: (now: UInt64, elapsed: UInt64)?
        /// The reaped tombstones ``DocumentStore/row(_:_:_:)`` stood in for a missing row, each with
        /// the `seq` the document was born with (`nil`: unknown, born before every `seq`): the
        /// write of that row forgets the key, and gives the row that birth
        /// (``DocumentStore/writeRow``).
        var reapedRowsRead: [DocumentKey: Int64?] = [:]
        /// The collections that may hold a string with U+0000 (DocumentStore+NULStrings.swift).
        var nulCollections: Set<UTF8Key> = []
        /// Each collection's rescan generation (``DocumentStore/rescanGeneration(collection:)``).
        var rescanGenerations: [UTF8Key: UInt32] = [:]
        /// The query subscriptions served to peers, by collection (DocumentStore+Scope.swift).
        var servedScopes: [UTF8Key: [ServedScope]] = [:] {
            didSet { servedScopeIndexes = [:] }
        }
        /// ``servedScopes`` indexed for commits, built when first needed.
        var servedScopeIndexes: [UTF8Key: ServedScopeIndex] = [:]
        /// This transaction's scope checks, by collection: the keys checked against the served
        /// query subscriptions, the subscriptions every one of them was checked against, and
        /// those a change concerns (``StoreEvent/scopeChecks``).
        var scopeChecked: [UTF8Key: (keys: Set<UTF8Key>, check: ScopeCheck)] = [:]
        /// When each served subscription was last recorded as used (ms), this run.
        var servedUsed: [Int64: UInt64] = [:]
        var servedCount = 0
        /// Per peer and collection, the `seq` of the peer's log after which it sent documents
        /// that no scope records (the `unrecorded` table, DocumentStore+Scope.swift).
        var unrecorded: [PeerCollection: Int64] = [:]
        /// Per peer and collection, the query subscriptions whose scopes record what the peer
        /// holds although it is no longer served them (the `held_through` table).
        var heldThrough: [PeerCollection: Set<Int64>] = [:]
        /// Per peer and collection, what it may hold because this node served it the whole
        /// collection (the `whole_held` table, DocumentStore+Scope.swift).
        var wholeHeld = WholeHeldRecords()
        /// The number of rows in the `reaped` table (0 lets merges skip looking there).
        var reapedRows = 0
        /// The number of rows in the `withholding` table (0 lets merges skip clearing there):
        /// documents brought back from eviction that still withhold a value
        /// (DocumentStore+Withholding.swift).
        var withholdingRows = 0

        /// A new stamp for a local write at physical time `now` (milliseconds).
        mutating func stamp(now: UInt64) -> Stamp { Stamp(time: clock.now(physicalMillis: now), site: siteID) }

        /// The stamp of default data: HLC time zero and this store's site, below every real write.
        var defaultStamp: Stamp { Stamp(time: .zero, site: siteID) }
    }

    let state: Mutex<State>
    /// How many writers wait for the store lock right now (``write(durable:origin:_:)``): a remote
    /// merge, which holds it for a batch, commits what it has and lets them in when this is above
    /// zero. Readers are not counted: a live query that re-runs on each commit would otherwise
    /// cut every batch into pieces of a few documents.
    let writersWaiting = Atomic<Int>(0)
    let observers = ObserverList()
    /// Delivers commit events to observers, one at a time, in commit order.
    let events = DispatchQueue(label: "trellis.store.events")
    /// What ``restoreSnapshot()`` goes back to (DocumentStore+Snapshot.swift).
    let savedSnapshot = Mutex<SnapshotBox?>(nil)
    /// Whatever the owner handed in to live as long as the store (the data directory's lock).
    private let lock: (any Sendable)?
    /// Checkpoints the WAL off the writer's path (`nil` read-only or when not in WAL mode).
    let checkpointer: WALCheckpointer?
    /// A second, read-only connection for ``document(id:in:)``: in WAL mode it reads the last
    /// commit while the writer holds the store lock (a merge's transaction of a whole batch), so
    /// a lookup by `_id` waits for no write. `nil` read-only, in memory, or when not in WAL mode;
    /// emptied by ``close()`` before the writer's connection closes.
    let reader: Mutex<Connection?>
    public let options: StoreOptions
    /// The site ID stamping this store's writes: random, persistent, replaced when the log is
    /// rotated (``rotateLog(reason:)``). Read under the store lock.
    public var siteID: SiteID { state.withLock { $0.siteID } }
    /// The random ID of this life of the store's log (16 bytes): peers' checkpoints and contacts
    /// anchors name it; replaced when the log is rotated (``rotateLog(reason:)``). Read under the
    /// store lock.
    public var epoch: [UInt8] { state.withLock { $0.epoch } }
    /// The path of the SQLite database file.
    public let path: String

    /// The `_id` key of a row, read from its row key `k` (docs/ARCHITECTURE.md, "The row key"):
    /// the bytes after the collection's length, the collection and two `:`. Plain SQL, so any
    /// connection reads `documents.id`, also one without the store's functions.
    static let idFromKeySQL =
        "CAST(substr(CAST(k AS BLOB), length(CAST(collection AS BLOB)) + length(length(CAST(collection AS BLOB))) + 3) "
        + "AS TEXT)"

    /// The bytes of a row key `k` before the `_id` key in `collection`: its length in decimal,
    /// `:`, the collection, `:` (`trellis_key`). Hot reads select `k` and drop these rather than
    /// select the computed `id` column.
    static func keyPrefixLength(_ collection: String) -> Int { keyPrefixLength(byteCount: collection.utf8.count) }

    /// ``keyPrefixLength(_:)`` for a collection name of `count` bytes.
    static func keyPrefixLength(byteCount count: Int) -> Int { String(count).utf8.count + count + 2 }

    static let schema = """
        PRAGMA journal_mode=WAL;
        CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value BLOB) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS documents(
            k TEXT NOT NULL PRIMARY KEY,
            collection TEXT NOT NULL,
            id TEXT GENERATED ALWAYS AS (\(idFromKeySQL)) VIRTUAL,
            seq INTEGER NOT NULL,
            deleted INTEGER NOT NULL,
            state BLOB NOT NULL,
            value TEXT,
            removed_at INTEGER,
            delta BLOB,
            delta_seq INTEGER,
            age INTEGER,
            unacked INTEGER
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS documents_by_collection_seq ON documents(collection, seq);
        CREATE TABLE IF NOT EXISTS checkpoints(
            peer BLOB NOT NULL,
            subscription TEXT NOT NULL,
            epoch BLOB NOT NULL,
            seq INTEGER NOT NULL,
            collection TEXT NOT NULL DEFAULT '',
            reaped INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY(peer, subscription)
        ) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS deferred(
            collection TEXT NOT NULL,
            id TEXT NOT NULL,
            peer BLOB NOT NULL,
            state BLOB NOT NULL,
            reason TEXT NOT NULL,
            kind TEXT NOT NULL,
            ready INTEGER NOT NULL,
            since INTEGER NOT NULL,
            attempts INTEGER NOT NULL,
            PRIMARY KEY(collection, id, peer)
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS deferred_by_peer ON deferred(peer);
        CREATE TABLE IF NOT EXISTS reaped(
            collection TEXT NOT NULL,
            id TEXT NOT NULL,
            removed_at INTEGER NOT NULL,
            reaped_at INTEGER NOT NULL,
            state BLOB,
            seq INTEGER,
            age INTEGER,
            PRIMARY KEY(collection, id)
        ) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS withholding(
            collection TEXT NOT NULL,
            id TEXT NOT NULL,
            PRIMARY KEY(collection, id)
        ) WITHOUT ROWID;
        """

    /// Opens (creating if needed) the store at `path`.
    ///
    /// Opening for writing records that the store is open (with the system's boot ID) until
    /// ``close()``; when the previous run did not close the store and the system restarted since,
    /// its last commits may have been lost after peers received them, so the log is rotated
    /// (``rotateLog(reason:)``). The next `seq` is above every `seq` issued before, also for a store
    /// restored from a backup (see ``lastSeq``).
    ///
    /// - Parameters:
    ///   - path: the SQLite database file.
    ///   - options: limits, clock, durability; see ``StoreOptions``.
    ///   - lock: an object the store keeps alive until it is released itself, such as the data
    ///     directory's lock: then the lock lasts as long as anything can write through the store.
    /// - Throws: ``StoreError/corrupt(_:)`` when the file is not a Trellis store,
    ///   ``StoreError/sqlite(_:)`` when it cannot be opened.
    public init(path: String, options: StoreOptions = StoreOptions(), lock: (any Sendable)? = nil) throws(StoreError) {
        self.path = path
        self.options = options
        self.lock = lock
        do {
            let db = options.readOnly ? try Self.openReadOnly(path) : try Connection(path: path)
            let opened: OpenedLog
            if options.readOnly {
                // Inspect without writing anything, not even the schema.
                guard try Self.hasTable(db, "meta"), try Self.meta(db, "site") != nil else {
                    // A node creating the store right now has not written its site ID yet.
                    throw StoreError.corrupt(
                        "\(path) is not a Trellis store, or not yet: a node may be creating it at this moment "
                            + "(try again), else it is another SQLite database (no site ID)")
                }
                guard try !Self.hasTable(db, "documents") || Self.hasRowKey(db) else {
                    throw StoreError.invalidValue(
                        "\(path) was written by an earlier version of Trellis, whose documents table this version "
                            + "reads only after upgrading it; open it for writing once (start its node) to upgrade it")
                }
                opened = try db.transaction(readOnly: true) { try Self.readLog(db) }
            } else {
                try db.execute(Self.schema)
                try db.execute(Self.scopeSchema)
                try Self.migrate(db)
                // The open marker and any rotation are on disk before anything else is written.
                try db.execute("PRAGMA synchronous=FULL")
                opened = try db.transaction { try Self.openLog(db, path: path, options: options) }
                try db.execute(Self.synchronousPragma(options.durability))
            }
            if !options.readOnly, try Self.journalMode(db) == "wal" {
                // A WAL that grew during a burst (up to the checkpointer's limit) is cut back to
                // this size when it is next rewound, instead of keeping its size on disk.
                try db.execute("PRAGMA journal_size_limit=\(options.walSizeLimitBytes)")
                checkpointer = WALCheckpointer(
                    db: db, path: path, threshold: options.walCheckpointPages.threshold,
                    limit: options.walCheckpointPages.limit, log: options.log)
                reader = Mutex(try? Connection(path: path, readOnly: true))
            } else {
                checkpointer = nil
                reader = Mutex(nil)
            }
            for message in opened.messages { options.log(message) }
            var state = State(
                db: db,
                clock: HybridLogicalClock(last: opened.clock, maxForwardDrift: options.maxClockDrift),
                nextSeq: opened.nextSeq, siteID: opened.site, epoch: opened.epoch)
            state.savedClock = opened.clock
            let generations = try db.prepare("SELECT key, value FROM meta WHERE key >= 'rescan:' AND key < 'rescan;'")
            while try generations.step() {
                let key = generations.string(0) ?? ""
                state.rescanGenerations[
                    UTF8Key(String(decoding: key.utf8.dropFirst("rescan:".utf8.count), as: UTF8.self))] = UInt32(
                        truncatingIfNeeded: Self.uint64(generations.bytes(1) ?? []))
            }
            generations.reset()
            try Self.loadTombstoneState(db, into: &state)
            try Self.loadWithholding(db, into: &state, readOnly: options.readOnly)
            state.nulCollections = try Self.loadNULCollections(db, readOnly: options.readOnly)
            state.servedScopes = try Self.loadServedScopes(db)
            state.servedCount = state.servedScopes.values.reduce(0) { $0 + $1.count }
            state.unrecorded = try Self.loadUnrecorded(db)
            state.heldThrough = try Self.loadHeldThrough(db)
            state.wholeHeld = try Self.loadWholeHeld(db)
            if try Self.hasTable(db, "deferred") {
                let count = try db.prepare("SELECT count(*) FROM deferred")
                _ = try count.step()
                state.deferredRows = Int(count.int64(0))
                count.reset()
                if !options.readOnly {
                    // A new version or new limits may accept what an earlier run could not.
                    try db.execute("UPDATE deferred SET ready = 0 WHERE kind != 'clock'")
                }
            }
            self.state = Mutex(state)
        } catch let error as StoreError {
            throw error
        } catch let error as SQLiteError where error.code == 26 {  // SQLITE_NOTADB
            throw .corrupt("\(path) is not a Trellis store (SQLite: \(error.message))")
        } catch {
            throw .sqlite("opening \(path): \(error)")
        }
    }

    deinit { close() }

    /// Why `path` holds no store to read, in the same words for every reader, naming the
    /// directory: `no Trellis store in DIR (no such directory)` or
    /// `no Trellis store in DIR (it holds no store.sqlite)`; `nil` when the file exists.
    public static func missingStore(_ path: String) -> String? {
        guard !FileManager.default.fileExists(atPath: path) else { return nil }
        let url = URL(fileURLWithPath: path)
        let directory = url.deletingLastPathComponent().path
        var isDirectory: ObjCBool = false
        let why =
            !FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory)
            ? "no such directory"
            : isDirectory.boolValue ? "it holds no \(url.lastPathComponent)" : "it is not a directory"
        return "no Trellis store in \(directory) (\(why))"
    }

    /// Opens `path` for reading, also where this user may not write: a store in write-ahead-log
    /// mode is read through an index file beside it (`-shm`), which SQLite creates, and cannot
    /// where the directory or the file is not writable. When no write-ahead log holds commits
    /// (the node that wrote the store has stopped), the file is read as it is, without the index;
    /// otherwise the error says why in words.
    ///
    /// - Throws: ``StoreError/sqlite(_:)`` naming the file and the permission missing, or
    ///   ``missingStore(_:)``'s words when there is no such file.
    static func openReadOnly(_ path: String) throws(StoreError) -> Connection {
        if let missing = missingStore(path) { throw .sqlite(missing) }
        func probe(_ db: Connection) throws { _ = try hasTable(db, "meta") }
        do {
            let db = try Connection(path: path, readOnly: true)
            try probe(db)  // the first read opens the log index
            return db
        } catch let error as SQLiteError where error.code == 14 || error.code == 8 {  // CANTOPEN, READONLY
            guard FileManager.default.isReadableFile(atPath: path) else {
                throw .sqlite("cannot read \(path): this user may not read it")
            }
            let wal = path + "-wal"
            let walBytes = (try? FileManager.default.attributesOfItem(atPath: wal)[.size] as? Int) ?? 0
            guard walBytes == 0 else {
                let directory = (path as NSString).deletingLastPathComponent
                throw .sqlite(
                    "cannot read \(path): its write-ahead log (\(wal), \(walBytes) bytes) is read through "
                        + "an index file SQLite must create or open for writing beside it, and this user may not "
                        + "write in \(directory); run as the user that owns the store, or read it once the node "
                        + "that writes it has stopped")
            }
            do {
                let db = try Connection(path: path, readOnly: true, immutable: true)
                try probe(db)
                return db
            } catch {
                throw .sqlite("cannot read \(path): \(error)")
            }
        } catch let error as SQLiteError where error.code == 26 {  // SQLITE_NOTADB
            throw .corrupt("\(path) is not a Trellis store (SQLite: \(error.message))")
        } catch {
            throw .sqlite("opening \(path): \(error)")
        }
    }

    /// The connection's journal mode (`wal` for a file, `memory` for an in-memory database).
    static func journalMode(_ db: Connection) throws -> String {
        let s = try db.prepare("PRAGMA journal_mode")
        defer { s.reset() }
        return try s.step() ? (s.string(0) ?? "") : ""
    }

    static func hasTable(_ db: Connection, _ name: String) throws -> Bool {
        let s = try db.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?")
        s.bind(1, name)
        defer { s.reset() }
        return try s.step()
    }

    static func uint64(_ bytes: [UInt8]) -> UInt64 {
        var v: UInt64 = 0
        for b in bytes.prefix(8) { v = v << 8 | UInt64(b) }
        return v
    }

    static func bytes(_ v: UInt64) -> [UInt8] {
        (0..<8).map { UInt8(truncatingIfNeeded: v >> (56 - 8 * $0)) }
    }

    static func meta(_ db: Connection, _ key: String) throws -> [UInt8]? {
        let s = try db.prepare("SELECT value FROM meta WHERE key = ?")
        s.bind(1, key)
        defer { s.reset() }
        return try s.step() ? s.bytes(0) : nil
    }

    static func setMeta(_ db: Connection, _ key: String, _ value: [UInt8]) throws {
        let s = try db.prepare("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)")
        s.bind(1, key)
        s.bind(2, value)
        try s.run()
    }

    /// A meta value holding a big-endian 64-bit integer.
    static func metaInt64(_ db: Connection, _ key: String) throws -> Int64? {
        try meta(db, key).map { Int64(bitPattern: uint64($0)) }
    }

    static func setMetaInt64(_ db: Connection, _ key: String, _ value: Int64) throws {
        try setMeta(db, key, bytes(UInt64(bitPattern: value)))
    }

    // MARK: IDs

    /// The canonical key of an `_id` (its deterministic JSON text).
    ///
    /// - Throws: ``StoreError/invalidID(_:)`` unless the ID is a non-empty string or a map.
    public static func key(for id: Value) throws(StoreError) -> String {
        if let key = id.documentKey { return key }
        switch id {
        case .string: throw .invalidID("it is an empty string")
        case .map: throw .invalidID("it is an empty map")
        default: throw .invalidID("it must be a string or a map, not \(id.typeName)")
        }
    }

    // MARK: Local writes

    /// Runs `body` under the store lock.
    ///
    /// - Parameter writer: counts the caller in ``writersWaiting`` until it has the lock.
    func withState<R: Sendable>(writer: Bool = false, _ body: (inout State) throws -> R) throws(StoreError) -> R {
        if writer { writersWaiting.add(1, ordering: .relaxed) }
        do {
            return try state.withLock { (s: inout State) throws -> R in
                if writer { writersWaiting.subtract(1, ordering: .relaxed) }
                guard !s.closed else { throw StoreError.closed }
                return try body(&s)
            }
        } catch let error as StoreError {
            throw error
        } catch let error as SQLiteError {
            throw .sqlite(error.description)
        } catch {
            throw .sqlite("\(error)")
        }
    }

    /// Runs `body` as one write transaction under the store lock, saving the clock when it moved.
    /// After the commit, and before the lock is released, the changes it made are queued as one
    /// ``StoreEvent`` for observers, so events follow commit order.
    ///
    /// When `body` or the commit fails, everything is rolled back and the in-memory state is
    /// restored with it (next `seq`, changed keys, epoch, site ID, counts), so nothing rolled back
    /// is reported or left issued. The clock keeps what it issued (stamps that never committed
    /// harm no one, and the clock must not go back).
    ///
    /// - Parameters:
    ///   - durable: commit with `synchronous=FULL` whatever ``StoreOptions/durability`` says (for
    ///     the rare commits that must never be taken back, such as a rotation of the log).
    ///   - origin: the peer whose batch this is, for the commit's event.
    func write<R: Sendable>(
        durable: Bool = false, origin: [UInt8]? = nil, _ body: (inout State) throws -> R
    ) throws(StoreError) -> R {
        guard !options.readOnly else { throw .invalidValue("the store was opened read-only; it cannot be written") }
        // The event delivered last is released here, on the committing thread, once the store
        // lock is let go (``ObserverList/deliverAndHandBack(_:)``).
        defer { _ = observers.takeDelivered() }
        return try withState(writer: true) { s in
            let saved = s
            let relax = durable && options.durability != .full
            if relax { try s.db.execute("PRAGMA synchronous=FULL") }
            defer { if relax { try? s.db.execute(Self.synchronousPragma(options.durability)) } }
            do {
                let result = try s.db.transaction { () throws -> R in
                    let result = try body(&s)
                    if s.clock.last > s.savedClock { try saveClock(&s) }
                    return result
                }
                queueEvent(&s, origin: origin)
                return result
            } catch {
                let (clock, damaged) = (s.clock, s.damaged)
                s = saved
                s.clock = clock
                // Damage found on the way stays known; a repair that rolled back is forgotten.
                s.damaged.merge(damaged) { _, found in found }
                throw error
            }
        }
    }

    /// What a document row is (the `deleted` column).
    enum RowKind: Int64 {
        /// A live document: shown by reads, sent to peers.
        case live = 0
        /// A tombstone: hidden from reads, sent to peers (the remove replicates).
        case tombstone = 1
        /// An evicted document's local stub: hidden from reads, never sent to peers.
        case stub = 2
    }

    /// A stored document: its state, what its row is, its `seq`, and the delta of the local writes
    /// that made it (`nil` when its last change was not a local write).
    typealias Row = (state: DocumentState, kind: RowKind, seq: Int64, delta: StoredDelta?)

    /// The `seq` of a ``Row`` that is a reaped tombstone remembered with its state, not a row of
    /// the documents table (whose `seq`s start at 1).
    static let reapedRowSeq: Int64 = 0

    /// The delta a row keeps of the local writes since its base: the encoded ``StateDelta`` and
    /// the `seq` the row had when its state was the base (a peer whose checkpoint is at or past it
    /// likely holds the base: only then is the delta sent).
    struct StoredDelta {
        var bytes: [UInt8]
        var baseSeq: Int64
    }

    /// The stored state of a document and what its row is, or `nil` when there is no row.
    ///
    /// - Throws: ``StoreError/corrupt(_:)`` naming the document when its row does not decode.
    func row(_ s: inout State, _ collection: String, _ key: String) throws -> Row? {
        let st = try s.db.prepare(
            "SELECT state, value, deleted, seq, delta, delta_seq FROM documents WHERE k = trellis_key(?, ?)")
        st.bind(1, collection)
        st.bind(2, key)
        defer { st.reset() }
        guard try st.step(), let bytes = st.bytes(0) else {
            // No row, but a reaped tombstone remembered with its state: the key's row is that
            // tombstone, for writes and merges alike (as if it had not been reaped).
            guard s.reapedRows > 0, let reaped = try reapedTombstone(&s, collection, key) else { return nil }
            s.reapedRowsRead[DocumentKey(collection: collection, key: key)] = .some(reaped.born)
            return (reaped.state, .tombstone, Self.reapedRowSeq, nil)
        }
        // A row and a reaped key kept with its state never stand together: the write that makes
        // the row started from the state (above) and forgets the key (``writeRow``).
        do {
            return (
                try StoredState.decode(bytes, value: st.string(1)), RowKind(rawValue: st.int64(2)) ?? .tombstone,
                st.int64(3), st.bytes(4).map { StoredDelta(bytes: $0, baseSeq: st.int64(5)) }
            )
        } catch {
            let reason = "its state does not decode: \(error)"
            noteDamaged(&s, collection, key, reason)
            throw StoreError.corrupt("document \(key) in \(collection): \(reason)")
        }
    }

    /// The stored state of a document (live, removed or evicted), or `nil` when there is no row.
    func load(_ s: inout State, _ collection: String, _ key: String) throws -> DocumentState? {
        try row(&s, collection, key)?.state
    }

    /// The stored state of a live document, or `nil` when it is absent, removed or evicted.
    func loadLive(_ s: inout State, _ collection: String, _ key: String) throws -> DocumentState? {
        guard let row = try row(&s, collection, key), row.kind == .live else { return nil }
        return row.state
    }

    /// Writes a document state with the next `seq`. Checks the size limit.
    ///
    /// - Parameters:
    ///   - origin: ``WriteOrigin/merged`` for a peer's state; by default the write is this node's
    ///     own (recorded as not yet acknowledged by a peer, which only ever keeps more).
    ///   - previous: for local writes, the row they started from: the row then keeps the delta of
    ///     the writes since it (``StateDelta``), which peers that hold that row's state receive
    ///     instead of the whole state (docs/DELTAS.md).
    func persist(
        _ s: inout State, _ collection: String, _ key: String, _ id: Value, _ doc: DocumentState,
        origin: WriteOrigin = .local, previous: Row? = nil
    ) throws {
        // The delta is made from the state as written, before reaping: a delta vouches only for
        // the stamps above its base, so what a write removed below it travels only as the
        // removed entries' context, which reaping drops at once when those entries were written
        // more than the TTL ago (`DeltaReapingTests`). The receiver reaps it in turn.
        let written = doc
        // Every write of a whole state reaps its removed fields' expired contexts (the state is in
        // hand; docs/DATA-MODEL.md, "Tombstones and reaping").
        var doc = doc
        doc.reapRemovedFields(before: fieldReapHorizon(now: options.now()))
        let materialized = doc.materialize(id: id)
        // Whatever path wrote it (upsert, an update at a deep path, a merge), the document as a
        // whole must be storable and decodable by every peer.
        do { try materialized?.validate() } catch { throw StoreError.invalidValue("document \(key): \(error)") }
        let value = materialized.map { JSON.string($0) }
        let bytes = StoredState.bytes(for: doc, materialized: materialized)
        var delta: StoredDelta?
        if origin == .local, let previous, previous.kind == .live, value != nil, !StoredState.isCompact(bytes) {
            // A compact row travels as its JSON and stamp: not the bytes a digest of `bytes` names.
            let prior = previous.delta.flatMap { try? StateDelta(bytes: $0.bytes) }
            if let made = StateDelta.make(
                from: previous.state, to: written, previous: prior, digest: StateDigest(bytes))
            {
                let encoded = made.encoded()
                if encoded.count < bytes.count {
                    delta = StoredDelta(bytes: encoded, baseSeq: prior != nil ? previous.delta!.baseSeq : previous.seq)
                }
            }
        }
        try persistRow(
            &s, collection, key, materialized: { materialized }, json: value, state: bytes,
            removedAt: value == nil ? doc.maxTime.millis : nil, origin: origin, delta: delta, fullState: { doc })
    }

    /// The horizon before which the remove contexts of removed fields are reaped at `now`
    /// (milliseconds): ``StoreOptions/tombstoneTTL`` earlier, as for tombstones.
    func fieldReapHorizon(now: UInt64) -> HLCTimestamp {
        now > options.tombstoneTTL ? HLCTimestamp(millis: now - options.tombstoneTTL, logical: 0) : .zero
    }

    /// Writes the state of one write of a document's fields at `stamp` into a document that has
    /// no row: ``persist(_:_:_:_:_:)`` of `DocumentState(fields:stamp:)`, without building that
    /// state (the row is the compact form of StoredState.swift).
    ///
    /// - Parameters:
    ///   - json: the document's canonical JSON (with `_id`), already validated.
    ///   - document: the document (`value` with `_id`, `fields` without); asked for only when
    ///     served scopes need the value or the size limit the whole state, so a document that
    ///     came as canonical JSON is usually never parsed.
    ///   - ifAbsent: write only when the document has no row (then no served scope may track the
    ///     collection: the caller checks).
    /// - Returns: whether the row was written (always, unless `ifAbsent` found a row).
    @discardableResult
    func persistSingleWrite(
        _ s: inout State, _ collection: String, _ key: String, stamp: Stamp, json: String, ifAbsent: Bool = false,
        origin: WriteOrigin = .local, document: () throws -> SingleWriteState.Document
    ) throws -> Bool {
        try persistRow(
            &s, collection, key, materialized: { try document().value }, json: json,
            state: StoredState.compact(stamp), removedAt: nil, ifAbsent: ifAbsent, origin: origin,
            fullState: { DocumentState(fields: try document().fields, stamp: stamp) })
    }

    /// Checks the size limit, tracks served scopes and writes the row (``persist(_:_:_:_:_:)``).
    ///
    /// - Parameter fullState: the whole state, encoded only to measure a compact row that may be
    ///   near the limits.
    @discardableResult
    private func persistRow(
        _ s: inout State, _ collection: String, _ key: String, materialized: () throws -> Value?, json value: String?,
        state bytes: [UInt8], removedAt: UInt64?, ifAbsent: Bool = false, origin: WriteOrigin,
        delta: StoredDelta? = nil, fullState: () throws -> DocumentState
    ) throws -> Bool {
        let size = try countedSize(state: bytes, valueBytes: value?.utf8.count ?? 0, fullState: fullState)
        if origin == .local, size > options.maxDocumentBytes {
            // A local write may not take a document above the limit, nor further above it (a
            // merge may have: see mergedDocumentCeiling); one that does not grow it is taken.
            guard let stored = try storedSize(&s, collection, key), size <= stored else {
                throw StoreError.documentTooLarge(id: key, bytes: size, limit: options.maxDocumentBytes)
            }
        } else if size > options.mergedDocumentCeiling {
            throw StoreError.documentTooLarge(id: key, bytes: size, limit: options.mergedDocumentCeiling)
        }
        if !ifAbsent { try trackScope(&s, collection, key, new: materialized) }
        let written = try writeRow(
            &s, collection, key, kind: value == nil ? .tombstone : .live, state: bytes, value: value,
            removedAt: removedAt, ifAbsent: ifAbsent, origin: origin, delta: delta)
        // Once, by the write that happens (an insert that found a row is tried again the general way).
        if written, size > options.warnDocumentBytes {
            options.log(
                "document \(key) in \(collection) is \(size) bytes with metadata (above \(options.warnDocumentBytes))")
        }
        return written
    }

    /// The size the limits count for a row: its state as peers receive it, whatever form is
    /// stored, and its JSON (`valueBytes`).
    ///
    /// - Parameter fullState: the whole state of a compact row. A compact row stands for it; that
    ///   is at most about twice the JSON plus a little, so it is only encoded to be measured when
    ///   that bound could cross a threshold.
    private func countedSize(
        state bytes: [UInt8], valueBytes: Int, fullState: () throws -> DocumentState
    ) rethrows -> Int {
        let stateBytes =
            StoredState.isCompact(bytes) && 3 * valueBytes + 64 >= options.warnDocumentBytes
            ? try fullState().cbor().count : bytes.count
        return stateBytes + valueBytes
    }

    /// The size ``countedSize(state:valueBytes:fullState:)`` counts for the row stored for `key`,
    /// or `nil` when there is none or it does not decode. Read only when a local write goes above
    /// the limit.
    private func storedSize(_ s: inout State, _ collection: String, _ key: String) throws -> Int? {
        let st = try s.db.prepare("SELECT state, value FROM documents WHERE k = trellis_key(?, ?)")
        defer { st.reset() }
        st.bind(1, collection)
        st.bind(2, key)
        guard try st.step(), let bytes = st.bytes(0) else { return nil }
        let value = st.string(1)
        return try? countedSize(state: bytes, valueBytes: value?.utf8.count ?? 0) {
            try StoredState.decode(bytes, value: value)
        }
    }

    /// Writes a document row with the next `seq` and records the change for observers.
    ///
    /// - Parameters:
    ///   - removedAt: for a tombstone, the milliseconds of its newest stamp (when the reaper may
    ///     delete it, with ``StoreOptions/tombstoneTTL``).
    ///   - ifAbsent: write only when the document has no row: one B-tree descent instead of a
    ///     look-up and then a write, for the documents of a first sync.
    ///   - origin: ``WriteOrigin/local`` records the row's new `seq` as this node's write that no
    ///     peer has acknowledged (`unacked` 0, ``acknowledge(_:)``); ``WriteOrigin/merged`` and
    ///     ``WriteOrigin/evicted`` keep what the row recorded.
    ///   - delta: for a local write, the delta of the local writes since the row's base
    ///     (``StateDelta``, encoded); every other write clears it.
    /// - Returns: whether the row was written (always, unless `ifAbsent` found a row).
    @discardableResult
    func writeRow(
        _ s: inout State, _ collection: String, _ key: String, kind: RowKind, state bytes: [UInt8], value: String?,
        removedAt: UInt64? = nil, ifAbsent: Bool = false, origin: WriteOrigin, delta: StoredDelta? = nil
    ) throws -> Bool {
        let sql: String
        switch (origin, ifAbsent) {
        case (.local, false): sql = Self.writeLocalRowSQL
        case (.local, true): sql = Self.insertLocalRowIfAbsentSQL
        case (.merged, false), (.evicted, _): sql = Self.writeRowSQL
        case (.heldBySender, false): sql = Self.writeHeldRowSQL
        case (.merged, true), (.heldBySender, true): sql = Self.insertRowIfAbsentSQL
        }
        let st = try s.db.prepare(sql)
        st.bind(1, collection)
        st.bind(2, key)
        st.bind(3, s.nextSeq)
        st.bind(4, kind.rawValue)
        st.bind(5, bytes)
        st.bind(6, value)
        if let removedAt { st.bind(7, Int64(clamping: removedAt)) } else { st.bind(7, nil as String?) }
        if origin == .local, !ifAbsent {
            st.bind(8, delta?.bytes)
            if let delta { st.bind(9, delta.baseSeq) } else { st.bind(9, nil as String?) }
        }
        try st.run()
        if ifAbsent, s.db.changes == 0 { return false }
        if let value { try Self.noteNULStrings(&s, collection, value) }
        s.nextSeq += 1
        let listed = Self.noteChanged(&s, collection, key, listAlways: kind == .stub)
        if !s.renumberedKeys.isEmpty { s.renumberedKeys[UTF8Key(collection)]?.remove(UTF8Key(key)) }
        Self.noteValue(&s, collection, key, kind == .live ? value : nil, listed: listed)
        if !s.damaged.isEmpty { s.damaged[DocumentKey(collection: collection, key: key)] = nil }
        // The row now carries what the reaped tombstone of the key it started from remembered
        // (``row(_:_:_:)``): the key is forgotten. The row is not a new document: it keeps the
        // birth the document had before its tombstone was reaped, so a peer this node served the
        // whole collection past that birth still counts as holding it (`whole_held`,
        // DocumentStore+Scope.swift). An unknown birth (NULL `age`) is before every `seq`.
        if !s.reapedRowsRead.isEmpty,
            let birth = s.reapedRowsRead.removeValue(forKey: DocumentKey(collection: collection, key: key))
        {
            let seq = s.nextSeq - 1
            let born = try s.db.prepare("UPDATE documents SET age = ? WHERE k = trellis_key(?, ?)")
            if let birth { born.bind(1, seq - min(birth, seq)) } else { born.bind(1, nil as String?) }
            born.bind(2, collection)
            born.bind(3, key)
            try born.run()
            try forgetReaped(&s, collection, key)
        }
        return true
    }

    /// Who wrote a row (``writeRow(_:_:_:kind:state:value:removedAt:ifAbsent:origin:)``).
    enum WriteOrigin {
        /// An operation of this node: its write must reach a peer before an eviction may drop it.
        case local
        /// A merge of a peer's state.
        case merged
        /// A merge whose result is the peer's state: the peer holds every write of the row, so
        /// the row holds none of this node's that no peer has (`unacked` NULL), whatever it held.
        /// An eviction may then drop its values, and the reaper take it once it is a tombstone.
        case heldBySender
        /// An eviction's stub.
        case evicted
    }

    // `unacked` is how far the row's `seq` has moved past this node's latest write that no peer
    // has acknowledged (NULL when there is none): 0 for a local write, which SQLite stores in no
    // bytes at all. The others keep it, counting the `seq`s the row moved on by, so a merge or
    // an eviction does not forget a write of this node that no peer has yet.
    // `delta` is the encoded StateDelta of the local writes since the row's base: written by local
    // writes, cleared by every other write of the row's state.
    // `age` is how far the row's `seq` has moved past the first `seq` the document had (0 for a
    // new row, no bytes at all; NULL for rows from before the column, born before every `seq`):
    // every write of an existing row keeps its birth (DocumentStore+Scope.swift, `whole_held`).
    static let writeLocalRowSQL =
        "INSERT INTO documents(k, collection, seq, deleted, state, value, removed_at, unacked, delta, delta_seq, "
        + "age) VALUES (trellis_key(?1, ?2), ?1, ?3, ?4, ?5, ?6, ?7, 0, ?8, ?9, 0) "
        + "ON CONFLICT(k) DO UPDATE SET seq = excluded.seq, deleted = excluded.deleted, "
        + "state = excluded.state, value = excluded.value, removed_at = excluded.removed_at, unacked = 0, "
        + "delta = excluded.delta, delta_seq = excluded.delta_seq, age = age + excluded.seq - seq"
    static let insertLocalRowIfAbsentSQL =
        "INSERT OR IGNORE INTO documents(k, collection, seq, deleted, state, value, removed_at, unacked, age) "
        + "VALUES (trellis_key(?1, ?2), ?1, ?3, ?4, ?5, ?6, ?7, 0, 0)"
    static let writeRowSQL =
        "INSERT INTO documents(k, collection, seq, deleted, state, value, removed_at, age) "
        + "VALUES (trellis_key(?1, ?2), ?1, ?3, ?4, ?5, ?6, ?7, 0) "
        + "ON CONFLICT(k) DO UPDATE SET seq = excluded.seq, deleted = excluded.deleted, "
        + "state = excluded.state, value = excluded.value, removed_at = excluded.removed_at, "
        + "unacked = unacked + excluded.seq - seq, delta = NULL, delta_seq = NULL, age = age + excluded.seq - seq"
    static let writeHeldRowSQL =
        "INSERT INTO documents(k, collection, seq, deleted, state, value, removed_at, age) "
        + "VALUES (trellis_key(?1, ?2), ?1, ?3, ?4, ?5, ?6, ?7, 0) "
        + "ON CONFLICT(k) DO UPDATE SET seq = excluded.seq, deleted = excluded.deleted, "
        + "state = excluded.state, value = excluded.value, removed_at = excluded.removed_at, "
        + "unacked = NULL, delta = NULL, delta_seq = NULL, age = age + excluded.seq - seq"
    static let insertRowIfAbsentSQL =
        "INSERT OR IGNORE INTO documents(k, collection, seq, deleted, state, value, removed_at, age) "
        + "VALUES (trellis_key(?1, ?2), ?1, ?3, ?4, ?5, ?6, ?7, 0)"

    /// The rows of the collection bound as parameter 1, as a range of the row key `k`
    /// (docs/ARCHITECTURE.md, "The row key"): SQLite reads them in `_id` key order (`ORDER BY k`)
    /// without a sort, and without looking each one up from an index.
    static let collectionKeys = "k >= trellis_key(?1, '') AND k < trellis_key_end(?1)"

    /// The most changed documents of one collection a commit event lists (``StoreEvent/changedKeys``);
    /// beyond it the collection is listed as changed without its keys.
    public static let maxListedKeys = 10_000

    /// Records a changed document for the commit event, within ``maxListedKeys`` per collection
    /// unless `listAlways` (evictions: the sync engine asks peers for exactly those again).
    ///
    /// - Returns: whether the collection's keys are still listed for this commit.
    @discardableResult
    static func noteChanged(_ s: inout State, _ collection: String, _ key: String, listAlways: Bool = false) -> Bool {
        let name = UTF8Key(collection)
        if !listAlways, !s.unlistedCollections.isEmpty, s.unlistedCollections.contains(name) { return false }
        func insert(_ keys: inout Set<UTF8Key>) -> Int {
            keys.insert(UTF8Key(key))
            return keys.count
        }
        let listed = insert(&s.changedKeys[name, default: []])
        if !listAlways, listed > maxListedKeys, !s.evictedInCommit {
            s.changedKeys[name] = nil
            s.unlistedCollections.insert(name)
            return false
        }
        return true
    }

    /// The most bytes of document values one commit event carries (``StoreEvent/changedValues``):
    /// 8 MiB. Beyond it the commit's further values are left out and observers read the store.
    public static let maxEventValueBytes = 8 << 20

    /// Records a written document's value for the commit event, within ``maxEventValueBytes``
    /// and only while its collection's keys are listed.
    ///
    /// - Parameter listed: what ``noteChanged(_:_:_:listAlways:)`` returned for this write.
    static func noteValue(_ s: inout State, _ collection: String, _ key: String, _ value: String?, listed: Bool) {
        let name = UTF8Key(collection)
        guard listed else {
            s.changedValues[name] = nil  // unlisted now: its values would never be looked up
            return
        }
        let size = value?.utf8.count ?? 0
        let keyName = UTF8Key(key)
        guard s.changedValueBytes + size <= maxEventValueBytes else {
            s.changedValues[name]?[keyName] = nil  // an older value of it must not stand for this one
            return
        }
        s.changedValueBytes += size
        s.changedValues[name, default: [:]][keyName] = .some(value)
    }

    /// How far ahead of the system time the saved clock's ceiling is set: 1,000 ms, and at most
    /// half of ``StoreOptions/maxClockDrift``.
    static let clockLeaseMillis: UInt64 = 1_000

    /// Saves a ceiling of the clock in the transaction under way (called when the clock has
    /// passed the saved one).
    ///
    /// While the clock follows the system time, the ceiling is that time plus
    /// ``clockLeaseMillis``, so the commits of the next second save nothing: a commit that saved
    /// the clock wrote one page more of `meta` to the WAL, a fifth of a single upsert's time
    /// (docs/BENCHMARKS.md, "One commit, one page fewer"). A clock ahead of the system time (after
    /// a restart that found a ceiling, or a peer's stamp adopted) is saved as it is, so ceilings
    /// never add up across restarts: the clock leads the system time by at most the lease more
    /// than it did. A clean close saves the clock itself (``close()``).
    func saveClock(_ s: inout State) throws {
        let last = s.clock.last
        let now = options.now()
        // At most half the drift allowed, so an open after a crash never finds the ceiling "far
        // ahead" of the system time (``openLog``) for a clock that was not.
        let lease = min(Self.clockLeaseMillis, options.maxClockDrift / 2)
        // A ceiling is a stamp too: never past the largest (HLCTimestamp.maxMillis).
        let ceiling =
            last.millis <= now && now <= HLCTimestamp.maxMillis - lease
            ? HLCTimestamp(millis: now + lease, logical: 0) : last
        try Self.setMeta(s.db, "hlc", Self.bytes(ceiling.rawValue))
        s.savedClock = ceiling
    }

    /// Inserts or merges a document (Ditto's `upsert` with the `merge` strategy): every given
    /// top-level field is written as a last-writer-wins register; fields not given are kept.
    ///
    /// - Parameter document: a map; `_id` is a non-empty string or map, a new UUID string when absent.
    /// - Returns: the document's `_id`.
    /// - Throws: ``StoreError`` for a non-map, a bad `_id`, a non-finite number, or a document
    ///   above the size limit; nothing is written then.
    @discardableResult
    public func upsert(_ document: Value, in collection: String) throws(StoreError) -> Value {
        try upsert([document], in: collection)[0]
    }

    /// Upserts several documents in one transaction (one `seq` each, one commit event): all of
    /// them or, when one is refused, none.
    ///
    /// A batch of 1,024 documents or more (``UpsertsPreparedAhead/minimumBatch``) is checked and
    /// encoded on a second thread while this one stores the documents already checked
    /// (docs/BENCHMARKS.md, "A large batch prepared ahead"); a refused document then rolls back
    /// the documents stored before it, so that nothing is written either way.
    ///
    /// - Returns: the documents' `_id`s, in order (a new UUID string where one had none).
    /// - Throws: ``StoreError`` as ``upsert(_:in:)``, for the first document refused; nothing is
    ///   written then.
    /// - Complexity: O(total size) plus one indexed lookup per document.
    @discardableResult
    public func upsert(_ documents: [Value], in collection: String) throws(StoreError) -> [Value] {
        if documents.count >= UpsertsPreparedAhead.minimumBatch {
            return try upsertPreparedAhead(documents, in: collection)
        }
        let prepared = try prepare(documents)
        let now = options.now()
        try write { s in
            for (id, key, fields, generated) in prepared {
                try upsertPrepared(&s, collection, id, key, fields, generated: generated, now: now)
            }
        }
        return prepared.map(\.0)
    }

    /// ``upsert(_:in:)`` of a large batch, its documents checked and encoded by
    /// ``UpsertsPreparedAhead`` on another thread as this one stores them.
    ///
    /// It fails as the small path (``prepare(_:)`` first, then the writes) fails: a document
    /// refused by its check (``StoreError/notAMap(_:)``, ``StoreError/invalidID(_:)``,
    /// ``StoreError/invalidValue(_:)``) wins over an error met while writing an earlier one (a
    /// document too large, SQLite's), and an `_id` is drawn for each document without one up to
    /// the first refused by its check, so a seeded `StoreOptions.random` goes on as before.
    private func upsertPreparedAhead(_ documents: [Value], in collection: String) throws(StoreError) -> [Value] {
        let ahead = UpsertsPreparedAhead(documents)
        defer { ahead.stop() }
        let now = options.now()
        return try write { s -> [Value] in
            var ids: [Value] = []
            ids.reserveCapacity(documents.count)
            while let document = ahead.next() {
                let (id, key, fields, json, generated) = try identified(document.checked.get())
                do {
                    try upsertPrepared(&s, collection, id, key, fields, json: json, generated: generated, now: now)
                } catch {
                    throw firstRefusal(after: ahead) ?? error
                }
                ids.append(id)
            }
            return ids
        }
    }

    /// The first document `ahead` still holds that its check refused, after drawing an `_id` for
    /// each document without one before it (what ``prepare(_:)`` did before any write).
    private func firstRefusal(after ahead: UpsertsPreparedAhead) -> StoreError? {
        while let document = ahead.next() {
            switch document.checked {
            case .failure(let refusal): return refusal
            case .success(let checked): if checked.id == nil { _ = Self.newID(options.random) }
            }
        }
        return nil
    }

    /// Upserts the documents `next` returns, one at a time, in one transaction: all of them or,
    /// when anything fails, none. Memory stays bounded whatever the count: one document at a time,
    /// and a commit event that lists at most ``maxListedKeys`` keys per collection
    /// (``StoreEvent/unlistedCollections``).
    ///
    /// - Parameters:
    ///   - next: the next document (a map, as for ``upsert(_:in:)``), or `nil` after the last; an
    ///     error it throws ends the upsert and is rethrown as it is, with nothing written.
    ///   - progress: called after every `progressInterval` documents with the count so far.
    ///   - refused: when given, a document the store refuses (not a map, a bad `_id`, a value it
    ///     cannot hold, too large: ``StoreError/notAMap(_:)``, ``StoreError/invalidID(_:)``,
    ///     ``StoreError/invalidValue(_:)``, ``StoreError/documentTooLarge(id:bytes:limit:)``) is
    ///     passed to it and skipped, and the others are written; an error it throws ends the
    ///     upsert with nothing written. `nil` (the default): the first refusal ends it so.
    /// - Returns: the number of documents upserted (not counting those refused).
    /// - Throws: what `next` throws, or ``StoreError`` as ``upsert(_:in:)`` (nothing is written).
    /// - Complexity: O(total size) plus one indexed lookup per document.
    public func upsert(
        in collection: String, streaming next: () throws -> Value?, progressInterval: Int = 10_000,
        progress: (Int) -> Void = { _ in }, refused: ((StoreError) throws -> Void)? = nil
    ) throws -> Int {
        // Checked here, on the writing thread; the JSON of a new document is encoded when it is
        // written, and not at all for one merged into a document already there.
        try upsert(
            in: collection,
            streamingPrepared: {
                try next().map { Self.prepared($0, encoding: false) }
            }, progressInterval: progressInterval, progress: progress, refused: refused)
    }

    /// ``upsert(in:streaming:progressInterval:progress:refused:)`` of documents already checked and
    /// encoded by ``prepareUpsert(_:)``, which another thread can do while the store writes (an
    /// import reading ahead: DocumentReadAhead in Trellis). The outcome is the same: a document
    /// ``prepareUpsert(_:)`` refused is refused when the upsert reaches it, in its place. The
    /// encoded JSON serves a new document; one merged into a document already there is encoded
    /// again from its merged state, as always.
    ///
    /// - Parameter next: the next prepared document, or `nil` after the last.
    /// - Throws: as ``upsert(in:streaming:progressInterval:progress:refused:)``.
    /// - Complexity: O(total size) plus one indexed lookup per document.
    public func upsert(
        in collection: String, streamingPrepared next: () throws -> PreparedUpsert?, progressInterval: Int = 10_000,
        progress: (Int) -> Void = { _ in }, refused: ((StoreError) throws -> Void)? = nil
    ) throws -> Int {
        let now = options.now()
        var failure: (any Error)?
        do {
            return try write { s -> Int in
                var count = 0
                while true {
                    let document: PreparedUpsert?
                    do { document = try next() } catch {
                        failure = error
                        throw StoreError.invalidValue("\(error)")  // rolls the transaction back
                    }
                    guard let document else { return count }
                    do {
                        let (id, key, fields, json, generated) = try identified(document.checked.get())
                        try upsertPrepared(&s, collection, id, key, fields, json: json, generated: generated, now: now)
                    } catch let error as StoreError where refused != nil && error.refusesOneDocument {
                        // Each of these is found before the document's row is written.
                        do { try refused?(error) } catch {
                            failure = error
                            throw error
                        }
                        continue
                    }
                    count += 1
                    if count % max(1, progressInterval) == 0 { progress(count) }
                }
            }
        } catch {
            throw failure ?? error
        }
    }

    /// Checks `document` for an upsert and encodes the JSON it would be stored as when new: the
    /// part of a streamed upsert that needs no store, so that a thread other than the store's can
    /// do it (an import's reading thread). Never throws: a document the store refuses carries its
    /// error (``StoreError/notAMap(_:)``, ``StoreError/invalidID(_:)``,
    /// ``StoreError/invalidValue(_:)``), met when the upsert reaches it.
    ///
    /// - Complexity: O(size of the document).
    public static func prepareUpsert(_ document: Value) -> PreparedUpsert {
        prepared(document, encoding: true)
    }

    /// ``check(_:encoding:)``'s outcome, a refusal included, to be met when the upsert reaches it.
    private static func prepared(_ document: Value, encoding: Bool) -> PreparedUpsert {
        PreparedUpsert(checked: Result { () throws(StoreError) in try check(document, encoding: encoding) })
    }

    /// Checks a document for an upsert and splits it into `_id` (`nil` when absent), its key and
    /// its other fields; with `encoding`, also encodes the JSON it is stored as when new.
    ///
    /// - Throws: ``StoreError`` for a non-map, a bad `_id` or a value that cannot be stored.
    private static func check(_ document: Value, encoding: Bool) throws(StoreError) -> PreparedUpsert.Checked {
        guard case .map(var fields) = document else { throw .notAMap(document.typeName) }
        do throws(ValueError) { try document.validate() } catch { throw .invalidValue(error.description) }
        guard let id = fields.removeValue(forKey: "_id") else { return .init(id: nil, key: nil, fields: fields) }
        var json: String?
        if encoding {
            var materialized = fields
            materialized["_id"] = id
            json = JSON.string(.map(materialized))
        }
        return .init(id: id, key: try key(for: id), fields: fields, json: json)
    }

    /// Upserts one checked document (``prepare(_:)``) inside a write transaction.
    ///
    /// While upserts find no row (an import, say), the next one first tries to insert the new
    /// document where no row is (one B-tree descent instead of a look-up and then a write), when no
    /// served scope needs to see the write; once one finds a row, upserts look up first again.
    ///
    /// - Parameters:
    ///   - json: the document's stored JSON when new (`fields` and `_id`), when the caller already
    ///     encoded it (``prepareUpsert(_:)``).
    ///   - generated: the `_id` is a new random UUID made for this write: no peer can have removed
    ///     a document with it, so its creation is not noted (``noteCreated(_:_:)``).
    private func upsertPrepared(
        _ s: inout State, _ collection: String, _ id: Value, _ key: String, _ fields: UTF8Map<Value>,
        json encoded: String? = nil, generated: Bool, now: UInt64
    ) throws {
        let stamp = s.stamp(now: now)
        func persistNew(ifAbsent: Bool) throws -> Bool {
            // A new document: one write of every field, stored without building its state.
            var built: Value?
            func materialized() -> Value {
                if let built { return built }
                var map = fields
                map["_id"] = id
                built = .map(map)
                return built!
            }
            let json = encoded ?? JSON.string(materialized())
            return try persistSingleWrite(
                &s, collection, key, stamp: stamp, json: json, ifAbsent: ifAbsent,
                document: { (materialized(), fields, json) })
        }
        if s.upsertsFindNoRow, s.servedScopes[UTF8Key(collection)]?.isEmpty ?? true,
            try s.reapedRows == 0 || reapedRemoval(&s, collection, key) == nil
        {
            if try persistNew(ifAbsent: true) { return generated ? () : try noteCreated(&s, collection) }
            s.upsertsFindNoRow = false
        }
        guard let previous = try row(&s, collection, key) else {
            s.upsertsFindNoRow = true
            _ = try persistNew(ifAbsent: false)
            if !generated { try noteCreated(&s, collection) }
            return
        }
        var doc = previous.state
        doc.merge(fields: fields, stamp: stamp)
        try persist(&s, collection, key, id, doc, previous: previous)
    }

    /// Checks documents for upsert and splits each into `_id` (a new UUID string when absent,
    /// then `generated`), its key and its other fields.
    ///
    /// - Throws: ``StoreError`` for a non-map, a bad `_id` or a value that cannot be stored.
    func prepare(_ documents: [Value]) throws(StoreError) -> [Prepared] {
        var prepared: [Prepared] = []
        prepared.reserveCapacity(documents.count)
        for document in documents {
            let (id, key, fields, _, generated) = try identified(Self.check(document, encoding: false))
            prepared.append((id, key, fields, generated))
        }
        return prepared
    }

    /// A document checked for an upsert (``prepare(_:)``).
    typealias Prepared = (id: Value, key: String, fields: UTF8Map<Value>, generated: Bool)

    /// A checked document with its `_id` and key: a new UUID string when it has none (`generated`).
    private func identified(
        _ checked: PreparedUpsert.Checked
    ) throws(StoreError) -> (id: Value, key: String, fields: UTF8Map<Value>, json: String?, generated: Bool) {
        if let id = checked.id, let key = checked.key { return (id, key, checked.fields, checked.json, false) }
        let id = Self.newID(options.random)
        return (id, try Self.key(for: id), checked.fields, nil, true)
    }

    /// Removes a document (a tombstone that replicates).
    ///
    /// - Returns: `true` when the document existed and was removed.
    @discardableResult
    public func remove(id: Value, in collection: String) throws(StoreError) -> Bool {
        let key = try Self.key(for: id)
        let removed = try write { s -> Bool in
            guard var doc = try loadLive(&s, collection, key) else { return false }
            // The remove is an event on this node's clock, so later local writes order after it.
            doc.remove(stamp: s.stamp(now: options.now()))
            try persist(&s, collection, key, id, doc)
            return true
        }
        return removed
    }

    // MARK: Reads

    /// The live document with this `_id`, or `nil`.
    ///
    /// - Throws: ``StoreError/corrupt(_:)`` naming the document when its row is damaged.
    public func document(id: Value, in collection: String) throws(StoreError) -> Value? {
        let key = try Self.key(for: id)
        if let text = try readByID(key, in: collection) {
            guard let text = text else { return nil }
            if let value = try? JSON.parse(text) { return value }
            // A damaged row: reported as the writer's connection reports it, below.
        }
        return try withState { s -> Value? in
            let st = try s.db.prepare("SELECT value FROM documents WHERE k = trellis_key(?, ?) AND deleted = 0")
            st.bind(1, collection)
            st.bind(2, key)
            defer { st.reset() }
            guard try st.step(), let text = st.string(0) else { return nil }
            do { return try JSON.parse(text) } catch {
                let reason = "its JSON value does not parse: \(error)"
                noteDamaged(&s, collection, key, reason)
                throw StoreError.corrupt("document \(key) in \(collection): \(reason)")
            }
        }
    }

    /// The JSON text of a live document read on ``reader`` (`.some(nil)`: no such live
    /// document), or `nil` when there is no reader (the caller reads under the store lock).
    private func readByID(_ key: String, in collection: String) throws(StoreError) -> String?? {
        do {
            return try reader.withLock { connection throws -> String?? in
                guard let connection else { return nil }
                let st = try connection.prepare(
                    "SELECT value FROM documents WHERE k = trellis_key(?, ?) AND deleted = 0")
                st.bind(1, collection)
                st.bind(2, key)
                defer { st.reset() }
                guard try st.step(), let text = st.string(0) else { return .some(nil) }
                return .some(text)
            }
        } catch {
            throw .sqlite("\(error)")
        }
    }

    /// Every live document of a collection, ordered by `_id` key, optionally filtered.
    ///
    /// The rows are read under the store lock; `filter` runs after it was released, so it may
    /// call the store (or anything else) freely. A damaged row (its JSON value does not parse) is
    /// skipped, logged once and listed by ``damagedDocuments()``; the others are returned.
    ///
    /// - Throws: ``StoreError`` for SQLite errors; an error thrown by `filter` that is not a
    ///   ``StoreError`` is rethrown as ``StoreError/invalidValue(_:)``.
    /// - Complexity: O(n) in the collection's documents.
    public func documents(in collection: String, where filter: (Value) throws -> Bool = { _ in true })
        throws(StoreError) -> [Value]
    {
        let rows = try withState { s -> [(key: String, text: String)] in
            let st = try s.db.prepare(
                "SELECT k, value FROM documents WHERE \(Self.collectionKeys) AND deleted = 0 ORDER BY k")
            st.bind(1, collection)
            defer { st.reset() }
            let prefix = Self.keyPrefixLength(collection)
            var rows: [(key: String, text: String)] = []
            while try st.step() {
                guard let text = st.string(1) else { continue }
                rows.append((st.string(0, dropping: prefix) ?? "", text))
            }
            return rows
        }
        var out: [Value] = []
        var damaged: [String] = []
        for row in rows {
            guard let value = try? JSON.parse(row.text) else {
                damaged.append(row.key)
                continue
            }
            do { if try filter(value) { out.append(value) } } catch let error as StoreError { throw error } catch {
                throw .invalidValue("\(error)")
            }
        }
        if !damaged.isEmpty {
            state.withLock { s in
                for key in damaged { noteDamaged(&s, collection, key, "its JSON value does not parse") }
            }
        }
        return out
    }

    /// The collections this store holds rows of (live documents, tombstones or eviction stubs),
    /// in byte order of their names, each with its number of live documents.
    ///
    /// - Complexity: O(n) in the store's rows, over the `(collection, seq)` index.
    public func collectionCounts() throws(StoreError) -> [(name: String, documents: Int)] {
        try withState { s -> [(name: String, documents: Int)] in
            let st = try s.db.prepare(
                "SELECT collection, sum(deleted = 0) FROM documents GROUP BY collection ORDER BY collection")
            defer { st.reset() }
            var out: [(name: String, documents: Int)] = []
            while try st.step() { out.append((st.string(0) ?? "", Int(st.int64(1)))) }
            return out
        }
    }

    /// Number of live documents in a collection.
    public func count(in collection: String) throws(StoreError) -> Int {
        try withState { s -> Int in
            let st = try s.db.prepare("SELECT count(*) FROM documents WHERE \(Self.collectionKeys) AND deleted = 0")
            st.bind(1, collection)
            defer { st.reset() }
            _ = try st.step()
            return Int(st.int64(0))
        }
    }

    /// Number of change-log entries of a collection after `seq` (live documents, tombstones and
    /// eviction stubs), counted up to `cap`: how much a scan from `seq` may still have to read.
    ///
    /// - Complexity: O(min(result, cap)) over the `(collection, seq)` index.
    public func logEntryCount(in collection: String, after seq: Int64, cap: Int64 = 10_000_000) throws(StoreError)
        -> Int64
    {
        try withState { s -> Int64 in
            let st = try s.db.prepare(
                "SELECT count(*) FROM (SELECT 1 FROM documents WHERE collection = ? AND seq > ? LIMIT ?)")
            st.bind(1, collection)
            st.bind(2, seq)
            st.bind(3, cap)
            defer { st.reset() }
            _ = try st.step()
            return st.int64(0)
        }
    }

    /// The current CRDT state of a document, or `nil` when never seen or its tombstone was
    /// reaped: also a removed document's (its tombstone) and an evicted one's (its local stub).
    public func state(id: Value, in collection: String) throws(StoreError) -> DocumentState? {
        let key = try Self.key(for: id)
        return try withState { s in
            guard let row = try row(&s, collection, key), row.seq != Self.reapedRowSeq else { return nil }
            return row.state
        }
    }

    /// Copies the write-ahead log into the database file and truncates it
    /// (`PRAGMA wal_checkpoint(TRUNCATE)`), e.g. before measuring the file size or a backup.
    public func checkpointWAL() throws(StoreError) {
        try withState { s in try s.db.execute("PRAGMA wal_checkpoint(TRUNCATE)") }
    }

    // MARK: Change log

    /// The latest HLC timestamp this store issued or adopted.
    public var lastTimestamp: HLCTimestamp { state.withLock { $0.clock.last } }

    /// The highest `seq` committed so far (0 for an empty store).
    public var lastSeq: Int64 {
        guard options.readOnly else { return state.withLock { $0.nextSeq - 1 } }
        // A read-only store watches a log another process writes: read it from the database.
        return (try? withState { s -> Int64 in try Self.highestSeq(s.db) }) ?? state.withLock { $0.nextSeq - 1 }
    }

    /// The live documents of a collection matching `query`, ordered by `_id` key.
    ///
    /// The query runs inside SQLite when it translates (served by an index from
    /// ``createIndex(path:in:)`` on a compared field), otherwise in memory; see
    /// ``documents(in:matching:args:sort:limit:offset:)``.
    ///
    /// - Throws: ``StoreError/invalidValue(_:)`` naming a missing `$args` value.
    /// - Complexity: O(n) in the collection's documents without an index.
    public func documents(
        in collection: String, matching query: Query, args: UTF8Map<Value> = [:]
    ) throws(StoreError) -> [Value] {
        try documents(in: collection, matching: query, args: args, sort: [])
    }

    /// The rescan generation of a collection, persisted in the store: an earlier version raised it
    /// with every evict (so that batches asked for before the evict could be told from those
    /// after it); evictions now ask peers for the evicted documents only and leave it alone. 0 for
    /// a collection that never had one.
    public func rescanGeneration(collection: String) -> UInt32 {
        state.withLock { $0.rescanGenerations[UTF8Key(collection)] ?? 0 }
    }

    /// Every collection's rescan generation that is not 0, by collection name compared byte for
    /// byte (`UTF8Key`: a `String` key would make two collections named alike in another Unicode
    /// form one).
    public var rescanGenerations: [UTF8Key: UInt32] {
        state.withLock { $0.rescanGenerations }
    }
}
