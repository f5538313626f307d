import Testing
import TrellisCore
import TrellisTestKit

@Suite struct DocumentStateTests {
    let id: Value = "d1"

    func stamp(_ millis: UInt64, _ site: SiteID) -> Stamp {
        Stamp(time: HLCTimestamp(millis: millis, logical: 0), site: site)
    }

    @Test func lastWriterWinsByStampThenSite() {
        var a = DocumentState()
        a.set("v", to: "a", stamp: stamp(10, 1))
        var b = DocumentState()
        b.set("v", to: "b", stamp: stamp(10, 2))
        var ab = a
        ab.merge(b)
        var ba = b
        ba.merge(a)
        #expect(ab == ba)
        #expect(ab.materialize(id: id)?["v"] == "b")  // same time: the larger site ID wins
        var c = DocumentState()
        c.set("v", to: "c", stamp: stamp(11, 1))
        ab.merge(c)
        #expect(ab.materialize(id: id)?["v"] == "c")
    }

    @Test func fieldsMergePerKey() {
        var a = DocumentState()
        a.set("x", to: 1, stamp: stamp(10, 1))
        var b = DocumentState()
        b.set("y", to: 2, stamp: stamp(11, 2))
        a.merge(b)
        #expect(a.materialize(id: id) == ["_id": "d1", "x": 1, "y": 2])
    }

    @Test func removeIsAddWins() {
        // A and B hold d1 {n:1}; A removes; concurrently B sets n=2 (F02's shape).
        var base = DocumentState()
        base.set("n", to: 1, stamp: stamp(10, 1))
        var a = base
        a.remove()
        var b = base
        b.set("n", to: 2, stamp: stamp(11, 2))
        #expect(a.isDeleted)
        var ab = a
        ab.merge(b)
        var ba = b
        ba.merge(a)
        #expect(ab == ba)
        #expect(ab.materialize(id: id) == ["_id": "d1", "n": 2])
    }

    @Test func writingToARemovedIDBringsItBackWithOnlyTheNewFields() {
        var a = DocumentState()
        a.set("v", to: "one", stamp: stamp(10, 1))
        a.set("old", to: true, stamp: stamp(10, 1))
        a.remove()
        #expect(a.materialize(id: id) == nil)
        a.set("v", to: "new", stamp: stamp(12, 1))
        #expect(a.materialize(id: id) == ["_id": "d1", "v": "new"])
    }

    @Test func encodingRoundTripsAndRejectsMalformedStates() throws {
        var a = DocumentState()
        a.set("v", to: ["nested": [1, 2.5, "x"]], stamp: stamp(10, .max))
        a.remove()
        a.set("w", to: -0.0, stamp: stamp(12, 3))
        let decoded = try DocumentState(encoded: a.encoded)
        #expect(decoded == a)
        #expect(throws: DocumentStateError.self) { try DocumentState(encoded: "nope") }
        #expect(throws: DocumentStateError.self) { try DocumentState(encoded: ["f": ["k": [1, 2]]]) }
        #expect(throws: DocumentStateError.self) {
            try DocumentState(encoded: ["f": ["k": [.double(.nan), 1, 2]]])
        }
    }

    /// Merge is a join: any delivery order, with duplicates, of the same set of states converges.
    @Test func mergeIsCommutativeAssociativeIdempotent() {
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        print("DocumentStateTests.mergeIsCommutativeAssociativeIdempotent seed=\(seed) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        for _ in 0..<300 {
            // Three replicas make random writes and removes, exchanging state at random.
            var replicas = [DocumentState(), DocumentState(), DocumentState()]
            var history: [DocumentState] = []
            var time: UInt64 = 1
            for _ in 0..<12 {
                let r = Int.random(in: 0..<3, using: &random)
                switch Int.random(in: 0..<4, using: &random) {
                case 0: replicas[r].remove()
                case 1: replicas[r].merge(replicas[Int.random(in: 0..<3, using: &random)])
                default:
                    time += UInt64.random(in: 0...2, using: &random)
                    let key = ["a", "b", "c"][Int.random(in: 0..<3, using: &random)]
                    replicas[r].set(key, to: .int(Int64(time)), stamp: stamp(time, SiteID(r + 1)))
                }
                history.append(replicas[r])
            }
            var forward = DocumentState()
            for s in history { forward.merge(s) }
            var shuffled = DocumentState()
            for s in (history + history).shuffled(using: &random) { shuffled.merge(s) }
            // Associativity: merge pairs first, then the results.
            var grouped = DocumentState()
            let pairs = stride(from: 0, to: history.count, by: 2).map { i -> DocumentState in
                var pair = history[i]
                if i + 1 < history.count { pair.merge(history[i + 1]) }
                return pair
            }
            for pair in pairs.reversed() { grouped.merge(pair) }
            #expect(forward == shuffled, "seed \(seed)")
            #expect(forward == grouped, "seed \(seed)")
            #expect(forward.materialize(id: id) == shuffled.materialize(id: id), "seed \(seed)")
        }
    }
}
