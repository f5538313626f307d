/// The syntax tree of a query: what ``Query`` parses its text into.
///
/// It is public so that a store can translate it (see ``sqlWhere(column:)``) and so that code can
/// build queries without writing text. Walk it by switching over the cases, or with ``children``,
/// ``operands`` and ``forEach(_:)``. ``description`` prints the canonical query text.
///
/// Named `QueryPredicate` rather than `Predicate` so that it does not shadow Foundation's `Predicate`
/// (`Predicate<Input>`, built by `#Predicate`) in code that imports both. `Query.Predicate` names
/// this type too.
///
/// A tree built by the parser nests at most ``Query/maximumDepth`` levels, and `&&` / `||` chains
/// are flat lists, so recursive walks stay shallow however long the query is.
public indirect enum QueryPredicate: Sendable, Hashable {
    /// `true` (every document) or `false` (none).
    case constant(Bool)
    /// `!p`.
    case not(QueryPredicate)
    /// `p1 && p2 && ...`; an empty list is `true`.
    case and([QueryPredicate])
    /// `p1 || p2 || ...`; an empty list is `false`.
    case or([QueryPredicate])
    /// `lhs op rhs`.
    case compare(Operand, ComparisonOperator, Operand)
    /// `contains(haystack, needle)`: an array holding an element equal to `needle`, or a string
    /// holding `needle` as a substring (byte-wise).
    case contains(Operand, Operand)
    /// `lhs IN rhs`: `rhs` is an array holding an element equal to `lhs`.
    case isIn(Operand, Operand)

    /// One side of a comparison.
    public enum Operand: Sendable, Hashable {
        /// A constant: `1`, `2.5`, `'red'`, `null`, `[1, 2]`, `{'a': 1}`, `x'00ff'`.
        case literal(Value)
        /// A field of the document: `a.b[2].c`. Missing when any step is missing.
        case field(FieldPath)
        /// `$args.name...`: the value at this path in the arguments map. The first component is
        /// the argument's name.
        case argument(FieldPath)
    }

    /// The comparison operators, spelled as in the query language.
    public enum ComparisonOperator: String, Sendable, Hashable, CaseIterable {
        case equal = "=="
        case notEqual = "!="
        case less = "<"
        case lessOrEqual = "<="
        case greater = ">"
        case greaterOrEqual = ">="
    }
}

// MARK: - Walking

extension QueryPredicate {
    /// The predicates directly below this one (empty for leaves).
    public var children: [QueryPredicate] {
        switch self {
        case .not(let p): return [p]
        case .and(let ps), .or(let ps): return ps
        case .constant, .compare, .contains, .isIn: return []
        }
    }

    /// The operands of this node (not of its children): both sides of a comparison, `contains`
    /// or `IN`; empty for the logical nodes.
    public var operands: [Operand] {
        switch self {
        case .compare(let l, _, let r), .contains(let l, let r), .isIn(let l, let r): return [l, r]
        case .constant, .not, .and, .or: return []
        }
    }

    /// Calls `body` on this predicate and then on every predicate below it, depth first.
    ///
    /// - Complexity: O(number of nodes).
    public func forEach(_ body: (QueryPredicate) throws -> Void) rethrows {
        try body(self)
        for child in children { try child.forEach(body) }
    }

    /// Every document field the predicate reads.
    ///
    /// - Complexity: O(number of nodes).
    public var fieldPaths: Set<FieldPath> {
        var paths: Set<FieldPath> = []
        forEach { node in
            for case .field(let path) in node.operands { paths.insert(path) }
        }
        return paths
    }

    /// Every `$args` reference, as paths inside the arguments map (`$args.a.b` is `a.b`).
    ///
    /// - Complexity: O(number of nodes).
    public var argumentPaths: Set<FieldPath> {
        var paths: Set<FieldPath> = []
        forEach { node in
            for case .argument(let path) in node.operands { paths.insert(path) }
        }
        return paths
    }

