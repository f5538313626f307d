import Foundation
public import TrellisCore

// The change log as peers read it, and damaged rows.
//
// One damaged row never blocks the others: a row whose state or JSON does not decode is skipped
// by the change log, reads, queries and the contacts enumerator, each time with an error that
// names it (logged once, listed by `damagedDocuments()`); a good state merged from a peer
// replaces it.

/// A document named by its collection and canonical `_id` key, both compared byte-wise.
struct DocumentKey: Hashable {
    var collection: UTF8Key
    var key: UTF8Key

    init(collection: String, key: String) {
        self.collection = UTF8Key(collection)
        self.key = UTF8Key(key)
    }
}

extension SQLiteError {
    /// Whether SQLite refused a statement because a JSON function met text that is not JSON (a
    /// damaged row's materialised value).
    var isMalformedJSON: Bool { message.contains("malformed JSON") }
}

extension DocumentStore {
    /// One page of a collection's change log after `after`, in `seq` order: the entries whose
    /// document matches `query` with `args`, and every tombstone (a removed document matches no
    /// query, but whoever holds it must learn of the remove). This is what a peer subscribed to
    /// `(collection, query, args)` is sent. An evicted document's local stub is never returned.
    ///
    /// The query runs inside SQLite (``Query/sqlWhere(column:)`` over the materialised JSON) when
    /// it translates and SQLite accepts the translation; otherwise each entry's state is decoded
    /// and the query evaluated in memory.
    ///
    /// The page is cut by entries and by bytes: it ends after `limit` entries were examined, or
    /// after the record whose state brings the page's total state bytes to `maxBytes` or more
    /// (then `scannedUpTo` is that record's `seq` and `exhausted` is `false`). So a page holds at
    /// least one record whenever one matches after `after`, however large: one document always
    /// fits.
    ///
    /// When `after` is above 0 but below the collection's ``retainedFloor(in:)`` (tombstones after
    /// it were reaped), ``ChangePage/belowFloor`` is `true`: a reader resuming from a cursor it
    /// stored earlier may have missed removes and must start over from 0 (a full resync, never a
    /// silent "no changes"). A reader paging on from a cursor this store just returned to it
    /// carries on. An exhausted page's cursor is at least the floor.
    ///
    /// A damaged row (its state or JSON value does not decode) and a state above
    /// ``StoreOptions/mergedDocumentCeiling`` (stored under a larger limit) are passed over and listed in
    /// ``ChangePage/skipped`` with the reason; the rest of the log flows. Damaged rows are also
    /// logged once and listed by ``damagedDocuments()``.
    ///
    /// - Parameters:
    ///   - after: exclusive lower bound (a cursor: the `scannedUpTo` of the previous page, or 0).
    ///   - keys: when given, only the rows of these canonical `_id` keys are read (a peer asking
    ///     again for documents it evicted), found through the primary key.
    ///   - base: for a page answering a refetch, the query subscription the refetch was derived
    ///     from (`Refetch.base(of:)` in TrellisSync's adapter), whose subscriber will hold the
    ///     page's tombstones and eviction stubs: it is tracked as served, and each is recorded in
    ///     its scope, so a later change to the document is sent to it whatever its query matches.
    ///     A base whose query does not parse, or a whole-collection one, records nothing.
    ///   - reader: the peer the page is for, with its acknowledged position. For a
    ///     whole-collection `subscription`, the store records how far the peer was served the
    ///     collection (``WholeHeld``); for a query one with ``PageReader/sendsHeld``, the page also
    ///     returns, whatever they match, the documents the peer may hold from such service in an
    ///     older state (born up to ``WholeHeld/bornUpTo``, changed after
    ///     ``WholeHeld/changedAfter``).
    ///   - limit: at most this many log entries are examined (matching or not); at least 1.
    ///   - maxBytes: the byte budget of the page's states (CBOR bytes); at least 1.
    ///   - reapedAfter: for a reader that may hold documents of the log up to this position (a
    ///     peer that resumed from its checkpoint here, also one found below the floor and starting
    ///     over from 0, ``ChangePage/belowFloor``): the page also holds, in `seq` order among the
    ///     rows, the tombstones reaped here whose `seq` is above both it and `after`, each as the
    ///     state its reaped key kept, whatever the query (the reader may hold any of those
    ///     documents, and only a remove it receives takes it away). Keys reaped without a state
    ///     (by an earlier version) have none to send. Ignored with `keys`.
    /// - Throws: ``StoreError`` for SQLite errors, or a query whose `$args` are missing.
    /// - Complexity: O(limit · log n) through the `(collection, seq)` index, plus the size of the
    ///   states returned; with `keys`, O(k log n) through the primary key for k keys, and a sort
    ///   of the rows found; with `reapedAfter`, O(limit · log r) more for r reaped keys.
    public func changes(
        in collection: String, after: Int64, limit: Int, maxBytes: Int, matching query: Query = .all,
        args: UTF8Map<Value> = [:], servedAs subscription: SubscriptionSpec? = nil, keys: [String]? = nil,
        refetchOf base: SubscriptionSpec? = nil, reader: PageReader? = nil, reapedAfter: Int64? = nil
    ) throws(StoreError) -> ChangePage {
        let bound = try Self.bind(query, args)
        let translated = bound.sqlWhere(column: "documents.value")
        let now = options.now()
        return try withState { s -> ChangePage in
            var scope: Int64?
            var held: WholeHeld?
            if let subscription, !subscription.isWholeCollection {
                try registerServed(&s, subscription, bound: bound, now: now)
                scope = subscription.scopeHash
                if let reader, reader.sendsHeld {
                    held = s.wholeHeld[PeerCollection(peer: reader.peer, collection: UTF8Key(collection))]
                }
            }
            // Below the retained floor the log no longer holds every remove.
            let floor = try Self.metaInt64(s.db, "floor:" + collection) ?? 0
            var page: ChangePage
            func read(nulRows: Bool) throws -> ChangePage {
                do {
                    return try changePage(
                        &s, collection, after, limit, maxBytes, bound, translated, scope, held, keys, guarded: false,
                        nulRows: nulRows)
                } catch let error as SQLiteError where error.isMalformedJSON {
                    // A damaged JSON value in the page: evaluate the query only on valid JSON.
                    return try changePage(
                        &s, collection, after, limit, maxBytes, bound, translated, scope, held, keys, guarded: true,
                        nulRows: nulRows)
                }
            }
            let nulRows = try mayHoldNUL(&s, collection)
            page = try read(nulRows: nulRows)
            if !nulRows, try answeredWithoutNULRows(&s, collection) { page = try read(nulRows: true) }
            page.belowFloor = after > 0 && after < floor
            page.floor = floor
            page.heldFrom = held?.changedAfter
            // Every reaped key's `seq` is at most the floor: a reader past it has none to get, and
            // most pages (a peer caught up) read no more than they did.
            if let reapedAfter, keys == nil, s.reapedRows > 0, max(after, reapedAfter) < floor {
                try addReapedTombstones(&s, to: &page, collection, after: max(after, reapedAfter), limit: limit)
            }
            // Nothing is left between the last row and the floor: an exhausted page covers it, so
            // the next page is not below the floor again.
            if page.exhausted { page.scannedUpTo = max(page.scannedUpTo, floor) }
            if let base { try recordRefetched(&s, of: page, base: base, now: now) }
            // An eviction stub sent whole (it holds an unacknowledged write) is held by the
            // subscriber from now on; the stub's value is unknown to scope tracking, so the next
            // state of the document (a write over the stub, a merge) reaches it only if recorded.
            if let subscription { try recordStubs(&s, of: page, heldBy: subscription) }
            if let subscription, subscription.isWholeCollection, keys == nil, let reader {
                try noteWholeServed(&s, collection, page: page, after: after, for: reader)
            }
            return page
        }
    }

