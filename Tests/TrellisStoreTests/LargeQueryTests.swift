import Foundation
import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// Queries SQLite cannot take as a plain expression tree: `IN` lists of 1,000 and 100,000
/// values (bound as one JSON array), long `||` chains (written as a balanced tree) and nesting
/// deeper than SQLite's parser allows (evaluated in memory). Every answer is the in-memory one.
@Suite struct LargeQueryTests {
    let dir = TemporaryDirectory("trellis-large-queries")

    /// Values that stress the comparison rules of `IN`: int and double alike (`4 == 4.0`,
    /// `-0.0 == 0`), neighbours around 2^53 and 2^63, strings byte-wise (precomposed and
    /// decomposed é, a NUL, quotes), and the types that never equal a number or string.
    static let pool: [Value] = [
        0, 1, -1, 4, .double(4), .double(-0.0), .double(0.5), .double(0.1), .int(9_007_199_254_740_993),
        .double(9_007_199_254_740_992), .int(.max), .int(.min), .double(1e300), .double(-1e-300),
        "", "4", "Japan", "\u{E9}", "e\u{301}", "nul\u{0}x", "nul", "it's", "quo\"te", "back\\slash", "\u{1F600}",
        nil, true, false, [1], ["k": 1],
    ]

    /// `count` documents whose `n` is drawn from the pool or random, sometimes missing.
    func seededStore(_ count: Int, _ rng: inout SeededRandom) throws -> (DocumentStore, [Value]) {
        let store = try DocumentStore(path: dir.path("store.sqlite"))
        var documents: [Value] = []
        for i in 0..<count {
            var fields: UTF8Map<Value> = ["_id": .string(String(format: "d%04d", i))]
            switch Int.random(in: 0..<10, using: &rng) {
            case 0: break  // missing
            case 1..<6: fields["n"] = Self.pool.randomElement(using: &rng)!
            case 6..<8: fields["n"] = .int(Int64.random(in: -5_000...5_000, using: &rng))
            case 8: fields["n"] = .double(Double(Int.random(in: -400...400, using: &rng)) / 4)
            default: fields["n"] = .string("s\(Int.random(in: 0..<5_000, using: &rng))")
            }
            documents.append(.map(fields))
        }
        try store.upsert(documents, in: "c")
        return (store, documents)
    }

    /// A list of `count` scalars: the pool's scalars, then random numbers and strings.
    func randomList(_ count: Int, _ rng: inout SeededRandom) -> [Value] {
        // A list holding a string with U+0000 is not translated (json_each would cut it) but
        // evaluated in memory (NULStringTests): these lists are the ones SQLite answers.
        var list = Self.pool.filter {
            switch $0 {
            case .array, .map, .bytes: return false
            case .string(let text): return !text.utf8.contains(0)
            default: return true
            }
        }
        list.shuffle(using: &rng)
        list = Array(list.prefix(Int.random(in: 0...list.count, using: &rng)))
        while list.count < count {
            switch Int.random(in: 0..<3, using: &rng) {
            case 0: list.append(.int(Int64.random(in: -20_000...20_000, using: &rng)))
            case 1: list.append(.double(Double(Int.random(in: -4_000...4_000, using: &rng)) / 4))
            default: list.append(.string("s\(Int.random(in: 0..<20_000, using: &rng))"))
            }
        }
        if Bool.random(using: &rng) { list.append(.null) }
        if Bool.random(using: &rng) { list.append(.bool(Bool.random(using: &rng))) }
        list.shuffle(using: &rng)
        return list
    }

    /// The `_id`s the store returns, the ones in-memory evaluation accepts, and the ones the
    /// change log returns, for one query.
    func answers(_ store: DocumentStore, _ documents: [Value], _ query: Query) throws -> [[Value]] {
        let expected = try documents.filter { try query.matches($0) }.compactMap { $0["_id"] }
        let found = try store.documents(in: "c", matching: query).compactMap { $0["_id"] }
        let logged = try store.changes(in: "c", after: 0, limit: 10_000, maxBytes: .max, matching: query).records.map(
            \.id)
        #expect(try store.count(in: "c", matching: query) == expected.count)
        return [expected, found, logged.sorted { JSON.string($0) < JSON.string($1) }]
    }

