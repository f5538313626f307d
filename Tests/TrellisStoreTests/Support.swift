import Synchronization
import TrellisCore
import TrellisStore
import TrellisTestKit

/// Opens (creating) the store `name` in `dir` on a test clock, its log collected in `log` (or
/// dropped), with `configure` applied to the options last.
func openStore(
    _ dir: TemporaryDirectory, _ name: String, clock: ManualClock, log: LogLines? = nil,
    _ configure: (inout StoreOptions) -> Void = { _ in }
) throws -> DocumentStore {
    var options = StoreOptions()
    options.now = clock.source
    options.elapsed = clock.source  // the manual clock's advances are time passing
    options.log = { line in log?.append(line) }
    configure(&options)
    return try DocumentStore(path: dir.path(name), options: options)
}

/// Everything in one collection of `store`'s change log, as a peer's batch.
func batch(of store: DocumentStore, _ collection: String = "c") throws -> [RemoteDocument] {
    try store.changes(in: collection, after: 0, limit: 100_000, maxBytes: .max).records.map {
        RemoteDocument(collection: $0.collection, id: $0.id, state: $0.state)
    }
}

/// Records that a peer acknowledged every entry of a collection's log, as after a sync: this
/// node's writes are then held elsewhere, an eviction may drop their values, and the reaper may
/// take its tombstones.
func acknowledgeAll(_ store: DocumentStore, _ collection: String = "c") throws {
    try store.acknowledge(
        store.changes(in: collection, after: 0, limit: 100_000, maxBytes: .max).records.map {
            AcknowledgedEntry(collection: $0.collection, key: $0.key, seq: $0.seq, isTombstone: $0.isDeleted)
        })
}

/// Log lines collected from a store's `log` option.
final class LogLines: Sendable {
    private let storage = Mutex<[String]>([])
    func append(_ line: String) { storage.withLock { $0.append(line) } }
    var lines: [String] { storage.withLock { $0 } }
}
