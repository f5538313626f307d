// Query figures for trellis-bench (docs/BENCHMARKS.md, "Indexed find"): an equality on an
// indexed field through the public API (`find(…).exec()`), against the same query written by hand
// in SQL on a raw table of the same JSON rows, measured in the same run.
import CSQLite
import Foundation
import Trellis
import TrellisCore
import TrellisStore

/// Runs `body` `rounds` times and returns queries per second.
func rate(rounds: Int, _ body: () throws -> Void) rethrows -> Double {
    let t = try seconds { for _ in 0..<rounds { try body() } }
    return Double(rounds) / t
}

/// Runs each of `bodies` `rounds` times, taking turns (so that what else the machine does falls
/// on all of them alike), and returns each one's rate from its median round, in rounds per
/// second. A round is one call, timed alone (no `sync`: queries write nothing).
func interleavedRates(rounds: Int, _ bodies: [() throws -> Void]) throws -> [Double] {
    var times = Array(repeating: [Double](), count: bodies.count)
    for _ in 0..<rounds {
        for (i, body) in bodies.enumerated() {
            let start = DispatchTime.now().uptimeNanoseconds
            try body()
            times[i].append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9)
        }
    }
    return times.map { 1 / $0.sorted()[$0.count / 2] }
}

/// `Origin == 'Japan'` on `store`'s `cars` (indexed here) against the raw table `docs` of the
/// SQLite file `raw` (indexed here too): queries per second, then with one field or every
/// result's whole value read. The four queries take turns, `rounds` each; each rate is from the
/// median round.
func findFigures(store: DocumentStore, raw: String, rounds: Int = 20) throws -> [Figure] {
    _ = try store.createIndex(path: FieldPath(parsing: "Origin"), in: "cars")
    var rawDB: OpaquePointer?
    sqlite3_open_v2(raw, &rawDB, rawOpenFlags, nil)
    sqlite3_exec(rawDB, "CREATE INDEX IF NOT EXISTS docs_origin ON docs(json_extract(body, '$.Origin'))", nil, nil, nil)
    var rawMatched = 0
    var rawStatement: OpaquePointer?
    sqlite3_prepare_v2(
        rawDB, "SELECT id, body FROM docs WHERE json_extract(body, '$.Origin') = 'Japan'", -1, &rawStatement, nil)
    defer {
        sqlite3_finalize(rawStatement)
        sqlite3_close(rawDB)
    }
    func rawQuery() {
        rawMatched = 0
        while sqlite3_step(rawStatement) == SQLITE_ROW {
            // Read the row as an application would: the JSON text.
            _ = sqlite3_column_text(rawStatement, 1)
            rawMatched += 1
        }
        sqlite3_reset(rawStatement)
    }
    // Through the public API, as an application calls it: `find(…).exec()` returns documents that
    // parse their stored JSON when read (docs/BENCHMARKS.md, "Query results parsed when read").
    // Then the same with one field of every result read, or every result's whole value.
    let japan = Store(documents: store, subscriptions: NoSubscriptions()).collection("cars")
        .find("Origin == 'Japan'")
    var matched = 0
    var names = 0
    var values = 0
    let rates = try interleavedRates(
        rounds: rounds,
        [
            rawQuery,
            { matched = try japan.exec().count },
            { names = try japan.exec().count { $0["Name"] != nil } },
            { values = try japan.exec().count { $0.value["Name"] != nil } },
        ])
    let (rawQueryRate, queryRate, fieldRate, valueRate) = (rates[0], rates[1], rates[2], rates[3])
    precondition(matched == rawMatched, "query results differ: \(matched) vs \(rawMatched)")
    precondition(names == rawMatched, "results without a Name: \(rawMatched - names)")
    precondition(values == rawMatched, "values without a Name: \(rawMatched - values)")
    let baselineName = "sql_indexed_equality_query_per_s"
    return [
        Figure(name: baselineName, value: rawQueryRate, unit: "queries/s"),
        Figure(
            name: "find_indexed_equality_per_s", value: queryRate, unit: "queries/s", baseline: rawQueryRate,
            baselineName: baselineName),
        Figure(
            name: "find_then_one_field_per_s", value: fieldRate, unit: "queries/s", baseline: rawQueryRate,
            baselineName: baselineName),
        Figure(
            name: "find_then_whole_values_per_s", value: valueRate, unit: "queries/s", baseline: rawQueryRate,
            baselineName: baselineName),
    ]
}
