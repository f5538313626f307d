import CSQLite
import Testing
import TrellisCore

// Checks Predicate.sqlWhere(column:) against in-memory evaluation on a real SQLite (the one the
// store links), with documents stored as the JSON text JSON.string writes.

/// A throwaway in-memory SQLite database holding `docs(id INTEGER, doc TEXT)`.
private final class DocumentTable {
    private var db: OpaquePointer?

    init() throws {
        // As the store sets SQLite up before its first use (DocumentStore.configureSQLite), which
        // this target cannot call: the test process runs SQLite one way, whoever starts it.
        _ = trellis_sqlite3_config_memstatus(0)
        guard sqlite3_open(":memory:", &db) == SQLITE_OK else { throw SQLError(message: "open failed") }
        try execute("CREATE TABLE docs (id INTEGER PRIMARY KEY, doc TEXT NOT NULL)")
    }

    deinit { sqlite3_close(db) }

    struct SQLError: Error, CustomStringConvertible {
        var message: String
        var description: String { message }
    }

    func execute(_ sql: String) throws {
        guard sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK else {
            throw SQLError(message: String(cString: sqlite3_errmsg(db)))
        }
    }

    func insert(id: Int, json: String) throws {
        _ = try rows("INSERT INTO docs (id, doc) VALUES (?, ?)", [.int(Int64(id)), .string(json)])
    }

    /// The ids of documents matching `condition`.
    func ids(where condition: String, _ bindings: [Value]) throws -> Set<Int> {
        Set(try rows("SELECT id FROM docs WHERE \(condition)", bindings))
    }

    private func rows(_ sql: String, _ bindings: [Value]) throws -> [Int] {
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(db, sql, -1, &statement, nil) == SQLITE_OK else {
            throw SQLError(message: "\(String(cString: sqlite3_errmsg(db))) in \(sql)")
        }
        defer { sqlite3_finalize(statement) }
        guard Int(sqlite3_bind_parameter_count(statement)) == bindings.count else {
            throw SQLError(message: "\(bindings.count) bindings for \(sql)")
        }
        for (i, value) in bindings.enumerated() {
            let index = Int32(i + 1)
            switch value {
            case .int(let v): sqlite3_bind_int64(statement, index, v)
            case .double(let v): sqlite3_bind_double(statement, index, v)
            case .string(let s):
                s.withCString { trellis_sqlite3_bind_text_transient(statement, index, $0, Int32(s.utf8.count)) }
            default: throw SQLError(message: "unexpected binding \(value)")
            }
        }
        var out: [Int] = []
        while true {
            let rc = sqlite3_step(statement)
            if rc == SQLITE_DONE { break }
            guard rc == SQLITE_ROW else { throw SQLError(message: "\(String(cString: sqlite3_errmsg(db))) in \(sql)") }
            out.append(Int(sqlite3_column_int64(statement, 0)))
        }
        return out
    }
}

private typealias RNG = QueryTests.SplitMix64

/// Scalars that stress the comparison rules: int/double neighbours around 2^53 and 2^63, -0.0,
/// byte-wise string order, canonical-equivalent strings, booleans against 0 and 1.
private let scalarPool: [Value] = [
    nil, true, false, 0, 1, -1, 4, .double(4), .double(0.5), .double(-0.0), .double(0), .double(1),
    .int(9_007_199_254_740_992), .int(9_007_199_254_740_993), .double(9_007_199_254_740_992),
    .int(.max), .int(.min), .double(9_223_372_036_854_775_808), .double(-9_223_372_036_854_775_808),
    .double(1e300), .double(-1e-300), .double(.leastNonzeroMagnitude), .double(0.1), .double(33.5),
    "", "a", "ab", "Z", "é", "e\u{301}", "😀", "1", "true", "null", "it's", "quo\"te", "back\\slash",
    "line\nbreak", "\u{1}", "Japan",
    // The JSON text SQLite's json_extract gives for arrays and maps: equal to a string literal
    // only in SQL, never in the query language.
    "[]", "{}", "[1]", "[true]", "[null]", "{\"a\":1}", "[\"a\"]",
]

