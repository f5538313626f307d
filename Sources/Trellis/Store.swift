import Dispatch
import Foundation
import Synchronization
@_exported public import TrellisCore
public import TrellisStore
package import TrellisSync

/// A document as returned by queries: its `_id` and its value (a map including `_id`).
///
/// A document a query returns keeps the JSON text it was stored as and parses it the first time
/// ``value`` is read (Ditto's query result items are materialised on access too): a query that
/// only counts, lists `_id`s or reads a few fields never builds the whole value. Reading one
/// top-level field with the subscript before that parses only that field. A document is safe to
/// share between threads; reads parse at most once.
public struct Document: Sendable, Hashable, CustomStringConvertible {
    /// The document's `_id`.
    public let id: Value
    private let storage: Storage

    private enum Storage: Sendable {
        case value(Value)
        case stored(StoredJSON)
    }

    public init(value: Value) {
        self.storage = .value(value)
        self.id = value["_id"] ?? .null
    }

    /// A document read from the store: its key (the canonical JSON of its `_id`) and its JSON.
    init(key: String, json: StoredJSON) {
        self.storage = .stored(json)
        self.id = Self.plainStringID(key) ?? (try? JSON.parse(key)) ?? json.member("_id") ?? .null
    }

    /// The string `_id` whose key is `key` when the key holds no escape (`"…"` without `\`: its
    /// bytes between the quotes are the string's), without the parser; `nil` for any other key,
    /// which the parser reads. O(n) in the key's length.
    static func plainStringID(_ key: String) -> Value? {
        var key = key
        return key.withUTF8 { bytes -> Value? in
            let n = bytes.count
            guard n >= 2, bytes[0] == UInt8(ascii: "\""), bytes[n - 1] == UInt8(ascii: "\"") else { return nil }
            let content = UnsafeBufferPointer(rebasing: bytes[1..<n - 1])
            // Escapes, quotes and control characters (which the parser refuses raw) go to the parser.
            for byte in content where byte < 0x20 || byte == UInt8(ascii: "\\") || byte == UInt8(ascii: "\"") {
                return nil
            }
            return .string(String(decoding: content, as: UTF8.self))
        }
    }

    /// The whole document, `_id` included. For a document a query returned, the first read
    /// parses its stored JSON (O(n) in its length); later reads return the parsed value.
    public var value: Value {
        switch storage {
        case .value(let value): return value
        case .stored(let json): return json.value
        }
    }

    /// A top-level field, or `nil` when absent. Before ``value`` is read, this scans the stored
    /// JSON and parses that field alone (O(n) in the text's length, no tree for the rest).
    public subscript(key: String) -> Value? {
        switch storage {
        case .value(let value): return value[key]
        case .stored(let json): return json.member(key)
        }
    }

    /// The document as compact JSON with sorted keys.
    public var json: String { JSON.string(value) }

    public var description: String { json }

    public static func == (lhs: Document, rhs: Document) -> Bool {
        if case .stored(let a) = lhs.storage, case .stored(let b) = rhs.storage, a == b {
            return true  // the same text parses to the same value
        }
        return lhs.value == rhs.value
    }

    public func hash(into hasher: inout Hasher) { hasher.combine(value) }
}

/// The local store, shaped like Ditto's `DittoStore`: `store.collection("cars")`.
public final class Store: Sendable {
    /// The underlying SQLite document store.
    public let documents: DocumentStore
    let engine: any SubscriptionService
    let liveQueries: LiveQueryRegistry

    /// A store over `documents` whose subscriptions go to `subscriptions` (a node's sync engine,
    /// or a simulated node's).
    package init(documents: DocumentStore, subscriptions: any SubscriptionService) {
        self.documents = documents
        self.engine = subscriptions
        self.liveQueries = LiveQueryRegistry(documents: documents)
    }

    /// The number of running local observers (``LiveQuery``s and live query sequences); back to
    /// its previous value once the observers started since are stopped, dropped or cancelled.
    public var liveQueryCount: Int { liveQueries.count }

