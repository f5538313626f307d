internal import CSQLite
import Foundation
import Synchronization
public import TrellisCore

/// Options for opening a ``DocumentStore``.
public struct StoreOptions: Sendable {
    /// Documents whose stored size (value and CRDT metadata) exceeds this are rejected. Bytes.
    public var maxDocumentBytes: Int = 5 * 1024 * 1024
    /// Documents above this size are accepted with a warning. Bytes.
    public var warnDocumentBytes: Int = 256 * 1024
    /// How far ahead of local physical time a remote stamp may be, milliseconds. Documents carrying
    /// later stamps are refused (see docs/DATA-MODEL.md, "Stamps and the clock").
    public var maxClockDrift: UInt64 = 60_000
    /// Open without writing anything (inspecting a store a running node owns); writes then fail.
    public var readOnly = false
    /// Physical time in milliseconds since the Unix epoch; injected so tests control the clock.
    public var now: @Sendable () -> UInt64 = { UInt64(Date().timeIntervalSince1970 * 1000) }
    /// Where warnings go (oversized documents, far-future remote stamps).
    public var log: @Sendable (String) -> Void = { message in
        FileHandle.standardError.write(Data("trellis: warning: \(message)\n".utf8))
    }

    public init() {}
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
        }
    }
}

/// One entry of the change log: a document's latest state at its `seq`.
public struct ChangeRecord: Sendable {
    public var seq: Int64
    public var collection: String
    /// The document's `_id`.
    public var id: Value
    /// The CRDT state, CBOR-encoded as stored (sent to peers unchanged).
    public var state: [UInt8]
    /// `true` for a tombstone.
    public var isDeleted: Bool
    /// The peer whose state this is exactly (it need not be sent back to it), if any.
    public var source: [UInt8]?
}

/// A page of the change log.
public struct ChangePage: Sendable {
    /// The entries that match (plus every tombstone), in `seq` order.
    public var records: [ChangeRecord]
    /// The last `seq` examined: the cursor for the next page.
    public var scannedUpTo: Int64
    /// `true` when the page reached the end of the log.
    public var exhausted: Bool
}

/// A document received from a peer, to be merged: its collection, `_id` and CBOR state.
public typealias RemoteDocument = WireDocument

/// How far this store has durably applied one peer's log for one subscription.
public struct Checkpoint: Sendable, Equatable {
    /// The epoch of the peer's log the `seq` belongs to.
    public var epoch: [UInt8]
    public var seq: Int64

    public init(epoch: [UInt8], seq: Int64) {
        self.epoch = epoch
        self.seq = seq
    }
}

/// What a commit changed, delivered to observers after the transaction commits.
public struct StoreEvent: Sendable {
    /// Collections with at least one changed document. Names compare byte-wise (``UTF8Key``):
    /// "é" and "e" + U+0301 are two collections.
    public var collections: Set<UTF8Key>
    /// The peer whose batch caused the change; `nil` for local writes.
    public var origin: [UInt8]?
    /// `true` when documents were evicted (their subscriptions' checkpoints were forgotten, so
    /// peers send matching documents again).
    public var evicted = false
    /// The canonical keys (``DocumentStore/key(for:)``) of the changed documents, by collection.
    ///
    /// Every committed change to a document row (write, remove, merge, evict) is reported in the
    /// event of its own commit or of a commit that ended concurrently; a collection in
    /// ``collections`` may then have no keys here because another event already carried them.
    /// Collection names and keys compare byte-wise (``UTF8Key``).
    public var changedKeys: [UTF8Key: Set<UTF8Key>] = [:]
}

/// A per-document outcome of merging a remote batch.
public struct MergeOutcome: Sendable {
    /// Documents whose local state changed.
    public var applied: Int
    /// Documents refused, with the reason (they do not block the rest of the batch).
    public var rejected: [(id: String, reason: String)]
}

/// The local document store: SQLite in WAL mode holding every document's CRDT state, its
/// materialised JSON value (so SQLite's JSON functions can serve queries), and the per-store
/// change log ordered by `seq`.
///
/// All access goes through one lock that owns the connection (the single writer). Observers are
/// called after commit, outside the lock.
public final class DocumentStore: Sendable {
    struct State {
        let db: Connection
        var clock: HybridLogicalClock
        var nextSeq: Int64
        /// Documents changed since the last ``DocumentStore/notify(_:)``, by collection.
        var changedKeys: [UTF8Key: Set<UTF8Key>] = [:]
    }

