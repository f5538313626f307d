// Translation of predicates to SQLite WHERE expressions over a JSON text column, for stores that
// keep each document's materialised value as JSON (DESIGN.md, "Store"). Pure string building:
// nothing here links SQLite.

extension QueryPredicate {
    /// A SQLite expression selecting exactly the documents this predicate matches, or `nil` when
    /// the predicate cannot be expressed (the caller then evaluates ``matches(_:)`` in memory).
    ///
    /// The column must hold each document as JSON text in the shape ``JSON/string(_:)``
    /// writes. Every comparison checks the JSON type with `json_type` before comparing the value
    /// from `json_extract` (except equality with a string that does not start with `[` or `{`,
    /// where equal text already proves a JSON string), so the SQL keeps the query semantics: type
    /// classes never mix, `true` is not `1`, a missing field is not `null`, `!=` is `NOT (==)`.
    /// Each sub-expression yields 0 or 1, never SQL NULL, so `NOT`, `AND` and `OR` behave
    /// two-valued. Paths are inlined as SQL
    /// string literals (`json_extract(doc, '$.a.b[2]')`), so expression indexes on the same
    /// `json_extract` can serve the query; values go into `bindings`, one per `?` in order.
    ///
    /// SQLite 3.40's JSON functions cut a string at its first U+0000, so on a row whose JSON holds
    /// the escape `\u0000` the expression may disagree with ``matches(_:)``: evaluate such rows in
    /// memory (the store does, DocumentStore+NULStrings.swift).
    ///
    /// Returns `nil` for: unbound `$args` (bind first); comparisons or `contains` between two
    /// fields; equality, `contains` or `IN` with an array, map or bytes literal; `IN` with a list
    /// holding a string with U+0000; ordering against
    /// bytes; paths through a key named `$bytes` (the JSON form of bytes), or with an empty key or
    /// a key holding `"`, `\` or a control character (SQLite's JSON path syntax cannot name them).
    ///
    /// - Parameter column: the SQL expression naming the JSON column, inserted verbatim (quote it
    ///   yourself if needed). Qualify it with its table (`documents.value`) when its name is also a
    ///   column of `json_each` (`key`, `value`, `type`, `atom`, `id`, `parent`, `fullkey`, `path`):
    ///   inside the `json_each` subquery of `contains` and `IN` an unqualified name would resolve
    ///   to `json_each`'s column.
    /// - Returns: the expression and the values to bind to its `?` parameters, in order. Bound
    ///   values are `.int`, `.double` or `.string` only (booleans become `.int` 0 or 1).
    /// - Complexity: O(size of the predicate).
    public func sqlWhere(column: String) -> (sql: String, bindings: [Value])? {
        var writer = QuerySQLWriter(column: column)
        guard writer.write(self) else { return nil }
        return (writer.sql, writer.bindings)
    }
}

extension Query {
    /// ``QueryPredicate/sqlWhere(column:)`` of this query; `nil` when it holds `$args` (use
    /// ``bind(args:)`` first) or cannot be expressed in SQL.
    public func sqlWhere(column: String) -> (sql: String, bindings: [Value])? {
        predicate.sqlWhere(column: column)
    }
}

/// Appends SQL for one predicate; every `write` returns `false` when the predicate has no
/// translation (the partial text is then discarded).
struct QuerySQLWriter {
    let column: String
    var sql = ""
    var bindings: [Value] = []

    private static let eachAlias = "trellis_each"

    mutating func write(_ predicate: QueryPredicate) -> Bool {
        switch predicate {
        case .constant(let b):
            sql += b ? "1" : "0"
            return true
        case .not(let p):
            sql += "(NOT "
            guard write(p) else { return false }
            sql += ")"
            return true
        case .and(let ps):
            return writeList(ps, separator: " AND ", empty: "1")
        case .or(let ps):
            return writeList(ps, separator: " OR ", empty: "0")
        case .compare(let l, let op, let r):
            switch (l, r) {
            case (.literal, .literal): return writeConstant(predicate)
            case (.field(let path), .literal(let value)): return writeCompare(path, op, value)
            case (.literal(let value), .field(let path)): return writeCompare(path, op.flipped, value)
            default: return false
            }
        case .contains(let l, let r):
            switch (l, r) {
            case (.literal, .literal): return writeConstant(predicate)
            case (.field(let path), .literal(let value)): return writeContains(path, value, substrings: true)
            case (.literal(.array(let elements)), .field(let path)): return writeIn(path, elements)
            default: return false
            }
        case .isIn(let l, let r):
            switch (l, r) {
            case (.literal, .literal): return writeConstant(predicate)
            case (.field(let path), .literal(.array(let elements))): return writeIn(path, elements)
            case (.field, .literal):
                sql += "0"
                return true  // not a list: matches nothing
            case (.literal(let value), .field(let path)): return writeContains(path, value, substrings: false)
            default: return false
            }
        }
    }

