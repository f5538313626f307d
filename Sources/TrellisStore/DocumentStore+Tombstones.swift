import Foundation
public import TrellisCore

// Tombstone expiry (docs/DATA-MODEL.md, "Tombstones and reaping").
//
// A tombstone is kept for `StoreOptions.tombstoneTTL` after its newest stamp, then reaped: its row
// leaves the documents table (and so the change log, reads and enumerations). Two things remain:
// - the collection's retained floor: the highest `seq` of a reaped row. A reader of the log (a
//   peer's checkpoint, a contacts anchor) below it may have missed a remove and starts over.
// - a reaped key: the collection, `_id` key, the time of the tombstone's newest stamp, the
//   tombstone's state, its `seq` and the document's birth (its row's `age`), for
//   `StoreOptions.reapedKeyRetention`. That state stands for the missing row (`row(_:_:_:)`): a
//   state for that `_id` arriving later is merged into it and a local write re-creating the
//   document starts from it, so what the remove covered stays removed, and the row written then
//   keeps the birth (`whole_held`, DocumentStore+Scope.swift). A state
//   that adds nothing to it but what the remove covers is a stale copy of the removed document
//   (from a node that was away longer than the TTL, or relayed from one): it is merged and
//   removed again with a new remove stamp, so the remove travels back to whoever still holds the
//   document instead of the document coming back. Keys reaped by an earlier version have no
//   state: a state arriving for one whose every stamp is at or before that time is such a copy,
//   and one carrying a newer stamp is merged as usual and, add-wins, brings the document back.

/// What one run of ``DocumentStore/reapExpiredTombstones(limit:)`` did.
public struct ReapResult: Sendable, Equatable {
    /// Tombstones deleted (their keys remembered).
    public var reaped: Int
    /// Reaped keys forgotten (older than ``StoreOptions/reapedKeyRetention``).
    public var forgotten: Int
    /// Whether more work is waiting (a bound was reached): call again.
    public var more: Bool

    public init(reaped: Int, forgotten: Int, more: Bool) {
        self.reaped = reaped
        self.forgotten = forgotten
        self.more = more
    }
}

/// A tombstone row chosen for reaping.
struct ReapRow {
    var collection: String
    var key: String
    /// The row key `k` as stored, which the reaper deletes the row by: a collection name that is
    /// not well-formed UTF-8 (a damaged row) reads repaired in `collection`, and its key made
    /// again from that would miss the row.
    var rowKey: [UInt8]
    var seq: Int64
    var removedAt: UInt64
    /// The row's `age` (its `seq` less the first `seq` the document had); `nil` for a row from
    /// before the column, born before every `seq`.
    var age: Int64?

    /// The columns ``read(_:)`` takes, in its order.
    static let columns = "collection, k, seq, removed_at, age"

    /// Every row of a statement that selects ``columns``; the statement is reset.
    static func read(_ st: Statement) throws -> [ReapRow] {
        defer { st.reset() }
        var rows: [ReapRow] = []
        while try st.step() {
            // The prefix counts the collection's bytes as stored, not as a repaired `String`.
            let prefix = DocumentStore.keyPrefixLength(byteCount: st.textBytes(0)?.count ?? 0)
            rows.append(
                ReapRow(
                    collection: st.string(0) ?? "", key: st.string(1, dropping: prefix) ?? "",
                    rowKey: st.textBytes(1).map { Array($0) } ?? [], seq: st.int64(2),
                    removedAt: UInt64(max(0, st.int64(3))), age: st.optionalInt64(4)))
        }
        return rows
    }
}

extension DocumentStore {
    /// Reads what the store remembers of reaped tombstones at open.
    static func loadTombstoneState(_ db: Connection, into state: inout State) throws {
        guard try hasTable(db, "reaped") else { return }
        let count = try db.prepare("SELECT count(*) FROM reaped")
        defer { count.reset() }
        _ = try count.step()
        state.reapedRows = Int(count.int64(0))
    }

    /// The lowest `seq` after which the change log of a collection is complete: tombstones with a
    /// lower or equal `seq` may have been reaped, so a reader whose cursor is below it has missed
    /// removals and must start over (the contacts enumerator answers `changeAnchorExpired`; a
    /// peer's scan starts again from the beginning, ``ChangePage/belowFloor``). 0 when nothing was
    /// reaped.
    public func retainedFloor(in collection: String) throws(StoreError) -> Int64 {
        try withState { s -> Int64 in try Self.metaInt64(s.db, "floor:" + collection) ?? 0 }
    }

