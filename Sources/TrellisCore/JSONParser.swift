internal import Foundation

/// A strict RFC 8259 parser that builds a ``Value`` straight from UTF-8 bytes.
///
/// The parser is iterative: open arrays and objects live on an explicit stack (``frames``) and
/// their finished members on a flat value stack, so hostile nesting can never overflow the
/// thread's stack; nesting deeper than ``JSON/maximumDepth`` is an error. Every read is checked
/// against the end of the input, and no input traps.
///
/// What it accepts (RFC 8259):
/// - whitespace: space, tab, line feed, carriage return; a leading UTF-8 byte order mark is
///   skipped (§8.1 allows this; Foundation's `JSONSerialization` did the same);
/// - `null`, `true`, `false`, strings, numbers, arrays and objects, any of them at the top level;
/// - strings: the escapes `\" \\ \/ \b \f \n \r \t \uXXXX` (a UTF-16 surrogate pair in two
///   `\u` escapes is one scalar; a lone surrogate is an error), no raw control characters, and
///   only well-formed UTF-8 (RFC 3629: no overlong forms, no encoded surrogates, nothing above
///   U+10FFFF), which is never repaired;
/// - numbers: `-? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)?`, nothing else.
struct JSONParser {
    /// One open array or object.
    private struct Frame {
        /// `true` for an object, `false` for an array.
        var isObject: Bool
        /// Where this container's members start in ``values``.
        var valueStart: Int
        /// Where this object's keys start in ``keys``.
        var keyStart: Int
    }

    private let input: UnsafeRawBufferPointer
    private let end: Int
    private var position = 0
    /// Members of the open containers, innermost last.
    private var values: [Value] = []
    /// Keys of the open objects, innermost last; `keys[k]` names `values[k - keyStart + valueStart]`.
    private var keys: [String] = []
    private var frames: [Frame] = []
    /// Bytes of the string being unescaped.
    private var scratch: [UInt8] = []

    private init(_ input: UnsafeRawBufferPointer) {
        self.input = input
        self.end = input.count
    }

    /// Parses exactly one JSON text from `input`.
    static func parse(_ input: UnsafeRawBufferPointer) throws(JSONError) -> Value {
        if let text = plainString(input) { return .string(text) }
        var parser = JSONParser(input)
        return try parser.parseDocument()
    }

    /// The content of a text that is one string literal without escapes, control characters or
    /// surrounding whitespace (every stored `_id` key of a string `_id`), read without the
    /// parser's stacks; `nil` for any other text, including invalid UTF-8, which the parser then
    /// reports.
    ///
    /// - Complexity: O(n), one pass plus UTF-8 validation.
    private static func plainString(_ input: UnsafeRawBufferPointer) -> String? {
        plainStringContent(input).map { String(decoding: $0, as: UTF8.self) }
    }

