public import TrellisStore

/// How ``TrellisCollection/upsert(_:writeStrategy:)`` treats an existing document (Ditto's
/// `DittoWriteStrategy`); see ``TrellisStore/WriteStrategy``.
public typealias WriteStrategy = TrellisStore.WriteStrategy
/// The direction of a sort key (Ditto's `DittoSortDirection`): `.ascending` or `.descending`.
public typealias SortDirection = TrellisStore.SortDirection
/// What one mutation of an `update` did (Ditto's `DittoUpdateResult`): `.set(docID:path:value:)`,
/// `.removed(docID:path:)` or `.incremented(docID:path:amount:)`.
public typealias UpdateResult = TrellisStore.UpdateResult
/// The error thrown by store operations (a bad `_id`, `_id` changed, NaN, size limit, …).
public typealias StoreError = TrellisStore.StoreError

/// A document being changed inside an `update` closure (Ditto's `DittoMutableDocument`).
///
/// Subscript by key, then by key or array index, and call ``MutableDocumentPath/set(_:isDefault:)``,
/// ``MutableDocumentPath/remove()`` or ``MutableDocumentPath/increment(by:)``. Each call is
/// recorded and shows at once in ``value`` (reads see earlier changes); the recorded mutations
/// are applied in one transaction when the closure returns. Recording after the closure returned
/// has no effect.
///
/// Not thread-safe: use it only inside the closure, on the closure's thread.
public final class MutableDocument {
    /// The document's `_id` (immutable).
    public let id: Value
    /// The document as it is now plus the mutations recorded so far.
    public private(set) var value: Value
    /// The mutations recorded so far, in order.
    private(set) var mutations: [DocumentMutation] = []
    /// The first recording that failed (an `_id` change, an index out of range, …); `update`
    /// throws it and writes nothing.
    public private(set) var error: (any Error)?
    private var closed = false

    init(document: Document) {
        id = document.id
        value = document.value
    }

    /// The top-level field `key`.
    public subscript(key: String) -> MutableDocumentPath {
        MutableDocumentPath(document: self, path: FieldPath(components: [.key(key)]))
    }

    /// Records a mutation, applying it to ``value``; the first failure is kept in ``error`` and
    /// later mutations are ignored.
    func record(_ mutation: DocumentMutation) {
        guard !closed, error == nil else { return }
        do {
            try mutation.apply(to: &value)
            mutations.append(mutation)
        } catch {
            self.error = error
        }
    }

    /// Records a failure that is not a mutation (a Swift value a document cannot hold): `update`
    /// throws it, unless an earlier failure is kept.
    func fail(_ failure: any Error) {
        guard !closed, error == nil else { return }
        error = failure
    }

    /// Ends recording (the closure returned).
    func close() { closed = true }
}

/// A path inside a ``MutableDocument`` (Ditto's `DittoMutableDocumentPath`): read it, go deeper,
/// or record a change.
public struct MutableDocumentPath {
    let document: MutableDocument
    /// The field path from the document root.
    public let path: FieldPath

    /// The map entry `key` below this path.
    public subscript(key: String) -> MutableDocumentPath {
        MutableDocumentPath(document: document, path: FieldPath(components: path.components + [.key(key)]))
    }

    /// The array element `index` below this path. Setting it replaces the element in the whole
    /// array (arrays are last-writer-wins registers); the index must be in range.
    public subscript(index: Int) -> MutableDocumentPath {
        MutableDocumentPath(document: document, path: FieldPath(components: path.components + [.index(index)]))
    }

    /// The value here, including changes recorded so far; `nil` when absent.
    public var value: Value? { document.value.value(at: path) }
    /// The value as a string, or `nil`.
    public var string: String? { value?.stringValue }
    /// The value as an integer when it is an `.int`, or `nil`.
    public var int: Int64? { value?.intValue }
    /// The value as a `Double` when it is a number (`.int` or `.double`), or `nil`.
    public var double: Double? { value?.numberValue }
    /// The value as a boolean, or `nil`.
    public var bool: Bool? {
        if case .bool(let b)? = value { return b }
        return nil
    }

    /// Sets the field to `value`, replacing what it held (a map replaces the map; missing maps on
    /// the way are created).
    ///
    /// - Parameter isDefault: write *default data*: stamped with HLC time zero, so any real write
    ///   to the field on any node wins over it; written only when the field is absent locally
    ///   (Ditto's `isDefault`).
    public func set(_ value: Value, isDefault: Bool = false) {
        document.record(.set(path, value, isDefault: isDefault))
    }

    /// Removes the field (observed-remove: a concurrent write elsewhere survives); inside an
    /// array, removes the element. Removing a missing field does nothing.
    public func remove() {
        document.record(.unset(path))
    }

    /// Adds `amount` to the counter here: increments from every node add up when they merge.
    /// A missing field starts at 0, a number starts from its value. `amount` is an `.int` or a
    /// finite `.double`; a counter stays an exact int while every increment is an int
    /// (`increment(by: 1)` passes an int).
    public func increment(by amount: Value) {
        document.record(.increment(path, amount))
    }

    /// Adds a `Double` amount to the counter here (the counter becomes a double); see
    /// ``increment(by:)-(Value)``.
    @_disfavoredOverload
    public func increment(by amount: Double) {
        document.record(.increment(path, .double(amount)))
    }
}

extension FieldPath {
    /// Parses a field path as queries write it (docs/QUERIES.md): `a.b[2].c`, with backticks
    /// around keys that are not identifiers (``"`odd key`.x"``, ``"`true`"``, ``"`$args`.x"``).
    ///
    /// - Throws: ``StoreError/invalidValue(_:)`` naming the text and the problem, also for text
    ///   that is a literal or an `$args` reference rather than a field.
    public init(querySyntax text: String) throws(StoreError) {
        let query: Query
        do { query = try Query("\(text) == null") } catch {
            throw .invalidValue("bad field path '\(text)': \(error)")
        }
        guard case .compare(.field(let path), .equal, .literal(.null)) = query.predicate else {
            throw .invalidValue("bad field path '\(text)': expected a field like a.b[2] or `odd key`")
        }
        self = path
    }

    static func parse(_ text: String) throws(StoreError) -> FieldPath {
        try FieldPath(querySyntax: text)
    }
}
