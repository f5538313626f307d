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
        options.elapsed = clock.source
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
        let start = store.lastSeq
        try store.upsert(["_id": "d1", "a": 1, "b": 2], in: "c")
        clock.advance(by: 1)
        try store.upsert(["_id": "d1", "b": 3], in: "c")
        #expect(try store.document(id: "d1", in: "c") == ["_id": "d1", "a": 1, "b": 3])
        #expect(try store.remove(id: "d1", in: "c"))
        #expect(try !store.remove(id: "d1", in: "c"))
        #expect(try store.document(id: "d1", in: "c") == nil)
        let log = try store.changes(in: "c", after: 0, limit: 10, maxBytes: .max).records
        #expect(log.count == 1)  // the change log holds each document once, at its last seq
        #expect(log[0].isDeleted && log[0].seq == start + 3)
    }

    /// A batch that mixes new documents, a live one and a removed one: each new one is inserted,
    /// the others merged into their rows (whichever way the upsert looked for the row first).
    @Test func upsertBatchesMixingNewAndExistingDocumentsMergeIntoRows() throws {
        let store = try open()
        try store.upsert([["_id": "live", "a": 1], ["_id": "gone", "a": 1]], in: "c")
        try store.remove(id: "gone", in: "c")
        clock.advance(by: 1)
        let start = store.lastSeq
        try store.upsert(
            [["_id": "n1", "b": 1], ["_id": "live", "b": 2], ["_id": "n2", "b": 3], ["_id": "gone", "b": 4]], in: "c")
        #expect(try store.document(id: "live", in: "c") == ["_id": "live", "a": 1, "b": 2])
        #expect(try store.document(id: "gone", in: "c") == ["_id": "gone", "b": 4])
        #expect(try store.document(id: "n1", in: "c") == ["_id": "n1", "b": 1])
        #expect(try store.document(id: "n2", in: "c") == ["_id": "n2", "b": 3])
        let log = try store.changes(in: "c", after: start, limit: 10, maxBytes: .max).records
        #expect(log.map(\.id) == ["n1", "live", "n2", "gone"])
        #expect(log.map(\.seq) == Array((start + 1)...(start + 4)))
        try store.upsert(["_id": "n1", "c": 5], in: "c")
        #expect(try store.document(id: "n1", in: "c") == ["_id": "n1", "b": 1, "c": 5])
    }

    @Test func clockAndSeqSurviveRestart() throws {
        var stamp: HLCTimestamp
        var seq: Int64
        do {
            let store = try open()
            clock.set(5_000_000)
            try store.upsert(["_id": "d", "v": 1], in: "c")
            stamp = try #require(try store.state(id: "d", in: "c")?.stamp(at: .key("v"))?.time)
            seq = store.lastSeq
        }
        clock.set(5_000_000 - 30_000)  // the wall clock went back across the restart, within the drift
        let store = try open()
        try store.upsert(["_id": "d", "v": 2], in: "c")
        let after = try #require(try store.state(id: "d", in: "c")?.stamp(at: .key("v"))?.time)
        #expect(after > stamp)
        #expect(try store.document(id: "d", in: "c")?["v"] == 2)
        #expect(store.lastSeq == seq + 1)
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

    @Test func documentsAboveTheWarningSizeAreStoredWithAWarning() throws {
        let warnings = Mutex<[String]>([])
        var options = StoreOptions()
        options.warnDocumentBytes = 1000
        options.log = { message in warnings.withLock { $0.append(message) } }
        let store = try DocumentStore(path: dir.path("warn.sqlite"), options: options)
        try store.upsert(["_id": "small", "s": "x"], in: "c")
        #expect(warnings.withLock { $0.isEmpty })
        // 900 bytes of value plus its metadata cross the 1000-byte line: metadata counts.
        try store.upsert(["_id": "big", "s": .string(String(repeating: "x", count: 900))], in: "c")
        #expect(warnings.withLock { $0.count == 1 && $0[0].contains("\"big\"") && $0[0].contains("above 1000") })
        #expect(try store.count(in: "c") == 2)
    }

    @Test func mergeAppliesRemoteStatesWithTheCheckpointAndKeepsBadDocumentsAside() throws {
        let a = try open("a.sqlite")
        let b = try open("b.sqlite")
        try a.upsert([["_id": "1", "v": 1], ["_id": "2", "v": 2]], in: "c")
        let records = try a.changes(in: "c", after: 0, limit: 10, maxBytes: .max).records
        var docs = records.map { RemoteDocument(collection: $0.collection, id: $0.id, state: $0.state) }
        docs.insert(RemoteDocument(collection: "c", id: "bad", state: [0xFF, 0x00]), at: 1)
        docs.append(RemoteDocument(collection: "c", id: 5, state: docs[0].state))
        let peer: [UInt8] = [7, 7]
        let outcome = try b.merge(docs, from: peer, checkpoint: ("sub", Checkpoint(epoch: a.epoch, seq: 2)))
        #expect(outcome.applied == 2)
        // A state that does not decode is kept aside (deferred); only an `_id` that cannot be a key
        // is rejected.
        #expect(outcome.deferred.map(\.key) == ["\"bad\""])
        #expect(outcome.rejected.map(\.id) == ["5"])
        #expect(try b.documents(in: "c").count == 2)
        #expect(try b.checkpoint(peer: peer, subscription: "sub") == Checkpoint(epoch: a.epoch, seq: 2))
        // Merging the same states again changes nothing and writes no new log entries.
        let seqBefore = b.lastSeq
        let again = try b.merge(docs, from: peer, checkpoint: nil)
        #expect(again.applied == 0)
        #expect(b.lastSeq == seqBefore)
    }

    /// A local write during a long merge waits for a piece of the batch, not the whole batch:
    /// its `seq` falls between the batch's. The checkpoint still comes with the batch's end, and
    /// the batch merged again adds nothing.
    @Test func aLocalWriteDuringAMergeGoesBetweenItsPieces() throws {
        let a = try open("a.sqlite")
        let b = try open("b.sqlite")
        let count = 10_000
        try a.upsert((0..<count).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] }, in: "c")
        let records = try a.changes(in: "c", after: 0, limit: count, maxBytes: .max).records
        let docs = records.map { RemoteDocument(collection: $0.collection, id: $0.id, state: $0.state) }
        let peer: [UInt8] = [7, 7]
        let checkpoint = Checkpoint(epoch: a.epoch, seq: Int64(count))
        let merged = Mutex<Result<MergeOutcome, StoreError>?>(nil)
        let merging = Thread {
            let result = Result { () throws(StoreError) in
                try b.merge(docs, from: peer, checkpoint: ("sub", checkpoint))
            }
            merged.withLock { $0 = result }
        }
        merging.start()
        var local = 0
        while merged.withLock({ $0 == nil }) {
            try b.upsert(["_id": .string("local\(local)")], in: "local")
            local += 1
        }
        let outcome = try #require(merged.withLock { $0 }).get()
        #expect(outcome.applied == count)
        #expect(try b.checkpoint(peer: peer, subscription: "sub") == checkpoint)
        let batchSeqs = try b.changes(in: "c", after: 0, limit: count, maxBytes: .max).records.map(\.seq)
        let localSeqs = try b.changes(in: "local", after: 0, limit: local, maxBytes: .max).records.map(\.seq)
        #expect(batchSeqs.count == count && localSeqs.count == local)
        let (first, last) = (batchSeqs.min() ?? 0, batchSeqs.max() ?? 0)
        #expect(
            localSeqs.contains { $0 > first && $0 < last }, "local writes \(localSeqs.count), batch \(first)...\(last)")
        let lastSeq = b.lastSeq
        #expect(try b.merge(docs, from: peer, checkpoint: ("sub", checkpoint)).applied == 0)
        #expect(b.lastSeq == lastSeq)
    }

    @Test func queriesRunInSQLiteAndInMemoryAlike() throws {
        let store = try open()
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        print("queriesRunInSQLiteAndInMemoryAlike seed=\(seed) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        let values: [Value] = [1, 2, 2.5, -0.0, "2", "a", "é", true, false, nil, [1, 2], ["k": 1]]
        var docs: [Value] = []
        for n in 0..<300 {
            var m: UTF8Map<Value> = ["_id": .string("d\(n)")]
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
            let args: UTF8Map<Value> = ["x": 1]
            let fast = try store.documents(in: "c", matching: query, args: args)
            let slow = try store.documents(in: "c") { try query.matches($0, args: args) }
            #expect(fast == slow, "\(text), seed \(seed)")
            // The change log filters the same way (live documents only here).
            let page = try store.changes(in: "c", after: 0, limit: 1000, maxBytes: .max, matching: query, args: args)
            #expect(Set(page.records.map(\.id)) == Set(slow.compactMap { $0["_id"] }), "\(text), seed \(seed)")
        }
        #expect(throws: StoreError.self) { try store.documents(in: "c", matching: Query("a == $args.missing")) }
    }

    @Test func changePagesIncludeTombstonesAndAdvancePastFilteredEntries() throws {
        let store = try open()
        let start = store.lastSeq
        try store.upsert(
            [["_id": "1", "city": "Oslo"], ["_id": "2", "city": "Bergen"], ["_id": "3", "city": "Oslo"]], in: "c")
        try store.remove(id: "1", in: "c")
        let oslo = try Query("city == 'Oslo'")
        let page = try store.changes(in: "c", after: 0, limit: 2, maxBytes: .max, matching: oslo)
        // The log is 2 (Bergen), 3 (Oslo), 4 (the tombstone of 1, which moved to the end), after start.
        #expect(page.records.map(\.id) == ["3"])
        #expect(page.scannedUpTo == start + 3 && !page.exhausted)
        let rest = try store.changes(in: "c", after: page.scannedUpTo, limit: 2, maxBytes: .max, matching: oslo)
        #expect(rest.records.map(\.id) == ["1"] && rest.records[0].isDeleted)  // the tombstone
        #expect(rest.exhausted && rest.scannedUpTo == start + 4)
    }

    @Test func observersHearCommitsAfterTheyCommitInCommitOrderOffTheCommittingThread() throws {
        let store = try open()
        let heard = Mutex<[Set<UTF8Key>]>([])
        let committer = pthread_self()
        let offThread = Mutex(true)
        let token = store.addObserver { event in
            heard.withLock { $0.append(event.collections) }
            if pthread_equal(pthread_self(), committer) != 0 { offThread.withLock { $0 = false } }
        }
        try store.upsert(["_id": "x"], in: "one")
        try store.upsert([["_id": "y"], ["_id": "z"]], in: "two")
        store.waitForObservers()
        store.removeObserver(token)
        try store.upsert(["_id": "w"], in: "three")
        store.waitForObservers()
        #expect(heard.withLock { $0 } == [["one"], ["two"]])
        #expect(offThread.withLock { $0 })
    }
}

