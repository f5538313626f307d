import Foundation
public import TrellisCore

// Ditto-shaped store operations beyond the basic upsert/remove (docs/API.md): write strategies,
// field-level updates, evict, expression indexes, and sorted / limited / offset queries.
// Every write here is one SQLite transaction: one `seq` per changed document, the HLC saved,
// observers told after the commit.

/// How ``DocumentStore/upsert(_:in:writeStrategy:)`` treats a document that may already exist
/// (Ditto's `DittoWriteStrategy`).
public enum WriteStrategy: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// Writes every given field (nested maps merge per key; other values replace the field);
    /// fields not given are kept. The default.
    case merge
    /// Writes the document only when no live document with its `_id` exists locally; otherwise
    /// writes nothing. A local tombstone counts as absent: the write brings the document back. So
    /// does an evicted document, whose write starts from its local stub.
    case insertIfAbsent
    /// When no document with the `_id` is known locally (neither live nor removed), writes it as
    /// *default data*: every field is stamped with HLC time zero and the local site ID, so any
    /// real write to the same field, on any node, earlier or later, wins when the two meet.
    /// Meant for initial data that many peers create identically. Writes nothing when the
    /// document exists, was removed here (a remove is a real write) or was evicted here (its
    /// writes were seen here; default data written again could carry a stamp it already used).
    case insertDefaultIfAbsent
    /// Writes only the leaves whose value differs from the current local value (walking nested
    /// maps; values compare bit-exactly, so `4` and `4.0` differ). Removes nothing. When nothing
    /// differs nothing is written and no `seq` is used. Caveat (as in Ditto): the leaves not
    /// written keep their old stamps, so a concurrent write elsewhere wins for them.
    case updateDifferentValues

    public var description: String { rawValue }
}

/// One change to a document, applied by ``DocumentStore/update(id:in:operations:)``.
///
/// A path whose first array index is `a[2]` is applied to the whole array: the store reads the
/// current array, edits it, and writes it back as one register (arrays are last-writer-wins
/// registers). Paths must start with a field name and never with `_id`.
public enum DocumentMutation: Sendable, Hashable, CustomStringConvertible {
    /// Sets the field to the value, replacing whatever it held (a map value replaces the map).
    /// With `isDefault`, the value is *default data* stamped with HLC time zero and the local
    /// site (it loses to any real write, on any node) and is written only when the field is
    /// absent locally; a path into an array has no effect then (the array is present and wins).
    case set(FieldPath, Value, isDefault: Bool)
    /// Removes the field (observed-remove); inside an array, removes the element. A missing field
    /// is left alone and yields no result.
    case unset(FieldPath)
    /// Adds the amount (an `.int` or a finite `.double`) to a counter (a missing field starts at 0;
    /// a number becomes a counter starting from it). Ints keep the counter exact. Inside an array
    /// the element is read, added to and written back.
    case increment(FieldPath, Value)

    /// The field the mutation changes.
    public var path: FieldPath {
        switch self {
        case .set(let path, _, _), .unset(let path), .increment(let path, _): return path
        }
    }

    public var description: String {
        switch self {
        case .set(let path, let value, let isDefault): return "set \(path) \(value)\(isDefault ? " (default)" : "")"
        case .unset(let path): return "unset \(path)"
        case .increment(let path, let amount): return "increment \(path) by \(amount)"
        }
    }

    /// Checks what can be checked without the document: the path starts with a field other than
    /// `_id`, values and amounts are finite.
    ///
    /// - Throws: ``StoreError/idChanged`` for a path starting with `_id`,
    ///   ``StoreError/invalidValue(_:)`` otherwise.
    public func validate() throws(StoreError) {
        guard case .key(let first)? = path.components.first else {
            throw .invalidValue("a field path must start with a field name, not '\(path)'")
        }
        if first == "_id" { throw .idChanged }
        switch self {
        case .set(_, let value, _):
            do { try value.validate(path: path.description) } catch { throw .invalidValue(error.description) }
        case .increment(_, let amount) where !amount.isCounterNumber:
            throw .invalidValue("cannot increment '\(path)' by \(amount); only finite numbers are allowed")
        default:
            break
        }
    }

    /// Applies the mutation to a materialised document (a map) the way the store applies it to
    /// the replicated state, e.g. to show the effect of recorded mutations before they commit.
    ///
    /// - Returns: whether the document changed (a default set on a present field, or an unset of
    ///   a missing one, changes nothing).
    /// - Throws: ``StoreError`` for the errors of ``validate()`` and for paths the document cannot
    ///   take (an index out of range, an index into something that is not an array, an increment
    ///   of something that is not a number).
    /// - Complexity: O(size of the values along the path).
    @discardableResult
    public func apply(to document: inout Value) throws(StoreError) -> Bool {
        try validate()
        let components = path.components[...]
        switch self {
        case .set(_, let value, let isDefault):
            if isDefault, document.value(at: path.register) != nil { return false }
            return try FieldEdit.set(value).apply(to: &document, components, path: path)
        case .unset:
            return try FieldEdit.remove.apply(to: &document, components, path: path)
        case .increment(_, let amount):
            return try FieldEdit.increment(amount).apply(to: &document, components, path: path)
        }
    }
}

extension FieldPath {
    /// The path of the register holding this field: the path up to its first array index (arrays
    /// are one register), or the whole path when it has no index.
    var register: FieldPath {
        let end = components.firstIndex { if case .index = $0 { return true } else { return false } }
        return FieldPath(components: Array(components[..<(end ?? components.endIndex)]))
    }
}

/// What one applied mutation did (Ditto's `DittoUpdateResult`).
public enum UpdateResult: Sendable, Hashable, CustomStringConvertible {
    /// The field at `path` was set to `value`.
    case set(docID: Value, path: String, value: Value)
    /// The field at `path` was removed.
    case removed(docID: Value, path: String)
    /// The counter at `path` was incremented by `amount`.
    case incremented(docID: Value, path: String, amount: Value)

    /// The `_id` of the document the mutation applied to.
    public var docID: Value {
        switch self {
        case .set(let id, _, _), .removed(let id, _), .incremented(let id, _, _): return id
        }
    }

    public var description: String {
        switch self {
        case .set(let id, let path, let value): return "set \(id) \(path) = \(value)"
        case .removed(let id, let path): return "removed \(id) \(path)"
        case .incremented(let id, let path, let amount): return "incremented \(id) \(path) by \(amount)"
        }
    }
}

/// The direction of one sort key (Ditto's `DittoSortDirection`).
public enum SortDirection: String, Sendable, Hashable, CaseIterable {
    case ascending
    case descending
}

/// One key of a sort: a field path and a direction.
public struct SortKey: Sendable, Hashable, CustomStringConvertible {
    public var path: FieldPath
    public var direction: SortDirection

    public init(_ path: FieldPath, _ direction: SortDirection = .ascending) {
        self.path = path
        self.direction = direction
    }

    public var description: String { "\(path) \(direction == .ascending ? "asc" : "desc")" }
}