    /// Reaps tombstones whose newest stamp is older than ``StoreOptions/tombstoneTTL`` (by
    /// ``StoreOptions/now``), in one transaction of at most `limit` rows: each row is deleted, its
    /// key remembered (so a stale copy is removed again rather than brought back), and its
    /// collection's ``retainedFloor(in:)`` raised to its `seq`. Reaped keys older than
    /// ``StoreOptions/reapedKeyRetention`` are forgotten, as many again. Tombstones written by an
    /// earlier version (without a recorded time) are dated on the way, `limit` at a time.
    ///
    /// A tombstone holding a remove (or any write) of this node that no peer has acknowledged is
    /// kept past the TTL until a peer acknowledges a batch that carries it (``acknowledge(_:)``),
    /// or asks the whole collection from past it (``acknowledgeTombstones(in:through:)``): reaped
    /// before, the remove would be lost, and the document would live on at every peer that held
    /// it. It is kept no longer than the TTL and ``StoreOptions/reapedKeyRetention`` together
    /// (for good when that is `nil`), when the reaped key it leaves would be forgotten too.
    ///
    /// Nothing is loaded beyond `limit` rows, so the lock is held for a bounded time; call again
    /// while ``ReapResult/more`` is `true` (the sync host does, one call per tick).
    ///
    /// - Parameter limit: the most rows handled (dated, reaped, forgotten, each); at least 1.
    /// - Returns: what was done, and whether more waits.
    /// - Throws: ``StoreError`` for SQLite errors (nothing of this run is kept then).
    /// - Complexity: O(limit · log n) through the partial index on tombstones' times.
    public func reapExpiredTombstones(limit: Int = 1000) throws(StoreError) -> ReapResult {
        guard !options.readOnly else { return ReapResult(reaped: 0, forgotten: 0, more: false) }
        let limit = max(1, limit)
        return try write { s -> ReapResult in
            let now = reaperNow(&s)
            let dated = try dateLegacyTombstones(&s, limit: limit)
            var rows: [ReapRow] = []
            if now > options.tombstoneTTL {
                rows = try expiredTombstones(
                    &s, acknowledged: true, removedBy: now - options.tombstoneTTL, limit: limit)
            }
            // A tombstone kept for a write no peer acknowledged goes once the reaped key it would
            // leave would itself be forgotten: past that, a node that holds the document brings
            // it back anyway (docs/MESH.md, "Tombstones").
            if rows.count < limit, let retention = options.reapedKeyRetention,
                case let (kept, overflow) = options.tombstoneTTL.addingReportingOverflow(retention), !overflow,
                now > kept
            {
                rows += try expiredTombstones(&s, acknowledged: false, removedBy: now - kept, limit: limit - rows.count)
            }
            try reap(&s, rows, now: now)
            var forgotten = 0
            if let retention = options.reapedKeyRetention, now > retention, s.reapedRows > 0 {
                let del = try s.db.prepare(
                    "DELETE FROM reaped WHERE (collection, id) IN "
                        + "(SELECT collection, id FROM reaped WHERE reaped_at <= ? LIMIT ?)")
                del.bind(1, Int64(clamping: now - retention))
                del.bind(2, Int64(limit))
                try del.run()
                forgotten = s.db.changes
                s.reapedRows -= forgotten
            }
            return ReapResult(
                reaped: rows.count, forgotten: forgotten,
                more: dated == limit || rows.count == limit || forgotten == limit)
        }
    }

    /// Reaps every tombstone of a collection with `seq <= through`, whatever its age, in one
    /// transaction: as ``reapExpiredTombstones(limit:)`` does for expired ones (keys remembered,
    /// floor raised to at least `through`, or the end of the log if that is lower). For tests and tools; nodes reap by age.
    ///
    /// - Returns: the number of tombstones deleted.
    /// - Complexity: O(tombstones in the collection).
    @discardableResult
    public func reapTombstones(in collection: String, through: Int64) throws(StoreError) -> Int {
        try write { s -> Int in
            let now = reaperNow(&s)
            try dateLegacyTombstones(&s, limit: .max)
            let st = try s.db.prepare(
                "SELECT \(ReapRow.columns) FROM documents WHERE collection = ? AND deleted = 1 AND seq <= ?")
            st.bind(1, collection)
            st.bind(2, through)
            let rows = try ReapRow.read(st)
            try reap(&s, rows, now: now)
            // Never above the end of the log: a peer's cursor at the floor would look like a log
            // that went back in time.
            try raiseFloor(&s, collection, to: min(through, s.nextSeq - 1))
            return rows.count
        }
    }

