public import TrellisCore
public import TrellisStore

extension DocumentStore: SyncStore {
    public var localLog: LocalLog { LocalLog(epoch: epoch, site: siteID, lastSeq: lastSeq) }

    public func rescanGenerations() throws -> [String: UInt32] { [:] }

    public func scan(_ request: ScanRequest) throws -> ScanPage {
        let page = try changes(
            in: request.spec.collection, after: request.after, limit: request.limit, matching: request.query)
        var records: [LogRecord] = []
        var bytes = 0
        for record in page.records {
            records.append(
                LogRecord(
                    seq: record.seq, key: JSON.string(record.id),
                    document: WireDocument(collection: record.collection, id: record.id, state: record.state)))
            bytes += record.state.count
            if bytes >= request.maxBytes, record.seq < page.scannedUpTo {
                return ScanPage(records: records, upTo: record.seq, exhausted: false)
            }
        }
        return ScanPage(records: records, upTo: page.scannedUpTo, exhausted: page.exhausted)
    }

    public func apply(_ request: ApplyRequest) throws -> (deferred: Int, refusals: [String]) {
        let outcome = try merge(
            request.documents, from: request.peerKey,
            checkpoint: request.storeCheckpoint
                ? (request.subscription, Checkpoint(epoch: request.peerEpoch, seq: request.upTo)) : nil)
        return (0, outcome.rejected.map { "refused document \($0.id): \($0.reason)" })
    }

    public func retryDeferred() throws -> Int { 0 }

    public func rotateLog(reason: String) throws -> LocalLog { localLog }
}