extension Value {
    /// The total order used to sort query results (``SortKey``), `nil` standing for a missing
    /// field.
    ///
    /// Type classes order as in Couchbase's N1QL collation: missing < null < booleans < numbers <
    /// strings < arrays < maps < bytes. Within a class: `false < true`; numbers numerically and
    /// exactly, `.int` and `.double` together (``Value/compare(_:_:)``; `4 == 4.0` and
    /// `-0.0 == 0.0` tie); strings and bytes byte-wise (UTF-8, never normalised); arrays element
    /// by element with this order, a prefix first; maps by their entries in byte-wise key order
    /// (key, then value), a prefix first. Ties are left to the caller (the store breaks them by
    /// `_id`).
    ///
    /// - Complexity: O(size of the smaller value).
    public static func sortOrder(_ lhs: Value?, _ rhs: Value?) -> Value.Ordering {
        let (l, r) = (sortRank(lhs), sortRank(rhs))
        if l != r { return l < r ? .less : .greater }
        guard let lhs, let rhs else { return .equal }
        switch (lhs, rhs) {
        case (.array(let a), .array(let b)):
            for (x, y) in zip(a, b) {
                let o = sortOrder(x, y)
                if o != .equal { return o }
            }
            return a.count == b.count ? .equal : (a.count < b.count ? .less : .greater)
        case (.map(let a), .map(let b)):
            for (x, y) in zip(a, b) {  // maps iterate in byte order of their keys
                let keyOrder = UTF8Key.compare(x.key, y.key)
                if keyOrder != 0 { return keyOrder < 0 ? .less : .greater }
                let o = sortOrder(x.value, y.value)
                if o != .equal { return o }
            }
            return a.count == b.count ? .equal : (a.count < b.count ? .less : .greater)
        default:
            return compare(lhs, rhs) ?? .equal  // null, null; NaN never reaches a store
        }
    }

    private static func sortRank(_ value: Value?) -> Int {
        switch value {
        case nil: return 0
        case .null?: return 1
        case .bool?: return 2
        case .int?, .double?: return 3
        case .string?: return 4
        case .array?: return 5
        case .map?: return 6
        case .bytes?: return 7
        }
    }

    static func utf8Less(_ a: String, _ b: String) -> Bool {
        UTF8Key.compare(a, b) < 0
    }
}

extension DocumentStore {
    // MARK: Upsert with a write strategy

    /// Inserts or updates a document with a write strategy (Ditto's `upsert(_:writeStrategy:)`).
    ///
    /// - Parameters:
    ///   - document: a map; `_id` is a non-empty string or map, a new UUID string when absent.
    ///   - writeStrategy: see ``WriteStrategy``; `.merge` is ``upsert(_:in:)``.
    /// - Returns: the document's `_id` (also when the strategy wrote nothing).
    /// - Throws: ``StoreError`` for a non-map, a bad `_id`, a non-finite number or a document above
    ///   the size limit; nothing is written then.
    /// - Complexity: O(size of the document) plus one indexed lookup.
    @discardableResult
    public func upsert(_ document: Value, in collection: String, writeStrategy: WriteStrategy) throws(StoreError)
        -> Value
    {
        try upsert([document], in: collection, writeStrategy: writeStrategy)[0]
    }

    /// Upserts several documents with one write strategy in one transaction (one `seq` per
    /// document written, one commit event when anything was written).
    ///
    /// - Returns: the `_id`s, in order.
    /// - Complexity: O(total size) plus one indexed lookup per document.
    @discardableResult
    public func upsert(_ documents: [Value], in collection: String, writeStrategy: WriteStrategy) throws(StoreError)
        -> [Value]
    {
        try upsertReportingWrites(documents, in: collection, writeStrategy: writeStrategy).map(\.id)
    }

    /// Upserts like ``upsert(_:in:writeStrategy:)-([Value],_,_)`` and tells which documents the
    /// write strategy wrote (the shell says so after `upsert --strategy`).
    ///
    /// - Returns: per document, in order, its `_id` and whether it was written: always for
    ///   `.merge`; for `.insertIfAbsent` when no live document had the `_id`; for
    ///   `.insertDefaultIfAbsent` when the `_id` was unknown here; for `.updateDifferentValues`
    ///   when a value differed.
    /// - Throws: as ``upsert(_:in:writeStrategy:)-([Value],_,_)``; nothing is written then.
    /// - Complexity: O(total size) plus one indexed lookup per document.
    @discardableResult
    public func upsertReportingWrites(_ documents: [Value], in collection: String, writeStrategy: WriteStrategy)
        throws(StoreError) -> [(id: Value, written: Bool)]
    {
        if writeStrategy == .merge { return try upsert(documents, in: collection).map { ($0, true) } }
        let prepared = try prepare(documents)
        let now = options.now()
        var written = [Bool](repeating: false, count: prepared.count)
        try write { s in
            for (index, (id, key, fields, generated)) in prepared.enumerated() {
                // An evicted document's stub counts as present (its writes were seen here) but
                // not live; writes start from it, so counters continue.
                let existing = try row(&s, collection, key)
                let live = existing?.kind == .live
                var doc = existing?.state ?? DocumentState()
                switch writeStrategy {
                case .merge:
                    preconditionFailure("handled by upsert(_:in:)")
                case .insertIfAbsent:
                    guard !live else { continue }
                    doc.merge(fields: fields, stamp: s.stamp(now: now))
                case .insertDefaultIfAbsent:
                    guard existing == nil else { continue }
                    doc.merge(fields: fields, stamp: s.defaultStamp)
                case .updateDifferentValues:
                    var changes = fields
                    if live, case .map(let current)? = doc.materialize(id: id) {
                        changes = Self.differingLeaves(fields, current)
                        if changes.isEmpty { continue }
                    }
                    doc.merge(fields: changes, stamp: s.stamp(now: now))
                }
                try persist(&s, collection, key, id, doc, previous: existing)
                if existing == nil, !generated { try noteCreated(&s, collection) }
                written[index] = true
            }
        }
        return zip(prepared, written).map { ($0.id, $1) }
    }

    /// The parts of `new` whose leaves differ (bit-exactly) from `current`, walking maps present
    /// in both.
    static func differingLeaves(_ new: UTF8Map<Value>, _ current: UTF8Map<Value>) -> UTF8Map<Value> {
        var out = UTF8Map<Value>()
        for (key, value) in new {
            if case .map(let newMap) = value, case .map(let currentMap)? = current[key] {
                let nested = differingLeaves(newMap, currentMap)
                if !nested.isEmpty { out[key] = .map(nested) }
            } else if current[key] != value {
                out[key] = value
            }
        }
        return out
    }

    // MARK: Update

    /// Applies mutations to one document in one transaction (Ditto's `update { doc in … }`).
    ///
    /// Each mutation gets its own HLC stamp, in order, so a later mutation of the same field wins
    /// over an earlier one (default sets are stamped at time zero). The document gets one new
    /// `seq` when its state changed, none otherwise.
    ///
    /// - Returns: one result per mutation that took effect, in order; `[]` when the document does
    ///   not exist locally (then nothing is written).
    /// - Throws: ``StoreError/idChanged`` for a mutation of `_id`; ``StoreError/invalidValue(_:)``
    ///   for a non-finite value, an array index out of range, an index into a non-array, or an
    ///   increment of a non-number; ``StoreError/documentTooLarge(id:bytes:limit:)``. Nothing is
    ///   written when any mutation fails.
    /// - Complexity: O(size of the document) per mutation.
    @discardableResult
    public func update(id: Value, in collection: String, operations: [DocumentMutation]) throws(StoreError)
        -> [UpdateResult]
    {
        try update([(id, operations)], in: collection)[0] ?? []
    }

