// A document's stored JSON, parsed when its value is first read.
//
// Query results used to be parsed into `Value` trees row by row while the query ran: about four
// fifths of an indexed `find`'s time (docs/BENCHMARKS.md, "Query results parsed when read").
// Ditto's query result items materialise their value on first access too.

internal import Synchronization

/// The JSON text of a stored document, parsed into a ``Value`` the first time the value is read,
/// then kept.
///
/// A query checks each row with ``StoredJSON/init(checking:)`` (one pass over the bytes, no
/// allocation) instead of parsing it; reading ``value`` parses it once, and reading one top-level
/// member with ``member(_:)`` before that parses only that member. Safe to share between threads.
public final class StoredJSON: Sendable, CustomStringConvertible {
    /// The JSON text as stored.
    public let text: String
    private let parsed: Mutex<Value?>

    /// Wraps `text`, checking that it parses; `nil` when it does not.
    ///
    /// Text the one-pass check (``JSONScan/certainlyParses(_:)``) vouches for is kept unparsed;
    /// anything else is parsed now, and kept parsed when it parses.
    ///
    /// - Complexity: O(n) in the length of the text.
    public init?(checking text: String) {
        self.text = text
        if JSONScan.certainlyParses(text) {
            parsed = Mutex(nil)
        } else if let value = try? JSON.parse(text) {
            parsed = Mutex(value)
        } else {
            return nil
        }
    }

    /// Wraps `text` whose value is already known (`value` must be what `text` parses to).
    public init(text: String, value: Value) {
        self.text = text
        parsed = Mutex(value)
    }

    /// The document's value: parsed on first read (O(n) in the text), then kept.
    ///
    /// The text was checked when this was made, so it parses; were it ever not to, this is an
    /// empty map rather than a trap.
    public var value: Value {
        parsed.withLock { cached in
            if let cached { return cached }
            let value = (try? JSON.parse(text)) ?? .map([:])
            cached = value
            return value
        }
    }

    /// Whether ``value`` has been parsed.
    public var isParsed: Bool { parsed.withLock { $0 != nil } }

    /// A top-level member of the document, or `nil` when absent (or the document is not a map).
    ///
    /// Before ``value`` is read this scans the text and parses that member alone; afterwards it
    /// looks it up in the parsed map.
    ///
    /// - Complexity: O(n) in the length of the text before the value is parsed, O(log m) in the
    ///   map's m members after.
    public func member(_ key: String) -> Value? {
        if let cached = parsed.withLock({ $0 }) { return cached[key] }
        switch JSONScan.member(key, in: text) {
        case .found(let value): return value
        case .absent: return nil
        case .unsure: return value[key]
        }
    }

    public var description: String { text }
}

/// One-pass scans of JSON text that build no ``Value``.
public enum JSONScan {
    /// Whether ``JSON/parse(_:)-(String)`` certainly accepts `text`.
    ///
    /// Conservative: it answers `true` only for compact JSON (no whitespace) without `\u` escapes,
    /// exponents or numbers of more than 300 digits, nested at most ``JSON/maximumDepth`` deep,
    /// which is all JSON Trellis writes except strings with control characters other than tab,
    /// line feed and carriage return. `false` means "parse it to know", not "invalid". A Swift
    /// string is well-formed UTF-8, so the bytes need no UTF-8 check. The JSON fuzz target checks
    /// the promise on every input.
    ///
    /// - Complexity: O(n) in the length of the text; no allocation.
    public static func certainlyParses(_ text: String) -> Bool {
        var text = text
        return text.withUTF8 { bytes in
            var scanner = Scanner(bytes: bytes)
            return scanner.value() && scanner.position == bytes.count
        }
    }

    /// The outcome of looking for a top-level member without parsing the document.
    public enum Member {
        /// The member's value.
        case found(Value)
        /// The text is a map without that key.
        case absent
        /// The scan cannot tell (a key with an escape, text it does not vouch for): parse it.
        case unsure
    }

