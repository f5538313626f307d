import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// Local writes keep the delta of what they changed beside the row (docs/DELTAS.md); a store
/// that holds the delta's base merges it to exactly the sender's state, and one that does not
/// refuses the batch for the whole states (never keeps the delta aside, never stores the
/// checkpoint past it).
@Suite struct DeltaStoreTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()

    /// A 20-field car.
    static func car(_ id: String, price: Int64 = 1_000) -> Value {
        var fields: UTF8Map<Value> = ["_id": .string(id), "price": .int(price)]
        for i in 0..<19 { fields["field\(i)"] = .string("value number \(i) of \(id)") }
        return .map(fields)
    }

    /// The change-log entry of `id` in collection `c`.
    static func record(_ store: DocumentStore, _ id: String) throws -> ChangeRecord {
        try #require(
            try store.changes(in: "c", after: 0, limit: 1_000, maxBytes: .max).records.first { $0.id == .string(id) })
    }

    /// The entry as a peer receives it: its delta when it has one.
    static func asDelta(_ record: ChangeRecord) throws -> RemoteDocument {
        let delta = try #require(record.delta)
        return RemoteDocument(collection: record.collection, id: record.id, state: delta.bytes)
    }

    /// Stores A and B holding the same car `x`, written once on A and merged into B, the clock
    /// 10 ms on: the set-up of a delta B can apply. `bClock` gives B a clock of its own.
    static func pairHoldingX(_ dir: TemporaryDirectory, _ clock: ManualClock, bClock: ManualClock? = nil) throws
        -> (DocumentStore, DocumentStore)
    {
        let a = try openStore(dir, "a", clock: clock)
        let b = try openStore(dir, "b", clock: bClock ?? clock)
        try a.upsert(car("x"), in: "c", writeStrategy: .merge)
        _ = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        clock.advance(by: 10)
        return (a, b)
    }

    static let checkpoint = ("c\u{1F}true\u{1F}{}", Checkpoint(epoch: Array(repeating: 1, count: 16), seq: 99))

    @Test func aReceiverHoldingTheBaseMergesTheDeltaToTheSendersState() throws {
        let (a, b) = try Self.pairHoldingX(dir, clock)
        let before = try Self.record(a, "x")
        #expect(before.delta == nil)  // written once: nothing to base a delta on
        try a.upsert(["_id": "x", "price": 1_200], in: "c", writeStrategy: .merge)
        let after = try Self.record(a, "x")
        let delta = try #require(after.delta)
        #expect(delta.baseSeq == before.seq)
        #expect(delta.bytes.count * 4 < after.state.count, "\(delta.bytes.count) against \(after.state.count)")
        #expect(StateDelta.digest(in: delta.bytes) == StateDigest(after.state))
        let outcome = try b.merge([try Self.asDelta(after)], from: [1], checkpoint: Self.checkpoint)
        #expect(outcome.applied == 1)
        #expect(try Self.record(b, "x").state == after.state)
        #expect(try b.checkpoint(peer: [1], subscription: Self.checkpoint.0) == Self.checkpoint.1)
        // The merge is B's, not a local write: B keeps no delta to pass on.
        #expect(try Self.record(b, "x").delta == nil)
    }

    /// A row stored by a build before the compact form keeps an old-form delta: the store reads
    /// it, a receiver takes it as it is sent (as stored), and the next local write extends it
    /// into one compact delta from the same base.
    @Test func anOldFormDeltaStoredByAnEarlierBuildIsSentAndExtended() throws {
        let (a, b) = try Self.pairHoldingX(dir, clock)
        let base = try Self.record(a, "x").seq
        try a.upsert(["_id": "x", "price": 1_200], in: "c", writeStrategy: .merge)
        let compact = try #require(try Self.record(a, "x").delta).bytes
        #expect(compact.first == 0x84)
        let old = try StateDelta(bytes: compact).encodedInOldForm()
        let hex = old.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
        try Connection(path: dir.path("a")).execute("UPDATE documents SET delta = x'\(hex)' WHERE collection = 'c'")
        let stored = try Self.record(a, "x")
        #expect(stored.delta?.bytes == old)
        #expect(try b.merge([try Self.asDelta(stored)], from: [1], checkpoint: nil).applied == 1)
        #expect(try Self.record(b, "x").state == stored.state)
        clock.advance(by: 10)
        try a.upsert(["_id": "x", "price": 1_300], in: "c", writeStrategy: .merge)
        let extended = try Self.record(a, "x")
        let delta = try #require(extended.delta)
        #expect(delta.baseSeq == base)
        #expect(delta.bytes.first == 0x84)
        #expect(try StateDelta(bytes: delta.bytes).base == StateDelta(bytes: old).base)
        #expect(try b.merge([try Self.asDelta(extended)], from: [1], checkpoint: nil).applied == 1)
        #expect(try Self.record(b, "x").state == extended.state)
    }

    @Test func oneDeltaCoversEveryLocalWriteSinceItsBase() throws {
        let (a, b) = try Self.pairHoldingX(dir, clock)
        let base = try Self.record(a, "x").seq
        try a.upsert(["_id": "x", "price": 1_200], in: "c", writeStrategy: .merge)
        clock.advance(by: 10)
        _ = try a.update(
            id: "x", in: "c",
            operations: [.unset(try FieldPath(parsing: "field3")), .increment(try FieldPath(parsing: "n"), 2)])
        let after = try Self.record(a, "x")
        #expect(after.delta?.baseSeq == base)
        _ = try b.merge([try Self.asDelta(after)], from: [1], checkpoint: nil)
        #expect(try Self.record(b, "x").state == after.state)
    }

    @Test func aReceiverWithoutTheBaseAsksForTheWholeStateAndKeepsNothingOfThePiece() throws {
        let a = try openStore(dir, "a", clock: clock)
        let b = try openStore(dir, "b", clock: clock)
        try a.upsert([Self.car("x"), Self.car("y")], in: "c", writeStrategy: .merge)
        clock.advance(by: 10)
        try a.upsert(["_id": "x", "price": 1_200], in: "c", writeStrategy: .merge)
        // B never had x: the delta cannot be applied, and y, merged before it in the same piece,
        // is not kept either; the checkpoint stays where it was.
        let y = try #require(try batch(of: a).first { $0.id == "y" })
        #expect(throws: StoreError.self) {
            try b.merge([y, try Self.asDelta(try Self.record(a, "x"))], from: [1], checkpoint: Self.checkpoint)
        }
        #expect(try b.changes(in: "c", after: 0, limit: 10, maxBytes: .max).records.isEmpty)
        #expect(try b.checkpoint(peer: [1], subscription: Self.checkpoint.0) == nil)
        #expect(try b.deferredDocuments().isEmpty)
        // The whole state then goes the usual way.
        _ = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        #expect(try Self.record(b, "x").state == (try Self.record(a, "x")).state)
    }

    @Test func aReceiverThatMissedAnIntermediateWriteAsksForTheWholeState() throws {
        let (a, b) = try Self.pairHoldingX(dir, clock)
        try a.upsert(["_id": "x", "price": 1_200], in: "c", writeStrategy: .merge)
        // A remote merge on A ends the delta: the next local write starts a new one, based on a
        // state B never saw.
        let c = try openStore(dir, "c", clock: clock)
        clock.advance(by: 10)
        try c.upsert(["_id": "x", "colour": "red"], in: "c", writeStrategy: .merge)
        _ = try a.merge(try batch(of: c), from: [3], checkpoint: nil)
        #expect(try Self.record(a, "x").delta == nil)
        clock.advance(by: 10)
        try a.upsert(["_id": "x", "price": 1_300], in: "c", writeStrategy: .merge)
        do {
            _ = try b.merge([try Self.asDelta(try Self.record(a, "x"))], from: [1], checkpoint: nil)
            Issue.record("a delta on a base B never held was applied")
        } catch StoreError.needsWholeState(let reason) {
            #expect(reason.contains("has not seen the state the delta is based on"), "\(reason)")
        }
        _ = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        #expect(try Self.record(b, "x").state == (try Self.record(a, "x")).state)
    }

    @Test func anEvictedDocumentAsksForTheWholeState() throws {
        let (a, b) = try Self.pairHoldingX(dir, clock)
        #expect(try b.evict(id: "x", in: "c"))
        try a.upsert(["_id": "x", "price": 1_200], in: "c", writeStrategy: .merge)
        #expect(throws: StoreError.self) {
            try b.merge([try Self.asDelta(try Self.record(a, "x"))], from: [1], checkpoint: nil)
        }
    }

    @Test func aDeltaTooFarAheadIsNotKeptAsideButAskedForWhole() throws {
        let (a, b) = try Self.pairHoldingX(dir, clock, bClock: ManualClock())
        clock.advance(by: 3_600_000)
        try a.upsert(["_id": "x", "price": 1_200], in: "c", writeStrategy: .merge)
        #expect(throws: StoreError.self) {
            try b.merge([try Self.asDelta(try Self.record(a, "x"))], from: [1], checkpoint: nil)
        }
        #expect(try b.deferredDocuments().isEmpty)
        // Whole, the state is deferred as any state too far ahead.
        let outcome = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        #expect(outcome.deferred.count == 1)
    }

    @Test func removesAndWritesOfNewDocumentsKeepNoDelta() throws {
        let a = try openStore(dir, "a", clock: clock)
        try a.upsert(Self.car("x"), in: "c", writeStrategy: .merge)
        clock.advance(by: 10)
        try a.upsert(["_id": "x", "price": 1_200], in: "c", writeStrategy: .merge)
        #expect(try Self.record(a, "x").delta != nil)
        clock.advance(by: 10)
        #expect(try a.remove(id: "x", in: "c"))
        #expect(try Self.record(a, "x").delta == nil)
    }
}

