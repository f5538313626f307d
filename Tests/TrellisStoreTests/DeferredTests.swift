import Foundation
import Synchronization
import Testing
import TrellisCore
import TrellisStore
import TrellisTestKit

/// Remote documents that cannot be applied yet are kept, with the checkpoint, and applied once
/// the condition clears: nothing a checkpoint covers is lost (F21).
@Suite struct DeferredTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()
    static let day: UInt64 = 86_400_000

    func open(_ name: String, clock: ManualClock? = nil, _ configure: (inout StoreOptions) -> Void = { _ in }) throws
        -> DocumentStore
    {
        try openStore(dir, name, clock: clock ?? self.clock, configure)
    }

    @Test func aDocumentFromAClockFarAheadIsKeptWithTheCheckpointAndAppliedWhenTheClockCatchesUp() throws {
        let local = try open("local.sqlite")
        let aheadClock = ManualClock(startingAt: clock.now + Self.day)
        let peer = try open("peer.sqlite", clock: aheadClock)
        try peer.upsert(["_id": "d1", "v": 1], in: "c")
        let outcome = try local.merge(
            try batch(of: peer), from: [1], checkpoint: (subscription: "s", Checkpoint(epoch: peer.epoch, seq: 1)))
        #expect(outcome.applied == 0 && outcome.rejected.isEmpty)
        #expect(outcome.deferred.map(\.key) == ["\"d1\""])
        #expect(try local.checkpoint(peer: [1], subscription: "s") == Checkpoint(epoch: peer.epoch, seq: 1))
        #expect(try local.document(id: "d1", in: "c") == nil)
        let kept = try local.deferredDocuments()
        #expect(kept.count == 1)
        #expect(kept.first?.collection == "c" && kept.first?.key == "\"d1\"" && kept.first?.peer == [1])
        #expect(kept.first?.since == clock.now && kept.first?.attempts == 0)
        #expect(kept.first?.reason.contains("ahead of this node's clock") == true)
        // Nothing changes while the clock is still behind.
        clock.advance(by: Self.day / 2)
        #expect(try local.retryDeferred() == (applied: 0, remaining: 1))
        // Once it has caught up (within the allowed drift), the document is applied.
        clock.advance(by: Self.day / 2 - 30_000)
        #expect(try local.retryDeferred() == (applied: 1, remaining: 0))
        #expect(try local.document(id: "d1", in: "c") == ["_id": "d1", "v": 1])
        #expect(try local.deferredDocuments().isEmpty)
        // The clock moved past the merged stamp: a local write wins over it.
        try local.upsert(["_id": "d1", "v": 2], in: "c")
        #expect(try local.document(id: "d1", in: "c")?["v"] == 2)
    }

    /// The drift bound is measured from the HLC too: a node that has merged a fast writer's stamps
    /// accepts the writes of nodes that adopted that time, while a node that has not defers them.
    @Test func theDriftIsMeasuredFromTheLaterOfTheClockAndTheHLC() throws {
        let fast = ManualClock(startingAt: clock.now + 50_000)  // X: 50 s fast, within the bound
        let x = try open("x.sqlite", clock: fast)
        let a = try open("a.sqlite")  // A: right; adopts X's time by merging its document
        let slow = ManualClock(startingAt: clock.now - 15_000)  // C: 15 s slow
        let c = try open("c.sqlite", clock: slow)
        try x.upsert(["_id": "x1", "v": 1], in: "c")
        #expect(try a.merge(try batch(of: x), from: [1], checkpoint: nil).applied == 1)
        try a.upsert(["_id": "a1", "v": 1], in: "c")  // stamped with X's time (its HLC moved)
        // C sees a1 65 s ahead of its clock and of its HLC: deferred, not dropped.
        let first = try c.merge(
            try batch(of: a), from: [2], checkpoint: (subscription: "s", Checkpoint(epoch: a.epoch, seq: 9)))
        #expect(first.applied == 0 && first.deferred.count == 2)
        // Another peer's document 45 s ahead is accepted and moves C's HLC; now a1 and x1 are
        // within the bound of C's HLC and the retry applies them, though C's wall clock is as slow.
        let near = try open("near.sqlite", clock: ManualClock(startingAt: slow.now + 45_000))
        try near.upsert(["_id": "n1"], in: "c")
        #expect(try c.merge(try batch(of: near), from: [3], checkpoint: nil).applied == 1)
        #expect(try c.retryDeferred() == (applied: 2, remaining: 0))
        #expect(try c.documents(in: "c").count == 3)
    }

    @Test func aNodeWhoseClockIsBehindNeverDropsAndAcceptsOnceItsClockIsRight() throws {
        let piClock = ManualClock(startingAt: clock.now - 10 * 60_000)  // booted 10 minutes slow
        let pi = try open("pi.sqlite", clock: piClock)
        let writer = try open("writer.sqlite")
        try writer.upsert((0..<5).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] }, in: "c")
        let outcome = try pi.merge(
            try batch(of: writer), from: [1], checkpoint: (subscription: "s", Checkpoint(epoch: writer.epoch, seq: 5)))
        #expect(outcome.deferred.count == 5 && outcome.applied == 0)
        #expect(try pi.checkpoint(peer: [1], subscription: "s")?.seq == 5)  // stored: nothing is skipped
        piClock.set(clock.now)  // NTP
        #expect(try pi.retryDeferred() == (applied: 5, remaining: 0))
        #expect(try pi.documents(in: "c") == writer.documents(in: "c"))
    }

    @Test func statesThatDoNotDecodeOrAreTooLargeAreKeptAndRetried() throws {
        let writer = try open("writer.sqlite")
        try writer.upsert(["_id": "big", "s": .string(String(repeating: "x", count: 5_000))], in: "c")
        let path = "small.sqlite"
        do {
            let small = try open(path) {
                $0.maxDocumentBytes = 4_000
                $0.maxMergedDocumentBytes = 4_000
            }
            var docs = try batch(of: writer)
            docs.append(RemoteDocument(collection: "c", id: "newer", state: [0xFF]))
            let outcome = try small.merge(docs, from: [1], checkpoint: nil)
            #expect(outcome.applied == 0 && outcome.rejected.isEmpty)
            #expect(Set(outcome.deferred.map(\.key)) == ["\"big\"", "\"newer\""])
            let reasons = Dictionary(uniqueKeysWithValues: try small.deferredDocuments().map { ($0.key, $0.reason) })
            #expect(reasons["\"big\""]?.contains("above the limit of 4000 bytes") == true)
            #expect(reasons["\"newer\""]?.contains("does not decode") == true)
            // Tried again (after the delay), still refused: the attempt is counted.
            clock.advance(by: 1_000)
            #expect(try small.retryDeferred() == (applied: 0, remaining: 2))
            #expect(try small.deferredDocuments().allSatisfy { $0.attempts == 1 })
            clock.advance(by: 1_000)  // the next delay is two seconds
            #expect(try small.retryDeferred() == (applied: 0, remaining: 2))
            #expect(try small.deferredDocuments().allSatisfy { $0.attempts == 1 })
        }
        // Opened with a larger limit, the document is applied at once.
        let large = try open(path)
        #expect(try large.retryDeferred() == (applied: 1, remaining: 1))
        #expect(try large.document(id: "big", in: "c") == writer.document(id: "big", in: "c"))
        #expect(try large.deferredDocuments().map(\.key) == ["\"newer\""])
    }

    /// One state per (collection, document, peer): a newer state from the same peer joins the one
    /// kept, so nothing either held is lost.
    @Test func deferredStatesFromOnePeerAreJoined() throws {
        let local = try open("local.sqlite")
        let ahead = ManualClock(startingAt: clock.now + Self.day)
        let p1 = try open("p1.sqlite", clock: ahead)
        let p2 = try open("p2.sqlite", clock: ahead)
        try p1.upsert(["_id": "d", "a": 1], in: "c")
        try p2.upsert(["_id": "d", "b": 2], in: "c")
        _ = try local.merge(try batch(of: p1), from: [1], checkpoint: nil)
        _ = try local.merge(try batch(of: p2), from: [1], checkpoint: nil)
        _ = try local.merge(try batch(of: p2), from: [2], checkpoint: nil)
        #expect(try local.deferredDocuments().map(\.peer) == [[1], [2]])
        clock.set(ahead.now)
        #expect(try local.retryDeferred() == (applied: 1, remaining: 0))  // [2]'s state adds nothing
        #expect(try local.document(id: "d", in: "c") == ["_id": "d", "a": 1, "b": 2])
    }

    /// A peer's newer, acceptable state that holds everything of its deferred one clears it.
    @Test func anAppliedStateThatCoversTheDeferredOneClearsIt() throws {
        let local = try open("local.sqlite")
        let peerClock = ManualClock(startingAt: clock.now + Self.day)
        let peer = try open("peer.sqlite", clock: peerClock)
        try peer.upsert(["_id": "d", "v": 1], in: "c")
        _ = try local.merge(try batch(of: peer), from: [1], checkpoint: nil)
        #expect(try local.deferredDocuments().count == 1)
        clock.advance(by: Self.day)  // the local clock reaches the peer's, then the peer writes again
        peerClock.advance(by: 1)
        try peer.upsert(["_id": "d", "w": 2], in: "c")
        let outcome = try local.merge(try batch(of: peer), from: [1], checkpoint: nil)
        #expect(outcome.applied == 1 && outcome.deferred.isEmpty)
        #expect(try local.deferredDocuments().isEmpty)
    }

    /// Above the per-peer bound the whole batch is refused, without its checkpoint, and says so.
    @Test func aBatchBeyondTheDeferredBoundIsRefusedWholeWithoutItsCheckpoint() throws {
        let local = try open("local.sqlite") { $0.maxDeferredDocumentsPerPeer = 2 }
        let ahead = try open("ahead.sqlite", clock: ManualClock(startingAt: clock.now + Self.day))
        let right = try open("right.sqlite")
        try ahead.upsert((0..<3).map { ["_id": .string("f\($0)")] }, in: "c")
        try right.upsert(["_id": "ok"], in: "c")
        let before = local.lastSeq
        let error = #expect(throws: StoreError.self) {
            try local.merge(
                try batch(of: right) + batch(of: ahead), from: [1],
                checkpoint: (subscription: "s", Checkpoint(epoch: ahead.epoch, seq: 3)))
        }
        #expect(error?.description.contains("checkpoint was not stored") == true)
        #expect(try local.checkpoint(peer: [1], subscription: "s") == nil)
        #expect(try local.document(id: "ok", in: "c") == nil && local.lastSeq == before)
        #expect(try local.deferredDocuments().isEmpty)
        // Within the bound, and for another peer, batches go through.
        let two = Array(try batch(of: ahead).prefix(2))
        #expect(try local.merge(two, from: [1], checkpoint: nil).deferred.count == 2)
        #expect(try local.merge(two, from: [2], checkpoint: nil).deferred.count == 2)
        #expect(try local.deferredDocuments().count == 4)
        // A batch that defers nothing is not refused because of what is already kept.
        #expect(try local.merge(try batch(of: right), from: [1], checkpoint: nil).applied == 1)
    }
}