    private func changePage(
        _ s: inout State, _ collection: String, _ after: Int64, _ limit: Int, _ maxBytes: Int, _ bound: Query,
        _ translated: PushedQuery?, _ scope: Int64?, _ held: WholeHeld?, _ keys: [String]?, guarded: Bool,
        nulRows: Bool
    ) throws -> ChangePage {
        // 1: send (a tombstone or stub, or a match), 0 or NULL: no match, 2: the JSON is damaged,
        // 3: send whatever it holds (it left the subscription's scope, DocumentStore+Scope.swift),
        // 4: evaluate in memory (its JSON holds a string with U+0000, DocumentStore+NULStrings.swift).
        // A translation SQLite refuses to prepare is evaluated in memory instead. Without a scope
        // (a whole collection, or no subscription named) every tombstone is sent.
        let (st, pushed) = try Self.preparePushedDown(s.db, translated) { pushed in
            let left =
                scope.map {
                    // A stub offered whole (an unacknowledged write) tells the subscriber too; so
                    // does a change to what the peer may hold from a whole-collection service.
                    let holds = held.map { " OR " + Self.heldFromWholeSQL($0) } ?? ""
                    return "WHEN (deleted != 2 OR unacked IS NOT NULL) AND (\(Self.leftScopeSQL($0))\(holds)) THEN 3 "
                        + "WHEN deleted = 1 THEN 0 "
                } ?? ""
            var match = scope == nil ? "1" : "CASE \(left)ELSE 1 END"
            if let pushed {
                let filter =
                    nulRows ? "CASE WHEN \(Self.nulEscapeSQL) THEN 4 ELSE (\(pushed.sql)) END" : "(\(pushed.sql))"
                match =
                    guarded
                    ? "CASE \(left)WHEN deleted != 0 THEN 1 WHEN json_valid(value) THEN \(filter) ELSE 2 END"
                    : "CASE \(left)WHEN deleted != 0 THEN 1 ELSE \(filter) END"
            }
            // With keys, the rows are found through the primary key and sorted (`+seq` keeps
            // SQLite off the `seq` index, which would walk the whole log after `after` for a few
            // hundred `_id`s: a refetch of n documents then examined n² / 256 rows).
            let seq = keys == nil ? "seq" : "+seq"
            return "SELECT seq, k, state, deleted, \(match), value, deleted != 0 OR json_valid(value), "
                + "unacked IS NOT NULL, delta, delta_seq FROM documents "
                + "WHERE collection = ? AND \(seq) > ?"
                + (keys == nil ? "" : " AND k IN (SELECT trellis_key(?, value) FROM json_each(?))")
                + " ORDER BY \(seq) LIMIT ?"
        }
        let bindings = pushed?.bindings ?? []
        Self.bind(st, bindings)
        var index = Int32(bindings.count) + 1
        st.bind(index, collection)
        st.bind(index + 1, after)
        if let keys {
            st.bind(index + 2, collection)
            st.bind(index + 3, JSON.string(.array(keys.map { .string($0) })))
            index += 2
        }
        st.bind(index + 2, Int64(max(1, limit)))
        defer { st.reset() }
        var page = ChangePage(records: [], scannedUpTo: after, exhausted: false)
        let prefix = Self.keyPrefixLength(collection)
        var scanned = 0
        var bytes = 0
        while try st.step() {
            scanned += 1
            let seq = st.int64(0)
            page.scannedUpTo = seq
            let matched = st.isNull(4) ? 0 : st.int64(4)
            guard matched != 0 else { continue }
            // An evicted document's stub is local: never sent to peers, unless it holds a write of
            // this node that no peer has acknowledged (it kept the whole state for it).
            let unacknowledged = st.int64(7) == 1
            guard let kind = RowKind(rawValue: st.int64(3)), kind != .stub || unacknowledged else { continue }
            let key = st.string(1, dropping: prefix) ?? ""
            func skip(_ reason: String, damaged: Bool = true) {
                page.skipped.append(SkippedRecord(seq: seq, collection: collection, key: key, reason: reason))
                if damaged { noteDamaged(&s, collection, key, reason) }
            }
            guard let id = try? Value.id(ofDocumentKey: key) else {
                skip("its _id key is not JSON")
                continue
            }
            guard matched != 2 else {
                skip("its JSON value does not parse")
                continue
            }
            let stored = st.bytes(2) ?? []
            let deleted = kind == .tombstone
            // A compact row goes out as its stamp and JSON (SingleWriteState), every other row as stored.
            var state = stored
            var compact = false
            do {
                if let stamp = try StoredState.compactStamp(stored) {
                    compact = true
                    guard let json = st.string(5), st.int64(6) == 1 else {
                        skip("its JSON value does not parse")
                        continue
                    }
                    state = SingleWriteState(stamp: stamp, json: json).encoded()
                }
                // A stub has no JSON value for SQL to match: its query is evaluated here.
                if pushed == nil || matched == 4 || kind == .stub, !deleted, matched != 3 {
                    let doc = try StoredState.decode(stored, value: st.string(5))
                    guard let value = doc.materialize(id: id), try bound.matches(value) else { continue }
                } else if !compact {
                    _ = try CBOR.decode(stored)  // sent as stored: at least well-formed
                }
            } catch let error as QueryEvaluationError {
                throw error
            } catch {
                skip("its state does not decode: \(error)")
                continue
            }
            guard state.count <= options.mergedDocumentCeiling else {
                skip(
                    "its state is \(state.count) bytes, above the limit of \(options.mergedDocumentCeiling) bytes "
                        + "(stored under a larger limit)", damaged: false)
                continue
            }
            // A live row's delta (local writes since its base) goes beside it; the replicator
            // chooses which a peer gets.
            let delta = kind == .live && !compact ? st.bytes(8).map { LogDelta(bytes: $0, baseSeq: st.int64(9)) } : nil
            page.records.append(
                ChangeRecord(
                    seq: seq, collection: collection, id: id, key: key, state: state, isDeleted: deleted,
                    holdsUnacknowledgedWrite: unacknowledged, isEvictionStub: kind == .stub, delta: delta))
            bytes += state.count
            if bytes >= maxBytes { return page }
        }
        page.exhausted = scanned < max(1, limit)
        return page
    }