    /// The bytes between the quotes of a text that ``plainString(_:)`` reads: those of the
    /// string the text parses as, well-formed UTF-8; `nil` for any other text.
    ///
    /// - Complexity: O(n), one pass plus UTF-8 validation; no allocation.
    static func plainStringContent(_ input: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer? {
        let n = input.count
        guard n >= 2, input[0] == quote, input[n - 1] == quote else { return nil }
        var i = 1
        while i < n - 1 {
            let b = input[i]
            if b < 0x80 {
                if b == quote || b == backslash || b < 0x20 { return nil }
                i += 1
            } else {
                // Well-formed UTF-8 checked here, so decoding the content repairs nothing.
                guard let length = UTF8Check.sequenceLength(input, at: i), i + length < n else { return nil }
                i += length
            }
        }
        return UnsafeRawBufferPointer(rebasing: input[1..<(n - 1)])
    }

    // MARK: Bytes

    private static let quote = UInt8(ascii: "\"")
    private static let backslash = UInt8(ascii: "\\")

    @inline(__always)
    private func byte(_ offset: Int) -> UInt8 {
        input[offset]
    }

    private func fail(_ message: String, at offset: Int) -> JSONError {
        JSONError(message: "\(message) at offset \(offset)")
    }

    private func expected(_ what: String, at offset: Int) -> JSONError {
        fail("expected \(what)", at: offset)
    }

    @inline(__always)
    private mutating func skipWhitespace() {
        while position < end {
            switch byte(position) {
            case 0x20, 0x0A, 0x0D, 0x09: position += 1
            default: return
            }
        }
    }

    // MARK: Structure

    private mutating func parseDocument() throws(JSONError) -> Value {
        if end >= 3 && byte(0) == 0xEF && byte(1) == 0xBB && byte(2) == 0xBF { position = 3 }
        skipWhitespace()
        values.reserveCapacity(16)
        parsing: while true {
            // A value starts here.
            guard position < end else { throw expected("a value", at: position) }
            switch byte(position) {
            case UInt8(ascii: "{"):
                try checkDepth()
                position += 1
                skipWhitespace()
                if position < end && byte(position) == UInt8(ascii: "}") {
                    position += 1
                    values.append(.map([:]))
                } else {
                    if keys.capacity == 0 { keys.reserveCapacity(16) }
                    frames.append(Frame(isObject: true, valueStart: values.count, keyStart: keys.count))
                    try parseKey(expecting: "a string key or '}'")
                    continue parsing
                }
            case UInt8(ascii: "["):
                try checkDepth()
                position += 1
                skipWhitespace()
                if position < end && byte(position) == UInt8(ascii: "]") {
                    position += 1
                    values.append(.array([]))
                } else {
                    frames.append(Frame(isObject: false, valueStart: values.count, keyStart: keys.count))
                    continue parsing
                }
            case Self.quote:
                values.append(.string(try parseString()))
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                values.append(try parseNumber())
            case UInt8(ascii: "t"):
                try parseLiteral("true")
                values.append(.bool(true))
            case UInt8(ascii: "f"):
                try parseLiteral("false")
                values.append(.bool(false))
            case UInt8(ascii: "n"):
                try parseLiteral("null")
                values.append(.null)
            default:
                throw expected("a value", at: position)
            }

            // A value ended: continue or close the containers it completes.
            while let frame = frames.last {
                skipWhitespace()
                let next: UInt8? = position < end ? byte(position) : nil
                if frame.isObject {
                    if next == UInt8(ascii: ",") {
                        position += 1
                        skipWhitespace()
                        try parseKey(expecting: "a string key")
                        continue parsing
                    }
                    guard next == UInt8(ascii: "}") else { throw expected("',' or '}'", at: position) }
                    position += 1
                    closeObject(frame)
                } else {
                    if next == UInt8(ascii: ",") {
                        position += 1
                        skipWhitespace()
                        continue parsing
                    }
                    guard next == UInt8(ascii: "]") else { throw expected("',' or ']'", at: position) }
                    position += 1
                    closeArray(frame)
                }
                frames.removeLast()
            }
            break
        }
        skipWhitespace()
        guard position == end else { throw expected("end of input", at: position) }
        return values[0]
    }

    private func checkDepth() throws(JSONError) {
        guard frames.count < JSON.maximumDepth else {
            throw fail("arrays and objects nested deeper than \(JSON.maximumDepth)", at: position)
        }
    }

    /// Reads `"key" :` and leaves the position at the member's value.
    private mutating func parseKey(expecting what: String) throws(JSONError) {
        guard position < end && byte(position) == Self.quote else { throw expected(what, at: position) }
        keys.append(try parseString())
        skipWhitespace()
        guard position < end && byte(position) == UInt8(ascii: ":") else { throw expected("':'", at: position) }
        position += 1
        skipWhitespace()
    }

    private mutating func closeArray(_ frame: Frame) {
        let array = Array(values[frame.valueStart...])
        values.removeSubrange(frame.valueStart...)
        values.append(.array(array))
    }

    /// Builds the map of the innermost object. Keys are byte strings: a key that appears again,
    /// byte for byte, replaces the earlier member's value (the last one wins, as with
    /// `JSONSerialization`), while two spellings of the same text in different Unicode forms
    /// (precomposed `é` and `e` + U+0301) are two keys, both kept.
    ///
    /// - Complexity: O(k) for k members in sorted order, O(k log k) otherwise.
    private mutating func closeObject(_ frame: Frame) {
        let map = UTF8Map(
            keys: Array(keys[frame.keyStart...]), members: Array(values[frame.valueStart...]),
            uniquingKeysWith: { _, last in last })
        keys.removeSubrange(frame.keyStart...)
        values.removeSubrange(frame.valueStart...)
        values.append(Self.bytesOrMap(map))
    }

    private static func bytesOrMap(_ map: UTF8Map<Value>) -> Value {
        if map.count == 1, case .string(let text)? = map["$bytes"], let data = Data(base64Encoded: text) {
            return .bytes([UInt8](data))
        }
        return .map(map)
    }

    // MARK: Literals

    private mutating func parseLiteral(_ literal: StaticString) throws(JSONError) {
        let count = literal.utf8CodeUnitCount
        let start = position
        guard end - position >= count else { throw expected("'\(literal)'", at: start) }
        let text = literal.utf8Start
        for k in 0..<count where byte(position + k) != text[k] {
            throw expected("'\(literal)'", at: start)
        }
        position += count
    }

    // MARK: Numbers

    /// Powers of ten that a `Double` holds exactly.
    private static let exactPowersOfTen: [Double] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
        1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
    ]

