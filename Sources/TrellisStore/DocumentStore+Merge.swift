import Foundation
import Synchronization
public import TrellisCore

// Remote merges, deferred documents and checkpoints.
//
// Every document of a remote batch is either applied (or found already known) or kept in the
// `deferred` table, in the same transaction as the batch's checkpoint or an earlier one (a batch
// merged in pieces): a checkpoint never covers a document that is neither applied nor kept. Only
// a document that cannot even be named (a bad `_id`) is rejected.

/// Why a remote state was not applied; decides when trying again can help.
enum DeferralKind: String {
    /// Its latest stamp leads this node's time by more than the allowed drift: retried once the
    /// physical clock or the HLC has come within the drift of it.
    case clock
    /// Its state does not decode here (damaged, or from a newer version).
    case decode
    /// Merged, the document would be above the size limit.
    case size
    /// Merged, the document would not validate (too deep, a bad value).
    case invalid
}

/// The outcome of merging one remote state into the store.
enum StateMerge {
    /// The local state changed and was written.
    case applied
    /// As ``applied``, and the document still withholds a value (an evicted document's stub
    /// brought back by a state without the newest value: docs/MESH.md, "Eviction").
    case appliedWithholding
    /// A stale copy of a document removed here whose tombstone was reaped: merged and removed
    /// again with a new remove stamp (DocumentStore+Tombstones.swift).
    case revived
    /// The local state already held everything in it; `behind` when it has seen more
    /// (``DocumentState/hasSeenMore(than:)``: the sender's state is older than this node's);
    /// `withholding` when the document, brought back from eviction, still withholds a value.
    case unchanged(behind: Bool, withholding: Bool = false)
    /// Not applied: why, and from when (milliseconds) trying again may succeed (clock refusals).
    case refused(DeferralKind, reason: String, ready: UInt64, decoded: DocumentState?)
    /// A delta this node cannot apply now (it does not hold the state the delta is based on, or
    /// the result would be refused): never kept aside; the peer is asked for the whole state.
    case needsWholeState(String)

    /// Whether the document still withholds a value after this merge, applied or not
    /// (``MergeOutcome/withholding``).
    var leavesWithholding: Bool {
        switch self {
        case .appliedWithholding, .unchanged(_, withholding: true): return true
        default: return false
        }
    }
}

extension DocumentStore {
    // MARK: Remote merge