    /// Adds to `page` the tombstones reaped here with a `seq` above `after` and up to the page's
    /// end (the end of the log for an exhausted page), as their reaped keys kept them, in `seq`
    /// order among its records. When `limit` of them fall in the page, the page is cut after the
    /// last one's `seq` (the rows after it come with the next page). Keys reaped by the version
    /// before share their collection's floor as `seq` (DocumentStore+Lifecycle.swift): those at
    /// the cut all come in this page.
    private func addReapedTombstones(
        _ s: inout State, to page: inout ChangePage, _ collection: String, after: Int64, limit: Int
    ) throws {
        let end = page.exhausted ? Int64.max : page.scannedUpTo
        guard end > after else { return }
        let (reaped, cut) = try readReaped(&s, collection, after: after, through: end, limit: limit)
        if let last = cut {
            page.records.removeAll { $0.seq > last }
            page.skipped.removeAll { $0.seq > last }
            page.scannedUpTo = last
            page.exhausted = false
        }
        guard !reaped.isEmpty else { return }
        page.records = (page.records + reaped).sorted { $0.seq < $1.seq }
    }

    /// The tombstones reaped in `collection` whose `seq` is above `after` and at most `through`,
    /// in `seq` order, each as the state its reaped key kept, for a peer that asked with `h` from
    /// a checkpoint at `through` (docs/PROTOCOL.md §2 step 5): it got documents from other peers
    /// since it asked from 0 without `h`, and may hold copies of documents removed and reaped
    /// here. Keys reaped without a state (by an earlier version) have none to send.
    ///
    /// - Parameter limit: at most this many keys, and all of those with the last one's `seq` (keys
    ///   reaped by an earlier version share their collection's floor); at least 1.
    /// - Returns: the tombstones as ``ChangePage/records``; ``ChangePage/scannedUpTo`` is the
    ///   `seq` the next page goes on after (`through` once none is left), and the page is
    ///   ``ChangePage/exhausted`` when none is left.
    /// - Throws: ``StoreError`` for SQLite errors.
    /// - Complexity: O(limit · log r) for r reaped keys.
    public func reapedTombstones(in collection: String, after: Int64, through: Int64, limit: Int) throws(StoreError)
        -> ChangePage
    {
        try withState { s -> ChangePage in
            var page = ChangePage(records: [], scannedUpTo: through, exhausted: true)
            guard through > after else { return page }
            let (reaped, cut) = try readReaped(&s, collection, after: after, through: through, limit: limit)
            page.records = reaped
            if let last = cut, last < through {
                page.scannedUpTo = last
                page.exhausted = false
            }
            return page
        }
    }

