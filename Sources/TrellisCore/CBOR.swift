/// CBOR (RFC 8949) encoding and decoding for Trellis messages and CRDT state.
///
/// Two levels:
/// - ``Value`` ↔ bytes in core deterministic encoding (RFC 8949 §4.2.1): the same value always
///   encodes to the same bytes, whatever order its maps were built in. Types survive bit-exactly:
///   `.int` is major type 0/1, `.double` is always a float (1.0 stays a double, -0.0 keeps its
///   sign), strings keep their UTF-8 bytes (never normalised).
/// - ``CBORItem`` ↔ bytes for any well-formed CBOR (all of RFC 8949 Appendix A), written in
///   preferred serialisation (RFC 8949 §4.1).
///
/// Decoders treat input as hostile: they never trap, reject trailing bytes, bound nesting depth,
/// and check declared lengths against the bytes remaining before allocating.
///
/// ```swift
/// let bytes = CBOR.encode(["name": "Ada", "born": 1815])
/// let value = try CBOR.decode(bytes)
/// ```
public enum CBOR {
    /// Limits and strictness for decoding.
    public struct DecodingOptions: Hashable, Sendable {
        /// How many arrays, maps and tags may enclose one another; deeper input fails with
        /// ``CBORError/Code/depthLimitExceeded``. Decoding recurses once per level, so keep this in
        /// the hundreds (thread stacks are finite).
        public var maxDepth: Int
        /// Reject anything but core deterministic encoding (RFC 8949 §4.2.1): shortest arguments,
        /// definite lengths, floats in their narrowest exact width, map keys in strictly
        /// ascending order of their encoded bytes. Fails with ``CBORError/Code/notDeterministic``.
        public var requireDeterministic: Bool

        /// - Parameters:
        ///   - maxDepth: nesting limit, default ``CBOR/defaultMaxDepth``.
        ///   - requireDeterministic: accept only core deterministic encoding; default `false`.
        public init(maxDepth: Int = CBOR.defaultMaxDepth, requireDeterministic: Bool = false) {
            self.maxDepth = maxDepth
            self.requireDeterministic = requireDeterministic
        }
    }

    /// The default nesting limit for decoding: 256 arrays, maps and tags inside one another.
    public static let defaultMaxDepth = 256

    // MARK: Value

    /// Encodes a value in core deterministic encoding (RFC 8949 §4.2.1).
    ///
    /// `.int` → major type 0 or 1; `.double` → the narrowest float that keeps its bits; `.string`
    /// → text string (UTF-8 bytes as stored); `.bytes` → byte string; `.array` → array; `.map` →
    /// map with text keys sorted by encoded bytes (shorter first, then bytewise); `.null`, `.bool`
    /// → `f6`, `f4`/`f5`.
    ///
    /// Non-finite doubles are written as `f97e00`/`f97c00`/`f9fc00`, which ``decode(_:options:)``
    /// rejects: validate values first (``Value/validate(path:)``).
    ///
    /// - Complexity: O(n + k log k) for n nodes, k the size of the largest map.
    public static func encode(_ value: Value) -> [UInt8] {
        var writer = CBORWriter()
        writer.write(value)
        return writer.bytes
    }

    /// Appends the encoding of `value` to `buffer` (see ``encode(_:)``), reusing its capacity.
    public static func encode(_ value: Value, into buffer: inout [UInt8]) {
        var writer = CBORWriter(appendingTo: buffer)
        buffer = []  // The writer now owns the only reference: appends do not copy.
        writer.write(value)
        buffer = writer.bytes
    }

    /// Decodes exactly one CBOR data item as a value.
    ///
    /// Accepts any well-formed encoding of a value (indefinite lengths and non-shortest forms too,
    /// unless `options.requireDeterministic`). Any float width decodes to `.double`.
    ///
    /// - Parameters:
    ///   - bytes: one complete data item, nothing after it.
    ///   - options: depth limit and strictness.
    /// - Throws: ``CBORError`` with the offset and a ``CBORError/Code``: malformed or truncated
    ///   input, trailing bytes, nesting too deep, invalid UTF-8, and for CBOR that has no value
    ///   equivalent: integers outside `Int64` (``CBORError/Code/integerOutOfRange``), NaN and
    ///   ±Infinity (``CBORError/Code/nonFiniteNumber``), non-text map keys, duplicate keys, tags,
    ///   `undefined` and other simple values.
    /// - Complexity: O(n) in the input size (plus hashing map keys).
    public static func decode(
        _ bytes: [UInt8], options: DecodingOptions = DecodingOptions()
    ) throws(CBORError) -> Value {
        var reader = CBORReader(bytes, options: options)
        let value = try reader.readValue(depth: 0)
        try reader.expectEnd()
        return value
    }

    /// The two integers of a CBOR array of two integers that starts at `offset` and ends the
    /// bytes, read without building a ``Value``: a stored stamp `[time, site]`.
    ///
    /// - Returns: `nil` when a well-formed item there is not such an array.
    /// - Throws: ``CBORError`` as ``decode(_:options:)`` would for the bytes from `offset`:
    ///   malformed or truncated input, an integer outside `Int64`, trailing bytes.
    /// - Complexity: O(1).
    public static func decodeIntegerPair(_ bytes: [UInt8], from offset: Int) throws(CBORError) -> (Int64, Int64)? {
        var reader = CBORReader(bytes, options: DecodingOptions(), from: offset)
        let head = try reader.readHead()
        guard head.major == 4, head.isIndefinite || head.argument == 2 else { return nil }
        guard case .int(let first) = try reader.readValue(depth: 1),
            case .int(let second) = try reader.readValue(depth: 1)
        else { return nil }
        if head.isIndefinite, !reader.consumeBreak() { return nil }
        try reader.expectEnd()
        return (first, second)
    }

    // MARK: CBORItem

    /// Encodes an item in preferred serialisation (RFC 8949 §4.1): shortest arguments, definite
    /// lengths, floats in the narrowest width that keeps their bits (NaN `f97e00`, ±Infinity
    /// `f97c00`/`f9fc00`), map pairs in the item's order.
    public static func encodeItem(_ item: CBORItem) -> [UInt8] {
        var writer = CBORWriter()
        writer.write(item)
        return writer.bytes
    }

    /// Decodes exactly one well-formed CBOR data item (RFC 8949 §3).
    ///
    /// Indefinite-length strings, arrays and maps become their definite equivalents; floats keep
    /// the width they were read in; map pairs keep their order, duplicates included.
    ///
    /// - Parameters:
    ///   - bytes: one complete data item, nothing after it.
    ///   - options: depth limit and strictness.
    /// - Throws: ``CBORError`` for malformed or truncated input, trailing bytes, nesting deeper
    ///   than `options.maxDepth`, and text strings that are not valid UTF-8.
    /// - Complexity: O(n) in the input size.
    public static func decodeItem(
        _ bytes: [UInt8], options: DecodingOptions = DecodingOptions()
    ) throws(CBORError) -> CBORItem {
        var reader = CBORReader(bytes, options: options)
        let item = try reader.readItem(depth: 0)
        try reader.expectEnd()
        return item
    }
}