    /// Applies mutations to several documents in one transaction (Ditto's cursor `update`).
    ///
    /// - Returns: per entry of `batch`, in order, the results of ``update(id:in:operations:)``, or
    ///   `nil` when that document does not exist locally.
    /// - Throws: as ``update(id:in:operations:)``; nothing is written when any mutation fails.
    /// - Complexity: O(total size of the documents × mutations).
    public func update(_ batch: [(id: Value, mutations: [DocumentMutation])], in collection: String)
        throws(StoreError) -> [[UpdateResult]?]
    {
        var keys: [String] = []
        for (id, mutations) in batch {
            keys.append(try Self.key(for: id))
            for mutation in mutations { try mutation.validate() }
        }
        let now = options.now()
        return try write { s -> [[UpdateResult]?] in
            var results: [[UpdateResult]?] = []
            for ((id, mutations), key) in zip(batch, keys) {
                guard let previous = try row(&s, collection, key), previous.kind == .live else {
                    results.append(nil)
                    continue
                }
                let original = previous.state
                var doc = original
                var applied: [UpdateResult] = []
                for mutation in mutations {
                    if let result = try apply(mutation, to: &doc, id: id, s: &s, now: now) {
                        applied.append(result)
                    }
                }
                results.append(applied)
                if doc != original { try persist(&s, collection, key, id, doc, previous: previous) }
            }
            return results
        }
    }

    /// Applies one validated mutation to a document's state.
    ///
    /// - Returns: its result, or `nil` when it had no effect.
    private func apply(
        _ mutation: DocumentMutation, to doc: inout DocumentState, id: Value, s: inout State, now: UInt64
    ) throws(StoreError) -> UpdateResult? {
        let path = mutation.path
        let text = path.description
        // Everything from the first array index on lives inside one register: the array.
        let field = path.register
        let split = field.components.count < path.components.count ? field.components.count : nil
        func stamp() -> Stamp { s.stamp(now: now) }
        func writeArray(_ edit: FieldEdit, _ stamp: Stamp) throws(StoreError) -> Bool {
            guard var array = doc.value(at: field), case .array = array else {
                throw .invalidValue("cannot change '\(path)': '\(field)' does not hold an array")
            }
            let inside = path.components[split!...]
            guard try edit.apply(to: &array, inside, path: path) else { return false }
            do { try doc.set(field, to: array, stamp: stamp) } catch { throw .invalidValue(error.description) }
            return true
        }
        do {
            switch mutation {
            case .set(_, let value, let isDefault):
                // Default data only fills a field that is absent and that this site never wrote or
                // saw removed (inside an array: the array), so no stamp names two writes.
                if isDefault, !doc.admitsDefaultData(at: field, site: s.siteID) { return nil }
                let stamp = isDefault ? s.defaultStamp : stamp()
                if split == nil {
                    try doc.set(path, to: value, stamp: stamp)
                } else {
                    _ = try writeArray(.set(value), stamp)
                }
                // A default that an earlier remove here had seen stays hidden: it lost.
                if isDefault, doc.value(at: path) != value { return nil }
                return .set(docID: id, path: text, value: value)
            case .unset:
                guard doc.value(at: path) != nil else { return nil }
                if split == nil {
                    try doc.unset(path, stamp: stamp())
                } else {
                    _ = try writeArray(.remove, stamp())
                }
                return .removed(docID: id, path: text)
            case .increment(_, let amount):
                if split == nil {
                    try doc.increment(path, by: amount, stamp: stamp())
                } else {
                    _ = try writeArray(.increment(amount), stamp())
                }
                return .incremented(docID: id, path: text, amount: amount)
            }
        } catch let error as DocumentStateError {
            throw .invalidValue(error.message)
        } catch let error as StoreError {
            throw error
        } catch {
            throw .invalidValue("\(error)")
        }
    }

    // MARK: Evict

    /// Drops the local copy of a document without telling peers (Ditto's `evict`).
    ///
    /// The row is replaced by a local **stub** at a new `seq`: it is never sent to peers and never
    /// shown by reads, queries or counts, and readers of the change log (the contacts enumerator)
    /// see the document as deleted. The stub keeps what this node must not forget about its own
    /// writes, so writing to the `_id` again starts from it (counters continue), default data
    /// (``WriteStrategy/insertDefaultIfAbsent``) is not written again, and a state merged from a
    /// peer brings the document back. Only live documents are evicted; a tombstone stays (it keeps
    /// the remove from being undone by peers).
    ///
    /// While a subscription of this node (or a peer's subscription this node relays) still
    /// matches the document, peers send it back; Ditto documents the same: cancel the
    /// subscription, evict, then subscribe again to a narrower query. The commit's
    /// ``StoreEvent/evicted`` tells the sync engine, which asks its peers for exactly the evicted
    /// `_id`s (and, when a subscription is made, for the evicted documents of its collection,
    /// ``evictedIDs(in:limit:)``); checkpoints and the rescan generation are left alone, so peers
    /// re-send about as many documents as were evicted, not the collection.
    ///
    /// - Returns: `true` when a live document existed and was evicted.
    /// - Complexity: one indexed lookup and write.
    @discardableResult
    public func evict(id: Value, in collection: String) throws(StoreError) -> Bool {
        try evict(ids: [id], in: collection).count == 1
    }

    /// Evicts several documents in one transaction (see ``evict(id:in:)``).
    ///
    /// - Returns: the `_id`s that were live and are now evicted, in order.
    @discardableResult
    public func evict(ids: [Value], in collection: String) throws(StoreError) -> [Value] {
        var keys: [String] = []
        for id in ids { keys.append(try Self.key(for: id)) }
        let evicted = try write { s -> [Value] in try evictRows(&s, collection, Array(zip(ids, keys))) }
        return evicted
    }

    private func evictRows(_ s: inout State, _ collection: String, _ rows: [(Value, String)]) throws -> [Value] {
        var evicted: [Value] = []
        for (id, key) in rows {
            guard let doc = try loadLive(&s, collection, key) else { continue }
            // The served query subscriptions its value matches hold it whatever it becomes: once
            // a stub, what it matched is unknown (DocumentStore+Scope.swift), so it leaves their
            // scope now, as if removed, and its later states reach them when it is fetched again.
            try trackScope(&s, collection, key, new: { nil })
            // Every stamp, context and counter total stays; the values go (docs/DATA-MODEL.md rule 8),
            // unless a write of this node in it has reached no peer yet: then nobody else holds its
            // values, and its withheld entries, fetched back, would hide the field on every node.
            let stub = try holdsUnacknowledgedWrite(&s, collection, key) ? doc : doc.evictionStub()
            try writeRow(&s, collection, key, kind: .stub, state: stub.cbor(), value: nil, origin: .evicted)
            evicted.append(id)
        }
        // Peers send evicted documents back while a subscription matches them (Ditto's rule): the
        // commit's event says the documents were evicted, and the sync engine asks its peers for
        // exactly these `_id`s again (Refetch in TrellisCore); checkpoints stay.
        if !evicted.isEmpty { s.evictedInCommit = true }
        return evicted
    }

