public import Foundation

/// Conversion between JSON text and ``Value``.
///
/// Parsing is strict RFC 8259 over UTF-8 (the rules are listed on the `UnsafeRawBufferPointer`
/// overload of `parse`) and keeps the spelling of numbers: an integer literal (no fraction, no
/// exponent) that fits in `Int64` becomes `.int`, every other number a correctly rounded
/// `.double` (so `1.0` stays a double). Writing emits doubles so that they read back as the same
/// doubles, bit for bit (`1.0`, `-0.0`, `1e+100`). Bytes are written as `{"$bytes": "<base64>"}`,
/// the same shape parsing turns back into `.bytes`.
public enum JSON {
    /// How deeply arrays and objects may nest in parsed text; deeper input is rejected.
    public static let maximumDepth = 512

    /// Parses one JSON text (any top-level value).
    ///
    /// - Throws: ``JSONError`` naming the byte offset (in the text's UTF-8) and what was expected.
    /// - Complexity: O(n) in the length of the text, plus O(k log k) for each object of k
    ///   members whose keys do not come in byte order.
    public static func parse(_ text: String) throws(JSONError) -> Value {
        let result = text.utf8.withContiguousStorageIfAvailable { buffer in
            catching { () throws(JSONError) in try JSONParser.parse(UnsafeRawBufferPointer(buffer)) }
        }
        if let result { return try result.get() }
        return try parse(Array(text.utf8))
    }

    /// Parses one JSON text from UTF-8 bytes.
    public static func parse(_ data: Data) throws(JSONError) -> Value {
        try data.withUnsafeBytes { buffer in
            catching { () throws(JSONError) in try JSONParser.parse(buffer) }
        }.get()
    }

    /// Parses one JSON text from UTF-8 bytes.
    public static func parse(_ bytes: [UInt8]) throws(JSONError) -> Value {
        try bytes.withUnsafeBytes { buffer in
            catching { () throws(JSONError) in try JSONParser.parse(buffer) }
        }.get()
    }

    /// Parses one JSON text (RFC 8259) from UTF-8 bytes in memory the caller owns.
    ///
    /// Accepted: any value at the top level, surrounded by optional whitespace (space, tab, line
    /// feed, carriage return) and optionally preceded by a UTF-8 byte order mark. Strings must be
    /// well-formed UTF-8 without raw control characters; escapes are `\" \\ \/ \b \f \n \r \t`
    /// and `\uXXXX`, where a surrogate must be part of a pair. Numbers follow the RFC's grammar
    /// (no leading zeros, `+`, `.5`, `1.`, `NaN` or `Infinity`). Keys are byte strings: in an
    /// object a key repeated byte for byte replaces the earlier member's value, while two spellings
    /// of the same text in different Unicode forms are two keys. `{"$bytes": "<base64>"}` with
    /// exactly that one key and valid padded base64 is `.bytes`. Not accepted: trailing commas,
    /// comments, single quotes, and text in UTF-16 or UTF-32 (RFC 8259 §8.1 requires UTF-8
    /// between systems).
    ///
    /// - Parameter buffer: the text; read only during the call.
    /// - Returns: the value; integer literals that fit are `.int`, other numbers `.double`
    ///   (correctly rounded; an integer literal beyond `Int64` becomes the double nearest to it).
    /// - Throws: ``JSONError`` with a message such as `expected ',' or '}' at offset 17`, for
    ///   malformed text, invalid UTF-8, a number whose magnitude is beyond `Double` ("number out
    ///   of range"), or nesting deeper than ``maximumDepth``. No input traps.
    /// - Complexity: O(n) in the length of the text.
    public static func parse(_ buffer: UnsafeRawBufferPointer) throws(JSONError) -> Value {
        try JSONParser.parse(buffer)
    }

    /// The bytes between the quotes of `text` when it is one string literal that
    /// ``parse(_:)-(UnsafeRawBufferPointer)`` reads as exactly those bytes (no escapes, control
    /// characters or surrounding whitespace; well-formed UTF-8): what the stored `_id` key of a
    /// string `_id` is. `nil` for any other text, which may still parse.
    ///
    /// - Parameter text: the text; the result points into it.
    /// - Complexity: O(n), one pass plus UTF-8 validation; no allocation.
    package static func plainStringContent(_ text: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer? {
        JSONParser.plainStringContent(text)
    }

    private static func catching(_ body: () throws(JSONError) -> Value) -> Result<Value, JSONError> {
        do throws(JSONError) {
            return .success(try body())
        } catch {
            return .failure(error)
        }
    }

    /// Writes a value as compact JSON with map keys in byte-wise order of their UTF-8 (the order
    /// ``UTF8Map`` keeps), so the same value always gives the same text.
    ///
    /// Strings escape only `"`, `\` and U+0000–U+001F (as `\"` `\\` `\n` `\r` `\t` or `\u00xx`);
    /// doubles are spelled by ``formatDouble(_:)``. Keys are written as they are, never
    /// normalised: `{"é": 1, "e\u{301}": 2}` keeps both.
    ///
    /// - Complexity: O(n) in the size of the value.
    public static func string(_ value: Value) -> String {
        String(decoding: bytes(value), as: UTF8.self)
    }

    /// The UTF-8 bytes of ``string(_:)``, without making a `String`.
    ///
    /// - Complexity: O(n) in the size of the value.
    public static func bytes(_ value: Value) -> [UInt8] {
        var writer = JSONWriter()
        writer.write(value)
        return writer.output
    }

    /// The shortest text that reads back as the same double and is never mistaken for an int.
    ///
    /// Swift's shortest round-trip description (`1.0`, `-0.0`, `0.1`, `1e-07`, `1e+100`), with
    /// `.0` appended when it has neither a `.` nor an exponent; `null` for NaN and ±Infinity.
    static func formatDouble(_ d: Double) -> String {
        guard d.isFinite else { return "null" }
        var s = d.description
        if !s.utf8.contains(where: { $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "e") || $0 == UInt8(ascii: "E") }) {
            s += ".0"
        }
        return s
    }
}

/// JSON text that could not be parsed.
public struct JSONError: Error, Equatable, Sendable, CustomStringConvertible {
    public var message: String
    public init(message: String) { self.message = message }
    public var description: String { "invalid JSON: \(message)" }
}
