import Foundation
import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// Attempts to break the pages of a reader found below the retained floor (`changes(...,
/// reapedAfter:)`, DocumentStore+ChangeLog.swift `addReapedTombstones`): reaped tombstones in
/// `seq` order among live rows, the cut of a page when `limit` of them fall in it, the byte
/// budget, keys reaped by the version before (sharing their collection's floor as `seq`). A
/// reviewer's scenarios; each says what it checks and whether it failed.
@Suite struct ReapedPageBreakTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()
    static let ttl: UInt64 = 7 * 86_400_000

    func open(_ name: String) throws -> DocumentStore { try openStore(dir, name, clock: clock) }

    /// Every page of a reader from 0 with `reapedAfter: checkpoint`, until exhausted.
    static func pages(
        _ store: DocumentStore, limit: Int, maxBytes: Int, query: Query = .all, checkpoint: Int64
    ) throws -> [ChangePage] {
        var after: Int64 = 0
        var pages: [ChangePage] = []
        for _ in 0..<2_000 {
            let page = try store.changes(
                in: "c", after: after, limit: limit, maxBytes: maxBytes, matching: query, reapedAfter: checkpoint)
            pages.append(page)
            #expect(page.scannedUpTo >= after)
            after = page.scannedUpTo
            if page.exhausted { return pages }
        }
        Issue.record("limit \(limit), maxBytes \(maxBytes): no exhausted page after 2,000 pages")
        return pages
    }

    /// 80 documents of different sizes; a reader takes them all (its checkpoint). Then, in four
    /// rounds: some are removed, new ones written, one removed document written again; the
    /// removes of each round are reaped before the next. Two removes after that are not reaped
    /// (their tombstone rows are in the log). For every limit and byte budget and two queries,
    /// the pages from 0 with `reapedAfter: checkpoint` carry, across all pages, every reaped
    /// tombstone after the checkpoint exactly once (not the one written again), the two live
    /// tombstone rows, records in strictly increasing `seq` order, and end.
    ///
    /// Passes.
    @Test func pagesOfAReaderBelowTheFloorCarryEachReapedTombstoneOnceWhateverTheLimitAndBudget() throws {
        let store = try open("a.sqlite")
        try store.upsert(
            (0..<80).map {
                ["_id": .string("d\($0)"), "v": .int(Int64($0)), "pad": .string(String(repeating: "p", count: $0))]
            },
            in: "c")
        let checkpoint = store.lastSeq
        var reaped: Set<String> = []
        var next = 80
        for round in 0..<4 {
            for i in stride(from: round, to: 80, by: 5 + round) where !reaped.contains("\"d\(i)\"") {
                try store.remove(id: .string("d\(i)"), in: "c")
                reaped.insert("\"d\(i)\"")
                try store.upsert(["_id": .string("d\(next)"), "v": .int(Int64(next))], in: "c")
                next += 1
            }
            clock.advance(by: Self.ttl + 1)
            _ = try store.reapOnceAcknowledged()
        }
        try store.upsert(["_id": "d5", "v": 500], in: "c")  // written again: its reaped key goes
        reaped.remove("\"d5\"")
        try store.remove(id: "d1", in: "c")
        try store.remove(id: "d2", in: "c")
        let unreaped: Set<String> = ["\"d1\"", "\"d2\""]
        reaped.subtract(unreaped)
        #expect(try store.changes(in: "c", after: checkpoint, limit: 10, maxBytes: .max).belowFloor)
        for query in [Query.all, try Query("v >= 40")] {
            for limit in [1, 2, 3, 7, 1_000] {
                for maxBytes in [1, 60, 400, Int.max] {
                    let pages = try Self.pages(
                        store, limit: limit, maxBytes: maxBytes, query: query, checkpoint: checkpoint)
                    let records = pages.flatMap(\.records)
                    let seqs = records.map(\.seq)
                    let label = "query \(query), limit \(limit), maxBytes \(maxBytes)"
                    #expect(seqs == seqs.sorted() && Set(seqs).count == seqs.count, "\(label): \(seqs)")
                    let removed = records.filter(\.isDeleted).map(\.key)
                    #expect(removed.count == Set(removed).count, "\(label): a tombstone twice")
                    #expect(Set(removed) == reaped.union(unreaped), "\(label)")
                    let keys = records.map(\.key)
                    #expect(keys.count == Set(keys).count, "\(label): a key twice")
                }
            }
        }
    }

    /// Keys reaped by the version before (state, no `seq`) take their collection's floor as
    /// `seq` when the store is opened: 30 of them share one `seq`. After the migration more
    /// tombstones are reaped (with their own `seq`), and live rows are written between. With a
    /// limit of 1 and 2 and a byte budget of 1, a reader below the floor from a checkpoint before
    /// them all gets each of the 30 + 5 tombstones exactly once, in `seq` order, and its pages
    /// end; a reader whose checkpoint is above the old floor gets only the 5.
    ///
    /// Passes.
    @Test func keysReapedByTheVersionBeforeShareOneSeqAndStillComeOnceWithALimitOfOne() throws {
        var legacy: Set<String> = []
        let before: Int64
        do {
            let old = try open("old.sqlite")
            try old.upsert((0..<40).map { ["_id": .string("d\($0)"), "v": .int(Int64($0))] }, in: "c")
            before = old.lastSeq
            for i in 0..<30 {
                try old.remove(id: .string("d\(i)"), in: "c")
                legacy.insert("\"d\(i)\"")
            }
            clock.advance(by: Self.ttl + 1)
            #expect(try old.reapOnceAcknowledged().reaped == 30)
            try keepReapedKeysAsAnEarlierVersion(old)
            old.close()
        }
        let store = try open("old.sqlite")
        let oldFloor = try store.retainedFloor(in: "c")
        var newer: Set<String> = []
        for i in 30..<35 {
            try store.upsert(["_id": .string("n\(i)"), "v": .int(Int64(i))], in: "c")
            try store.remove(id: .string("d\(i)"), in: "c")
            newer.insert("\"d\(i)\"")
        }
        clock.advance(by: Self.ttl + 1)
        #expect(try store.reapOnceAcknowledged().reaped == 5)
        for limit in [1, 2] {
            let pages = try Self.pages(store, limit: limit, maxBytes: 1, checkpoint: before)
            let removed = pages.flatMap(\.records).filter(\.isDeleted).map(\.key)
            #expect(removed.count == Set(removed).count, "limit \(limit): a tombstone twice: \(removed)")
            #expect(Set(removed) == legacy.union(newer), "limit \(limit)")
            let seqs = pages.flatMap(\.records).map(\.seq)
            #expect(seqs == seqs.sorted(), "limit \(limit)")
            let above = try Self.pages(store, limit: limit, maxBytes: 1, checkpoint: oldFloor)
            #expect(Set(above.flatMap(\.records).filter(\.isDeleted).map(\.key)) == newer, "limit \(limit)")
        }
    }
}