    @inline(__always)
    private static func isDigit(_ b: UInt8) -> Bool {
        b &- UInt8(ascii: "0") < 10
    }

    /// Reads one number. An integer literal (no fraction, no exponent) that fits in `Int64` is
    /// `.int`; any other number is the correctly rounded `.double` of its text.
    private mutating func parseNumber() throws(JSONError) -> Value {
        let start = position
        let negative = byte(position) == UInt8(ascii: "-")
        if negative { position += 1 }

        // Integer part. Up to 19 digits accumulate in a UInt64 without overflow.
        let digitsStart = position
        guard position < end && Self.isDigit(byte(position)) else { throw expected("a digit", at: position) }
        var significand: UInt64 = 0
        if byte(position) == UInt8(ascii: "0") {
            position += 1
            if position < end && Self.isDigit(byte(position)) {
                throw fail("leading zero in number", at: position - 1)
            }
        } else {
            while position < end {
                let d = byte(position) &- UInt8(ascii: "0")
                guard d < 10 else { break }
                if position - digitsStart < 19 { significand = significand &* 10 &+ UInt64(d) }
                position += 1
            }
        }
        let integerDigits = position - digitsStart

        var fractionDigits = 0
        if position < end && byte(position) == UInt8(ascii: ".") {
            position += 1
            let fractionStart = position
            while position < end && Self.isDigit(byte(position)) { position += 1 }
            fractionDigits = position - fractionStart
            guard fractionDigits > 0 else { throw expected("a digit after '.'", at: position) }
        }

        var exponent = 0
        var hasExponent = false
        if position < end && (byte(position) | 0x20) == UInt8(ascii: "e") {
            hasExponent = true
            position += 1
            var exponentNegative = false
            if position < end && (byte(position) == UInt8(ascii: "+") || byte(position) == UInt8(ascii: "-")) {
                exponentNegative = byte(position) == UInt8(ascii: "-")
                position += 1
            }
            let exponentStart = position
            while position < end {
                let d = byte(position) &- UInt8(ascii: "0")
                guard d < 10 else { break }
                if exponent < 100_000 { exponent = exponent * 10 + Int(d) }
                position += 1
            }
            guard position > exponentStart else { throw expected("a digit in the exponent", at: position) }
            if exponentNegative { exponent = -exponent }
        }

        if fractionDigits == 0 && !hasExponent {
            if integerDigits <= 19 {
                if negative {
                    if significand <= UInt64(Int64.max) + 1 { return .int(Int64(truncatingIfNeeded: 0 &- significand)) }
                } else if significand <= UInt64(Int64.max) {
                    return .int(Int64(significand))
                }
            }
            // An integer is an int64 (RFC 8259 §6 lets a parser limit the range): read as a double
            // it would lose digits without a word (a 20-digit ID), so it is refused, as a Swift
            // `UInt64` above `Int64.max` is.
            let cut = position - start > 40
            let text = String(decoding: (start..<min(position, start + 40)).map { input[$0] }, as: UTF8.self)
            let shown = cut ? "\(text)… (\(integerDigits) digits)" : text
            // With a fraction it is a double, when one can hold it (below about 1.8e308).
            let asDouble =
                integerDigits > 308
                ? ""
                : cut
                    ? ", or end it with .0 to store it as a rounded double"
                    : ", or with a fraction (\(text).0) to store it as a rounded double"
            throw fail(
                "the integer \(shown) is outside int64 (-9223372036854775808 to 9223372036854775807): "
                    + "write it as a string to keep every digit\(asDouble)",
                at: start)
        }
        return .double(
            try parseDouble(
                from: start, integerDigits: integerDigits, fractionDigits: fractionDigits,
                exponent: exponent, negative: negative))
    }