    /// Merges documents from a peer and stores the checkpoint with the last of them, so after a
    /// crash the checkpoint never covers a document that was not applied.
    ///
    /// The batch is one transaction unless a local write waits for the store lock while it runs:
    /// then the merge commits in pieces of at least ``mergePieceMinimum`` documents and
    /// ``mergePieceMinimumTime`` and lets the writers in between them, so a local write waits for
    /// a piece, not for the batch. Readers do not cut a batch (``writersWaiting``).
    /// The checkpoint goes with the last piece; a batch sent again after a crash between pieces
    /// finds the merged documents already held (the merge is a join), so nothing is applied twice.
    /// Each piece is one commit with its own change event.
    ///
    /// Each document is applied (when it adds something) or, when it cannot be applied yet, kept
    /// in the deferred table and reported in ``MergeOutcome/deferred``: a stamp further ahead than
    /// ``StoreOptions/maxClockDrift`` of this node's time (its physical clock or its HLC, whichever
    /// is later), a state that does not decode here, a merged document above the size limit or
    /// one that does not validate. ``retryDeferred()`` applies them once the condition clears.
    /// Per peer and (collection, `_id`) the deferred table keeps one state: the newest, joined with
    /// the one it held when both decode. Only documents whose `_id` is not a valid key are
    /// rejected (``MergeOutcome/rejected``). So the checkpoint never covers a document that was
    /// neither applied nor kept.
    ///
    /// After a document is applied, the clock has moved past its latest stamp.
    ///
    /// - Parameters:
    ///   - documents: the peer's document states.
    ///   - peer: the peer key of the sender.
    ///   - checkpoint: `(subscription key, checkpoint)` to store, or `nil`.
    ///   - holders: the query subscriptions this node serves to the sending peer: the peer holds
    ///     every document it sends, so the store records them in those subscriptions' scope and
    ///     later changes to them go back to the peer even when its queries do not match them
    ///     (DocumentStore+Scope.swift).
    ///   - heldScans: where the scans of `holders` (by ``SubscriptionSpec/key``) have read this
    ///     node's log for the sender in this session; a holder without one carries nothing. A
    ///     document the sender holds an older state of keeps its row's `seq` when every holder
    ///     carries it to the sender: its scan has yet to read the row (the merge records the
    ///     document in every holder's scope), or read it in this session and the document matches
    ///     the holder's query (it was sent then). Otherwise the row is logged again with a new
    ///     `seq`, which every subscriber's scan reads again.
    ///   - unserved: this node serves the peer no query subscription in the documents'
    ///     collection, so no scope records that the peer holds them: the store notes that it
    ///     sent some there after the checkpoint this batch moves on from
    ///     (``servedQueries(peer:subscriptions:askAgain:)``).
    /// - Throws: ``StoreError/deferredLimit(_:)`` when the documents deferred from this peer would
    ///   exceed ``StoreOptions/maxDeferredDocumentsPerPeer`` or
    ///   ``StoreOptions/maxDeferredBytesPerPeer``; ``StoreError`` for SQLite errors. Nothing of the
    ///   piece under way is applied then (pieces committed before it stay), and the checkpoint is
    ///   not stored (the peer sends the batch again).
    /// - Complexity: O(total size of the batch) plus a few indexed lookups per document, and one
    ///   commit per piece.
    public func merge(
        _ documents: [RemoteDocument], from peer: [UInt8], checkpoint: (subscription: String, Checkpoint)?,
        heldBy holders: [SubscriptionSpec] = [], heldScans: [String: HeldScan] = [:], unserved: Bool = false
    ) throws(StoreError) -> MergeOutcome {
        var outcome = MergeOutcome()
        let now = options.now()
        let holders = holders.filter { !$0.isWholeCollection }
        var bound: [(SubscriptionSpec, Query)] = []
        for spec in holders {
            if let query = try? Query(spec.query).bind(args: spec.args) { bound.append((spec, query)) }
        }
        // Decoding, parsing and checking need no lock: done before it is taken.
        let decoded = documents.map { $0.decoded ?? DecodedState($0.state, id: $0.id) }
        // In pieces, as the doc comment says; `next` is where the next piece starts.
        var next = 0
        repeat {
            let start = next
            next = try write(origin: peer) { s in
                var deferredHere = false
                var noted: String?  // the collection last noted as sent unserved
                var live: String?  // the collection of the last live document applied or kept aside
                // A live document applied or kept aside: the other peers' `notAsked` checkpoints in
                // its collection want their reaped tombstones (once per collection and piece).
                func noteLive(_ collection: String) throws {
                    outcome.live += 1
                    guard live != collection else { return }
                    try wantReapedKeys(&s, in: collection, besides: peer)
                    live = collection
                }
                if start == 0 {
                    for (spec, query) in bound { try registerServed(&s, spec, bound: query, now: now) }
                }
                var index = start
                let began = DispatchTime.now().uptimeNanoseconds
                while index < documents.count {
                    if index - start >= Self.mergePieceMinimum, writersWaiting.load(ordering: .relaxed) > 0,
                        DispatchTime.now().uptimeNanoseconds - began >= Self.mergePieceMinimumTime
                    {
                        break
                    }
                    let (remote, incoming) = (documents[index], decoded[index])
                    index += 1
                    let key: String
                    do { key = try incoming.key ?? Self.key(for: remote.id) } catch {
                        outcome.rejected.append((JSON.string(remote.id), "\(error)"))
                        continue
                    }
                    let result = try mergeState(&s, remote.collection, key, remote.id, incoming, now: now)
                    switch result {
                    case .applied, .appliedWithholding, .unchanged, .revived:
                        switch result {
                        case .applied, .appliedWithholding:
                            outcome.applied += 1
                            if incoming.mayBeLive { try noteLive(remote.collection) }
                        case .revived:
                            outcome.applied += 1
                            outcome.revived.append(key)
                        default: break
                        }
                        if result.leavesWithholding { outcome.withholding.append(remote.id) }
                        // The sender holds this document whatever its queries match: later changes to
                        // it go back to it (DocumentStore+Scope.swift).
                        var held = false
                        for (spec, _) in bound where UTF8Key.equal(spec.collection, remote.collection) {
                            try recordHeld(&s, remote.collection, key, by: spec)
                            held = true
                        }
                        if unserved, noted != remote.collection {
                            // The batch's documents come after the checkpoint it moves on from.
                            var since: Int64 = 0
                            if let (subscription, cp) = checkpoint,
                                let stored = try storedCheckpoint(&s, peer, subscription), stored.epoch == cp.epoch
                            {
                                since = stored.seq
                            }
                            try noteUnrecorded(&s, peer, remote.collection, since: since)
                            noted = remote.collection
                        }
                        // The sender holds an older state than this node's (a tombstone, say). When
                        // every one of its query subscriptions here will send the row or sent it in
                        // this session, they carry it (the scope record is made above). Otherwise one
                        // may have passed it (the scope record may be new, or made when another peer
                        // served the same subscription sent the document: records are per
                        // subscription, not per peer), and the sender may cancel the others: the row
                        // is logged again, so the newer state reaches the sender. Logged again, it goes
                        // to every subscriber: a peer that joins a mesh behind on many documents would
                        // otherwise make each of its new peers send them to all the others.
                        if held, case .unchanged(behind: true, _) = result {
                            let (reaches, unread) = try heldRowReachesSender(
                                &s, remote.collection, key, bound, heldScans)
                            if !reaches {
                                try relog(&s, remote.collection, key)
                            } else if unread {
                                outcome.heldBehind += 1
                            }
                        }
                        try dropDeferredIfCovered(&s, remote.collection, key, peer)
                    case .needsWholeState(let reason):
                        // Nothing of this piece is kept and no checkpoint is stored: the replicator
                        // asks the peer for the subscription again, without deltas.
                        throw StoreError.needsWholeState("document \(key) of \(remote.collection): \(reason)")
                    case .refused(let kind, let reason, let ready, let decoded):
                        try keepDeferred(
                            &s, remote.collection, key, peer, remote.state, decoded, kind, reason, ready: ready,
                            now: now)
                        outcome.deferred.append((key, reason))
                        deferredHere = true
                        // Kept to be applied later: as good as live for the checkpoints of other
                        // peers (the retry runs without a sender to ask them again).
                        if incoming.mayBeLive { try noteLive(remote.collection) }
                    }
                }
                if deferredHere { try checkDeferredBounds(&s, peer) }
                if index == documents.count, let (subscription, cp) = checkpoint {
                    let st = try s.db.prepare(
                        "INSERT OR REPLACE INTO checkpoints(peer, subscription, epoch, seq, collection, reaped) "
                            + "VALUES (?,?,?,?,?,?)")
                    st.bind(1, peer)
                    st.bind(2, subscription)
                    st.bind(3, cp.epoch)
                    st.bind(4, cp.seq)
                    // Kept beside the checkpoint so an evict finds its collection's checkpoints.
                    let collection = SubscriptionSpec.collection(ofKey: subscription)
                    st.bind(5, collection)
                    let reaped = checkpointReapedKeys(s, cp.reapedKeys, collection)
                    st.bind(6, Int64(reaped.rawValue))
                    defer { st.reset() }
                    try st.run()
                    outcome.storedReapedKeys = reaped
                }
                return index
            }
            if next < documents.count { letWaitersIn() }
        } while next < documents.count
        for (key, reason) in outcome.deferred {
            options.log("deferred document \(key) from peer \(Self.hex(Array(peer.prefix(8)))): \(reason)")
        }
        if !outcome.revived.isEmpty {
            options.log(
                "peer \(Self.hex(Array(peer.prefix(8)))) sent \(outcome.revived.count) documents removed here before "
                    + "their tombstones were reaped (first: \(outcome.revived[0])), with nothing newer than the remove: "
                    + "they stay removed, and the remove is sent again to whoever still holds them")
        }
        return outcome
    }

