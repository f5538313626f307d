import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// Documents written once travel and are stored as their JSON plus one stamp (SingleWriteState,
/// docs/PROTOCOL.md §3): the fast paths of upsert, the change log and merge must give exactly what
/// the general paths give, and bad single-write states from peers are deferred, never applied.
@Suite struct SingleWriteTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()
    let site: SiteID = 0xABCD

    func stamp(_ t: UInt64) -> Stamp { Stamp(time: HLCTimestamp(millis: t, logical: 0), site: site) }

    /// The fast path stores a new document as `{"u": stamp}` plus `JSON.string(fields + _id)`
    /// without building its state: the general path (build the state, materialise, choose the
    /// form) must give the same bytes for every document.
    @Test func theFastPathStoresWhatTheGeneralPathStores() throws {
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        print("SingleWriteTests seed=\(seed) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        for round in 0..<1_000 {
            var fields: UTF8Map<Value> = [:]
            for _ in 0..<Int.random(in: 0...6, using: &random) {
                let key = Bool.random(using: &random) ? "f\(Int.random(in: 0..<9, using: &random))" : "\u{E9}"
                fields[key] = randomValue(depth: 3, using: &random)
            }
            let id: Value = Bool.random(using: &random) ? .string("d\(round)") : ["k": .int(Int64(round))]
            var document = fields
            document["_id"] = id
            guard (try? Value.map(document).validate()) != nil else { continue }
            let state = DocumentState(fields: fields, stamp: stamp(10))
            let materialized = try #require(state.materialize(id: id))
            #expect(materialized == .map(document), "round \(round), seed \(seed)")
            #expect(
                StoredState.bytes(for: state, materialized: materialized) == StoredState.compact(stamp(10)),
                "round \(round), seed \(seed)")
            #expect(JSON.string(materialized) == JSON.string(.map(document)))
            let single = SingleWriteState(stamp: stamp(10), json: JSON.string(.map(document)))
            #expect(try DocumentState(bytes: single.encoded(), id: id) == state, "round \(round), seed \(seed)")
        }
    }

    /// A document written once goes out in the single-write form, and a changed one whole; a
    /// store that merges them holds the same documents and sends the same bytes on.
    @Test func theChangeLogSendsSingleWritesAsTheyAreStoredAndAReceiverPassesThemOnUnchanged() throws {
        let a = try openStore(dir, "a.sqlite", clock: clock)
        let b = try openStore(dir, "b.sqlite", clock: clock)
        try a.upsert([["_id": "once", "n": 1, "m": ["x": [1, 2.5, "z"]]], ["_id": "twice", "n": 1]], in: "c")
        try a.upsert(["_id": "twice", "n": 2], in: "c")
        let records = try a.changes(in: "c", after: 0, limit: 100, maxBytes: .max).records
        let forms = Dictionary(uniqueKeysWithValues: records.map { ($0.key, SingleWriteState.isEncoded($0.state)) })
        #expect(forms == ["\"once\"": true, "\"twice\"": false])
        let outcome = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        #expect(outcome.applied == 2 && outcome.deferred.isEmpty)
        #expect(try b.document(id: "once", in: "c") == ["_id": "once", "n": 1, "m": ["x": [1, 2.5, "z"]]])
        #expect(try b.document(id: "twice", in: "c") == ["_id": "twice", "n": 2])
        let passedOn = try b.changes(in: "c", after: 0, limit: 100, maxBytes: .max).records
        #expect(Set(passedOn.map(\.state)) == Set(records.map(\.state)))
    }

    /// A single-write state for a document the receiver already holds merges field by field, as the
    /// whole state would.
    @Test func aSingleWriteIntoAnExistingDocumentMerges() throws {
        let a = try openStore(dir, "a.sqlite", clock: clock)
        let b = try openStore(dir, "b.sqlite", clock: clock)
        try b.upsert(["_id": "d", "mine": true], in: "c")
        clock.advance(by: 5)
        try a.upsert(["_id": "d", "theirs": 1], in: "c")
        let outcome = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        #expect(outcome.applied == 1)
        #expect(try b.document(id: "d", in: "c") == ["_id": "d", "mine": true, "theirs": 1])
        let sent = try b.changes(in: "c", after: 0, limit: 100, maxBytes: .max).records
        #expect(sent.count == 1 && !SingleWriteState.isEncoded(sent[0].state))
    }

    /// Bad single-write states are deferred with the reason and nothing is applied; the
    /// checkpoint is stored with them.
    @Test func malformedSingleWritesAreDeferredNotApplied() throws {
        let b = try openStore(dir, "b.sqlite", clock: clock)
        let now = stamp(clock.now)
        func state(_ json: String, at stamp: Stamp? = nil) -> [UInt8] {
            SingleWriteState(stamp: stamp ?? now, json: json).encoded()
        }
        let cases: [(id: String, state: [UInt8], reason: String)] = [
            ("bad-json", state("{\"_id\":\"bad-json\","), "does not parse"),
            ("not-a-map", state("[1]"), "not a map"),
            ("no-id", state("{\"v\":1}"), "no _id"),
            ("other-id", state("{\"_id\":\"someone-else\",\"v\":1}"), "_id \"someone-else\""),
            ("reserved", state("{\"_id\":\"reserved\",\"v\":{\"$bytes\":1}}"), "$bytes"),
            ("ahead", state("{\"_id\":\"ahead\"}", at: stamp(clock.now + 86_400_000)), "ahead of this node's clock"),
            ("trailing", state("{\"_id\":\"trailing\"}") + [0], "does not decode"),
        ]
        let documents = cases.map { RemoteDocument(collection: "c", id: .string($0.id), state: $0.state) }
        let outcome = try b.merge(
            documents, from: [1],
            checkpoint: (subscription: "s", Checkpoint(epoch: [UInt8](repeating: 1, count: 16), seq: 7)))
        #expect(outcome.applied == 0)
        let reasons = Dictionary(uniqueKeysWithValues: outcome.deferred.map { ($0.key, $0.reason) })
        for c in cases {
            let reason = try #require(reasons["\"\(c.id)\""], "\(c.id) was not deferred")
            #expect(reason.contains(c.reason), "\(c.id): \(reason)")
            #expect(try b.document(id: .string(c.id), in: "c") == nil)
        }
        #expect(try b.checkpoint(peer: [1], subscription: "s")?.seq == 7)
    }

    /// A first sync's single-write state is stored by an insert that skips rows it finds: a
    /// document held here as a newer tombstone, an eviction stub or the same document takes the
    /// general path, with the same outcome as before the shortcut.
    @Test func aSingleWriteOntoARowHeldHereTakesTheGeneralPath() throws {
        let a = try openStore(dir, "a.sqlite", clock: clock)
        try a.upsert([["_id": "removed", "v": 1], ["_id": "evicted", "v": 2], ["_id": "same", "v": 3]], in: "c")
        let first = try batch(of: a)
        #expect(first.allSatisfy { SingleWriteState.isEncoded($0.state) })
        let b = try openStore(dir, "b.sqlite", clock: clock)
        #expect(try b.merge(first, from: [1], checkpoint: nil).applied == 3)
        clock.advance(by: 10)
        try b.remove(id: "removed", in: "c")
        #expect(try b.evict(id: "evicted", in: "c"))
        let seqBefore = b.lastSeq
        let outcome = try b.merge(first, from: [1], checkpoint: nil)
        // The stub is brought back by the copy; the tombstone is newer; the same state adds nothing.
        #expect(outcome.applied == 1 && outcome.deferred.isEmpty)
        #expect(try b.document(id: "removed", in: "c") == nil)
        #expect(try b.document(id: "evicted", in: "c") == ["_id": "evicted", "v": 2])
        #expect(try b.document(id: "same", in: "c") == ["_id": "same", "v": 3])
        #expect(b.lastSeq == seqBefore + 1)
    }

    /// A stale single-write copy of a document whose tombstone was reaped here takes the general
    /// path: it is removed again, not brought back.
    @Test func aSingleWriteOfAReapedDocumentStaysRemoved() throws {
        let a = try openStore(dir, "a.sqlite", clock: clock)
        try a.upsert(["_id": "old", "v": 1], in: "c")
        let stale = try batch(of: a)
        #expect(SingleWriteState.isEncoded(stale[0].state))
        let b = try openStore(dir, "b.sqlite", clock: clock) { $0.tombstoneTTL = 1_000 }
        _ = try b.merge(stale, from: [1], checkpoint: nil)
        clock.advance(by: 10)
        try b.remove(id: "old", in: "c")
        clock.advance(by: 5_000)
        #expect(try b.reapOnceAcknowledged().reaped == 1)
        let outcome = try b.merge(stale, from: [1], checkpoint: nil)
        #expect(outcome.revived == ["\"old\""])
        #expect(try b.document(id: "old", in: "c") == nil)
    }
}
