// A document's stored JSON, parsed when its value is first read.
//
// Query results used to be parsed into `Value` trees row by row while the query ran: about four
// fifths of an indexed `find`'s time (docs/BENCHMARKS.md, "Query results parsed when read").
// Ditto's query result items materialise their value on first access too.

internal import Synchronization

/// The JSON text of a stored document, parsed into a ``Value`` the first time the value is read,
/// then kept.
///
/// A query checks each row with ``StoredJSON/init(checking:)-(UnsafeBufferPointer<UInt8>)`` (one
/// pass over the bytes) instead of parsing it; reading ``value`` parses it once, and reading one
/// top-level member with ``member(_:)`` before that parses only that member. The text and the
/// parsed value live in one allocation (a query makes one per result row). Safe to share between
/// threads; two copies share the text and the parsed value.
public struct StoredJSON: @unchecked Sendable, Equatable, CustomStringConvertible {
    // @unchecked: the bytes never change after `Storage.make`, and `Header.parsed` is read and
    // written only under a lock (`Storage.withParsed`).
    private let storage: Storage

    /// Wraps `text`, checking that it parses; `nil` when it does not.
    ///
    /// Text the one-pass check (``JSONScan/certainlyParses(_:)-(String)``) vouches for is kept
    /// unparsed; anything else is parsed now, and kept parsed when it parses.
    ///
    /// - Complexity: O(n) in the length of the text.
    public init?(checking text: String) {
        var text = text
        guard let storage = text.withUTF8({ Self.checked($0) }) else { return nil }
        self.init(storage)
    }

    /// Wraps the JSON text `bytes` (for instance a column SQLite holds), checking that it parses;
    /// `nil` when it does not. Ill-formed UTF-8 is repaired first, as `String(decoding: bytes,
    /// as: UTF8.self)` repairs it (each bad sequence becomes U+FFFD), so this answers what
    /// ``init(checking:)-(String)`` answers for that string.
    ///
    /// - Complexity: O(n) in the number of bytes; the bytes are copied and read only during the
    ///   call. ASCII text the one-pass check vouches for (what Trellis writes) is read once, and
    ///   then copied (``JSONScan/certainlyParsesAsWellFormedUTF8(_:)``).
    public init?(checking bytes: UnsafeBufferPointer<UInt8>) {
        // The common case in one pass: text the scan vouches for, in well-formed UTF-8.
        if JSONScan.certainlyParsesAsWellFormedUTF8(bytes) {
            self.init(Storage.make(bytes, parsed: nil))
            return
        }
        let storage =
            UTF8Check.firstInvalid(UnsafeRawBufferPointer(bytes)) == nil
            ? Self.checked(bytes) : Self.checked(repairing: bytes)
        guard let storage else { return nil }
        self.init(storage)
    }

    /// Wraps `text` whose value is already known (`value` must be what `text` parses to).
    public init(text: String, value: Value) {
        var text = text
        storage = text.withUTF8 { Storage.make($0, parsed: value) }
    }

    private init(_ storage: Storage) { self.storage = storage }

    private static func checked(repairing bytes: UnsafeBufferPointer<UInt8>) -> Storage? {
        var text = String(decoding: bytes, as: UTF8.self)
        return text.withUTF8 { checked($0) }
    }

    private static func checked(_ bytes: UnsafeBufferPointer<UInt8>) -> Storage? {
        if JSONScan.certainlyParses(bytes) { return Storage.make(bytes, parsed: nil) }
        guard let value = try? JSON.parse(UnsafeRawBufferPointer(bytes)) else { return nil }
        return Storage.make(bytes, parsed: value)
    }

    /// The JSON text as stored (made anew on each read: O(n) in its length).
    public var text: String { withUTF8 { String(decoding: $0, as: UTF8.self) } }

