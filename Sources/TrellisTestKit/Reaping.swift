import TrellisCore
public import TrellisStore

extension DocumentStore {
    /// Acknowledges every change-log entry that holds a write of this node no peer has
    /// acknowledged, as a peer that took the whole log would (``DocumentStore/acknowledge(_:)``),
    /// then runs the reaper once (``DocumentStore/reapExpiredTombstones(limit:)``): for tests of
    /// a store alone, whose own removes the reaper otherwise keeps until a peer has them.
    ///
    /// - Complexity: O(n) over the change log of every collection holding rows.
    @discardableResult
    public func reapOnceAcknowledged(limit: Int = 1000) throws -> ReapResult {
        try acknowledgeEveryWrite()
        return try reapExpiredTombstones(limit: limit)
    }

    /// Acknowledges every change-log entry that holds a write of this node no peer has
    /// acknowledged, as a peer that took the whole log would.
    ///
    /// - Complexity: O(n) over the change log of every collection holding rows.
    public func acknowledgeEveryWrite() throws {
        for collection in try collectionsHoldingRows() {
            var after: Int64 = 0
            while true {
                let page = try changes(in: collection, after: after, limit: 1_000, maxBytes: .max)
                try acknowledge(
                    page.records.filter(\.holdsUnacknowledgedWrite).map {
                        AcknowledgedEntry(
                            collection: collection, key: $0.key, seq: $0.seq, isEvictionStub: $0.isEvictionStub,
                            isTombstone: $0.isDeleted)
                    })
                after = page.scannedUpTo
                if page.exhausted { break }
            }
        }
    }
}
