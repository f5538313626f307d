import Testing
import TrellisCore
import TrellisTestKit

/// What peers send is untrusted: decoding any bytes or values as messages or document states
/// either succeeds or throws, never traps; what decodes merges and materialises without trapping.
@Suite struct UntrustedInputTests {
    func validState(_ random: inout SeededRandom) throws -> DocumentState {
        var state = DocumentState()
        for n in 0..<Int.random(in: 1...6, using: &random) {
            let s = Stamp(
                time: HLCTimestamp(millis: UInt64(100 + n), logical: 0), site: SiteID.random(in: 1...3, using: &random))
            switch Int.random(in: 0..<4, using: &random) {
            case 0: state.merge(fields: ["a": randomValue(depth: 2, using: &random), "m": ["x": 1]], stamp: s)
            case 1: try state.increment(.key("n"), by: 2, stamp: s)
            case 2: _ = try state.unset(.key("a"), stamp: s)
            default: state.remove(stamp: s)
            }
        }
        return state
    }

    @Test func mutatedStatesAndMessagesNeverTrap() throws {
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        print("UntrustedInputTests seed=\(seed) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        var decoded = 0
        for _ in 0..<3000 {
            let state = try validState(&random)
            var bytes = state.cbor()
            let message = WireMessage.batch(
                subscription: "c\u{1F}true\u{1F}{}", documents: [WireDocument(collection: "c", id: "d", state: bytes)],
                upTo: 5, generation: 0
            ).serialized()
            var wire = message
            // Flip, insert or delete a few bytes.
            for _ in 0..<Int.random(in: 1...4, using: &random) {
                let i = Int.random(in: 0..<bytes.count, using: &random)
                switch Int.random(in: 0..<3, using: &random) {
                case 0: bytes[i] = UInt8.random(in: 0...255, using: &random)
                case 1: bytes.insert(UInt8.random(in: 0...255, using: &random), at: i)
                default: if bytes.count > 1 { bytes.remove(at: i) }
                }
                let j = Int.random(in: 0..<wire.count, using: &random)
                wire[j] = UInt8.random(in: 0...255, using: &random)
            }
            if let value = try? CBOR.decode(bytes), let mutated = try? DocumentState(encoded: value) {
                decoded += 1
                var merged = state
                merged.merge(mutated)
                _ = merged.materialize(id: "d")
                _ = merged.cbor()
            }
            _ = try? WireMessage(serialized: wire)
            // Random values where a state is expected.
            _ = try? DocumentState(encoded: randomValue(depth: 4, using: &random))
        }
        #expect(decoded > 0, "some mutations still decode, so merging them was exercised (seed \(seed))")
    }
}
