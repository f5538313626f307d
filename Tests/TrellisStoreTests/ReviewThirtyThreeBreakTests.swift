import Foundation
import Synchronization
import Testing
import TrellisCore
import TrellisTestKit

@testable import Trellis
@testable import TrellisStore

/// Attacks on ChunkPipeline, the read-ahead and prepared-ahead built on it, Thread.nameCurrent and
/// find's plain string `_id`s (review 33). Each test asserts what the change promises.
@Suite struct ReviewThirtyThreeBreakTests {
    let dir = TemporaryDirectory("trellis-r33")
    let clock = ManualClock()

    // MARK: ChunkPipeline

    /// Dropping the pipeline (deinit's stop) while the producer waits in `hand` ends the producer.
    @Test func deinitWhileTheProducerWaitsInHandEndsIt() {
        var ended: (@Sendable () -> Bool)?
        do {
            let pipeline = ChunkPipeline<Int>(threadName: "trellis.r33a", chunksAhead: 1) { producer in
                var n = 0
                while producer.hand([n, n + 1]) { n += 2 }
            }
            #expect(pipeline.next() == 0)
            Thread.sleep(forTimeInterval: 0.05)
            ended = pipeline.producerEnded
            #expect(ended?() == false)
        }
        #expect(eventually { ended?() == true })
    }

    /// Many pipelines made and dropped at once, some before any item, some mid-chunk, some
    /// drained: every producer thread ends and no thread of that name is left.
    @Test func manyPipelinesDroppedQuicklyLeaveNoThread() {
        var ended: [@Sendable () -> Bool] = []
        for k in 0..<300 {
            let pipeline = ChunkPipeline<Int>(threadName: "trellis.r33many", chunksAhead: 1 + k % 3) { producer in
                for c in 0..<(k % 5 == 0 ? 3 : 1_000) {
                    guard producer.hand(Array(repeating: c, count: 1 + k % 7)) else { return }
                }
            }
            ended.append(pipeline.producerEnded)
            switch k % 4 {
            case 0: break
            case 1: _ = pipeline.next()
            case 2: while pipeline.next() != nil {}
            default: pipeline.stop()
            }
        }
        #expect(eventually { ended.allSatisfy { $0() } })
        #expect(eventually { !threadNames().contains("trellis.r33many") })
    }