    /// The fewest documents a piece of a remote merge commits before it lets waiting writers
    /// have the store lock (``merge(_:from:checkpoint:heldBy:unserved:)``).
    static let mergePieceMinimum = 4
    /// The least time (nanoseconds) a piece of a remote merge runs before it lets waiting writers
    /// in: 0.25 ms, so that a writer that answers every commit (an observer writing back) costs a
    /// merge at most one commit per 0.25 ms of merging, not one per 4 documents.
    static let mergePieceMinimumTime: UInt64 = 250_000

    /// Between two pieces of a merge: gives the writers waiting for the store lock up to 2 ms to
    /// take it before the merge takes it again (the lock is not fair: released and taken back at
    /// once, it would usually go to the merge again).
    private func letWaitersIn() {
        let deadline = DispatchTime.now().uptimeNanoseconds + 2_000_000
        while writersWaiting.load(ordering: .relaxed) > 0, DispatchTime.now().uptimeNanoseconds < deadline {
            sched_yield()
        }
    }

    /// Merges one remote state into the stored document (inside a write transaction).
    ///
    /// - Throws: SQLite errors only; every refusal is a ``StateMerge/refused(_:reason:ready:decoded:)``.
    func mergeState(
        _ s: inout State, _ collection: String, _ key: String, _ id: Value, _ decoded: DecodedState, now: UInt64
    ) throws -> StateMerge {
        // A damaged row (its state or its JSON does not decode) is replaced by the good state.
        var repair = s.damaged[DocumentKey(collection: collection, key: key)] != nil
        if decoded.isDelta { return try mergeDelta(&s, collection, key, id, decoded, repair: repair, now: now) }
        var stored: Row?
        if case .failure(let error) = decoded.form {
            return .refused(
                .decode, reason: "its state does not decode here (\(error)); kept until a version that reads it",
                ready: 0, decoded: nil)
        }
        if case .success(.single(let single, let parsed)) = decoded.form, !repair, s.reapedRows == 0,
            s.servedScopes[UTF8Key(collection)]?.isEmpty ?? true,
            let merged = try mergeNewSingleWrite(&s, collection, key, id, single, parsed, now: now, ifAbsent: true)
        {
            // The common case of a first sync: a document written once, new here, stored as it came
            // by one insert that finds no row. Anything else (a row, a refusal) is decided below.
            return merged
        }
        do { stored = try row(&s, collection, key) } catch StoreError.corrupt { repair = true }
        if case .success(.single(let single, let parsed)) = decoded.form, stored == nil, !repair,
            try reapedRemoval(&s, collection, key) == nil
        {
            // A document written once, new here, in a collection whose served scopes track it or
            // with reaped keys to check. It is stored as it came, without building its per-field state.
            if let merged = try mergeNewSingleWrite(&s, collection, key, id, single, parsed, now: now) { return merged }
        }
        let incoming = try decoded.state()
        if let reaped = stored, reaped.seq == Self.reapedRowSeq, !repair {
            // A state for a document whose tombstone was reaped here, kept with its state: merged
            // into that tombstone, as if it had not been reaped. What it adds that the remove did
            // not cover (a write the remover had not seen) comes back, and only that. A copy that
            // adds nothing to it, or only what the remove covers, is a stale copy of the removed
            // document (its sender was away longer than the TTL, or relays for one): the remove
            // is made again with a new stamp, so it reaches whoever still holds the document.
            var doc = reaped.state
            let changed = doc.merge(incoming)
            if !incoming.isDeleted, !changed || doc.isDeleted {
                s.clock.receive(incoming.maxTime, physicalMillis: max(now, s.clock.last.millis))
                doc.remove(stamp: s.stamp(now: now))
                try persist(&s, collection, key, id, doc)
                return .revived
            }
            if !changed { return .unchanged(behind: false) }
        }
        if stored == nil, !repair, let removedAt = try reapedRemoval(&s, collection, key),
            incoming.maxTime.millis <= removedAt
        {
            // A copy from before the remove of a document whose tombstone was reaped here (its sender
            // was away longer than the TTL, or relays for one): the remove is made again, with a new
            // stamp, so it reaches whoever still holds the document. A tombstone adds nothing.
            guard !incoming.isDeleted else { return .unchanged(behind: false) }
            s.clock.receive(incoming.maxTime, physicalMillis: max(now, s.clock.last.millis))
            var doc = incoming
            doc.remove(stamp: s.stamp(now: now))
            try persist(&s, collection, key, id, doc)
            return .revived
        }
        var doc = stored?.state ?? DocumentState()
        var changed = doc.merge(incoming)
        // The sender's state holds the whole result: whatever write of this node the row held, a
        // peer has it now, and the row holds none that no peer has (``WriteOrigin/heldBySender``).
        let heldBySender = changed && doc == incoming
        // What the merge brought and reaping drops again (remove contexts of removed fields this
        // node has already reaped, from a peer that has not yet) is no change: no new `seq`, so
        // two nodes whose clocks differ do not send the document back and forth.
        if changed, doc.reapRemovedFields(before: fieldReapHorizon(now: now)), let stored, doc == stored.state {
            changed = false
        }
        // Merging into an evicted document's stub brings the document back, even when the state
        // adds nothing to the stub.
        guard changed || stored?.kind == .stub || repair else {
            // The sender wrote to an eviction stub and passes on entries without their values
            // (rule 8) that this node holds with values: the row is logged again, so the values
            // go back to it and on to whoever it passed the withheld entries to. Nothing else
            // would send them: every checkpoint here is past this row.
            if stored != nil, case let withheld = incoming.withheldEntryCount, withheld > 0,
                withheld > doc.withheldEntryCount
            {
                try relog(&s, collection, key)
            }
            // Behind: this node's state would add to the sender's. One that only lacks remove records
            // reaped here adds nothing (relogging it would send the document back and forth
            // between two query peers for good).
            // Still withholding a value (the store lists it, DocumentStore+Withholding.swift): each
            // copy that adds nothing is reported too, so that it does not end the refetch.
            let withholding =
                s.withholdingRows > 0 && stored?.kind == .live && !doc.isDeleted && doc.withheldEntryCount > 0
            guard doc != incoming else {
                // The sender holds exactly this tombstone: a remove of this node in it has reached
                // a peer, whose acknowledgement may have been lost (a reset connection).
                if stored?.kind == .tombstone { try markHeldTombstone(&s, collection, key) }
                return .unchanged(behind: false, withholding: withholding)
            }
            var probe = incoming
            return .unchanged(behind: probe.merge(doc), withholding: withholding)
        }
        let (horizon, tooFarAhead) = driftCheck(
            clock: s.clock.last, latest: incoming.maxTime, now: now, decoded: incoming)
        if let tooFarAhead { return tooFarAhead }
        do {
            try persist(&s, collection, key, id, doc, origin: heldBySender ? .heldBySender : .merged)
        } catch let error as StoreError {
            switch error {
            case .documentTooLarge:
                return .refused(.size, reason: error.description, ready: 0, decoded: incoming)
            case .invalidValue:
                return .refused(.invalid, reason: error.description, ready: 0, decoded: incoming)
            default:
                throw error
            }
        }
        s.clock.receive(incoming.maxTime, physicalMillis: horizon)
        if repair { options.log("document \(key) in \(collection) was damaged and is repaired from a peer's state") }
        let withholds = !doc.isDeleted && doc.withheldEntryCount > 0
        try noteWithholding(&s, collection, key, withholds)
        return withholds ? .appliedWithholding : .applied
    }

