import Testing
import TrellisTestKit

@testable import TrellisCore

/// A batch is written straight into its buffer and read straight from it: its bytes must be
/// exactly those of the generic encoding of the same message (deterministic CBOR), and whatever
/// the direct reader accepts, even damaged, must be what the generic decoder reads.
@Suite struct WireMessageEncodingTests {
    func randomBatch(_ random: inout SeededRandom) -> WireMessage {
        let documents = (0..<Int.random(in: 0...6, using: &random)).map { n in
            // An empty collection is an entry without `c` (the subscription's).
            WireDocument(
                collection: [0, 1].randomElement(using: &random) == 0
                    ? "" : Bool.random(using: &random) ? "cars" : randomString(using: &random),
                id: Bool.random(using: &random) ? .string("d\(n)") : randomValue(depth: 2, using: &random),
                state: (0..<Int.random(in: 0...40, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random)
                })
        }
        return WireMessage.batch(
            subscription: Bool.random(using: &random)
                ? .key(randomString(using: &random)) : .number(UInt32.random(in: 0...UInt32.max, using: &random)),
            documents: documents, upTo: Int64.random(in: 0...Int64.max, using: &random),
            generation: Bool.random(using: &random) ? 0 : UInt32.random(in: 0...UInt32.max, using: &random),
            left: Bool.random(using: &random) ? nil : Int64.random(in: 0...1_000_000_000_000, using: &random))
    }

    @Test func damagedBatchesReadDirectlyReadAsTheGenericDecoderReadsThem() throws {
        var (random, seed) = SeededRandom.fromEnvironment(default: 0xBA7C5)
        print("WireMessageEncodingTests seed \(seed) (replay with \(SeededRandom.environmentVariable)=\(seed))")
        var direct = 0
        for round in 0..<3_000 {
            var bytes = randomBatch(&random).serialized()
            for _ in 0..<Int.random(in: 1...3, using: &random) {
                switch Int.random(in: 0..<3, using: &random) {
                case 0:
                    bytes[Int.random(in: 0..<bytes.count, using: &random)] = UInt8.random(in: 0...255, using: &random)
                case 1: bytes.removeLast(Int.random(in: 0...min(4, bytes.count - 1), using: &random))
                default:
                    bytes.insert(
                        UInt8.random(in: 0...255, using: &random), at: Int.random(in: 0...bytes.count, using: &random))
                }
            }
            guard let read = WireMessage.canonicalBatch(bytes) else { continue }
            direct += 1
            let generic = try? WireMessage(CBOR.decode(bytes))
            #expect(generic == read, "round \(round), seed \(seed)")
        }
        #expect(direct > 0, "some damaged batches still read directly (seed \(seed))")
    }

    @Test func batchesAreWrittenAsTheGenericEncoderWritesThem() throws {
        var (random, seed) = SeededRandom.fromEnvironment(default: 0xBA7C4)
        print("WireMessageEncodingTests seed \(seed) (replay with \(SeededRandom.environmentVariable)=\(seed))")
        for round in 0..<300 {
            let message = randomBatch(&random)
            #expect(message.serialized() == CBOR.encode(message.encoded), "round \(round), seed \(seed)")
            #expect(WireMessage.canonicalBatch(message.serialized()) == message, "round \(round), seed \(seed)")
            #expect(try WireMessage(CBOR.decode(message.serialized())) == message, "round \(round), seed \(seed)")
        }
    }

    /// Batches changed field by field rather than byte by byte (a key left out, added, doubled
    /// between `sub` and `i`, a `c` empty or of another type, an unknown key), written in
    /// deterministic CBOR: whatever the direct reader accepts is what the generic decoder reads.
    @Test func restructuredBatchesReadDirectlyReadAsTheGenericDecoderReadsThem() throws {
        var (random, seed) = SeededRandom.fromEnvironment(default: 0xBA7C6)
        print("WireMessageEncodingTests seed \(seed) (replay with \(SeededRandom.environmentVariable)=\(seed))")
        let topKeys = ["t", "i", "sub", "gen", "docs", "left", "upTo", "zz", "c"]
        let entryKeys = ["c", "id", "s", "zz", "i"]
        func field(_ random: inout SeededRandom) -> Value {
            switch Int.random(in: 0..<8, using: &random) {
            case 0: return .string("")
            case 1: return .string("cars")
            case 2: return .int(Int64.random(in: 0...5, using: &random))
            case 3: return .int(-1)
            case 4: return .int(1 << 32)
            case 5: return .bytes([1, 2])
            case 6: return .string("batch")
            default: return .int(Int64(UInt32.max))
            }
        }
        var direct = 0
        for round in 0..<5_000 {
            guard case .map(var top) = randomBatch(&random).encoded else { continue }
            for _ in 0..<Int.random(in: 1...3, using: &random) {
                let onEntry = Bool.random(using: &random)
                if onEntry, case .array(var docs)? = top["docs"], !docs.isEmpty {
                    let k = Int.random(in: 0..<docs.count, using: &random)
                    guard case .map(var entry) = docs[k] else { continue }
                    let name = entryKeys.randomElement(using: &random)!
                    if Bool.random(using: &random) {
                        _ = entry.removeValue(forKey: name)
                    } else {
                        entry[name] = field(&random)
                    }
                    docs[k] = .map(entry)
                    top["docs"] = .array(docs)
                } else {
                    let name = topKeys.randomElement(using: &random)!
                    if Bool.random(using: &random) {
                        _ = top.removeValue(forKey: name)
                    } else {
                        top[name] = field(&random)
                    }
                }
            }
            let bytes = CBOR.encode(.map(top))
            guard let read = WireMessage.canonicalBatch(bytes) else { continue }
            direct += 1
            let generic = try? WireMessage(CBOR.decode(bytes))
            #expect(generic == read, "round \(round), seed \(seed): \(Value.map(top))")
        }
        #expect(direct > 0, "some restructured batches still read directly (seed \(seed))")
    }
}