    /// Whether the document's row holds a write of this node that no peer has acknowledged. A row
    /// whose write was acknowledged since open (``acknowledge(_:)``, in memory) is cleared here.
    private func holdsUnacknowledgedWrite(_ s: inout State, _ collection: String, _ key: String) throws -> Bool {
        let st = try s.db.prepare(
            "SELECT seq - unacked FROM documents WHERE k = trellis_key(?, ?) AND unacked IS NOT NULL")
        st.bind(1, collection)
        st.bind(2, key)
        guard try st.step() else {
            st.reset()
            return false
        }
        let written = st.int64(0)
        st.reset()
        guard let acknowledged = s.acknowledged[DocumentKey(collection: collection, key: key)],
            acknowledged >= written
        else { return true }
        try clearUnacknowledged(&s, collection, key, stub: nil)
        return false
    }

    private func clearUnacknowledged(_ s: inout State, _ collection: String, _ key: String, stub: [UInt8]?) throws {
        let st = try s.db.prepare(
            "UPDATE documents SET unacked = NULL, state = coalesce(?, state) WHERE k = trellis_key(?, ?)")
        st.bind(1, stub)
        st.bind(2, collection)
        st.bind(3, key)
        try st.run()
    }

    // MARK: Acknowledged writes

    /// At most this many acknowledgements are kept in memory (``acknowledge(_:)``); beyond it
    /// they are forgotten, which only costs an eviction the values it could have dropped.
    public static let maxAcknowledgedWrites = 1 << 16

    /// Records that a peer durably applied these change-log entries (it acknowledged a batch that
    /// held them): this node's writes in them are no longer its alone, so an eviction may drop
    /// their values (``evict(id:in:)``). An evicted document that kept its whole state for such a
    /// write is made an ordinary stub now; for the others it is noted in memory and written to
    /// the row only when the document is evicted, so acknowledging costs the sync path no writes.
    ///
    /// Forgetting an acknowledgement (a restart, the bound ``maxAcknowledgedWrites``) is safe:
    /// evicting that document keeps its whole state and offers it to peers once more, until one
    /// acknowledges it again.
    ///
    /// A tombstone among them (``AcknowledgedEntry/isTombstone``) that is still the row, and holds
    /// no later write of this node, is marked acknowledged in the row at once: the reaper keeps a
    /// tombstone holding an unacknowledged write (``reapExpiredTombstones(limit:)``), and a restart
    /// must not make it keep one for good.
    ///
    /// - Complexity: O(entries) in memory; one indexed read and write per eviction stub among them
    ///   and one indexed write per tombstone, in one transaction.
    public func acknowledge(_ entries: [AcknowledgedEntry]) throws(StoreError) {
        guard !entries.isEmpty else { return }
        try withState { s in
            if s.acknowledged.count + entries.count > Self.maxAcknowledgedWrites { s.acknowledged = [:] }
            // One look-up per entry: the value is raised in place.
            func raise(_ acknowledged: inout Int64, to seq: Int64) { acknowledged = max(acknowledged, seq) }
            for entry in entries {
                raise(
                    &s.acknowledged[DocumentKey(collection: entry.collection, key: entry.key), default: entry.seq],
                    to: entry.seq)
            }
        }
        let stubs = entries.filter(\.isEvictionStub)
        let tombstones = entries.filter(\.isTombstone)
        guard !stubs.isEmpty || !tombstones.isEmpty else { return }
        try write { s in
            if !tombstones.isEmpty {
                let mark = try s.db.prepare(
                    "UPDATE documents SET unacked = NULL WHERE k = trellis_key(?, ?) AND seq - unacked <= ? "
                        + "AND deleted = \(RowKind.tombstone.rawValue)")
                defer { mark.reset() }
                for entry in tombstones {
                    mark.reset()
                    mark.bind(1, entry.collection)
                    mark.bind(2, entry.key)
                    mark.bind(3, entry.seq)
                    try mark.run()
                }
            }
            let find = try s.db.prepare(
                "SELECT state FROM documents WHERE k = trellis_key(?, ?) AND seq - unacked <= ? "
                    + "AND deleted = \(RowKind.stub.rawValue)")
            defer { find.reset() }
            for entry in stubs {
                find.reset()
                find.bind(1, entry.collection)
                find.bind(2, entry.key)
                find.bind(3, entry.seq)
                guard try find.step() else { continue }
                let stub = try DocumentState(bytes: find.bytes(0) ?? []).evictionStub().cbor()
                find.reset()
                try clearUnacknowledged(&s, entry.collection, entry.key, stub: stub)
            }
        }
    }

    /// Records that a peer holds every tombstone of `collection` up to `seq` of this log (its
    /// whole-collection subscription asks from there: ``ReplicatorDirective/peerHolds(collection:through:)``):
    /// each that holds a write of this node no peer had acknowledged is marked acknowledged, as
    /// its acknowledgement would (``acknowledge(_:)``), which a reset connection may have lost. The
    /// reaper may then take them (``reapExpiredTombstones(limit:)``).
    ///
    /// - Complexity: O(log n + k) for the k such tombstones, through the partial index of the
    ///   tombstones the reaper keeps; a read alone when there are none.
    public func acknowledgeTombstones(in collection: String, through seq: Int64) throws(StoreError) {
        guard !options.readOnly else { return }
        let kept =
            "WHERE collection = ? AND deleted = \(RowKind.tombstone.rawValue) AND unacked IS NOT NULL AND seq <= ?"
        let any = try withState { s -> Bool in
            let st = try s.db.prepare("SELECT 1 FROM documents \(kept) LIMIT 1")
            defer { st.reset() }
            st.bind(1, collection)
            st.bind(2, seq)
            return try st.step()
        }
        guard any else { return }
        try write { s in
            let st = try s.db.prepare("UPDATE documents SET unacked = NULL \(kept)")
            st.bind(1, collection)
            st.bind(2, seq)
            try st.run()
        }
    }

    /// The `_id`s of the evicted documents of a collection (their local stubs), most recently
    /// evicted first: what a new subscription asks peers for again. First come the documents
    /// brought back from eviction by an older copy that still withhold a value (the
    /// `withholding` table, DocumentStore+Withholding.swift).
    ///
    /// - Parameter limit: at most this many.
    /// - Complexity: O(limit · log n), through the index of stubs.
    public func evictedIDs(in collection: String, limit: Int) throws(StoreError) -> [Value] {
        try withState { s -> [Value] in
            var ids: [Value] = []
            if s.withholdingRows > 0 {
                // Brought back by an older copy and still withholding a value: asked for again too.
                let held = try s.db.prepare("SELECT id FROM withholding WHERE collection = ? LIMIT ?")
                held.bind(1, collection)
                held.bind(2, Int64(max(0, limit)))
                defer { held.reset() }
                while try held.step() {
                    if let id = try? JSON.parse(held.string(0) ?? "") { ids.append(id) }
                }
            }
            let st = try s.db.prepare(
                "SELECT id FROM documents WHERE collection = ? AND deleted = \(RowKind.stub.rawValue) "
                    + "ORDER BY seq DESC LIMIT ?")
            st.bind(1, collection)
            st.bind(2, Int64(max(0, limit - ids.count)))
            defer { st.reset() }
            while try st.step() {
                if let id = try? JSON.parse(st.string(0) ?? "") { ids.append(id) }
            }
            return ids
        }
    }

