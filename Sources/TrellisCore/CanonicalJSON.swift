// Recognising canonical document JSON without building the document.
//
// A peer sends a document written once as its JSON (the single-write form, docs/PROTOCOL.md §3),
// and Trellis peers write that JSON canonically (JSONWriter). When the text is already what
// `JSON.string(JSON.parse(text))` would give and `Value.validate` would accept it, a receiver can
// store it as it came and parse it only if something asks for the value; one pass over the bytes
// replaces a parse that builds a tree, a check of that tree and a second writing of it.

/// Checks whether JSON text is the canonical text of a storable document, in one pass and without
/// building any ``Value``.
///
/// Canonical is what ``JSON/string(_:)`` writes: no whitespace; map keys in strictly increasing
/// byte order of their UTF-8 (no duplicates); ints in decimal without leading zeros or `-0`;
/// doubles as ``JSON/formatDouble(_:)`` spells them; strings escaping exactly `"` `\` and U+0000–
/// U+001F (`\n` `\r` `\t`, otherwise `\u00xx` in lowercase hex). Storable is what
/// ``Value/validate(path:)`` accepts: maps and arrays nested at most ``Value/maximumDepth`` levels,
/// finite numbers, no `$bytes` key.
///
/// The check is conservative: it also declines texts that are canonical but unusual (a `$bytes`
/// byte string, a key holding an escape), so "not canonical" means only "parse it the full way",
/// never "invalid". Whatever it accepts parses, validates and writes back to the same bytes (the
/// JSON fuzz target checks this on every input).
public enum CanonicalJSON {
    /// The text of the `_id` member when `text` is the canonical JSON of a storable map that has
    /// one, else `nil`.
    ///
    /// - Parameter text: the JSON text (a Swift string, so well-formed UTF-8).
    /// - Returns: the `_id` value's text: the canonical JSON of the `_id`, which is how
    ///   `DocumentStore` spells the document's key.
    /// - Complexity: O(n) in the length of the text.
    public static func documentID(of text: String) -> String? {
        scan(text) { bytes, id in String(decoding: UnsafeBufferPointer(rebasing: bytes[id]), as: UTF8.self) }
    }

    /// Whether `text` is the canonical JSON of a storable map whose `_id` is written `idKey`.
    ///
    /// - Complexity: O(n) in the length of the text; no allocation except for a double whose text
    ///   is longer than 15 bytes.
    public static func isDocument(_ text: String, idKey: String) -> Bool {
        scan(text) { bytes, id in UnsafeBufferPointer(rebasing: bytes[id]).elementsEqual(idKey.utf8) } ?? false
    }

    /// Runs `body` on the text's bytes and where its `_id` value is written, when the text is the
    /// canonical JSON of a storable map with an `_id`.
    private static func scan<R>(_ text: String, _ body: (UnsafeBufferPointer<UInt8>, Range<Int>) -> R) -> R? {
        var text = text
        return text.withUTF8 { bytes in
            guard bytes.first == UInt8(ascii: "{") else { return nil }
            var scanner = Scanner(bytes: bytes)
            guard scanner.value(depth: 0, isRoot: true), scanner.position == bytes.count, let id = scanner.idSpan
            else { return nil }
            return body(bytes, id)
        }
    }

    private struct Scanner {
        let bytes: UnsafeBufferPointer<UInt8>
        var position = 0
        /// Where the root map's `_id` value is written.
        var idSpan: Range<Int>?