    /// Whether any `$args` reference is left to bind.
    public var hasArguments: Bool {
        switch self {
        case .constant: return false
        case .not(let p): return p.hasArguments
        case .and(let ps), .or(let ps): return ps.contains { $0.hasArguments }
        case .compare(let l, _, let r), .contains(let l, let r), .isIn(let l, let r):
            return l.isArgument || r.isArgument
        }
    }

    /// The same predicate with every `$args` reference replaced by its value.
    ///
    /// - Parameter args: the arguments map; `$args.a.b` reads `args["a"]` and then its key `b`
    ///   (keys compared byte-wise).
    /// - Throws: ``QueryEvaluationError/missingArgument(name:)`` for the first reference with no
    ///   value, ``QueryEvaluationError/invalidArgument(name:reason:)`` for one holding NaN or
    ///   ±Infinity.
    /// - Complexity: O(number of nodes + size of the values bound).
    public func bound(to args: UTF8Map<Value>) throws(QueryEvaluationError) -> QueryPredicate {
        switch self {
        case .constant:
            return self
        case .not(let p):
            return .not(try p.bound(to: args))
        case .and(let ps):
            var out: [QueryPredicate] = []
            out.reserveCapacity(ps.count)
            for p in ps { out.append(try p.bound(to: args)) }
            return .and(out)
        case .or(let ps):
            var out: [QueryPredicate] = []
            out.reserveCapacity(ps.count)
            for p in ps { out.append(try p.bound(to: args)) }
            return .or(out)
        case .compare(let l, let op, let r):
            return .compare(try l.bound(to: args), op, try r.bound(to: args))
        case .contains(let l, let r):
            return .contains(try l.bound(to: args), try r.bound(to: args))
        case .isIn(let l, let r):
            let list = try r.bound(to: args)
            // `x IN $args.a` needs a list: anything else is an error naming the argument, not a
            // query that matches nothing (and whose text would not parse).
            if case .argument(let path) = r, case .literal(let value) = list {
                switch value {
                case .array: break
                default:
                    throw .invalidArgument(
                        name: path.description, reason: "IN needs a list, and it holds \(value.typeName)")
                }
            }
            return .isIn(try l.bound(to: args), list)
        }
    }
}

extension QueryPredicate.Operand {
    var isArgument: Bool {
        if case .argument = self { return true }
        return false
    }

    /// A literal for an argument reference, resolved from `args`; other operands unchanged.
    ///
    /// - Throws: ``QueryEvaluationError`` when the argument is missing or not finite.
    public func bound(to args: UTF8Map<Value>) throws(QueryEvaluationError) -> QueryPredicate.Operand {
        guard case .argument(let path) = self else { return self }
        let name = path.description
        guard let value = Value.map(args).value(at: path) else { throw .missingArgument(name: name) }
        do {
            try value.validate()
        } catch {
            throw .invalidArgument(name: name, reason: "it holds NaN or an infinity; only finite numbers are allowed")
        }
        return .literal(value)
    }
}

// MARK: - Canonical text

extension QueryPredicate: CustomStringConvertible {
    /// The canonical query text: single-quoted strings, one space around binary operators,
    /// parentheses only where needed. For every tree the parser produces, parsing it gives back an
    /// equal predicate. Hand-built trees print their meaning, not always their shape: a
    /// one-element `&&` or `||` list prints as its element, an empty one as `true` / `false`.
    public var description: String {
        var out = ""
        write(into: &out)
        return out
    }

    func write(into out: inout String) {
        switch self {
        case .constant(let b):
            out += b ? "true" : "false"
        case .not(let p):
            out += "!"
            switch p {
            case .constant, .not, .contains: p.write(into: &out)
            default:
                out += "("
                p.write(into: &out)
                out += ")"
            }
        case .and(let ps):
            writeList(ps, separator: " && ", empty: "true", into: &out) { child in
                switch child {
                case .and, .or: return true
                default: return false
                }
            }
        case .or(let ps):
            writeList(ps, separator: " || ", empty: "false", into: &out) { child in
                if case .or = child { return true }
                return false
            }
        case .compare(let l, let op, let r):
            out += "\(l) \(op.rawValue) \(r)"
        case .contains(let l, let r):
            out += "contains(\(l), \(r))"
        case .isIn(let l, let r):
            out += "\(l) IN \(r)"
        }
    }