    let state: Mutex<State>
    private let observers = Mutex<[UInt64: @Sendable (StoreEvent) -> Void]>([:])
    private let nextObserver = Atomic<UInt64>(0)
    public let options: StoreOptions
    /// The site ID stamping this store's writes (random, persistent).
    public let siteID: SiteID
    /// The random ID of this life of the store's log.
    public let epoch: [UInt8]
    /// The path of the SQLite database file.
    public let path: String

    static let schema = """
        PRAGMA journal_mode=WAL;
        PRAGMA synchronous=NORMAL;
        CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value BLOB) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS documents(
            collection TEXT NOT NULL,
            id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            deleted INTEGER NOT NULL,
            state BLOB NOT NULL,
            value TEXT,
            source BLOB,
            PRIMARY KEY(collection, id)
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS documents_by_collection_seq ON documents(collection, seq);
        CREATE TABLE IF NOT EXISTS checkpoints(
            peer BLOB NOT NULL,
            subscription TEXT NOT NULL,
            epoch BLOB NOT NULL,
            seq INTEGER NOT NULL,
            PRIMARY KEY(peer, subscription)
        ) WITHOUT ROWID;
        """

    /// Opens (creating if needed) the store at `path`.
    ///
    /// - Throws: ``StoreError/sqlite(_:)`` when the file cannot be opened or is not a Trellis store.
    public init(path: String, options: StoreOptions = StoreOptions()) throws(StoreError) {
        self.path = path
        self.options = options
        do {
            let db = try Connection(path: path, readOnly: options.readOnly)
            if options.readOnly {
                // Inspect without writing anything, not even the schema.
                guard try Self.hasTable(db, "meta"), try Self.meta(db, "site") != nil else {
                    throw StoreError.corrupt("\(path) is not a Trellis store (no site ID)")
                }
            } else {
                try db.execute(Self.schema)
            }
            let (site, epoch, hlc) = try db.transaction(readOnly: options.readOnly) {
                () throws -> (SiteID, [UInt8], UInt64) in
                let site =
                    try Self.meta(db, "site")
                    ?? {
                        let fresh = Array(withUnsafeBytes(of: UInt64.random(in: 1...UInt64.max)) { Array($0) })
                        try Self.setMeta(db, "site", fresh)
                        return fresh
                    }()
                let epoch =
                    try Self.meta(db, "epoch")
                    ?? {
                        let fresh = (0..<16).map { _ in UInt8.random(in: 0...255) }
                        try Self.setMeta(db, "epoch", fresh)
                        return fresh
                    }()
                let hlc = try Self.meta(db, "hlc").map { Self.uint64($0) } ?? 0
                guard site.count == 8 else { throw StoreError.corrupt("site ID is \(site.count) bytes") }
                return (Self.uint64(site), epoch, hlc)
            }
            let maxSeq = try db.prepare("SELECT coalesce(max(seq), 0) FROM documents")
            _ = try maxSeq.step()
            // Evicted rows leave the log, so the highest seq ever issued is also kept in meta:
            // a seq is never issued twice.
            let issued = try Self.meta(db, "seq").map { Int64(bitPattern: Self.uint64($0)) } ?? 0
            let next = max(maxSeq.int64(0), issued) + 1
            maxSeq.reset()
            self.siteID = site
            self.epoch = epoch
            self.state = Mutex(
                State(
                    db: db,
                    clock: HybridLogicalClock(
                        last: HLCTimestamp(rawValue: hlc), maxForwardDrift: options.maxClockDrift), nextSeq: next))
        } catch let error as StoreError {
            throw error
        } catch let error as SQLiteError where error.code == 26 {  // SQLITE_NOTADB
            throw .corrupt("\(path) is not a Trellis store (SQLite: \(error.message))")
        } catch {
            throw .sqlite("opening \(path): \(error)")
        }
    }

    private static func hasTable(_ db: Connection, _ name: String) throws -> Bool {
        let s = try db.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?")
        s.bind(1, name)
        defer { s.reset() }
        return try s.step()
    }

    private static func uint64(_ bytes: [UInt8]) -> UInt64 {
        var v: UInt64 = 0
        for b in bytes.prefix(8) { v = v << 8 | UInt64(b) }
        return v
    }