        init(bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

        private var next: UInt8? { position < bytes.count ? bytes[position] : nil }

        mutating func value(depth: Int, isRoot: Bool = false) -> Bool {
            guard let first = next else { return false }
            switch first {
            case UInt8(ascii: "{"): return map(depth: depth, isRoot: isRoot)
            case UInt8(ascii: "["): return array(depth: depth)
            case UInt8(ascii: "\""): return string() != nil
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return number()
            case UInt8(ascii: "t"): return literal("true")
            case UInt8(ascii: "f"): return literal("false")
            case UInt8(ascii: "n"): return literal("null")
            default: return false
            }
        }

        private mutating func map(depth: Int, isRoot: Bool) -> Bool {
            guard depth < Value.maximumDepth else { return false }
            position += 1
            if next == UInt8(ascii: "}") {
                position += 1
                return true
            }
            var previous: Range<Int>?
            while true {
                // Keys with escapes are declined: their byte order is that of the unescaped text.
                guard next == UInt8(ascii: "\""), let key = string(), !key.escaped else { return false }
                if let previous, !Self.precedes(bytes, previous, key.content) { return false }
                if Self.equals(bytes, key.content, "$bytes") { return false }
                guard next == UInt8(ascii: ":") else { return false }
                position += 1
                let start = position
                guard value(depth: depth + 1) else { return false }
                if isRoot, Self.equals(bytes, key.content, "_id") { idSpan = start..<position }
                previous = key.content
                switch next {
                case UInt8(ascii: ","): position += 1
                case UInt8(ascii: "}"):
                    position += 1
                    return true
                default: return false
                }
            }
        }

        private mutating func array(depth: Int) -> Bool {
            guard depth < Value.maximumDepth else { return false }
            position += 1
            if next == UInt8(ascii: "]") {
                position += 1
                return true
            }
            while true {
                guard value(depth: depth + 1) else { return false }
                switch next {
                case UInt8(ascii: ","): position += 1
                case UInt8(ascii: "]"):
                    position += 1
                    return true
                default: return false
                }
            }
        }

        /// Reads a string written canonically; returns where its content is and whether it holds
        /// an escape.
        private mutating func string() -> (content: Range<Int>, escaped: Bool)? {
            position += 1
            let start = position
            var escaped = false
            while position < bytes.count {
                let b = bytes[position]
                if b == UInt8(ascii: "\"") {
                    position += 1
                    return (start..<position - 1, escaped)
                }
                if b < 0x20 { return nil }
                if b == UInt8(ascii: "\\") {
                    guard position + 1 < bytes.count else { return nil }
                    escaped = true
                    switch bytes[position + 1] {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "n"), UInt8(ascii: "r"),
                        UInt8(ascii: "t"):
                        position += 2
                    case UInt8(ascii: "u"):
                        // Only the controls without a short escape, as `\u00xx` in lowercase hex.
                        guard position + 5 < bytes.count, bytes[position + 2] == UInt8(ascii: "0"),
                            bytes[position + 3] == UInt8(ascii: "0"), let high = Self.lowerHex(bytes[position + 4]),
                            let low = Self.lowerHex(bytes[position + 5]), high < 2
                        else { return nil }
                        let code = high << 4 | low
                        guard code != 0x09, code != 0x0A, code != 0x0D else { return nil }
                        position += 6
                    default:
                        return nil
                    }
                    continue
                }
                position += 1
            }
            return nil
        }