    /// Marks a tombstone's row as holding no write of this node that no peer has (`unacked`
    /// NULL; ``WriteOrigin/heldBySender``): its sender holds it exactly. One indexed write, and
    /// none when it is marked already.
    private func markHeldTombstone(_ s: inout State, _ collection: String, _ key: String) throws {
        let st = try s.db.prepare(
            "UPDATE documents SET unacked = NULL WHERE k = trellis_key(?, ?) "
                + "AND deleted = \(RowKind.tombstone.rawValue) AND unacked IS NOT NULL")
        st.bind(1, collection)
        st.bind(2, key)
        try st.run()
    }

    /// Merges a delta (``StateDelta``) into the stored document, when the stored state covers the
    /// delta's base (``DocumentState/covers(base:)``: no value withheld either) and is whole here
    /// (not an eviction stub, not damaged), and
    /// the result would be applied (not too far ahead, not too large, valid). Otherwise the delta
    /// is not kept aside as a state would be: ``StateMerge/needsWholeState(_:)``, and the peer
    /// sends the whole state, which takes the usual way (deferred, if it must be).
    private func mergeDelta(
        _ s: inout State, _ collection: String, _ key: String, _ id: Value, _ decoded: DecodedState, repair: Bool,
        now: UInt64
    ) throws -> StateMerge {
        let delta: StateDelta
        switch decoded.form {
        case .success(.delta(let d)): delta = d
        case .failure(let error): return .needsWholeState("its delta does not decode (\(error))")
        default: return .needsWholeState("it is not a delta")
        }
        guard !repair else { return .needsWholeState("the document is damaged here") }
        let stored: Row?
        do { stored = try row(&s, collection, key) } catch StoreError.corrupt {
            return .needsWholeState("the document is damaged here")
        }
        guard let stored else { return .needsWholeState("this node holds no state of it") }
        guard stored.kind != .stub else { return .needsWholeState("it is evicted here") }
        guard stored.state.covers(base: delta.base) else {
            return .needsWholeState(
                "this node has not seen the state the delta is based on, or withholds some of its values")
        }
        var doc = stored.state
        var changed = doc.merge(delta)
        if changed, doc.reapRemovedFields(before: fieldReapHorizon(now: now)), doc == stored.state { changed = false }
        // The sender's state is within this one (it covers the base, and the delta added nothing):
        // behind when this one has seen more, by the causal context the delta carries whole.
        guard changed else { return .unchanged(behind: doc.hasSeenMore(than: delta.state)) }
        let latest = delta.state.maxTime
        let (horizon, tooFarAhead) = driftCheck(clock: s.clock.last, latest: latest, now: now, decoded: nil)
        if let tooFarAhead, case .refused(_, let reason, _, _) = tooFarAhead { return .needsWholeState(reason) }
        do {
            try persist(&s, collection, key, id, doc, origin: .merged)
        } catch let error as StoreError {
            guard error.refusesOneDocument else { throw error }
            return .needsWholeState(error.description)
        }
        s.clock.receive(latest, physicalMillis: horizon)
        return .applied
    }

