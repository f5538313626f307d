import Foundation
import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// Leaves the reaped keys of `store` as earlier versions kept them: without the document's birth
/// (`age`), with `seq: false` without their tombstone's `seq` (and its index) either, and with
/// `state: false` without the tombstone's state either.
func keepReapedKeysAsAnEarlierVersion(_ store: DocumentStore, seq: Bool = false, state: Bool = true) throws {
    try store.withState { s in
        try s.db.execute(
            "ALTER TABLE reaped DROP COLUMN age"
                + (seq ? "" : "; DROP INDEX reaped_by_seq; ALTER TABLE reaped DROP COLUMN seq")
                + (state ? "" : "; ALTER TABLE reaped DROP COLUMN state"))
    }
}

/// Tombstones are reaped after their TTL (F04): the rows leave the log, the store remembers the
/// lowest `seq` it still answers for completely, and a stale copy of a reaped document is removed
/// again instead of coming back.
@Suite struct TombstoneReapingTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()
    static let ttl: UInt64 = 7 * 86_400_000

    func open(_ name: String, clock: ManualClock? = nil) throws -> DocumentStore {
        try openStore(dir, name, clock: clock ?? self.clock)
    }

    func rowCount(_ store: DocumentStore) throws -> Int {
        try store.changes(in: "c", after: 0, limit: 1_000_000, maxBytes: .max).records.count
    }

    /// What a subscription from 0 says it holds (`WireSubscription.holds`): every collection with
    /// a row, live, tombstone or stub; not one whose rows were all reaped.
    @Test func collectionsHoldingRowsCountTombstonesAndStubs() throws {
        let store = try open("held.sqlite")
        #expect(try store.collectionsHoldingRows() == [])
        try store.upsert(["_id": "a"], in: "live")
        try store.upsert(["_id": "b"], in: "gone")
        try store.remove(id: "b", in: "gone")
        try store.upsert(["_id": "c"], in: "evicted")
        #expect(try store.evict(id: "c", in: "evicted"))
        try store.upsert(["_id": "d"], in: "reaped")
        try store.remove(id: "d", in: "reaped")
        #expect(try store.collectionsHoldingRows() == ["evicted", "gone", "live", "reaped"])
        clock.advance(by: Self.ttl + 1)
        try store.upsert(["_id": "b2"], in: "gone")
        while try store.reapOnceAcknowledged(limit: 100).more {}
        #expect(try store.collectionsHoldingRows() == ["evicted", "gone", "live"])
    }

    /// A document written again after its tombstone was reaped is not a new document: its row
    /// keeps the birth the document had before it was removed (the reaped key remembers it), so a
    /// peer served the whole collection past that birth still counts as holding it, and its query
    /// subscriptions carry the change (`whole_held`). `trellis simulate --replay 4400026 --nodes
    /// 3-8 --steps 100 --queries 2 --ttl 120000 --widen` kept the peer's stale state while the row
    /// was born anew; 4400105 of the same sweep kept it while the row was born at the tombstone's
    /// `seq`, after the peer's whole-collection pages but before its query subscription.
    @Test func aDocumentWrittenAgainAfterItsTombstoneWasReapedIsNotBornAnew() throws {
        let store = try open("born.sqlite")
        try store.upsert(["_id": "d"], in: "c")
        let birth = store.lastSeq
        try store.upsert(["_id": "between"], in: "c")
        try store.upsert(["_id": "d", "v": 0], in: "c")
        try store.remove(id: "d", in: "c")
        #expect(store.lastSeq > birth + 1)
        try store.upsert(["_id": "other"], in: "c")
        clock.advance(by: Self.ttl + 1)
        while try store.reapOnceAcknowledged(limit: 100).more {}
        #expect(try store.reapedState(id: "d", in: "c") != nil)
        try store.upsert(["_id": "d", "v": 1], in: "c")
        let key = try DocumentStore.key(for: "d")
        let (seq, born) = try store.withState { s -> (Int64, Int64) in
            let st = try s.db.prepare("SELECT seq, seq - age FROM documents WHERE collection = 'c' AND id = ?")
            st.bind(1, key)
            defer { st.reset() }
            _ = try st.step()
            return (st.int64(0), st.int64(1))
        }
        #expect(seq == store.lastSeq)
        #expect(born == birth)
    }

    /// A key reaped by a version that kept no birth: the document written again counts as born
    /// before every `seq` (NULL `age`), so every peer served the whole collection counts as
    /// holding it. Sending it to one that never held it costs bytes; missing one that did would
    /// leave it a stale copy.
    @Test func aKeyReapedWithoutItsBirthIsWrittenAgainAsBornBeforeEverySeq() throws {
        let store = try open("unborn.sqlite")
        try store.upsert(["_id": "d"], in: "c")
        try store.remove(id: "d", in: "c")
        try store.upsert(["_id": "other"], in: "c")
        clock.advance(by: Self.ttl + 1)
        while try store.reapOnceAcknowledged(limit: 100).more {}
        try keepReapedKeysAsAnEarlierVersion(store, seq: true)
        store.close()
        let reopened = try open("unborn.sqlite")
        try reopened.upsert(["_id": "d", "v": 1], in: "c")
        let key = try DocumentStore.key(for: "d")
        let age = try reopened.withState { s -> Int64? in
            let st = try s.db.prepare("SELECT age FROM documents WHERE collection = 'c' AND id = ?")
            st.bind(1, key)
            defer { st.reset() }
            _ = try st.step()
            return st.isNull(0) ? nil : st.int64(0)
        }
        #expect(age == nil)
        #expect(try reopened.document(id: "d", in: "c") == ["_id": "d", "v": 1])
    }

    @Test func tombstonesAreReapedOnlyOnceOlderThanTheTTL() throws {
        let store = try open("a.sqlite")
        #expect(store.options.tombstoneTTL == Self.ttl)
        try store.upsert((0..<10).map { ["_id": .string("d\($0)"), "v": .int($0)] }, in: "c")
        for i in 0..<10 { try store.remove(id: .string("d\(i)"), in: "c") }
        try store.upsert(["_id": "live"], in: "c")
        let lastTombstone = store.lastSeq - 1
        clock.advance(by: Self.ttl - 1)
        #expect(try store.reapOnceAcknowledged() == ReapResult(reaped: 0, forgotten: 0, more: false))
        #expect(try rowCount(store) == 11)
        #expect(try store.retainedFloor(in: "c") == 0)
        clock.advance(by: 2)
        #expect(try store.reapOnceAcknowledged() == ReapResult(reaped: 10, forgotten: 0, more: false))
        #expect(try rowCount(store) == 1)
        #expect(try store.state(id: "d3", in: "c") == nil)
        #expect(try store.retainedFloor(in: "c") == lastTombstone)
        #expect(store.reapedKeyCount == 10)
        #expect(try store.document(id: "live", in: "c") == ["_id": "live"])
        // The seq of a reaped row is never issued again, also after reopening.
        let last = store.lastSeq
        store.close()
        let reopened = try open("a.sqlite")
        try reopened.upsert(["_id": "next"], in: "c")
        #expect(reopened.lastSeq > last)
        #expect(reopened.reapedKeyCount == 10)
    }

    /// A remove of this node that no peer has yet (seed 4500046 of `trellis simulate`): reaped,
    /// it would be lost, and the document would live on at every peer that held it. The reaper
    /// keeps its tombstone, however old, until a peer acknowledges a batch carrying it; the
    /// acknowledgement is written to the row, so it holds across a restart. A tombstone merged
    /// from a peer, which holds no write of this node, is reaped at its TTL.
    @Test func aRemoveNoPeerHasIsKeptUntilAPeerAcknowledgesIt() throws {
        let store = try open("kept.sqlite")
        let peer = try open("peer.sqlite")
        try store.upsert([["_id": "mine"], ["_id": "theirs"]], in: "c")
        _ = try peer.merge(try batch(of: store), from: [1], checkpoint: nil)
        try acknowledgeAll(store)
        // An acknowledgement of the document's earlier write does not cover the remove.
        let upserted = store.lastSeq
        try store.remove(id: "mine", in: "c")
        try peer.remove(id: "theirs", in: "c")
        _ = try store.merge(try batch(of: peer), from: [2], checkpoint: nil)
        try store.acknowledge([
            AcknowledgedEntry(
                collection: "c", key: try DocumentStore.key(for: "mine"), seq: upserted, isTombstone: true)
        ])
        clock.advance(by: 10 * Self.ttl)
        #expect(try store.reapExpiredTombstones() == ReapResult(reaped: 1, forgotten: 0, more: false))
        #expect(try store.reapedState(id: "theirs", in: "c") != nil)
        #expect(try store.state(id: "mine", in: "c")?.isDeleted == true)
        // Still kept after a restart, and reaped once a peer acknowledges the remove.
        store.close()
        let reopened = try open("kept.sqlite")
        #expect(try reopened.reapExpiredTombstones().reaped == 0)
        let removal = try #require(
            try reopened.changes(in: "c", after: 0, limit: 100, maxBytes: .max).records.first { $0.key == "\"mine\"" })
        #expect(removal.isDeleted && removal.holdsUnacknowledgedWrite)
        try reopened.acknowledge([
            AcknowledgedEntry(collection: "c", key: removal.key, seq: removal.seq, isTombstone: true)
        ])
        reopened.close()
        let acknowledged = try open("kept.sqlite")
        #expect(try acknowledged.reapExpiredTombstones().reaped == 1)
        #expect(try acknowledged.state(id: "mine", in: "c") == nil)
        #expect(try acknowledged.reapedState(id: "mine", in: "c") != nil)
    }

    /// F04, second half: a document whose keys are set and unset 20,000 times carries, once the
    /// TTL has passed and it is written again, only what its live fields need: the unset keys'
    /// remove contexts are reaped, and what the document shows does not change.
    @Test func unsetFieldsAreReapedAfterTheTTL() throws {
        let store = try open("a.sqlite")
        try store.upsert(["_id": "d", "keep": "yes"], in: "c")
        for chunk in stride(from: 0, to: 20_000, by: 2_000) {
            let keys = (chunk..<(chunk + 2_000)).map { FieldPath.key("k\($0)") }
            try store.update(id: "d", in: "c", operations: keys.map { .set($0, .int(1), isDefault: false) })
            try store.update(id: "d", in: "c", operations: keys.map { .unset($0) })
        }
        let grown = try #require(try store.state(id: "d", in: "c")).cbor().count
        #expect(grown > 100_000)  // one remove context per unset key
        clock.advance(by: Self.ttl - 1)
        try store.upsert(["_id": "d", "more": 1], in: "c")
        #expect(try #require(try store.state(id: "d", in: "c")).cbor().count > grown / 2)  // not yet
        clock.advance(by: 2)
        try store.upsert(["_id": "d", "more": 2], in: "c")
        let reaped = try #require(try store.state(id: "d", in: "c")).cbor().count
        #expect(reaped < 200, "\(reaped) bytes after the TTL, \(grown) before")
        #expect(try store.document(id: "d", in: "c") == ["_id": "d", "keep": "yes", "more": 2])
    }

    @Test func reapingRunsInBoundedTransactions() throws {
        let store = try open("a.sqlite")
        try store.upsert((0..<25).map { ["_id": .string("d\($0)")] }, in: "c")
        for i in 0..<25 { try store.remove(id: .string("d\(i)"), in: "c") }
        clock.advance(by: Self.ttl + 1)
        #expect(try store.reapOnceAcknowledged(limit: 10) == ReapResult(reaped: 10, forgotten: 0, more: true))
        #expect(try store.reapOnceAcknowledged(limit: 10) == ReapResult(reaped: 10, forgotten: 0, more: true))
        #expect(try store.reapOnceAcknowledged(limit: 10) == ReapResult(reaped: 5, forgotten: 0, more: false))
        #expect(try rowCount(store) == 0)
    }

    @Test func reapedKeysAreForgottenAfterTheirRetention() throws {
        let store = try openStore(dir, "a.sqlite", clock: clock) { $0.reapedKeyRetention = 1000 }
        try store.upsert(["_id": "d1"], in: "c")
        try store.remove(id: "d1", in: "c")
        clock.advance(by: Self.ttl + 1)
        #expect(try store.reapOnceAcknowledged().reaped == 1)
        clock.advance(by: 1000)
        #expect(try store.reapOnceAcknowledged() == ReapResult(reaped: 0, forgotten: 1, more: false))
        #expect(store.reapedKeyCount == 0)
    }

    /// A node that was away longer than the TTL still holds d1 live; the others removed it and
    /// reaped the tombstone. Its copy arriving is removed again (with a new stamp) rather than
    /// shown, and that new tombstone removes d1 from the stale node too.
    @Test func aStaleCopyOfAReapedDocumentIsRemovedAgainAndTheRemoveTravelsBack() throws {
        let fresh = try open("fresh.sqlite")
        let stale = try open("stale.sqlite")
        try fresh.upsert(["_id": "d1", "v": 1], in: "c")
        try fresh.upsert(["_id": "d2", "v": 2], in: "c")
        _ = try stale.merge(try batch(of: fresh), from: [1], checkpoint: nil)
        try fresh.remove(id: "d1", in: "c")
        clock.advance(by: Self.ttl + 1)
        #expect(try fresh.reapOnceAcknowledged().reaped == 1)
        #expect(try fresh.state(id: "d1", in: "c") == nil)
        let outcome = try stale.changes(in: "c", after: 0, limit: 100, maxBytes: .max).records.map {
            RemoteDocument(collection: $0.collection, id: $0.id, state: $0.state)
        }
        let merged = try fresh.merge(outcome, from: [2], checkpoint: nil)
        #expect(merged.revived == ["\"d1\""])
        #expect(try fresh.document(id: "d1", in: "c") == nil)
        #expect(try fresh.state(id: "d1", in: "c")?.isDeleted == true)
        #expect(try fresh.document(id: "d2", in: "c")?["v"] == 2)
        // The remove made again reaches the stale node.
        _ = try stale.merge(try batch(of: fresh), from: [1], checkpoint: nil)
        #expect(try stale.document(id: "d1", in: "c") == nil)
        #expect(try stale.document(id: "d2", in: "c")?["v"] == 2)
    }

    /// Add-wins survives reaping: a write the remover had not seen (newer than the remove) brings
    /// the document back, as it would have against the tombstone.
    @Test func aWriteNewerThanAReapedRemoveBringsTheDocumentBack() throws {
        let fresh = try open("fresh.sqlite")
        let away = try open("away.sqlite")
        try fresh.upsert(["_id": "d1", "v": 1], in: "c")
        _ = try away.merge(try batch(of: fresh), from: [1], checkpoint: nil)
        try fresh.remove(id: "d1", in: "c")
        clock.advance(by: Self.ttl + 1)
        _ = try fresh.reapOnceAcknowledged()
        try away.upsert(["_id": "d1", "v": 9], in: "c")  // written while away, after the remove
        let merged = try fresh.merge(try batch(of: away), from: [2], checkpoint: nil)
        #expect(merged.revived.isEmpty)
        #expect(try fresh.document(id: "d1", in: "c") == ["_id": "d1", "v": 9])
    }

    /// A reader whose cursor is below the floor is never answered a silent "no changes": the page
    /// says the cursor is below the floor. Paging from 0 through a log whose floor lies above the
    /// first pages ends (the floor is only a warning for a stored cursor), at the floor or beyond.
    @Test func aCursorBelowTheRetainedFloorIsReportedAndPagingFromZeroEnds() throws {
        let store = try open("a.sqlite")
        try store.upsert((0..<5).map { ["_id": .string("d\($0)")] }, in: "c")
        let checkpoint = store.lastSeq
        try store.remove(id: "d0", in: "c")
        clock.advance(by: Self.ttl + 1)
        _ = try store.reapOnceAcknowledged()
        let floor = try store.retainedFloor(in: "c")
        let stale = try store.changes(in: "c", after: checkpoint, limit: 100, maxBytes: .max)
        #expect(stale.belowFloor && stale.records.isEmpty)
        #expect(stale.exhausted && stale.scannedUpTo >= floor)
        var after: Int64 = 0
        var keys: [String] = []
        var pages = 0
        while true {
            let page = try store.changes(in: "c", after: after, limit: 2, maxBytes: .max)
            keys += page.records.map(\.key)
            after = page.scannedUpTo
            pages += 1
            if page.exhausted { break }
            #expect(pages < 10, "paging from 0 does not end")
            if pages >= 10 { break }
        }
        #expect(keys == ["\"d1\"", "\"d2\"", "\"d3\"", "\"d4\""])
        #expect(after >= floor)
        #expect(!(try store.changes(in: "c", after: after, limit: 100, maxBytes: .max).belowFloor))
    }

    /// A reader found below the floor with its cursor at `checkpoint` starts over from 0, and its
    /// pages (`reapedAfter: checkpoint`) carry the tombstones reaped after that cursor, as their
    /// reaped keys kept them, in `seq` order among the rows and whatever the query; not those it
    /// had already read. Merged into the reader, they remove what it still showed.
    @Test func aReaderBelowTheFloorIsSentTheTombstonesReapedAfterItsCursor() throws {
        let store = try open("a.sqlite")
        let reader = try open("reader.sqlite")
        try store.upsert((0..<8).map { ["_id": .string("d\($0)"), "v": .int($0)] }, in: "c")
        try store.remove(id: "d0", in: "c")  // the reader reads this remove
        _ = try reader.merge(try batch(of: store), from: [1], checkpoint: nil)
        let checkpoint = store.lastSeq
        for i in [5, 2, 6] { try store.remove(id: .string("d\(i)"), in: "c") }
        try store.upsert(["_id": "d9", "v": 9], in: "c")
        clock.advance(by: Self.ttl + 1)
        #expect(try store.reapOnceAcknowledged().reaped == 4)
        #expect(try store.changes(in: "c", after: checkpoint, limit: 100, maxBytes: .max).belowFloor)
        for limit in [1, 2, 3, 100] {
            var after: Int64 = 0
            var seqs: [Int64] = []
            var keys: [String] = []
            var removed: [String] = []
            for _ in 0..<40 {
                let page = try store.changes(
                    in: "c", after: after, limit: limit, maxBytes: .max, matching: try Query("v >= 7"),
                    reapedAfter: checkpoint)
                seqs += page.records.map(\.seq)
                keys += page.records.map(\.key)
                removed += page.records.filter(\.isDeleted).map(\.key)
                #expect(page.scannedUpTo >= after)
                after = page.scannedUpTo
                if page.exhausted { break }
            }
            #expect(seqs == seqs.sorted() && Set(seqs).count == seqs.count, "limit \(limit): \(seqs)")
            #expect(removed == ["\"d5\"", "\"d2\"", "\"d6\""], "limit \(limit)")
            #expect(keys == ["\"d7\"", "\"d5\"", "\"d2\"", "\"d6\"", "\"d9\""], "limit \(limit)")
        }
        // Without `reapedAfter` (a reader from 0 that never held anything) the page holds none.
        let fresh = try store.changes(in: "c", after: 0, limit: 100, maxBytes: .max)
        #expect(fresh.records.allSatisfy { !$0.isDeleted })
        // The reader merges the page and stops showing what was removed.
        let page = try store.changes(in: "c", after: 0, limit: 100, maxBytes: .max, reapedAfter: checkpoint)
        _ = try reader.merge(
            page.records.map { RemoteDocument(collection: $0.collection, id: $0.id, state: $0.state) }, from: [1],
            checkpoint: nil)
        let shown = try reader.documents(in: "c").compactMap { $0["_id"] }.map { JSON.string($0) }.sorted()
        #expect(shown == ["\"d1\"", "\"d3\"", "\"d4\"", "\"d7\"", "\"d9\""])
    }

    /// A store whose reaped keys were kept with their states but not their `seq` (the version
    /// before) gives them its collection's floor when opened: a reader below the floor is sent
    /// them whatever its cursor, never fewer than it missed.
    @Test func reapedKeysOfAStoreWithoutTheirSeqAreSentToEveryReaderBelowTheFloor() throws {
        do {
            let old = try open("old.sqlite")
            try old.upsert((0..<4).map { ["_id": .string("d\($0)")] }, in: "c")
            try old.remove(id: "d1", in: "c")
            try old.remove(id: "d3", in: "c")
            clock.advance(by: Self.ttl + 1)
            #expect(try old.reapOnceAcknowledged().reaped == 2)
            try keepReapedKeysAsAnEarlierVersion(old)
            old.close()
        }
        let store = try open("old.sqlite")
        let page = try store.changes(in: "c", after: 0, limit: 100, maxBytes: .max, reapedAfter: 5)
        #expect(page.records.filter(\.isDeleted).map(\.key) == ["\"d1\"", "\"d3\""])
        #expect(page.records.map(\.key) == ["\"d0\"", "\"d2\"", "\"d1\"", "\"d3\""])
    }

    /// Reaping tombstones of two collections named alike in another Unicode form ("é" U+00E9
    /// and "e" + U+0301, two collections) raises each one's floor to its own reaped tombstone:
    /// a reader of either below it is told so, and neither takes the other's. Both are listed
    /// among the collections holding rows, so a subscription from 0 in either says it holds rows.
    @Test func collectionsNamedAlikeKeepTheirOwnFloors() throws {
        let store = try open("spellings.sqlite")
        let (nfc, nfd) = ("\u{E9}", "e\u{301}")
        try store.upsert(["_id": "d1"], in: nfd)
        try store.upsert(["_id": "d1"], in: nfc)
        let before = store.lastSeq
        try store.remove(id: "d1", in: nfd)
        let nfdRemoved = store.lastSeq
        try store.upsert(["_id": "d2"], in: nfc)
        try store.remove(id: "d1", in: nfc)
        let nfcRemoved = store.lastSeq
        // Two collections holding rows, not one (a `Set<String>` kept one of the two names).
        #expect(try store.collectionsHoldingRows().map { Array($0.utf8) } == [nfd, nfc].map { Array($0.utf8) })
        clock.advance(by: Self.ttl + 1)
        _ = try store.reapOnceAcknowledged()
        #expect(try store.retainedFloor(in: nfd) == nfdRemoved)
        #expect(try store.retainedFloor(in: nfc) == nfcRemoved)
        #expect(try store.changes(in: nfd, after: before, limit: 100, maxBytes: .max).belowFloor)
        #expect(try store.changes(in: nfc, after: before, limit: 100, maxBytes: .max).belowFloor)
    }
}
