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
            if next == UInt8(ascii: ".") {
                position += 1
                guard Self.isDigit(next) else { return false }
                while Self.isDigit(next) { position += 1 }
            }
            if next == UInt8(ascii: "e") || next == UInt8(ascii: "E") {
                position += 1
                if next == UInt8(ascii: "+") || next == UInt8(ascii: "-") { position += 1 }
                guard Self.isDigit(next) else { return false }
                while Self.isDigit(next) { position += 1 }
            }
            let text = UnsafeBufferPointer(rebasing: bytes[start..<position])
            guard let double = Double(String(decoding: text, as: UTF8.self)), double.isFinite else { return false }
            return JSON.formatDouble(double).utf8.elementsEqual(text)
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