    /// Stores a single-write state of a document this node holds no row for (nor a reaped key):
    /// the fast path of ``mergeState(_:_:_:_:_:now:)``, with the same checks (the clock drift,
    /// the size limit; the `_id` and the value were checked when it was decoded).
    ///
    /// - Parameter ifAbsent: write only when the document has no row; then `nil` (nothing
    ///   written) when it has one or when the state would be refused, for the caller to decide
    ///   with the stored row in hand.
    private func mergeNewSingleWrite(
        _ s: inout State, _ collection: String, _ key: String, _ id: Value, _ single: SingleWriteState,
        _ parsed: SingleWriteState.Document?, now: UInt64, ifAbsent: Bool = false
    ) throws -> StateMerge? {
        func document() throws -> SingleWriteState.Document {
            do { return try DecodedState.document(single, parsed, id: id) } catch {
                throw StoreError.invalidValue("document \(key): \(error)")
            }
        }
        func state() -> DocumentState? {
            (try? document()).map { DocumentState(fields: $0.fields, stamp: single.stamp) }
        }
        let (horizon, tooFarAhead) = driftCheck(
            clock: s.clock.last, latest: single.stamp.time, now: now, decoded: state())
        if let tooFarAhead { return ifAbsent ? nil : tooFarAhead }
        do {
            let written = try persistSingleWrite(
                &s, collection, key, stamp: single.stamp, json: parsed?.json ?? single.json, ifAbsent: ifAbsent,
                origin: .merged, document: document)
            guard written else { return nil }
        } catch let error as StoreError {
            switch error {
            case .documentTooLarge:
                return ifAbsent ? nil : .refused(.size, reason: error.description, ready: 0, decoded: state())
            case .invalidValue:
                return ifAbsent ? nil : .refused(.invalid, reason: error.description, ready: 0, decoded: nil)
            default: throw error
            }
        }
        s.clock.receive(single.stamp.time, physicalMillis: horizon)
        return .applied
    }

    /// This node's time and, when a state's latest stamp leads it by more than
    /// ``StoreOptions/maxClockDrift``, the refusal that defers the state.
    ///
    /// A stamp far ahead would win every later local write to its fields until the clock caught
    /// up. The HLC spreads the fastest clock of the mesh, so the bound is taken from the later of
    /// the physical clock and the HLC: a node whose own clock is behind defers instead of
    /// dropping, and accepts once its clock or its HLC has moved.
    ///
    /// - Parameter clock: this node's HLC.
    /// - Returns: the later of `now` and the HLC (milliseconds), and the refusal or `nil`.
    private func driftCheck(
        clock: HLCTimestamp, latest stamp: HLCTimestamp, now: UInt64, decoded: @autoclosure () -> DocumentState?
    ) -> (horizon: UInt64, refusal: StateMerge?) {
        let horizon = max(now, clock.millis)
        let latest = stamp.millis
        guard latest > horizon, latest - horizon > options.maxClockDrift else { return (horizon, nil) }
        let reason =
            "it carries a stamp \(latest - horizon) ms ahead of this node's clock, more than the allowed "
            + "\(options.maxClockDrift) ms; kept until the clock reaches it (if this node's clock is right, "
            + "fix the writer's clock)"
        return (horizon, .refused(.clock, reason: reason, ready: latest - options.maxClockDrift, decoded: decoded()))
    }

    // MARK: Deferred documents

