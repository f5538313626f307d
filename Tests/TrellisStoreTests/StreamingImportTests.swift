import Foundation
import Synchronization
import Testing
import Trellis
import TrellisCore
import TrellisStore
import TrellisTestKit

/// `trellis import` streams a file into one transaction: the reader yields one document at a time
/// whatever the file's size, the upsert is all or nothing, and a commit too large to list its
/// keys still reaches live queries.
@Suite struct StreamingImportTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()

    func write(_ name: String, _ text: String) throws -> String {
        let path = dir.path(name)
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
        return path
    }

    func readAll(_ path: String) throws -> [Value] {
        let reader = try DocumentFileReader(path: path)
        var out: [Value] = []
        while let document = try reader.next() { out.append(document) }
        #expect(try reader.next() == nil)
        return out
    }

    /// What `next` yields until it ends: each document or error with the place and count after it.
    func transcript(
        _ next: () throws(FileError) -> Value?, _ where_: () -> (String, Int, Int)
    ) -> [String] {
        var out: [String] = []
        while true {
            do {
                let document = try next()
                out.append("\(document.map { JSON.string($0) } ?? "end") at \(where_())")
                if document == nil { return out }
            } catch {
                out.append("error \(error) at \(where_())")
                if !error.recoverable { return out }
            }
        }
    }

    /// Reading ahead on another thread yields what the reader yields, in order, with the same
    /// places and counts: documents over many chunks, bad records between them (recoverable), and
    /// the error that ends an array left open.
    @Test func readingAheadYieldsWhatTheReaderYields() throws {
        var lines = ""
        var array = "["
        for n in 0..<(DocumentReadAhead.chunkSize * 5 + 17) {
            let record = n % 97 == 5 ? "{\"_id\": oops}" : n % 101 == 7 ? "[1, 2]" : "{\"_id\":\"d\(n)\",\"n\":\(n)}"
            lines += record + "\n"
            array += (n == 0 ? "" : ",") + record
        }
        for path in [try write("many.jsonl", lines), try write("open.json", array)] {
            let reader = try DocumentFileReader(path: path)
            let expected = transcript(reader.next) { (reader.place, reader.bytesRead, reader.count) }
            let ahead = DocumentReadAhead(try DocumentFileReader(path: path))
            let read = transcript(ahead.next) { (ahead.place, ahead.bytesRead, ahead.count) }
            #expect(read == expected)
            #expect(expected.count > DocumentReadAhead.chunkSize * 5 && expected.contains { $0.hasPrefix("error") })
            // It keeps answering as it ended.
            #expect(transcript(ahead.next) { (ahead.place, ahead.bytesRead, ahead.count) } == [expected.last!])
        }
    }

    /// A caller that stops early (an import that failed) lets the reading thread go: dropping the
    /// read-ahead releases it, and nothing waits for ever.
    @Test func aReadAheadDroppedEarlyIsReleased() throws {
        let path = try write("long.jsonl", (0..<50_000).map { "{\"_id\":\"d\($0)\"}\n" }.joined())
        weak var dropped: DocumentReadAhead?
        do {
            let ahead = DocumentReadAhead(try DocumentFileReader(path: path))
            dropped = ahead
            #expect(try ahead.next() == ["_id": "d0"])
        }
        #expect(dropped == nil)
    }

    /// Reading ahead yields what the reader yields on `path`.
    func expectReadingAheadAlike(_ path: String) throws {
        let reader = try DocumentFileReader(path: path)
        let expected = transcript(reader.next) { (reader.place, reader.bytesRead, reader.count) }
        let ahead = DocumentReadAhead(try DocumentFileReader(path: path))
        #expect(transcript(ahead.next) { (ahead.place, ahead.bytesRead, ahead.count) } == expected, "\(path)")
    }

    @Test func readingAheadYieldsWhatTheReaderYieldsAtTheEdges() throws {
        for (name, text) in [
            ("empty.jsonl", ""), ("blank.jsonl", "\n \n\t\n"), ("bom.jsonl", "\u{FEFF}"),
            ("first-bad.jsonl", "oops\n{\"_id\":\"a\"}\n"), ("only-bad.jsonl", "oops"), ("empty.json", "[]"),
            ("open.json", "["), ("first-bad.json", "[1, {\"_id\":\"a\"}]"), ("trailing.json", "[{\"_id\":\"a\"}] x"),
            ("comma.json", "[{\"_id\":\"a\"},]"),
        ] {
            try expectReadingAheadAlike(try write(name, text))
        }
        let n = DocumentReadAhead.chunkSize
        try expectReadingAheadAlike(try write("chunk.jsonl", (0..<n).map { "{\"_id\":\"d\($0)\"}\n" }.joined()))
        try expectReadingAheadAlike(try write("chunk-1.jsonl", (0..<(n - 1)).map { "{\"_id\":\"d\($0)\"}\n" }.joined()))
        try expectReadingAheadAlike(try write("bad.jsonl", String(repeating: "bad\n", count: 2 * n)))
        // A line longer than a document may be, between two good ones.
        let huge = dir.path("huge.jsonl")
        var data = Data("{\"_id\":\"a\"}\n{\"s\":\"".utf8)
        data.append(Data(repeating: UInt8(ascii: "x"), count: DocumentFileReader.maxDocumentBytes + 10))
        data.append(Data("\"}\n{\"_id\":\"b\"}\n".utf8))
        try data.write(to: URL(fileURLWithPath: huge))
        try expectReadingAheadAlike(huge)
    }

    /// The offset of this process's descriptor open on `path` (from `/proc/self/fdinfo`).
    static func fileOffset(of path: String) -> Int? {
        let target = URL(fileURLWithPath: path).resolvingSymlinksInPath().path
        for fd in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? [] {
            guard (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(fd)")) == target,
                let info = try? String(contentsOfFile: "/proc/self/fdinfo/\(fd)", encoding: .utf8)
            else { continue }
            for line in info.split(separator: "\n") where line.hasPrefix("pos:") {
                return Int(line.dropFirst(4).trimmingCharacters(in: .whitespaces))
            }
        }
        return nil
    }

    /// `value` once it stopped changing for `window` seconds (within 60 s).
    static func settled(window: Double, _ value: () -> Int?) -> Int? {
        var last = value()
        var stableSince = Date()
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline, Date().timeIntervalSince(stableSince) <= window {
            Thread.sleep(forTimeInterval: 0.05)
            let now = value()
            if now != last { (last, stableSince) = (now, Date()) }
        }
        return last
    }

    /// Memory follows the bytes read ahead: chunks are cut at a mebibyte too, so large documents
    /// are not read a thousand ahead (64 MiB of 64 KiB lines before the cut by bytes).
    @Test func readingAheadIsBoundedInBytes() throws {
        let big = String(repeating: "x", count: 64 << 10)
        let path = try write("big.jsonl", (0..<1_100).map { "{\"_id\":\"d\($0)\",\"s\":\"\(big)\"}\n" }.joined())
        let ahead = DocumentReadAhead(try DocumentFileReader(path: path))
        _ = try ahead.next()
        let offset = Self.settled(window: 1) { Self.fileOffset(of: path) } ?? 0
        #expect(offset - ahead.bytesRead < 8 << 20)
        ahead.close()
    }

    /// `close()` stops the reading thread between documents (an import that failed half-way
    /// reads no further).
    @Test func closingStopsTheReadingAtOnce() throws {
        let big = String(repeating: "x", count: 128 << 10)
        let path = try write("big2.jsonl", (0..<600).map { "{\"_id\":\"d\($0)\",\"s\":\"\(big)\"}\n" }.joined())
        let ahead = DocumentReadAhead(try DocumentFileReader(path: path))
        _ = try ahead.next()
        ahead.close()
        let atClose = Self.fileOffset(of: path) ?? 0
        let last = Self.settled(window: 0.5) { Self.fileOffset(of: path) } ?? atClose
        #expect(last - atClose < 4 << 20)
        withExtendedLifetime(ahead) {}
    }

    /// Dropped wherever the caller stopped, no reading thread stays behind. Each reader's own
    /// thread is watched (`readingThreadEnded`): counting threads by name also counted those of
    /// tests running beside this one, which start and end reading threads of their own.
    @Test func noReadingThreadStaysBehind() throws {
        let path = try write("long.jsonl", (0..<5_000).map { "{\"_id\":\"d\($0)\"}\n" }.joined())
        var ended: [@Sendable () -> Bool] = []
        for taken in [0, 1, 255, 256, 257, 600, 4_999, 5_000, 5_001] {
            let ahead = DocumentReadAhead(try DocumentFileReader(path: path))
            for _ in 0..<taken { _ = try ahead.next() }
            ended.append(ahead.readingThreadEnded)
        }
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline, !ended.allSatisfy({ $0() }) { Thread.sleep(forTimeInterval: 0.01) }
        #expect(ended.filter { !$0() }.count == 0)
    }

    @Test func linesAndArraysReadTheSameDocuments() throws {
        let lines = try write(
            "l.jsonl", "\u{FEFF}{\"_id\":\"a\",\"v\":1}\r\n\n \t\n{\"_id\":\"b\",\"s\":\"x]},\\\"[\"}")
        let array = try write(
            "a.json", "\u{FEFF}\n [ {\"_id\":\"a\",\"v\":1} ,\n{\"_id\":\"b\",\"s\":\"x]},\\\"[\"} ]\n\n")
        let expected: [Value] = [["_id": "a", "v": 1], ["_id": "b", "s": "x]},\"["]]
        #expect(try readAll(lines) == expected)
        #expect(try readAll(array) == expected)
        #expect(try readAll(try write("e.json", " [ ] ")) == [])
        #expect(try readAll(try write("e.jsonl", "")) == [])
    }

    /// Documents larger than the 1 MiB read chunk, and boundaries falling anywhere inside them.
    @Test func documentsAcrossChunkBoundariesReadWhole() throws {
        let big = String(repeating: "ab\\\"[{,", count: 300_000)  // escapes and brackets in a string
        var lines = ""
        var array = "["
        var expected: [Value] = []
        for i in 0..<5 {
            let text =
                "{\"_id\":\"d\(i)\",\"pad\":\"\(String(repeating: "z", count: i * 100_003))\",\"big\":\"\(big)\"}"
            lines += text + "\n"
            array += (i == 0 ? "" : ",") + text
            expected.append(try JSON.parse(text))
        }
        array += "]"
        #expect(try readAll(try write("big.jsonl", lines)) == expected)
        #expect(try readAll(try write("big.json", array)) == expected)
    }

    @Test(arguments: [
        ("[{\"_id\":\"x\"},]", "a ',' after element 1 is not followed by a value"),
        ("[{\"_id\":\"x\"} {\"_id\":\"y\"}]", "bad element 1 (line 1): invalid JSON"),
        ("[{\"_id\":\"x\"}", "the array is not closed"),
        ("[1]", "bad element 1 (line 1) is int, not a JSON object"),
        ("[{\"_id\":\"x\"}] x", "unexpected 'x' after the array"),
        ("{\"_id\":\"a\"}\n\n{\"_id\":\"b\",}\n", "bad line 3: invalid JSON"),
        ("{\"_id\":\"a\"}\n[1]\n", "bad line 2: array, not a JSON object"),
        // Read as a double it would lose its last digits without a word: refused, and named.
        (
            "{\"_id\":\"t1\",\"tweet_id\":12345678901234567891}\n",
            "line 1: invalid JSON: the integer 12345678901234567891 is outside int64"
        ),
    ])
    func malformedFilesNameThePlace(text: String, message: String) throws {
        let path = try write("bad", text)
        do {
            _ = try readAll(path)
            Issue.record("\(text) was read")
        } catch let error as FileError {
            #expect(error.description.contains(message), "\(error)")
        }
    }

    /// A document that does not parse half-way through leaves nothing behind.
    @Test func aStreamingUpsertIsAllOrNothing() throws {
        let store = try openStore(dir, "s.sqlite", clock: clock)
        try store.upsert(["_id": "before", "v": 0], in: "c")
        let path = try write(
            "half.jsonl", (0..<100).map { "{\"_id\":\"d\($0)\",\"v\":\($0)}" }.joined(separator: "\n") + "\n{oops}\n")
        let reader = try DocumentFileReader(path: path)
        #expect(throws: FileError.self) { _ = try store.upsert(in: "c", streaming: { try reader.next() }) }
        #expect(try store.documents(in: "c").map { $0["_id"] } == ["before"])
        // A good file: every document, in one commit.
        let good = try DocumentFileReader(path: try write("good.jsonl", "{\"_id\":\"a\"}\n{\"v\":2}\n"))
        var reported: [Int] = []
        let count = try store.upsert(
            in: "c", streaming: { try good.next() }, progressInterval: 1, progress: { reported.append($0) })
        #expect(count == 2 && reported == [1, 2])
        #expect(try store.documents(in: "c").count == 3)
    }

    /// Documents checked and encoded on the reading thread (`trellis import`) are stored exactly as
    /// the store checks and encodes them itself: the same documents and stored JSON, new or
    /// merged into one already there, with or without an `_id` (drawn alike from the same
    /// random source), and the same refusals at the same places.
    @Test func documentsPreparedAheadAreStoredAsTheStoreWouldStoreThem() throws {
        var lines: [String] = []
        for n in 0..<(DocumentReadAhead.chunkSize * 2 + 9) {
            switch n % 11 {
            case 3: lines.append("{\"_id\": \"\", \"v\": \(n)}")  // an empty `_id`
            case 5: lines.append("{\"_id\": 5, \"v\": \(n)}")  // a bad `_id`
            case 7: lines.append("{\"v\": \(n), \"name\": \"no id \\u00e9\"}")  // drawn `_id`
            case 8: lines.append("{\"_id\": \"old\", \"w\": \(n)}")  // merged into a document already there
            case 9: lines.append("{\"_id\": {\"k\": \(n), \"a\": \"x\"}, \"zz\": [1, {\"b\": null}], \"aa\": 1.5}")
            default: lines.append("{\"v\": \(n), \"_id\": \"d\(n)\", \"t\": true}")
            }
        }
        let path = try write("mixed.jsonl", lines.joined(separator: "\n") + "\n")
        func imported(_ name: String, prepared: Bool) throws -> (stored: [String], refusals: [String], count: Int) {
            let draws = Atomic<UInt64>(0)
            let store = try openStore(dir, name, clock: clock) { options in
                options.random = { draws.add(1, ordering: .relaxed).newValue &* 0x9E37_79B9_7F4A_7C15 }
            }
            try store.upsert(["_id": "old", "v": -1], in: "c")
            let reader = DocumentReadAhead(try DocumentFileReader(path: path), preparingUpserts: prepared)
            var refusals: [String] = []
            let refused: (StoreError) throws -> Void = { refusals.append("\(reader.place): \($0)") }
            let count =
                prepared
                ? try store.upsert(in: "c", streamingPrepared: { try reader.nextPrepared() }, refused: refused)
                : try store.upsert(in: "c", streaming: { try reader.next() }, refused: refused)
            let stored = try store.storedDocuments(in: "c", matching: .all, sort: []).map { $0.json.text }
            return (stored, refusals, count)
        }
        let itself = try imported("itself.sqlite", prepared: false)
        let ahead = try imported("ahead.sqlite", prepared: true)
        #expect(ahead.count == itself.count && ahead.count > DocumentReadAhead.chunkSize)
        #expect(ahead.refusals == itself.refusals)
        #expect(
            itself.refusals.count == 2 * (lines.count / 11) + (lines.count % 11 > 5 ? 1 : 0)
                + (lines.count % 11 > 3 ? 1 : 0))
        #expect(ahead.stored == itself.stored)
        #expect(
            itself.stored.contains {
                $0.contains("\"w\":") && $0.contains("\"_id\":\"old\"") && $0.contains("\"v\":-1")
            })
    }

    /// A commit changing more documents than an event lists names the collection instead, and a
    /// live query on it still sees the result.
    @Test func aCommitTooLargeToListStillReachesLiveQueries() throws {
        let store = try openStore(dir, "big.sqlite", clock: clock)
        let events = Mutex<[StoreEvent]>([])
        store.addObserver { event in events.withLock { $0.append(event) } }
        var n = 0
        let total = DocumentStore.maxListedKeys + 5
        let count = try store.upsert(
            in: "c",
            streaming: {
                n += 1
                return n <= total ? ["_id": .string("d\(n)")] : nil
            })
        #expect(count == total)
        store.waitForObservers()
        let event = try #require(events.withLock { $0.last })
        #expect(event.unlistedCollections == ["c"] && event.collections == ["c"] && event.changedKeys.isEmpty)
    }
}
