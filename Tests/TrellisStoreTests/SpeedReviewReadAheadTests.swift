import Foundation
import Testing
import Trellis
import TrellisCore
import TrellisStore
import TrellisTestKit

/// Review of ef29c2a: the reading thread frees the chunks the caller finished. Many readers in a
/// row, of tiny, empty, erroneous and multi-chunk files, stopped at random places (closed,
/// dropped, or read to the end and then asked again): each yields what the plain reader yields,
/// and every reading thread ends.
@Suite struct SpeedReviewReadAheadTests {
    let dir = TemporaryDirectory("trellis-review-readahead")

    func write(_ name: String, _ text: String) throws -> String {
        let path = dir.path(name)
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
        return path
    }

    /// What `next` yields, at most `limit` results.
    static func transcript(_ next: () throws(FileError) -> Value?, limit: Int = .max) -> [String] {
        var out: [String] = []
        while out.count < limit {
            do {
                guard let document = try next() else {
                    out.append("end")
                    return out
                }
                out.append(JSON.string(document))
            } catch {
                out.append("error \(error)")
                if !error.recoverable { return out }
            }
        }
        return out
    }

    @Test func manyReadersStoppedAnywhereReadAlikeAndEnd() throws {
        var (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        print("SpeedReviewReadAheadTests seed \(seed) (replay with \(SeededRandom.environmentVariable)=\(seed))")
        let n = DocumentReadAhead.chunkSize
        let files = [
            try write("empty.jsonl", ""), try write("one.jsonl", "{\"_id\":\"a\"}\n"), try write("bad.jsonl", "x\n"),
            try write("open.json", "[{\"_id\":\"a\"},"),
            try write(
                "chunks.jsonl", (0..<(3 * n + 5)).map { $0 % 50 == 3 ? "oops\n" : "{\"_id\":\"d\($0)\"}\n" }.joined()),
            try write("exact.jsonl", (0..<(2 * n)).map { "{\"_id\":\"d\($0)\"}\n" }.joined()),
            try write("array.json", "[" + (0..<(4 * n)).map { "{\"_id\":\"d\($0)\"}" }.joined(separator: ",") + "]"),
        ]
        var expected: [String: [String]] = [:]
        for path in files {
            let reader = try DocumentFileReader(path: path)
            expected[path] = Self.transcript(reader.next)
        }
        var ended: [@Sendable () -> Bool] = []
        for round in 0..<60 {
            let path = files.randomElement(using: &rng)!
            let whole = expected[path]!
            let ahead = DocumentReadAhead(
                try DocumentFileReader(path: path), preparingUpserts: Bool.random(using: &rng))
            ended.append(ahead.readingThreadEnded)
            let stop = Int.random(in: 0...(whole.count + 2), using: &rng)
            let read = Self.transcript(ahead.next, limit: stop)
            #expect(read == Array(whole.prefix(stop)), "round \(round) \(path) stop \(stop) seed \(seed)")
            if read.count == whole.count {
                // Ended: it keeps answering as it ended.
                #expect(Self.transcript(ahead.next, limit: 1) == [whole.last!], "round \(round) seed \(seed)")
            }
            switch Int.random(in: 0..<3, using: &rng) {
            case 0: ahead.close()
            case 1:
                ahead.close()
                ahead.close()
            default: break  // dropped
            }
        }
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline, !ended.allSatisfy({ $0() }) { Thread.sleep(forTimeInterval: 0.01) }
        #expect(ended.filter { !$0() }.count == 0, "seed \(seed)")
    }

    /// A slow consumer and a fast one of a long file: the documents arrive whole and in order
    /// (a chunk freed by the reading thread is never one still being read).
    @Test func slowAndFastConsumersReadEveryDocument() throws {
        let n = DocumentReadAhead.chunkSize
        let path = try write("long.jsonl", (0..<(20 * n + 3)).map { "{\"_id\":\"d\($0)\",\"s\":\"\($0)\"}\n" }.joined())
        for slow in [false, true] {
            let ahead = DocumentReadAhead(try DocumentFileReader(path: path), preparingUpserts: true)
            var k = 0
            while let prepared = try ahead.nextPrepared() {
                _ = prepared
                if slow, k % n == n - 1 { Thread.sleep(forTimeInterval: 0.002) }
                k += 1
            }
            #expect(k == 20 * n + 3)
            #expect(ahead.count == k)
        }
        let ahead = DocumentReadAhead(try DocumentFileReader(path: path))
        var k = 0
        while let document = try ahead.next() {
            #expect(document == .map(["_id": .string("d\(k)"), "s": .string("\(k)")]))
            k += 1
        }
        #expect(k == 20 * n + 3)
    }
}