    /// Lists longer than this are written as a balanced tree of parenthesised halves.
    static let flatListLimit = 64

    /// `(p1 OP p2 OP …)`. SQLite parses a flat chain into a tree as deep as the chain is long and
    /// refuses trees deeper than 1000, so a long list is split into parenthesised halves
    /// recursively: the depth grows with the logarithm of the length.
    private mutating func writeList(_ ps: [QueryPredicate], separator: String, empty: String) -> Bool {
        guard !ps.isEmpty else {
            sql += empty
            return true
        }
        return writeList(ps[...], separator: separator)
    }

    private mutating func writeList(_ ps: ArraySlice<QueryPredicate>, separator: String) -> Bool {
        sql += "("
        if ps.count > Self.flatListLimit {
            let middle = ps.startIndex + ps.count / 2
            guard writeList(ps[..<middle], separator: separator) else { return false }
            sql += separator
            guard writeList(ps[middle...], separator: separator) else { return false }
        } else {
            for (i, p) in ps.enumerated() {
                if i > 0 { sql += separator }
                guard write(p) else { return false }
            }
        }
        sql += ")"
        return true
    }

    /// A predicate on literals only: its value is the same for every document.
    private mutating func writeConstant(_ predicate: QueryPredicate) -> Bool {
        sql += predicate.matches(.null) ? "1" : "0"
        return true
    }

    private mutating func writeCompare(_ path: FieldPath, _ op: QueryPredicate.ComparisonOperator, _ value: Value)
        -> Bool
    {
        if op == .notEqual {
            sql += "(NOT "
            guard writeCompare(path, .equal, value) else { return false }
            sql += ")"
            return true
        }
        guard let jsonPath = Self.jsonPath(path) else { return false }
        let type = "json_type(\(column), '\(jsonPath)')"
        let extract = "json_extract(\(column), '\(jsonPath)')"
        let sqlOp = op == .equal ? "=" : op.rawValue
        switch value {
        case .null:
            sql += op == .equal ? "(\(type) IS 'null')" : "0"
        case .bool(let b):
            if op == .equal {
                sql += "(\(type) IS '\(b)')"
            } else {
                sql += "(COALESCE(\(type) IN ('true', 'false'), 0) AND \(extract) \(sqlOp) ?)"
                bindings.append(.int(b ? 1 : 0))
            }
        case .int, .double:
            sql += "(COALESCE(\(type) IN ('integer', 'real'), 0) AND \(extract) \(sqlOp) ?)"
            bindings.append(value)
        case .string(let text) where op == .equal && !text.hasPrefix("[") && !text.hasPrefix("{"):
            // `json_extract` gives SQL text only for a JSON string, or for an array or a map as
            // their JSON text (which starts with `[` or `{`); numbers and booleans come back as
            // numbers, which never equal text, and null as NULL. So equal text proves a string
            // and `json_type` (which parses the document once more per row: 60 % of an indexed
            // find's SQL time) is not needed; `IS NOT NULL` keeps the result 0 or 1, and the bare
            // `=` term lets an expression index serve the query in `_id` order.
            sql += "(\(extract) = ? AND \(extract) IS NOT NULL)"
            bindings.append(value)
        case .string:
            sql += "(\(type) IS 'text' AND \(extract) \(sqlOp) ?)"
            bindings.append(value)
        case .array, .map:
            guard op != .equal else { return false }
            sql += "0"  // arrays and maps are unordered
        case .bytes:
            return false
        }
        return true
    }

    /// An array at `path` holding an element equal to `value`, or (with `substrings`, as
    /// `contains` does and `IN` does not) a string at `path` holding `value` as a substring.
    private mutating func writeContains(_ path: FieldPath, _ value: Value, substrings: Bool) -> Bool {
        guard let jsonPath = Self.jsonPath(path) else { return false }
        let alias = Self.eachAlias
        let element: String
        var elementBinding: Value?
        switch value {
        case .null: element = "\(alias).type = 'null'"
        case .bool(let b): element = "\(alias).type = '\(b)'"
        case .int, .double:
            element = "\(alias).type IN ('integer', 'real') AND \(alias).value = ?"
            elementBinding = value
        case .string:
            element = "\(alias).type = 'text' AND \(alias).value = ?"
            elementBinding = value
        case .array, .map, .bytes:
            return false
        }
        sql +=
            "(CASE json_type(\(column), '\(jsonPath)') WHEN 'array' THEN EXISTS (SELECT 1 FROM "
            + "json_each(\(column), '\(jsonPath)') AS \(alias) WHERE \(element))"
        if let elementBinding { bindings.append(elementBinding) }
        if substrings, case .string = value {
            sql += " WHEN 'text' THEN instr(json_extract(\(column), '\(jsonPath)'), ?) > 0"
            bindings.append(value)
        }
        sql += " ELSE 0 END)"
        return true
    }

