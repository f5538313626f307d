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

    @Test func mutatedAndTruncatedDeltasNeverTrapNorStick() throws {
        let (a, b) = try DeltaStoreTests.pairHoldingX(dir, clock)
        try a.upsert(["_id": "x", "price": 1_200, "nested": ["k": 1]], in: "c", writeStrategy: .merge)
        let record = try DeltaStoreTests.record(a, "x")
        let delta = try #require(record.delta).bytes
        var inputs: [[UInt8]] = (0..<delta.count).map { Array(delta[..<$0]) }
        for i in 0..<delta.count {
            for flip in [UInt8(0x01), UInt8(0x80), UInt8(0xFF)] {
                var m = delta
                m[i] ^= flip
                inputs.append(m)
            }
        }
        inputs.append([0xA3, 0x61, 0x62])
        inputs.append([0xA3, 0x61, 0x62, 0x80, 0x61, 0x64, 0xA0, 0x61, 0x68, 0x50] + Array(repeating: 0, count: 16))
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
        _ = ("refused \(refused), applied \(applied) of \(inputs.count)")
        // Whatever the hostile deltas did, the sender's whole state still brings b to a join
        // that holds a's state (b then sends a the difference).
        _ = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        let onB = try #require(try b.state(id: "x", in: "c"))
        var joined = onB
        #expect(!joined.merge(try #require(try a.state(id: "x", in: "c"))))
    }
}
