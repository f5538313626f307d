import Dispatch
import Foundation
import Synchronization
import Testing
import TrellisCore
import TrellisStore
import TrellisTestKit

@testable import Trellis

/// A reviewer's scenarios against `UpsertsPreparedAhead` (a batched upsert of 1,024 documents or
/// more checked and encoded on a thread of its own, `trellis.prepare`): each asserts what the
/// change promises, so a failing one is a finding. Serialized: several count the process's
/// `trellis.prepare` threads.
@Suite(.serialized) struct PreparedAheadBreakTests {
    let dir = TemporaryDirectory("trellis-ahead-break")
    let clock = ManualClock()

    static let large = 2 * UpsertsPreparedAhead.minimumBatch
    static let chunk = UpsertsPreparedAhead.chunkSize

    /// The threads of this process named `trellis.prepare` (`/proc/self/task/*/comm`).
    static func preparingThreads() -> Int { threadNames().count { $0 == "trellis.prepare" } }

    static func seeded(_ seed: UInt64) -> (inout StoreOptions) -> Void {
        { options in
            let random = Mutex(SeededRandom(seed: seed))
            options.random = { random.withLock { $0.next() } }
        }
    }

    /// `count` small documents `p<prefix>-<n>`.
    static func documents(_ count: Int, prefix: String = "d") -> [Value] {
        (0..<count).map { n in .map(["_id": .string("\(prefix)\(n)"), "n": .int(Int64(n)), "s": .string("v\(n)")]) }
    }

    /// A document above a 2,000-byte limit.
    static func tooLarge(_ id: String) -> Value {
        .map(["_id": .string(id), "blob": .string(String(repeating: "x", count: 5_000))])
    }

    /// Upserts in batches of 1,023 (the path before the change), one commit each.
    static func upsertInSmallBatches(_ documents: [Value], into store: DocumentStore) throws -> [Value] {
        var ids: [Value] = []
        var start = 0
        while start < documents.count {
            let end = min(documents.count, start + UpsertsPreparedAhead.minimumBatch - 1)
            ids += try store.upsert(Array(documents[start..<end]), in: "c")
            start = end
        }
        return ids
    }

    /// The counting helper sees the thread while it runs (so that the checks of zero mean something).
    @Test func theThreadCountSeesAPreparingThread() throws {
        let ahead = UpsertsPreparedAhead(Self.documents(20_000))
        _ = ahead.next()
        #expect(Self.preparingThreads() >= 1)
        let ended = ahead.preparingThreadEnded
        ahead.stop()
        #expect(eventually { ended() })
        #expect(eventually { Self.preparingThreads() == 0 })
    }

    /// A document above the size limit at a chunk's first or last place, at the batch's first or
    /// last: the error of the small path, nothing written, the store writes afterwards.
    @Test(arguments: [0, 255, 256, 1_023, 1_024, 2_047])
    func aSizeRefusalAtAChunkBoundaryWritesNothing(at position: Int) throws {
        let store = try openStore(dir, "size-\(position).sqlite", clock: clock) { $0.maxDocumentBytes = 2_000 }
        try store.upsert(.map(["_id": .string("kept")]), in: "c")
        let before = store.lastSeq
        var documents = Self.documents(Self.large)
        documents[position] = Self.tooLarge("big")
        let expected = #expect(throws: StoreError.self) { try store.upsert([Self.tooLarge("big")], in: "c") }
        let error = #expect(throws: StoreError.self) { try store.upsert(documents, in: "c") }
        #expect(error.map { "\($0)" } == expected.map { "\($0)" })
        #expect(store.lastSeq == before)
        #expect(try store.document(id: .string("d1"), in: "c") == nil)
        #expect(try store.document(id: .string("d2047"), in: "c") == nil)
        documents.remove(at: position)
        #expect(try store.upsert(documents, in: "c").count == Self.large - 1)
        #expect(store.lastSeq == before + Int64(Self.large - 1))
        #expect(eventually { Self.preparingThreads() == 0 })
    }

