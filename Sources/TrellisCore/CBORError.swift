/// Why CBOR bytes could not be decoded, and where.
///
/// Every decoding failure carries the byte offset (from the start of the input) of the data item
/// or byte where the problem was found, a ``Code`` to branch on, and a message for people.
/// Decoding never traps: malformed, truncated or hostile input always ends in a `CBORError`.
public struct CBORError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The kind of failure.
    ///
    /// The first group means the bytes are not well-formed CBOR (RFC 8949 §3, Appendix F); the
    /// second that they are well-formed but exceed a decoder limit or break the deterministic
    /// rules; the third that they are valid CBOR with no ``Value`` equivalent.
    public enum Code: String, Hashable, Sendable {
        /// The input ended inside a data item.
        case unexpectedEnd
        /// A string, array or map declares more content than there are bytes left.
        case lengthExceedsInput
        /// Additional information 28, 29 or 30, reserved by RFC 8949 §3.
        case reservedAdditionalInfo
        /// Indefinite length (additional information 31) on an integer or tag.
        case invalidIndefiniteLength
        /// A "break" stop code (0xff) outside an indefinite-length array, map or string, or in
        /// the value position of an indefinite-length map.
        case unexpectedBreak
        /// A chunk of an indefinite-length string that is not a definite-length string of the
        /// same major type.
        case invalidIndefiniteChunk
        /// A two-byte simple value below 32 (RFC 8949 §3.3).
        case invalidSimpleValue
        /// A text string that is not valid UTF-8.
        case invalidUTF8
        /// Bytes remain after the top-level data item.
        case trailingBytes

        /// Arrays, maps and tags nested deeper than ``CBOR/DecodingOptions/maxDepth``.
        case depthLimitExceeded
        /// With ``CBOR/DecodingOptions/requireDeterministic``: an encoding other than RFC 8949
        /// §4.2.1 core deterministic encoding.
        case notDeterministic

        /// An integer outside the `Int64` range (``Value`` only).
        case integerOutOfRange
        /// NaN or ±Infinity (``Value`` only): Trellis stores finite numbers only.
        case nonFiniteNumber
        /// A map key that is not a text string (``Value`` only).
        case nonTextMapKey
        /// The same key (byte for byte) twice in one map (``Value`` only); keys that differ only in
        /// Unicode form ("é" and "e" + U+0301) are two keys.
        case duplicateMapKey
        /// A tagged data item (``Value`` only).
        case unsupportedTag
        /// `undefined` or a simple value other than false, true and null (``Value`` only).
        case unsupportedSimpleValue
    }

    /// The kind of failure.
    public var code: Code
    /// Offset, in bytes from the start of the input, of the item or byte at fault.
    public var offset: Int
    /// What was wrong, for people.
    public var message: String

    /// An error of kind `code` found at byte `offset`, explained by `message`.
    public init(_ code: Code, offset: Int, _ message: String) {
        self.code = code
        self.offset = offset
        self.message = message
    }

    public var description: String {
        "CBOR \(code.rawValue) at byte \(offset): \(message)"
    }
}