@Suite struct RoundTripTests {
    let dir = TemporaryDirectory()

    /// Random values survive store → change log → wire bytes → merge → store, bit for bit.
    @Test func randomDocumentsRoundTripThroughStoreAndWire() throws {
        let a = try DocumentStore(path: dir.path("a.sqlite"))
        let b = try DocumentStore(path: dir.path("b.sqlite"))
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        print("randomDocumentsRoundTripThroughStoreAndWire seed=\(seed) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        var written: [Value] = []
        for n in 0..<300 {
            var fields: UTF8Map<Value> = ["_id": .string("doc\(n)")]
            for k in 0..<Int.random(in: 0...6, using: &random) {
                let value = randomValue(depth: 3, using: &random)
                if (try? value.validate()) != nil { fields["f\(k)"] = value }
            }
            written.append(try a.upsert(.map(fields), in: "c") == fields["_id"] ? .map(fields) : .null)
        }
        let page = try a.changes(in: "c", after: 0, limit: 10_000, maxBytes: .max)
        let wire = WireMessage.batch(
            subscription: "s",
            documents: page.records.map { WireDocument(collection: "c", id: $0.id, state: $0.state) },
            upTo: page.scannedUpTo, generation: 0)
        guard case .batch(_, let docs, _, _, _) = try WireMessage(serialized: wire.serialized()) else {
            Issue.record("not a batch")
            return
        }
        let outcome = try b.merge(
            docs.map { RemoteDocument(collection: $0.collection, id: $0.id, state: $0.state) }, from: [1],
            checkpoint: nil)
        #expect(outcome.rejected.isEmpty && outcome.deferred.isEmpty, "seed \(seed)")
        for doc in written {
            let id = try #require(doc["_id"])
            let got = try a.document(id: id, in: "c")
            #expect(got == doc, "seed \(seed): \(String(describing: got)) vs \(doc)")
            #expect(try b.document(id: id, in: "c") == doc, "seed \(seed)")
        }
    }
}

@Suite struct ClockSkewTests {
    let dir = TemporaryDirectory()

