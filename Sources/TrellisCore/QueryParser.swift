/// Recursive-descent parser for the grammar written down on ``Query``.
///
/// Recursion happens only where the text nests (`(`, `!`, list and map literals), and every
/// such level is counted against ``Query/maximumDepth``, so no input can exhaust the stack.
struct QueryParser {
    private var lexer: QueryLexer
    private var token: QueryToken
    private var depth = 0

    init(_ text: String) throws(QueryParseError) {
        lexer = QueryLexer(text)
        token = try lexer.next()
    }

    /// Parses the whole text; the empty text (or only spaces) is `true`.
    mutating func parseQuery() throws(QueryParseError) -> QueryPredicate {
        if token.kind == .end { return .constant(true) }
        let predicate = try parseOr()
        guard token.kind == .end else {
            throw error(expected: "'&&', '||' or the end of the query")
        }
        return predicate
    }

    // MARK: Token helpers

    private mutating func advance() throws(QueryParseError) {
        token = try lexer.next()
    }

    private func peekKind() throws(QueryParseError) -> QueryToken.Kind {
        var copy = lexer
        return try copy.next().kind
    }

    private mutating func expect(_ kind: QueryToken.Kind, _ expected: String) throws(QueryParseError) {
        guard token.kind == kind else { throw error(expected: expected) }
        try advance()
    }

    private mutating func enter() throws(QueryParseError) {
        depth += 1
        if depth > Query.maximumDepth {
            throw error(
                expected: "at most \(Query.maximumDepth) levels of nesting",
                hint: "split the query or flatten its parentheses")
        }
    }

    private mutating func leave() { depth -= 1 }

    /// An error at the current token.
    private func error(expected: String, hint: String? = nil) -> QueryParseError {
        QueryParseError(
            text: lexer.text, bytes: lexer.bytes, offset: token.offset, found: describe(token),
            expected: expected, hint: hint)
    }

    private func describe(_ token: QueryToken) -> String {
        let source = String(decoding: lexer.bytes[token.offset..<token.end], as: UTF8.self)
        let shown = source.count > 32 ? String(source.prefix(32)) + "…" : source
        switch token.kind {
        case .end: return "end of query"
        case .unknown: return lexer.describeCharacter(at: token.offset)
        case .int, .double: return "number \(shown)"
        case .string: return "string \(shown)"
        case .bytes: return "bytes \(shown)"
        case .word(let w) where Query.keywords.contains(w): return "'\(shown)'"
        case .word, .path: return "field '\(shown)'"
        case .argument: return "argument '\(shown)'"
        default: return "'\(shown)'"
        }
    }

    // MARK: Predicates

    /// `disjunction = conjunction { "||" conjunction }`
    private mutating func parseOr() throws(QueryParseError) -> QueryPredicate {
        var terms = [try parseAnd()]
        while token.kind == .or {
            try advance()
            terms.append(try parseAnd())
        }
        return terms.count == 1 ? terms[0] : .or(terms)
    }

    /// `conjunction = unary { "&&" unary }`
    private mutating func parseAnd() throws(QueryParseError) -> QueryPredicate {
        var terms = [try parseUnary()]
        while token.kind == .and {
            try advance()
            terms.append(try parseUnary())
        }
        return terms.count == 1 ? terms[0] : .and(terms)
    }

    /// `unary = "!" negated | term`
    private mutating func parseUnary() throws(QueryParseError) -> QueryPredicate {
        guard token.kind == .not else { return try parseTerm() }
        return try parseNegation()
    }

    /// `"!" negated` where `negated = "!" negated | group | contains | "true" | "false"`.
    ///
    /// `!` binds tighter than comparisons, so `!a == 1` would negate the field `a`, which is not a
    /// condition: it is rejected with a hint to write `!(a == 1)`.
    private mutating func parseNegation() throws(QueryParseError) -> QueryPredicate {
        try enter()
        defer { leave() }
        try advance()  // the "!"
        switch token.kind {
        case .not:
            return .not(try parseNegation())
        case .leftParen:
            return .not(try parseGroup())
        case .word("contains") where try peekKind() == .leftParen:
            return .not(try parseContains())
        case .word("true"), .word("false"):
            let value = token.kind == .word("true")
            try advance()
            return .not(.constant(value))
        default:
            throw error(
                expected: "'(', 'contains(', 'true', 'false' or '!' after '!'",
                hint: "to negate a comparison write !(a == 1)")
        }
    }

    /// `group = "(" disjunction ")"`
    private mutating func parseGroup() throws(QueryParseError) -> QueryPredicate {
        try enter()
        defer { leave() }
        try advance()  // the "("
        let inner = try parseOr()
        try expect(.rightParen, "')'")
        return inner
    }