    /// Up to `limit` tombstones whose newest stamp is at or before `removedBy` (milliseconds),
    /// oldest first: those holding no write of this node that no peer has acknowledged, or with
    /// `acknowledged` false the others (the reaper keeps those longer), each through its partial
    /// index (`documents_reapable`, `documents_kept_by_time`).
    private func expiredTombstones(_ s: inout State, acknowledged: Bool, removedBy: UInt64, limit: Int) throws
        -> [ReapRow]
    {
        let st = try s.db.prepare(
            "SELECT \(ReapRow.columns) FROM documents WHERE deleted = 1 AND unacked IS \(acknowledged ? "" : "NOT ")NULL "
                + "AND removed_at <= ? ORDER BY removed_at LIMIT ?")
        st.bind(1, Int64(clamping: removedBy))
        st.bind(2, Int64(limit))
        return try ReapRow.read(st)
    }

    /// The time the reaper goes by, in milliseconds: the wall clock (``StoreOptions/now``), but
    /// never more than ``StoreOptions/elapsed`` says passed since its previous reading in this
    /// run of the store, nor less than that reading. A wall clock set an hour ahead for two
    /// minutes so moves the reaper two minutes, not an hour: it neither reaps tombstones nor
    /// forgets reaped keys an hour early (it would then take a stale copy of a removed document
    /// for a new one). A wall clock set right after running behind leaves the reaper behind by
    /// as much until the store is opened again: tombstones and keys are kept longer, never
    /// dropped early.
    func reaperNow(_ s: inout State) -> UInt64 {
        let wall = options.now()
        let elapsed = options.elapsed()
        guard let last = s.reaperClock else {
            s.reaperClock = (wall, elapsed)
            return wall
        }
        let passed = elapsed >= last.elapsed ? elapsed - last.elapsed : 0
        let now = max(last.now, min(wall, last.now &+ passed))
        s.reaperClock = (now, elapsed)
        return now
    }

    /// Deletes tombstone rows, remembers their keys with their states and raises their
    /// collections' floors.
    private func reap(_ s: inout State, _ rows: [ReapRow], now: UInt64) throws {
        guard !rows.isEmpty else { return }
        let remember = try s.db.prepare(
            "INSERT INTO reaped(collection, id, removed_at, reaped_at, state, seq, age) VALUES (?,?,?,?,?,?,?) "
                + "ON CONFLICT(collection, id) DO UPDATE SET removed_at = max(removed_at, excluded.removed_at), "
                + "reaped_at = excluded.reaped_at, state = excluded.state, seq = excluded.seq, age = excluded.age")
        let delete = try s.db.prepare("DELETE FROM documents WHERE k = ? AND deleted = 1")
        let unscope = try s.db.prepare("DELETE FROM scopes WHERE collection = ? AND id = ?")
        var floors: [UTF8Key: Int64] = [:]  // byte-wise: "é" and "e" + U+0301 are two collections
        for row in rows {
            // The tombstone's state (its causal context, a few bytes per site) is kept with the
            // key: a state arriving later for it, or a write re-creating it, starts from it, so
            // what the remove covered stays removed (``row(_:_:_:)``). A tombstone made again for
            // a key reaped before started from the state kept then, so replacing it loses nothing.
            var tombstone = try self.row(&s, row.collection, row.key)?.state
            if tombstone?.isDeleted == false { tombstone = nil }  // not a tombstone: keep no state
            remember.reset()
            remember.bind(1, row.collection)
            remember.bind(2, row.key)
            remember.bind(3, Int64(clamping: row.removedAt))
            remember.bind(4, Int64(clamping: now))
            remember.bind(5, tombstone?.cbor())
            remember.bind(6, row.seq)
            // The document's birth (`seq - age`) stays with the key: a row written for it again is
            // not a new document (``writeRow``).
            if let age = row.age { remember.bind(7, age) } else { remember.bind(7, nil as String?) }
            if try reapedRemoval(&s, row.collection, row.key) == nil { s.reapedRows += 1 }
            try remember.run()
            delete.reset()
            delete.bind(1, cell: .text(row.rowKey))
            try delete.run()
            unscope.reset()
            unscope.bind(1, row.collection)
            unscope.bind(2, row.key)
            try unscope.run()
            let name = UTF8Key(row.collection)
            floors[name] = max(floors[name] ?? 0, row.seq)
        }
        for (collection, floor) in floors { try raiseFloor(&s, collection.string, to: floor) }
        // A reaped row may have held the highest seq; remember it so no seq is issued twice.
        try Self.setMetaInt64(s.db, "seq", s.nextSeq - 1)
    }