    private static func bytes(_ v: UInt64) -> [UInt8] {
        (0..<8).map { UInt8(truncatingIfNeeded: v >> (56 - 8 * $0)) }
    }

    private static func meta(_ db: Connection, _ key: String) throws -> [UInt8]? {
        let s = try db.prepare("SELECT value FROM meta WHERE key = ?")
        s.bind(1, key)
        defer { s.reset() }
        return try s.step() ? s.bytes(0) : nil
    }

    private static func setMeta(_ db: Connection, _ key: String, _ value: [UInt8]) throws {
        let s = try db.prepare("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)")
        s.bind(1, key)
        s.bind(2, value)
        try s.run()
    }

    // MARK: Observers

    /// Registers a callback run after every commit that changed documents, outside the store lock.
    ///
    /// - Returns: a token for ``removeObserver(_:)``.
    @discardableResult
    public func addObserver(_ callback: @escaping @Sendable (StoreEvent) -> Void) -> UInt64 {
        let token = nextObserver.add(1, ordering: .relaxed).newValue
        observers.withLock { $0[token] = callback }
        return token
    }

    public func removeObserver(_ token: UInt64) {
        _ = observers.withLock { $0.removeValue(forKey: token) }
    }

    /// The number of registered observers (for leak tests).
    public var observerCount: Int { observers.withLock { $0.count } }

    func notify(_ event: StoreEvent) {
        guard !event.collections.isEmpty else { return }
        var event = event
        event.changedKeys = state.withLock { s in
            defer { s.changedKeys = [:] }
            return s.changedKeys
        }
        let callbacks = observers.withLock { Array($0.values) }
        for callback in callbacks { callback(event) }
    }

    // MARK: IDs

    /// The canonical key of an `_id` (its deterministic JSON text).
    ///
    /// - Throws: ``StoreError/invalidID(_:)`` unless the ID is a non-empty string or a map.
    public static func key(for id: Value) throws(StoreError) -> String {
        switch id {
        case .string(let s) where !s.isEmpty: return JSON.string(id)
        case .map(let m) where !m.isEmpty: return JSON.string(id)
        case .string: throw .invalidID("it is an empty string")
        case .map: throw .invalidID("it is an empty map")
        default: throw .invalidID("it must be a string or a map, not \(id.typeName)")
        }
    }

    // MARK: Local writes

    func withState<R: Sendable>(_ body: (inout State) throws -> R) throws(StoreError) -> R {
        do {
            return try state.withLock { (s: inout State) throws -> R in try body(&s) }
        } catch let error as StoreError {
            throw error
        } catch let error as SQLiteError {
            throw .sqlite(error.description)
        } catch {
            throw .sqlite("\(error)")
        }
    }

    func load(_ db: Connection, _ collection: String, _ key: String) throws -> DocumentState? {
        let s = try db.prepare("SELECT state, value FROM documents WHERE collection = ? AND id = ?")
        s.bind(1, collection)
        s.bind(2, key)
        defer { s.reset() }
        guard try s.step(), let bytes = s.bytes(0) else { return nil }
        do {
            return try StoredState.decode(bytes, value: s.string(1))
        } catch {
            throw StoreError.corrupt("document \(key) in \(collection): \(error)")
        }
    }

