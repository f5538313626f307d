import Foundation
import Testing
import TrellisCore
import TrellisTestKit

/// Random operations on 3–5 replicas, exchanged in random orders, checked against the reference
/// model (`DocumentStateModel`, docs/DATA-MODEL.md) after every step, and the join laws checked on
/// the final states: sets, upserts and unsets of values, maps and nested counters, increments by
/// ints and doubles, restarts, removes, evictions (stubs) and writes after them, default data,
/// and equal stamps (a site whose data directory was cloned writes twice with one stamp).
///
/// Runs `TRELLIS_PROPERTY_CASES` cases (10,000 by default); prints its seed, and
/// `TRELLIS_SEED=<seed>` replays a run. `deltasOfLocalWritesJoinLikeTheWholeState`
/// (StateDeltaPropertyTests.swift) runs the same steps and checks the delta of every local write.
@Suite struct DocumentStatePropertyTests {
    typealias Model = DocumentStateModel
    typealias Path = Model.Path

    /// "é" as U+00E9 and as "e" U+0301: canonically equivalent, different bytes, so two fields
    /// (docs/DATA-MODEL.md, "Keys are byte strings"), at the top level and inside `m`.
    static let byteExactKeys = true

    static let nfc = "\u{E9}"
    static let nfd = "e\u{301}"
    static let unicodeLeaves: [[String]] = byteExactKeys ? [[nfc], [nfd], ["m", nfc], ["m", nfd]] : []
    static let leafPaths: [[String]] = [["a"], ["b"], ["m", "x"], ["m", "y"]] + unicodeLeaves
    static let counterPaths: [[String]] = [["n"], ["m", "n"]]
    static let allPaths: [[String]] =
        [["a"], ["b"], ["n"], ["m"], ["m", "x"], ["m", "y"], ["m", "n"]] + unicodeLeaves

    static let values: [Value] = [1, 2, 2.5, -0.0, "x", "é", "e\u{301}", true, nil, [1, 2], 0.1]
    static let maps: [Value] =
        [["x": 1], ["n": 100, "x": "s"], [:], ["y": "t", "n": 0.5]]
        + (byteExactKeys ? [.map([nfc: 1, nfd: "s"]), .map([nfd: 2, "x": 3])] : [])
    static let amounts: [Value] = [1, 2, 5, -3, 0, 0.1, 0.2, -0.5]

    static let id: Value = "d1"
    /// The model with its field tables built once.
    static let emptyModel = Model(paths: allPaths)

    struct Replica {
        var state = DocumentState()
        var view = Model.View()
        var clock = HybridLogicalClock()
        let site: SiteID
        /// The delta of this replica's latest local writes, while its state changed only by local
        /// writes since that delta's base (`StateDeltaPropertyTests`).
        var pending: StateDelta? = nil
    }

    static var cases: Int {
        ProcessInfo.processInfo.environment["TRELLIS_PROPERTY_CASES"].flatMap { Int($0) } ?? 10_000
    }