    /// Up to `limit` reaped tombstones of `collection` with a `seq` in `after...through` (`after`
    /// excluded), and every one sharing the last one's `seq`; `cut` is that `seq` when the limit
    /// was reached (more may follow it), `nil` when every one up to `through` was read.
    private func readReaped(_ s: inout State, _ collection: String, after: Int64, through end: Int64, limit: Int)
        throws -> (records: [ChangeRecord], cut: Int64?)
    {
        let st = try s.db.prepare(
            "SELECT seq, id, state FROM reaped WHERE collection = ? AND seq > ? AND seq <= ? AND state IS NOT NULL "
                + "ORDER BY seq, id LIMIT ?")
        defer { st.reset() }
        var reaped: [ChangeRecord] = []
        var rows = 0
        var lastSeen: Int64?
        func read(after: Int64, through end: Int64, limit: Int64) throws {
            st.reset()
            st.bind(1, collection)
            st.bind(2, after)
            st.bind(3, end)
            st.bind(4, limit)
            while try st.step() {
                rows += 1
                lastSeen = st.int64(0)
                let key = st.string(1) ?? ""
                // A key that no longer parses has nothing a peer could merge.
                guard let id = try? Value.id(ofDocumentKey: key), let state = st.bytes(2) else { continue }
                reaped.append(
                    ChangeRecord(
                        seq: st.int64(0), collection: collection, id: id, key: key, state: state, isDeleted: true))
            }
        }
        let limit = max(1, limit)
        try read(after: after, through: end, limit: Int64(limit))
        guard rows >= limit, let last = lastSeen else { return (reaped, nil) }
        reaped.removeAll { $0.seq == last }
        try read(after: last - 1, through: last, limit: .max)
        return (reaped, last)
    }

