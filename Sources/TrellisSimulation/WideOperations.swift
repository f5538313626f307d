import Trellis
import TrellisCore
import TrellisStore

/// The app operations a ``RandomWorkload`` draws.
public enum WorkloadOperations: String, CaseIterable, Sendable {
    /// Upserts, sets, unsets, increments, removes and evicts by `_id` with small values (`v` an
    /// int 0–9, `s` one of four short strings): the workload as it was before ``wide``, so a
    /// seed recorded then replays the same run.
    case basic
    /// ``basic``'s operations half of the time; the other half, values of every type and their
    /// edges (-0.0, 1e300, ints near 2^53 and Int64.max, strings holding U+0000, empty, combining
    /// or JSON-looking strings, booleans, null, bytes, nested arrays and maps, a long string),
    /// every write strategy, nested sets and unsets, array elements, increments of fields that
    /// hold non-numbers, and remove, evict and update by query. Each node also watches two
    /// queries over these values, and every check compares the store's queries with the same
    /// queries evaluated in memory (``WideOperations/queriesAgree``).
    case wide
}

/// The ``WorkloadOperations/wide`` half of a ``RandomWorkload``'s app operations: every draw
/// comes from the workload's generator, so a seed replays the same run.
struct WideOperations {
    /// Whether apps may evict (the `evict` fault is on).
    var evicts: Bool

    /// Values of every type, with the edges where SQLite's JSON and the in-memory rules could
    /// part: signed zero, the largest doubles, ints that a double cannot hold, U+0000 inside and
    /// alone, text that looks like JSON, and containers.
    static let values: [Value] = [
        .int(5), .int(7), .int(-1), .int(1 << 53), .int((1 << 53) + 1), .int(Int64.max), .int(Int64.min),
        .double(-0.0), .double(0.0), .double(5.5), .double(5.0), .double(4.999_999_999_999_999), .double(1e300),
        .double(-1e300), .double(.leastNonzeroMagnitude), .double(9_007_199_254_740_992.0),
        .double(9_223_372_036_854_775_808.0),
        .string("x\u{0}y"), .string("\u{0}"), .string(""), .string("x"), .string("e\u{301}"), .string("[1]"),
        .string("{}"), .string("5"), .string("null"), .string("true"), .bool(true), .bool(false), .null,
        .bytes([]), .bytes([0, 5]), .array([]), .array([.int(5)]), .array([.int(7), "a", .array([.null])]),
        .array(["x\u{0}y"]), .map([:]), .map(["x": .int(6)]), .map(["a": .map(["b": .array([.double(5.5)])])]),
        .map(["x": "\u{0}", "y": .map([:])]),
    ]

    /// Strings, most of them short and odd.
    static let strings: [String] = [
        "a", "b", "é", "e\u{301}", "x\u{0}y", "\u{0}", "", "x", "[1]", "{}", "a\u{0}", "\u{0}a", "e\u{301}\u{301}",
        "😀", "'", "\"", "\\", "\u{7F}", "\u{FEFF}", "a\u{0}b\u{0}", "null", "5",
    ]

    /// Queries (with their arguments) that the apps remove, evict and update by, and that
    /// ``queriesAgree`` runs on every node.
    static let queries: [(text: String, args: UTF8Map<Value>)] = [
        ("v >= 7", [:]), ("v >= 5", [:]), ("v == 5.5", [:]), ("v < 0", [:]), ("v == 0", [:]),
        ("v == $args.v", ["v": .int((1 << 53) + 1)]), ("v > 9007199254740992.0", [:]),
        ("v == $args.v", ["v": .double(1e300)]), ("v >= 9223372036854775807", [:]),
        ("s == $args.s", ["s": "x\u{0}y"]), ("s == $args.s", ["s": "x"]), ("s == $args.s", ["s": ""]),
        ("s > $args.s", ["s": "x"]), ("s < 'b'", [:]), ("s != 'a'", [:]), ("contains(s, $args.s)", ["s": "\u{0}"]),
        ("contains(s, 'x')", [:]), ("s == '[1]'", [:]), ("s == '{}'", [:]), ("v == [5]", [:]),
        ("v == {'x': 6}", [:]), ("v == null", [:]), ("v == true", [:]), ("v == '5'", [:]),
        ("v IN [5, 'x\\u0000y', null, 5.5]", [:]), ("m.x >= 1", [:]), ("m.a.b[0] == 5.5", [:]), ("v[0] == 5", [:]),
        ("n == 'x'", [:]), ("n >= 3", [:]), ("contains(v, 5)", [:]), ("v == x'0005'", [:]), ("v >= x''", [:]),
        ("v == v && v != null", [:]), ("s == 'é' || s == 'e\\u0301'", [:]), ("u >= 2", [:]),
        ("s == 'x\\u0000y' || s < 'b' || v == 5.5", [:]),
    ]

