// The single-write form of a document state (docs/PROTOCOL.md §3, "Single-write form").
//
//   single = { "j": text,              the document's JSON (canonical, `_id` included)
//              "u": [time, site] }     the stamp of the one write that made every field
//
// Most documents are written once and never changed: every field then carries the same stamp and
// the state is `DocumentState(fields:stamp:)` of the document's own fields. Stores keep such a
// document as its JSON plus that stamp, and send it the same way, so neither side builds, encodes
// or decodes the per-field state to move it.

/// A document state made by one write of every field into nothing: the document's JSON and the
/// write's stamp. Its state is ``DocumentState/init(fields:stamp:)`` of the JSON's fields other
/// than `_id`.
public struct SingleWriteState: Sendable, Equatable {
    /// The stamp of the write.
    public var stamp: Stamp
    /// The document's canonical JSON (``JSON/string(_:)``), `_id` included.
    public var json: String

    public init(stamp: Stamp, json: String) {
        self.stamp = stamp
        self.json = json
    }

    /// The encoded form: a CBOR map `{"j": json, "u": [time, site]}` (times and sites as the Int64
    /// bit patterns of their UInt64 values, as in every state encoding).
    ///
    /// - Complexity: O(size of the JSON): one copy.
    public func encoded() -> [UInt8] {
        var w = CBORWriter()
        w.writeMapHeader(count: 2)
        w.writeText("j")
        w.writeText(json)
        w.writeText("u")
        w.writeArrayHeader(count: 2)
        w.writeInt(Int64(bitPattern: stamp.time.rawValue))
        w.writeInt(Int64(bitPattern: stamp.site))
        return w.bytes
    }

    /// Whether `bytes` hold the single-write form (checked by its first bytes only: `{"j": ...`).
    public static func isEncoded(_ bytes: [UInt8]) -> Bool { bytes.starts(with: [0xA2, 0x61, 0x6A]) }

    /// Reads the single-write form.
    ///
    /// - Returns: `nil` when `bytes` are not in this form (another state encoding).
    /// - Throws: ``DocumentStateError`` when they start as this form but are malformed: not
    ///   exactly the two entries, a stamp that is not two integers, or trailing bytes.
    /// - Complexity: O(size of the JSON).
    public static func decode(_ bytes: [UInt8]) throws(DocumentStateError) -> SingleWriteState? {
        guard isEncoded(bytes) else { return nil }
        if let exact = canonical(bytes) { return exact }
        let value: Value
        do { value = try CBOR.decode(bytes) } catch {
            throw DocumentStateError(message: "single-write state does not decode: \(error)")
        }
        guard case .map(let m) = value, m.count == 2, case .string(let json)? = m["j"],
            case .array(let parts)? = m["u"], parts.count == 2, case .int(let time) = parts[0],
            case .int(let site) = parts[1]
        else {
            throw DocumentStateError(
                message: "malformed single-write state: expected {\"j\": text, \"u\": [time, site]}")
        }
        return SingleWriteState(
            stamp: Stamp(time: HLCTimestamp(rawValue: UInt64(bitPattern: time)), site: SiteID(bitPattern: site)),
            json: json)
    }

    /// Reads `bytes` when they are exactly what ``encoded()`` writes (the case of every state a
    /// Trellis peer sends), without building the generic CBOR value; `nil` for anything else,
    /// which ``decode(_:)`` then reads the general way.
    private static func canonical(_ bytes: [UInt8]) -> SingleWriteState? {
        // Deterministic: every head in its shortest form and every length definite, which is how
        // ``encoded()`` writes them; so bytes that read as the two entries below are exactly its
        // output, with no second encoding to compare against.
        var reader = CBORReader(bytes, options: CBOR.DecodingOptions(requireDeterministic: true))
        func text() -> String? {
            guard let head = try? reader.readHead(), head.major == 3 else { return nil }
            return try? reader.readText(head)
        }
        func int() -> Int64? {
            guard let head = try? reader.readHead(), head.major <= 1, head.argument <= UInt64(Int64.max) else {
                return nil
            }
            return head.major == 0 ? Int64(head.argument) : -1 - Int64(head.argument)
        }
        guard let map = try? reader.readHead(), map.major == 5, map.argument == 2, text() == "j", let json = text(),
            text() == "u",
            let parts = try? reader.readHead(), parts.major == 4, parts.argument == 2, let time = int(),
            let site = int(), reader.remaining == 0
        else { return nil }
        // Any other spelling of the same content (a longer head, say) failed above and is left to
        // the general reader.
        return SingleWriteState(
            stamp: Stamp(time: HLCTimestamp(rawValue: UInt64(bitPattern: time)), site: SiteID(bitPattern: site)),
            json: json)
    }

    /// A document read from its JSON: the materialised document (with `_id`), its fields without
    /// `_id`, and its canonical JSON.
    public typealias Document = (value: Value, fields: UTF8Map<Value>, json: String)

    /// The document: its JSON parsed, checked and written again canonically.
    ///
    /// - Parameter id: the `_id` the document must carry, when known (a peer names the document
    ///   beside its state).
    /// - Returns: the materialised document (with `_id`), its fields without `_id`, and its
    ///   canonical JSON (equal to ``json`` for what Trellis writes).
    /// - Throws: ``DocumentStateError`` when the JSON does not parse, is not a map, has no `_id`
    ///   or another one than `id`, or holds a value a document cannot hold (``Value/validate(path:)``).
    /// - Complexity: O(size of the JSON).
    public func document(id: Value? = nil) throws(DocumentStateError) -> Document {
        let value: Value
        do { value = try JSON.parse(json) } catch {
            throw DocumentStateError(message: "single-write state: its JSON does not parse: \(error)")
        }
        guard case .map(var fields) = value else {
            throw DocumentStateError(message: "single-write state: its JSON is \(value.typeName), not a map")
        }
        guard let stored = fields.removeValue(forKey: "_id") else {
            throw DocumentStateError(message: "single-write state: its JSON has no _id")
        }
        if let id, stored != id {
            throw DocumentStateError(
                message: "single-write state: its JSON has _id \(JSON.string(stored)), not \(JSON.string(id))")
        }
        do { try value.validate() } catch {
            throw DocumentStateError(message: "single-write state: \(error)")
        }
        return (value, fields, JSON.string(value))
    }

    /// The full state: ``DocumentState/init(fields:stamp:)`` of the document's fields.
    ///
    /// - Throws: as ``document(id:)``.
    public func state(id: Value? = nil) throws(DocumentStateError) -> DocumentState {
        DocumentState(fields: try document(id: id).fields, stamp: stamp)
    }
}

extension DocumentState {
    /// Decodes a state from any of its encoded forms: ``cbor()`` (encoding version 1 or 2) or
    /// ``SingleWriteState/encoded()``.
    ///
    /// - Parameter id: the document's `_id` when known: a single-write form must carry that one.
    /// - Throws: ``DocumentStateError`` naming what is malformed (CBOR errors are reported as such).
    /// - Complexity: O(size of the state).
    public init(bytes: [UInt8], id: Value? = nil) throws(DocumentStateError) {
        if let single = try SingleWriteState.decode(bytes) {
            self = try single.state(id: id)
            return
        }
        let value: Value
        do { value = try CBOR.decode(bytes) } catch {
            throw DocumentStateError(message: "document state does not decode: \(error)")
        }
        try self.init(encoded: value)
    }
}