    /// Keeps a refused state in the deferred table: the newest per (collection, key, peer), joined
    /// with the one kept before when both decode.
    private func keepDeferred(
        _ s: inout State, _ collection: String, _ key: String, _ peer: [UInt8], _ bytes: [UInt8],
        _ decoded: DocumentState?, _ kind: DeferralKind, _ reason: String, ready: UInt64, now: UInt64
    ) throws {
        let old = try s.db.prepare(
            "SELECT state, since, attempts, kind FROM deferred WHERE collection = ? AND id = ? AND peer = ?")
        old.bind(1, collection)
        old.bind(2, key)
        old.bind(3, peer)
        var stored = bytes
        var kind = kind
        var ready = ready
        var since = now
        var attempts: Int64 = 0
        let existed = try old.step()
        if existed {
            since = UInt64(max(0, old.int64(1)))
            attempts = old.int64(2)
            if var decoded, let previous = old.bytes(0),
                let before = try? DocumentState(bytes: previous)
            {
                decoded.merge(before)
                stored = decoded.cbor()
                if kind == .clock || DeferralKind(rawValue: old.string(3) ?? "") == .clock {
                    let latest = decoded.maxTime.millis
                    kind = .clock
                    ready = latest > options.maxClockDrift ? latest - options.maxClockDrift : 0
                }
            }
        }
        old.reset()
        if kind != .clock { ready = now &+ Self.retryDelay(attempts: attempts) }
        let st = try s.db.prepare(
            "INSERT OR REPLACE INTO deferred(collection, id, peer, state, reason, kind, ready, since, attempts) "
                + "VALUES (?,?,?,?,?,?,?,?,?)")
        st.bind(1, collection)
        st.bind(2, key)
        st.bind(3, peer)
        st.bind(4, stored)
        st.bind(5, reason)
        st.bind(6, kind.rawValue)
        st.bind(7, Int64(clamping: ready))
        st.bind(8, Int64(clamping: since))
        st.bind(9, attempts)
        try st.run()
        if !existed { s.deferredRows += 1 }
    }

    /// How long a refusal other than the clock waits before it is tried again: one second, doubling
    /// with each attempt, at most an hour (a new open tries them all again).
    static func retryDelay(attempts: Int64) -> UInt64 {
        min(1000 << UInt64(min(max(attempts, 0), 12)), 3_600_000)
    }

    /// Deletes the state deferred from `peer` for a document once the stored document holds all of it.
    private func dropDeferredIfCovered(_ s: inout State, _ collection: String, _ key: String, _ peer: [UInt8])
        throws
    {
        guard s.deferredRows > 0 else { return }
        let st = try s.db.prepare("SELECT state FROM deferred WHERE collection = ? AND id = ? AND peer = ?")
        st.bind(1, collection)
        st.bind(2, key)
        st.bind(3, peer)
        guard try st.step(), let bytes = st.bytes(0) else {
            st.reset()
            return
        }
        st.reset()
        guard let pending = try? DocumentState(bytes: bytes),
            var doc = try? load(&s, collection, key), !doc.merge(pending)
        else { return }
        try deleteDeferred(&s, collection, key, peer)
    }

    private func deleteDeferred(_ s: inout State, _ collection: String, _ key: String, _ peer: [UInt8]) throws {
        let del = try s.db.prepare("DELETE FROM deferred WHERE collection = ? AND id = ? AND peer = ?")
        del.bind(1, collection)
        del.bind(2, key)
        del.bind(3, peer)
        try del.run()
        s.deferredRows -= s.db.changes
    }

    /// Throws ``StoreError/deferredLimit(_:)`` when the documents deferred from `peer` exceed the bounds.
    private func checkDeferredBounds(_ s: inout State, _ peer: [UInt8]) throws {
        let st = try s.db.prepare("SELECT count(*), coalesce(sum(length(state)), 0) FROM deferred WHERE peer = ?")
        st.bind(1, peer)
        defer { st.reset() }
        _ = try st.step()
        let (count, bytes) = (Int(st.int64(0)), Int(st.int64(1)))
        guard count > options.maxDeferredDocumentsPerPeer || bytes > options.maxDeferredBytesPerPeer else { return }
        throw StoreError.deferredLimit(
            "refused a batch from peer \(Self.hex(Array(peer.prefix(8)))): it would leave \(count) documents "
                + "(\(bytes) bytes) from that peer deferred, above the limit of "
                + "\(options.maxDeferredDocumentsPerPeer) documents or \(options.maxDeferredBytesPerPeer) bytes; "
                + "nothing of the batch was applied and its checkpoint was not stored, so it will be sent again "
                + "(see the deferred documents for why they wait)")
    }

    /// Merges again the deferred documents whose condition may have cleared: clock refusals whose
    /// stamp this node's time (physical clock or HLC) has come within the drift of, and the others
    /// after a delay that doubles with each attempt (one second to one hour; all of them again
    /// after the store is opened). Meant to run on a timer; it takes the store lock for one small
    /// transaction at a time, so writes and merges go on in between.
    ///
    /// A document applied, or found already held, leaves the table; one still refused stays with
    /// its new reason and one more attempt counted.
    ///
    /// - Returns: how many were applied, and how many stay deferred.
    /// - Throws: ``StoreError`` for SQLite errors (the transactions committed before stay).
    /// - Complexity: O(size of the states tried), 128 per transaction.
    public func retryDeferred() throws(StoreError) -> (applied: Int, remaining: Int) {
        let outcome = try retryDeferredReporting()
        return (outcome.applied, outcome.remaining)
    }

