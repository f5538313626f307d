import Testing
import TrellisCore
import TrellisStore
import TrellisTestKit

/// `saveSnapshot` and `restoreSnapshot`: a store goes back to a saved state in memory, database
/// and position alike (what the fuzzed sync session relies on between inputs).
@Suite struct SnapshotTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()

    /// The change log of a collection as (seq, key, state) triples, to compare two runs.
    func log(_ store: DocumentStore, _ collection: String) throws -> [String] {
        try store.changes(in: collection, after: 0, limit: 1_000, maxBytes: .max).records.map {
            "\($0.seq) \($0.key) \($0.state)"
        }
    }

    @Test func restoringUndoesWritesMergesCheckpointsAndRotationsAndTheSameWritesGiveTheSameLog() throws {
        let store = try openStore(dir, "s.sqlite", clock: clock)
        try store.upsert([["_id": "a", "n": 1], ["_id": "b", "tags": ["x"]]], in: "items")
        _ = try store.remove(id: "b", in: "items")
        try store.saveSnapshot()
        let documents = try store.documents(in: "items")
        let (seq, stamp, epoch, site) = (store.lastSeq, store.lastTimestamp, store.epoch, store.siteID)

        // The first run after the snapshot: local writes, a peer's batch with its checkpoint, a
        // rotation of the log.
        clock.advance(by: 10)
        try store.upsert(["_id": "a", "n": 2], in: "items")
        let firstLog = try log(store, "items")
        let peerStore = try openStore(dir, "peer.sqlite", clock: clock)
        try peerStore.upsert([["_id": "p", "v": 1], ["_id": "q", "v": 2]], in: "items")
        let peer = [UInt8](repeating: 7, count: 32)
        let checkpoint = Checkpoint(epoch: peerStore.epoch, seq: peerStore.lastSeq)
        let merged = try store.merge(try batch(of: peerStore, "items"), from: peer, checkpoint: ("items", checkpoint))
        #expect(merged.applied == 2)
        try store.rotateLog(reason: "test")
        #expect(try store.checkpoints(peer: peer).count == 1)

        try store.restoreSnapshot()
        #expect(try store.documents(in: "items") == documents)
        #expect(store.lastSeq == seq)
        #expect(store.lastTimestamp == stamp)
        #expect(store.epoch == epoch)
        #expect(store.siteID == site)
        #expect(try store.checkpoints(peer: peer).isEmpty)

        // The same write at the same time gives the same log, byte for byte; and the snapshot is
        // kept for the next restore.
        try store.upsert(["_id": "a", "n": 2], in: "items")
        #expect(try log(store, "items") == firstLog)
        try store.restoreSnapshot()
        #expect(try store.documents(in: "items") == documents)
    }

    @Test func restoreRefusesWithoutASnapshotAndWhileObserversAreRegistered() throws {
        let store = try openStore(dir, "s.sqlite", clock: clock)
        #expect(throws: StoreError.self) { try store.restoreSnapshot() }
        try store.upsert(["_id": "a"], in: "c")
        try store.saveSnapshot()
        let token = store.addObserver { _ in }
        do {
            try store.restoreSnapshot()
            Issue.record("restored while an observer was registered")
        } catch {
            #expect("\(error)".contains("observers"))
        }
        store.removeObserver(token)
        try store.upsert(["_id": "b"], in: "c")
        try store.restoreSnapshot()
        #expect(try store.count(in: "c") == 1)
        store.close()
        #expect(throws: StoreError.closed) { try store.restoreSnapshot() }
    }
}