    /// The most events a plain `observeLocal` observer keeps queued (waiting for, or running on,
    /// its delivery queue) before it merges commits: 1,024 by default; at least 1.
    ///
    /// A plain observer gets one event per commit that touches its results. When its callbacks
    /// fall this far behind, the commits after the limit are not queued one by one: once a
    /// queued callback returns, they arrive as **one** event from the last queued results to the
    /// results then, whose `commitCount` says how many commits it covers (intermediate results
    /// are not delivered). Each observer reads the limit when it starts; next-signal observers
    /// always keep one.
    public var liveQueryEventLimit: Int {
        get { liveQueries.eventLimit.load(ordering: .relaxed) }
        set { liveQueries.eventLimit.store(max(1, newValue), ordering: .relaxed) }
    }

    /// Waits until every live query has evaluated the commits made before this call and the
    /// callbacks they caused have run (for tests, and for simulated meshes between steps).
    ///
    /// Do not call it from a live query callback (it would wait for itself).
    public func flushLiveQueries() {
        liveQueries.settle()
    }

    /// A collection by name (created on first write).
    public func collection(_ name: String) -> TrellisCollection {
        TrellisCollection(name: name, store: self)
    }
}

/// A collection of documents (Ditto's `DittoCollection`).
///
/// Named after Ditto's type rather than plain `Collection`, which would shadow Swift's
/// `Collection` protocol in every file that imports Trellis (docs/API.md, "Names"). There is no
/// alias under the old name, since it would go on shadowing the protocol.
public struct TrellisCollection: Sendable {
    /// The name given to ``Store/collection(_:)``; names compare byte for byte.
    public let name: String
    let store: Store

    /// Inserts or updates a document (Ditto's `upsert(_:writeStrategy:)`).
    ///
    /// ```swift
    /// try cars.upsert(["_id": "c1", "Name": "corolla", "Specs": ["Cylinders": 4]])         // .merge
    /// try cars.upsert(["_id": "c1", "Name": "preset"], writeStrategy: .insertIfAbsent)       // no effect
    /// try cars.upsert(["_id": "c2", "Seats": 5], writeStrategy: .insertDefaultIfAbsent)     // loses to real writes
    /// try cars.upsert(["_id": "c1", "Name": "corolla"], writeStrategy: .updateDifferentValues)  // writes nothing
    /// ```
    ///
    /// - Parameters:
    ///   - document: a map; `_id` (a non-empty string or a map) is generated as a UUID string
    ///     when absent.
    ///   - writeStrategy: see ``WriteStrategy``: `.merge` (default) writes every given field;
    ///     `.insertIfAbsent` writes only when no live document has the `_id` locally;
    ///     `.insertDefaultIfAbsent` writes default data (HLC time zero) only when the `_id` is
    ///     unknown locally; `.updateDifferentValues` writes only the leaves that differ.
    /// - Returns: the document's `_id`, also when the strategy wrote nothing.
    /// - Throws: ``StoreError`` for a non-map, a bad `_id`, NaN/Infinity, or an oversized document.
    /// - Complexity: O(size of the document) plus one indexed lookup.
    @discardableResult
    public func upsert(_ document: Value, writeStrategy: WriteStrategy = .merge) throws -> Value {
        try store.documents.upsert(document, in: name, writeStrategy: writeStrategy)
    }

    /// Upserts many documents with one write strategy in one transaction.
    ///
    /// - Returns: the `_id`s, in order.
    @discardableResult
    public func upsert(_ documents: [Value], writeStrategy: WriteStrategy = .merge) throws -> [Value] {
        try store.documents.upsert(documents, in: name, writeStrategy: writeStrategy)
    }

    /// Creates (if absent) an index on one field of this collection, so that `find` queries
    /// comparing the field with numbers or strings (`==`, `<`, `IN [...]`, …) seek it instead of
    /// scanning the collection (Ditto's `CREATE INDEX`). Indexes persist in the store.
    ///
    /// - Parameter path: a field path in query syntax, e.g. `"Origin"`, `"specs.engine.cylinders"`,
    ///   ``"tags[0]"``, ``"`odd key`.x"``.
    /// - Returns: the SQLite name of the index.
    /// - Throws: ``StoreError/invalidValue(_:)`` for a path that does not parse or that SQLite's
    ///   JSON path syntax cannot name (docs/QUERIES.md, "Translation to SQL").
    /// - Complexity: O(n log n) in the collection's documents, once.
    @discardableResult
    public func createIndex(_ path: String) throws -> String {
        try store.documents.createIndex(path: FieldPath.parse(path), in: name)
    }