    /// Calls `body` with the text's UTF-8 (well formed), valid only during the call.
    public func withUTF8<R>(_ body: (UnsafeBufferPointer<UInt8>) throws -> R) rethrows -> R {
        try storage.withUnsafeMutablePointers { header, bytes in
            try body(UnsafeBufferPointer(start: bytes, count: header.pointee.count))
        }
    }

    /// The document's value: parsed on first read (O(n) in the text), then kept.
    ///
    /// The text was checked when this was made, so it parses; were it ever not to, this is an
    /// empty map rather than a trap.
    public var value: Value {
        storage.withParsed { cached in
            if let cached { return cached }
            let value = withUTF8 { (try? JSON.parse(UnsafeRawBufferPointer($0))) ?? .map([:]) }
            cached = value
            return value
        }
    }

    /// Whether ``value`` has been parsed.
    public var isParsed: Bool { storage.withParsed { $0 != nil } }

    /// A top-level member of the document, or `nil` when absent (or the document is not a map).
    ///
    /// Before ``value`` is read this scans the text and parses that member alone; afterwards it
    /// looks it up in the parsed map.
    ///
    /// - Complexity: O(n) in the length of the text before the value is parsed, O(log m) in the
    ///   map's m members after.
    public func member(_ key: String) -> Value? {
        if let cached = storage.withParsed({ $0 }) { return cached[key] }
        switch withUTF8({ JSONScan.member(key, in: $0) }) {
        case .found(let value): return value
        case .absent: return nil
        case .unsure: return value[key]
        }
    }

    /// Two stored texts are equal when their bytes are (the same text parses to the same value).
    public static func == (a: StoredJSON, b: StoredJSON) -> Bool {
        a.storage === b.storage || a.withUTF8 { x in b.withUTF8 { y in x.elementsEqual(y) } }
    }

    public var description: String { text }

    private struct Header {
        let count: Int
        var parsed: Value?
    }

    /// The text's bytes, tail-allocated after a header holding their count and the parsed value.
    private final class Storage: ManagedBuffer<Header, UInt8> {
        static func make(_ bytes: UnsafeBufferPointer<UInt8>, parsed: Value?) -> Storage {
            let buffer = create(minimumCapacity: bytes.count) { _ in Header(count: bytes.count, parsed: parsed) }
            buffer.withUnsafeMutablePointerToElements { target in
                if let base = bytes.baseAddress { target.initialize(from: base, count: bytes.count) }
            }
            return unsafeDowncast(buffer, to: Storage.self)
        }

        /// Runs `body` on the parsed value under this storage's lock. `ManagedBuffer`'s header
        /// cannot hold a `Mutex` (it must be copyable), and a lock object of its own would cost
        /// each result row a second allocation, so storages share 64 locks by address; `body`
        /// must not read another stored text's value.
        func withParsed<R: Sendable>(_ body: (inout Value?) -> R) -> R {
            let address = UInt(bitPattern: ObjectIdentifier(self))
            return Self.locks[Int((address >> 4) & 63)].mutex.withLock { _ in
                withUnsafeMutablePointerToHeader { body(&$0.pointee.parsed) }
            }
        }

        private final class Lock: Sendable {
            let mutex = Mutex(())
        }

