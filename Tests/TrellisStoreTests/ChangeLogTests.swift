import Foundation
import Synchronization
import Testing
import TrellisCore
import TrellisStore
import TrellisTestKit

/// The change log as peers read it: pages cut by entries and bytes, records named by key,
/// checkpoints per peer.
@Suite struct ChangeLogTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()

    func open(_ name: String = "store.sqlite") throws -> DocumentStore { try openStore(dir, name, clock: clock) }

    @Test func pagesAreCutByBytesAndOneLargeDocumentAlwaysFits() throws {
        let store = try open()
        let big = String(repeating: "x", count: 10_000)
        try store.upsert(
            [
                ["_id": "a", "s": "small"], ["_id": "b", "s": .string(big)], ["_id": "c", "s": "small"],
                ["_id": "d", "s": "small"],
            ], in: "c")
        let all = try store.changes(in: "c", after: 0, limit: 100, maxBytes: .max)
        #expect(all.records.map(\.key) == ["\"a\"", "\"b\"", "\"c\"", "\"d\""] && all.exhausted)
        let seqs = all.records.map(\.seq)
        // A budget smaller than the large state: the page ends after the record that reaches it.
        let first = try store.changes(in: "c", after: 0, limit: 100, maxBytes: 5_000)
        #expect(first.records.map(\.id) == ["a", "b"])
        #expect(first.scannedUpTo == seqs[1] && !first.exhausted)
        // A budget of one byte still returns one record per page, so the log always advances.
        var cursor: Int64 = 0
        var pages: [[Value]] = []
        while true {
            let page = try store.changes(in: "c", after: cursor, limit: 100, maxBytes: 1)
            if !page.records.isEmpty { pages.append(page.records.map(\.id)) }
            cursor = page.scannedUpTo
            if page.exhausted { break }
        }
        #expect(pages == [["a"], ["b"], ["c"], ["d"]])
        // The records carry the whole state and the canonical key.
        let b = try #require(all.records.first { $0.id == "b" })
        #expect(b.key == (try DocumentStore.key(for: "b")) && b.collection == "c" && !b.isDeleted)
        #expect(try DocumentState(bytes: b.state).materialize(id: "b")?["s"] == .string(big))
    }

    @Test func checkpointsAreListedPerPeer() throws {
        let a = try open("a.sqlite")
        let b = try open("b.sqlite")
        try a.upsert(["_id": "1"], in: "c")
        _ = try b.merge(
            try batch(of: a), from: [1], checkpoint: (subscription: "s1", Checkpoint(epoch: a.epoch, seq: 5)))
        _ = try b.merge([], from: [1], checkpoint: (subscription: "s2", Checkpoint(epoch: a.epoch, seq: 7)))
        _ = try b.merge([], from: [2], checkpoint: (subscription: "s1", Checkpoint(epoch: [9], seq: 1)))
        #expect(
            try b.checkpoints(peer: [1]) == [
                "s1": Checkpoint(epoch: a.epoch, seq: 5), "s2": Checkpoint(epoch: a.epoch, seq: 7),
            ])
        #expect(try b.checkpoints(peer: [2]) == ["s1": Checkpoint(epoch: [9], seq: 1)])
        #expect(try b.checkpoints(peer: [3]).isEmpty)
    }

    @Test func rotatingTheLogGivesANewEpochAndSiteAndIsLogged() throws {
        let log = LogLines()
        let (epoch, site): ([UInt8], SiteID)
        do {
            let store = try openStore(dir, "rotate.sqlite", clock: clock, log: log)
            (epoch, site) = (store.epoch, store.siteID)
            try store.upsert(["_id": "d", "v": 1], in: "c")
            let before = store.lastSeq
            try store.rotateLog(reason: "asked in a test")
            #expect(store.epoch != epoch && store.epoch.count == 16 && store.siteID != site)
            #expect(log.lines.contains { $0.contains("asked in a test") })
            // Writes after the rotation carry the new site; seqs keep growing.
            clock.advance(by: 1)
            try store.upsert(["_id": "d", "v": 2], in: "c")
            #expect(store.lastSeq > before)
            #expect(try store.state(id: "d", in: "c")?.stamp(at: .key("v"))?.site == store.siteID)
        }
        let reopened = try openStore(dir, "rotate.sqlite", clock: clock)
        #expect(reopened.epoch != epoch && reopened.siteID != site)  // persisted
    }
}
