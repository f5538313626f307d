import Foundation
import Synchronization
import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// Write strategies, field-level updates, evict, indexes, and sorted / windowed queries of
/// `DocumentStore` (DocumentStore+Operations.swift).
@Suite struct StoreOperationsTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()

    func open(_ name: String = "store.sqlite", clock: ManualClock? = nil) throws -> DocumentStore {
        var options = StoreOptions()
        options.now = (clock ?? self.clock).source
        options.elapsed = options.now
        return try DocumentStore(path: dir.path(name), options: options)
    }

    /// Merges every change of `from`'s collection into `to`, as a peer's batch would.
    func sync(_ from: DocumentStore, into to: DocumentStore, _ collection: String = "c") throws {
        let records = try from.changes(in: collection, after: 0, limit: 10_000, maxBytes: .max).records
        _ = try to.merge(
            records.map { RemoteDocument(collection: $0.collection, id: $0.id, state: $0.state) }, from: [9],
            checkpoint: nil)
    }

    func stamp(_ store: DocumentStore, _ id: Value, _ path: String...) throws -> Stamp? {
        try store.state(id: id, in: "c")?.stamp(at: FieldPath(components: path.map { .key($0) }))
    }

    /// Counts commit events.
    final class Events: Sendable {
        final class Counter: Sendable { let count = Atomic<Int>(0) }
        let counter = Counter()
        let store: DocumentStore
        init(_ store: DocumentStore) {
            self.store = store
            store.addObserver { [counter] _ in counter.count.add(1, ordering: .relaxed) }
        }
        /// The events delivered for every commit so far.
        var value: Int {
            store.waitForObservers()
            return counter.count.load(ordering: .relaxed)
        }
    }

    // MARK: Write strategies

    @Test func mergeStrategyIsThePlainUpsert() throws {
        let store = try open()
        let start = store.lastSeq
        try store.upsert(["_id": "d", "a": 1, "m": ["x": 1, "y": 2]], in: "c", writeStrategy: .merge)
        clock.advance(by: 1)
        try store.upsert(["_id": "d", "b": 2, "m": ["y": 3]], in: "c", writeStrategy: .merge)
        #expect(try store.document(id: "d", in: "c") == ["_id": "d", "a": 1, "b": 2, "m": ["x": 1, "y": 3]])
        #expect(store.lastSeq == start + 2)
    }

    /// `upsertReportingWrites` says which documents each strategy wrote; `collectionCounts`
    /// lists collections in byte order with their live documents (tombstones count as none).
    @Test func upsertsReportTheirWritesAndCollectionsAreCounted() throws {
        let store = try open()
        #expect(try store.collectionCounts().isEmpty)
        try store.upsert(["_id": "a", "n": 1], in: "c")
        try store.upsert(["_id": "r"], in: "é")
        _ = try store.remove(id: "r", in: "é")
        func written(_ strategy: WriteStrategy, _ documents: [Value]) throws -> [Bool] {
            try store.upsertReportingWrites(documents, in: "c", writeStrategy: strategy).map(\.written)
        }
        #expect(try written(.insertIfAbsent, [["_id": "a", "n": 2], ["_id": "b"]]) == [false, true])
        #expect(try written(.insertDefaultIfAbsent, [["_id": "a"], ["_id": "d"]]) == [false, true])
        #expect(try written(.updateDifferentValues, [["_id": "a", "n": 1], ["_id": "b", "x": 1]]) == [false, true])
        #expect(try written(.merge, [["_id": "a", "n": 1]]) == [true])
        let counts = try store.collectionCounts()
        #expect(counts.map(\.name) == ["c", "é"] && counts.map(\.documents) == [3, 0])
    }

    @Test func insertIfAbsentWritesOnlyWhenNoLiveDocumentExists() throws {
        let store = try open()
        let start = store.lastSeq
        let events = Events(store)
        #expect(try store.upsert(["_id": "d", "a": 1], in: "c", writeStrategy: .insertIfAbsent) == "d")
        #expect(store.lastSeq == start + 1 && events.value == 1)
        clock.advance(by: 1)
        #expect(try store.upsert(["_id": "d", "a": 2, "b": 2], in: "c", writeStrategy: .insertIfAbsent) == "d")
        #expect(try store.document(id: "d", in: "c") == ["_id": "d", "a": 1])
        #expect(store.lastSeq == start + 1 && events.value == 1)  // no write, no seq, no event
        // A removed document is absent: the insert brings it back with only the new fields.
        try store.remove(id: "d", in: "c")
        clock.advance(by: 1)
        try store.upsert(["_id": "d", "b": 3], in: "c", writeStrategy: .insertIfAbsent)
        #expect(try store.document(id: "d", in: "c") == ["_id": "d", "b": 3])
        // Without an _id a new UUID is generated and the document written.
        let id = try store.upsert(["x": 1], in: "c", writeStrategy: .insertIfAbsent)
        #expect(try store.document(id: id, in: "c")?["x"] == 1)
    }

    @Test func insertDefaultIfAbsentLosesToAnEarlierRealWriteOnAnotherReplica() throws {
        let clockA = ManualClock(startingAt: 1_000_000)
        let clockB = ManualClock(startingAt: 1_030_000)  // B writes later by the wall clock (within the drift bound)
        let a = try open("a.sqlite", clock: clockA)
        let b = try open("b.sqlite", clock: clockB)
        try a.upsert(["_id": "d", "seats": 2, "color": "red"], in: "c")
        try b.upsert(["_id": "d", "seats": 5, "doors": 4], in: "c", writeStrategy: .insertDefaultIfAbsent)
        #expect(try b.document(id: "d", in: "c") == ["_id": "d", "seats": 5, "doors": 4])
        #expect(try stamp(b, "d", "seats") == Stamp(time: .zero, site: b.siteID))
        try sync(a, into: b)
        try sync(b, into: a)
        let expected: Value = ["_id": "d", "seats": 2, "color": "red", "doors": 4]
        #expect(try a.document(id: "d", in: "c") == expected)
        #expect(try b.document(id: "d", in: "c") == expected)
        // A real write made after the default, on the replica that wrote the default, wins too.
        clockB.advance(by: 1)
        try b.upsert(["_id": "d", "doors": 2], in: "c")
        try sync(b, into: a)
        #expect(try a.document(id: "d", in: "c")?["doors"] == 2)
    }

    @Test func insertDefaultIfAbsentWritesNothingOverAnExistingOrRemovedDocument() throws {
        let store = try open()
        try store.upsert(["_id": "d", "a": 1], in: "c")
        try store.upsert(["_id": "d", "a": 0, "b": 0], in: "c", writeStrategy: .insertDefaultIfAbsent)
        #expect(try store.document(id: "d", in: "c") == ["_id": "d", "a": 1])
        try store.remove(id: "d", in: "c")
        let seq = store.lastSeq
        try store.upsert(["_id": "d", "a": 0], in: "c", writeStrategy: .insertDefaultIfAbsent)
        #expect(try store.document(id: "d", in: "c") == nil)  // the remove is a real write
        #expect(store.lastSeq == seq)
    }

    @Test func defaultsFromTwoReplicasConvergeDeterministically() throws {
        let a = try open("a.sqlite")
        let b = try open("b.sqlite")
        try a.upsert(["_id": "d", "v": "from a"], in: "c", writeStrategy: .insertDefaultIfAbsent)
        try b.upsert(["_id": "d", "v": "from b"], in: "c", writeStrategy: .insertDefaultIfAbsent)
        try sync(a, into: b)
        try sync(b, into: a)
        let winner: Value = a.siteID > b.siteID ? "from a" : "from b"  // equal times: the site decides
        #expect(try a.document(id: "d", in: "c")?["v"] == winner)
        #expect(try b.document(id: "d", in: "c")?["v"] == winner)
    }

    @Test func updateDifferentValuesWritesOnlyTheLeavesThatDiffer() throws {
        let store = try open()
        let start = store.lastSeq
        let events = Events(store)
        try store.upsert(["_id": "d", "a": 1, "b": "x", "n": 4, "m": ["p": 1, "q": 2], "keep": true], in: "c")
        let before = try (stamp(store, "d", "a"), stamp(store, "d", "m", "p"), stamp(store, "d", "m", "q"))
        clock.advance(by: 10)
        try store.upsert(
            ["_id": "d", "a": 1, "b": "y", "n": 4.0, "m": ["p": 1, "q": 3]], in: "c",
            writeStrategy: .updateDifferentValues)
        #expect(try stamp(store, "d", "a") == before.0)  // unchanged leaves keep their stamps
        #expect(try stamp(store, "d", "m", "p") == before.1)
        #expect(try stamp(store, "d", "m", "q")! > before.2!)
        #expect(try stamp(store, "d", "b")! > before.0!)
        // 4 and 4.0 differ (types survive), and nothing given is removed.
        #expect(
            try store.document(id: "d", in: "c")
                == ["_id": "d", "a": 1, "b": "y", "n": 4.0, "m": ["p": 1, "q": 3], "keep": true])
        #expect(store.lastSeq == start + 2 && events.value == 2)
        // Nothing differs: no write, no seq, no event.
        clock.advance(by: 10)
        try store.upsert(["_id": "d", "a": 1, "m": ["q": 3]], in: "c", writeStrategy: .updateDifferentValues)
        #expect(store.lastSeq == start + 2 && events.value == 2)
        // A missing document is written whole, even with no fields.
        try store.upsert(["_id": "e"], in: "c", writeStrategy: .updateDifferentValues)
        #expect(try store.document(id: "e", in: "c") == ["_id": "e"])
    }

    @Test func updateDifferentValuesLetsAConcurrentWriteWinForUnchangedLeaves() throws {
        let clockA = ManualClock(startingAt: 1_000_000)
        let clockB = ManualClock(startingAt: 1_000_000)
        let a = try open("a.sqlite", clock: clockA)
        let b = try open("b.sqlite", clock: clockB)
        try a.upsert(["_id": "d", "x": 1, "y": 1], in: "c")
        try sync(a, into: b)
        clockB.advance(by: 5)
        try b.upsert(["_id": "d", "x": 2], in: "c")  // B changes x
        clockA.advance(by: 10)
        // A re-writes the same x (no write) and a new y: B's x survives the merge.
        try a.upsert(["_id": "d", "x": 1, "y": 3], in: "c", writeStrategy: .updateDifferentValues)
        try sync(b, into: a)
        #expect(try a.document(id: "d", in: "c") == ["_id": "d", "x": 2, "y": 3])
    }

    @Test func upsertWithAStrategyRejectsBadDocumentsAndWritesNothing() throws {
        let store = try open()
        let start = store.lastSeq
        for strategy in WriteStrategy.allCases {
            #expect(throws: StoreError.notAMap("array")) {
                try store.upsert(Value.array([1]), in: "c", writeStrategy: strategy)
            }
            #expect(throws: StoreError.self) { try store.upsert(["_id": 5], in: "c", writeStrategy: strategy) }
            #expect(throws: StoreError.self) {
                try store.upsert(["_id": "n", "x": .double(.infinity)], in: "c", writeStrategy: strategy)
            }
        }
        #expect(store.lastSeq == start)
    }

    // MARK: Update

    @Test func updateSetsNestedFieldsAndArrayElementsAndReportsResults() throws {
        let store = try open()
        let start = store.lastSeq
        let id: Value = ["vin": "A1", "plant": 3]  // composite _id
        try store.upsert(["_id": id, "name": "car", "tags": ["a", "b", ["k": 1]], "specs": ["hp": 100]], in: "c")
        clock.advance(by: 1)
        let results = try store.update(
            id: id, in: "c",
            operations: [
                .set(try FieldPath(parsing: "specs.engine.cyl"), 6, isDefault: false),
                .set(try FieldPath(parsing: "tags[1]"), "B", isDefault: false),
                .set(try FieldPath(parsing: "tags[2].k"), 2, isDefault: false),
                .unset(.key("name")),
                .unset(.key("absent")),
                .increment(.key("sold"), 2),
                .increment(.key("sold"), 0.5),
            ])
        #expect(
            results == [
                .set(docID: id, path: "specs.engine.cyl", value: 6), .set(docID: id, path: "tags[1]", value: "B"),
                .set(docID: id, path: "tags[2].k", value: 2), .removed(docID: id, path: "name"),
                .incremented(docID: id, path: "sold", amount: 2), .incremented(docID: id, path: "sold", amount: 0.5),
            ])
        #expect(
            try store.document(id: id, in: "c")
                == ["_id": id, "tags": ["a", "B", ["k": 2]], "specs": ["hp": 100, "engine": ["cyl": 6]], "sold": 2.5])
        #expect(store.lastSeq == start + 2)  // one seq for the whole update
    }

    @Test func laterMutationsOfTheSameFieldWinWithinOneUpdate() throws {
        let store = try open()
        try store.upsert(["_id": "d", "a": 1, "b": 1], in: "c")
        try store.update(
            id: "d", in: "c",
            operations: [
                .set(.key("a"), 2, isDefault: false), .set(.key("a"), 3, isDefault: false), .unset(.key("b")),
                .set(.key("b"), 4, isDefault: false), .set(.key("c"), 5, isDefault: false), .increment(.key("c"), 1),
            ])
        #expect(try store.document(id: "d", in: "c") == ["_id": "d", "a": 3, "b": 4, "c": 6])
    }

    @Test func updateRefusesIDChangesAndBadPathsAtomically() throws {
        let store = try open()
        let start = store.lastSeq
        try store.upsert(["_id": "d", "a": 1, "s": "text", "arr": [1]], in: "c")
        let before = try store.document(id: "d", in: "c")
        let ok = DocumentMutation.set(.key("a"), 2, isDefault: false)
        #expect(throws: StoreError.idChanged) {
            try store.update(id: "d", in: "c", operations: [ok, .set(.key("_id"), "e", isDefault: false)])
        }
        #expect(throws: StoreError.idChanged) { try store.update(id: "d", in: "c", operations: [.unset(.key("_id"))]) }
        let bad: [DocumentMutation] = [
            .set(try FieldPath(parsing: "arr[1]"), 0, isDefault: false),  // out of range
            .set(try FieldPath(parsing: "a[0]"), 0, isDefault: false),  // not an array
            .increment(.key("s"), 1),  // not a number
            .increment(try FieldPath(parsing: "arr[3]"), 1),
            .increment(.key("a"), .double(.nan)),
            .set(.key("a"), .double(.infinity), isDefault: false),
            .set(FieldPath(components: [.index(0)]), 1, isDefault: false),
        ]
        for mutation in bad {
            #expect(throws: StoreError.self, "\(mutation)") {
                try store.update(id: "d", in: "c", operations: [ok, mutation])
            }
        }
        #expect(try store.document(id: "d", in: "c") == before)
        #expect(store.lastSeq == start + 1)
    }

    @Test func updatingAMissingDocumentWritesNothing() throws {
        let store = try open()
        let start = store.lastSeq
        let events = Events(store)
        #expect(try store.update(id: "nope", in: "c", operations: [.set(.key("a"), 1, isDefault: false)]) == [])
        try store.upsert(["_id": "gone"], in: "c")
        try store.remove(id: "gone", in: "c")
        #expect(try store.update(id: "gone", in: "c", operations: [.set(.key("a"), 1, isDefault: false)]) == [])
        #expect(try store.document(id: "gone", in: "c") == nil)
        #expect(store.lastSeq == start + 2 && events.value == 2)
        // A no-op update (unset of an absent field) writes nothing either.
        try store.upsert(["_id": "d"], in: "c")
        #expect(try store.update(id: "d", in: "c", operations: [.unset(.key("x"))]) == [])
        #expect(store.lastSeq == start + 3)
    }

    @Test func incrementsFromTwoReplicasAddUp() throws {
        let a = try open("a.sqlite")
        let b = try open("b.sqlite")
        try a.upsert(["_id": "d", "n": 10], in: "c")
        try sync(a, into: b)
        try a.update(id: "d", in: "c", operations: [.increment(.key("n"), 1)])
        try b.update(id: "d", in: "c", operations: [.increment(.key("n"), 5), .increment(.key("n"), -2)])
        try sync(a, into: b)
        try sync(b, into: a)
        #expect(try a.document(id: "d", in: "c")?["n"] == 14)
        #expect(try b.document(id: "d", in: "c")?["n"] == 14)
    }

    @Test func defaultSetsFillOnlyAbsentFieldsAndLoseToRealWrites() throws {
        let clockA = ManualClock(startingAt: 1_000_000)
        let clockB = ManualClock(startingAt: 2_000_000)
        let a = try open("a.sqlite", clock: clockA)
        let b = try open("b.sqlite", clock: clockB)
        try a.upsert(["_id": "d", "x": 1], in: "c")
        try sync(a, into: b)
        try a.update(id: "d", in: "c", operations: [.set(.key("y"), "real", isDefault: false)])
        let results = try b.update(
            id: "d", in: "c",
            operations: [.set(.key("x"), 9, isDefault: true), .set(.key("y"), "default", isDefault: true)])
        #expect(results == [.set(docID: "d", path: "y", value: "default")])  // x is present: no effect
        #expect(try b.document(id: "d", in: "c") == ["_id": "d", "x": 1, "y": "default"])
        try sync(a, into: b)
        try sync(b, into: a)
        #expect(try a.document(id: "d", in: "c") == ["_id": "d", "x": 1, "y": "real"])
        #expect(try b.document(id: "d", in: "c") == ["_id": "d", "x": 1, "y": "real"])
    }

    @Test func mutationPreviewMatchesTheStore() throws {
        let store = try open()
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        print("mutationPreviewMatchesTheStore seed=\(seed) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        let paths = try ["a", "b.c", "b.d", "arr[0]", "arr[1].k", "arr[2]", "n"].map { try FieldPath(parsing: $0) }
        let values: [Value] = [1, 2.5, "s", nil, true, ["k": 1], [1, 2]]
        for round in 0..<200 {
            let id = Value.string("d\(round)")
            try store.upsert(["_id": id, "a": 1, "b": ["c": 1], "arr": [1, ["k": 1], 3], "n": 2], in: "c")
            var mutations: [DocumentMutation] = []
            for _ in 0..<Int.random(in: 1...4, using: &random) {
                let path = paths.randomElement(using: &random)!
                switch Int.random(in: 0..<3, using: &random) {
                case 0: mutations.append(.set(path, values.randomElement(using: &random)!, isDefault: false))
                case 1: mutations.append(.unset(path))
                default: mutations.append(.increment(path, 1.5))
                }
            }
            var preview = try #require(try store.document(id: id, in: "c"))
            var previewError = false
            do { for m in mutations { try m.apply(to: &preview) } } catch { previewError = true }
            clock.advance(by: 1)
            do {
                try store.update(id: id, in: "c", operations: mutations)
                #expect(!previewError, "seed \(seed): \(mutations)")
                let stored = try #require(try store.document(id: id, in: "c"))
                // A number set on a field that became a counter restarts the counter at that number
                // (docs/DATA-MODEL.md rule 4); compared as queries compare numbers.
                #expect(
                    Value.queryEquals(stored, preview), "seed \(seed): \(mutations): \(stored) vs \(preview)")
            } catch {
                #expect(previewError, "seed \(seed): \(mutations): \(error)")
            }
        }
    }

    // MARK: Evict

    @Test func evictLeavesALocalStubWhileRemoveLeavesATombstone() throws {
        let store = try open()
        let events = Events(store)
        try store.upsert([["_id": "e", "v": 1], ["_id": "r", "v": 2]], in: "c")
        try acknowledgeAll(store)  // a peer holds them: the stub is local
        let before = store.lastSeq
        #expect(try store.evict(id: "e", in: "c"))
        #expect(store.lastSeq == before + 1)  // the stub takes a new seq
        #expect(try store.remove(id: "r", in: "c"))
        #expect(try store.document(id: "e", in: "c") == nil && store.document(id: "r", in: "c") == nil)
        // Peers never see the stub; readers of the log see the document deleted.
        let log = try store.changes(in: "c", after: 0, limit: 100, maxBytes: .max).records
        #expect(log.map(\.id) == ["r"] && log[0].isDeleted)
        let entries = try store.entries(in: "c", after: 0, limit: 100, includeDeleted: true)
        #expect(entries.map(\.id) == ["e", "r"] && entries.allSatisfy { $0.value == nil })
        #expect(try store.entries(in: "c", after: 0, limit: 100, includeDeleted: false).isEmpty)
        // Queries and counts do not show it.
        #expect(try store.count(in: "c") == 0 && store.count(in: "c", matching: .all) == 0)
        #expect(try store.documents(in: "c", matching: Query("v == 1")).isEmpty)
        #expect(try store.state(id: "e", in: "c") != nil)  // the stub
        #expect(events.value == 3)
        // Evicting something missing, a stub or a tombstone does nothing.
        #expect(try !store.evict(id: "e", in: "c"))
        #expect(try !store.evict(id: "r", in: "c"))
        #expect(try !store.evict(id: "never", in: "c"))
        #expect(try store.changes(in: "c", after: 0, limit: 100, maxBytes: .max).records.count == 1)
        #expect(events.value == 3)
        // update, remove and insertDefaultIfAbsent treat it as absent or present as documented.
        #expect(
            try store.update(id: "e", in: "c", operations: [.set(FieldPath(parsing: "v"), 9, isDefault: false)]).isEmpty
        )
        #expect(try !store.remove(id: "e", in: "c"))
        try store.upsert(["_id": "e", "d": 1], in: "c", writeStrategy: .insertDefaultIfAbsent)
        #expect(try store.document(id: "e", in: "c") == nil)
    }

    /// Writing to an evicted `_id` starts from the stub: this site's counter total continues
    /// (issue 8 item 7d: 9 must not become 4).
    @Test func writingToAnEvictedDocumentContinuesItsCounters() throws {
        let a = try open("a.sqlite")
        let b = try open("b.sqlite")
        try a.upsert(["_id": "d"], in: "c")
        for _ in 0..<5 { try a.update(id: "d", in: "c", operations: [.increment(FieldPath(parsing: "likes"), 1)]) }
        try sync(a, into: b)
        try b.update(id: "d", in: "c", operations: [.increment(FieldPath(parsing: "likes"), 3)])
        try sync(b, into: a)
        #expect(try a.document(id: "d", in: "c")?["likes"]?.numberValue == 8)
        #expect(try a.evict(id: "d", in: "c"))
        clock.advance(by: 1)
        try a.upsert(["_id": "d", "x": 1], in: "c", writeStrategy: .insertIfAbsent)
        try a.update(id: "d", in: "c", operations: [.increment(FieldPath(parsing: "likes"), 1)])
        try sync(a, into: b)
        try sync(b, into: a)
        #expect(try a.document(id: "d", in: "c")?["likes"]?.numberValue == 9)
        #expect(try b.document(id: "d", in: "c")?["likes"]?.numberValue == 9)
    }

    /// Evicting leaves every checkpoint and the rescan generation alone (the sync engine asks peers
    /// for the evicted `_id`s only); the evicted `_id`s are listed, most recently evicted first.
    @Test func evictLeavesCheckpointsAloneAndListsTheEvictedIDs() throws {
        let store = try open()
        try store.upsert([["_id": "d"], ["_id": "e"], ["_id": "f"]], in: "c")
        let c1 = SubscriptionSpec(collection: "c").key
        _ = try store.merge([], from: [1], checkpoint: (subscription: c1, Checkpoint(epoch: [7], seq: 40)))
        #expect(try store.evict(id: "e", in: "c"))
        #expect(try store.evict(id: "d", in: "c"))
        #expect(store.rescanGeneration(collection: "c") == 0)
        #expect(try store.checkpoints(peer: [1]) == [UTF8Key(c1): .init(epoch: [7], seq: 40)])
        #expect(try store.evictedIDs(in: "c", limit: 10) == ["d", "e"])
        #expect(try store.evictedIDs(in: "c", limit: 1) == ["d"])
        #expect(try store.evictedIDs(in: "other", limit: 10).isEmpty)
        #expect(try store.evictedCollections() == ["c"])
        // A document back from a peer (or written again) is no longer listed.
        try store.upsert(["_id": "d", "v": 1], in: "c")
        #expect(try store.evictedIDs(in: "c", limit: 10) == ["e"])
        try store.upsert(["_id": "e", "v": 1], in: "c")
        #expect(try store.evictedCollections().isEmpty)
    }

    /// A copy older than the evicted one brings the document back with its newest value still
    /// withheld: the merge reports it (`withholding`), and the store keeps listing it with the
    /// evicted documents, across a reopen, until a merge makes it whole; a local write that fills
    /// the field drops it at the next open.
    @Test func aDocumentBroughtBackByAnOlderCopyStaysListedUntilWhole() throws {
        let a = try open("a.sqlite")
        let old = try open("old.sqlite")
        try a.upsert(["_id": "d", "v": 1], in: "c")
        try sync(a, into: old)
        clock.advance(by: 1)
        try a.upsert(["_id": "d", "v": 2], in: "c")
        try a.upsert(["_id": "e", "v": 1], in: "c")
        do {
            let b = try open("b.sqlite")
            try sync(a, into: b)
            #expect(try b.evict(id: "d", in: "c"))
            let records = try old.changes(in: "c", after: 0, limit: 10, maxBytes: .max).records
            let outcome = try b.merge(
                records.map { RemoteDocument(collection: $0.collection, id: $0.id, state: $0.state) }, from: [8],
                checkpoint: nil)
            #expect(outcome.withholding == ["d"])
            #expect(try b.document(id: "d", in: "c")?["v"] == nil)
            #expect(try b.evictedIDs(in: "c", limit: 10) == ["d"])
            b.close()
        }
        do {
            let b = try open("b.sqlite")
            #expect(try b.evictedIDs(in: "c", limit: 10) == ["d"])
            #expect(try b.evictedCollections() == ["c"])
            try sync(a, into: b)
            #expect(try b.document(id: "d", in: "c")?["v"] == 2)
            #expect(try b.evictedIDs(in: "c", limit: 10).isEmpty)
            #expect(try b.evictedCollections().isEmpty)
            // Withholding again, then a local write fills the field: dropped at the next open.
            #expect(try b.evict(id: "d", in: "c"))
            try sync(old, into: b)
            #expect(try b.evictedIDs(in: "c", limit: 10) == ["d"])
            try b.update(id: "d", in: "c", operations: [.set(FieldPath(parsing: "v"), 7, isDefault: false)])
            b.close()
        }
        let b = try open("b.sqlite")
        #expect(try b.document(id: "d", in: "c")?["v"] == 7)
        #expect(try b.evictedIDs(in: "c", limit: 10).isEmpty)
    }

    /// A store whose reaped keys were written before they kept their tombstone's state (no
    /// `state` column in `reaped`): it opens, such a key still decides by its time (a stale copy
    /// is removed again, never shown), and a key reaped from then on keeps its state (a write
    /// re-creating the document does not take back its old field).
    @Test func reapedKeysOfAnOlderStoreStillDecideByTime() throws {
        let stale = try open("stale.sqlite")
        do {
            let old = try open("old.sqlite")
            try old.upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]], in: "c")
            try sync(old, into: stale)
            try old.remove(id: "d1", in: "c")
            clock.advance(by: old.options.tombstoneTTL + 1)
            #expect(try old.reapOnceAcknowledged().reaped == 1)
            try keepReapedKeysAsAnEarlierVersion(old, state: false)
            old.close()
        }
        let reopened = try open("old.sqlite")
        #expect(reopened.reapedKeyCount == 1)
        try sync(stale, into: reopened)
        #expect(try reopened.document(id: "d1", in: "c") == nil)
        #expect(try reopened.state(id: "d1", in: "c")?.isDeleted == true)
        // d2 removed and reaped under this version keeps its tombstone's state.
        try reopened.remove(id: "d2", in: "c")
        clock.advance(by: reopened.options.tombstoneTTL + 1)
        _ = try reopened.reapOnceAcknowledged()
        #expect(try reopened.state(id: "d2", in: "c") == nil)
        try reopened.upsert(["_id": "d2", "w": 3], in: "c")
        #expect(try reopened.document(id: "d2", in: "c") == ["_id": "d2", "w": 3])
        try sync(stale, into: reopened)
        #expect(try reopened.document(id: "d2", in: "c") == ["_id": "d2", "w": 3])
    }

    /// A store written by the version that kept the peer a row's state came from (`source`, once
    /// used to suppress echoes) opens and works; the column is ignored.
    @Test func aStoreWithTheOldSourceColumnOpensAndWorks() throws {
        do {
            let store = try open("old.sqlite")
            try store.upsert([["_id": "a", "v": 1], ["_id": "b"]], in: "c")
            try store.withState { s in
                try s.db.execute("ALTER TABLE documents ADD COLUMN source BLOB; UPDATE documents SET source = x'0707'")
            }
        }
        let store = try open("old.sqlite")
        let other = try open("other.sqlite")
        clock.advance(by: 1)
        try store.upsert(["_id": "a", "v": 2], in: "c")
        try other.upsert(["_id": "o"], in: "c")
        try sync(other, into: store)
        let log = try store.changes(in: "c", after: 0, limit: 10, maxBytes: .max).records
        #expect(Set(log.map(\.id)) == ["a", "b", "o"])
        #expect(try store.document(id: "a", in: "c") == ["_id": "a", "v": 2])
        // What it sends back to the peer its rows came from, that peer merges without change.
        let peer = try open("peer.sqlite")
        try sync(store, into: peer)
        #expect(try peer.documents(in: "c").count == 3)
    }

    /// A store written by the version that kept no collection beside its checkpoints opens and
    /// fills it in from the subscription keys.
    @Test func checkpointsOfAnOlderStoreLearnTheirCollection() throws {
        do {
            let store = try open("old.sqlite")
            _ = try store.merge(
                [], from: [1],
                checkpoint: (subscription: SubscriptionSpec(collection: "c").key, Checkpoint(epoch: [7], seq: 5)))
            try store.withState { s in
                try s.db.execute("DROP INDEX checkpoints_by_collection; ALTER TABLE checkpoints DROP COLUMN collection")
            }
        }
        let store = try open("old.sqlite")
        let collections = try store.withState { s -> [String] in
            let st = try s.db.prepare("SELECT collection FROM checkpoints")
            defer { st.reset() }
            var out: [String] = []
            while try st.step() { out.append(st.string(0) ?? "") }
            return out
        }
        #expect(collections == ["c"])
        #expect(try store.checkpoints(peer: [1]).values.map(\.seq) == [5])
    }

    /// A store written by the version that kept nothing of its peers' reaped tombstones beside its
    /// checkpoints opens with `reaped` added: each checkpoint counts them received, as that
    /// version did, and later ones keep what they say.
    @Test func checkpointsOfAnOlderStoreCountTheirPeersReapedTombstonesReceived() throws {
        let key = SubscriptionSpec(collection: "c").key
        do {
            let store = try open("old.sqlite")
            _ = try store.merge([], from: [1], checkpoint: (key, Checkpoint(epoch: [7], seq: 5, reapedKeys: .notAsked)))
            try store.withState { s in try s.db.execute("ALTER TABLE checkpoints DROP COLUMN reaped") }
        }
        let store = try open("old.sqlite")
        #expect(try store.checkpoint(peer: [1], subscription: key) == Checkpoint(epoch: [7], seq: 5))
        _ = try store.merge([], from: [2], checkpoint: (key, Checkpoint(epoch: [7], seq: 6, reapedKeys: .wanted)))
        #expect(try store.checkpoint(peer: [2], subscription: key)?.reapedKeys == .wanted)
    }

    /// The rescan generations an earlier version kept, of two collections named alike in another
    /// Unicode form ("é" U+00E9 and "e" + U+0301, two collections here), read back as two: a
    /// `[String: UInt32]` made them one (Swift compares strings by canonical equivalence), and
    /// the replicator then asked one collection under the other's generation.
    @Test func rescanGenerationsOfCollectionsNamedAlikeStayApart() throws {
        let (nfc, nfd) = ("\u{E9}", "e\u{301}")
        do {
            let store = try open("generations.sqlite")
            try store.withState { s in
                try DocumentStore.setMeta(s.db, "rescan:" + nfc, DocumentStore.bytes(3))
                try DocumentStore.setMeta(s.db, "rescan:" + nfd, DocumentStore.bytes(7))
            }
            store.close()
        }
        let store = try open("generations.sqlite")
        #expect(store.rescanGenerations == [UTF8Key(nfc): 3, UTF8Key(nfd): 7])
        #expect(store.rescanGeneration(collection: nfc) == 3)
        #expect(store.rescanGeneration(collection: nfd) == 7)
    }

    /// A store written before `unacked` existed opens with the column added. Nothing says which
    /// of its live rows a peer holds, so they count as unacknowledged: a write made offline
    /// before the upgrade survives an eviction (a reviewer's test: with the rows counted as
    /// acknowledged, the field showed nothing on both nodes).
    @Test func aWriteUnsentAtUpgradeSurvivesAnEviction() throws {
        do {
            let a = try open("a.sqlite")
            let b = try open("b.sqlite")
            try a.upsert(["_id": "d", "u": "old"], in: "c")
            try sync(a, into: b)
            try acknowledgeAll(a)
            clock.advance(by: 10)
            try a.upsert(["_id": "d", "u": "new"], in: "c")  // offline: no peer has it
            // As that version left it: every tombstone indexed by time, no `unacked`.
            try a.withState { s in
                try s.db.execute(
                    "DROP INDEX documents_reapable; DROP INDEX documents_kept; DROP INDEX documents_kept_by_time; "
                        + "CREATE INDEX documents_tombstones ON documents(removed_at) WHERE deleted = 1; "
                        + "ALTER TABLE documents DROP COLUMN unacked")
            }
        }
        let a = try open("a.sqlite")
        let b = try open("b.sqlite")
        #expect(try a.evict(id: "d", in: "c"))
        #expect(try a.state(id: "d", in: "c")?.withheldEntryCount == 0)
        try sync(b, into: a)
        try sync(a, into: b)
        #expect(try a.document(id: "d", in: "c")?["u"] == "new")
        #expect(try b.document(id: "d", in: "c")?["u"] == "new")
    }

    @Test func seqsAreNeverReusedAfterEvictingTheNewestDocument() throws {
        var issued: Int64
        do {
            let store = try open()
            try store.upsert(["_id": "a"], in: "c")
            try store.upsert(["_id": "b"], in: "c")
            try acknowledgeAll(store)
            #expect(try store.evict(id: "b", in: "c"))
            issued = store.lastSeq
        }
        clock.set(1_000)  // a wall clock far behind cannot bring old seqs back either
        let store = try open()
        #expect(store.lastSeq == issued)
        try store.upsert(["_id": "x"], in: "c")
        let seqs = try store.changes(in: "c", after: 0, limit: 10, maxBytes: .max).records.map(\.seq)
        #expect(seqs.count == 2 && seqs[1] == issued + 1)
    }

    @Test func evictedDocumentsComeBackWhenAPeerSendsThemAgain() throws {
        let a = try open("a.sqlite")
        let b = try open("b.sqlite")
        try a.upsert(["_id": "d", "v": 1], in: "c")
        try sync(a, into: b)
        #expect(try b.evict(id: "d", in: "c"))
        try sync(a, into: b)  // what a matching subscription does: the state adds nothing to the stub
        #expect(try b.document(id: "d", in: "c") == ["_id": "d", "v": 1])
        // Also a document this node wrote itself, which a peer holds unchanged.
        try b.upsert(["_id": "own", "v": 2], in: "c")
        try sync(b, into: a)
        #expect(try b.evict(id: "own", in: "c"))
        try sync(a, into: b)
        #expect(try b.document(id: "own", in: "c") == ["_id": "own", "v": 2])
    }

    @Test func cursorRemoveAndEvictTakeTheSortedWindow() throws {
        let store = try open()
        try store.upsert((0..<10).map { ["_id": .string("d\($0)"), "n": .int(Int64($0 % 5))] }, in: "c")
        let sort = [SortKey(.key("n"), .descending)]
        let removed = try store.remove(in: "c", matching: .all, sort: sort, limit: 3)
        #expect(removed == ["d4", "d9", "d3"])
        let evicted = try store.evict(in: "c", matching: try Query("n < 2"), limit: 2, offset: 1)
        #expect(evicted == ["d1", "d5"])
        #expect(try store.documents(in: "c").map { $0["_id"]! } == ["d0", "d2", "d6", "d7", "d8"])
        #expect(try store.changes(in: "c", after: 0, limit: 100, maxBytes: .max).records.filter(\.isDeleted).count == 3)
    }

    // MARK: Sort, limit, offset

    @Test func sortOrderFollowsTheDocumentedCollation() throws {
        let store = try open()
        let docs: [Value] = [
            ["_id": "map", "k": ["a": 1]], ["_id": "arr", "k": [1, 2]], ["_id": "arr2", "k": [1]],
            ["_id": "bytes", "k": .bytes([1])], ["_id": "str", "k": "b"], ["_id": "strZ", "k": "Z"],
            ["_id": "int", "k": 3], ["_id": "dbl", "k": 2.5], ["_id": "three", "k": 3.0], ["_id": "true", "k": true],
            ["_id": "false", "k": false], ["_id": "null", "k": nil], ["_id": "missing"],
            ["_id": "big", "k": .int(.max)],
            ["_id": "huge", "k": 9_223_372_036_854_775_808.0],
        ]
        try store.upsert(docs, in: "c")
        let ids = try store.documents(in: "c", matching: .all, sort: [SortKey(.key("k"))]).map { $0["_id"]! }
        #expect(
            ids == [
                "missing", "null", "false", "true", "dbl", "int", "three", "big", "huge", "strZ", "str", "arr2", "arr",
                "map", "bytes",
            ])
        let down = try store.documents(in: "c", matching: .all, sort: [SortKey(.key("k"), .descending)])
        // Descending reverses the order of values; ties (3 and 3.0) stay in _id order.
        #expect(
            down.map { $0["_id"]! } == [
                "bytes", "map", "arr", "arr2", "str", "strZ", "huge", "big", "int", "three", "dbl", "true", "false",
                "null", "missing",
            ])
    }

    @Test func sortLimitAndOffsetMatchAReferenceOnRandomDocuments() throws {
        let store = try open()
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        print("sortLimitAndOffsetMatchAReferenceOnRandomDocuments seed=\(seed) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        let pool: [Value] = [1, 2, 2.0, -0.0, 0, 1.5, "a", "B", "é", "e\u{301}", true, false, nil, [1], ["k": 1]]
        var docs: [Value] = []
        for n in 0..<250 {
            var m: UTF8Map<Value> = ["_id": n % 7 == 0 ? ["n": .int(Int64(n))] : .string("d\(n)")]
            for key in ["a", "b"] where Int.random(in: 0..<4, using: &random) > 0 {
                m[key] =
                    Bool.random(using: &random)
                    ? pool.randomElement(using: &random)! : randomValue(depth: 1, using: &random)
            }
            if Bool.random(using: &random) { m["m"] = ["x": pool.randomElement(using: &random)!] }
            docs.append(.map(m))
        }
        try store.upsert(docs, in: "c")
        // The model works on the documents as stored (what the store's JSON round trip gives).
        docs = try store.documents(in: "c")
        let paths = try ["a", "b", "m.x", "_id", "_id.n"].map { try FieldPath(parsing: $0) }
        let queries = ["true", "a != null", "b > 1", "a == b || b == 'a'", "contains(a, 1)"]
        for round in 0..<150 {
            let query = try Query(queries.randomElement(using: &random)!)
            let sort = (0..<Int.random(in: 0...3, using: &random)).map { _ in
                SortKey(paths.randomElement(using: &random)!, Bool.random(using: &random) ? .ascending : .descending)
            }
            let limit = Bool.random(using: &random) ? Int.random(in: 0...60, using: &random) : nil
            let offset = Bool.random(using: &random) ? Int.random(in: 0...260, using: &random) : 0
            let got = try store.documents(in: "c", matching: query, sort: sort, limit: limit, offset: offset)
            let expected = Self.reference(docs, query, sort, limit, offset)
            #expect(
                got == expected,
                "seed \(seed) round \(round): \(query) sort \(sort) limit \(limit as Any) offset \(offset)")
            #expect(
                try store.documents(in: "c", matching: query, sort: sort, limit: limit, offset: offset) == got,
                "deterministic")
        }
    }

    /// An independent model of the documented order: filter in memory, sort by type rank then
    /// value, ties by the `_id` key's UTF-8 bytes, then drop `offset` and keep `limit`.
    static func reference(_ docs: [Value], _ query: Query, _ sort: [SortKey], _ limit: Int?, _ offset: Int) -> [Value] {
        func rank(_ v: Value?) -> Int {
            guard let v else { return 0 }
            switch v {
            case .null: return 1
            case .bool: return 2
            case .int, .double: return 3
            case .string: return 4
            case .array: return 5
            case .map: return 6
            case .bytes: return 7
            }
        }
        func less(_ x: Value?, _ y: Value?) -> Bool? {  // nil: tie
            if rank(x) != rank(y) { return rank(x) < rank(y) }
            guard let x, let y else { return nil }
            switch (x, y) {
            case (.bool(let p), .bool(let q)): return p == q ? nil : !p
            case (.string(let p), .string(let q)):
                return Array(p.utf8) == Array(q.utf8) ? nil : Array(p.utf8).lexicographicallyPrecedes(q.utf8)
            case (.bytes(let p), .bytes(let q)): return p == q ? nil : p.lexicographicallyPrecedes(q)
            case (.array(let p), .array(let q)):
                for (e, f) in zip(p, q) { if let r = less(e, f) { return r } }
                return p.count == q.count ? nil : p.count < q.count
            case (.map(let p), .map(let q)):
                let pk = p.keys.sorted { Array($0.utf8).lexicographicallyPrecedes($1.utf8) }
                let qk = q.keys.sorted { Array($0.utf8).lexicographicallyPrecedes($1.utf8) }
                for (k, l) in zip(pk, qk) {
                    if let r = less(.string(k), .string(l)) { return r }
                    if let r = less(p[k], q[l]) { return r }
                }
                return pk.count == qk.count ? nil : pk.count < qk.count
            default:
                switch Value.compare(x, y) {
                case .less?: return true
                case .greater?: return false
                default: return nil
                }
            }
        }
        let matching = docs.filter { (try? query.matches($0)) == true }
        let sorted = matching.sorted { d, e in
            for key in sort {
                if let r = less(d.value(at: key.path), e.value(at: key.path)) {
                    return key.direction == .ascending ? r : !r
                }
            }
            return Array(JSON.string(d["_id"]!).utf8).lexicographicallyPrecedes(JSON.string(e["_id"]!).utf8)
        }
        return Array(sorted.dropFirst(offset).prefix(limit ?? Int.max))
    }

    @Test func limitAndOffsetWithoutSortFollowTheIDOrder() throws {
        let store = try open()
        try store.upsert((0..<20).map { ["_id": .string(String(format: "d%02d", $0)), "n": .int(Int64($0))] }, in: "c")
        let pushed = try store.documents(in: "c", matching: try Query("n >= 5"), sort: [], limit: 3, offset: 2)
        #expect(pushed.map { $0["_id"]! } == ["d07", "d08", "d09"])
        // The same window when the query is evaluated in memory (field-to-field comparison).
        let inMemory = try store.documents(
            in: "c", matching: try Query("n >= n && n >= 5"), sort: [], limit: 3, offset: 2)
        #expect(inMemory == pushed)
        #expect(try store.queryPlan(in: "c", matching: try Query("n >= 5"), limit: 3).isEmpty == false)
        #expect(throws: StoreError.self) { try store.documents(in: "c", matching: .all, sort: [], limit: -1) }
        #expect(throws: StoreError.self) { try store.documents(in: "c", matching: .all, sort: [], offset: -1) }
        #expect(try store.documents(in: "c", matching: .all, sort: [], limit: 0).isEmpty)
        #expect(try store.documents(in: "c", matching: .all, sort: [], offset: 100).isEmpty)
        #expect(try store.count(in: "c", matching: try Query("n >= 5")) == 15)
        #expect(try store.count(in: "c", matching: try Query("n >= n && n < 5")) == 5)
    }

    // MARK: Indexes

    @Test func anIndexServesThePushedDownQuery() throws {
        let store = try open()
        let origins = ["USA", "Europe", "Japan"]
        try store.upsert(
            (0..<600).map {
                ["_id": .string("car\($0)"), "Origin": .string(origins[$0 % 3]), "Cylinders": .int(Int64(4 + $0 % 5))]
            },
            in: "cars")
        try store.upsert((0..<600).map { ["_id": .string("x\($0)"), "Origin": "Japan"] }, in: "other")
        let japan = try Query("Origin == 'Japan'")
        let before = try store.documents(in: "cars", matching: japan, sort: [])
        #expect(try store.queryPlan(in: "cars", matching: japan).joined().contains("USING INDEX idx_") == false)

        let name = try store.createIndex(path: .key("Origin"), in: "cars")
        #expect(name == "idx_" + DocumentStore.hex("cars") + "_" + DocumentStore.hex("$.Origin"))
        #expect(try store.createIndex(path: .key("Origin"), in: "cars") == name)  // idempotent
        let plan = try store.queryPlan(in: "cars", matching: japan)
        print("EXPLAIN QUERY PLAN for find(\"Origin == 'Japan'\"): \(plan)")
        #expect(plan.contains { $0.contains("USING INDEX \(name)") }, "\(plan)")
        #expect(try store.documents(in: "cars", matching: japan, sort: []) == before)
        #expect(before.count == 200)
        // With $args, more conditions, or a sort, the index still serves the filter.
        let args = try Query("Origin == $args.o")
        #expect(try store.queryPlan(in: "cars", matching: args, args: ["o": "Japan"]).joined().contains(name))
        let more = try Query("Origin == 'Japan' && Cylinders >= 6")
        #expect(try store.queryPlan(in: "cars", matching: more).joined().contains(name))
        #expect(
            try store.queryPlan(in: "cars", matching: japan, sort: [SortKey(.key("Cylinders"))]).joined().contains(name)
        )
        // The partial index belongs to one collection.
        #expect(try !store.queryPlan(in: "other", matching: japan).joined().contains(name))
        #expect(try store.documents(in: "other", matching: japan, sort: []).count == 600)

        // Ranges and IN lists stay correct with indexes (SQLite's planner decides whether to
        // seek the index; without statistics it scans the collection in _id order).
        try store.createIndex(path: .key("Cylinders"), in: "cars")
        #expect(try store.documents(in: "cars", matching: try Query("Cylinders > 7"), sort: []).count == 120)
        #expect(
            try store.documents(in: "cars", matching: try Query("Origin IN ['Japan', 'USA']"), sort: []).count == 400)
    }

    @Test func indexesOnNestedAndQuotedPathsAndRefusedPaths() throws {
        let store = try open()
        try store.upsert((0..<200).map { ["_id": .string("d\($0)"), "a": ["odd key": .int(Int64($0))]] }, in: "c")
        let path = FieldPath(components: [.key("a"), .key("odd key")])
        let name = try store.createIndex(path: path, in: "c")
        let query = try Query("a.`odd key` == 7")
        #expect(try store.queryPlan(in: "c", matching: query).joined().contains(name))
        #expect(try store.documents(in: "c", matching: query, sort: []).count == 1)
        // A collection name with a quote is escaped, not injected.
        let quoted = try store.createIndex(path: .key("x"), in: "it's")
        try store.upsert((0..<50).map { ["_id": .string("d\($0)"), "x": .int(Int64($0))] }, in: "it's")
        #expect(try store.queryPlan(in: "it's", matching: try Query("x == 3")).joined().contains(quoted))
        for bad in [
            FieldPath.key(""), .key("$bytes"), .key("quote\"d"), .key("back\\slash"), .key("tab\t"),
            FieldPath(components: [.index(0)]),
        ] {
            #expect(throws: StoreError.self, "\(bad.components)") { try store.createIndex(path: bad, in: "c") }
        }
        #expect(throws: StoreError.self) { try store.createIndex(path: .key("x"), in: "nul\u{0}") }
    }
}