    /// A peer whose clock runs far ahead cannot make local writes vanish: its document is deferred
    /// with a reason, and local writes keep working.
    @Test func documentsStampedFarInTheFutureAreDeferred() throws {
        let clock = ManualClock()
        var options = StoreOptions()
        options.now = clock.source
        options.elapsed = clock.source
        let local = try DocumentStore(path: dir.path("local.sqlite"), options: options)
        try local.upsert(["_id": "car1", "hp": 100], in: "c")
        var ahead = options
        let skewed = ManualClock(startingAt: clock.now + 2 * 86_400_000)  // two days ahead
        ahead.now = skewed.source
        let peer = try DocumentStore(path: dir.path("peer.sqlite"), options: ahead)
        try peer.upsert(["_id": "car1", "hp": 555], in: "c")
        let docs = try peer.changes(in: "c", after: 0, limit: 10, maxBytes: .max).records.map {
            RemoteDocument(collection: "c", id: $0.id, state: $0.state)
        }
        let outcome = try local.merge(docs, from: [1], checkpoint: nil)
        #expect(outcome.applied == 0 && outcome.rejected.isEmpty)
        #expect(outcome.deferred.count == 1 && outcome.deferred[0].reason.contains("ahead of this node's clock"))
        clock.advance(by: 1)
        try local.upsert(["_id": "car1", "hp": 200], in: "c")
        #expect(try local.document(id: "car1", in: "c")?["hp"] == 200)
        // Within the allowed drift the document merges (and wins by its later stamp).
        var slightly = options
        let near30s = ManualClock(startingAt: clock.now + 30_000)
        slightly.now = near30s.source
        let nearPeer = try DocumentStore(path: dir.path("near.sqlite"), options: slightly)
        try nearPeer.upsert(["_id": "car2", "hp": 7], in: "c")
        let near = try nearPeer.changes(in: "c", after: 0, limit: 10, maxBytes: .max).records.map {
            RemoteDocument(collection: "c", id: $0.id, state: $0.state)
        }
        #expect(try local.merge(near, from: [1], checkpoint: nil).applied == 1)
    }
}

@Suite struct NestingLimitTests {
    let dir = TemporaryDirectory()