    @Test func replicasConvergeToTheReferenceModel() async throws {
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        let cases = Self.cases
        print("DocumentStatePropertyTests seed=\(seed) cases=\(cases) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        var stats = Stats()
        for round in 0..<cases {
            var run = Run(round: round, seed: seed)
            try run.play(&random)
            stats.add(run.stats)
            if run.failed { break }  // one counterexample is enough; replay it with the seed
            // A long computation must not hold one of the few threads async tests run on.
            if round % 32 == 31 { await Task.yield() }
        }
        print("DocumentStatePropertyTests: \(stats)")
        #expect(stats.steps > cases * 4)
        #expect(stats.kinds.count == 9, "every kind of step ran: \(stats.kinds.keys.sorted())")
    }

    /// The reference model keeps a site's default data apart from its latest entry, as states do
    /// (reduced from round 47363 of seed 16322543050915008908): a site sets `m.x`, evicts, and
    /// writes default data at `m.y`, which records a valued "a map" at `m` at time zero beside the
    /// site's earlier, withheld "map" entry there. Once `m.y` is unset, `m` shows `{}`.
    @Test func theModelKeepsADefaultApartFromItsSitesLaterEntries() throws {
        var model = Self.emptyModel
        var view = Model.View()
        var state = DocumentState()
        let site: SiteID = 1
        let t = { (millis: UInt64) in Stamp(time: HLCTimestamp(millis: millis, logical: 0), site: site) }
        func apply(_ op: Model.Op?) throws {
            let op = try #require(op)
            model.ops.append(op)
            view.held.insert(model.ops.count - 1)
        }
        try state.set(Path(["m", "x"]).fieldPath, to: true, stamp: t(10))
        try apply(model.set(Path(["m", "x"]), true, stamp: t(10), view: view))
        state = state.evictionStub()
        view.withheld = view.held
        let zero = Stamp(time: .zero, site: site)
        #expect(state.admitsDefaultData(at: Path(["m", "y"]).fieldPath, site: site))
        try state.set(Path(["m", "y"]).fieldPath, to: .null, stamp: zero)
        try apply(model.set(Path(["m", "y"]), .null, stamp: zero, view: view))
        #expect(model.display(view, id: Self.id) == ["_id": "d1", "m": ["y": .null]])
        _ = try state.unset(Path(["m", "y"]).fieldPath, stamp: t(11))
        try apply(model.unset(Path(["m", "y"]), stamp: t(11), view: view))
        #expect(state.materialize(id: Self.id) == ["_id": "d1", "m": [:]])
        #expect(model.display(view, id: Self.id) == state.materialize(id: Self.id))
    }

    struct Stats: CustomStringConvertible {
        var steps = 0
        var kinds: [String: Int] = [:]
        /// The deltas of local writes checked, when the run checks them (`StateDeltaPropertyTests`).
        var deltas = DeltaStats()

        mutating func add(_ other: Stats) {
            steps += other.steps
            kinds.merge(other.kinds, uniquingKeysWith: +)
            deltas.add(other.deltas)
        }

        var description: String {
            "\(steps) steps: "
                + kinds.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
                + (deltas.localWrites > 0 ? "; \(deltas)" : "")
        }
    }

    /// One random case.
    struct Run {
        let round: Int
        let seed: UInt64
        var model = DocumentStatePropertyTests.emptyModel
        var replicas: [Replica] = []
        var physical: UInt64 = 1000
        var stats = Stats()
        var failed = false
        /// When set, every local write's delta is checked against every state of the run
        /// (`StateDeltaPropertyTests`); no random draw depends on it, so seeds replay either way.
        var deltas: DeltaCheck? = nil

        init(round: Int, seed: UInt64, checksDeltas: Bool = false) {
            self.round = round
            self.seed = seed
            if checksDeltas { deltas = DeltaCheck() }
        }

        var where_: String { "round \(round), seed \(seed)" }

        static func text(_ value: Value?) -> String { value.map { JSON.string($0) } ?? "nil" }

        mutating func check(_ r: Int, _ what: @autoclosure () -> String) {
            trace(
                "replica \(r) (site \(replicas[r].site)): \(what()) -> \(Self.text(replicas[r].state.materialize(id: DocumentStatePropertyTests.id)))"
            )
            let shown = replicas[r].state.materialize(id: DocumentStatePropertyTests.id)
            let expected = model.display(replicas[r].view, id: DocumentStatePropertyTests.id)
            if shown != expected {
                failed = true
                Issue.record(
                    Comment(
                        rawValue:
                            "after \(what()) on replica \(r): shows \(Self.text(shown)), model \(Self.text(expected)); "
                            + where_))
            }
        }

        /// `TRELLIS_TRACE=<round>` prints that round's steps, each with every replica's state.
        static let traceRound = ProcessInfo.processInfo.environment["TRELLIS_TRACE"].flatMap { Int($0) }

        func trace(_ text: @autoclosure () -> String) {
            if Self.traceRound == round {
                print("  [\(round)] \(text())")
                for (i, replica) in replicas.enumerated() {
                    print("      state \(i): \((try? CBOR.decode(replica.state.cbor())).map { "\($0)" } ?? "?")")
                }
            }
        }

        mutating func count(_ kind: String) {
            stats.steps += 1
            stats.kinds[kind, default: 0] += 1
        }

        /// Records an operation the model issued and the implementation applied.
        mutating func record(_ op: Model.Op, on r: Int) {
            model.ops.append(op)
            replicas[r].view.held.insert(model.ops.count - 1)
        }

        mutating func play(_ random: inout SeededRandom) throws {
            let n = Int.random(in: 3...4, using: &random)
            replicas = (0..<n).map { Replica(site: SiteID($0 + 1)) }
            for _ in 0..<Int.random(in: 4...12, using: &random) {
                physical += UInt64.random(in: 0...2, using: &random)
                let r = Int.random(in: 0..<n, using: &random)
                let roll = Int.random(in: 0..<32, using: &random)
                switch roll {
                case 0..<7: merge(into: r, from: Int.random(in: 0..<n, using: &random))
                case 7:
                    replicas[r].state = replicas[r].state.evictionStub()
                    replicas[r].view.withheld = replicas[r].view.held
                    replicas[r].pending = nil
                    count("evict")
                    check(r, "evict")
                case 8: try twin(r, &random)
                case 9: try defaultData(r, &random)
                default: try operation(r, roll, &random)
                }
                if failed { return }
                rememberStates()
            }
            try finalChecks(&random)
        }

        mutating func merge(into r: Int, from o: Int) {
            let before = replicas[r].state
            let changed = replicas[r].state.merge(replicas[o].state)
            if before != replicas[r].state { replicas[r].pending = nil }
            if changed != (before != replicas[r].state) {
                fail("merge from \(o) returned \(changed) but the state \(changed ? "did not change" : "changed")", r)
            }
            replicas[r].view = replicas[r].view.merged(replicas[o].view)
            replicas[r].clock.receive(replicas[o].state.maxTime, physicalMillis: physical)
            count("merge")
            check(r, "merge from \(o)")
        }

        mutating func stamp(_ r: Int) -> Stamp {
            Stamp(time: replicas[r].clock.now(physicalMillis: physical), site: replicas[r].site)
        }

        mutating func operation(_ r: Int, _ roll: Int, _ random: inout SeededRandom) throws {
            let s = stamp(r)
            let view = replicas[r].view
            let pick = { (paths: [[String]], random: inout SeededRandom) in
                Path(paths.randomElement(using: &random)!)
            }
            let old = replicas[r].state
            defer { localWrite(r, from: old) }
            switch roll {
            case 10..<14:  // set a leaf, a counter field or a whole map
                let p: Path
                let value: Value
                switch Int.random(in: 0..<3, using: &random) {
                case 0:
                    p = pick(DocumentStatePropertyTests.leafPaths, &random)
                    value = DocumentStatePropertyTests.values.randomElement(using: &random)!
                case 1:
                    p = pick(DocumentStatePropertyTests.counterPaths, &random)
                    value = DocumentStatePropertyTests.values.randomElement(using: &random)!
                default:
                    p = Path(["m"])
                    value =
                        Bool.random(using: &random)
                        ? DocumentStatePropertyTests.maps.randomElement(using: &random)!
                        : DocumentStatePropertyTests.values.randomElement(using: &random)!
                }
                attempt(model.set(p, value, stamp: s, view: view), on: r, "set \(p) = \(value)") {
                    try $0.set(p.fieldPath, to: value, stamp: s)
                }
                count("set")
                check(r, "set \(p) = \(value)")
            case 14..<16:  // upsert
                var fields: UTF8Map<Value> = [:]
                if Bool.random(using: &random) {
                    fields["a"] = DocumentStatePropertyTests.values.randomElement(using: &random)!
                }
                if Bool.random(using: &random) {
                    fields["m"] = DocumentStatePropertyTests.maps.randomElement(using: &random)!
                }
                if Int.random(in: 0..<3, using: &random) == 0 {
                    fields["n"] = DocumentStatePropertyTests.amounts.randomElement(using: &random)!
                }
                for key in DocumentStatePropertyTests.unicodeLeaves.filter({ $0.count == 1 }).map({ $0[0] })
                where Bool.random(using: &random) {
                    fields[key] = DocumentStatePropertyTests.values.randomElement(using: &random)!
                }
                replicas[r].state.merge(fields: fields, stamp: s)
                record(model.upsert(fields, stamp: s, view: view), on: r)
                count("upsert")
                check(r, "upsert \(Value.map(fields))")
            case 16..<20:  // unset
                let p = pick(DocumentStatePropertyTests.allPaths, &random)
                _ = try replicas[r].state.unset(p.fieldPath, stamp: s)
                record(model.unset(p, stamp: s, view: view), on: r)
                count("unset")
                check(r, "unset \(p)")
            case 20..<29:  // increment
                let p = pick(DocumentStatePropertyTests.counterPaths, &random)
                let amount = DocumentStatePropertyTests.amounts.randomElement(using: &random)!
                attempt(model.increment(p, by: amount, stamp: s, view: view), on: r, "increment \(p) by \(amount)") {
                    try $0.increment(p.fieldPath, by: amount, stamp: s)
                }
                count("increment")
                check(r, "increment \(p) by \(amount)")
            default:  // 29..<32: remove
                replicas[r].state.remove(stamp: s)
                record(model.remove(stamp: s, view: view), on: r)
                count("remove")
                check(r, "remove")
            }
        }

        /// Applies an operation the model may refuse (`op` is `nil`): the implementation must
        /// throw exactly then.
        mutating func attempt(
            _ op: Model.Op?, on r: Int, _ what: @autoclosure () -> String,
            _ apply: (inout DocumentState) throws -> Void
        ) {
            do {
                try apply(&replicas[r].state)
                guard let op else { return fail("\(what()) succeeded; the model refuses it", r) }
                record(op, on: r)
            } catch {
                if op != nil { fail("\(what()) threw \(error); the model accepts it", r) }
            }
        }

        /// Records a failed law (cheaper than `#expect` in a loop of many cases).
        mutating func law(_ holds: Bool, _ name: String) {
            guard !holds else { return }
            failed = true
            Issue.record(Comment(rawValue: "\(name): fails; \(where_)"))
        }

        mutating func fail(_ message: String, _ r: Int) {
            failed = true
            Issue.record("replica \(r): \(message); \(where_)")
        }

        /// Default data: stamped at time zero, written only where the state admits it.
        mutating func defaultData(_ r: Int, _ random: inout SeededRandom) throws {
            let p = Path(
                (DocumentStatePropertyTests.leafPaths + DocumentStatePropertyTests.counterPaths).randomElement(
                    using: &random)!)
            let value = DocumentStatePropertyTests.values.randomElement(using: &random)!
            let s = Stamp(time: .zero, site: replicas[r].site)
            count("default")
            guard replicas[r].state.admitsDefaultData(at: p.fieldPath, site: replicas[r].site) else { return }
            let view = replicas[r].view
            if model.reach(p, model.evaluate(view)).part != nil {
                fail("default data admitted at \(p), which shows a value", r)
            }
            guard let op = model.set(p, value, stamp: s, view: view) else {
                fail("default data admitted at \(p); the model refuses the write", r)
                return
            }
            let old = replicas[r].state
            try replicas[r].state.set(p.fieldPath, to: value, stamp: s)
            record(op, on: r)
            check(r, "default \(p) = \(value)")
            localWrite(r, from: old)
        }

        /// A clone of replica `r` (same site, same clock) writes one value, which another replica
        /// receives; `r` writes another value to the same field with the same stamp.
        mutating func twin(_ r: Int, _ random: inout SeededRandom) throws {
            let p = Path(DocumentStatePropertyTests.leafPaths.randomElement(using: &random)!)
            let v1 = DocumentStatePropertyTests.values.randomElement(using: &random)!
            var v2 = DocumentStatePropertyTests.values.randomElement(using: &random)!
            if v2 == v1 { v2 = "twin" }
            let s = stamp(r)
            let view = replicas[r].view
            count("twin")
            guard let cloneOp = model.set(p, v2, stamp: s, view: view), let op = model.set(p, v1, stamp: s, view: view)
            else { return }
            let x = (r + Int.random(in: 1..<replicas.count, using: &random)) % replicas.count
            var clone = replicas[r].state
            try clone.set(p.fieldPath, to: v2, stamp: s)
            model.ops.append(cloneOp)
            var cloneView = view
            cloneView.held.insert(model.ops.count - 1)
            if replicas[x].state.merge(clone) { replicas[x].pending = nil }
            replicas[x].view = replicas[x].view.merged(cloneView)
            replicas[x].clock.receive(clone.maxTime, physicalMillis: physical)
            check(x, "merge of a clone's \(p) = \(v2) at \(s)")
            deltas?.remember(clone)
            let old = replicas[r].state
            try replicas[r].state.set(p.fieldPath, to: v1, stamp: s)
            record(op, on: r)
            check(r, "twin \(p) = \(v1) at \(s)")
            localWrite(r, from: old)
        }

        /// Join laws on the final states, the encoding, and the model on everything merged.
        mutating func finalChecks(_ random: inout SeededRandom) throws {
            let states = replicas.map(\.state)
            var first = DocumentState()
            for s in states { first.merge(s) }
            var second = DocumentState()
            for s in (states + [states.randomElement(using: &random)!]).shuffled(using: &random) { second.merge(s) }
            law(first == second, "merging in any order, with duplicates, gives one state")
            let (a, b, c) = (
                states.randomElement(using: &random)!, states.randomElement(using: &random)!,
                states.randomElement(using: &random)!
            )
            func join(_ x: DocumentState, _ y: DocumentState) -> DocumentState {
                var out = x
                out.merge(y)
                return out
            }
            law(join(a, b) == join(b, a), "commutative")
            law(join(join(a, b), c) == join(a, join(b, c)), "associative")
            var again = first
            let changedBySelf = again.merge(first)
            let changedByPart = again.merge(a)
            law(!changedBySelf && again == first, "idempotent")
            law(!changedByPart && again == first, "absorbs its parts")
            for state in round % 8 == 0 ? [first, a] : [first] {
                let bytes = state.cbor()
                // The direct encoder writes exactly the bytes of the Value-tree encoder, which decode back.
                law(bytes == CBOR.encode(state.referenceEncoding), "the direct encoding is the reference encoding")
                law(try DocumentState(encoded: CBOR.decode(bytes)) == state, "the encoding decodes to the state")
            }
            var all = Model.View()
            for replica in replicas { all = all.merged(replica.view) }
            let shown = first.materialize(id: DocumentStatePropertyTests.id)
            let expected = model.display(all, id: DocumentStatePropertyTests.id)
            if let shown {
                // Keys stay byte strings through the document's JSON text and CBOR bytes.
                law((try? JSON.parse(JSON.bytes(shown))) == shown, "the document's JSON reads back as the document")
                law((try? CBOR.decode(CBOR.encode(shown))) == shown, "the document's CBOR reads back as the document")
            }
            if shown != expected {
                failed = true
                Issue.record(
                    Comment(
                        rawValue: "everything merged shows \(Self.text(shown)), model \(Self.text(expected)); \(where_)"
                    ))
            }
            reapingLaws(states, merged: first, expected: expected, &random)
        }

        /// A random reap horizon around the run's stamps (milliseconds 998 to the last + 2).
        func horizon(_ random: inout SeededRandom) -> HLCTimestamp {
            HLCTimestamp(
                millis: UInt64.random(in: 998...(physical + 2), using: &random),
                logical: UInt16.random(in: 0...3, using: &random))
        }

        /// Reaping removed fields' contexts: states reaped at random horizons, merged in random
        /// orders (reaping after each merge, as stores do), show what the model shows; reaped at one
        /// horizon, they join to identical states whatever the order, and the join laws hold.
        mutating func reapingLaws(
            _ states: [DocumentState], merged: DocumentState, expected: Value?, _ random: inout SeededRandom
        ) {
            func reaped(_ state: DocumentState, _ h: HLCTimestamp) -> DocumentState {
                var out = state
                out.reapRemovedFields(before: h)
                return out
            }
            func join(_ x: DocumentState, _ y: DocumentState, _ h: HLCTimestamp) -> DocumentState {
                var out = x
                out.merge(y)
                out.reapRemovedFields(before: h)
                return out
            }
            var mixed = DocumentState()
            for state in (states + states).shuffled(using: &random) {
                mixed.merge(reaped(state, horizon(&random)))
                if Bool.random(using: &random) { mixed.reapRemovedFields(before: horizon(&random)) }
            }
            law(
                mixed.materialize(id: DocumentStatePropertyTests.id) == expected,
                "reaped at random horizons, shows the model")
            let h = horizon(&random)
            let target = reaped(merged, h)
            var inOrder = DocumentState()
            for state in (states + [states.randomElement(using: &random)!]).shuffled(using: &random) {
                inOrder = join(inOrder, Bool.random(using: &random) ? reaped(state, h) : state, h)
            }
            law(inOrder == target, "reaped at one horizon, any order gives the reaped join, byte for byte")
            law(inOrder.cbor() == target.cbor(), "reaped at one horizon, identical bytes")
            let (a, b, c) = (
                reaped(states.randomElement(using: &random)!, h), reaped(states.randomElement(using: &random)!, h),
                reaped(states.randomElement(using: &random)!, h)
            )
            law(join(a, b, h) == join(b, a, h), "reaped: commutative")
            law(join(join(a, b, h), c, h) == join(a, join(b, c, h), h), "reaped: associative")
            law(
                join(target, target, h) == target && join(target, a, h) == target,
                "reaped: idempotent, absorbs its parts")
            // A state that still holds what another reaped changes nothing there (no new seq, F17).
            var receiver = target
            receiver.merge(states.randomElement(using: &random)!)
            receiver.reapRemovedFields(before: h)
            law(receiver == target, "a reaped state absorbs the unreaped states it was reaped from")
        }
    }
}
