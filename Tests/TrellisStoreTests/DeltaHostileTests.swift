import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// A reviewer's hostile deltas: every truncation and single-byte change of a real delta, and
/// junk in the delta form. The store never traps; a delta it cannot use is refused with
/// `needsWholeState`, never kept aside; and its state stays a valid one whose peer's whole
/// state still merges to the sender's.
@Suite struct DeltaHostileTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()

    /// Every truncation of `delta`, and every change of one of its bytes by three flips.
    static func mangled(_ delta: [UInt8]) -> [[UInt8]] {
        var inputs: [[UInt8]] = (0..<delta.count).map { Array(delta[..<$0]) }
        for i in 0..<delta.count {
            for flip in [UInt8(0x01), UInt8(0x80), UInt8(0xFF)] {
                var m = delta
                m[i] ^= flip
                inputs.append(m)
            }
        }
        return inputs
    }

    /// Junk in the compact form: random bytes after its first byte, and random arrays of four
    /// whose parts are drawn from the real delta's and from junk.
    static func compactJunk(from delta: [UInt8], _ random: inout SeededRandom) throws -> [[UInt8]] {
        guard case .array(let parts) = try CBOR.decode(delta) else { return [] }
        let junkParts: [Value] = [
            0, 1, -1, .int(.max), .int(.min), [], [[0, 0]], [[0, 1]], [[5, 0]], [[0, -1]], .map([:]),
            ["s": []], ["s": [1], "w": [[0, 0]]], .bytes(Array(repeating: 0, count: 16)), .bytes([]), "h",
        ]
        var inputs: [[UInt8]] = []
        for _ in 0..<200 {
            let count = Int.random(in: 1..<40, using: &random)
            inputs.append([0x84] + (0..<count).map { _ in UInt8.random(in: 0...255, using: &random) })
            var four = parts
            for i in four.indices where Bool.random(using: &random) {
                four[i] =
                    Bool.random(using: &random)
                    ? junkParts.randomElement(using: &random)! : parts.randomElement(using: &random)!
            }
            inputs.append(CBOR.encode(.array(four)))
        }
        return inputs
    }

    @Test func mutatedAndTruncatedDeltasNeverTrapNorStick() throws {
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        print("DeltaHostileTests seed=\(seed) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        let (a, b) = try DeltaStoreTests.pairHoldingX(dir, clock)
        try a.upsert(["_id": "x", "price": 1_200, "nested": ["k": 1]], in: "c", writeStrategy: .merge)
        let record = try DeltaStoreTests.record(a, "x")
        let delta = try #require(record.delta).bytes
        #expect(delta.first == 0x84)  // the compact form, as stored
        // The compact bytes, the same delta in the old form (rows stored by earlier builds), and
        // junk in both forms.
        let oldForm = try StateDelta(bytes: delta).encodedInOldForm()
        var inputs = Self.mangled(delta) + Self.mangled(oldForm) + (try Self.compactJunk(from: delta, &random))
        inputs.append([0xA3, 0x61, 0x62])
        inputs.append([0xA3, 0x61, 0x62, 0x80, 0x61, 0x64, 0xA0, 0x61, 0x68, 0x50] + Array(repeating: 0, count: 16))
        inputs.append([0x84])
        inputs.append([0x84, 0x01, 0x80, 0xA0, 0x50] + Array(repeating: 0, count: 16))
        inputs.append(
            [0x84, 0x01, 0x81, 0x82, 0x00, 0x00, 0xA1, 0x61, 0x73, 0x80, 0x50] + Array(repeating: 0, count: 16))
        var refused = 0
        var applied = 0
        for input in inputs {
            do {
                let outcome = try b.merge(
                    [RemoteDocument(collection: "c", id: "x", state: input)], from: [1], checkpoint: nil)
                #expect(!StateDelta.isEncoded(input) || outcome.deferred.isEmpty, "a delta was kept aside")
                applied += outcome.applied
            } catch {
                guard case .needsWholeState = error else { throw error }
                refused += 1
            }
        }
        print("DeltaHostileTests: refused \(refused), applied \(applied) of \(inputs.count) inputs")
        // Whatever the hostile deltas did, the sender's whole state still brings b to a join
        // that holds a's state (b then sends a the difference).
        _ = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        let onB = try #require(try b.state(id: "x", in: "c"))
        var joined = onB
        #expect(!joined.merge(try #require(try a.state(id: "x", in: "c"))))
    }
}