    /// The correctly rounded double of the number text from `start` to the current position.
    ///
    /// Clinger's fast path when the digits form an integer below 2^53 and the decimal exponent
    /// is within ±22 (one exact IEEE operation, so correctly rounded); otherwise the standard
    /// library's `Double(_: Substring)` (strtod), which is correctly rounded too.
    private mutating func parseDouble(
        from start: Int, integerDigits: Int, fractionDigits: Int, exponent: Int, negative: Bool
    ) throws(JSONError) -> Double {
        let digitsStart = negative ? start + 1 : start
        if integerDigits + fractionDigits <= 15 {
            var mantissa: UInt64 = 0
            for k in digitsStart..<digitsStart + integerDigits { mantissa = mantissa * 10 + UInt64(byte(k) &- 48) }
            let fractionStart = digitsStart + integerDigits + 1
            for k in fractionStart..<fractionStart + fractionDigits {
                mantissa = mantissa * 10 + UInt64(byte(k) &- 48)
            }
            let scale = exponent - fractionDigits
            var result: Double?
            if mantissa == 0 {
                result = 0
            } else if scale >= 0 && scale <= 22 {
                result = Double(mantissa) * Self.exactPowersOfTen[scale]
            } else if scale < 0 && scale >= -22 {
                result = Double(mantissa) / Self.exactPowersOfTen[-scale]
            }
            if let result { return negative ? -result : result }
        }
        let text = String(decoding: UnsafeRawBufferPointer(rebasing: input[start..<position]), as: UTF8.self)
        guard let result = Double(text), result.isFinite else {
            throw fail("number out of range", at: start)
        }
        return result
    }

    // MARK: Strings

    /// Reads a string whose opening quote is at the current position.
    private mutating func parseString() throws(JSONError) -> String {
        position += 1
        let start = position
        while position < end {
            skipPlainASCII()
            guard position < end else { break }
            let b = byte(position)
            if b == Self.quote {
                let text = String(decoding: UnsafeRawBufferPointer(rebasing: input[start..<position]), as: UTF8.self)
                position += 1
                return text
            }
            if b == Self.backslash { return try parseEscapedString(from: start) }
            if b < 0x20 { throw unescapedControl(b) }
            if b < 0x80 {
                position += 1
            } else {
                try skipUTF8Sequence()
            }
        }
        throw expected("'\"'", at: position)
    }