    /// The small path checks every document before it writes any, so a batch with a document too
    /// large (found while writing) before one that is not a map (found by the check) throws the
    /// check's error. A large batch must throw the same.
    @Test func aSizeRefusalBeforeACheckRefusalThrowsWhatTheSmallPathThrows() throws {
        let store = try openStore(dir, "order.sqlite", clock: clock) { $0.maxDocumentBytes = 2_000 }
        var small = Self.documents(1_000)
        small[5] = Self.tooLarge("big")
        small[900] = .int(3)
        let smallError = #expect(throws: StoreError.self) { try store.upsert(small, in: "c") }
        var large = Self.documents(Self.large)
        large[5] = Self.tooLarge("big")
        large[1_500] = .int(3)
        let largeError = #expect(throws: StoreError.self) { try store.upsert(large, in: "c") }
        #expect(smallError.map { "\($0)" } == "\(StoreError.notAMap(Value.int(3).typeName))")
        #expect(largeError.map { "\($0)" } == smallError.map { "\($0)" })
        #expect(try store.count(in: "c") == 0)
    }

    /// Documents without `_id` in a seeded store: the `_id`s drawn are those the small path draws,
    /// in order, and so are the ones drawn after the batch.
    @Test func generatedIDsComeInTheSmallPathsOrder() throws {
        let documents: [Value] = (0..<Self.large).map { n in .map(["n": .int(Int64(n))]) }
        let large = try openStore(dir, "gen-large.sqlite", clock: clock, Self.seeded(11))
        let small = try openStore(dir, "gen-small.sqlite", clock: clock, Self.seeded(11))
        let ids = try large.upsert(documents, in: "c")
        #expect(ids == (try Self.upsertInSmallBatches(documents, into: small)))
        #expect(Set(ids.map { JSON.string($0) }).count == ids.count)
        #expect(try large.upsert(.map(["after": .int(1)]), in: "c") == small.upsert(.map(["after": .int(1)]), in: "c"))
        for id in ids.prefix(50) + ids.suffix(50) {
            #expect(try large.document(id: id, in: "c") == small.document(id: id, in: "c"))
        }
    }

    /// A refused batch of documents without `_id`: the small path drew an `_id` for every document
    /// before it wrote any (and found the one too large); the `_id`s drawn after the refusal must
    /// be the ones a seeded store drew before the change.
    /// (1,000: the small path itself, the control.)
    @Test(arguments: [1_000, 2 * UpsertsPreparedAhead.minimumBatch])
    func generatedIDsAfterASizeRefusedBatchAreThoseDrawnBefore(count: Int) throws {
        var documents: [Value] = (0..<count).map { n in .map(["n": .int(Int64(n))]) }
        documents[100] = .map(["blob": .string(String(repeating: "x", count: 5_000))])
        let large = try openStore(dir, "genref-large-\(count).sqlite", clock: clock) {
            Self.seeded(12)(&$0)
            $0.maxDocumentBytes = 2_000
        }
        #expect(throws: StoreError.self) { try large.upsert(documents, in: "c") }
        let after = try large.upsert(.map(["after": .int(1)]), in: "c")
        // Before the change: one `_id` drawn per document of the refused batch, then this one.
        let reference = try openStore(dir, "genref-ref-\(count).sqlite", clock: clock, Self.seeded(12))
        _ = try Self.upsertInSmallBatches((0..<count).map { n in .map(["n": .int(Int64(n))]) }, into: reference)
        #expect(after == (try reference.upsert(.map(["after": .int(1)]), in: "c")))
    }

    /// The same `_id` on either side of every chunk boundary (and first and last): one row each,
    /// the later fields winning, the same documents and `_id`s as the small path.
    @Test func anIDRepeatedAcrossChunkBoundariesMergesAsTheSmallPathDoes() throws {
        var documents = Self.documents(Self.large + 5)
        for boundary in stride(from: Self.chunk, to: Self.large, by: Self.chunk) {
            documents[boundary - 1] = .map(["_id": .string("dup\(boundary)"), "a": .int(1), "side": .string("before")])
            documents[boundary] = .map(["_id": .string("dup\(boundary)"), "b": .int(2), "side": .string("after")])
        }
        documents[0] = .map(["_id": .string("ends"), "first": .bool(true)])
        documents[documents.count - 1] = .map(["_id": .string("ends"), "last": .bool(true)])
        let large = try openStore(dir, "dup-large.sqlite", clock: clock)
        let small = try openStore(dir, "dup-small.sqlite", clock: clock)
        let first = large.lastSeq
        let ids = try large.upsert(documents, in: "c")
        #expect(ids == (try Self.upsertInSmallBatches(documents, into: small)))
        for boundary in stride(from: Self.chunk, to: Self.large, by: Self.chunk) {
            let doc = try large.document(id: .string("dup\(boundary)"), in: "c")
            #expect(doc?["a"] == .int(1) && doc?["b"] == .int(2) && doc?["side"] == .string("after"))
            #expect(doc == (try small.document(id: .string("dup\(boundary)"), in: "c")))
        }
        let ends = try large.document(id: .string("ends"), in: "c")
        #expect(ends?["first"] == .bool(true) && ends?["last"] == .bool(true))
        #expect(large.lastSeq - first == Int64(documents.count))
    }