    func nested(_ depth: Int, map: Bool) -> Value {
        var value: Value = 1
        for _ in 0..<depth { value = map ? ["x": value] : [value] }
        return value
    }

    /// What a node accepts, every peer can decode: deeper documents are refused at write time.
    @Test func documentsAtTheNestingLimitReplicateAndDeeperOnesAreRefused() throws {
        let a = try DocumentStore(path: dir.path("a.sqlite"))
        let b = try DocumentStore(path: dir.path("b.sqlite"))
        for map in [true, false] {
            let deepest = nested(Value.maximumDepth - 1, map: map)  // plus the document's own map
            try a.upsert(["_id": .string("ok-\(map)"), "v": deepest], in: "c")
            let error = #expect(throws: StoreError.self) {
                try a.upsert(["_id": "deep", "v": nested(Value.maximumDepth, map: map)], in: "c")
            }
            #expect(error?.description.contains("levels deep") == true)
        }
        let docs = try a.changes(in: "c", after: 0, limit: 10, maxBytes: .max).records.map {
            RemoteDocument(collection: "c", id: $0.id, state: $0.state)
        }
        let outcome = try b.merge(docs, from: [1], checkpoint: nil)
        #expect(outcome.rejected.isEmpty && outcome.deferred.isEmpty && outcome.applied == 2)
        #expect(try b.document(id: "ok-true", in: "c") == a.document(id: "ok-true", in: "c"))
        // And the writer can still change and remove them.
        try a.upsert(["_id": "ok-true", "y": 1], in: "c")
        #expect(try a.remove(id: "ok-false", in: "c"))
    }
}