    /// Writes a document state with the next `seq`. Checks the size limit.
    func persist(
        _ s: inout State, _ collection: String, _ key: String, _ id: Value, _ doc: DocumentState,
        source: [UInt8]?
    ) throws {
        let materialized = doc.materialize(id: id)
        // Whatever path wrote it (upsert, an update at a deep path, a merge), the document as a
        // whole must be storable and decodable by every peer.
        do { try materialized?.validate() } catch { throw StoreError.invalidValue("document \(key): \(error)") }
        let value = materialized.map { JSON.string($0) }
        let bytes = StoredState.bytes(for: doc, materialized: materialized)
        // The limit counts the whole state as peers receive it, whatever form is stored.
        let valueBytes = value?.utf8.count ?? 0
        // A compact row stands for the whole state; that is at most about twice the JSON plus a
        // little, so it is only encoded to be measured when that bound could cross a threshold.
        let stateBytes =
            StoredState.isCompact(bytes) && 3 * valueBytes + 64 >= options.warnDocumentBytes
            ? doc.cbor().count : bytes.count
        let size = stateBytes + valueBytes
        if size > options.maxDocumentBytes {
            throw StoreError.documentTooLarge(id: key, bytes: size, limit: options.maxDocumentBytes)
        }
        if size > options.warnDocumentBytes {
            options.log(
                "document \(key) in \(collection) is \(size) bytes with metadata (above \(options.warnDocumentBytes))")
        }
        let st = try s.db.prepare(
            "INSERT OR REPLACE INTO documents(collection, id, seq, deleted, state, value, source) VALUES (?,?,?,?,?,?,?)"
        )
        st.bind(1, collection)
        st.bind(2, key)
        st.bind(3, s.nextSeq)
        st.bind(4, Int64(value == nil ? 1 : 0))
        st.bind(5, bytes)
        st.bind(6, value)
        st.bind(7, source)
        try st.run()
        s.nextSeq += 1
        s.changedKeys[UTF8Key(collection), default: []].insert(UTF8Key(key))
    }