    /// `path IN [elements]`, however long the list: one term per type class present, each a
    /// type check and, for numbers and strings, one `IN` over a bound JSON array (no translation
    /// when a string holds U+0000, which `json_each` would cut):
    ///
    ///     (COALESCE(json_type(doc, '$.x') IN ('integer', 'real'), 0)
    ///         AND json_extract(doc, '$.x') IN (SELECT value FROM json_each(?)))
    ///
    /// with `?` bound to `[1,4.0,…]`. SQLite compares an integer and a real numerically and two
    /// texts byte-wise (BINARY), which is ``Value/queryEquals(_:_:)`` on these classes; `null`
    /// and booleans need only `json_type`. An expression index on `json_extract(doc, '$.x')`
    /// serves the `IN`. A one-element class is written as the plain equality.
    private mutating func writeIn(_ path: FieldPath, _ elements: [Value]) -> Bool {
        var hasNull = false
        var booleans: Set<Bool> = []
        var numbers: [Value] = []
        var strings: [Value] = []
        for element in elements {
            switch element {
            case .null: hasNull = true
            case .bool(let b): booleans.insert(b)
            case .int, .double: numbers.append(element)
            case .string(let text):
                // `json_each` cuts a string at its first U+0000: such a list is evaluated in memory.
                if text.utf8.contains(0) { return false }
                strings.append(element)
            case .array, .map, .bytes: return false
            }
        }
        guard let jsonPath = Self.jsonPath(path) else { return false }
        let type = "json_type(\(column), '\(jsonPath)')"
        let extract = "json_extract(\(column), '\(jsonPath)')"
        var terms: [String] = []
        var termBindings: [Value] = []
        if hasNull { terms.append("(\(type) IS 'null')") }
        for b in [false, true] where booleans.contains(b) { terms.append("(\(type) IS '\(b)')") }
        for (members, check) in [
            (numbers, "COALESCE(\(type) IN ('integer', 'real'), 0)"), (strings, "\(type) IS 'text'"),
        ] where !members.isEmpty {
            if members.count == 1 {
                terms.append("(\(check) AND \(extract) = ?)")
                termBindings.append(members[0])
            } else {
                terms.append("(\(check) AND \(extract) IN (SELECT value FROM json_each(?)))")
                termBindings.append(.string(JSON.string(.array(members))))
            }
        }
        switch terms.count {
        case 0: sql += "0"
        case 1: sql += terms[0]
        default: sql += "(" + terms.joined(separator: " OR ") + ")"
        }
        bindings += termBindings
        return true
    }

    /// SQLite JSON path for a field path, escaped for use inside a single-quoted SQL literal, or
    /// `nil` when SQLite's path syntax cannot name a key exactly as JSON writes it.
    static func jsonPath(_ path: FieldPath) -> String? {
        var out = "$"
        for component in path.components {
            switch component {
            case .index(let i):
                out += "[\(i)]"
            case .key(let key):
                // `$bytes` is how JSON spells bytes: in a query, a bytes value has no keys.
                guard key != "$bytes", !key.isEmpty else { return nil }
                if QueryText.isIdentifier(key) {
                    out += "." + key
                } else {
                    // Quoted keys end at the next `"` and are compared with the raw JSON text of
                    // the label, so anything JSON escapes cannot be named.
                    let unnameable = key.unicodeScalars.contains { $0 == "\"" || $0 == "\\" || $0.value < 0x20 }
                    guard !unnameable else { return nil }
                    out += ".\"" + key + "\""
                }
            }
        }
        // Escape per scalar: a `'` followed by a combining mark is one Character, which a
        // Character-based replace would miss.
        var escaped = ""
        for scalar in out.unicodeScalars {
            if scalar == "'" { escaped += "''" } else { escaped.unicodeScalars.append(scalar) }
        }
        return escaped
    }
}

extension QueryPredicate.ComparisonOperator {
    /// The operator with its sides swapped: `a < b` is `b > a`.
    public var flipped: QueryPredicate.ComparisonOperator {
        switch self {
        case .equal, .notEqual: return self
        case .less: return .greater
        case .lessOrEqual: return .greaterOrEqual
        case .greater: return .less
        case .greaterOrEqual: return .lessOrEqual
        }
    }
}
