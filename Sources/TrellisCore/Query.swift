/// A parsed query in Ditto's legacy predicate syntax: `color == 'red' && mileage > $args.min`.
///
/// The full reference, with the comparison rules and error messages, is `docs/QUERIES.md`.
///
/// Grammar (ISO EBNF). Spaces, tabs, CR and LF may stand between tokens; a number, string,
/// bytes literal, field path or `$args` reference is one token and holds no spaces.
///
/// ```
/// query       = [ disjunction ] ;                      (* empty text: every document *)
/// disjunction = conjunction , { "||" , conjunction } ;
/// conjunction = unary , { "&&" , unary } ;
/// unary       = "!" , negated | term ;
/// negated     = "!" , negated | group | contains | "true" | "false" ;
/// term        = group | contains | comparison | "true" | "false" ;
/// group       = "(" , disjunction , ")" ;
/// contains    = "contains" , "(" , operand , "," , operand , ")" ;
/// comparison  = operand , ( compare-op , operand | in-op , ( list | argument ) ) ;
/// compare-op  = "==" | "!=" | "<" | "<=" | ">" | ">=" ;
/// in-op       = "IN" | "in" ;
/// operand     = literal | path | argument ;
/// argument    = "$args" , "." , path ;
/// path        = segment , { index } , { "." , segment , { index } } ;
/// segment     = identifier | quoted-name ;
/// identifier  = ( letter | "_" | "$" ) , { letter | digit | "_" | "$" } ;   (* ASCII letters *)
/// quoted-name = "`" , { character - ( "`" | "\" ) | escape } , "`" ;
/// index       = "[" , digit , { digit } , "]" ;
/// literal     = "null" | "true" | "false" | number | string | bytes | list | map ;
/// number      = [ "-" ] , digit , { digit } , [ "." , digit , { digit } ] ,
///               [ ( "e" | "E" ) , [ "+" | "-" ] , digit , { digit } ] ;
/// string      = "'" , { character - ( "'" | "\" ) | escape } , "'"
///             | '"' , { character - ( '"' | "\" ) | escape } , '"' ;
/// escape      = "\" , ( "\" | "'" | '"' | "`" | "/" | "n" | "r" | "t" | "u" , 4 * hex ) ;
/// bytes       = ( "x" | "X" ) , "'" , { hex , hex } , "'" ;
/// list        = "[" , [ literal , { "," , literal } ] , "]" ;
/// map         = "{" , [ key , ":" , literal , { "," , key , ":" , literal } ] , "}" ;
/// key         = string | identifier ;
/// ```
///
/// Precedence, tightest first: `!`, comparisons (`==` ... `IN`), `&&`, `||`. Because `!` binds
/// tighter than comparisons and a field is not a condition, `!a == 1` is an error: write
/// `!(a == 1)`. A `term` that is a lone operand must be `true` or `false` (Ditto wants booleans
/// compared explicitly: `isDeleted == true`). `true`, `false` and `null` are literals only as a
/// whole bare word (a field named `true` is written `` `true` ``); `contains` is the function only
/// when `(` follows; the first segment `$args` starts an argument reference (a field named
/// `$args` is written `` `$args` ``). Integers that fit in `Int64` are `.int`, every other
/// number `.double`. A `\u` escape of a scalar above U+FFFF is a surrogate pair.
///
/// Equality and hashing follow ``predicate``: two queries that differ only in spacing or quote
/// style are equal.
public struct Query: Sendable, Hashable, CustomStringConvertible {
    /// How deeply parentheses, `!` and literal lists and maps may nest.
    public static let maximumDepth = 200

    /// Bare words with a meaning of their own.
    static let keywords: Set<String> = ["true", "false", "null", "IN", "in", "contains"]

    /// The syntax tree type, ``QueryPredicate``, under the name it had before it was renamed so as
    /// not to shadow Foundation's `Predicate`. A nested name shadows nothing, so it stays.
    public typealias Predicate = QueryPredicate

    /// The text this query was parsed from; for a query built from a ``QueryPredicate`` or bound to
    /// arguments, the predicate's canonical text.
    public let text: String
    /// The syntax tree.
    public let predicate: QueryPredicate
    /// Whether `predicate` holds `$args` references, computed once.
    private let needsArguments: Bool

    /// Parses a query.
    ///
    /// - Parameter text: the query; the empty string (or only spaces) matches every document.
    /// - Throws: ``QueryParseError`` for the first problem in the text, with its place, what was
    ///   found there and what was expected. Never traps, whatever the input.
    /// - Complexity: O(length of `text`).
    public init(_ text: String) throws(QueryParseError) {
        var parser = try QueryParser(text)
        self.text = text
        self.predicate = try parser.parseQuery()
        self.needsArguments = predicate.hasArguments
    }

    /// A query from a syntax tree; ``text`` is its canonical text.
    public init(predicate: QueryPredicate) {
        self.text = predicate.description
        self.predicate = predicate
        self.needsArguments = predicate.hasArguments
    }