    /// The collections that hold evicted documents (local stubs, or documents brought back from
    /// eviction that still withhold a value), in byte order: a node asks its peers for their
    /// documents again after a restart (``evictedIDs(in:limit:)``).
    ///
    /// - Complexity: O(stubs), through the index of stubs; nothing when there are none.
    public func evictedCollections() throws(StoreError) -> [String] {
        try withState { s -> [String] in
            // A store opened read-only may predate the index (opening it so writes no schema).
            let index = options.readOnly ? "" : "INDEXED BY documents_stubs "
            let withholding = s.withholdingRows > 0 ? "SELECT collection FROM withholding UNION " : ""
            let st = try s.db.prepare(
                "\(withholding)SELECT DISTINCT collection FROM documents \(index)WHERE deleted = \(RowKind.stub.rawValue) "
                    + "ORDER BY collection")
            defer { st.reset() }
            var names: [String] = []
            while try st.step() { names.append(st.string(0) ?? "") }
            return names
        }
    }

    /// The collections that hold rows: documents, tombstones or eviction stubs (a subscription
    /// from 0 in one of them asks the peer for the tombstones it reaped too,
    /// `WireSubscription.holds`), in byte order. An array, not a `Set<String>`: Swift compares
    /// strings by canonical equivalence, so a set would keep one of two collections named alike
    /// in another Unicode form ("é" U+00E9 and "e" + U+0301), which are two collections here.
    ///
    /// - Complexity: O(collections × log(rows)): one step down the `(collection, seq)` index
    ///   per collection.
    public func collectionsHoldingRows() throws(StoreError) -> [String] {
        try withState { s -> [String] in
            let st = try s.db.prepare(
                """
                WITH RECURSIVE c(name) AS (
                    SELECT min(collection) FROM documents
                    UNION ALL
                    SELECT (SELECT min(collection) FROM documents WHERE collection > c.name) FROM c
                    WHERE c.name IS NOT NULL)
                SELECT name FROM c WHERE name IS NOT NULL
                """)
            defer { st.reset() }
            var names: [String] = []
            while try st.step() { names.append(st.string(0) ?? "") }
            return names
        }
    }

    // MARK: Indexes

    /// Creates (if absent) an SQLite expression index serving queries on one field of one
    /// collection (Ditto's `CREATE INDEX`).
    ///
    /// The index is partial, `ON documents(json_extract(value, '$.path'), collection) WHERE
    /// collection = '…'`, with the `json_extract` written exactly as ``Query/sqlWhere(column:)``
    /// writes it, so SQLite's planner matches it: comparisons of the field with numbers and strings
    /// (`==`, `<`, `IN [...]`, …) seek the index. (`== null` and `== true` test `json_type` and do
    /// not use it.) The `collection` column lets the planner count the query's `collection = '…'`
    /// as served by the index too, which it weighs against reading the collection's key range.
    /// Entries of one value follow the row key, so equality results come in `_id` key order
    /// without a sort. The name is `idx_` + hex(collection) + `_` + hex(JSON path), unique by
    /// construction.
    ///
    /// - Parameter path: the field; its keys must be nameable by SQLite's JSON path syntax (no
    ///   empty key, no `"`, `\` or control characters, not `$bytes`).
    /// - Returns: the index name.
    /// - Throws: ``StoreError/invalidValue(_:)`` for such a path or a collection name holding a NUL.
    /// - Complexity: O(n log n) in the collection's documents when created; later writes to the
    ///   collection maintain it in O(log n).
    @discardableResult
    public func createIndex(path: FieldPath, in collection: String) throws(StoreError) -> String {
        guard !collection.utf8.contains(0) else {
            throw .invalidValue("cannot index collection '\(collection)': its name holds a NUL character")
        }
        guard let expression = Self.indexExpression(path) else {
            throw .invalidValue(
                "cannot index '\(path)': SQLite's JSON path syntax cannot name it (an empty key, a key with "
                    + "\", \\ or a control character, or $bytes)")
        }
        let (name, sql) = Self.indexSQL(collection: collection, jsonPath: expression.jsonPath)
        try withState { s in try s.db.execute(sql) }
        return name
    }

    /// The name and `CREATE INDEX IF NOT EXISTS` statement of the expression index on `jsonPath`
    /// (as ``indexExpression(_:)`` gives it, without quotes) in `collection`
    /// (``createIndex(path:in:)``).
    static func indexSQL(collection: String, jsonPath: String) -> (name: String, sql: String) {
        let name = "idx_" + hex(collection) + "_" + hex(jsonPath)
        return (
            name,
            "CREATE INDEX IF NOT EXISTS \"\(name)\" ON documents(json_extract(value, '\(jsonPath)'), collection) "
                + "WHERE collection = \(sqlLiteral(collection))"
        )
    }

    /// The `json_extract(value, '…')` that ``Query/sqlWhere(column:)`` writes for `path`, taken
    /// from its own output so that index and queries cannot drift apart; `nil` when queries on the
    /// path are not translated to SQL.
    static func indexExpression(_ path: FieldPath) -> (sql: String, jsonPath: String)? {
        guard case .key? = path.components.first else { return nil }
        let probe = QueryPredicate.compare(.field(path), .equal, .literal(.string("x")))
        guard let sql = probe.sqlWhere(column: "value")?.sql else { return nil }
        // Expected shape: (json_extract(value, L) = ? AND json_extract(value, L) IS NOT NULL)
        let head = "(json_extract(value, "
        let middle = ") = ? AND json_extract(value, "
        let tail = ") IS NOT NULL)"
        let fixed = head.utf8.count + middle.utf8.count + tail.utf8.count
        let total = sql.utf8.count
        guard sql.hasPrefix(head), total > fixed, (total - fixed) % 2 == 0 else { return nil }
        let literal = String(decoding: sql.utf8.dropFirst(head.utf8.count).prefix((total - fixed) / 2), as: UTF8.self)
        guard UTF8Key.equal(head + literal + middle + literal + tail, sql), literal.hasPrefix("'"),
            literal.hasSuffix("'")
        else { return nil }
        return ("json_extract(value, \(literal))", String(literal.dropFirst().dropLast()))
    }

    static func hex(_ text: String) -> String { hex(Array(text.utf8)) }

    static func sqlLiteral(_ text: String) -> String {
        var out = "'"
        for scalar in text.unicodeScalars {
            if scalar == "'" { out += "''" } else { out.unicodeScalars.append(scalar) }
        }
        return out + "'"
    }

    // MARK: Queries with sort, limit and offset

