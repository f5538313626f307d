import Foundation
import Synchronization
import Testing
import TrellisCore
import TrellisStore
import TrellisTestKit

@Suite struct DocumentStoreTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()

    func open(_ name: String = "store.sqlite") throws -> DocumentStore {
        var options = StoreOptions()
        options.now = clock.source
        return try DocumentStore(path: dir.path(name), options: options)
    }

    @Test func upsertAndReadKeepTypes() throws {
        let store = try open()
        let doc: Value = [
            "_id": "car1", "int": .int(.max), "double": 1.0, "neg0": -0.0, "small": .double(.leastNonzeroMagnitude),
            "text": "e\u{301} ü 日本", "nested": ["a": [1, 2.5, nil, true]],
        ]
        #expect(try store.upsert(doc, in: "cars") == "car1")
        let read = try #require(try store.document(id: "car1", in: "cars"))
        #expect(read == doc)
        guard case .double(let z)? = read["neg0"] else {
            Issue.record("-0.0 lost its type")
            return
        }
        #expect(z.sign == .minus)
    }

    @Test func missingIDGetsAUUIDAndBadIDsAreRejected() throws {
        let store = try open()
        let id = try store.upsert(["x": 1], in: "c")
        #expect(UUID(uuidString: id.stringValue ?? "") != nil)
        #expect(throws: StoreError.invalidID("it must be a string or a map, not int")) {
            try store.upsert(["_id": 5], in: "c")
        }
        #expect(throws: StoreError.notAMap("array")) { try store.upsert(Value.array([1, 2]), in: "c") }
        #expect(throws: StoreError.self) { try store.upsert(["x": .double(.nan)], in: "c") }
        #expect(try store.count(in: "c") == 1)  // nothing partial was written
        let composite: Value = ["_id": ["vin": "A1", "plant": 3], "x": 1]
        try store.upsert(composite, in: "c")
        #expect(try store.document(id: ["plant": 3, "vin": "A1"], in: "c") == composite)
    }

    @Test func upsertMergesFieldsAndRemoveLeavesATombstone() throws {
        let store = try open()
        try store.upsert(["_id": "d1", "a": 1, "b": 2], in: "c")
        clock.advance(by: 1)
        try store.upsert(["_id": "d1", "b": 3], in: "c")
        #expect(try store.document(id: "d1", in: "c") == ["_id": "d1", "a": 1, "b": 3])
        #expect(try store.remove(id: "d1", in: "c"))
        #expect(try !store.remove(id: "d1", in: "c"))
        #expect(try store.document(id: "d1", in: "c") == nil)
        let log = try store.changes(in: "c", after: 0, limit: 10).records
        #expect(log.count == 1)  // the change log holds each document once, at its last seq
        #expect(log[0].isDeleted && log[0].seq == 3)
    }

    @Test func clockAndSeqSurviveRestart() throws {
        var stamp: HLCTimestamp
        do {
            let store = try open()
            clock.set(5_000_000)
            try store.upsert(["_id": "d", "v": 1], in: "c")
            stamp = try #require(try store.state(id: "d", in: "c")?.root.entries["v"]?.register?.stamp.time)
        }
        clock.set(1_000)  // the wall clock went back across the restart
        let store = try open()
        try store.upsert(["_id": "d", "v": 2], in: "c")
        let after = try #require(try store.state(id: "d", in: "c")?.root.entries["v"]?.register?.stamp.time)
        #expect(after > stamp)
        #expect(try store.document(id: "d", in: "c")?["v"] == 2)
        #expect(store.lastSeq == 2)
    }

    @Test func oversizedDocumentsAreRejectedWithAClearError() throws {
        var options = StoreOptions()
        options.maxDocumentBytes = 1000
        let store = try DocumentStore(path: dir.path("small.sqlite"), options: options)
        let error = #expect(throws: StoreError.self) {
            try store.upsert(["_id": "big", "s": .string(String(repeating: "x", count: 2000))], in: "c")
        }
        guard case .documentTooLarge(let id, let bytes, let limit)? = error else {
            Issue.record("expected documentTooLarge, got \(String(describing: error))")
            return
        }
        #expect(id == "\"big\"" && bytes > 2000 && limit == 1000)
        try store.upsert(["_id": "ok", "s": "small"], in: "c")
        #expect(try store.count(in: "c") == 1)
    }

    @Test func mergeAppliesRemoteStatesWithTheCheckpointAndSkipsBadDocuments() throws {
        let a = try open("a.sqlite")
        let b = try open("b.sqlite")
        try a.upsert([["_id": "1", "v": 1], ["_id": "2", "v": 2]], in: "c")
        let records = try a.changes(in: "c", after: 0, limit: 10).records
        var docs = records.map { RemoteDocument(collection: $0.collection, id: $0.id, state: $0.state) }
        docs.insert(RemoteDocument(collection: "c", id: "bad", state: [0xFF, 0x00]), at: 1)
        let peer: [UInt8] = [7, 7]
        let outcome = try b.merge(docs, from: peer, checkpoint: ("sub", Checkpoint(epoch: a.epoch, seq: 2)))
        #expect(outcome.applied == 2)
        #expect(outcome.rejected.count == 1)
        #expect(try b.documents(in: "c").count == 2)
        #expect(try b.checkpoint(peer: peer, subscription: "sub") == Checkpoint(epoch: a.epoch, seq: 2))
        // Merging the same states again changes nothing and writes no new log entries.
        let again = try b.merge(docs, from: peer, checkpoint: nil)
        #expect(again.applied == 0)
        #expect(b.lastSeq == 2)
        // Entries that came unchanged from the peer remember it (never echoed back).
        #expect(try b.changes(in: "c", after: 0, limit: 10).records.allSatisfy { $0.source == peer })
    }

    @Test func queriesRunInSQLiteAndInMemoryAlike() throws {
        let store = try open()
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        print("queriesRunInSQLiteAndInMemoryAlike seed=\(seed) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        let values: [Value] = [1, 2, 2.5, -0.0, "2", "a", "é", true, false, nil, [1, 2], ["k": 1]]
        var docs: [Value] = []
        for n in 0..<300 {
            var m: [String: Value] = ["_id": .string("d\(n)")]
            for key in ["a", "b", "c"] where Bool.random(using: &random) {
                m[key] = values.randomElement(using: &random)!
            }
            docs.append(.map(m))
        }
        try store.upsert(docs, in: "c")
        let queries = [
            "a == 2", "a == 2.0", "a != 2", "a < 'b'", "a >= 1 && b == true", "a == null", "a != null || c > 1",
            "!(a == 1)", "a IN [1, 'a', true]", "contains(a, 1)", "a == b", "a == $args.x", "b > $args.x",
        ]
        for text in queries {
            let query = try Query(text)
            let args: [String: Value] = ["x": 1]
            let fast = try store.documents(in: "c", matching: query, args: args)
            let slow = try store.documents(in: "c") { try query.matches($0, args: args) }
            #expect(fast == slow, "\(text), seed \(seed)")
            // The change log filters the same way (live documents only here).
            let page = try store.changes(in: "c", after: 0, limit: 1000, matching: query, args: args)
            #expect(Set(page.records.map(\.id)) == Set(slow.compactMap { $0["_id"] }), "\(text), seed \(seed)")
        }
        #expect(throws: StoreError.self) { try store.documents(in: "c", matching: Query("a == $args.missing")) }
    }

    @Test func changePagesIncludeTombstonesAndAdvancePastFilteredEntries() throws {
        let store = try open()
        try store.upsert(
            [["_id": "1", "city": "Oslo"], ["_id": "2", "city": "Bergen"], ["_id": "3", "city": "Oslo"]], in: "c")
        try store.remove(id: "1", in: "c")
        let oslo = try Query("city == 'Oslo'")
        let page = try store.changes(in: "c", after: 0, limit: 2, matching: oslo)
        // The log is 2 (Bergen), 3 (Oslo), 4 (the tombstone of 1, which moved to the end).
        #expect(page.records.map(\.id) == ["3"])
        #expect(page.scannedUpTo == 3 && !page.exhausted)
        let rest = try store.changes(in: "c", after: page.scannedUpTo, limit: 2, matching: oslo)
        #expect(rest.records.map(\.id) == ["1"] && rest.records[0].isDeleted)  // the tombstone
        #expect(rest.exhausted && rest.scannedUpTo == 4)
    }

    @Test func observersHearCommitsAfterTheyCommit() throws {
        let store = try open()
        let heard = Mutex<[Set<String>]>([])
        let token = store.addObserver { event in heard.withLock { $0.append(event.collections) } }
        try store.upsert(["_id": "x"], in: "one")
        try store.upsert([["_id": "y"], ["_id": "z"]], in: "two")
        store.removeObserver(token)
        try store.upsert(["_id": "w"], in: "three")
        #expect(heard.withLock { $0 } == [["one"], ["two"]])
    }
}