    /// The query that matches every document (`true`).
    public static let all = Query(predicate: .constant(true))

    /// Whether the query is exactly `true` (so a store can skip evaluating it).
    public var isMatchAll: Bool { predicate == .constant(true) }

    /// The canonical text of the predicate (see ``QueryPredicate/description``).
    public var description: String { predicate.description }

    /// The query with every `$args` reference replaced by its value, ready to be evaluated many
    /// times (or translated to SQL) without arguments.
    ///
    /// Every reference is checked, including ones that evaluation would short-circuit past, so
    /// a missing argument is reported whatever the documents are.
    ///
    /// - Parameter args: the arguments map; `$args.a.b` reads key `b` of `args["a"]`.
    /// - Throws: ``QueryEvaluationError/missingArgument(name:)`` naming the first missing argument,
    ///   ``QueryEvaluationError/invalidArgument(name:reason:)`` for NaN or ±Infinity, or for an
    ///   argument of `IN` that is not a list.
    /// - Complexity: O(size of the predicate + size of the argument values used).
    public func bind(args: UTF8Map<Value>) throws(QueryEvaluationError) -> Query {
        guard needsArguments else { return self }
        return Query(predicate: try predicate.bound(to: args))
    }

    /// Whether a document matches.
    ///
    /// - Parameters:
    ///   - document: the document, usually a map holding `_id` and the fields.
    ///   - args: values for `$args` references; ignored when the query has none. To evaluate one
    ///     query on many documents, ``bind(args:)`` once and call this without arguments.
    /// - Throws: ``QueryEvaluationError`` when an argument is missing or not finite (checked before
    ///   looking at the document). Nothing about the document itself is an error: comparisons
    ///   across types are simply false.
    /// - Complexity: O(size of the predicate × size of the values it compares), plus binding.
    public func matches(_ document: Value, args: UTF8Map<Value> = [:]) throws(QueryEvaluationError) -> Bool {
        if needsArguments {
            return try predicate.bound(to: args).matches(document)
        }
        return predicate.matches(document)
    }

    public static func == (lhs: Query, rhs: Query) -> Bool { lhs.predicate == rhs.predicate }

    public func hash(into hasher: inout Hasher) { hasher.combine(predicate) }
}

/// A query that does not parse.
///
/// ``description`` reads `expected ')' at column 14, found end of query` (with `line L, column C`
/// when the text has several lines, and a hint after `;` where one helps).
public struct QueryParseError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The whole query text.
    public var text: String
    /// Byte offset of the problem in `text.utf8`.
    public var offset: Int
    /// 1-based line of the problem.
    public var line: Int
    /// 1-based column of the problem, counted in characters (grapheme clusters) from the start of
    /// its line.
    public var column: Int
    /// What stands at the problem: `end of query`, `')'`, `field 'a'`, `number 12`, ...
    public var found: String
    /// What the grammar allows there: `')'`, `a condition`, ...
    public var expected: String
    /// A suggestion, when one helps.
    public var hint: String?

    public init(text: String, offset: Int, found: String, expected: String, hint: String? = nil) {
        self.init(text: text, bytes: Array(text.utf8), offset: offset, found: found, expected: expected, hint: hint)
    }

    init(text: String, bytes: [UInt8], offset: Int, found: String, expected: String, hint: String? = nil) {
        self.text = text
        self.offset = offset
        (self.line, self.column) = Self.location(of: offset, in: bytes)
        self.found = found
        self.expected = expected
        self.hint = hint
    }

    /// 1-based line and column (in characters) of a byte offset.
    static func location(of offset: Int, in bytes: [UInt8]) -> (line: Int, column: Int) {
        let end = max(0, min(offset, bytes.count))
        var line = 1
        var lineStart = 0
        for i in 0..<end where bytes[i] == 0x0A {
            line += 1
            lineStart = i + 1
        }
        let column = String(decoding: bytes[lineStart..<end], as: UTF8.self).count + 1
        return (line, column)
    }

    public var description: String {
        let place = text.utf8.contains(0x0A) ? "line \(line), column \(column)" : "column \(column)"
        var message = "expected \(expected) at \(place), found \(found)"
        if let hint { message += "; \(hint)" }
        return message
    }
}

/// A query that cannot be evaluated with the arguments given.
public enum QueryEvaluationError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The query reads `$args.<name>` but the arguments map has no value there. `name` is the path
    /// inside the map, e.g. `min` or `range.low`.
    case missingArgument(name: String)
    /// The argument holds a value a query cannot use (NaN or ±Infinity).
    case invalidArgument(name: String, reason: String)

    public var description: String {
        switch self {
        case .missingArgument(let name):
            return "missing query argument $args.\(name): pass a value for it in args"
        case .invalidArgument(let name, let reason):
            return "invalid query argument $args.\(name): \(reason)"
        }
    }
}
