import Testing
import TrellisTestKit

@testable import TrellisCore

/// A session's echo memory (``EchoMemory``) against a reference dictionary keyed by collection
/// and key: random remembers and forgets give the same digests and the same count, which the
/// replicator's bound on the memory relies on.
@Suite struct EchoMemoryTests {
    @Test func randomOperationsMatchAReference() {
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        print("EchoMemoryTests seed=\(seed) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        var memory = EchoMemory()
        // Byte-wise keys: Swift's `String` equality would make the two spellings one.
        var reference: [UTF8Key: [UTF8Key: StateDigest]] = [:]
        // "é" and "e" + U+0301 are two collections and two keys, as everywhere in the store.
        let collections = ["cars", "people", "\u{E9}", "e\u{301}"]
        let keys = (0..<40).map { "\"k\($0)\"" } + ["\"\u{E9}\"", "\"e\u{301}\""]
        func digest() -> StateDigest {
            StateDigest(high: UInt64.random(in: 0...3, using: &random), low: UInt64.random(in: 0...3, using: &random))
        }
        for round in 0..<3_000 {
            let collection = collections.randomElement(using: &random)!
            switch Int.random(in: 0..<10, using: &random) {
            case 0..<5:
                let entries = (0..<Int.random(in: 0...8, using: &random)).map { _ in
                    (key: keys.randomElement(using: &random)!, digest: digest())
                }
                memory.remember(entries, in: collection)
                for (key, digest) in entries { reference[UTF8Key(collection), default: [:]][UTF8Key(key)] = digest }
            case 5..<8:
                let key = keys.randomElement(using: &random)!
                memory.forget(key, in: collection)
                reference[UTF8Key(collection)]?[UTF8Key(key)] = nil
            case 8:
                memory.forget(collection: collection)
                reference[UTF8Key(collection)] = nil
            default:
                if Int.random(in: 0..<10, using: &random) == 0 {
                    memory.removeAll()
                    reference = [:]
                }
            }
            #expect(memory.count == reference.values.reduce(0) { $0 + $1.count }, "round \(round), seed \(seed)")
            #expect(memory.isEmpty == (memory.count == 0))
            for collection in collections {
                for key in keys {
                    #expect(
                        memory.digest(of: key, in: collection) == reference[UTF8Key(collection)]?[UTF8Key(key)],
                        "round \(round): \(collection) \(key), seed \(seed)")
                }
            }
        }
    }
}