    // MARK: Damaged rows

    /// The damaged rows met since the store was opened (a state or JSON value that does not
    /// decode), by collection and canonical `_id` key, with the reason: skipped by reads, queries
    /// and the change log (the rest flows), and replaced by the next good state a peer sends.
    ///
    /// - Complexity: O(d log d) for d damaged rows.
    public func damagedDocuments() -> [(collection: String, key: String, reason: String)] {
        state.withLock { s in
            s.damaged.sorted { ($0.key.collection, $0.key.key) < ($1.key.collection, $1.key.key) }
                .map { (collection: $0.key.collection.string, key: $0.key.key.string, reason: $0.value) }
        }
    }

    /// Remembers a damaged row and logs it the first time.
    func noteDamaged(_ s: inout State, _ collection: String, _ key: String, _ reason: String) {
        let name = DocumentKey(collection: collection, key: key)
        if s.damaged[name] == nil {
            options.log(
                "document \(key) in \(collection) is damaged and skipped (\(reason)); a peer holding it "
                    + "repairs it by sending its state")
        }
        s.damaged[name] = reason
    }

    /// Finds and remembers the live rows of a collection whose JSON value is damaged (after SQLite
    /// refused a query over them).
    func noteDamagedJSON(_ s: inout State, _ collection: String) throws {
        let st = try s.db.prepare(
            "SELECT id FROM documents WHERE \(Self.collectionKeys) AND deleted = 0 AND NOT json_valid(value)")
        st.bind(1, collection)
        var keys: [String] = []
        while try st.step() { keys.append(st.string(0) ?? "") }
        st.reset()
        for key in keys { noteDamaged(&s, collection, key, "its JSON value does not parse") }
    }
}