    /// ``retryDeferred()``, also naming the documents applied that still withhold a value
    /// (``MergeOutcome/withholding``), by collection.
    public func retryDeferredReporting() throws(StoreError) -> (
        applied: Int, remaining: Int, withholding: [(collection: String, id: Value)]
    ) {
        guard !options.readOnly else { return (0, try withState { $0.deferredRows }, []) }
        let now = options.now()
        var applied = 0
        var withholding: [(collection: String, id: Value)] = []
        while true {
            let (count, more) = try write { s -> (Int, Bool) in
                guard s.deferredRows > 0 else { return (0, false) }
                let horizon = max(now, s.clock.last.millis)
                let st = try s.db.prepare(
                    "SELECT collection, id, peer, state, attempts FROM deferred "
                        + "WHERE (kind = 'clock' AND ready <= ?) OR (kind != 'clock' AND ready <= ?) "
                        + "ORDER BY collection, id, peer LIMIT 128")
                st.bind(1, Int64(clamping: horizon))
                st.bind(2, Int64(clamping: now))
                var rows: [(collection: String, key: String, peer: [UInt8], state: [UInt8], attempts: Int64)] = []
                while try st.step() {
                    rows.append(
                        (st.string(0) ?? "", st.string(1) ?? "", st.bytes(2) ?? [], st.bytes(3) ?? [], st.int64(4)))
                }
                st.reset()
                var count = 0
                for row in rows {
                    guard let id = try? JSON.parse(row.key) else {
                        try deleteDeferred(&s, row.collection, row.key, row.peer)  // not a key this store wrote
                        continue
                    }
                    let decoded = DecodedState(row.state, id: id)
                    let result = try mergeState(&s, row.collection, row.key, id, decoded, now: now)
                    if result.leavesWithholding { withholding.append((row.collection, id)) }
                    switch result {
                    case .applied, .appliedWithholding, .revived:
                        count += 1
                        try deleteDeferred(&s, row.collection, row.key, row.peer)
                        // Marked when it was kept aside; again here for rows an earlier version kept.
                        if decoded.mayBeLive { try wantReapedKeys(&s, in: row.collection, besides: row.peer) }
                    case .unchanged, .needsWholeState:
                        // (A delta is never kept aside, so none is retried.)
                        try deleteDeferred(&s, row.collection, row.key, row.peer)
                    case .refused(let kind, let reason, let ready, _):
                        let update = try s.db.prepare(
                            "UPDATE deferred SET reason = ?, kind = ?, ready = ?, attempts = attempts + 1 "
                                + "WHERE collection = ? AND id = ? AND peer = ?")
                        update.bind(1, reason)
                        update.bind(2, kind.rawValue)
                        update.bind(
                            3,
                            Int64(clamping: kind == .clock ? ready : now &+ Self.retryDelay(attempts: row.attempts + 1))
                        )
                        update.bind(4, row.collection)
                        update.bind(5, row.key)
                        update.bind(6, row.peer)
                        try update.run()
                    }
                }
                return (count, rows.count == 128)
            }
            applied += count
            if !more { break }
        }
        return (applied, try withState { $0.deferredRows }, withholding)
    }

    /// The remote documents kept because they could not be applied yet, oldest first.
    ///
    /// - Complexity: O(n) in the deferred documents.
    public func deferredDocuments() throws(StoreError) -> [DeferredDocument] {
        try withState { s -> [DeferredDocument] in
            guard s.deferredRows > 0 else { return [] }
            let st = try s.db.prepare(
                "SELECT collection, id, peer, reason, since, attempts FROM deferred ORDER BY since, collection, id, peer"
            )
            defer { st.reset() }
            var out: [DeferredDocument] = []
            while try st.step() {
                out.append(
                    DeferredDocument(
                        collection: st.string(0) ?? "", key: st.string(1) ?? "", peer: st.bytes(2) ?? [],
                        reason: st.string(3) ?? "", since: UInt64(max(0, st.int64(4))), attempts: Int(st.int64(5))))
            }
            return out
        }
    }

    // MARK: Checkpoints

    /// The checkpoint stored for a peer and subscription, if any.
    public func checkpoint(peer: [UInt8], subscription: String) throws(StoreError) -> Checkpoint? {
        try withState { s -> Checkpoint? in try storedCheckpoint(&s, peer, subscription) }
    }

    func storedCheckpoint(_ s: inout State, _ peer: [UInt8], _ subscription: String) throws -> Checkpoint? {
        let st = try s.db.prepare("SELECT epoch, seq, reaped FROM checkpoints WHERE peer = ? AND subscription = ?")
        st.bind(1, peer)
        st.bind(2, subscription)
        defer { st.reset() }
        guard try st.step() else { return nil }
        return Checkpoint(epoch: st.bytes(0) ?? [], seq: st.int64(1), reapedKeys: Self.reapedKeys(st.int64(2)))
    }