    /// The commit event of a large batch: one event, listing every key, with each document's
    /// final value, as the events of the small path's commits (chunks of 1,023) put together.
    @Test func aLargeBatchIsOneEventWithTheSmallPathsKeysAndValues() throws {
        var documents = Self.documents(Self.large + 100)
        for n in stride(from: 7, to: documents.count, by: 97) {
            documents[n] = .map(["_id": .string("d\(n / 3)"), "again": .int(Int64(n))])
        }
        for n in stride(from: 11, to: documents.count, by: 131) {
            documents[n] = .map(["_id": .map(["k": .int(Int64(n))]), "m": .string("é\n\"")])
        }
        let large = try openStore(dir, "ev-large.sqlite", clock: clock)
        let small = try openStore(dir, "ev-small.sqlite", clock: clock)
        let largeEvents = Mutex<[StoreEvent]>([])
        let smallEvents = Mutex<[StoreEvent]>([])
        let first = large.lastSeq
        large.addObserver { event in largeEvents.withLock { $0.append(event) } }
        small.addObserver { event in smallEvents.withLock { $0.append(event) } }
        try large.upsert(documents, in: "c")
        _ = try Self.upsertInSmallBatches(documents, into: small)
        large.waitForObservers()
        small.waitForObservers()
        let got = largeEvents.withLock { $0 }
        let old = smallEvents.withLock { $0 }
        #expect(got.count == 1)
        #expect(old.count == 3)
        guard let event = got.first else { return }
        let keys = old.reduce(into: Set<UTF8Key>()) { $0.formUnion($1.changedKeys[UTF8Key("c")] ?? []) }
        var values: [UTF8Key: String?] = [:]
        for e in old { values.merge(e.changedValues[UTF8Key("c")] ?? [:]) { _, later in later } }
        #expect(event.changedKeys[UTF8Key("c")] == keys)
        #expect(event.changedValues[UTF8Key("c")] == values)
        #expect(event.unlistedCollections.isEmpty)
        #expect(event.collections == [UTF8Key("c")])
        #expect(event.createdCollections == old.reduce(into: Set()) { $0.formUnion($1.createdCollections) })
        #expect(event.lastSeq == large.lastSeq)
        #expect(event.lastSeq - first == Int64(documents.count))
    }