    /// The local live queries every node watches besides its subscription's.
    static let watched = ["v >= 5", "s == 'x\\u0000y' || s < 'b' || v == 5.5"]

    /// Adds the ``watched`` live queries to `node`.
    static func watch(_ node: SimulatedNode) throws {
        for query in watched { try node.watch("items", query: query) }
    }

    /// On every up node, each of ``queries`` selects through the store (`find`, `count`, and a
    /// sorted `find`) exactly the documents it matches in memory.
    static let queriesAgree = Invariant("queries agree with memory") { sim in
        var violations: [String] = []
        for node in sim.nodes where node.isUp {
            let all = try node.documents.documents(in: "items")
            let items = node.store.collection("items")
            for (text, args) in queries {
                let expected = try matching(text, args, in: all)
                let found = try items.find(text, args: args).exec().map(\.id)
                let sorted = try items.find(text, args: args).sort("v").exec().map(\.id)
                let counted = try items.find(text, args: args).count()
                guard !same(found, expected) || !same(sorted, expected) || counted != expected.count else { continue }
                let describe: (Set<Value>) -> String = { ids in
                    ids.map { id in all.first { $0["_id"] == id }.map { JSON.string($0) } ?? "\(id)" }.sorted()
                        .joined(separator: ", ")
                }
                violations.append(
                    "\(node.name): \(text) \(Value.map(args)) found \(found.count), sorted \(sorted.count), counted \(counted), in memory "
                        + "\(expected.count); only found: [\(describe(Set(found).subtracting(expected)))], only in "
                        + "memory: [\(describe(expected.subtracting(found)))]")
            }
        }
        return violations
    }

    /// Draws and runs one operation on `node`'s `items`, about document `id`.
    func run(
        _ sim: Simulation, _ node: SimulatedNode, _ items: TrellisCollection, _ id: Value,
        _ random: inout SplitMix64
    ) throws {
        let say = { (line: String) in
            sim.note("\(node.name) app: \(line.count > 400 ? line.prefix(400) + "…" : line)")
        }
        switch Int.random(in: 0..<12, using: &random) {
        case 0, 1:
            var fields: UTF8Map<Value> = ["_id": id, "v": value(&random)]
            if Bool.random(using: &random) { fields["s"] = .string(string(&random)) }
            if Bool.random(using: &random) { fields["m"] = ["x": value(&random), "a": ["b": value(&random)]] }
            if Int.random(in: 0..<4, using: &random) == 0 { fields["n"] = value(&random) }
            let strategies: [WriteStrategy] = [
                .merge, .merge, .merge, .insertIfAbsent, .insertDefaultIfAbsent, .updateDifferentValues,
            ]
            let strategy = strategies.randomElement(using: &random)!
            try refusable(say, "upsert \(Value.map(fields)) (\(strategy))") {
                _ = try items.upsert(.map(fields), writeStrategy: strategy)
            }
        case 2:
            let v = value(&random)
            try refusable(say, "set \(id).v = \(v)") {
                _ = try items.findByID(id).update { doc in doc?["v"].set(v) }
            }
        case 3:
            let s = Value.string(string(&random))
            try refusable(say, "set \(id).s = \(s)") {
                _ = try items.findByID(id).update { doc in doc?["s"].set(s) }
            }
        case 4:
            let path = [["m", "x"], ["m", "y", "z"], ["m", "a", "b"], ["v", "x"]].randomElement(using: &random)!
            let v = value(&random)
            try refusable(say, "set \(id).\(path.joined(separator: ".")) = \(v)") {
                _ = try items.findByID(id).update { doc in doc.map { at($0, path) }?.set(v) }
            }
        case 5:
            let path = [["v"], ["m", "x"], ["m"], ["n"], ["f"], ["m", "a", "b"], ["u"]].randomElement(using: &random)!
            try refusable(say, "unset \(id).\(path.joined(separator: "."))") {
                _ = try items.findByID(id).update { doc in doc.map { at($0, path) }?.remove() }
            }
        case 6:
            let v = [Value.string("x"), .bool(true), .null, .map(["c": .int(1)]), .array([.int(1)]), .string("")]
                .randomElement(using: &random)!
            try refusable(say, "set \(id).n = \(v) (a counter's field)") {
                _ = try items.findByID(id).update { doc in doc?["n"].set(v) }
            }
        case 7:
            let path = [["n"], ["n"], ["v"], ["s"], ["m", "x"], ["m"]].randomElement(using: &random)!
            let amount: Value =
                Bool.random(using: &random)
                ? .int(Int64.random(in: -3...5, using: &random))
                : [.double(0.5), .double(-0.0), .double(1e300)]
                    .randomElement(using: &random)!
            try refusable(say, "increment \(id).\(path.joined(separator: ".")) by \(amount)") {
                _ = try items.findByID(id).update { doc in doc.map { at($0, path) }?.increment(by: amount) }
            }
        case 8:
            let (text, args) = Self.queries.randomElement(using: &random)!
            let expected = try Self.matching(text, args, on: node)
            let removed = try items.find(text, args: args).remove()
            say("remove by \(text) \(Value.map(args)): \(removed)")
            try Self.expect(removed, expected, "remove by \(text)", sim, node)
        case 9 where evicts:
            let (text, args) = Self.queries.randomElement(using: &random)!
            let expected = try Self.matching(text, args, on: node)
            let evicted = try items.find(text, args: args).evict()
            say("evict by \(text) \(Value.map(args)): \(evicted)")
            try Self.expect(evicted, expected, "evict by \(text)", sim, node)
        case 9, 10:
            let (text, args) = Self.queries.randomElement(using: &random)!
            let v = value(&random)
            let setV = Bool.random(using: &random)
            let expected = try Self.matching(text, args, on: node)
            var selected: [Value] = []
            try refusable(say, "update by \(text) \(Value.map(args)): u += 1\(setV ? ", v = \(v)" : "")") {
                let results = try items.find(text, args: args).update { docs in
                    selected = docs.map(\.id)
                    for doc in docs {
                        doc["u"].increment(by: .int(1))
                        if setV { doc["v"].set(v) }
                    }
                }
                say("updated \(results.keys.sorted { JSON.string($0) < JSON.string($1) })")
            }
            try Self.expect(selected, expected, "update by \(text)", sim, node)
        default:
            let index = Int.random(in: 0...1, using: &random)
            let v = value(&random)
            try refusable(say, "set \(id).v[\(index)] = \(v)") {
                _ = try items.findByID(id).update { doc in doc?["v"][index].set(v) }
            }
        }
    }