        private static let locks = (0..<64).map { _ in Lock() }
    }
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
        return text.withUTF8 { certainlyParses($0) }
    }

    /// Whether ``JSON/parse(_:)-(String)`` certainly accepts `String(decoding: bytes, as:
    /// UTF8.self)`: the check of ``certainlyParses(_:)-(String)`` on bytes that may hold
    /// ill-formed UTF-8, which it takes as it comes inside strings (read as U+FFFD, the text
    /// parses alike) and declines outside them.
    ///
    /// - Complexity: O(n) in the number of bytes; no allocation.
    public static func certainlyParses(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool { scan(bytes) != nil }

    /// Whether `bytes` are well-formed UTF-8 that ``JSON/parse(_:)-(String)`` certainly accepts:
    /// ``certainlyParses(_:)-(UnsafeBufferPointer<UInt8>)`` and no ill-formed sequence
    /// (``UTF8Check``), told in the scan's one pass when the text is ASCII (the scan notes every
    /// byte from 0x80 up that it meets) and with a second pass over the bytes otherwise. `false`
    /// means "check it another way", as for ``certainlyParses(_:)-(String)``.
    ///
    /// - Complexity: O(n) in the number of bytes; no allocation.
    package static func certainlyParsesAsWellFormedUTF8(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        guard let high = scan(bytes) else { return false }
        return high & 0x8080_8080_8080_8080 == 0 || UTF8Check.firstInvalid(UnsafeRawBufferPointer(bytes)) == nil
    }

    /// The one-pass check of the whole text: the OR of the bytes it read in strings
    /// (``Scanner/value(_:_:at:depth:sawEscape:high:)``) when it vouches for the text, `nil` when not.
    private static func scan(_ bytes: UnsafeBufferPointer<UInt8>) -> UInt64? {
        guard let base = bytes.baseAddress else { return nil }
        var sawEscape = false
        var high: UInt64 = 0
        let end = Scanner.value(base, bytes.count, at: 0, depth: 0, sawEscape: &sawEscape, high: &high)
        return end == bytes.count ? high : nil
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
        return text.withUTF8 { member(key, in: $0) }
    }

    /// ``member(_:in:)-(_,String)`` on the text's UTF-8 (well formed).
    ///
    /// - Complexity: O(n) in the number of bytes.
    public static func member(_ key: String, in bytes: UnsafeBufferPointer<UInt8>) -> Member {
        var key = key
        return key.withUTF8 { wanted in
            let n = bytes.count
            guard n > 1, let base = bytes.baseAddress, base[0] == UInt8(ascii: "{") else { return .unsure }
            var i = 1
            if base[i] == UInt8(ascii: "}") { return n == 2 ? .absent : .unsure }
            var found: Range<Int>?
            while true {
                guard i < n, base[i] == UInt8(ascii: "\"") else { return .unsure }
                let keyStart = i + 1
                var sawEscape = false
                var high: UInt64 = 0
                i = Scanner.string(base, n, at: i, sawEscape: &sawEscape, high: &high)
                guard i >= 0, !sawEscape, i < n, base[i] == UInt8(ascii: ":") else { return .unsure }
                let keyBytes = UnsafeBufferPointer(start: base + keyStart, count: i - 1 - keyStart)
                let valueStart = i + 1
                // The map itself counts towards the parser's nesting limit.
                i = Scanner.value(base, n, at: valueStart, depth: 1, sawEscape: &sawEscape, high: &high)
                guard i >= 0 else { return .unsure }
                // `{"$bytes": …}` alone is a byte string, not a map: leave that to the parser.
                if keyBytes.elementsEqual("$bytes".utf8) { return .unsure }
                if keyBytes.elementsEqual(wanted) { found = valueStart..<i }
                guard i < n else { return .unsure }
                switch base[i] {
                case UInt8(ascii: ","): i += 1
                case UInt8(ascii: "}"):
                    guard i + 1 == n else { return .unsure }
                    guard let found else { return .absent }
                    let slice = UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: bytes[found]))
                    guard let value = try? JSON.parse(slice) else { return .unsure }
                    return .found(value)
                default: return .unsure
                }
            }
        }
    }

    /// Steps over the JSON value starting at `position` in `bytes`, which sits inside `depth` open
    /// arrays and objects, and moves `position` past it; `false` when the value is not one the
    /// parser certainly accepts there (the same conservative rules as
    /// ``certainlyParses(_:)-(String)``: no whitespace, no `\u` escapes, no exponents, nesting
    /// within ``JSON/maximumDepth``). Bytes from 0x80 up are taken as they come inside strings (also
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
        guard let base = bytes.baseAddress else { return false }
        var sawEscape = false
        var high: UInt64 = 0
        let end = Scanner.value(base, bytes.count, at: position, depth: depth, sawEscape: &sawEscape, high: &high)
        guard end >= 0 else { return false }
        position = end
        return true
    }

    /// The one-pass grammar of ``certainlyParses(_:)-(String)``. Each function takes the position
    /// where its construct starts and returns the position just after it, or -1 when the text is
    /// not one it vouches for. Positions are passed and returned rather than kept in a structure, so
    /// that they stay in registers.
    private enum Scanner {
        static let quote = UInt8(ascii: "\"")
        static let backslash = UInt8(ascii: "\\")

        /// A value at `i`, inside `depth` open maps and arrays. `high` gets the bits of the bytes
        /// read in its strings, and maybe of a few bytes after them (so a byte from 0x80 up in
        /// the value sets a high bit of one of its bytes).
        static func value(
            _ p: UnsafePointer<UInt8>, _ n: Int, at i: Int, depth: Int, sawEscape: inout Bool, high: inout UInt64
        ) -> Int {
            guard i < n else { return -1 }
            switch p[i] {
            case UInt8(ascii: "{"), UInt8(ascii: "["): return container(p, n, at: i, depth: depth, high: &high)
            case quote: return string(p, n, at: i, sawEscape: &sawEscape, high: &high)
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return number(p, n, at: i)
            case UInt8(ascii: "t"): return literal(p, n, at: i, "true")
            case UInt8(ascii: "f"): return literal(p, n, at: i, "false")
            case UInt8(ascii: "n"): return literal(p, n, at: i, "null")
            default: return -1
            }
        }

        /// A map or an array at `i`; its members are `depth + 1` deep, at most
        /// ``JSON/maximumDepth``. `high` as for ``value(_:_:at:depth:sawEscape:high:)``.
        private static func container(
            _ p: UnsafePointer<UInt8>, _ n: Int, at start: Int, depth: Int, high: inout UInt64
        ) -> Int {
            guard depth < JSON.maximumDepth else { return -1 }
            let keyed = p[start] == UInt8(ascii: "{")
            let close = keyed ? UInt8(ascii: "}") : UInt8(ascii: "]")
            var i = start + 1
            guard i < n else { return -1 }
            if p[i] == close { return i + 1 }
            var sawEscape = false
            // Kept here, where it can stay in a register, and added to `high` at the end.
            var bits: UInt64 = 0
            while true {
                if keyed {
                    guard i < n, p[i] == quote else { return -1 }
                    i = string(p, n, at: i, sawEscape: &sawEscape, high: &bits)
                    guard i >= 0, i < n, p[i] == UInt8(ascii: ":") else { return -1 }
                    i += 1
                }
                guard i < n else { return -1 }
                // Strings and numbers, the common members, without the dispatch of `value`.
                let first = p[i]
                if first == quote {
                    i = string(p, n, at: i, sawEscape: &sawEscape, high: &bits)
                } else if first &- UInt8(ascii: "0") < 10 || first == UInt8(ascii: "-") {
                    i = number(p, n, at: i)
                } else {
                    i = value(p, n, at: i, depth: depth + 1, sawEscape: &sawEscape, high: &bits)
                }
                guard i >= 0, i < n else { return -1 }
                let next = p[i]
                if next == UInt8(ascii: ",") {
                    i += 1
                } else {
                    guard next == close else { return -1 }
                    high |= bits
                    return i + 1
                }
            }
        }

        /// A string whose opening quote is at `i`: plain bytes from U+0020 on (any UTF-8, which
        /// a Swift string holds well-formed) and the escapes other than `\u`. Sets `sawEscape`
        /// when it holds an escape; ORs every byte it reads into `high` (eight at a time where it
        /// reads eight, which may reach past the closing quote).
        @inline(__always)
        static func string(
            _ p: UnsafePointer<UInt8>, _ n: Int, at start: Int, sawEscape: inout Bool, high: inout UInt64
        ) -> Int {
            var i = start &+ 1
            while i < n {
                // Eight bytes at a time up to the first quote, backslash or control character.
                if n &- i >= 8 {
                    let word = UInt64(littleEndian: UnsafeRawPointer(p + i).loadUnaligned(as: UInt64.self))
                    high |= word
                    let special = specialBytes(word)
                    if special == 0 {
                        i &+= 8
                        continue
                    }
                    i &+= special.trailingZeroBitCount &>> 3
                }
                let b = p[i]
                high |= UInt64(b)
                i &+= 1
                if b >= 0x20 && b != quote && b != backslash { continue }
                if b == quote { return i }
                guard b == backslash, i < n, UTF8Check.jsonEscape(p[i]) != nil else { return -1 }
                sawEscape = true
                i += 1
            }
            return -1
        }

        /// The high bit of each byte of `word` (byte 0 the lowest) that is `"`, `\` or below
        /// U+0020, and maybe of bytes above the lowest such byte: a byte's test borrows only from
        /// the bytes below it, so the lowest bit set always marks such a byte; zero when there is
        /// none.
        @inline(__always)
        static func specialBytes(_ word: UInt64) -> UInt64 {
            let ones: UInt64 = 0x0101_0101_0101_0101
            let quotes = word ^ (ones &* UInt64(quote))
            let backslashes = word ^ (ones &* UInt64(backslash))
            let zeroQuote = (quotes &- ones) & ~quotes
            let zeroBackslash = (backslashes &- ones) & ~backslashes
            let control = (word &- ones &* 0x20) & ~word
            return (zeroQuote | zeroBackslash | control) & (ones &* 0x80)
        }

        /// `-? (0 | [1-9][0-9]*) (.[0-9]+)?` of at most 300 digits: always a finite number; an
        /// integer beyond int64 is declined (the parser refuses it).
        @inline(__always)
        private static func number(_ p: UnsafePointer<UInt8>, _ n: Int, at start: Int) -> Int {
            var i = start
            if p[i] == UInt8(ascii: "-") { i += 1 }
            let digitsStart = i
            guard i < n, p[i] &- UInt8(ascii: "0") < 10 else { return -1 }
            if p[i] == UInt8(ascii: "0") {
                i += 1
                if i < n, p[i] &- UInt8(ascii: "0") < 10 { return -1 }
            } else {
                i += 1
                while i < n, p[i] &- UInt8(ascii: "0") < 10 { i += 1 }
            }
            if i < n, p[i] == UInt8(ascii: ".") {
                i += 1
                let fractionStart = i
                while i < n, p[i] &- UInt8(ascii: "0") < 10 { i += 1 }
                guard i > fractionStart else { return -1 }
            } else if i - digitsStart >= 19,
                !fitsInt64(p + digitsStart, i - digitsStart, negative: digitsStart > start)
            {
                return -1
            }
            if i < n, p[i] | 0x20 == UInt8(ascii: "e") { return -1 }
            return i - digitsStart <= 301 ? i : -1
        }

        /// Whether the `count` digits at `digits` (no leading zero), negated when `negative`, are
        /// within int64.
        private static func fitsInt64(_ digits: UnsafePointer<UInt8>, _ count: Int, negative: Bool) -> Bool {
            guard count <= 19 else { return false }
            guard count == 19 else { return true }
            let bound: StaticString = negative ? "9223372036854775808" : "9223372036854775807"
            for k in 0..<19 where digits[k] != bound.utf8Start[k] { return digits[k] < bound.utf8Start[k] }
            return true
        }

        private static func literal(_ p: UnsafePointer<UInt8>, _ n: Int, at i: Int, _ word: StaticString) -> Int {
            let count = word.utf8CodeUnitCount
            guard n - i >= count else { return -1 }
            for k in 0..<count where p[i + k] != word.utf8Start[k] { return -1 }
            return i + count
        }
    }
}