private let keys = ["a", "b", "n", "s", "list", "m", "odd key", "x.y", "it's", "é", "$id"]

private func randomScalar(using rng: inout RNG) -> Value {
    if rng.next() % 4 == 0 {
        // Random doubles and ints across the whole range.
        switch rng.next() % 3 {
        case 0: return .int(Int64(bitPattern: rng.next()) >> Int64.random(in: 0...63, using: &rng))
        case 1:
            let d = Double(bitPattern: rng.next())
            return .double(d.isFinite ? d : Double.random(in: -1e9...1e9, using: &rng))
        default: return .double(Double(Int64.random(in: -1000...1000, using: &rng)) / 8)
        }
    }
    return scalarPool.randomElement(using: &rng)!
}

private func randomDocumentValue(depth: Int, using rng: inout RNG) -> Value {
    switch Int.random(in: 0..<(depth > 0 ? 10 : 7), using: &rng) {
    case 0..<6: return randomScalar(using: &rng)
    case 6: return .bytes([UInt8.random(in: 0...255, using: &rng)])
    case 7, 8:
        let count = Int.random(in: 0...4, using: &rng)
        return .array((0..<count).map { _ in randomDocumentValue(depth: depth - 1, using: &rng) })
    default:
        var m: UTF8Map<Value> = [:]
        for _ in 0..<Int.random(in: 0...3, using: &rng) {
            m[keys.randomElement(using: &rng)!] = randomDocumentValue(depth: depth - 1, using: &rng)
        }
        return .map(m)
    }
}

private func randomPath(using rng: inout RNG) -> FieldPath {
    var components: [FieldPath.Component] = [.key(keys.randomElement(using: &rng)!)]
    for _ in 0..<Int.random(in: 0...2, using: &rng) {
        components.append(
            Bool.random(using: &rng)
                ? .key(keys.randomElement(using: &rng)!) : .index(Int.random(in: 0...2, using: &rng)))
    }
    return FieldPath(components: components)
}

private func randomOperand(using rng: inout RNG) -> Query.Predicate.Operand {
    rng.next() % 5 == 0 ? .literal(randomScalar(using: &rng)) : .field(randomPath(using: &rng))
}

private func randomPredicate(depth: Int, using rng: inout RNG) -> Query.Predicate {
    if depth == 0 || rng.next() % 3 == 0 {
        switch rng.next() % 8 {
        case 0:
            return .contains(randomOperand(using: &rng), .literal(randomScalar(using: &rng)))
        case 1:
            let count = Int.random(in: 0...6, using: &rng)
            let list = Value.array((0..<count).map { _ in randomScalar(using: &rng) })
            return rng.next() % 4 == 0
                ? .isIn(.literal(randomScalar(using: &rng)), .field(randomPath(using: &rng)))
                : .isIn(randomOperand(using: &rng), .literal(list))
        case 2:
            return .constant(Bool.random(using: &rng))
        default:
            let op = Query.Predicate.ComparisonOperator.allCases.randomElement(using: &rng)!
            let field = Query.Predicate.Operand.field(randomPath(using: &rng))
            let literal = Query.Predicate.Operand.literal(randomScalar(using: &rng))
            return Bool.random(using: &rng) ? .compare(field, op, literal) : .compare(literal, op, field)
        }
    }
    let count = Int.random(in: 2...3, using: &rng)
    switch rng.next() % 3 {
    case 0: return .not(randomPredicate(depth: depth - 1, using: &rng))
    case 1: return .and((0..<count).map { _ in randomPredicate(depth: depth - 1, using: &rng) })
    default: return .or((0..<count).map { _ in randomPredicate(depth: depth - 1, using: &rng) })
    }
}