    /// Every checkpoint stored for a peer, by subscription key, compared byte-wise: the keys of
    /// two subscriptions to collections named alike in another Unicode form ("é" and "e" +
    /// U+0301) are two keys, each with its own checkpoint.
    ///
    /// - Complexity: O(k log n) for the peer's k checkpoints.
    public func checkpoints(peer: [UInt8]) throws(StoreError) -> [UTF8Key: Checkpoint] {
        try withState { s -> [UTF8Key: Checkpoint] in
            let st = try s.db.prepare("SELECT subscription, epoch, seq, reaped FROM checkpoints WHERE peer = ?")
            st.bind(1, peer)
            defer { st.reset() }
            var out: [UTF8Key: Checkpoint] = [:]
            while try st.step() {
                out[UTF8Key(st.string(0) ?? "")] = Checkpoint(
                    epoch: st.bytes(1) ?? [], seq: st.int64(2), reapedKeys: Self.reapedKeys(st.int64(3)))
            }
            return out
        }
    }

    /// The ``ReapedKeys`` a `reaped` column holds; a value no version writes reads as
    /// ``ReapedKeys/wanted`` (asking again costs a page of tombstones, missing them a removed
    /// document shown).
    static func reapedKeys(_ raw: Int64) -> ReapedKeys {
        ReapedKeys(rawValue: Int(clamping: raw)) ?? .wanted
    }

    /// Another peer than `peer` brought live documents of `collection`, or (`peer` `nil`) a local
    /// write created one: they may be copies of documents, or new documents with the `_id`s of
    /// documents, that a peer whose checkpoint in the collection is ``ReapedKeys/notAsked``
    /// removed and reaped, so those checkpoints now want the peer's reaped tombstones
    /// (``ReapedKeys/wanted``).
    ///
    /// - Complexity: O(c log n) for the c checkpoints of the collection.
    func wantReapedKeys(_ s: inout State, in collection: String, besides peer: [UInt8]?) throws {
        // 2: ReapedKeys.wanted, 1: ReapedKeys.notAsked (constant texts: the statements are cached).
        let st = try s.db.prepare(
            peer == nil
                ? "UPDATE checkpoints SET reaped = 2 WHERE collection = ? AND reaped = 1"
                : "UPDATE checkpoints SET reaped = 2 WHERE collection = ? AND reaped = 1 AND peer != ?")
        st.bind(1, collection)
        if let peer { st.bind(2, peer) }
        defer { st.reset() }
        try st.run()
    }

    /// Marks this node's ``ReapedKeys/notAsked`` checkpoints in `collection` on peers other than
    /// `peer` ``ReapedKeys/wanted``, in a transaction of its own: `peer` asked this node with `h`
    /// there, so it may hold documents the other peers removed and reaped, whose tombstones this
    /// node fetches for it (docs/DATA-MODEL.md, "A subscriber from 0 that holds rows").
    ///
    /// - Throws: ``StoreError`` when the store cannot be written.
    /// - Complexity: O(checkpoints stored).
    public func wantReapedKeys(in collection: String, besides peer: [UInt8]) throws(StoreError) {
        try write { s in try wantReapedKeys(&s, in: collection, besides: peer) }
    }

    /// A local write created a document of `collection` (it had no row, nor a reaped tombstone
    /// kept with its state) with an `_id` the caller gave (a UUID made for the write is new
    /// everywhere): a peer may have removed and reaped a document with that `_id` before this
    /// node's requests began, and only its reaped tombstone would tell this node. The
    /// peers' ``ReapedKeys/notAsked`` checkpoints in the collection now want them
    /// (``wantReapedKeys(_:in:besides:)``), and the commit's event names the collection
    /// (``StoreEvent/createdCollections``). Once per collection and transaction; the checkpoints
    /// are marked by the first creation in the collection since the store opened only: it leaves
    /// none `notAsked` there, and ``checkpointReapedKeys(_:_:_:)`` stores none since.
    ///
    /// - Complexity: O(1) but for the first creation in the collection since the store opened,
    ///   which is as ``wantReapedKeys(_:in:besides:)``.
    func noteCreated(_ s: inout State, _ collection: String) throws {
        if s.createdIn.contains(where: { $0 == collection }) { return }
        s.createdIn.append(collection)
        if s.createdSinceOpen.insert(collection).inserted { try wantReapedKeys(&s, in: collection, besides: nil) }
    }

    /// What a checkpoint stored now in `collection` says of its peer's reaped tombstones, asked
    /// to say `requested`: ``ReapedKeys/wanted`` for ``ReapedKeys/notAsked`` when a local write
    /// created a document of the collection since the store was opened. The sync engine hears of
    /// a local write after its commit, so a batch of a request made before the write, without
    /// `h`, can store its checkpoint in between, and ``noteCreated(_:_:)`` found no row to mark
    /// then. Only such a request stores `notAsked` after a creation: one made after it says `h`
    /// (the node holds rows) unless a `notAsked` checkpoint on the peer keeps it off, and the
    /// creation marked every one of those. A creation before the store was opened is in a row,
    /// and every request since said `h` or resumed a marked checkpoint.
    func checkpointReapedKeys(_ s: State, _ requested: ReapedKeys, _ collection: String) -> ReapedKeys {
        requested == .notAsked && s.createdSinceOpen.contains(collection) ? .wanted : requested
    }
}
