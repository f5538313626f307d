import CSQLite
import Foundation
import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// The store checkpoints its write-ahead log in the background, so commits do not copy pages
/// back into the database file under the store's lock; the commit that finds the WAL past the
/// limit checkpoints itself, so the WAL stays bounded while writes never pause.
@Suite struct WALCheckpointTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()

    func walBytes(_ name: String) -> Int {
        ((try? FileManager.default.attributesOfItem(atPath: dir.path(name) + "-wal"))?[.size] as? Int) ?? 0
    }

    @Test func theWALIsCheckpointedInTheBackgroundAndStaysBounded() throws {
        do {
            let store = try openStore(dir, "w.sqlite", clock: clock) { $0.walCheckpointPages = (50, 400) }
            let checkpointer = try #require(store.checkpointer)
            let filler = String(repeating: "x", count: 900)
            var maxWAL = 0
            for round in 0..<60 {
                try store.upsert((0..<100).map { ["_id": .string("d\(round)-\($0)"), "f": .string(filler)] }, in: "c")
                maxWAL = max(maxWAL, walBytes("w.sqlite"))
            }
            // The background did copy pages: before, its connection had never opened the WAL, so
            // its checkpoints found none and did nothing, and the writer copied everything.
            #expect(checkpointer.backgroundRuns.load(ordering: .relaxed) > 0)
            // About 5.4 MB written; the WAL never held much more than the limit (400 pages of
            // 4 KiB) plus the pages of one commit.
            #expect(maxWAL < 600 * 4_096 + 32, "WAL reached \(maxWAL) bytes")
            // Once a checkpoint has caught up, the next commit rewinds the WAL and cuts the file
            // back to the size limit, so a burst does not leave its WAL size on disk.
            #expect(maxWAL > store.options.walSizeLimitBytes, "the writes did not grow the WAL past the limit")
            var small = 0
            #expect(
                try eventually {
                    small += 1
                    try store.upsert(["_id": .string("small-\(small)")], in: "c")
                    return walBytes("w.sqlite") <= store.options.walSizeLimitBytes
                }, "the WAL stayed at \(walBytes("w.sqlite")) bytes")
            store.close()
        }
        #expect(walBytes("w.sqlite") == 0, "the last connection's close checkpoints and removes the WAL")
        let reopened = try openStore(dir, "w.sqlite", clock: clock)
        #expect(try reopened.count(in: "c") >= 6_000)
        let integrity = try reopened.withState { s -> String in
            let check = try s.db.prepare("PRAGMA integrity_check")
            defer { check.reset() }
            return try check.step() ? (check.string(0) ?? "") : ""
        }
        #expect(integrity == "ok")
    }

    @Test func anInMemoryStoreHasNoCheckpointer() throws {
        let store = try DocumentStore(path: ":memory:")
        #expect(store.checkpointer == nil)
        try store.upsert(["_id": "a"], in: "c")
    }

    /// SQLite runs without its memory statistics, whose upkeep takes one process-wide mutex on
    /// every allocation of every connection (the writer, the readers, the checkpointer): after a
    /// store wrote, read and checkpointed, SQLite has counted no memory. (Every use of SQLite in
    /// this test process sets it up as the store does, so whichever starts it first, the setting
    /// holds.)
    @Test func sqliteKeepsNoProcessWideMemoryStatistics() throws {
        let store = try openStore(dir, "m.sqlite", clock: clock) { $0.walCheckpointPages = (50, 400) }
        for round in 0..<20 {
            try store.upsert((0..<100).map { ["_id": .string("d\(round)-\($0)"), "n": .int(Int64($0))] }, in: "c")
        }
        #expect(try store.documents(in: "c").count == 2_000)
        #expect(sqlite3_memory_used() == 0, "SQLite kept memory statistics: it was started before configureSQLite")
    }
}