    /// Several threads upsert large batches into one store at once, beside small upserts: every
    /// batch is whole, each returns its own `_id`s, and no preparing thread is left.
    @Test func concurrentLargeBatchesFromSeveralThreads() throws {
        let store = try openStore(dir, "concurrent.sqlite", clock: clock)
        let first = store.lastSeq
        let threads = 4
        let rounds = 3
        let failures = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: threads + 1) { t in
            do {
                if t == threads {
                    for n in 0..<300 { try store.upsert(.map(["_id": .string("small\(n)")]), in: "c") }
                    return
                }
                for round in 0..<rounds {
                    let documents = Self.documents(1_500 + 37 * t, prefix: "t\(t)r\(round)-")
                    let ids = try store.upsert(documents, in: "c")
                    if ids != documents.map({ $0["_id"]! }) { failures.withLock { $0.append("ids of \(t)/\(round)") } }
                }
            } catch {
                failures.withLock { $0.append("\(t): \(error)") }
            }
        }
        #expect(failures.withLock { $0 } == [])
        let total = 300 + (0..<threads).reduce(0) { $0 + rounds * (1_500 + 37 * $1) }
        #expect(store.lastSeq - first == Int64(total))
        #expect(try store.count(in: "c") == total)
        for t in 0..<threads {
            for round in 0..<rounds {
                let last = 1_500 + 37 * t - 1
                #expect(try store.document(id: .string("t\(t)r\(round)-\(last)"), in: "c")?["n"] == .int(Int64(last)))
            }
        }
        #expect(eventually { Self.preparingThreads() == 0 })
    }

    /// An observer that upserts a large batch into the same store (another collection, which in
    /// turn triggers one more) and into another store: no deadlock, every batch whole.
    @Test func anObserverUpsertsLargeBatchesIntoTheSameAndAnotherStore() throws {
        let store = try openStore(dir, "reentrant.sqlite", clock: clock)
        let other = try openStore(dir, "reentrant-other.sqlite", clock: clock)
        let first = store.lastSeq
        let failures = Mutex<[String]>([])
        store.addObserver { event in
            do {
                if event.collections.contains(UTF8Key("c")) {
                    try store.upsert(Self.documents(Self.large, prefix: "echo"), in: "echo")
                    try other.upsert(Self.documents(Self.large, prefix: "far"), in: "far")
                } else if event.collections.contains(UTF8Key("echo")) {
                    try store.upsert(Self.documents(Self.large, prefix: "echo2-"), in: "echo2")
                }
            } catch {
                failures.withLock { $0.append("\(error)") }
            }
        }
        try store.upsert(Self.documents(Self.large), in: "c")
        #expect(eventually { (try? store.count(in: "echo2")) == Self.large })
        store.waitForObservers()
        #expect(failures.withLock { $0 } == [])
        #expect(try store.count(in: "echo") == Self.large)
        #expect(try other.count(in: "far") == Self.large)
        #expect(store.lastSeq - first == Int64(3 * Self.large))
        #expect(eventually { Self.preparingThreads() == 0 })
    }

    /// A live query whose callback upserts a large batch into the collection it watches (once)
    /// and into another: both stored, and the query sees them.
    @Test func aLiveQueryCallbackUpsertsALargeBatch() throws {
        let node = try TrellisNode(directory: dir.url.appendingPathComponent("node"), meshKey: .generate())
        let documents = node.store.documents
        let cars = node.store.collection("cars")
        let seen = Mutex<[Int]>([])
        let done = Mutex(false)
        let live = try cars.find("n >= 0").observeLocal { results, _ in
            seen.withLock { $0.append(results.count) }
            guard results.count == Self.large, !done.withLock({ $0 }) else { return }
            done.withLock { $0 = true }
            _ = try? documents.upsert(Self.documents(Self.large, prefix: "more"), in: "cars")
            _ = try? documents.upsert(Self.documents(Self.large, prefix: "bike"), in: "bikes")
        }
        try documents.upsert(Self.documents(Self.large), in: "cars")
        #expect(eventually(timeout: 60) { seen.withLock { $0.last } == 2 * Self.large })
        #expect(try documents.count(in: "bikes") == Self.large)
        live.stop()
        node.close()
    }

    /// `upsertReportingWrites` with `.merge` takes the large path: every document written, the
    /// same `_id`s as `upsert`; other strategies stay as they were; a refusal writes nothing.
    @Test func upsertReportingWritesWithMergeAndOtherStrategies() throws {
        let store = try openStore(dir, "strategy.sqlite", clock: clock, Self.seeded(5))
        var documents = Self.documents(Self.large)
        documents[300] = .map(["generated": .bool(true)])
        let reported = try store.upsertReportingWrites(documents, in: "c", writeStrategy: .merge)
        #expect(reported.count == Self.large && reported.allSatisfy(\.written))
        #expect(reported[1].id == .string("d1") && reported[300].id != .null)
        #expect(try store.document(id: reported[300].id, in: "c")?["generated"] == .bool(true))
        let again = try store.upsertReportingWrites(documents, in: "c", writeStrategy: .insertIfAbsent)
        #expect(again.filter(\.written).count == 1)  // only the one without `_id`, a new UUID
        var refused = Self.documents(Self.large, prefix: "r")
        refused[1_800] = .map(["_id": .string("bad"), "v": .double(.infinity)])
        let before = store.lastSeq
        #expect(throws: StoreError.self) { try store.upsertReportingWrites(refused, in: "c", writeStrategy: .merge) }
        #expect(store.lastSeq == before)
        #expect(try store.document(id: .string("r0"), in: "c") == nil)
    }

    /// A read-only store refuses a large batch as it refuses a small one, and the preparing
    /// thread ends.
    @Test func aReadOnlyStoreRefusesALargeBatch() throws {
        do {
            let store = try openStore(dir, "ro.sqlite", clock: clock)
            try store.upsert(.map(["_id": .string("kept")]), in: "c")
            store.close()
        }
        let store = try openStore(dir, "ro.sqlite", clock: clock) { $0.readOnly = true }
        let expected = #expect(throws: StoreError.self) { try store.upsert(Self.documents(3), in: "c") }
        for _ in 0..<20 {
            let error = #expect(throws: StoreError.self) { try store.upsert(Self.documents(Self.large), in: "c") }
            #expect(error.map { "\($0)" } == expected.map { "\($0)" })
        }
        #expect(try store.count(in: "c") == 1)
        #expect(eventually { Self.preparingThreads() == 0 })
    }

    /// A closed store refuses a large batch with `.closed`; a store closed while large batches
    /// are under way either stores each whole or refuses it, and leaves no preparing thread.
    @Test func aStoreClosedBeforeOrDuringLargeBatches() throws {
        let closed = try openStore(dir, "closed.sqlite", clock: clock)
        closed.close()
        let error = #expect(throws: StoreError.self) { try closed.upsert(Self.documents(Self.large), in: "c") }
        #expect(error.map { "\($0)" } == "\(StoreError.closed)")

        let stored = Mutex(0)
        let errors = Mutex<Set<String>>([])
        do {
            let store = try openStore(dir, "closing.sqlite", clock: clock)
            let group = DispatchGroup()
            for t in 0..<2 {
                DispatchQueue.global().async(group: group) {
                    for round in 0..<10 {
                        do {
                            try store.upsert(Self.documents(Self.large, prefix: "t\(t)r\(round)-"), in: "c")
                            stored.withLock { $0 += 1 }
                        } catch {
                            errors.withLock { _ = $0.insert("\(error)") }
                            return
                        }
                    }
                }
            }
            Thread.sleep(forTimeInterval: 0.15)
            store.close()
            group.wait()
        }
        #expect(errors.withLock { $0 }.isSubset(of: ["\(StoreError.closed)"]))
        let reopened = try openStore(dir, "closing.sqlite", clock: clock)
        #expect(try reopened.count(in: "c") == stored.withLock { $0 } * Self.large)
        #expect(eventually { Self.preparingThreads() == 0 })
    }

    /// Many refused batches, the refusal anywhere (first, at a chunk boundary, last): no
    /// preparing thread is left running.
    @Test func manyRefusedBatchesLeaveNoPreparingThread() throws {
        let store = try openStore(dir, "many.sqlite", clock: clock) { $0.maxDocumentBytes = 2_000 }
        let documents = Self.documents(Self.large * 2)
        let positions = [0, 1, 255, 256, 1_023, 1_024, 2_048, 4_095]
        for round in 0..<64 {
            var batch = documents
            let position = positions[round % positions.count]
            batch[position] = round % 2 == 0 ? .string("no map") : Self.tooLarge("big\(round)")
            #expect(throws: StoreError.self) { try store.upsert(batch, in: "c") }
        }
        #expect(try store.count(in: "c") == 0)
        #expect(eventually { Self.preparingThreads() == 0 })
    }

    /// The resident memory of this process, in bytes (`/proc/self/statm`).
    static func residentBytes() -> Int {
        let statm = (try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8)) ?? ""
        let pages = statm.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
        return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
    }

    /// A slow writer: the preparing thread stays a few chunks ahead, so the JSON it encoded stays
    /// a few chunks' worth (here about 5 MiB), not the batch's (about 160 MiB).
    @Test func memoryStaysAFewChunksAheadOfASlowWriter() throws {
        let text = String(repeating: "m", count: 4_000)  // one storage, shared by every document
        let documents: [Value] = (0..<40_000).map { n in .map(["_id": .string("m\(n)"), "t": .string(text)]) }
        let before = Self.residentBytes()
        let ahead = UpsertsPreparedAhead(documents)
        for round in 0..<5 {
            for _ in 0..<(Self.chunk + 1) { _ = ahead.next() }
            Thread.sleep(forTimeInterval: 0.2)
            let grown = Self.residentBytes() - before
            #expect(grown < 48 << 20, "round \(round): \(grown >> 20) MiB more")
        }
        let ended = ahead.preparingThreadEnded
        ahead.stop()
        #expect(eventually { ended() })
    }

    /// Dropped without `stop()` or any `next()`, or after the last document: the thread ends.
    @Test func aDroppedPreparerEndsItsThread() throws {
        var ended: [@Sendable () -> Bool] = []
        for n in 0..<32 {
            let ahead = UpsertsPreparedAhead(Self.documents(n % 2 == 0 ? 50_000 : 1_024))
            if n % 4 == 1 { while ahead.next() != nil {} }
            ended.append(ahead.preparingThreadEnded)
        }
        #expect(eventually { ended.allSatisfy { $0() } })
        #expect(eventually { Self.preparingThreads() == 0 })
    }
}