    private func writeList(
        _ ps: [QueryPredicate], separator: String, empty: String, into out: inout String,
        needsParentheses: (QueryPredicate) -> Bool
    ) {
        guard !ps.isEmpty else {
            out += empty
            return
        }
        for (i, p) in ps.enumerated() {
            if i > 0 { out += separator }
            if ps.count > 1, needsParentheses(p) {
                out += "("
                p.write(into: &out)
                out += ")"
            } else {
                p.write(into: &out)
            }
        }
    }
}

extension QueryPredicate.Operand: CustomStringConvertible {
    /// The operand as query text: a literal, a field path or `$args.name`.
    public var description: String {
        switch self {
        case .literal(let v): return QueryText.literal(v)
        case .field(let path): return QueryText.path(path, reserveKeywords: true)
        case .argument(let path): return "$args." + QueryText.path(path, reserveKeywords: false)
        }
    }
}

/// Printing values and paths in query syntax.
enum QueryText {
    /// Bare words that a one-segment field path must not print as.
    static let reservedFirstSegments: Set<String> = ["true", "false", "null", "IN", "in", "$args"]

    static func literal(_ value: Value) -> String {
        var out = ""
        writeLiteral(value, into: &out)
        return out
    }

    static func writeLiteral(_ value: Value, into out: inout String) {
        switch value {
        case .null: out += "null"
        case .bool(let b): out += b ? "true" : "false"
        case .int(let i): out += String(i)
        case .double(let d):
            // Swift prints the shortest form that reads back as the same double; keep it a double.
            var s = "\(d)"
            if d.isFinite, !s.contains("."), !s.contains("e") { s += ".0" }
            out += s
        case .string(let s): writeQuoted(s, quote: "'", into: &out)
        case .bytes(let b):
            out += "x'"
            for byte in b {
                out += byte < 16 ? "0" : ""
                out += String(byte, radix: 16)
            }
            out += "'"
        case .array(let a):
            out += "["
            for (i, element) in a.enumerated() {
                if i > 0 { out += ", " }
                writeLiteral(element, into: &out)
            }
            out += "]"
        case .map(let m):
            out += "{"
            for (i, (key, member)) in m.enumerated() {  // in byte order of the keys
                if i > 0 { out += ", " }
                writeQuoted(key, quote: "'", into: &out)
                out += ": "
                writeLiteral(member, into: &out)
            }
            out += "}"
        }
    }

    /// `a.b[2]`, with backticks around keys that are not identifiers (and, when
    /// `reserveKeywords`, around a first key that would read as a keyword).
    static func path(_ path: FieldPath, reserveKeywords: Bool) -> String {
        var out = ""
        for (i, component) in path.components.enumerated() {
            switch component {
            case .key(let key):
                if i > 0 { out += "." }
                let reserved = reserveKeywords && i == 0 && reservedFirstSegments.contains(key)
                if isIdentifier(key), !reserved {
                    out += key
                } else {
                    writeQuoted(key, quote: "`", into: &out)
                }
            case .index(let index):
                out += "[\(index)]"
            }
        }
        return out
    }

    static func isIdentifier(_ s: String) -> Bool {
        guard let first = s.utf8.first, QueryLexer.isIdentifierStart(first) else { return false }
        return s.utf8.allSatisfy(QueryLexer.isIdentifierPart)
    }

    static func writeQuoted(_ s: String, quote: Unicode.Scalar, into out: inout String) {
        out.unicodeScalars.append(quote)
        for scalar in s.unicodeScalars {
            switch scalar {
            case quote, "\\":
                out += "\\"
                out.unicodeScalars.append(scalar)
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case let c where c.value < 0x20 || c.value == 0x7F:
                out += "\\u" + QueryLexer.hex(c.value, width: 4)
            default: out.unicodeScalars.append(scalar)
            }
        }
        out.unicodeScalars.append(quote)
    }
}
