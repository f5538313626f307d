import Foundation
import Synchronization
import Testing
import TrellisCore
import TrellisStore
import TrellisTestKit

/// A batch of ``UpsertsPreparedAhead/minimumBatch`` documents or more is checked and encoded on a
/// second thread while the store writes (`UpsertsPreparedAhead`). It must store what smaller
/// batches store, return the same `_id`s in the same order, and, when a document is refused
/// anywhere in it, write nothing and throw the error the smaller path throws.
@Suite struct LargeBatchUpsertTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()

    /// `count` documents over several chunks: `_id`s of their own, some repeated later with other
    /// fields (a merge into a row the batch wrote), some without `_id` (the store draws one),
    /// map `_id`s, nested values and text that needs escapes.
    /// Upserts `documents`, which hold `refusal`, into `store` (holding `kept`, written here):
    /// the error is the one `refusal` alone gets, and nothing is written.
    static func expectRefusedAsAlone(_ refusal: Value, in documents: [Value], by store: DocumentStore) throws {
        try store.upsert(.map(["_id": .string("kept")]), in: "c")
        let before = store.lastSeq
        let expected = #expect(throws: StoreError.self) { try store.upsert([refusal], in: "c") }
        let error = #expect(throws: StoreError.self) { try store.upsert(documents, in: "c") }
        #expect(error.map { "\($0)" } == expected.map { "\($0)" })
        #expect(store.lastSeq == before)
        #expect(try store.document(id: .string("d3"), in: "c") == nil)
        #expect(try store.document(id: .string("kept"), in: "c") != nil)
    }

    static func documents(_ count: Int) -> [Value] {
        (0..<count).map { n -> Value in
            var fields: UTF8Map<Value> = [
                "n": .int(Int64(n)), "name": .string("car \"\(n)\"\n\u{e9}"),
                "tags": .array([.string("a"), .double(Double(n) / 4)]), "nested": .map(["k": .bool(n % 2 == 0)]),
            ]
            switch n % 13 {
            case 0: break  // no `_id`
            case 1: fields["_id"] = .map(["make": .string("m\(n % 5)"), "n": .int(Int64(n))])
            case 2: fields["_id"] = .string("d\(n / 2)")  // the `_id` of an earlier document, or a new one
            default: fields["_id"] = .string("d\(n)")
            }
            return .map(fields)
        }
    }

    func seeded(_ options: inout StoreOptions) {
        let random = Mutex(SeededRandom(seed: 7))
        options.random = { random.withLock { $0.next() } }
    }

    @Test func aLargeBatchStoresWhatSmallBatchesStore() throws {
        let documents = Self.documents(3 * UpsertsPreparedAhead.minimumBatch + 17)
        let large = try openStore(dir, "large.sqlite", clock: clock, seeded)
        let small = try openStore(dir, "small.sqlite", clock: clock, seeded)
        try large.upsert(.map(["_id": .string("d3"), "before": .int(1)]), in: "c")
        try small.upsert(.map(["_id": .string("d3"), "before": .int(1)]), in: "c")

        let ids = try large.upsert(documents, in: "c")
        let smallIDs = try PreparedAheadBreakTests.upsertInSmallBatches(documents, into: small)
        #expect(ids == smallIDs)
        #expect(ids.count == documents.count)
        #expect(large.lastSeq == small.lastSeq)
        for id in Set(ids.map { JSON.string($0) }) {
            let value = try JSON.parse(id)
            #expect(try large.document(id: value, in: "c") == small.document(id: value, in: "c"), "\(id)")
        }
        #expect(try large.document(id: .string("d3"), in: "c")?["before"] == .int(1))
    }

    /// A refused document (not a map, a bad `_id`, a value that cannot be stored) in the first
    /// chunk, in a later one or last: the same error as a small batch's, and nothing written.
    @Test(arguments: [5, UpsertsPreparedAhead.chunkSize * 3 + 1, 2_047])
    func aRefusedDocumentAnywhereLeavesNothingWritten(at position: Int) throws {
        let refusals: [Value] = [.int(3), .map(["_id": .string("")]), .map(["_id": .string("x"), "v": .double(.nan)])]
        for (k, refusal) in refusals.enumerated() {
            var documents = Self.documents(2_048)
            documents[position] = refusal
            let store = try openStore(dir, "refused-\(position)-\(k).sqlite", clock: clock)
            try Self.expectRefusedAsAlone(refusal, in: documents, by: store)
            // The store still writes afterwards.
            try store.upsert(Array(documents[0..<position]), in: "c")
            #expect(try store.document(id: .string("d3"), in: "c") != nil)
        }
    }

    /// A writer that stops early (a refusal, or any error) ends the preparing thread, also when it
    /// was waiting for room to hand over a chunk; one that reads to the end gets every document
    /// once, in order.
    @Test func thePreparingThreadEndsWhenTheWriterStopsOrFinishes() throws {
        let documents = Self.documents(10_000)
        let stopped = UpsertsPreparedAhead(documents)
        for _ in 0..<3 { #expect(stopped.next() != nil) }
        // Let it fill its chunks ahead and wait for room.
        Thread.sleep(forTimeInterval: 0.2)
        let stoppedEnded = stopped.preparingThreadEnded
        #expect(!stoppedEnded())
        stopped.stop()
        #expect(eventually { stoppedEnded() })

        let full = UpsertsPreparedAhead(documents)
        var count = 0
        while full.next() != nil { count += 1 }
        #expect(count == documents.count)
        #expect(full.next() == nil)
        let fullEnded = full.preparingThreadEnded
        #expect(eventually { fullEnded() })

        var ended: (@Sendable () -> Bool)?
        do {
            let dropped = UpsertsPreparedAhead(documents)
            _ = dropped.next()
            ended = dropped.preparingThreadEnded
        }
        #expect(eventually { ended?() == true })
    }
}