extension QueryTests {
    /// Random documents in SQLite and random predicates: wherever `sqlWhere` gives SQL, SQLite
    /// selects exactly the documents `matches` accepts.
    @Test func sqlWhereAgreesWithInMemoryEvaluation() throws {
        var rng = RNG(state: QueryTests.seed("sqlWhereAgreesWithInMemoryEvaluation"))
        let table = try DocumentTable()
        var documents: [Value] = []
        for id in 0..<80 {
            var fields: UTF8Map<Value> = ["_id": .string("d\(id)")]
            for key in keys where rng.next() % 3 != 0 {
                fields[key] = randomDocumentValue(depth: 2, using: &rng)
            }
            let document = Value.map(fields)
            documents.append(document)
            try table.insert(id: id, json: JSON.string(document))
        }
        var translated = 0
        let rounds = 3_000
        for _ in 0..<rounds {
            let predicate = randomPredicate(depth: 3, using: &rng)
            guard let (sql, bindings) = predicate.sqlWhere(column: "doc") else { continue }
            translated += 1
            let expected = Set(documents.indices.filter { predicate.matches(documents[$0]) })
            let selected = try table.ids(where: sql, bindings)
            if selected != expected {
                // Report the smallest sub-predicate that disagrees, on one document.
                let id = try #require(selected.symmetricDifference(expected).first)
                let culprit = try smallestDisagreement(predicate, documents[id], id: id, table: table)
                let (culpritSQL, culpritBindings) = try #require(culprit.sqlWhere(column: "doc"))
                Issue.record(
                    """
                    SQL and memory disagree on \(culprit) (memory: \(culprit.matches(documents[id])))
                    document: \(JSON.string(documents[id]))
                    SQL: \(culpritSQL)
                    bindings: \(culpritBindings)
                    whole predicate: \(predicate)
                    """)
                break
            }
        }
        print("sqlWhereAgreesWithInMemoryEvaluation: \(translated) of \(rounds) predicates translated")
        #expect(translated > rounds / 2)
    }

    /// Every double and int that JSON.string writes reads back in SQLite as the same number, so
    /// `n == value` in SQL finds exactly the document holding it.
    @Test func sqlWhereFindsEveryStoredNumber() throws {
        let table = try DocumentTable()
        let numbers = try storeRandomNumbers(in: table, seed: "sqlWhereFindsEveryStoredNumber")
        var mismatches: [String] = []
        for (id, number) in numbers.enumerated() {
            let n = FieldPath(components: [.key("n")])
            let predicate = Query.Predicate.compare(.field(n), .equal, .literal(number))
            let (sql, bindings) = try #require(predicate.sqlWhere(column: "doc"))
            let expected = Set(numbers.indices.filter { Value.queryEquals(numbers[$0], number) })
            #expect(expected.contains(id))
            let selected = try table.ids(where: sql, bindings)
            if selected != expected {
                mismatches.append("\(number): SQL \(selected.sorted()), memory \(expected.sorted())")
            }
        }
        #expect(mismatches.isEmpty, "\(mismatches.count) numbers: \(mismatches.prefix(5))")
    }

    /// `IN` lists bind their numbers as one JSON array, which SQLite parses itself: every stored
    /// number is still found by a list holding it, and only by lists holding an equal number.
    @Test func inListsFindEveryStoredNumber() throws {
        let table = try DocumentTable()
        let numbers = try storeRandomNumbers(in: table, seed: "inListsFindEveryStoredNumber")
        let n = FieldPath(components: [.key("n")])
        var mismatches: [String] = []
        for start in stride(from: 0, to: numbers.count, by: 40) {
            let chunk = Array(numbers[start..<min(start + 40, numbers.count)]) + ["not a number", nil]
            let predicate = Query.Predicate.isIn(.field(n), .literal(.array(chunk)))
            let (sql, bindings) = try #require(predicate.sqlWhere(column: "doc"))
            #expect(sql.contains("json_each(?)") && bindings.count == 2)
            let expected = Set(numbers.indices.filter { predicate.matches(["n": numbers[$0]]) })
            #expect(expected.isSuperset(of: start..<min(start + 40, numbers.count)))
            let selected = try table.ids(where: sql, bindings)
            if selected != expected {
                mismatches.append("chunk at \(start): SQL \(selected.sorted()), memory \(expected.sorted())")
            }
        }
        #expect(mismatches.isEmpty, "\(mismatches.prefix(3))")
    }

