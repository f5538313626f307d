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

    /// The compact form is written and read field by field: the bytes are those of the map
    /// `{"u": [time, site]}` encoded whole, every stamp reads back, and bytes that are not that
    /// map's (a damaged row) throw as the whole decoder would.
    @Test func compactBytesAreTheEncodedMapAndDamagedOnesThrow() throws {
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        print("StoredStateTests seed=\(seed) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        let edges: [UInt64] = [0, 23, 24, 255, 256, 65_535, 65_536, 1 << 32, UInt64(Int64.max), 1 << 63, .max]
        for round in 0..<2_000 {
            let time = round < edges.count ? edges[round] : UInt64.random(in: 0...UInt64.max, using: &random)
            let site =
                round < edges.count ? edges[edges.count - 1 - round] : UInt64.random(in: 0...UInt64.max, using: &random)
            let stamp = Stamp(time: HLCTimestamp(rawValue: time), site: SiteID(bitPattern: Int64(bitPattern: site)))
            let bytes = StoredState.compact(stamp)
            let whole = CBOR.encode(["u": [.int(Int64(bitPattern: time)), .int(Int64(bitPattern: site))]])
            #expect(bytes == whole, "round \(round), seed \(seed)")
            #expect(try StoredState.compactStamp(bytes) == stamp, "round \(round), seed \(seed)")
        }
        // Any spelling the whole decoder reads is read: an indefinite array, a longer argument.
        let stamp = Stamp(time: HLCTimestamp(rawValue: 1_000), site: 7)
        #expect(try StoredState.compactStamp([0xA1, 0x61, 0x75, 0x9F, 0x19, 0x03, 0xE8, 0x07, 0xFF]) == stamp)
        #expect(try StoredState.compactStamp([0xA1, 0x61, 0x75, 0x82, 0x1A, 0, 0, 0x03, 0xE8, 0x18, 0x07]) == stamp)
        let good = StoredState.compact(Stamp(time: HLCTimestamp(rawValue: 1_000), site: 7))
        let damaged: [[UInt8]] = [
            Array(good.dropLast()),  // truncated
            good + [0x00],  // trailing bytes
            [0xA1, 0x61, 0x75],  // no value
            [0xA1, 0x61, 0x75, 0x83, 0x01, 0x02, 0x03],  // three integers
            [0xA1, 0x61, 0x75, 0x81, 0x01],  // one
            [0xA1, 0x61, 0x75, 0x82, 0x01, 0x61, 0x78],  // a text where the site goes
            [0xA1, 0x61, 0x75, 0x9F, 0x01, 0x02, 0x03, 0xFF],  // an indefinite array of three
            [0xA1, 0x61, 0x75, 0x9F, 0x01, 0x02],  // an indefinite array without its end
            [0xA1, 0x61, 0x75, 0x82, 0x1B, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x01],  // beyond Int64
            [0xA1, 0x61, 0x75, 0x01],  // not an array
        ]
        for bytes in damaged {
            #expect(throws: (any Error).self, "\(bytes)") { try StoredState.compactStamp(bytes) }
            // The whole decoder refuses them too (a CBOR error, or not the map of a stamp).
            let whole = try? CBOR.decode(bytes)
            if case .array(let parts)? = whole?["u"], parts.count == 2, case .int = parts[0], case .int = parts[1] {
                Issue.record("the whole decoder reads a stamp from \(bytes)")
            }
        }
    }
}