    /// Finds the top-level member `key` of the map `text` by scanning, parsing only its value.
    /// A key repeated in the text answers its last value, as the parser keeps it.
    ///
    /// - Complexity: O(n) in the length of the text.
    public static func member(_ key: String, in text: String) -> Member {
        var text = text
        var key = key
        return text.withUTF8 { bytes in
            key.withUTF8 { wanted in
                var scanner = Scanner(bytes: bytes)
                guard scanner.next == UInt8(ascii: "{") else { return .unsure }
                scanner.position += 1
                scanner.depth = 1  // the map itself counts towards the parser's nesting limit
                if scanner.next == UInt8(ascii: "}") { return .absent }
                var found: Range<Int>?
                while true {
                    guard scanner.next == UInt8(ascii: "\"") else { return .unsure }
                    let keyStart = scanner.position + 1
                    guard scanner.string(), !scanner.sawEscape else { return .unsure }
                    let keyBytes = UnsafeBufferPointer(rebasing: bytes[keyStart..<scanner.position - 1])
                    guard scanner.next == UInt8(ascii: ":") else { return .unsure }
                    scanner.position += 1
                    let valueStart = scanner.position
                    guard scanner.value() else { return .unsure }
                    // `{"$bytes": …}` alone is a byte string, not a map: leave that to the parser.
                    if keyBytes.elementsEqual("$bytes".utf8) { return .unsure }
                    if keyBytes.elementsEqual(wanted) { found = valueStart..<scanner.position }
                    switch scanner.next {
                    case UInt8(ascii: ","): scanner.position += 1
                    case UInt8(ascii: "}"):
                        guard scanner.position + 1 == bytes.count else { return .unsure }
                        guard let found else { return .absent }
                        let slice = UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: bytes[found]))
                        guard let value = try? JSON.parse(slice) else { return .unsure }
                        return .found(value)
                    default: return .unsure
                    }
                }
            }
        }
    }

    /// Steps over the JSON value starting at `position` in `bytes`, which sits inside `depth` open
    /// arrays and objects, and moves `position` past it; `false` when the value is not one the
    /// parser certainly accepts there (the same conservative rules as
    /// ``certainlyParses(_:)``: no whitespace, no `\u` escapes, no exponents, nesting within
    /// ``JSON/maximumDepth``). Bytes from 0x80 up are taken as they come inside strings (also
    /// ill-formed UTF-8: the text with such sequences read as U+FFFD parses alike) and declined
    /// outside them.
    ///
    /// For decoders that read a document straight from its text and step over what they do not
    /// read, falling back to the parser when this answers `false`.
    ///
    /// - Complexity: O(length of the value); no allocation.
    package static func skipValue(
        in bytes: UnsafeBufferPointer<UInt8>, at position: inout Int, depth: Int
    ) -> Bool {
        var scanner = Scanner(bytes: bytes)
        scanner.position = position
        scanner.depth = depth
        guard scanner.value() else { return false }
        position = scanner.position
        return true
    }

    private struct Scanner {
        let bytes: UnsafeBufferPointer<UInt8>
        var position = 0
        var depth = 0
        /// Whether the last string scanned held an escape.
        var sawEscape = false

        init(bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

        var next: UInt8? { position < bytes.count ? bytes[position] : nil }

        mutating func value() -> Bool {
            guard let first = next else { return false }
            switch first {
            case UInt8(ascii: "{"): return container(close: UInt8(ascii: "}"), keyed: true)
            case UInt8(ascii: "["): return container(close: UInt8(ascii: "]"), keyed: false)
            case UInt8(ascii: "\""): return string()
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return number()
            case UInt8(ascii: "t"): return literal("true")
            case UInt8(ascii: "f"): return literal("false")
            case UInt8(ascii: "n"): return literal("null")
            default: return false
            }
        }

        private mutating func container(close: UInt8, keyed: Bool) -> Bool {
            guard depth < JSON.maximumDepth else { return false }
            depth += 1
            defer { depth -= 1 }
            position += 1
            if next == close {
                position += 1
                return true
            }
            while true {
                if keyed {
                    guard next == UInt8(ascii: "\""), string(), next == UInt8(ascii: ":") else { return false }
                    position += 1
                }
                guard value() else { return false }
                switch next {
                case UInt8(ascii: ","): position += 1
                case close:
                    position += 1
                    return true
                default: return false
                }
            }
        }

        /// A string whose opening quote is at the position: plain bytes from U+0020 on (any
        /// UTF-8, which a Swift string holds well-formed) and the escapes other than `\u`.
        mutating func string() -> Bool {
            guard let base = bytes.baseAddress else { return false }
            let end = bytes.count
            var i = position + 1
            sawEscape = false
            while i < end {
                let b = base[i]
                i += 1
                if b > UInt8(ascii: "\\") || (b >= 0x20 && b != UInt8(ascii: "\"") && b != UInt8(ascii: "\\")) {
                    continue
                }
                if b == UInt8(ascii: "\"") {
                    position = i
                    return true
                }
                guard b == UInt8(ascii: "\\"), i < end else { return false }
                switch base[i] {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"),
                    UInt8(ascii: "f"), UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    sawEscape = true
                    i += 1
                default: return false
                }
            }
            return false
        }

        /// `-? (0 | [1-9][0-9]*) (.[0-9]+)?` of at most 300 digits: always a finite number.
        private mutating func number() -> Bool {
            if next == UInt8(ascii: "-") { position += 1 }
            let start = position
            guard let first = next, first &- UInt8(ascii: "0") < 10 else { return false }
            position += 1
            if first == UInt8(ascii: "0") {
                if let b = next, b &- UInt8(ascii: "0") < 10 { return false }
            } else {
                while let b = next, b &- UInt8(ascii: "0") < 10 { position += 1 }
            }
            if next == UInt8(ascii: ".") {
                position += 1
                let fractionStart = position
                while let b = next, b &- UInt8(ascii: "0") < 10 { position += 1 }
                guard position > fractionStart else { return false }
            }
            if let b = next, b | 0x20 == UInt8(ascii: "e") { return false }
            return position - start <= 301
        }

        private mutating func literal(_ word: StaticString) -> Bool {
            let count = word.utf8CodeUnitCount
            guard bytes.count - position >= count else { return false }
            for k in 0..<count where bytes[position + k] != word.utf8Start[k] { return false }
            position += count
            return true
        }
    }
}
