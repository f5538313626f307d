/// One token of a query string, with its place in the text.
struct QueryToken: Sendable {
    enum Kind: Equatable, Sendable {
        case end
        case leftParen, rightParen, leftBracket, rightBracket, leftBrace, rightBrace, comma, colon
        case not, and, or
        case compare(QueryPredicate.ComparisonOperator)
        case int(Int64)
        case double(Double)
        case string(String)
        case bytes([UInt8])
        /// A bare identifier with nothing after it: a keyword (`true`, `IN`, ...) or a one-key path.
        case word(String)
        /// A field path with more than one segment, or with a backtick-quoted segment.
        case path(FieldPath)
        /// `$args.name...`: the path inside the arguments map.
        case argument(FieldPath)
        /// A character that starts no token; the parser reports it against what it expected.
        case unknown
    }

    var kind: Kind
    /// Byte offset of the first byte in the UTF-8 text.
    var offset: Int
    /// Byte offset just past the last byte.
    var end: Int
}

/// Splits a query into tokens on demand, so the first error in the text is the one reported.
///
/// Works on the UTF-8 bytes; every offset is a byte offset into `text.utf8`.
struct QueryLexer: Sendable {
    let text: String
    let bytes: [UInt8]
    private(set) var position = 0

    init(_ text: String) {
        self.text = text
        self.bytes = Array(text.utf8)
    }

    /// The next token; `.end` once the text is used up (and for every call after that).
    mutating func next() throws(QueryParseError) -> QueryToken {
        while position < bytes.count, Self.isSpace(bytes[position]) { position += 1 }
        let start = position
        guard position < bytes.count else { return QueryToken(kind: .end, offset: start, end: start) }
        let c = bytes[position]
        let kind: QueryToken.Kind
        switch c {
        case UInt8(ascii: "("):
            position += 1
            kind = .leftParen
        case UInt8(ascii: ")"):
            position += 1
            kind = .rightParen
        case UInt8(ascii: "["):
            position += 1
            kind = .leftBracket
        case UInt8(ascii: "]"):
            position += 1
            kind = .rightBracket
        case UInt8(ascii: "{"):
            position += 1
            kind = .leftBrace
        case UInt8(ascii: "}"):
            position += 1
            kind = .rightBrace
        case UInt8(ascii: ","):
            position += 1
            kind = .comma
        case UInt8(ascii: ":"):
            position += 1
            kind = .colon
        case UInt8(ascii: "="):
            guard peek(1) == UInt8(ascii: "=") else { throw error(at: start, expected: "'=='") }
            position += 2
            kind = .compare(.equal)
        case UInt8(ascii: "!"):
            if peek(1) == UInt8(ascii: "=") {
                position += 2
                kind = .compare(.notEqual)
            } else {
                position += 1
                kind = .not
            }
        case UInt8(ascii: "<"):
            if peek(1) == UInt8(ascii: "=") {
                position += 2
                kind = .compare(.lessOrEqual)
            } else {
                position += 1
                kind = .compare(.less)
            }
        case UInt8(ascii: ">"):
            if peek(1) == UInt8(ascii: "=") {
                position += 2
                kind = .compare(.greaterOrEqual)
            } else {
                position += 1
                kind = .compare(.greater)
            }
        case UInt8(ascii: "&"):
            guard peek(1) == UInt8(ascii: "&") else { throw error(at: start, expected: "'&&'") }
            position += 2
            kind = .and
        case UInt8(ascii: "|"):
            guard peek(1) == UInt8(ascii: "|") else { throw error(at: start, expected: "'||'") }
            position += 2
            kind = .or
        case UInt8(ascii: "'"), UInt8(ascii: "\""):
            kind = .string(try lexQuoted())
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            kind = try lexNumber()
        case UInt8(ascii: "x") where peek(1) == UInt8(ascii: "'"),
            UInt8(ascii: "X") where peek(1) == UInt8(ascii: "'"):
            kind = .bytes(try lexBytes())
        default:
            if Self.isIdentifierStart(c) || c == UInt8(ascii: "`") {
                kind = try lexPath()
            } else {
                position = min(bytes.count, position + Self.scalarLength(c))
                kind = .unknown
            }
        }
        return QueryToken(kind: kind, offset: start, end: position)
    }

    // MARK: Character classes

    static func isSpace(_ c: UInt8) -> Bool {
        c == 0x20 || c == 0x09 || c == 0x0A || c == 0x0D
    }