    /// The live documents of a collection matching `query`, sorted, then windowed by `offset`
    /// and `limit` (Ditto's `find(query).sort(…).offset(n).limit(m).exec()`).
    ///
    /// Without sort keys the order is by `_id` key (the canonical JSON of the `_id`, byte-wise).
    /// With sort keys documents are ordered by ``Value/sortOrder(_:_:)`` on each key in turn
    /// (missing fields first when ascending, last when descending), then by `_id` key, so the
    /// order is total and the same on every call.
    ///
    /// The filter runs in SQLite when the query translates (served by ``createIndex(path:in:)``
    /// indexes); `limit` and `offset` too when there are no sort keys. Sorting runs in memory
    /// after the filter: SQLite's order of JSON values (booleans as integers, arrays and maps as
    /// text, missing and null alike) differs from the query order.
    ///
    /// - Parameters:
    ///   - sort: sort keys, most significant first; may be empty.
    ///   - limit: at most this many documents (`nil`: all); not negative.
    ///   - offset: documents skipped before the first returned; not negative.
    /// - Throws: ``StoreError/invalidValue(_:)`` naming a missing `$args` value or a negative
    ///   limit or offset.
    /// - Complexity: O(n) in the collection's documents without an index, O(k log n) for k
    ///   matches with one; plus O(k log k) to sort.
    public func documents(
        in collection: String, matching query: Query, args: UTF8Map<Value> = [:], sort: [SortKey],
        limit: Int? = nil, offset: Int = 0
    ) throws(StoreError) -> [Value] {
        let bound = try Self.bind(query, args)
        try Self.checkWindow(limit: limit, offset: offset)
        return try withState { s in
            try select(&s, collection, bound, sort: sort, limit: limit, offset: offset).map(\.json.value)
        }
    }

    /// The documents ``documents(in:matching:args:sort:limit:offset:)`` returns, as their stored
    /// JSON with each one's key, parsed only when read (``StoredJSON``): what `find` results are
    /// made of.
    ///
    /// - Returns: `(key, json)` pairs in result order; `key` is the document's key
    ///   (``DocumentStore/key(for:)``: the canonical JSON of its `_id`).
    /// - Throws: as ``documents(in:matching:args:sort:limit:offset:)``.
    /// - Complexity: as ``documents(in:matching:args:sort:limit:offset:)``, less the parsing of
    ///   the rows: one pass over each row's text (O(n) in its length), unless the query is
    ///   evaluated in memory or sorted, which parses the rows it reads.
    public func storedDocuments(
        in collection: String, matching query: Query, args: UTF8Map<Value> = [:], sort: [SortKey],
        limit: Int? = nil, offset: Int = 0
    ) throws(StoreError) -> [StoredRow] {
        let bound = try Self.bind(query, args)
        try Self.checkWindow(limit: limit, offset: offset)
        return try withState { s in try select(&s, collection, bound, sort: sort, limit: limit, offset: offset) }
    }

    /// The number of live documents of a collection matching `query`.
    ///
    /// - Throws: ``StoreError/invalidValue(_:)`` naming a missing `$args` value.
    /// - Complexity: O(n) without an index; the count runs inside SQLite when the query translates.
    public func count(in collection: String, matching query: Query, args: UTF8Map<Value> = [:]) throws(StoreError)
        -> Int
    {
        let bound = try Self.bind(query, args)
        let translated = bound.sqlWhere(column: "documents.value")
        let counted = try withState { s -> Int? in
            // Rows with U+0000 in a string are evaluated in memory (DocumentStore+NULStrings.swift).
            if try mayHoldNUL(&s, collection) {
                return try select(&s, collection, bound, sort: [], limit: nil, offset: 0).count
            }
            let indexed = translated == nil ? [] : try Self.indexedPaths(s.db, collection)
            let (term, termBindings) = Self.collectionTerm(
                collection, ranged: !Self.readsIndexedField(translated, indexed))
            func count(_ condition: @escaping (PushedQuery) -> String) throws -> Int? {
                let (prepared, pushed) = try Self.preparePushedDown(s.db, translated) {
                    "SELECT count(*) FROM documents WHERE \(term) AND deleted = 0 AND \($0.map(condition) ?? "1")"
                }
                guard let pushed else { return nil }
                Self.bind(prepared, termBindings + pushed.bindings)
                defer { prepared.reset() }
                _ = try prepared.step()
                return Int(prepared.int64(0))
            }
            let counted: Int?
            do { counted = try count { "(\($0.sql))" } } catch let error as SQLiteError where error.isMalformedJSON {
                // A damaged row: count the others.
                try noteDamagedJSON(&s, collection)
                counted = try count { Self.guarded($0.sql) }
            }
            if try answeredWithoutNULRows(&s, collection) {
                return try select(&s, collection, bound, sort: [], limit: nil, offset: 0).count
            }
            return counted
        }
        if let counted { return counted }
        return try documents(in: collection) { try bound.matches($0) }.count
    }

    /// Removes the documents a query selects, in one transaction (tombstones, replicated).
    ///
    /// - Returns: the removed `_id`s, in result order.
    /// - Throws: as ``documents(in:matching:args:sort:limit:offset:)``.
    @discardableResult
    public func remove(
        in collection: String, matching query: Query, args: UTF8Map<Value> = [:], sort: [SortKey] = [],
        limit: Int? = nil, offset: Int = 0
    ) throws(StoreError) -> [Value] {
        let bound = try Self.bind(query, args)
        try Self.checkWindow(limit: limit, offset: offset)
        let now = options.now()
        let removed = try write { s -> [Value] in
            var removed: [Value] = []
            for (key, json) in try select(&s, collection, bound, sort: sort, limit: limit, offset: offset) {
                guard var doc = try loadLive(&s, collection, key) else { continue }
                let id = json.member("_id") ?? .null
                doc.remove(stamp: s.stamp(now: now))
                try persist(&s, collection, key, id, doc)
                removed.append(id)
            }
            return removed
        }
        return removed
    }

    /// Evicts the documents a query selects, in one transaction (see ``evict(id:in:)``).
    ///
    /// - Returns: the evicted `_id`s, in result order.
    /// - Throws: as ``documents(in:matching:args:sort:limit:offset:)``.
    @discardableResult
    public func evict(
        in collection: String, matching query: Query, args: UTF8Map<Value> = [:], sort: [SortKey] = [],
        limit: Int? = nil, offset: Int = 0
    ) throws(StoreError) -> [Value] {
        let bound = try Self.bind(query, args)
        try Self.checkWindow(limit: limit, offset: offset)
        let evicted = try write { s -> [Value] in
            let rows = try select(&s, collection, bound, sort: sort, limit: limit, offset: offset)
            return try evictRows(&s, collection, rows.map { ($0.json.member("_id") ?? .null, $0.key) })
        }
        return evicted
    }

    static func bind(_ query: Query, _ args: UTF8Map<Value>) throws(StoreError) -> Query {
        do { return try query.bind(args: args) } catch { throw .invalidValue("\(error)") }
    }

    static func checkWindow(limit: Int?, offset: Int) throws(StoreError) {
        if let limit, limit < 0 { throw .invalidValue("limit must not be negative, got \(limit)") }
        if offset < 0 { throw .invalidValue("offset must not be negative, got \(offset)") }
    }

