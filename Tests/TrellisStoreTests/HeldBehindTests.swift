import Dispatch
import Synchronization
import Testing
import TrellisCore
import TrellisStore
import TrellisTestKit

@testable import Trellis

/// A peer that sends an older state of a document this node holds newer gets the newer one
/// through the scans of its own subscriptions, without a new `seq` for the row that every
/// subscriber would read again (``DocumentStore/merge(_:from:checkpoint:heldBy:heldScans:unserved:)``).
@Suite struct HeldBehindTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()
    let low = SubscriptionSpec(collection: "items", query: "v < 5")

    /// This node's store holding d1 changed after the stale copy `stale` was taken.
    func stores(suffix: String = "") throws -> (store: DocumentStore, stale: [RemoteDocument]) {
        let store = try openStore(dir, "a\(suffix).sqlite", clock: clock)
        let source = try openStore(dir, "b\(suffix).sqlite", clock: clock)
        try source.upsert(["_id": "d1", "v": 1], in: "items")
        let stale = try batch(of: source, "items")
        _ = try store.merge(stale, from: [1], checkpoint: nil)
        _ = try store.update(
            id: "d1", in: "items", operations: [.set(try FieldPath(parsing: "v"), 2, isDefault: false)])
        return (store, stale)
    }

    func page(_ store: DocumentStore, after: Int64) throws -> [ChangeRecord] {
        try store.changes(
            in: "items", after: after, limit: 100, maxBytes: .max, matching: try Query(low.query), servedAs: low
        ).records
    }

    @Test func aRowTheHoldersScanHasNotReadKeepsItsSeqAndTheScanSendsIt() throws {
        let (store, stale) = try stores()
        let last = store.lastSeq
        let outcome = try store.merge(
            stale, from: [7], checkpoint: nil, heldBy: [low], heldScans: [low.key: HeldScan(since: 0, cursor: 0)])
        #expect(store.lastSeq == last)
        #expect(outcome.heldBehind == 1)
        let sent = try page(store, after: 0)
        #expect(sent.map(\.id) == ["d1"])
        #expect(sent[0].seq == last)  // the row as the update left it
    }

    @Test func aRowTheHoldersScanSentInThisSessionKeepsItsSeq() throws {
        let (store, stale) = try stores()
        let last = store.lastSeq
        let outcome = try store.merge(
            stale, from: [7], checkpoint: nil, heldBy: [low], heldScans: [low.key: HeldScan(since: 0, cursor: last)])
        #expect(store.lastSeq == last)
        #expect(outcome.heldBehind == 0)
    }

    /// Read before this session (at or below `since`), or never sent (a tombstone matches no
    /// query), or with no scan counted on: logged again.
    @Test func aRowTheHoldersScanMayNotHaveSentIsLoggedAgain() throws {
        var (store, stale) = try stores()
        var last = store.lastSeq
        _ = try store.merge(
            stale, from: [7], checkpoint: nil, heldBy: [low], heldScans: [low.key: HeldScan(since: last, cursor: last)])
        #expect(store.lastSeq == last + 1)
        last = store.lastSeq
        _ = try store.merge(stale, from: [7], checkpoint: nil, heldBy: [low])
        #expect(store.lastSeq == last + 1)
        (store, stale) = try (openStore(dir, "c.sqlite", clock: clock), stale)
        _ = try store.merge(stale, from: [1], checkpoint: nil)
        try store.remove(id: "d1", in: "items")
        last = store.lastSeq
        _ = try store.merge(
            stale, from: [7], checkpoint: nil, heldBy: [low], heldScans: [low.key: HeldScan(since: 0, cursor: last)])
        #expect(store.lastSeq == last + 1)
    }

    /// One holder's scan has yet to read the row, another read it in this session and did not
    /// send it (it does not match): the sender may cancel the first before its scan gets there,
    /// and the second would never read the row again. Logged again (the reviewer's
    /// `RelogReviewTests`).
    @Test func aRowOneHolderPassedWithoutSendingIsLoggedAgainWhateverTheOthers() throws {
        let (store, stale) = try stores()
        let other = SubscriptionSpec(collection: "items", query: "v > 100")
        let last = store.lastSeq
        let outcome = try store.merge(
            stale, from: [7], checkpoint: nil, heldBy: [low, other],
            heldScans: [low.key: HeldScan(since: 0, cursor: 0), other.key: HeldScan(since: 0, cursor: last)])
        #expect(store.lastSeq == last + 1)
        #expect(outcome.heldBehind == 0)
        // Both unread: kept, and left to their scans.
        let again = try stores(suffix: "2")
        let kept = try again.store.merge(
            again.stale, from: [7], checkpoint: nil, heldBy: [low, other],
            heldScans: [low.key: HeldScan(since: 0, cursor: 0), other.key: HeldScan(since: 0, cursor: 0)])
        #expect(kept.heldBehind == 1)
    }

    /// A row logged again for a peer keeps its value: its commit names it renumbered, and a
    /// live query reports nothing (before, every live query of the collection ran again and
    /// reported the document updated with the same value).
    @Test func aRowLoggedAgainIsNoLiveQueryUpdate() throws {
        let dir = TemporaryDirectory("trellis-held-behind")
        let node = try TrellisNode(directory: dir.url.appendingPathComponent("node"), meshKey: .generate())
        let items = node.store.collection("items")
        try items.upsert(["_id": "d1", "v": 1])
        let stale = try batch(of: node.store.documents, "items")
        try items.upsert(["_id": "d1", "v": 2])
        let events = Mutex<[LiveQueryEvent]>([])
        let live = try items.find("v < 5").observeLocal { _, event in events.withLock { $0.append(event) } }
        defer { live.stop() }
        node.store.flushLiveQueries()
        let renumbered = Mutex<[UTF8Key: Set<UTF8Key>]>([:])
        node.store.documents.addObserver { event in
            renumbered.withLock { $0.merge(event.renumberedKeys) { $0.union($1) } }
        }
        let last = node.store.documents.lastSeq
        _ = try node.store.documents.merge(stale, from: [7], checkpoint: nil, heldBy: [low])
        #expect(node.store.documents.lastSeq == last + 1)
        node.store.documents.waitForObservers()
        node.store.flushLiveQueries()
        #expect(renumbered.withLock { $0 } == [UTF8Key("items"): [UTF8Key(JSON.string("d1"))]])
        #expect(events.withLock { $0.count } == 1)  // the initial results only
        // A write after it is reported as before.
        try items.upsert(["_id": "d1", "v": 3])
        node.store.flushLiveQueries()
        #expect(events.withLock { $0.count } == 2)
    }
}