    @Test(arguments: [1_000, 100_000])
    func largeInListsAgreeWithInMemoryEvaluation(count: Int) throws {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("largeInListsAgreeWithInMemoryEvaluation(\(count)) seed: \(seed) (replay: TRELLIS_SEED=\(seed))")
        // In-memory evaluation compares each document with every element: keep the product small.
        let (store, documents) = try seededStore(count > 10_000 ? 100 : 600, &rng)
        for round in 0..<(count > 10_000 ? 1 : 3) {
            let list = Value.array(randomList(count, &rng))
            let predicate: Query.Predicate =
                round == 2
                ? .contains(.literal(list), .field(.key("n"))) : .isIn(.field(.key("n")), .literal(list))
            // Through the query text, as an application writes it.
            let query = try Query(Query(predicate: predicate).text)
            #expect(query.predicate == predicate)
            let translated = query.sqlWhere(column: "documents.value")
            let (sql, bindings) = try #require(translated, "seed \(seed)")
            #expect(bindings.count <= 2 && sql.utf8.count < 1_000, "one bound array per type class, seed \(seed)")
            let results = try answers(store, documents, query)
            #expect(results[1] == results[0], "find, seed \(seed)")
            #expect(results[2] == results[0], "change log, seed \(seed)")
            #expect(!results[0].isEmpty, "seed \(seed)")
        }
    }

    @Test func inListsKeepTheirIndex() throws {
        let store = try DocumentStore(path: dir.path("indexed.sqlite"))
        // 300 origins, 3 cars each: an `IN` list of two selects 6 of 900 rows. (SQLite counts 25
        // values in a `json_each` list; with 30 or fewer origins it reads the collection's key
        // range in order instead, without a sort, and that is its plan.)
        let origins = ["USA", "Europe", "Japan"] + (0..<297).map { "origin \($0)" }
        try store.upsert(
            (0..<900).map { ["_id": .string("car\($0)"), "Origin": .string(origins[$0 % 300]), "n": .int(Int64($0))] },
            in: "cars")
        let origin = try store.createIndex(path: .key("Origin"), in: "cars")
        let n = try store.createIndex(path: .key("n"), in: "cars")
        let names = (0..<1_000).map { Value.string("x\($0)") } + ["Japan", "USA"]
        // Without statistics SQLite's planner reads the collection in `_id` order instead.
        try store.withState { try $0.db.execute("ANALYZE") }
        for (query, index, count) in [
            (try Query("Origin IN ['Japan', 'USA']"), origin, 6),
            (Query(predicate: .isIn(.field(.key("Origin")), .literal(.array(names)))), origin, 6),
            (Query(predicate: .isIn(.field(.key("n")), .literal(.array((0..<2_000).map { .int($0) })))), n, 900),
            (try Query("n IN [3, 4.0, 5.5]"), n, 2),
        ] {
            let plan = try store.queryPlan(in: "cars", matching: query)
            #expect(plan.joined().contains(index), "\(plan)")
            #expect(try store.documents(in: "cars", matching: query).count == count)
        }
    }

    /// `||` chains far longer than SQLite's expression depth stay in SQL; nesting deeper than its
    /// parser takes is evaluated in memory: same answers, no error, also in the change log that
    /// replication reads.
    @Test func longChainsAndDeepNestingAnswerLikeMemory() throws {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("longChainsAndDeepNestingAnswerLikeMemory seed: \(seed) (replay: TRELLIS_SEED=\(seed))")
        let (store, documents) = try seededStore(150, &rng)
        let terms = (0..<1_200).map { i -> String in
            i % 2 == 0 ? "n == \(i - 600)" : "n == 's\(i)'"
        }
        let chain = try Query(terms.joined(separator: " || "))
        #expect(chain.sqlWhere(column: "documents.value") != nil)
        #expect(try !store.queryPlan(in: "c", matching: chain).isEmpty, "the chain runs in SQLite")
        let both = try Query(terms.joined(separator: " && ") + " || n >= 0")
        var nested = "n >= 0"
        for depth in 0..<90 { nested = depth % 2 == 0 ? "!(\(nested))" : "(\(nested) && true)" }
        let deep = try Query(nested)
        #expect(deep.sqlWhere(column: "documents.value") != nil)
        #expect(try store.queryPlan(in: "c", matching: deep).isEmpty, "SQLite refuses it: evaluated in memory")
        for query in [chain, both, deep] {
            let results = try answers(store, documents, query)
            #expect(results[1] == results[0], "find \(query.text.prefix(40)), seed \(seed)")
            #expect(results[2] == results[0], "change log \(query.text.prefix(40)), seed \(seed)")
            #expect(!results[0].isEmpty)
            // Windows and sorts take the same path.
            let window = try store.documents(in: "c", matching: query, sort: [], limit: 3, offset: 2)
            #expect(window.compactMap { $0["_id"] } == Array(results[0].dropFirst(2).prefix(3)))
        }
    }
}