    /// The document with this `_id`.
    public func findByID(_ id: Value) -> PendingIDSpecificOperation {
        PendingIDSpecificOperation(collection: self, id: id)
    }

    /// The documents matching a query in Ditto's predicate syntax (docs/QUERIES.md).
    ///
    /// - Parameters:
    ///   - query: e.g. `"Origin == 'Japan' && Cylinders > $args.min"`.
    ///   - args: values for `$args.name`.
    public func find(_ query: String, args: UTF8Map<Value> = [:]) -> PendingCursorOperation {
        PendingCursorOperation(collection: self, query: query, args: args)
    }

    /// Every document of the collection.
    public func findAll() -> PendingCursorOperation {
        PendingCursorOperation(collection: self, query: "true", args: [:])
    }
}

/// An operation on one document, run by its methods (Ditto's `DittoPendingIDSpecificOperation`).
public struct PendingIDSpecificOperation: Sendable {
    public let collection: TrellisCollection
    public let id: Value

    /// The document, or `nil` when it does not exist locally.
    public func exec() throws -> Document? {
        try collection.store.documents.document(id: id, in: collection.name).map(Document.init(value:))
    }

    /// Removes the document (replicated as a tombstone).
    ///
    /// - Returns: `true` when it existed.
    @discardableResult
    public func remove() throws -> Bool {
        try collection.store.documents.remove(id: id, in: collection.name)
    }

    /// Evicts the local copy of the document: no tombstone, nothing replicated.
    ///
    /// While a subscription still matches the document, peers send it back (as in Ditto): cancel
    /// the subscription first.
    ///
    /// - Returns: `true` when a live document existed and was evicted.
    @discardableResult
    public func evict() throws -> Bool {
        try collection.store.documents.evict(id: id, in: collection.name)
    }

    /// Changes the document through a ``MutableDocument`` (Ditto's `update { doc in … }`).
    ///
    /// The closure runs synchronously with the document as it is now (`nil` when it does not
    /// exist locally). The mutations it records are applied when it returns, in one transaction,
    /// to the document as it is then; a closure that records nothing writes nothing.
    ///
    /// ```swift
    /// let results = try cars.findByID("c1").update { doc in
    ///     doc?["Name"].set("toyota corolla")
    ///     doc?["Specs"]["Cylinders"].set(6)
    ///     doc?["Tags"][0].set("classic")     // read, replace element 0, write the array back
    ///     doc?["Sold"].increment(by: 1)      // a counter: increments from every peer add up
    ///     doc?["Obsolete"].remove()
    /// }
    /// ```
    ///
    /// - Returns: one ``UpdateResult`` per mutation that took effect, in order; `[]` when the
    ///   document does not exist.
    /// - Throws: ``StoreError/idChanged`` when the closure changed `_id`;
    ///   ``StoreError/invalidValue(_:)`` for an index out of range, an index into a non-array, an
    ///   increment of a non-number or a non-finite number; whatever the closure throws. Nothing is
    ///   written then.
    /// - Complexity: O(size of the document) per mutation.
    @discardableResult
    public func update(_ body: (MutableDocument?) throws -> Void) throws -> [UpdateResult] {
        let document = try exec().map(MutableDocument.init(document:))
        defer { document?.close() }
        try body(document)
        guard let document else { return [] }
        if let error = document.error { throw error }
        guard !document.mutations.isEmpty else { return [] }
        return try collection.store.documents.update(id: id, in: collection.name, operations: document.mutations)
    }

    /// Subscribes to this document from peers. Keep the subscription; `cancel()` ends it.
    public func subscribe() throws -> Subscription {
        let idLiteral = JSON.string(id)
        return try Subscription(
            engine: collection.store.engine,
            spec: SubscriptionSpec(collection: collection.name, query: "_id == $args.id", args: ["id": id]),
            label: idLiteral)
    }
}