        private static func lowerHex(_ b: UInt8) -> UInt8? {
            switch b {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): return b - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): return b - UInt8(ascii: "a") + 10
            default: return nil
            }
        }

        private static func isDigit(_ b: UInt8?) -> Bool {
            guard let b else { return false }
            return b &- UInt8(ascii: "0") < 10
        }

        /// Reads a number: an int as JSONWriter writes an Int64, or a double exactly as
        /// ``JSON/formatDouble(_:)`` spells the double the text reads as.
        private mutating func number() -> Bool {
            let start = position
            let negative = next == UInt8(ascii: "-")
            if negative { position += 1 }
            guard let lead = next, Self.isDigit(lead) else { return false }
            var magnitude: UInt64 = 0
            var digits = 0
            while Self.isDigit(next) {
                let d = UInt64(bytes[position] &- UInt8(ascii: "0"))
                let (times, overflowTimes) = magnitude.multipliedReportingOverflow(by: 10)
                let (sum, overflowSum) = times.addingReportingOverflow(d)
                if overflowTimes || overflowSum { return false }
                magnitude = sum
                digits += 1
                position += 1
            }
            if lead == UInt8(ascii: "0"), digits > 1 { return false }
            let isInt = next != UInt8(ascii: ".") && next != UInt8(ascii: "e") && next != UInt8(ascii: "E")
            if isInt {
                // JSONWriter writes no `-0` and no int beyond Int64 (the parser refuses such text).
                if negative { return magnitude != 0 && magnitude <= UInt64(Int64.max) + 1 }
                return magnitude <= UInt64(Int64.max)
            }
            var fraction = 0..<0
            if next == UInt8(ascii: ".") {
                position += 1
                guard Self.isDigit(next) else { return false }
                let first = position
                while Self.isDigit(next) { position += 1 }
                fraction = first..<position
            }
            if next == UInt8(ascii: "e") || next == UInt8(ascii: "E") {
                position += 1
                if next == UInt8(ascii: "+") || next == UInt8(ascii: "-") { position += 1 }
                guard Self.isDigit(next) else { return false }
                while Self.isDigit(next) { position += 1 }
            } else if let plain = Self.plainDecimal(bytes, integer: magnitude, digits: digits, fraction: fraction) {
                return plain
            }
            let text = UnsafeBufferPointer(rebasing: bytes[start..<position])
            guard let double = Double(String(decoding: text, as: UTF8.self)), double.isFinite else { return false }
            return JSON.formatDouble(double).utf8.elementsEqual(text)
        }

        /// Whether a double written `integer.fraction` (no exponent) is spelled as
        /// ``JSON/formatDouble(_:)`` spells it, decided from its digits alone; `nil` when the
        /// digits cannot decide it (zero, more than 15 significant digits, below 0.001), which the
        /// caller then decides by parsing and writing the double again.
        ///
        /// A decimal of at most 15 significant digits is the only one of that many digits or
        /// fewer to read as its double (IEEE 754 binary64 carries 15 decimal digits: DBL_DIG), so
        /// the shortest digits that read back as that double, which `Double.description` writes,
        /// are the text's own digits without trailing zeros. `description` writes such a number
        /// from 0.001 up to 2^53 without an exponent, and with `.0` when it has no fraction. So the
        /// spelling is canonical exactly when the fraction has no trailing zero, or is the one
        /// digit `0` of a whole number.
        ///
        /// - Parameters:
        ///   - integer: the integer part's value (below 2^64), `digits` its number of digits
        ///     (no leading zero unless it is `0`).
        ///   - fraction: where the fraction's digits are (at least one).
        /// - Complexity: O(number of digits).
        private static func plainDecimal(
            _ bytes: UnsafeBufferPointer<UInt8>, integer: UInt64, digits: Int, fraction: Range<Int>
        ) -> Bool? {
            guard !fraction.isEmpty else { return nil }
            let lastNonZero = fraction.last { bytes[$0] != UInt8(ascii: "0") }
            var significant: Int
            if integer != 0 {
                significant = digits + fraction.count
            } else {
                // 0.xyz: the significant digits start at the first nonzero one, within the first three.
                guard let firstNonZero = fraction.first(where: { bytes[$0] != UInt8(ascii: "0") }),
                    firstNonZero - fraction.lowerBound < 3
                else { return nil }
                significant = fraction.upperBound - firstNonZero
            }
            // Trailing zeros of the fraction are not significant, but make the spelling longer.
            if let lastNonZero { significant -= fraction.upperBound - 1 - lastNonZero }
            guard significant <= 15 else { return nil }
            if let lastNonZero { return lastNonZero == fraction.upperBound - 1 }
            return fraction.count == 1  // a whole number: `.0`, one zero
        }

        private mutating func literal(_ word: StaticString) -> Bool {
            let count = word.utf8CodeUnitCount
            guard bytes.count - position >= count else { return false }
            for k in 0..<count where bytes[position + k] != word.utf8Start[k] { return false }
            position += count
            return true
        }

        /// Whether the bytes at `a` sort strictly before those at `b` (a proper prefix first).
        private static func precedes(_ bytes: UnsafeBufferPointer<UInt8>, _ a: Range<Int>, _ b: Range<Int>) -> Bool {
            UnsafeBufferPointer(rebasing: bytes[a]).lexicographicallyPrecedes(UnsafeBufferPointer(rebasing: bytes[b]))
        }

        private static func equals(_ bytes: UnsafeBufferPointer<UInt8>, _ range: Range<Int>, _ word: StaticString)
            -> Bool
        {
            range.count == word.utf8CodeUnitCount
                && UnsafeBufferPointer(rebasing: bytes[range]).elementsEqual(
                    UnsafeBufferPointer(start: word.utf8Start, count: word.utf8CodeUnitCount))
        }
    }
}