    /// Steps over string bytes that need no attention (ASCII, not `"`, `\` or a control
    /// character) eight at a time, stopping at the first byte that might.
    @inline(__always)
    private mutating func skipPlainASCII() {
        while end - position >= 8 {
            let word = UInt64(littleEndian: input.loadUnaligned(fromByteOffset: position, as: UInt64.self))
            let flags = JSONByteScan.flags(word, nonASCII: true)
            if flags != 0 {
                position += JSONByteScan.firstFlagged(flags)
                return
            }
            position += 8
        }
    }

    private func unescapedControl(_ b: UInt8) -> JSONError {
        fail(
            "unescaped control character U+00\(b < 0x10 ? "0" : "")\(String(b, radix: 16, uppercase: true))",
            at: position)
    }

    /// The rest of a string that holds escapes; `start` is its first content byte.
    private mutating func parseEscapedString(from start: Int) throws(JSONError) -> String {
        scratch.removeAll(keepingCapacity: true)
        scratch.append(contentsOf: UnsafeRawBufferPointer(rebasing: input[start..<position]))
        while position < end {
            let runStart = position
            while position < end {
                skipPlainASCII()
                guard position < end else { break }
                let b = byte(position)
                if b == Self.quote || b == Self.backslash { break }
                if b < 0x20 { throw unescapedControl(b) }
                if b < 0x80 {
                    position += 1
                } else {
                    try skipUTF8Sequence()
                }
            }
            if position > runStart {
                scratch.append(contentsOf: UnsafeRawBufferPointer(rebasing: input[runStart..<position]))
            }
            guard position < end else { break }
            if byte(position) == Self.quote {
                position += 1
                return String(decoding: scratch, as: UTF8.self)
            }
            try parseEscape()
        }
        throw expected("'\"'", at: position)
    }

    /// Reads one escape at the current position (a backslash) and appends its UTF-8 to ``scratch``.
    private mutating func parseEscape() throws(JSONError) {
        let escapeStart = position
        position += 1
        guard position < end else { throw expected("an escape character", at: position) }
        let b = byte(position)
        position += 1
        if let escaped = UTF8Check.jsonEscape(b) {
            scratch.append(escaped)
            return
        }
        switch b {
        case UInt8(ascii: "u"):
            var scalar = try parseHex4()
            if scalar >= 0xD800 && scalar < 0xDC00 {
                guard end - position >= 2 && byte(position) == Self.backslash && byte(position + 1) == UInt8(ascii: "u")
                else { throw loneSurrogate(scalar, at: escapeStart) }
                position += 2
                let low = try parseHex4()
                guard low >= 0xDC00 && low < 0xE000 else { throw loneSurrogate(scalar, at: escapeStart) }
                scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
            } else if scalar >= 0xDC00 && scalar < 0xE000 {
                throw loneSurrogate(scalar, at: escapeStart)
            }
            UTF8Check.append(scalar, to: &scratch)
        default:
            throw expected("an escape character (one of \" \\ / b f n r t u)", at: position - 1)
        }
    }

    private func loneSurrogate(_ unit: UInt32, at offset: Int) -> JSONError {
        let hex = String(unit, radix: 16, uppercase: true)
        return fail(
            "lone surrogate \\u\(hex) (a \\uD800-\\uDBFF escape must be followed by \\uDC00-\\uDFFF)", at: offset)
    }

    private mutating func parseHex4() throws(JSONError) -> UInt32 {
        var unit: UInt32 = 0
        for _ in 0..<4 {
            guard position < end else { throw expected("a hex digit", at: position) }
            guard let digit = UTF8Check.hexDigit(byte(position)) else { throw expected("a hex digit", at: position) }
            unit = unit << 4 | UInt32(digit)
            position += 1
        }
        return unit
    }

    /// Steps over one well-formed multi-byte UTF-8 sequence (RFC 3629 §4) at the current position.
    private mutating func skipUTF8Sequence() throws(JSONError) {
        guard let length = UTF8Check.sequenceLength(input, at: position) else {
            throw fail("invalid UTF-8", at: position)
        }
        position += length
    }
}
