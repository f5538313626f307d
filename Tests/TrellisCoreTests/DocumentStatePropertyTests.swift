import Testing
import TrellisCore
import TrellisTestKit

/// Random operations on 3–5 replicas, exchanged in random orders, checked against a reference
/// model that replays each replica's operations in stamp order (docs/DATA-MODEL.md):
/// - a set or upsert writes its leaves; a later-stamped write replaces an earlier one;
/// - an unset or remove kills exactly the writes its issuer had seen (observed-remove);
/// - a counter shows the sum of its increments not killed;
/// - a map shows while its latest write or any child survives; the document while any write survives.
@Suite struct DocumentStatePropertyTests {
    enum Kind {
        case set(String, Value)  // "a", "b", "m.x", "m.y"
        case upsert(Value, Value)  // a and m.x together
        case unset(String)  // "a", "b", "m", "m.x", "m.y", "n"
        case increment(Int)
        case remove
    }

    struct Op {
        var stamp: Stamp
        var kind: Kind
        /// Indexes of the operations the issuer had seen (its own included).
        var context: Set<Int>
    }

    struct Replica {
        var state = DocumentState()
        var ops: Set<Int> = []
        var clock = HybridLogicalClock()
        let site: SiteID
    }

    static let id: Value = "d1"

    /// The reference model: what a replica holding `ops` shows.
    static func model(_ all: [Op], _ held: Set<Int>) -> Value? {
        let sorted = held.sorted { all[$0].stamp < all[$1].stamp }
        var regs: [String: (value: Value, op: Int)] = [:]
        var mapWrites: [Int] = []
        var increments: [(op: Int, amount: Int)] = []
        var writes: [Int] = []
        var removeContexts: Set<Int> = []
        func kill(_ prefix: String?, _ context: Set<Int>) {
            for (path, reg) in regs where context.contains(reg.op) {
                if prefix == nil || path == prefix! || path.hasPrefix(prefix! + ".") { regs[path] = nil }
            }
            if prefix == nil || prefix == "m" { mapWrites.removeAll { context.contains($0) } }
            if prefix == nil || prefix == "n" { increments.removeAll { context.contains($0.op) } }
        }
        for index in sorted {
            let op = all[index]
            switch op.kind {
            case .set(let path, let value):
                regs[path] = (value, index)
                if path.hasPrefix("m.") { mapWrites.append(index) }
                writes.append(index)
            case .upsert(let a, let mx):
                regs["a"] = (a, index)
                regs["m.x"] = (mx, index)
                mapWrites.append(index)
                writes.append(index)
            case .unset(let path):
                kill(path, op.context)
            case .increment(let amount):
                increments.append((index, amount))
                writes.append(index)
            case .remove:
                kill(nil, op.context)
                removeContexts.formUnion(op.context)
            }
        }
        guard writes.contains(where: { !removeContexts.contains($0) }) else { return nil }
        var out: UTF8Map<Value> = ["_id": id]
        for key in ["a", "b"] { if let r = regs[key] { out[key] = r.value } }
        var m: UTF8Map<Value> = [:]
        for key in ["x", "y"] { if let r = regs["m.\(key)"] { m[key] = r.value } }
        let latestMapWrite = held.filter { i in
            switch all[i].kind {
            case .upsert: return true
            case .set(let p, _): return p.hasPrefix("m.")
            default: return false
            }
        }.max { all[$0].stamp < all[$1].stamp }
        if !m.isEmpty || (latestMapWrite.map { mapWrites.contains($0) } ?? false) { out["m"] = .map(m) }
        if !increments.isEmpty { out["n"] = .double(Double(increments.reduce(0) { $0 + $1.amount })) }
        return .map(out)
    }

    static func apply(_ kind: Kind, to state: inout DocumentState, stamp: Stamp) throws {
        switch kind {
        case .set(let path, let value): try state.set(FieldPath(parsing: path), to: value, stamp: stamp)
        case .upsert(let a, let mx): state.merge(fields: ["a": a, "m": ["x": mx]], stamp: stamp)
        case .unset(let path): _ = try state.unset(FieldPath(parsing: path), stamp: stamp)
        case .increment(let amount): try state.increment(.key("n"), by: Double(amount), stamp: stamp)
        case .remove: state.remove(stamp: stamp)
        }
    }