    /// The collection's range of the row key (``collectionKeys``), so that a scan reads the
    /// collection's rows alone, in `_id` key order; or, for a condition on an indexed field,
    /// `collection = 'name'`, so that the field's partial index (`WHERE collection = 'name'`)
    /// applies. The name is inlined: SQLite's planner cannot use a partial index for a bound
    /// parameter. A name holding NUL (which SQL text cannot carry) is bound instead.
    ///
    /// - Parameter ranged: with the key range; without it when the condition reads a field an
    ///   expression index serves (``readsIndexedField(_:_:)``): SQLite's planner, which knows
    ///   nothing of how many rows a key range holds, would otherwise read the range rather than
    ///   seek that index for an `IN` list.
    static func collectionTerm(_ collection: String, ranged: Bool = true) -> (sql: String, bindings: [Value]) {
        // The key range alone, without `collection = …`: SQLite's planner would seek the change
        // log's `(collection, seq)` index for it and sort the rows, one lookup each.
        if collection.utf8.contains(0) {
            guard ranged else { return ("collection = ?", [.string(collection)]) }
            return ("k >= trellis_key(?, '') AND k < trellis_key_end(?)", [.string(collection), .string(collection)])
        }
        let name = sqlLiteral(collection)
        guard ranged else { return ("collection = \(name)", []) }
        return ("k >= trellis_key(\(name), '') AND k < trellis_key_end(\(name))", [])
    }

    /// The JSON paths of the collection's expression indexes (as ``indexExpression(_:)`` writes
    /// them, such as `$.Origin`), read from their names in the schema.
    ///
    /// - Complexity: O(log s + i) in the schema's entries s and the collection's indexes i.
    static func indexedPaths(_ db: Connection, _ collection: String) throws -> [String] {
        let st = try db.prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND name > ? AND name < ?")
        st.bind(1, "idx_" + hex(collection) + "_")
        st.bind(2, "idx_" + hex(collection) + "`")  // "`" follows "_"
        defer { st.reset() }
        var paths: [String] = []
        while try st.step() {
            guard let index = st.string(0).flatMap(expressionIndex) else { continue }
            paths.append(index.jsonPath)
        }
        return paths
    }

    /// The collection and JSON path an expression index's name holds, when it is a name
    /// ``createIndex(path:in:)`` gives: `idx_`, the collection in hex, `_`, the JSON path in hex.
    static func expressionIndex(named name: String) -> (collection: String, jsonPath: String)? {
        let parts = name.utf8.split(separator: UInt8(ascii: "_"), omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0].elementsEqual("idx".utf8),
            let collection = unhex(Substring(parts[1]).utf8), let jsonPath = unhex(Substring(parts[2]).utf8)
        else { return nil }
        return (collection, jsonPath)
    }

    /// The text whose hex digits (lowercase, as ``hex(_:)`` writes them) `digits` are; `nil` for
    /// anything else.
    static func unhex(_ digits: Substring.UTF8View) -> String? {
        func nibble(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            default: nil
            }
        }
        guard digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        var high: UInt8?
        for c in digits {
            guard let n = nibble(c) else { return nil }
            if let h = high {
                bytes.append(h << 4 | n)
                high = nil
            } else {
                high = n
            }
        }
        return String(validating: bytes, as: UTF8.self)
    }

    /// Whether a pushed-down condition reads one of `indexed` (``indexedPaths(_:_:)``): the
    /// `json_extract` it writes for such a field is the one the index is on.
    static func readsIndexedField(_ pushed: PushedQuery?, _ indexed: [String]) -> Bool {
        guard let pushed else { return false }
        return indexed.contains { pushed.sql.contains("json_extract(documents.value, '\($0)')") }
    }

    static func bind(_ statement: Statement, _ values: [Value], from start: Int32 = 1) {
        var index = start
        for value in values {
            statement.bind(index, value: value)
            index += 1
        }
    }

    /// A query translated to SQL: the condition and its bindings (``Query/sqlWhere(column:)``).
    typealias PushedQuery = (sql: String, bindings: [Value])

    /// Prepares the statement `sql(pushed)` for a query translated to SQL, or, when SQLite refuses
    /// that statement, the statement `sql(nil)`, for which the caller evaluates the query in
    /// memory. SQLite refuses conditions nested deeper than its parser allows (about 45
    /// parentheses; the query language allows 200), expression trees deeper than 1000, and more
    /// bound parameters than it was built for; none of these is a reason to fail a query that
    /// in-memory evaluation answers. Only preparing falls back: errors while stepping are thrown.
    ///
    /// - Returns: the statement and the translation it runs (`nil`: evaluate in memory).
    static func preparePushedDown(
        _ db: Connection, _ pushed: PushedQuery?, _ sql: (PushedQuery?) -> String
    ) throws(SQLiteError) -> (Statement, PushedQuery?) {
        if let pushed {
            do {
                return (try db.prepare(sql(pushed)), pushed)
            } catch {
                // Refused as SQL: fall through to the statement without the condition.
            }
        }
        return (try db.prepare(sql(nil)), nil)
    }

    /// The SQL and bindings selecting `(k, value)` rows for a bound query (the row key, whose
    /// `_id` key follows ``keyPrefixLength(_:)`` bytes): the filter pushed down when it
    /// translates, and the window when there is no sort and the filter is pushed.
    ///
    /// - Parameter guarded: evaluate the filter only on rows whose JSON is valid (after SQLite
    ///   refused the query over a damaged row); rows with damaged JSON are left out.
    ///   - nulRows: the collection may hold strings with U+0000: rows whose JSON holds one are
    ///     selected whatever the filter says, for the caller to evaluate in memory
    ///     (DocumentStore+NULStrings.swift); no window is given then.
    ///   - indexed: the JSON paths of the collection's expression indexes (``indexedPaths(_:_:)``).
    static func selectSQL(
        _ collection: String, _ pushed: PushedQuery?, window: (limit: Int?, offset: Int)?, guarded: Bool = false,
        nulRows: Bool = false, indexed: [String] = []
    ) -> (sql: String, bindings: [Value]) {
        let (term, termBindings) = collectionTerm(collection, ranged: !readsIndexedField(pushed, indexed))
        var sql = "SELECT k, value FROM documents WHERE \(term) AND deleted = 0"
        var bindings = termBindings
        if let pushed {
            let filter = guarded ? Self.guarded(pushed.sql) : "(\(pushed.sql))"
            sql += nulRows ? " AND (\(nulEscapeSQL) OR \(filter))" : " AND " + filter
            bindings += pushed.bindings
        }
        sql += " ORDER BY k"
        if let window, window.limit != nil || window.offset > 0 {
            sql += " LIMIT ? OFFSET ?"
            bindings += [.int(Int64(window.limit ?? -1)), .int(Int64(window.offset))]
        }
        return (sql, bindings)
    }

    /// A pushed-down filter evaluated only on valid JSON (`CASE` fixes the order of evaluation).
    static func guarded(_ sql: String) -> String { "(CASE WHEN json_valid(value) THEN (\(sql)) ELSE 0 END)" }

    /// Selects `(id key, value)` rows: filter, sort, window. Runs under the store lock.
    ///
    /// A damaged row (its JSON value does not parse) is left out and remembered
    /// (``damagedDocuments()``); the window applies to the others. In a collection that may hold
    /// strings with U+0000, the rows holding one are evaluated in memory
    /// (DocumentStore+NULStrings.swift).
    func select(
        _ s: inout State, _ collection: String, _ bound: Query, sort: [SortKey], limit: Int?, offset: Int
    ) throws -> [StoredRow] {
        let nulRows = try mayHoldNUL(&s, collection)
        let rows = try select(&s, collection, bound, sort: sort, limit: limit, offset: offset, nulRows: nulRows)
        guard !nulRows, try answeredWithoutNULRows(&s, collection) else { return rows }
        return try select(&s, collection, bound, sort: sort, limit: limit, offset: offset, nulRows: true)
    }

    private func select(
        _ s: inout State, _ collection: String, _ bound: Query, sort: [SortKey], limit: Int?, offset: Int,
        nulRows: Bool
    ) throws -> [StoredRow] {
        func window(_ pushed: PushedQuery?) -> (limit: Int?, offset: Int)? {
            pushed != nil && sort.isEmpty && !nulRows ? (limit, offset) : nil
        }
        let translated = bound.sqlWhere(column: "documents.value")
        let indexed = translated == nil ? [] : try Self.indexedPaths(s.db, collection)
        let prefix = Self.keyPrefixLength(collection)
        var windowInSQL = false
        func rows(guarded: Bool) throws -> (rows: [StoredRow], damaged: Bool) {
            let (st, pushed) = try Self.preparePushedDown(s.db, translated) {
                Self.selectSQL(
                    collection, $0, window: window($0), guarded: guarded, nulRows: nulRows, indexed: indexed
                ).sql
            }
            windowInSQL = window(pushed) != nil
            Self.bind(
                st,
                Self.selectSQL(
                    collection, pushed, window: window(pushed), guarded: guarded, nulRows: nulRows, indexed: indexed
                ).bindings)
            defer { st.reset() }
            var rows: [StoredRow] = []
            var damaged = false
            while try st.step() {
                guard let key = st.string(0, dropping: prefix), let text = st.textBytes(1) else { continue }
                guard let json = StoredJSON(checking: text) else {
                    noteDamaged(&s, collection, key, "its JSON value does not parse")
                    damaged = true
                    continue
                }
                if pushed == nil || (nulRows && json.withUTF8(Self.holdsNULEscape)), try !bound.matches(json.value) {
                    continue
                }
                rows.append((key, json))
            }
            return (rows, damaged)
        }
        var selected: [StoredRow]
        do {
            let first = try rows(guarded: false)
            // A damaged row inside a window SQLite counted: count again without it.
            selected = first.damaged && windowInSQL ? try rows(guarded: true).rows : first.rows
        } catch let error as SQLiteError where error.isMalformedJSON {
            try noteDamagedJSON(&s, collection)
            selected = try rows(guarded: true).rows
        }
        var rows = selected
        if windowInSQL { return rows }
        if !sort.isEmpty { rows = Self.sorted(rows, by: sort) }
        return Array(rows.dropFirst(offset).prefix(limit ?? Int.max))
    }

    /// Rows ordered by the sort keys, then by `_id` key byte-wise.
    static func sorted(_ rows: [StoredRow], by sort: [SortKey]) -> [StoredRow] {
        let keyed = rows.map { row in (row, sort.map { row.json.value.value(at: $0.path) }) }
        return keyed.sorted { a, b in
            for (i, key) in sort.enumerated() {
                var order = Value.sortOrder(a.1[i], b.1[i])
                if key.direction == .descending { order = order.reversed }
                if order != .equal { return order == .less }
            }
            return Value.utf8Less(a.0.key, b.0.key)
        }.map(\.0)
    }

    /// SQLite's `EXPLAIN QUERY PLAN` rows (the `detail` column) for the statement
    /// ``documents(in:matching:args:sort:limit:offset:)`` runs; empty when the query is
    /// evaluated in memory only. For tests and diagnostics.
    func queryPlan(
        in collection: String, matching query: Query, args: UTF8Map<Value> = [:], sort: [SortKey] = [],
        limit: Int? = nil, offset: Int = 0
    ) throws(StoreError) -> [String] {
        let bound = try Self.bind(query, args)
        let translated = bound.sqlWhere(column: "documents.value")
        return try withState { s -> [String] in
            func window(_ pushed: PushedQuery?) -> (limit: Int?, offset: Int)? {
                pushed != nil && sort.isEmpty ? (limit, offset) : nil
            }
            let indexed = try Self.indexedPaths(s.db, collection)
            let (st, pushed) = try Self.preparePushedDown(s.db, translated) {
                "EXPLAIN QUERY PLAN " + Self.selectSQL(collection, $0, window: window($0), indexed: indexed).sql
            }
            guard pushed != nil else { return [] }
            Self.bind(st, Self.selectSQL(collection, pushed, window: window(pushed), indexed: indexed).bindings)
            defer { st.reset() }
            var rows: [String] = []
            while try st.step() { rows.append(st.string(3) ?? "") }
            return rows
        }
    }
}

