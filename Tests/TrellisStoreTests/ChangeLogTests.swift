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

    /// A checkpoint keeps what it says of its peer's reaped tombstones (``ReapedKeys``). Live
    /// documents merged from another peer make the collection's `notAsked` checkpoints `wanted`,
    /// in the merge's transaction; documents from the checkpoint's own peer, tombstones, and
    /// other collections change nothing (docs/DATA-MODEL.md "A subscriber from 0 that holds rows").
    @Test func liveDocumentsFromAnotherPeerMakeCheckpointsWantTheirPeersReapedTombstones() throws {
        let a = try open("a.sqlite")
        let b = try open("b.sqlite")
        let items = SubscriptionSpec(collection: "c").key
        let other = SubscriptionSpec(collection: "d").key
        for key in [items, other] {
            _ = try b.merge([], from: [1], checkpoint: (key, Checkpoint(epoch: [9], seq: 5, reapedKeys: .notAsked)))
        }
        _ = try b.merge([], from: [3], checkpoint: (items, Checkpoint(epoch: [9], seq: 5)))
        func reapedKeys(_ peer: UInt8, _ key: String = items) throws -> ReapedKeys? {
            try b.checkpoint(peer: [peer], subscription: key)?.reapedKeys
        }
        try a.upsert(["_id": "1"], in: "c")
        _ = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        #expect(try reapedKeys(1) == .notAsked, "the checkpoint's own peer")
        try a.upsert(["_id": "2"], in: "c")
        _ = try a.remove(id: "2", in: "c")
        _ = try b.merge(try batch(of: a).filter { $0.id == "2" }, from: [2], checkpoint: nil)
        #expect(try reapedKeys(1) == .notAsked, "a tombstone")
        try a.upsert(["_id": "3"], in: "c")
        _ = try b.merge(try batch(of: a).filter { $0.id == "3" }, from: [2], checkpoint: nil)
        #expect(try reapedKeys(1) == .wanted)
        #expect(try reapedKeys(1, other) == .notAsked, "another collection")
        #expect(try reapedKeys(3) == .received)
        #expect(try b.checkpoints(peer: [1])[UTF8Key(items)]?.reapedKeys == .wanted)
    }

    /// A local write that creates a document with an `_id` it gives (no row for it here) makes the collection's
    /// `notAsked` checkpoints `wanted`, whatever their peer, in the write's transaction, and its
    /// event names the collection (``StoreEvent/createdCollections``): a peer may have removed and
    /// reaped a document with that `_id`. Updates, removes and re-creations over a tombstone held
    /// here, and new documents whose `_id` the store makes, change nothing (docs/DATA-MODEL.md "A
    /// subscriber from 0 that holds rows").
    @Test func aLocalWriteThatCreatesADocumentMakesCheckpointsWantReapedTombstones() throws {
        let a = try open("a.sqlite")
        let b = try open("b.sqlite")
        let items = SubscriptionSpec(collection: "c").key
        let other = SubscriptionSpec(collection: "d").key
        func mark(_ peer: UInt8, _ key: String = items) throws {
            _ = try b.merge([], from: [peer], checkpoint: (key, Checkpoint(epoch: [9], seq: 5, reapedKeys: .notAsked)))
        }
        func reapedKeys(_ peer: UInt8, _ key: String = items) throws -> ReapedKeys? {
            try b.checkpoint(peer: [peer], subscription: key)?.reapedKeys
        }
        let created = Mutex<[Set<UTF8Key>]>([])
        let token = b.addObserver { event in created.withLock { $0.append(event.createdCollections) } }
        defer { b.removeObserver(token) }
        func events() -> [Set<UTF8Key>] {
            b.waitForObservers()
            return created.withLock { list in
                defer { list.removeAll() }
                return list
            }
        }
        // The documents came from peer 1: merged, not created here.
        try a.upsert([["_id": "held", "v": 1], ["_id": "gone", "v": 1]], in: "c")
        _ = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        _ = try b.remove(id: "gone", in: "c")
        #expect(events() == [[], []])
        for peer: UInt8 in [1, 2] { try mark(peer) }
        try mark(1, other)

        try b.upsert(["_id": "held", "v": 2], in: "c")
        _ = try b.update(id: "held", in: "c", operations: [.set(.key("v"), 3, isDefault: false)])
        _ = try b.remove(id: "held", in: "c")
        // Over their tombstones: the removes are known here.
        try b.upsert(["_id": "gone", "v": 2], in: "c")
        _ = try b.upsert([["_id": "held", "v": 4]], in: "c", writeStrategy: .insertIfAbsent)
        // With an `_id` the store makes: a new UUID, which no peer can have removed.
        try b.upsert(["v": 5], in: "c")
        _ = try b.upsert([["v": 6]], in: "c", writeStrategy: .insertIfAbsent)
        #expect(events() == [[], [], [], [], [], [], []])
        #expect(try reapedKeys(1) == .notAsked && reapedKeys(2) == .notAsked)

        // Refused at its second document, after the first was created: rolled back with the
        // write, and no event.
        let tooLarge = Value.string(String(repeating: "x", count: 6 * 1024 * 1024))
        #expect(throws: StoreError.self) { try b.upsert([["_id": "x"], ["_id": "y", "n": tooLarge]], in: "c") }
        #expect(try b.document(id: "x", in: "c") == nil)
        #expect(try reapedKeys(1) == .notAsked && reapedKeys(2) == .notAsked)

        try b.upsert(["_id": "new", "v": 1], in: "d")
        #expect(try reapedKeys(1, other) == .wanted, "its own collection's")
        #expect(try reapedKeys(1) == .notAsked, "another collection's")
        _ = try b.upsert([["_id": "n1"], ["_id": "n2"]], in: "c", writeStrategy: .insertIfAbsent)
        #expect(try reapedKeys(1) == .wanted && reapedKeys(2) == .wanted, "every peer's")
        #expect(events() == [["d"], ["c"]])
        try b.upsert(["_id": "n3", "v": 1], in: "c")
        #expect(events() == [["c"]], "named again: the sync engine checks")
        // A checkpoint stored `notAsked` after a creation (a batch of a request made before it,
        // which the sync engine had not heard of) is stored wanting them, and says so.
        let outcome = try b.merge(
            [], from: [3], checkpoint: (items, Checkpoint(epoch: [9], seq: 6, reapedKeys: .notAsked)))
        #expect(try reapedKeys(3) == .wanted && outcome.storedReapedKeys == .wanted)
        let received = try b.merge([], from: [3], checkpoint: (items, Checkpoint(epoch: [9], seq: 7)))
        #expect(try reapedKeys(3) == .received && received.storedReapedKeys == .received)
        #expect(try b.merge([], from: [3], checkpoint: nil).storedReapedKeys == nil)
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

/// Writes of this node that no peer has acknowledged (docs/DATA-MODEL.md rule 8): recorded per
/// row, kept by merges, and once a peer acknowledged the latest one an eviction drops its values;
/// until then the eviction keeps the whole state and offers it to peers.
@Suite struct UnacknowledgedWriteTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()

    func record(_ store: DocumentStore, _ id: Value) throws -> ChangeRecord {
        try #require(try store.changes(in: "c", after: 0, limit: 100, maxBytes: .max).records.first { $0.id == id })
    }

    func acknowledge(_ store: DocumentStore, _ record: ChangeRecord, seq: Int64? = nil) throws {
        try store.acknowledge([
            AcknowledgedEntry(
                collection: "c", key: record.key, seq: seq ?? record.seq, isEvictionStub: record.isEvictionStub)
        ])
    }

    /// Evicts `id`, says whether the stub dropped the values, and writes the document again.
    func evictionDropsValues(_ store: DocumentStore, _ id: Value) throws -> Bool {
        #expect(try store.evict(id: id, in: "c"))
        let dropped = try #require(try store.state(id: id, in: "c")).withheldEntryCount > 0
        try store.upsert(["_id": id, "again": true], in: "c")
        return dropped
    }

    @Test func aLocalWriteIsKeptByAnEvictionUntilAPeerAcknowledgesItsEntry() throws {
        let a = try openStore(dir, "a.sqlite", clock: clock)
        let b = try openStore(dir, "b.sqlite", clock: clock)
        try a.upsert([["_id": "d", "v": 1], ["_id": "e", "v": 1]], in: "c")
        let first = try record(a, "d")
        #expect(first.holdsUnacknowledgedWrite && !first.isEvictionStub)
        // An acknowledgement of an older entry of the document says nothing of this write.
        try acknowledge(a, first, seq: first.seq - 1)
        try acknowledge(a, try record(a, "e"))
        #expect(try !evictionDropsValues(a, "d"))
        #expect(try evictionDropsValues(a, "e"))
        // Written again: unacknowledged again. A merge from a peer keeps that, and the
        // acknowledgement of the entry that first carried the write is enough.
        let second = try record(a, "d")
        clock.advance(by: 5)
        try b.upsert(["_id": "d", "w": 3], in: "c")
        _ = try a.merge(try batch(of: b), from: [2], checkpoint: nil)
        let merged = try record(a, "d")
        #expect(merged.seq > second.seq && merged.holdsUnacknowledgedWrite)
        #expect(try !evictionDropsValues(a, "d"))
        let third = try record(a, "d")
        _ = try a.merge(try batch(of: b), from: [2], checkpoint: nil)
        try acknowledge(a, third)
        #expect(try evictionDropsValues(a, "d"))
        // Merged documents are never this node's writes.
        clock.advance(by: 5)
        try a.upsert(["_id": "f"], in: "c")
        _ = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        #expect(try !record(b, "f").holdsUnacknowledgedWrite)
        // Acknowledgements live in memory: after a restart, an eviction keeps the whole state.
        let g = try openStore(dir, "g.sqlite", clock: clock)
        try g.upsert(["_id": "g"], in: "c")
        try acknowledge(g, try record(g, "g"))
        g.close()
        let reopened = try openStore(dir, "g.sqlite", clock: clock)
        #expect(try !evictionDropsValues(reopened, "g"))
    }

    @Test func anEvictionKeepsTheValuesOfAnUnacknowledgedWrite() throws {
        let store = try openStore(dir, "store.sqlite", clock: clock)
        try store.upsert([["_id": "sent", "v": 1], ["_id": "unsent", "v": 1]], in: "c")
        try acknowledge(store, try record(store, "sent"))
        #expect(try store.evict(ids: ["sent", "unsent"], in: "c") == ["sent", "unsent"])
        #expect(try store.state(id: "sent", in: "c")?.withheldEntryCount == 1)
        let kept = try #require(try store.state(id: "unsent", in: "c"))
        #expect(kept.withheldEntryCount == 0 && kept.materialize(id: "unsent")?["v"] == 1)
        // Neither is shown; the one holding the unacknowledged write is still offered to peers
        // (whole, to a query that matches it), until one acknowledges it: then it is a stub
        // like the other.
        #expect(try store.count(in: "c") == 0)
        let offered = try store.changes(in: "c", after: 0, limit: 100, maxBytes: .max).records
        #expect(offered.map(\.id) == ["unsent"] && offered[0].holdsUnacknowledgedWrite && !offered[0].isDeleted)
        #expect(offered[0].isEvictionStub)
        #expect(try DocumentState(bytes: offered[0].state).materialize(id: "unsent")?["v"] == 1)
        let matching = try store.changes(in: "c", after: 0, limit: 100, maxBytes: .max, matching: Query("v == 1"))
        #expect(matching.records.map(\.id) == ["unsent"])
        #expect(
            try store.changes(in: "c", after: 0, limit: 100, maxBytes: .max, matching: Query("v == 2")).records.isEmpty)
        try acknowledge(store, offered[0])
        #expect(try store.state(id: "unsent", in: "c")?.withheldEntryCount == 1)
        #expect(try store.changes(in: "c", after: 0, limit: 100, maxBytes: .max).records.isEmpty)
        #expect(try store.count(in: "c") == 0)
    }
}