/// An operation on the documents matching a query (Ditto's `DittoPendingCursorOperation`).
///
/// `sort`, `limit` and `offset` return a new operation and chain:
/// `cars.find("Origin == 'Japan'").sort("Horsepower", direction: .descending).limit(10).exec()`.
/// They shape `exec`, `update`, `remove`, `evict`, `count` and `observeLocal`; a subscription
/// replicates every document matching the query whatever the window.
public struct PendingCursorOperation: Sendable {
    public let collection: TrellisCollection
    public let query: String
    public let args: UTF8Map<Value>
    /// The sort keys, most significant first, as given to ``sort(_:direction:)``.
    public private(set) var sortKeys: [(path: String, direction: SortDirection)] = []
    /// The limit given to ``limit(_:)``, if any.
    public private(set) var limitCount: Int?
    /// The offset given to ``offset(_:)`` (0 by default).
    public private(set) var offsetCount: Int = 0

    init(collection: TrellisCollection, query: String, args: UTF8Map<Value>) {
        self.collection = collection
        self.query = query
        self.args = args
    }

    /// Sorts the results by a field; chain calls to sort by several fields, the first most
    /// significant.
    ///
    /// Order: numbers numerically (`.int` and `.double` together), strings byte-wise by UTF-8,
    /// `false < true`; across types missing < null < booleans < numbers < strings < arrays <
    /// maps < bytes (Couchbase's collation); a document missing the field sorts first ascending
    /// and last descending. Ties are broken by `_id`, so the order is total.
    ///
    /// - Parameter path: a field path in query syntax (`"Name"`, `"specs.hp"`, ``"a[0]"``); a bad
    ///   path makes `exec` and the other operations throw.
    /// - Complexity: sorting runs in memory after the filter: O(k log k) for k matches.
    public func sort(_ path: String, direction: SortDirection = .ascending) -> PendingCursorOperation {
        var copy = self
        copy.sortKeys.append((path, direction))
        return copy
    }

    /// Returns at most `count` documents (after ``offset(_:)``); a negative count makes `exec`
    /// throw.
    public func limit(_ count: Int) -> PendingCursorOperation {
        var copy = self
        copy.limitCount = count
        return copy
    }

    /// Skips the first `count` documents of the sorted results; a negative count makes `exec`
    /// throw.
    public func offset(_ count: Int) -> PendingCursorOperation {
        var copy = self
        copy.offsetCount = count
        return copy
    }

    /// The parsed query and sort keys.
    func resolved() throws -> (query: Query, sort: [SortKey]) {
        let parsed = try Query(query)
        let keys = try sortKeys.map { SortKey(try FieldPath.parse($0.path), $0.direction) }
        return (parsed, keys)
    }

    /// The matching documents: sorted by the sort keys (by `_id` when there are none), then
    /// windowed by offset and limit.
    ///
    /// - Throws: ``QueryParseError`` when the query does not parse; ``StoreError`` for a missing
    ///   `$args` value, a bad sort path, or a negative limit or offset.
    /// - Complexity: O(n) in the collection's documents, or O(k log n) for k matches when an
    ///   index (``TrellisCollection/createIndex(_:)``) serves the query; plus O(k log k) to sort.
    public func exec() throws -> [Document] {
        let (parsed, keys) = try resolved()
        var rows = try collection.store.documents.storedDocuments(
            in: collection.name, matching: parsed, args: args, sort: keys, limit: limitCount, offset: offsetCount)
        // Each row moved out (last first) rather than copied: no retain and release per row, and
        // the rows' array frees no elements.
        var documents: [Document] = []
        documents.reserveCapacity(rows.count)
        while let row = rows.popLast() { documents.append(Document(key: row.key, json: row.json)) }
        documents.reverse()
        return documents
    }