    /// 600 random finite doubles and ints (a quarter), then the edge cases, each stored as
    /// `{"n": number}` with the row id its position.
    private func storeRandomNumbers(in table: DocumentTable, seed: String) throws -> [Value] {
        var rng = RNG(state: QueryTests.seed(seed))
        var numbers: [Value] = []
        while numbers.count < 600 {
            let bits = rng.next()
            let d = Double(bitPattern: bits)
            if !d.isFinite { continue }
            numbers.append(rng.next() % 4 == 0 ? .int(Int64(bitPattern: bits)) : .double(d))
        }
        numbers += [
            .int(.min), .int(.max), .double(-0.0), 0, .int(9_007_199_254_740_993), .double(9_007_199_254_740_992),
        ]
        for (id, number) in numbers.enumerated() {
            try table.insert(id: id, json: JSON.string(["n": number]))
        }
        return numbers
    }

    private func smallestDisagreement(
        _ predicate: Query.Predicate, _ document: Value, id: Int,
        table: DocumentTable
    ) throws -> Query.Predicate {
        for child in predicate.children {
            guard let (sql, bindings) = child.sqlWhere(column: "doc") else { continue }
            if try table.ids(where: sql, bindings).contains(id) != child.matches(document) {
                return try smallestDisagreement(child, document, id: id, table: table)
            }
        }
        return predicate
    }

    @Test func sqlWhereShapes() throws {
        let query = try Query("color == 'red' && mileage > $args.min").bind(args: ["min": 10_000])
        let (sql, bindings) = try #require(query.sqlWhere(column: "doc"))
        #expect(
            sql == "((json_extract(doc, '$.color') = ? AND json_extract(doc, '$.color') IS NOT NULL) AND "
                + "(COALESCE(json_type(doc, '$.mileage') IN ('integer', 'real'), 0) "
                + "AND json_extract(doc, '$.mileage') > ?))")
        #expect(bindings == ["red", 10_000])
        #expect(
            try Query("`it's`.`a b` == null").sqlWhere(column: "doc")?.sql
                == "(json_type(doc, '$.\"it''s\".\"a b\"') IS 'null')")
        #expect(try Query("1 < 2 && !('a' IN [])").sqlWhere(column: "doc")?.sql == "(1 AND (NOT 0))")
        // A string that could be an array's or a map's JSON text keeps the type check.
        #expect(
            try Query("a == '[1]'").sqlWhere(column: "doc")?.sql
                == "(json_type(doc, '$.a') IS 'text' AND json_extract(doc, '$.a') = ?)")
        // IN: one term per type class; numbers and strings through one bound JSON array each, a
        // single element as plain equality.
        let list = try #require(try Query("a IN [2, 'x', null, 'y', 2.5, true]").sqlWhere(column: "doc"))
        #expect(
            list.sql
                == "((json_type(doc, '$.a') IS 'null') OR (json_type(doc, '$.a') IS 'true') OR "
                + "(COALESCE(json_type(doc, '$.a') IN ('integer', 'real'), 0) AND json_extract(doc, '$.a') IN "
                + "(SELECT value FROM json_each(?))) OR (json_type(doc, '$.a') IS 'text' AND "
                + "json_extract(doc, '$.a') IN (SELECT value FROM json_each(?))))")
        #expect(list.bindings == [#"[2,2.5]"#, #"["x","y"]"#])
        #expect(
            try Query("a IN ['x']").sqlWhere(column: "doc")?.sql
                == "(json_type(doc, '$.a') IS 'text' AND json_extract(doc, '$.a') = ?)")
        // Long && and || lists nest as balanced halves, so SQLite's expression depth stays small.
        let chain = try Query((0..<200).map { "a == \($0)" }.joined(separator: " || ")).sqlWhere(column: "doc")
        #expect(chain?.sql.hasPrefix("((((") == true && chain?.bindings.count == 200)
        // No translation: unbound arguments, two fields, container literals, unnameable keys.
        for text in [
            "a == $args.x", "a == b", "a == [1]", "contains(a, {})", "a IN [[1]]", "a == x'00'",
            "`` == 1", "`a\\\"b` == 1", "b.`$bytes` == 'x'",
        ] {
            #expect(try Query(text).sqlWhere(column: "doc") == nil, "\(text)")
        }
    }
}
