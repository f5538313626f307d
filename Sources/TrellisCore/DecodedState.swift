/// A remote document state decoded and checked ahead of its merge: off the store lock, and in a
/// running node on the link's reader thread, so that parsing a batch overlaps merging the one
/// before it (docs/ARCHITECTURE.md, "TrellisSync").
public struct DecodedState: Sendable {
    public enum Form: Sendable {
        /// The single-write form. `parsed` is `nil` when its JSON is already canonical, storable
        /// and carries the document's `_id` (``CanonicalJSON``): it is then stored as it came and
        /// parsed only if something needs its value; otherwise it holds the document parsed,
        /// checked and written canonically.
        case single(SingleWriteState, parsed: SingleWriteState.Document?)
        /// A whole state.
        case whole(DocumentState)
        /// A delta (``StateDelta``): applied only to a state that covers its base.
        case delta(StateDelta)
    }

    /// What the bytes hold, or why they do not decode.
    public let form: Result<Form, DocumentStateError>
    /// The document's `_id`.
    public let id: Value
    /// Whether the bytes are in the delta form (``StateDelta/isEncoded(_:)``), decoded or not: a
    /// delta that cannot be applied is never kept aside, its whole state is asked for instead.
    public let isDelta: Bool
    /// The document key `id` names (``Value/documentKey``), or `nil` when it names none (the
    /// merge rejects the document).
    public let key: String?
    /// What a replicator's echo memory keeps of these bytes: the digest a delta names of the
    /// sender's whole state after it (``StateDelta/digest(in:)``), else the bytes' own
    /// (``StateDigest/init(_:)``).
    public let echoDigest: StateDigest

    /// Whether the state may hold a live document: not a whole state of a tombstone, nor bytes
    /// that do not decode (a delta or a single write may).
    public var mayBeLive: Bool {
        switch form {
        case .success(.whole(let state)): !state.isDeleted
        case .success(.single), .success(.delta): true
        case .failure: false
        }
    }

    /// Decodes `bytes`, the state of the document `id` (every form: docs/PROTOCOL.md §3).
    ///
    /// - Complexity: O(size of the state); a canonical single-write state builds no ``Value``.
    public init(_ bytes: [UInt8], id: Value) {
        self.id = id
        key = id.documentKey
        isDelta = StateDelta.isEncoded(bytes)
        echoDigest = Self.echoDigest(of: bytes)
        do {
            if isDelta {
                form = .success(.delta(try StateDelta(bytes: bytes)))
            } else if let single = try SingleWriteState.decode(bytes) {
                if let key, CanonicalJSON.isDocument(single.json, idKey: key) {
                    form = .success(.single(single, parsed: nil))
                } else {
                    form = .success(.single(single, parsed: try single.document(id: id)))
                }
            } else {
                form = .success(.whole(try DocumentState(bytes: bytes, id: id)))
            }
        } catch {
            form = .failure(error)
        }
    }

    /// What a replicator's echo memory keeps of the state `bytes` (``echoDigest``).
    ///
    /// - Complexity: O(size of the state).
    public static func echoDigest(of bytes: [UInt8]) -> StateDigest {
        StateDelta.digest(in: bytes) ?? StateDigest(bytes)
    }

    /// The single-write document parsed: what `.single` holds, or its JSON parsed now.
    ///
    /// - Throws: what ``SingleWriteState/document(id:)`` throws; never for JSON that
    ///   ``CanonicalJSON`` accepted (the JSON fuzz target checks that promise), but a merge treats
    ///   it as any state that does not decode rather than trusting it.
    public static func document(_ single: SingleWriteState, _ parsed: SingleWriteState.Document?, id: Value)
        throws(DocumentStateError) -> SingleWriteState.Document
    {
        if let parsed { return parsed }
        return try single.document(id: id)
    }

    /// The whole state (of a delta: the delta's own state, which is not the document's).
    ///
    /// - Throws: the decoding error.
    public func state() throws(DocumentStateError) -> DocumentState {
        switch form {
        case .success(.single(let single, let parsed)):
            return DocumentState(fields: try Self.document(single, parsed, id: id).fields, stamp: single.stamp)
        case .success(.whole(let state)): return state
        case .success(.delta(let delta)): return delta.state
        case .failure(let error): throw error
        }
    }
}