    static func isIdentifierStart(_ c: UInt8) -> Bool {
        (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c == 95 || c == 36
    }

    static func isIdentifierPart(_ c: UInt8) -> Bool { isIdentifierStart(c) || isDigit(c) }

    static func isDigit(_ c: UInt8) -> Bool { c >= 48 && c <= 57 }

    /// Length in bytes of the UTF-8 sequence that starts with `lead` (1 for stray bytes).
    static func scalarLength(_ lead: UInt8) -> Int {
        switch lead {
        case 0xF0...0xF7: return 4
        case 0xE0...0xEF: return 3
        case 0xC0...0xDF: return 2
        default: return 1
        }
    }

    private func peek(_ ahead: Int) -> UInt8? {
        position + ahead < bytes.count ? bytes[position + ahead] : nil
    }

    // MARK: Errors

    /// An error at `offset` whose "found" part is the character there (or the end of the query).
    func error(at offset: Int, expected: String, hint: String? = nil) -> QueryParseError {
        QueryParseError(
            text: text, bytes: bytes, offset: offset, found: describeCharacter(at: offset),
            expected: expected, hint: hint)
    }

    func describeCharacter(at offset: Int) -> String {
        guard offset < bytes.count else { return "end of query" }
        let end = min(bytes.count, offset + Self.scalarLength(bytes[offset]))
        let piece = String(decoding: bytes[offset..<end], as: UTF8.self)
        if let scalar = piece.unicodeScalars.first, scalar.value < 0x20 || scalar.value == 0x7F {
            return "control character U+\(Self.hex(scalar.value, width: 4))"
        }
        return "'\(piece)'"
    }

    static func hex(_ value: UInt32, width: Int) -> String {
        let digits = String(value, radix: 16, uppercase: true)
        return String(repeating: "0", count: max(0, width - digits.count)) + digits
    }

    // MARK: Literals

    /// A number: `-?digits(.digits)?([eE][+-]?digits)?`. Integers that fit become `.int`, every
    /// other number `.double` (the JSON rule of DESIGN.md).
    private mutating func lexNumber() throws(QueryParseError) -> QueryToken.Kind {
        let start = position
        var isInteger = true
        if bytes[position] == UInt8(ascii: "-") {
            position += 1
            guard let d = peek(0), Self.isDigit(d) else { throw error(at: position, expected: "a digit after '-'") }
        }
        while let d = peek(0), Self.isDigit(d) { position += 1 }
        if peek(0) == UInt8(ascii: ".") {
            isInteger = false
            position += 1
            guard let d = peek(0), Self.isDigit(d) else { throw error(at: position, expected: "a digit after '.'") }
            while let d = peek(0), Self.isDigit(d) { position += 1 }
        }
        if let e = peek(0), e == UInt8(ascii: "e") || e == UInt8(ascii: "E") {
            isInteger = false
            position += 1
            if let sign = peek(0), sign == UInt8(ascii: "+") || sign == UInt8(ascii: "-") { position += 1 }
            guard let d = peek(0), Self.isDigit(d) else {
                throw error(at: position, expected: "a digit in the exponent")
            }
            while let d = peek(0), Self.isDigit(d) { position += 1 }
        }
        if let next = peek(0), Self.isIdentifierPart(next) || next == UInt8(ascii: ".") || next == UInt8(ascii: "`") {
            throw error(at: position, expected: "an operator or a space after the number")
        }
        let spelling = String(decoding: bytes[start..<position], as: UTF8.self)
        if isInteger, let i = Int64(spelling) { return .int(i) }
        guard let d = Double(spelling), d.isFinite else {
            throw QueryParseError(
                text: text, bytes: bytes, offset: start, found: "number \(spelling)",
                expected: "a finite number (at most about 1.8e308)")
        }
        return .double(d)
    }

    /// A string in single or double quotes, or a backtick-quoted path segment, with escapes
    /// `\\ \' \" \` \/ \n \r \t \uXXXX` (a surrogate pair for scalars above U+FFFF).
    private mutating func lexQuoted() throws(QueryParseError) -> String {
        let start = position
        let quote = bytes[position]
        position += 1
        var out: [UInt8] = []
        while true {
            guard position < bytes.count else {
                let what = quote == UInt8(ascii: "`") ? "quoted name" : "string"
                let column = QueryParseError.location(of: start, in: bytes).column
                throw error(
                    at: position,
                    expected: "a closing \(Character(Unicode.Scalar(quote))) (the \(what) opened at column "
                        + "\(column))")
            }
            let c = bytes[position]
            if c == quote {
                position += 1
                break
            }
            if c != UInt8(ascii: "\\") {
                out.append(c)
                position += 1
                continue
            }
            let escapeStart = position
            position += 1
            guard let e = peek(0) else { throw error(at: position, expected: "an escaped character after '\\'") }
            position += 1
            switch e {
            case UInt8(ascii: "\\"), UInt8(ascii: "'"), UInt8(ascii: "\""), UInt8(ascii: "`"), UInt8(ascii: "/"):
                out.append(e)
            case UInt8(ascii: "n"): out.append(0x0A)
            case UInt8(ascii: "r"): out.append(0x0D)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "u"):
                var scalar = try lexHex4(escapeStart: escapeStart)
                if (0xD800...0xDBFF).contains(scalar) {
                    guard peek(0) == UInt8(ascii: "\\"), peek(1) == UInt8(ascii: "u") else {
                        throw error(at: position, expected: "a low surrogate \\uDC00-\\uDFFF after a high surrogate")
                    }
                    let lowStart = position
                    position += 2
                    let low = try lexHex4(escapeStart: lowStart)
                    guard (0xDC00...0xDFFF).contains(low) else {
                        throw error(at: lowStart, expected: "a low surrogate \\uDC00-\\uDFFF after a high surrogate")
                    }
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                } else if (0xDC00...0xDFFF).contains(scalar) {
                    throw error(at: escapeStart, expected: "a high surrogate before a low surrogate")
                }
                guard let decoded = Unicode.Scalar(scalar) else {
                    throw error(at: escapeStart, expected: "a Unicode scalar value")
                }
                UTF8.encode(decoded) { out.append($0) }
            default:
                let end = min(bytes.count, position - 1 + Self.scalarLength(e))
                throw QueryParseError(
                    text: text, bytes: bytes, offset: escapeStart,
                    found: "'" + String(decoding: bytes[escapeStart..<end], as: UTF8.self) + "'",
                    expected: "an escape \\\\, \\', \\\", \\`, \\/, \\n, \\r, \\t or \\uXXXX")
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    private mutating func lexHex4(escapeStart: Int) throws(QueryParseError) -> UInt32 {
        var value: UInt32 = 0
        for _ in 0..<4 {
            guard let h = peek(0), let digit = Self.hexValue(h) else {
                throw error(at: position, expected: "four hex digits after \\u")
            }
            value = value << 4 | UInt32(digit)
            position += 1
        }
        return value
    }

    static func hexValue(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return c - UInt8(ascii: "A") + 10
        default: return nil
        }
    }

    /// A bytes literal `x'00ff'`: an even number of hex digits.
    private mutating func lexBytes() throws(QueryParseError) -> [UInt8] {
        let start = position
        position += 2
        var out: [UInt8] = []
        while true {
            guard let c = peek(0) else {
                let column = QueryParseError.location(of: start, in: bytes).column
                throw error(at: position, expected: "a closing ' (the bytes literal opened at column \(column))")
            }
            if c == UInt8(ascii: "'") {
                position += 1
                return out
            }
            guard let high = Self.hexValue(c), let next = peek(1), let low = Self.hexValue(next) else {
                let at = Self.hexValue(c) == nil ? position : position + 1
                throw error(at: at, expected: "pairs of hex digits in a bytes literal like x'00ff'")
            }
            out.append(high << 4 | low)
            position += 2
        }
    }

    // MARK: Paths

    /// A field path `a.b[2].c` (segments may be backtick-quoted), or `$args.name...`.
    private mutating func lexPath() throws(QueryParseError) -> QueryToken.Kind {
        var components: [FieldPath.Component] = []
        var quotedAny = false
        var isArgument = false
        var first = true
        while true {
            // One key segment.
            if peek(0) == UInt8(ascii: "`") {
                components.append(.key(try lexQuoted()))
                quotedAny = true
            } else {
                guard let c = peek(0), Self.isIdentifierStart(c) else {
                    throw error(
                        at: position, expected: "a field name after '.'",
                        hint: "quote names that are not identifiers in backticks: a.`odd name`")
                }
                let start = position
                while let c = peek(0), Self.isIdentifierPart(c) { position += 1 }
                let name = String(decoding: bytes[start..<position], as: UTF8.self)
                if first, name == "$args" {
                    isArgument = true
                    guard peek(0) == UInt8(ascii: ".") else {
                        throw error(at: position, expected: "'.' and an argument name after '$args'")
                    }
                } else {
                    components.append(.key(name))
                }
                // `IN[1, 2]` is the operator followed by a list, not an index into a field `IN`.
                if first, name == "IN" || name == "in", peek(0) == UInt8(ascii: "[") { break }
            }
            first = false
            // Index suffixes.
            while peek(0) == UInt8(ascii: "[") {
                let open = position
                position += 1
                let digitsStart = position
                while let d = peek(0), Self.isDigit(d) { position += 1 }
                guard position > digitsStart, peek(0) == UInt8(ascii: "]") else {
                    throw error(at: position, expected: "an array index like [0]")
                }
                guard let index = Int(String(decoding: bytes[digitsStart..<position], as: UTF8.self)),
                    index <= Int(Int32.max)
                else {
                    throw QueryParseError(
                        text: text, bytes: bytes, offset: digitsStart,
                        found: "'" + String(decoding: bytes[open...position], as: UTF8.self) + "'",
                        expected: "an array index of at most \(Int32.max)")
                }
                components.append(.index(index))
                position += 1
            }
            guard peek(0) == UInt8(ascii: ".") else { break }
            position += 1
        }
        let path = FieldPath(components: components)
        if isArgument { return .argument(path) }
        if !quotedAny, components.count == 1, case .key(let name) = components[0] { return .word(name) }
        return .path(path)
    }
}