/// Deltas and the reaping of removed fields' remove contexts (docs/DATA-MODEL.md, "Tombstones
/// and reaping"; docs/DELTAS.md). A delta vouches only for the stamps above its base, so what a
/// write removed below it must travel as the field's remove context, although the store reaps
/// that context as it writes when the removed entries were written more than the TTL ago.
@Suite struct DeltaReapingTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()

    /// d: {m: {a: 1, b: 2}, v: 1} and 19 more fields, so that a one-field change is worth a delta.
    static var document: Value {
        var fields: UTF8Map<Value> = ["_id": "d", "m": ["a": 1, "b": 2], "v": 1]
        for i in 0..<19 { fields["field\(i)"] = .string("value number \(i) of d") }
        return .map(fields)
    }

    /// Stores A and B holding the same state of ``document`` (v written twice on A), the clock
    /// then moved past the TTL: every entry of it is older than the TTL.
    func pairAfterTheTTL() throws -> (DocumentStore, DocumentStore) {
        let a = try openStore(dir, "a", clock: clock)
        let b = try openStore(dir, "b", clock: clock)
        try a.upsert(Self.document, in: "c")
        try a.update(id: "d", in: "c", operations: [.set(FieldPath.key("v"), .int(2), isDefault: false)])
        _ = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        clock.advance(by: a.options.tombstoneTTL + 1_000)
        return (a, b)
    }

    /// A and B hold d {m: {a: 1, b: 2}}; more than the TTL later A unsets m.b. The remove
    /// context of m.b names a write older than the TTL, so A's store reaps it as it writes. B
    /// merges what A sends (the delta when there is one) and shows what A shows.
    ///
    /// Failed before: A's delta carried m without b and without the context that removed it
    /// (reaped as A wrote); B kept m.b (its stamp below the delta's base), and showed
    /// {a: 1, b: 2} for good. Now the delta is made from the state as written.
    @Test func aRemoveOfAFieldWrittenBeforeTheTTLReachesAReceiverOfTheDelta() throws {
        let (a, b) = try pairAfterTheTTL()
        try a.update(id: "d", in: "c", operations: [.unset(FieldPath(components: [.key("m"), .key("b")]))])
        let record = try DeltaStoreTests.record(a, "d")
        let sent = RemoteDocument(collection: "c", id: "d", state: record.delta?.bytes ?? record.state)
        _ = try b.merge([sent], from: [1], checkpoint: nil)
        let shown = try #require(try a.document(id: "d", in: "c"))
        #expect(shown["m"] == ["a": 1])
        #expect(try b.document(id: "d", in: "c") == shown)
        #expect(try b.state(id: "d", in: "c") == a.state(id: "d", in: "c"))
    }

    /// Two writes in a row, each overwriting a value written more than the TTL ago: the second
    /// write's delta carries the first's field again with the context that removed the old
    /// value (reaped from the stored row by then). B, holding only the state before both, merges
    /// it to A's state: no old value is kept beside the new one.
    @Test func aDeltaCarriedOverTwoWritesKeepsTheRemoveContextsOfTheFirst() throws {
        let (a, b) = try pairAfterTheTTL()
        try a.update(id: "d", in: "c", operations: [.unset(FieldPath(components: [.key("m"), .key("b")]))])
        clock.advance(by: 10)
        try a.update(id: "d", in: "c", operations: [.set(FieldPath.key("field3"), .int(3), isDefault: false)])
        let record = try DeltaStoreTests.record(a, "d")
        let delta = try #require(record.delta)
        _ = try b.merge([RemoteDocument(collection: "c", id: "d", state: delta.bytes)], from: [1], checkpoint: nil)
        #expect(try b.state(id: "d", in: "c") == a.state(id: "d", in: "c"))
    }
}