/// An edit of a materialised value at a path (used inside arrays, which are one register, and
/// to preview mutations).
enum FieldEdit {
    case set(Value)
    case remove
    case increment(Value)

    /// Applies the edit at `components` below `value`.
    ///
    /// Missing maps on the way are created for `set` and `increment` (a non-map on the way is
    /// replaced by a map, as the CRDT does); `remove` of something missing changes nothing.
    /// Array indexes must be in range, except that `remove` of a missing element changes nothing.
    ///
    /// - Returns: whether `value` changed.
    func apply(to value: inout Value, _ components: ArraySlice<FieldPath.Component>, path: FieldPath)
        throws(StoreError) -> Bool
    {
        guard let first = components.first else {
            switch self {
            case .set(let new):
                value = new
                return true
            case .remove:
                return false  // handled by the parent
            case .increment(let amount):
                guard value.isCounterNumber else {
                    throw .invalidValue("cannot increment '\(path)': it holds \(value.typeName)")
                }
                guard let sum = Value.counterSum(value, amount) else {
                    throw .invalidValue("cannot increment '\(path)' by \(amount): the sum leaves the range of numbers")
                }
                value = sum
                return true
            }
        }
        let rest = components.dropFirst()
        switch first {
        case .key(let key):
            var map: UTF8Map<Value>
            if case .map(let m) = value {
                map = m
            } else {
                if case .remove = self { return false }
                map = [:]
            }
            if rest.isEmpty, case .remove = self {
                guard map.removeValue(forKey: key) != nil else { return false }
                value = .map(map)
                return true
            }
            var child: Value
            if let existing = map[key] {
                child = existing
            } else {
                switch self {
                case .remove: return false
                case .increment where rest.isEmpty: child = .int(0)
                default: child = .map([:])
                }
            }
            guard try apply(to: &child, rest, path: path) else { return false }
            map[key] = child
            value = .map(map)
            return true
        case .index(let index):
            guard case .array(var array) = value else {
                if case .remove = self { return false }
                throw .invalidValue("cannot change '\(path)': element [\(index)] of something that is not an array")
            }
            guard index >= 0, index < array.count else {
                if case .remove = self { return false }
                throw .invalidValue(
                    "cannot change '\(path)': index \(index) is out of range (the array has \(array.count) element\(array.count == 1 ? "" : "s"))"
                )
            }
            if rest.isEmpty, case .remove = self {
                array.remove(at: index)
                value = .array(array)
                return true
            }
            guard try apply(to: &array[index], rest, path: path) else { return false }
            value = .array(array)
            return true
        }
    }
}