    /// The number of documents ``exec()`` would return, counted inside SQLite when the query
    /// translates (no documents are decoded).
    ///
    /// - Throws: as ``exec()``.
    public func count() throws -> Int {
        let (parsed, _) = try resolved()
        if let limitCount, limitCount < 0 {
            throw StoreError.invalidValue("limit must not be negative, got \(limitCount)")
        }
        if offsetCount < 0 { throw StoreError.invalidValue("offset must not be negative, got \(offsetCount)") }
        let total = try collection.store.documents.count(in: collection.name, matching: parsed, args: args)
        return max(0, min(limitCount ?? Int.max, total - offsetCount))
    }

    /// Removes the selected documents in one transaction (tombstones, replicated).
    ///
    /// - Returns: the removed `_id`s, in result order.
    /// - Throws: as ``exec()``.
    @discardableResult
    public func remove() throws -> [Value] {
        let (parsed, keys) = try resolved()
        return try collection.store.documents.remove(
            in: collection.name, matching: parsed, args: args, sort: keys, limit: limitCount, offset: offsetCount)
    }

    /// Evicts the selected documents in one transaction: local only, no tombstones. While a
    /// subscription still matches them, peers send them back (as in Ditto).
    ///
    /// - Returns: the evicted `_id`s, in result order.
    /// - Throws: as ``exec()``.
    @discardableResult
    public func evict() throws -> [Value] {
        let (parsed, keys) = try resolved()
        return try collection.store.documents.evict(
            in: collection.name, matching: parsed, args: args, sort: keys, limit: limitCount, offset: offsetCount)
    }

    /// Changes the selected documents through ``MutableDocument``s (Ditto's cursor `update`).
    ///
    /// The closure runs synchronously with the documents as they are now; the mutations it
    /// records are applied when it returns, all in one transaction.
    ///
    /// ```swift
    /// let results = try cars.find("Origin == 'Japan'").update { docs in
    ///     for doc in docs { doc["Checked"].set(true) }
    /// }
    /// ```
    ///
    /// - Returns: for every selected document that still exists at commit, its `_id` and the
    ///   results of its mutations (empty when it recorded none).
    /// - Throws: as ``PendingIDSpecificOperation/update(_:)``; nothing is written then.
    /// - Complexity: O(total size of the selected documents) plus the mutations.
    @discardableResult
    public func update(_ body: ([MutableDocument]) throws -> Void) throws -> [Value: [UpdateResult]] {
        let documents = try exec().map(MutableDocument.init(document:))
        defer { for document in documents { document.close() } }
        try body(documents)
        if let error = documents.lazy.compactMap(\.error).first { throw error }
        let results = try collection.store.documents.update(
            documents.map { (id: $0.id, mutations: $0.mutations) }, in: collection.name)
        var out: [Value: [UpdateResult]] = [:]
        for (document, result) in zip(documents, results) {
            if let result { out[document.id] = result }
        }
        return out
    }

    /// Subscribes to the matching documents from peers (replicated here while connected).
    public func subscribe() throws -> Subscription {
        // The canonical text names the subscription, so `a==1` and `a == 1` are one subscription.
        let canonical = try Query(query).description
        return try Subscription(
            engine: collection.store.engine,
            spec: SubscriptionSpec(collection: collection.name, query: canonical, args: args), label: query)
    }
}

/// A subscription to peers' documents; `cancel()` (or dropping it) stops replication of it.
public final class Subscription: Sendable {
    let engine: any SubscriptionService
    public let spec: SubscriptionSpec
    public let label: String
    private let cancelled = LockedFlag()

    init(engine: any SubscriptionService, spec: SubscriptionSpec, label: String) throws {
        self.engine = engine
        self.spec = spec
        self.label = label
        try engine.subscribe(spec)
    }

    public var isCancelled: Bool { cancelled.value }

    public func cancel() {
        guard cancelled.set() else { return }
        engine.unsubscribe(spec)
    }

    deinit { cancel() }
}

final class LockedFlag: Sendable {
    private let flag = Atomic<Bool>(false)
    var value: Bool { flag.load(ordering: .acquiring) }
    /// Sets the flag. - Returns: `true` when this call set it.
    func set() -> Bool { !flag.exchange(true, ordering: .acquiringAndReleasing) }
}