    /// `term = group | contains | comparison | "true" | "false"`
    private mutating func parseTerm() throws(QueryParseError) -> QueryPredicate {
        switch token.kind {
        case .leftParen:
            return try parseGroup()
        case .word("contains") where try peekKind() == .leftParen:
            return try parseContains()
        default:
            guard startsOperand(token.kind) else { throw error(expected: "a condition") }
        }
        let lhsToken = token
        let lhs = try parseOperand()
        switch token.kind {
        case .compare(let op):
            try advance()
            let rhs = try parseOperand()
            return .compare(lhs, op, rhs)
        case .word("IN"), .word("in"):
            try advance()
            switch token.kind {
            case .leftBracket, .argument: return .isIn(lhs, try parseOperand())
            default: throw error(expected: "a list like [1, 2] or an $args reference after IN")
            }
        default:
            // `true` / `false` alone are conditions; any other lone operand is not.
            if case .literal(.bool(let b)) = lhs { return .constant(b) }
            let bareField =
                token.kind == .end || token.kind == .and || token.kind == .or
                || token.kind == .rightParen
            throw error(
                expected: "a comparison operator (==, !=, <, <=, >, >=) or IN after \(describe(lhsToken))",
                hint: bareField ? "compare booleans explicitly, e.g. isDeleted == true" : nil)
        }
    }

    /// `contains = "contains" "(" operand "," operand ")"`
    private mutating func parseContains() throws(QueryParseError) -> QueryPredicate {
        try advance()  // "contains"
        try expect(.leftParen, "'(' after contains")
        let haystack = try parseOperand()
        try expect(.comma, "',' between the arguments of contains")
        let needle = try parseOperand()
        try expect(.rightParen, "')' after the second argument of contains")
        return .contains(haystack, needle)
    }

    // MARK: Operands and literals

    private func startsOperand(_ kind: QueryToken.Kind) -> Bool {
        switch kind {
        case .int, .double, .string, .bytes, .word, .path, .argument, .leftBracket, .leftBrace: return true
        default: return false
        }
    }

    /// `operand = literal | path | argument`
    private mutating func parseOperand() throws(QueryParseError) -> QueryPredicate.Operand {
        switch token.kind {
        case .word(let name) where name != "true" && name != "false" && name != "null":
            try advance()
            return .field(FieldPath(components: [.key(name)]))
        case .path(let path):
            try advance()
            return .field(path)
        case .argument(let path):
            try advance()
            return .argument(path)
        default:
            return .literal(try parseLiteral(expected: "a value, a field or an $args reference"))
        }
    }

    /// `literal = "null" | "true" | "false" | number | string | bytes | list | map`
    private mutating func parseLiteral(expected: String) throws(QueryParseError) -> Value {
        let value: Value
        switch token.kind {
        case .word("null"): value = .null
        case .word("true"): value = .bool(true)
        case .word("false"): value = .bool(false)
        case .int(let i): value = .int(i)
        case .double(let d): value = .double(d)
        case .string(let s): value = .string(s)
        case .bytes(let b): value = .bytes(b)
        case .leftBracket: return try parseList()
        case .leftBrace: return try parseMap()
        case .path, .argument, .word:
            throw error(
                expected: expected,
                hint: "list and map literals hold constants only; pass a whole "
                    + "list as one argument: x IN $args.list")
        default:
            throw error(expected: expected)
        }
        try advance()
        return value
    }

    /// `list = "[" [ literal { "," literal } ] "]"`
    private mutating func parseList() throws(QueryParseError) -> Value {
        try enter()
        defer { leave() }
        try advance()  // "["
        var elements: [Value] = []
        if token.kind == .rightBracket {
            try advance()
            return .array(elements)
        }
        while true {
            elements.append(try parseLiteral(expected: "a constant value in the list"))
            if token.kind == .rightBracket { break }
            try expect(.comma, "',' or ']' in the list")
        }
        try advance()  // "]"
        return .array(elements)
    }

    /// `map = "{" [ key ":" literal { "," key ":" literal } ] "}"` where a key is a string or an
    /// identifier.
    private mutating func parseMap() throws(QueryParseError) -> Value {
        try enter()
        defer { leave() }
        try advance()  // "{"
        var entries = UTF8Map<Value>()
        if token.kind == .rightBrace {
            try advance()
            return .map(entries)
        }
        while true {
            let key: String
            switch token.kind {
            case .string(let s), .word(let s): key = s
            default: throw error(expected: "a key (a string or a name) in the map")
            }
            if entries[key] != nil {
                throw error(expected: "each key once in a map literal")
            }
            try advance()
            try expect(.colon, "':' after the key")
            entries[key] = try parseLiteral(expected: "a constant value in the map")
            if token.kind == .rightBrace { break }
            try expect(.comma, "',' or '}' in the map")
        }
        try advance()  // "}"
        return .map(entries)
    }
}