    private func raiseFloor(_ s: inout State, _ collection: String, to seq: Int64) throws {
        let floor = max(try Self.metaInt64(s.db, "floor:" + collection) ?? 0, seq)
        try Self.setMetaInt64(s.db, "floor:" + collection, floor)
    }

    /// Records the time of the newest stamp of up to `limit` tombstones written before tombstones
    /// carried it. A row whose state does not decode is dated 0 (reaped at the next run: its
    /// remove cannot be sent anyway).
    ///
    /// - Returns: how many were dated.
    @discardableResult
    private func dateLegacyTombstones(_ s: inout State, limit: Int) throws -> Int {
        let st = try s.db.prepare(
            "SELECT collection, id, state, value FROM documents WHERE deleted = 1 AND removed_at IS NULL LIMIT ?")
        st.bind(1, Int64(clamping: limit))
        var rows: [(collection: String, key: String, time: UInt64)] = []
        while try st.step() {
            let time = (try? StoredState.decode(st.bytes(2) ?? [], value: st.string(3)))?.maxTime.millis ?? 0
            rows.append((st.string(0) ?? "", st.string(1) ?? "", time))
        }
        st.reset()
        let update = try s.db.prepare("UPDATE documents SET removed_at = ? WHERE k = trellis_key(?, ?)")
        for row in rows {
            update.reset()
            update.bind(1, Int64(clamping: row.time))
            update.bind(2, row.collection)
            update.bind(3, row.key)
            try update.run()
        }
        return rows.count
    }

    /// The time of the newest stamp of a reaped tombstone of this document, if its key is
    /// remembered.
    func reapedRemoval(_ s: inout State, _ collection: String, _ key: String) throws -> UInt64? {
        guard s.reapedRows > 0 else { return nil }
        let st = try s.db.prepare("SELECT removed_at FROM reaped WHERE collection = ? AND id = ?")
        st.bind(1, collection)
        st.bind(2, key)
        defer { st.reset() }
        guard try st.step() else { return nil }
        return UInt64(max(0, st.int64(0)))
    }

    /// The state of a reaped tombstone of this document, if its key is remembered with it (keys
    /// reaped by an earlier version have none). A state that no longer decodes counts as none:
    /// the key's time alone then decides (``reapedRemoval(_:_:_:)``).
    ///
    /// - Returns: the state, and the `seq` the document was born with in this log (`nil` when
    ///   unknown: a row from before `age`, or a key reaped by a version that kept no birth; such a
    ///   document counts as born before every `seq`).
    func reapedTombstone(_ s: inout State, _ collection: String, _ key: String) throws -> (
        state: DocumentState, born: Int64?
    )? {
        guard s.reapedRows > 0 else { return nil }
        let st = try s.db.prepare("SELECT state, seq - age FROM reaped WHERE collection = ? AND id = ?")
        st.bind(1, collection)
        st.bind(2, key)
        defer { st.reset() }
        guard try st.step(), let bytes = st.bytes(0), let state = try? DocumentState(bytes: bytes) else { return nil }
        return (state, st.optionalInt64(1))
    }

    /// Forgets a reaped key: a row holds the key again, and with it what its tombstone kept.
    func forgetReaped(_ s: inout State, _ collection: String, _ key: String) throws {
        let st = try s.db.prepare("DELETE FROM reaped WHERE collection = ? AND id = ?")
        st.bind(1, collection)
        st.bind(2, key)
        try st.run()
        s.reapedRows -= s.db.changes
    }

    /// The state kept with the reaped key of a document that has no row: its reaped tombstone,
    /// which the store stands in for the missing row when a copy of the document arrives or the
    /// app writes it again (as if it had not been reaped). `nil` when the key is not remembered,
    /// was reaped by a version that kept no state, or the document has a row (a row and a reaped
    /// key never stand together). ``state(id:in:)`` and the change log leave it out; a checker
    /// that must tell a reaped document from a lost one (the simulator's invariants) reads it
    /// here.
    ///
    /// - Throws: ``StoreError/invalidID(_:)`` for an `_id` no document can have; the store's errors.
    public func reapedState(id: Value, in collection: String) throws(StoreError) -> DocumentState? {
        let key = try Self.key(for: id)
        return try withState { s in try reapedTombstone(&s, collection, key)?.state }
    }

    /// The number of reaped keys remembered (``StoreOptions/reapedKeyRetention``).
    public var reapedKeyCount: Int { (try? withState { $0.reapedRows }) ?? 0 }
}
