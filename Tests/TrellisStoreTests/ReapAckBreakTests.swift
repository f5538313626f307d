import Foundation
import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// A reviewer's attempts to break "the reaper keeps a tombstone holding a write of this node no
/// peer has acknowledged" (docs/DATA-MODEL.md, "A remove no peer has is kept"). Each test says
/// what it sets up, what the documentation promises, and whether it fails on the code it was
/// written against.
@Suite struct ReapAckBreakTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()
    static let ttl: UInt64 = 7 * 86_400_000

    func open(_ name: String) throws -> DocumentStore { try openStore(dir, name, clock: clock) }

    func unacked(_ store: DocumentStore, _ id: String) throws -> Int64? {
        let key = try DocumentStore.key(for: .string(id))
        return try store.withState { s -> Int64? in
            let st = try s.db.prepare("SELECT unacked FROM documents WHERE collection = 'c' AND id = ?")
            defer { st.reset() }
            st.bind(1, key)
            guard try st.step(), !st.isNull(0) else { return nil }
            return st.int64(0)
        }
    }

    /// A removes d; B merges A's batch (B holds the remove) and sends its state back; A merges
    /// it: unchanged, A's state is exactly B's. The ack of A's batch to B never came (the link
    /// dropped, or A restarted, between the batch and its ack; B's checkpoint is past the remove,
    /// so it is never sent to B again).
    ///
    /// Promised (DATA-MODEL.md): "a merge whose result is the sender's own state marks the row
    /// acknowledged too (the sender holds every write in it)". An unchanged merge's result is the
    /// sender's state as well.
    ///
    /// Failed on the first version of the change: the tombstone was kept for good (`heldBySender`
    /// only for a merge that changed the row, and an unchanged merge wrote nothing). Now an
    /// unchanged merge of the sender's identical tombstone marks it (`markHeldTombstone`).
    @Test func aRemoveTheSenderSendsBackUnchangedIsReapedAtItsTTL() throws {
        let a = try open("a.sqlite")
        let b = try open("b.sqlite")
        try a.upsert(["_id": "d", "v": 1], in: "c")
        try a.remove(id: "d", in: "c")
        _ = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        #expect(try b.state(id: "d", in: "c")?.isDeleted == true)
        _ = try a.merge(try batch(of: b), from: [2], checkpoint: nil)  // B holds exactly A's tombstone
        clock.advance(by: Self.ttl + 1)
        #expect(
            try a.reapExpiredTombstones().reaped == 1,
            "B sent A its own tombstone back: B holds the remove, yet A keeps it (unacked \(String(describing: (try? unacked(a, "d")) ?? nil)))"
        )
    }

    /// A writes d {a: 1, b: 1}, then unsets b; B takes both and acknowledges (for a live row the
    /// acknowledgement is only kept in memory: the row keeps `unacked` 0). More than the TTL later
    /// B removes d; B's write reaps the unset's remove context (expired), so B's tombstone lacks
    /// it. A merges B's tombstone: the merged state still has the context, so it is not B's
    /// state, the write goes as `.merged` and keeps `unacked`; reaping then drops the context and
    /// the row A stores is exactly B's tombstone.
    ///
    /// Promised: a peer's remove that saw this node's writes is reaped at its TTL "whatever this
    /// node had not yet heard acknowledged".
    ///
    /// Passes: a tombstone carries no field remove records, so the merged state is B's
    /// tombstone before reaping too (`heldBySender` is computed before `reapRemovedFields`,
    /// DocumentStore+Merge.swift:299 vs :303, which did not matter here).
    @Test func aPeersRemoveOverAnExpiredUnsetIsReapedAtItsTTL() throws {
        let a = try open("a.sqlite")
        let b = try open("b.sqlite")
        try a.upsert(["_id": "d", "a": 1, "b": 1], in: "c")
        try a.update(id: "d", in: "c", operations: [.unset(.key("b"))])
        _ = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        try acknowledgeAll(a)
        clock.advance(by: Self.ttl + 1)
        #expect(try b.remove(id: "d", in: "c"))
        _ = try a.merge(try batch(of: b), from: [2], checkpoint: nil)
        #expect(try a.state(id: "d", in: "c") == b.state(id: "d", in: "c"), "A stores exactly B's tombstone")
        clock.advance(by: Self.ttl + 1)
        #expect(
            try a.reapExpiredTombstones().reaped == 1,
            "A keeps B's remove (unacked \(String(describing: (try? unacked(a, "d")) ?? nil))) though B holds all of it"
        )
    }

    /// A store of the previous version: a local remove wrote `unacked` 0, and its acknowledgement
    /// (entries without `isTombstone`) was kept in memory only, as for every live row; the
    /// reaper took it at its TTL whatever `unacked` said. After the upgrade, that tombstone has
    /// `unacked` 0 and nothing will ever clear it: the peers that acknowledged it hold
    /// checkpoints past it and never receive it again.
    ///
    /// Failed on the first version of the change: every tombstone of a local remove written before
    /// the upgrade (and not yet reaped) was kept for good, the migration only swapping the index.
    /// Now a store that had the earlier index has its tombstones marked acknowledged once, and
    /// they are reaped at their TTL as that version reaped them.
    @Test func tombstonesOfThePreviousVersionAreReapedAfterTheUpgrade() throws {
        do {
            let old = try open("old.sqlite")
            try old.upsert(["_id": "d", "v": 1], in: "c")
            try old.remove(id: "d", in: "c")
            // What the previous version's host passed on: no `isTombstone` (it did not exist).
            try old.acknowledge(
                try old.changes(in: "c", after: 0, limit: 100, maxBytes: .max).records.map {
                    AcknowledgedEntry(collection: "c", key: $0.key, seq: $0.seq)
                })
            // The previous version's index, as it left the schema.
            try old.withState { s in
                try s.db.execute("DROP INDEX documents_reapable")
                try s.db.execute("CREATE INDEX documents_tombstones ON documents(removed_at) WHERE deleted = 1")
            }
            old.close()
        }
        clock.advance(by: Self.ttl + 1)
        let upgraded = try open("old.sqlite")
        #expect(
            try upgraded.reapExpiredTombstones().reaped == 1,
            "a remove acknowledged before the upgrade is kept (unacked \(String(describing: (try? unacked(upgraded, "d")) ?? nil)))"
        )
    }

    /// Control (passes if the change holds): A removes d while B, which never saw A's remove,
    /// removes it too. A merges B's tombstone: the result holds A's remove, which B lacks, so it
    /// is not B's state, and A keeps it until a peer acknowledges it.
    @Test func aPeersTombstoneOverALocalUnacknowledgedRemoveKeepsIt() throws {
        let a = try open("a.sqlite")
        let b = try open("b.sqlite")
        try a.upsert(["_id": "d", "v": 1], in: "c")
        _ = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        try a.remove(id: "d", in: "c")
        clock.advance(by: 10)
        try b.remove(id: "d", in: "c")
        _ = try a.merge(try batch(of: b), from: [2], checkpoint: nil)
        clock.advance(by: Self.ttl + 1)
        #expect(try a.reapExpiredTombstones().reaped == 0, "A's own remove reached no peer and was reaped")
        #expect(try a.state(id: "d", in: "c")?.isDeleted == true)
    }

    /// Control (passes if the change holds): a write of A made after its remove and before the
    /// remove's acknowledgement came (the acknowledgement names the remove's `seq`) is not
    /// covered by it.
    @Test func anAckOfARemoveDoesNotCoverALaterRemoveOfTheSameDocument() throws {
        let a = try open("a.sqlite")
        try a.upsert(["_id": "d", "v": 1], in: "c")
        try a.remove(id: "d", in: "c")
        let first = a.lastSeq
        try a.upsert(["_id": "d", "v": 2], in: "c")
        try a.remove(id: "d", in: "c")
        try a.acknowledge([
            AcknowledgedEntry(collection: "c", key: try DocumentStore.key(for: "d"), seq: first, isTombstone: true)
        ])
        clock.advance(by: Self.ttl + 1)
        #expect(try a.reapExpiredTombstones().reaped == 0)
    }
}
