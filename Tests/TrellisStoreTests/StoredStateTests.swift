import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

@Suite struct StoredStateTests {
    let site: SiteID = 0xABCD

    func stamp(_ t: UInt64) -> Stamp { Stamp(time: HLCTimestamp(millis: t, logical: 0), site: site) }

    /// A state written by one write is kept as its stamp; any other state whole. Both read back
    /// as the same state.
    @Test func singleWriteStatesAreCompactAndEveryStateReadsBack() throws {
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        print("StoredStateTests seed=\(seed) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        var compact = 0
        for round in 0..<500 {
            var state = DocumentState()
            var fields: UTF8Map<Value> = [:]
            for k in 0..<Int.random(in: 0...5, using: &random) {
                let v = randomValue(depth: 3, using: &random)
                if (try? v.validate()) != nil { fields["f\(k)"] = v }
            }
            for key in ["\u{E9}", "e\u{301}"] where Bool.random(using: &random) { fields[key] = .int(Int64(round)) }
            state.merge(fields: fields, stamp: stamp(10))
            switch Int.random(in: 0..<4, using: &random) {
            case 0: try state.set(.key("later"), to: 1, stamp: stamp(11))  // two stamps
            case 1: try state.increment(.key("n"), by: 1, stamp: stamp(10))  // a counter
            case 2: state.remove(stamp: stamp(12))  // a tombstone
            default: break  // one write
            }
            let id: Value = "d"
            let materialized = state.materialize(id: id)
            let bytes = StoredState.bytes(for: state, materialized: materialized)
            if StoredState.isCompact(bytes) {
                compact += 1
                #expect(bytes.count < 40)
            }
            let value = materialized.map { JSON.string($0) }
            #expect(try StoredState.decode(bytes, value: value) == state, "round \(round), seed \(seed)")
        }
        #expect(compact > 50, "seed \(seed)")
    }

    /// "é" (U+00E9) and "e" + U+0301 in one write stay two fields in the compact form and in the
    /// whole state.
    @Test func bothSpellingsOfAKeyReadBackFromEitherForm() throws {
        let (nfc, nfd) = ("\u{E9}", "e\u{301}")
        var state = DocumentState(fields: [nfc: 1, nfd: 2, "m": [nfd: 3, nfc: 4]], stamp: stamp(10))
        for compact in [true, false] {
            let materialized = try #require(state.materialize(id: "d"))
            #expect(materialized[nfc] == 1 && materialized[nfd] == 2 && materialized["m"]?.mapValue?.count == 2)
            let bytes = StoredState.bytes(for: state, materialized: materialized)
            #expect(StoredState.isCompact(bytes) == compact)
            let decoded = try StoredState.decode(bytes, value: JSON.string(materialized))
            #expect(decoded == state)
            #expect(decoded.materialize(id: "d") == materialized)
            try state.set(.key("later"), to: 1, stamp: stamp(11))
        }
    }
}