    @Test func replicasConvergeToTheReferenceModel() throws {
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        print("DocumentStatePropertyTests seed=\(seed) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        let values: [Value] = [1, 2, 2.5, "x", "é", true, nil, [1, 2]]
        for round in 0..<200 {
            let count = Int.random(in: 3...5, using: &random)
            var replicas = (0..<count).map { Replica(site: SiteID($0 + 1)) }
            var ops: [Op] = []
            var physical: UInt64 = 1000
            for _ in 0..<Int.random(in: 10...40, using: &random) {
                physical += UInt64.random(in: 0...2, using: &random)
                let r = Int.random(in: 0..<count, using: &random)
                if Int.random(in: 0..<4, using: &random) == 0 {
                    // Replica r merges another replica's whole state.
                    let o = Int.random(in: 0..<count, using: &random)
                    replicas[r].state.merge(replicas[o].state)
                    replicas[r].ops.formUnion(replicas[o].ops)
                    replicas[r].clock.receive(replicas[o].state.maxTime, physicalMillis: physical)
                    _ = replicas[r].clock.receive(replicas[o].clock.last, physicalMillis: physical)
                    continue
                }
                let kind: Kind
                switch Int.random(in: 0..<10, using: &random) {
                case 0, 1:
                    kind = .set(["a", "b"].randomElement(using: &random)!, values.randomElement(using: &random)!)
                case 2, 3:
                    kind = .set(["m.x", "m.y"].randomElement(using: &random)!, values.randomElement(using: &random)!)
                case 4: kind = .upsert(values.randomElement(using: &random)!, values.randomElement(using: &random)!)
                case 5, 6: kind = .unset(["a", "b", "m", "m.x", "m.y", "n"].randomElement(using: &random)!)
                case 7, 8: kind = .increment(Int.random(in: -3...5, using: &random))
                default: kind = .remove
                }
                let s = Stamp(time: replicas[r].clock.now(physicalMillis: physical), site: replicas[r].site)
                try Self.apply(kind, to: &replicas[r].state, stamp: s)
                ops.append(Op(stamp: s, kind: kind, context: replicas[r].ops.union([ops.count])))
                replicas[r].ops.insert(ops.count - 1)
                let shown = replicas[r].state.materialize(id: Self.id)
                #expect(shown == Self.model(ops, replicas[r].ops), "round \(round), seed \(seed)")
            }
            // Deliver every final state to a fresh replica in random orders, with duplicates and
            // pairwise pre-merging: join laws say the results are identical.
            let states = replicas.map(\.state)
            var first = DocumentState()
            for s in states { first.merge(s) }
            var second = DocumentState()
            for s in (states + states).shuffled(using: &random) { second.merge(s) }
            var grouped = DocumentState()
            for pair in stride(from: 0, to: states.count, by: 2).reversed() {
                var p = states[pair]
                if pair + 1 < states.count { p.merge(states[pair + 1]) }
                grouped.merge(p)
            }
            for state in states + [first] {
                // The direct encoder writes exactly the bytes of the Value-tree encoder, which decode back.
                #expect(state.cbor() == CBOR.encode(state.referenceEncoding), "round \(round), seed \(seed)")
                #expect(try DocumentState(encoded: CBOR.decode(state.cbor())) == state, "round \(round), seed \(seed)")
            }
            #expect(first == second, "round \(round), seed \(seed)")
            #expect(first == grouped, "round \(round), seed \(seed)")
            var again = first
            let changed = again.merge(first)
            #expect(!changed, "idempotent, round \(round), seed \(seed)")
            #expect(first.materialize(id: Self.id) == Self.model(ops, Set(ops.indices)), "round \(round), seed \(seed)")
        }
    }
}