    func saveClock(_ s: State) throws {
        try Self.setMeta(s.db, "hlc", Self.bytes(s.clock.last.rawValue))
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

    /// Upserts several documents in one transaction (one `seq` each, one commit event).
    ///
    /// - Complexity: O(total size) plus one indexed lookup per document.
    @discardableResult
    public func upsert(_ documents: [Value], in collection: String) throws(StoreError) -> [Value] {
        let prepared = try Self.prepare(documents)
        let now = options.now()
        try withState { s in
            try s.db.transaction {
                for (id, key, fields) in prepared {
                    var doc = try load(s.db, collection, key) ?? DocumentState()
                    let stamp = Stamp(time: s.clock.now(physicalMillis: now), site: siteID)
                    doc.merge(fields: fields, stamp: stamp)
                    try persist(&s, collection, key, id, doc, source: nil)
                }
                try saveClock(s)
            }
        }
        notify(StoreEvent(collections: [UTF8Key(collection)], origin: nil))
        return prepared.map(\.0)
    }

    /// Checks documents for upsert and splits each into `_id` (a new UUID string when absent), its
    /// key and its other fields.
    ///
    /// - Throws: ``StoreError`` for a non-map, a bad `_id` or a value that cannot be stored.
    static func prepare(_ documents: [Value]) throws(StoreError) -> [(id: Value, key: String, fields: UTF8Map<Value>)] {
        var prepared: [(id: Value, key: String, fields: UTF8Map<Value>)] = []
        prepared.reserveCapacity(documents.count)
        for document in documents {
            guard case .map(var fields) = document else { throw .notAMap(document.typeName) }
            do { try document.validate() } catch { throw .invalidValue(error.description) }
            let id = fields.removeValue(forKey: "_id") ?? .string(UUID().uuidString)
            prepared.append((id, try key(for: id), fields))
        }
        return prepared
    }

    /// Removes a document (a tombstone that replicates).
    ///
    /// - Returns: `true` when the document existed and was removed.
    @discardableResult
    public func remove(id: Value, in collection: String) throws(StoreError) -> Bool {
        let key = try Self.key(for: id)
        let removed = try withState { s -> Bool in
            try s.db.transaction {
                guard var doc = try load(s.db, collection, key), !doc.isDeleted else { return false }
                // The remove is an event on this node's clock, so later local writes order after it.
                doc.remove(stamp: Stamp(time: s.clock.now(physicalMillis: options.now()), site: siteID))
                try persist(&s, collection, key, id, doc, source: nil)
                try saveClock(s)
                return true
            }
        }
        if removed { notify(StoreEvent(collections: [UTF8Key(collection)], origin: nil)) }
        return removed
    }

    // MARK: Reads

    /// The live document with this `_id`, or `nil`.
    public func document(id: Value, in collection: String) throws(StoreError) -> Value? {
        let key = try Self.key(for: id)
        return try withState { s -> Value? in
            let st = try s.db.prepare("SELECT value FROM documents WHERE collection = ? AND id = ? AND deleted = 0")
            st.bind(1, collection)
            st.bind(2, key)
            defer { st.reset() }
            guard try st.step(), let text = st.string(0) else { return nil }
            return try JSON.parse(text)
        }
    }

    /// Every live document of a collection, ordered by `_id` key, optionally filtered.
    ///
    /// - Complexity: O(n) in the collection's documents.
    public func documents(in collection: String, where filter: (Value) throws -> Bool = { _ in true })
        throws(StoreError) -> [Value]
    {
        try withState { s -> [Value] in
            let st = try s.db.prepare("SELECT value FROM documents WHERE collection = ? AND deleted = 0 ORDER BY id")
            st.bind(1, collection)
            defer { st.reset() }
            var out: [Value] = []
            while try st.step() {
                guard let text = st.string(0) else { continue }
                let value = try JSON.parse(text)
                if try filter(value) { out.append(value) }
            }
            return out
        }
    }

    /// Number of live documents in a collection.
    public func count(in collection: String) throws(StoreError) -> Int {
        try withState { s -> Int in
            let st = try s.db.prepare("SELECT count(*) FROM documents WHERE collection = ? AND deleted = 0")
            st.bind(1, collection)
            defer { st.reset() }
            _ = try st.step()
            return Int(st.int64(0))
        }
    }

    /// The current CRDT state of a document (tombstones included), or `nil` when never seen.
    public func state(id: Value, in collection: String) throws(StoreError) -> DocumentState? {
        let key = try Self.key(for: id)
        return try withState { s in try load(s.db, collection, key) }
    }

    /// Copies the write-ahead log into the database file and truncates it
    /// (`PRAGMA wal_checkpoint(TRUNCATE)`), e.g. before measuring the file size or a backup.
    public func checkpointWAL() throws(StoreError) {
        try withState { s in try s.db.execute("PRAGMA wal_checkpoint(TRUNCATE)") }
    }

    // MARK: Change log

    /// The highest `seq` committed so far (0 for an empty store).
    public var lastSeq: Int64 {
        guard options.readOnly else { return state.withLock { $0.nextSeq - 1 } }
        // A read-only store watches a log another process writes: read it from the database.
        return
            (try? withState { s -> Int64 in
                let st = try s.db.prepare("SELECT coalesce(max(seq), 0) FROM documents")
                defer { st.reset() }
                _ = try st.step()
                let fromLog = st.int64(0)
                let issued = try Self.meta(s.db, "seq").map { Int64(bitPattern: Self.uint64($0)) } ?? 0
                return max(fromLog, issued)
            }) ?? state.withLock { $0.nextSeq - 1 }
    }

    /// One page of a collection's change log after `after`, in `seq` order: the entries whose
    /// document matches `query` with `args`, and every tombstone (a removed document matches no
    /// query, but whoever holds it must learn of the remove).
    ///
    /// The query runs inside SQLite (``Query/sqlWhere(column:)`` over the materialised JSON) when
    /// it translates; otherwise each entry's state is decoded and the query evaluated in memory.
    ///
    /// - Parameters:
    ///   - limit: at most this many log entries are examined (matching or not).
    /// - Throws: ``StoreError`` for SQLite errors, a corrupt state, or a query whose `$args` are missing.
    /// - Complexity: O(limit · log n) through the `(collection, seq)` index.
    public func changes(
        in collection: String, after: Int64, limit: Int, matching query: Query = .all, args: UTF8Map<Value> = [:]
    ) throws(StoreError) -> ChangePage {
        let bound = try Self.bind(query, args)
        let translated = bound.sqlWhere(column: "documents.value")
        return try withState { s -> ChangePage in
            let (st, pushed) = try Self.preparePushedDown(s.db, translated) {
                let matchSQL = $0.map { "(deleted = 1 OR (\($0.sql)))" } ?? "1"
                return "SELECT seq, id, state, deleted, source, \(matchSQL), value FROM documents "
                    + "WHERE collection = ? AND seq > ? ORDER BY seq LIMIT ?"
            }
            let bindings = pushed?.bindings ?? []
            Self.bind(st, bindings)
            let index = Int32(bindings.count) + 1
            st.bind(index, collection)
            st.bind(index + 1, after)
            st.bind(index + 2, Int64(limit))
            defer { st.reset() }
            var records: [ChangeRecord] = []
            var scanned = 0
            var last = after
            while try st.step() {
                scanned += 1
                last = st.int64(0)
                guard st.int64(5) != 0 else { continue }
                let id = try JSON.parse(st.string(1) ?? "null")
                let stored = st.bytes(2) ?? []
                let deleted = st.int64(3) != 0
                let compact = StoredState.isCompact(stored)
                var doc: DocumentState?
                if compact || (pushed == nil && !deleted) {
                    do { doc = try StoredState.decode(stored, value: st.string(6)) } catch {
                        throw StoreError.corrupt("document \(id) in \(collection): \(error)")
                    }
                }
                if pushed == nil, !deleted {
                    guard let value = doc?.materialize(id: id), try bound.matches(value) else { continue }
                }
                // Peers receive the whole state, whatever form the row keeps.
                let state = compact ? doc?.cbor() ?? [] : stored
                records.append(
                    ChangeRecord(
                        seq: last, collection: collection, id: id, state: state, isDeleted: deleted,
                        source: st.bytes(4)))
            }
            return ChangePage(records: records, scannedUpTo: last, exhausted: scanned < limit)
        }
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

    // MARK: Remote merge

    /// Merges documents from a peer and stores the checkpoint in the same transaction, so after
    /// a crash neither is applied without the other.
    ///
    /// A document that fails to decode or is above the size limit is skipped and reported; the rest
    /// of the batch is applied.
    ///
    /// - Parameters:
    ///   - documents: the peer's document states.
    ///   - peer: the peer key of the sender.
    ///   - checkpoint: `(subscription key, checkpoint)` to store, or `nil`.
    /// - Complexity: O(total size of the batch) plus one indexed lookup per document.
    public func merge(
        _ documents: [RemoteDocument], from peer: [UInt8], checkpoint: (String, Checkpoint)?
    ) throws(StoreError) -> MergeOutcome {
        var outcome = MergeOutcome(applied: 0, rejected: [])
        var touched: Set<UTF8Key> = []
        let now = options.now()
        try withState { s in
            try s.db.transaction {
                for remote in documents {
                    let key: String
                    let incoming: DocumentState
                    do {
                        key = try Self.key(for: remote.id)
                        incoming = try DocumentState(encoded: CBOR.decode(remote.state))
                    } catch {
                        outcome.rejected.append((JSON.string(remote.id), "\(error)"))
                        continue
                    }
                    // A stamp far ahead of this node's clock would win every later local write to
                    // its fields until the wall clock caught up: refuse the document instead.
                    guard incoming.maxTime.millis <= now &+ options.maxClockDrift else {
                        let ahead = incoming.maxTime.millis &- now
                        outcome.rejected.append(
                            (
                                key,
                                "it carries a stamp \(ahead) ms ahead of this node's clock, more than the allowed "
                                    + "\(options.maxClockDrift) ms; fix the writer's clock (a later change is sent again)"
                            ))
                        continue
                    }
                    s.clock.receive(incoming.maxTime, physicalMillis: now)
                    var doc = try load(s.db, remote.collection, key) ?? DocumentState()
                    guard doc.merge(incoming) else { continue }
                    do {
                        try persist(&s, remote.collection, key, remote.id, doc, source: doc == incoming ? peer : nil)
                    } catch let error as StoreError {
                        outcome.rejected.append((key, error.description))
                        continue
                    }
                    outcome.applied += 1
                    touched.insert(UTF8Key(remote.collection))
                }
                if let (subscription, cp) = checkpoint {
                    let st = try s.db.prepare(
                        "INSERT OR REPLACE INTO checkpoints(peer, subscription, epoch, seq) VALUES (?,?,?,?)")
                    st.bind(1, peer)
                    st.bind(2, subscription)
                    st.bind(3, cp.epoch)
                    st.bind(4, cp.seq)
                    try st.run()
                }
                try saveClock(s)
            }
        }
        notify(StoreEvent(collections: touched, origin: peer))
        return outcome
    }

    /// The checkpoint stored for a peer and subscription, if any.
    public func checkpoint(peer: [UInt8], subscription: String) throws(StoreError) -> Checkpoint? {
        try withState { s -> Checkpoint? in
            let st = try s.db.prepare("SELECT epoch, seq FROM checkpoints WHERE peer = ? AND subscription = ?")
            st.bind(1, peer)
            st.bind(2, subscription)
            defer { st.reset() }
            guard try st.step() else { return nil }
            return Checkpoint(epoch: st.bytes(0) ?? [], seq: st.int64(1))
        }
    }
}