    /// A consumer that stops mid-chunk gets `nil` from then on, and the producer ends.
    @Test func stopMidChunkThenNextAnswersNil() {
        let pipeline = ChunkPipeline<Int>(threadName: "trellis.r33b", chunksAhead: 2) { producer in
            var n = 0
            while producer.hand(Array(n..<n + 10)) { n += 10 }
        }
        #expect(pipeline.next() == 0)
        #expect(pipeline.next() == 1)
        #expect(pipeline.next() == 2)
        pipeline.stop()
        for _ in 0..<5 { #expect(pipeline.next() == nil) }
        pipeline.stop()
        #expect(pipeline.next() == nil)
        let ended = pipeline.producerEnded
        #expect(eventually { ended() })
    }

    /// chunksAhead of 0 or below is 1: items still arrive in order; chunks handed are never more
    /// than the chunks taken plus `chunksAhead`.
    @Test(arguments: [-3, 0, 1, 2, 4])
    func theProducerNeverRunsFurtherAhead(chunksAhead: Int) {
        let handed = Atomic<Int>(0)
        let pipeline = ChunkPipeline<Int>(threadName: "trellis.r33c", chunksAhead: chunksAhead) { producer in
            for c in 0..<200 {
                guard producer.hand([2 * c, 2 * c + 1]) else { return }
                handed.add(1, ordering: .relaxed)
            }
        }
        var taken: [Int] = []
        var begun = 0
        while let item = pipeline.next() {
            if item % 2 == 0 {
                begun += 1
                // Taken chunks, the current one included; at most max(1, chunksAhead) wait.
                #expect(handed.load(ordering: .relaxed) <= begun + max(1, chunksAhead))
                if begun % 17 == 0 { Thread.sleep(forTimeInterval: 0.002) }
            }
            taken.append(item)
        }
        #expect(taken == Array(0..<400))
        #expect(pipeline.next() == nil)
    }

    /// An item that notes the thread it is freed on.
    final class Tracked: @unchecked Sendable {
        static let consumer = Mutex<pthread_t?>(nil)
        static let freedOnConsumer = Atomic<Int>(0)
        static let freed = Atomic<Int>(0)
        deinit {
            Self.freed.add(1, ordering: .relaxed)
            if let consumer = Self.consumer.withLock({ $0 }), pthread_equal(consumer, pthread_self()) != 0 {
                Self.freedOnConsumer.add(1, ordering: .relaxed)
            }
        }
    }

    /// Finished chunks are freed on the producer's thread: the consumer frees at most the chunks
    /// it finished after the producer's last hand-over (the ready ones and its current one).
    @Test func finishedChunksAreFreedOnTheProducersThread() {
        Tracked.consumer.withLock { $0 = pthread_self() }
        let chunks = 300
        let size = 20
        let ahead = 2
        do {
            let pipeline = ChunkPipeline<Tracked>(threadName: "trellis.r33d", chunksAhead: ahead) { producer in
                for _ in 0..<chunks {
                    guard producer.hand((0..<size).map { _ in Tracked() }) else { return }
                }
            }
            var count = 0
            while pipeline.next() != nil {
                count += 1
                if count % 50 == 0 { Thread.sleep(forTimeInterval: 0.001) }
            }
            #expect(count == chunks * size)
            let ended = pipeline.producerEnded
            #expect(eventually { ended() })
        }
        #expect(Tracked.freed.load(ordering: .relaxed) == chunks * size)
        let onConsumer = Tracked.freedOnConsumer.load(ordering: .relaxed)
        #expect(onConsumer <= (ahead + 1) * size, "\(onConsumer) of \(chunks * size) freed on the consumer's thread")
        Tracked.consumer.withLock { $0 = nil }
    }

    // MARK: DocumentReadAhead

    func write(_ name: String, _ text: String) throws -> String {
        let path = dir.url.appendingPathComponent(name).path
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    /// Closed at any point (before the first document, mid-chunk, after the end): `next()` and
    /// `nextPrepared()` answer `nil`, again and again, at once; the reading thread ends.
    @Test(arguments: [0, 5, 256, 600, 2_000, 2_001])
    func aClosedReadAheadAnswersNil(after taken: Int) throws {
        let path = try write("docs-\(taken).jsonl", (0..<2_000).map { "{\"_id\":\"d\($0)\"}\n" }.joined())
        let ahead = DocumentReadAhead(try DocumentFileReader(path: path), preparingUpserts: taken % 2 == 0)
        for k in 0..<taken {
            let document = try ahead.next()
            if k < 2_000 { #expect(document?["_id"] == .string("d\(k)")) } else { #expect(document == nil) }
        }
        ahead.close()
        for _ in 0..<3 {
            #expect(try ahead.next() == nil)
            #expect(try ahead.nextPrepared() == nil)
        }
        ahead.close()
        #expect(try ahead.next() == nil)
        let ended = ahead.readingThreadEnded
        #expect(eventually { ended() })
    }

    /// Closed after the reading ended with an error that is not recoverable: `close()` promises
    /// `next()` returns `nil` from then on.
    @Test func aReadAheadClosedAfterAFatalErrorAnswersNil() throws {
        let path = try write("open.json", "[{\"_id\":\"a\"},")
        let ahead = DocumentReadAhead(try DocumentFileReader(path: path))
        #expect(try ahead.next()?["_id"] == .string("a"))
        #expect(throws: FileError.self) { try ahead.next() }
        ahead.close()
        #expect(throws: Never.self) { try ahead.next() }
        #expect(throws: Never.self) { try ahead.nextPrepared() }
    }

    // MARK: Large batches refused

    /// A refused document at the first or last place of a chunk, first or last of the batch, in
    /// a batch of exactly 1,024 and one of 1,280: the small path's error, nothing written.
    @Test(arguments: [
        (1_024, 0), (1_024, 255), (1_024, 256), (1_024, 1_023), (1_280, 1_023), (1_280, 1_024), (1_280, 1_279),
    ])
    func aRefusedDocumentAtChunkEdgesLeavesNothingWritten(count: Int, position: Int) throws {
        let refusals: [Value] = [
            .string("x"), .map(["_id": .int(4)]), .map(["_id": .map([:])]),
            .map(["_id": .string("y"), "v": .double(.infinity)]),
        ]
        for (k, refusal) in refusals.enumerated() {
            var documents = LargeBatchUpsertTests.documents(count)
            documents[position] = refusal
            let store = try openStore(dir, "edge-\(count)-\(position)-\(k).sqlite", clock: clock)
            try LargeBatchUpsertTests.expectRefusedAsAlone(refusal, in: documents, by: store)
        }
    }

    /// A document too large early and a check refusal later: the small path meets the check
    /// refusal first (it checks every document before writing), so must the large path; with
    /// no check refusal the size error is the small path's too. The seeded `_id`s drawn after
    /// are the same.
    @Test(arguments: [0, 255, 256, 1_000])
    func aTooLargeDocumentThenARefusalThrowsTheRefusal(position: Int) throws {
        func seeded(_ options: inout StoreOptions) {
            let random = Mutex(SeededRandom(seed: 11))
            options.random = { random.withLock { $0.next() } }
            options.maxDocumentBytes = 2_000
        }
        var documents = LargeBatchUpsertTests.documents(1_100)
        documents[position] = .map(["_id": .string("big"), "blob": .string(String(repeating: "z", count: 5_000))])
        let large = try openStore(dir, "big-\(position).sqlite", clock: clock, seeded)
        let small = try openStore(dir, "big-small-\(position).sqlite", clock: clock, seeded)
        let smallError = #expect(throws: StoreError.self) { try small.upsert(Array(documents[0...position]), in: "c") }
        let largeError = #expect(throws: StoreError.self) { try large.upsert(documents, in: "c") }
        #expect(largeError.map { "\($0)" } == smallError.map { "\($0)" })
        #expect(large.lastSeq == small.lastSeq)
        // A check refusal after it wins.
        var refused = documents
        refused[1_099] = .int(1)
        let refusal = #expect(throws: StoreError.self) { try large.upsert(refused, in: "c") }
        let expected = #expect(throws: StoreError.self) { try small.upsert([.int(1)], in: "c") }
        #expect(refusal.map { "\($0)" } == expected.map { "\($0)" })
        #expect(try large.document(id: .string("d3"), in: "c") == nil)
    }

    // MARK: plainStringID and find

    /// Strings that stress the key: escapes, controls, DEL, non-ASCII, combining marks, BOM,
    /// noncharacters, line separators.
    static let edgeStrings: [String] = [
        "a", "\"", "\\", "\"\"", "a\"b", "\\\"", "\u{0}", "\u{1f}", "\u{7f}", "\u{80}", "\u{a0}", "\u{ad}",
        "\u{feff}", "\u{feff}x", "\u{fffe}", "\u{ffff}", "\u{10ffff}", "\u{2028}", "\u{2029}", "e\u{301}",
        "\u{301}", "\u{e9}", "😀", "👩‍👩‍👧", "/", "\\/", "\\u0041", " ", " x ", "\t", "null", "true", "1",
        "{}", "[]", "\"x\"", "é€😀\u{0}", String(repeating: "ab", count: 600),
    ]

    /// For every string `_id`, the fast path answers what the parser answers, byte for byte.
    @Test func plainStringIDMatchesTheParser() throws {
        var rng = SystemRandomNumberGenerator()
        var strings = Self.edgeStrings
        let alphabet: [Unicode.Scalar] = [
            "a", "\"", "\\", "\u{0}", "\u{1}", "\u{1f}", "\u{20}", "\u{7f}", "\u{80}", "\u{e9}", "\u{301}",
            "\u{2028}", "\u{feff}", "\u{fffd}", "\u{1f600}", "/", "u", "0",
        ]
        for _ in 0..<3_000 {
            var s = String.UnicodeScalarView()
            for _ in 0..<Int.random(in: 1...12, using: &rng) { s.append(alphabet.randomElement(using: &rng)!) }
            strings.append(String(s))
        }
        for s in strings {
            let key = JSON.string(.string(s))
            let parsed = try JSON.parse(key)
            let fast = Document.plainStringID(key)
            if let fast {
                #expect(fast == parsed, "\(key.debugDescription)")
                #expect(Array(fast.stringValue?.utf8 ?? "".utf8) == Array(s.utf8), "\(key.debugDescription)")
            }
            #expect((fast ?? parsed) == .string(s), "\(key.debugDescription)")
        }
        // Keys that are no string literal, or not canonical.
        for key in ["", "\"", "x\"", "\"x", "{\"a\":1}", "[\"a\"]", "\"a\" ", " \"a\"", "\"\\u0041\""] {
            if let fast = Document.plainStringID(key) {
                #expect((try? JSON.parse(key)) == fast, "\(key.debugDescription)")
            }
        }
    }

    /// `find(...).exec()` returns every document written, with the `_id` written (byte for byte)
    /// in the order asked, for string and map `_id`s of every kind.
    @Test func findReturnsTheIDsWrittenInOrder() throws {
        let node = try TrellisNode(directory: dir.url.appendingPathComponent("node"), meshKey: .generate())
        let cars = node.store.collection("cars")
        var ids: [Value] = Self.edgeStrings.filter { !$0.isEmpty }.map { .string($0) }
        ids += [
            .map(["k": .string("with \"quotes\"")]), .map(["é": .string("e\u{301}")]),
            .map(["a": .map(["b": .int(1)])]),
            .map(["n": .int(7), "s": .string("\u{0}")]),
        ]
        for (n, id) in ids.enumerated() {
            try cars.upsert(.map(["_id": id, "n": .int(Int64(n))]))
        }
        for descending in [false, true] {
            let found = try cars.findAll().sort("n", direction: descending ? .descending : .ascending).exec()
            let expected = descending ? Array(ids.reversed()) : ids
            #expect(found.count == expected.count)
            for (document, id) in zip(found, expected) {
                #expect(JSON.string(document.id) == JSON.string(id))
                #expect(document.value["_id"].map { JSON.string($0) } == JSON.string(id))
            }
        }
        let limited = try cars.findAll().sort("n", direction: .ascending).offset(3).limit(5).exec()
        #expect(limited.map { JSON.string($0.id) } == ids[3..<8].map { JSON.string($0) })
    }

    /// A map `_id` shaped like the parser's bytes form (`{"$bytes": "<base64>"}`), whose key the
    /// parser would read as `.bytes`, is refused at the write, so find never meets it.
    @Test func aMapIDShapedLikeBytesIsRefused() throws {
        let node = try TrellisNode(directory: dir.url.appendingPathComponent("bytes-node"), meshKey: .generate())
        let cars = node.store.collection("cars")
        let id: Value = .map(["$bytes": .string("AAAA")])
        #expect(throws: (any Error).self) { try cars.upsert(.map(["_id": id, "n": .int(1)])) }
        #expect(try cars.findAll().exec().isEmpty)
    }

    // MARK: Thread names

    /// The name the system shows for a new thread named `name`.
    func shownName(_ name: String) -> String {
        let shown = Mutex("?")
        let done = DispatchSemaphore(value: 0)
        Thread {
            Thread.nameCurrent(name)
            let text = currentThreadName()
            shown.withLock { $0 = text }
            done.signal()
        }.start()
        done.wait()
        return shown.withLock { $0 }
    }

    /// Names of exactly 15 bytes are kept whole; a scalar straddling byte 15 is left out whole.
    @Test func namesAreCutAtFifteenBytesOnAScalarBoundary() {
        let cases: [(String, String)] = [
            ("abcdefghijklmno", "abcdefghijklmno"),  // 15 ASCII bytes
            ("abcdefghijklmnop", "abcdefghijklmno"),
            ("abcdefghijklmé", "abcdefghijklmé"),  // 13 + 2 = 15
            ("abcdefghijklmné", "abcdefghijklmn"),  // 14 + 2 straddles
            ("abcdefghijklm€", "abcdefghijklm"),  // 13 + 3 straddles
            ("abcdefghijkl€", "abcdefghijkl€"),  // 12 + 3 = 15
            ("abcdefghijk😀", "abcdefghijk😀"),  // 11 + 4 = 15
            ("abcdefghijkl😀", "abcdefghijkl"),  // 12 + 4 straddles
            ("ééééééééé", "ééééééé"),
            ("😀😀😀😀", "😀😀😀"),
            ("abcdefghijklmne\u{301}", "abcdefghijklmne"),
        ]
        for (name, expected) in cases {
            let shown = shownName(name)
            #expect(shown == expected, "\(name)")
            #expect(shown.utf8.count <= 15)
        }
    }
}