    /// The `_id`s of `node`'s live documents that the query matches, evaluated in memory.
    static func matching(_ text: String, _ args: UTF8Map<Value>, on node: SimulatedNode) throws -> Set<Value> {
        try matching(text, args, in: node.documents.documents(in: "items"))
    }

    /// The `_id`s of the documents that the query matches, evaluated in memory.
    static func matching(_ text: String, _ args: UTF8Map<Value>, in documents: [Value]) throws -> Set<Value> {
        let query = try Query(text).bind(args: args)
        return try Set(documents.filter { try query.matches($0) }.map { $0["_id"] ?? .null })
    }

    /// Whether `chosen` names exactly the documents of `expected`, each once.
    static func same(_ chosen: [Value], _ expected: Set<Value>) -> Bool {
        chosen.count == expected.count && Set(chosen) == expected
    }

    /// Throws a ``SimulationFailure`` when an operation by query chose other documents than
    /// the query matches in memory.
    static func expect(
        _ chosen: [Value], _ expected: Set<Value>, _ what: String, _ sim: Simulation, _ node: SimulatedNode
    ) throws {
        guard !same(chosen, expected) else { return }
        let only = { (ids: Set<Value>) in ids.map { JSON.string($0) }.sorted().joined(separator: ", ") }
        throw SimulationFailure(
            seed: sim.seed,
            violations: [
                "\(node.name) app: \(what) chose \(chosen.count) documents, \(expected.count) match in memory; "
                    + "only chosen: [\(only(Set(chosen).subtracting(expected)))], only matching: "
                    + "[\(only(expected.subtracting(chosen)))]"
            ], trace: sim.trace)
    }

    /// A value for `v`: half of the time an int 0–9, rarely a long string, otherwise one of
    /// ``values``.
    private func value(_ random: inout SplitMix64) -> Value {
        switch Int.random(in: 0..<40, using: &random) {
        case 0..<20: return .int(Int64.random(in: 0...9, using: &random))
        case 20: return .string(String(repeating: "ab\u{0}é", count: Int.random(in: 500...3_000, using: &random)))
        default: return Self.values.randomElement(using: &random)!
        }
    }

    private func string(_ random: inout SplitMix64) -> String { Self.strings.randomElement(using: &random)! }

    private func at(_ doc: MutableDocument, _ path: [String]) -> MutableDocumentPath {
        path.dropFirst().reduce(doc[path[0]]) { $0[$1] }
    }

    /// Runs `body`, noting `what` in the trace; a store error that refuses the document (a
    /// value it cannot hold, an increment of a non-number, an index out of range) is noted, not
    /// thrown.
    private func refusable(_ say: (String) -> Void, _ what: String, _ body: () throws -> Void) throws {
        do {
            try body()
            say(what)
        } catch let error as StoreError where error.refusesOneDocument {
            say("\(what): refused: \(error)")
        }
    }
}
