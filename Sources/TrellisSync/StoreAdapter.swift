public import TrellisCore
public import TrellisStore

extension DocumentStore: SyncStore {
    public var localLog: LocalLog { LocalLog(epoch: epoch, site: siteID, lastSeq: lastSeq) }

    public func scan(_ request: ScanRequest) throws -> ScanPage {
        if let backlog = request.reapedBacklog {
            let page = try reapedTombstones(
                in: request.spec.collection, after: backlog.after, through: backlog.through, limit: request.limit)
            return ScanPage(records: Self.logRecords(page), upTo: page.scannedUpTo, exhausted: page.exhausted)
        }
        // A peer asking again for documents it evicted: read only those rows, and do not track
        // the request as a served query (it is dropped once they arrive); the tombstones and stubs
        // it gets are recorded in the scope of the subscription it was derived from.
        let refetch = Refetch.ids(of: request.spec).map { ids in ids.compactMap { try? DocumentStore.key(for: $0) } }
        let page = try changes(
            in: request.spec.collection, after: request.after, limit: request.limit, maxBytes: request.maxBytes,
            matching: request.query, servedAs: refetch == nil ? request.spec : nil, keys: refetch,
            refetchOf: Refetch.base(of: request.spec), reader: request.reader, reapedAfter: request.reapedAfter)
        return ScanPage(
            records: Self.logRecords(page),
            upTo: page.scannedUpTo, exhausted: page.exhausted,
            remaining: page.exhausted
                ? 0
                : request.countRemaining
                    ? try logEntryCount(in: request.spec.collection, after: page.scannedUpTo) : nil,
            belowFloor: page.belowFloor, floor: page.floor, heldFrom: page.heldFrom)
    }

    /// A change-log page's records as the replicator reads them.
    private static func logRecords(_ page: ChangePage) -> [LogRecord] {
        page.records.map { record in
            LogRecord(
                seq: record.seq, key: record.key,
                document: WireDocument(collection: record.collection, id: record.id, state: record.state),
                holdsUnacknowledgedWrite: record.holdsUnacknowledgedWrite, isEvictionStub: record.isEvictionStub,
                isTombstone: record.isDeleted, delta: record.delta)
        }
    }

    public func apply(_ request: ApplyRequest) throws -> (
        deferred: Int, refusals: [String], withholding: [Value], heldBehind: Int, live: Int, reapedKeys: ReapedKeys?
    ) {
        let outcome = try merge(
            request.documents, from: request.peerKey,
            checkpoint: request.storeCheckpoint
                ? (
                    request.subscription,
                    Checkpoint(epoch: request.peerEpoch, seq: request.upTo, reapedKeys: request.reapedKeys)
                ) : nil,
            heldBy: request.heldBy, heldScans: request.heldScans, unserved: request.unserved)
        let refusals =
            outcome.rejected.map { "refused document \($0.id) of \(request.collection): \($0.reason)" }
            + outcome.deferred.map { "deferred document \($0.key) of \(request.collection): \($0.reason)" }
        return (
            outcome.deferred.count, refusals, outcome.withholding, outcome.heldBehind, outcome.live,
            outcome.storedReapedKeys
        )
    }

    public func retryDeferredDocuments() throws -> (remaining: Int, withholding: [(collection: String, id: Value)]) {
        let outcome = try retryDeferredReporting()
        return (outcome.remaining, outcome.withholding)
    }

    public func reapTombstones(limit: Int) throws -> Bool {
        try reapExpiredTombstones(limit: limit).more
    }

    public func rotatedLog(reason: String) throws -> LocalLog {
        try rotateLog(reason: reason)
        return localLog
    }
}
