public import Dispatch
import Foundation
import Synchronization
@_exported public import TrellisCore
public import TrellisStore
import TrellisSync

/// A document as returned by queries: its `_id` and its value (a map including `_id`).
public struct Document: Sendable, Hashable, CustomStringConvertible {
    public let id: Value
    public let value: Value

    public init(value: Value) {
        self.value = value
        self.id = value["_id"] ?? .null
    }

    /// A top-level field, or `nil` when absent.
    public subscript(key: String) -> Value? { value[key] }

    /// The document as compact JSON with sorted keys.
    public var json: String { JSON.string(value) }

    public var description: String { json }
}

/// The local store, shaped like Ditto's `DittoStore`: `store.collection("cars")`.
public final class Store: Sendable {
    /// The underlying SQLite document store.
    public let documents: DocumentStore
    let engine: SyncEngine

    init(documents: DocumentStore, engine: SyncEngine) {
        self.documents = documents
        self.engine = engine
    }

    /// A collection by name (created on first write).
    public func collection(_ name: String) -> Collection {
        Collection(name: name, store: self)
    }
}

/// A collection of documents (Ditto's `DittoCollection`).
public struct Collection: Sendable {
    public let name: String
    let store: Store

    /// Inserts or merges a document; every given field is written (Ditto's `merge` strategy).
    ///
    /// - Parameter document: a map; `_id` (string or map) is generated as a UUID string when absent.
    /// - Returns: the document's `_id`.
    /// - Throws: ``StoreError`` for a non-map, a bad `_id`, NaN/Infinity, or an oversized document.
    @discardableResult
    public func upsert(_ document: Value) throws -> Value {
        try store.documents.upsert(document, in: name)
    }

    /// Upserts many documents in one transaction.
    @discardableResult
    public func upsert(_ documents: [Value]) throws -> [Value] {
        try store.documents.upsert(documents, in: name)
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
    public func find(_ query: String, args: [String: Value] = [:]) -> PendingCursorOperation {
        PendingCursorOperation(collection: self, query: query, args: args)
    }

    /// Every document of the collection.
    public func findAll() -> PendingCursorOperation {
        PendingCursorOperation(collection: self, query: "true", args: [:])
    }
}

/// An operation on one document, run by its methods (Ditto's `DittoPendingIDSpecificOperation`).
public struct PendingIDSpecificOperation: Sendable {
    public let collection: Collection
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
public struct PendingCursorOperation: Sendable {
    public let collection: Collection
    public let query: String
    public let args: [String: Value]

    /// The matching documents, ordered by `_id`.
    ///
    /// - Throws: ``QueryParseError`` when the query does not parse, or evaluation errors
    ///   (a missing `$args` value).
    /// - Complexity: O(n) in the collection's documents.
    public func exec() throws -> [Document] {
        try collection.store.documents.documents(in: collection.name, matching: Query(query), args: args)
            .map(Document.init(value:))
    }

    /// Removes every matching document.
    ///
    /// - Returns: the removed `_id`s.
    @discardableResult
    public func remove() throws -> [Value] {
        var removed: [Value] = []
        for document in try exec() where try collection.store.documents.remove(id: document.id, in: collection.name) {
            removed.append(document.id)
        }
        return removed
    }

    /// Subscribes to the matching documents from peers (replicated here while connected).
    public func subscribe() throws -> Subscription {
        try Subscription(
            engine: collection.store.engine,
            spec: SubscriptionSpec(collection: collection.name, query: query, args: args), label: query)
    }

    /// Calls `handler` with the current results now and after every commit that touches the
    /// collection, on `queue` (a dedicated serial queue by default: on Linux nothing drains the main
    /// queue unless the program runs `dispatchMain()`).
    ///
    /// - Returns: a ``LiveQuery``; keep it, `stop()` ends the callbacks.
    public func observeLocal(
        deliverOn queue: DispatchQueue = DispatchQueue(label: "trellis.live-query"),
        _ handler: @escaping @Sendable ([Document]) -> Void
    ) throws -> LiveQuery {
        _ = try Query(query)
        let operation = self
        let documents = collection.store.documents
        let name = collection.name
        let live = LiveQuery(documents: documents)
        let deliver: @Sendable () -> Void = { [weak live] in
            guard let live, !live.isStopped else { return }
            guard let results = try? operation.exec() else { return }
            queue.async {
                guard !live.isStopped else { return }
                handler(results)
            }
        }
        let evaluation = DispatchQueue(label: "trellis.live-query.eval")
        live.token = documents.addObserver { event in
            if event.collections.contains(name) { evaluation.async(execute: deliver) }
        }
        evaluation.async(execute: deliver)
        return live
    }
}

/// A running local observer; `stop()` (or dropping it) ends its callbacks.
public final class LiveQuery: @unchecked Sendable {
    // Invariant: `token` is set once right after init, before the object is shared.
    let documents: DocumentStore
    var token: UInt64?
    private let stopped = LockedFlag()

    init(documents: DocumentStore) { self.documents = documents }

    public var isStopped: Bool { stopped.value }

    public func stop() {
        guard stopped.set() else { return }
        if let token { documents.removeObserver(token) }
    }

    deinit { stop() }
}

/// A subscription to peers' documents; `cancel()` (or dropping it) stops replication of it.
public final class Subscription: Sendable {
    let engine: SyncEngine
    public let spec: SubscriptionSpec
    public let label: String
    private let cancelled = LockedFlag()

    init(engine: SyncEngine, spec: SubscriptionSpec, label: String) throws {
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
