internal import CSQLite
import Dispatch
import Synchronization

/// Checkpoints a store's write-ahead log on a background queue, so that the writer's commits
/// never wait for one.
///
/// SQLite's automatic checkpoint runs inside the commit that takes the WAL past 1,000 pages:
/// that commit copies every page back into the database file and syncs both files (about 20 ms
/// on a 100,000-document sync, once every few commits), all under the store's lock. Here the
/// commit hook (`sqlite3_wal_hook`, which replaces the automatic checkpoint) only asks a second
/// connection to run a `PASSIVE` checkpoint on a utility queue; SQLite lets it copy committed
/// pages while the writer appends new ones (https://www.sqlite.org/wal.html, "Checkpointing").
///
/// A passive checkpoint that overlaps commits never finishes the whole log, and the log rewinds
/// only when one does, so the commit that takes the WAL past ``limitFrames`` checkpoints itself,
/// as SQLite would: by then the background has copied almost every page, so that commit copies
/// few and the log rewinds at the next transaction. The WAL stays within about
/// ``limitFrames`` pages. Durability is unchanged: a commit is in the WAL before it returns,
/// whoever copies it later.
///
/// Thread-safety: the hook runs on the writer's thread under the store's lock; the second
/// connection is used only on the checkpointer's serial queue.
final class WALCheckpointer: @unchecked Sendable {
    /// WAL pages after a commit at which a background checkpoint is asked for (SQLite's own
    /// automatic checkpoint threshold).
    static let defaultThreshold: Int32 = 1_000
    /// WAL pages after a commit at which that commit checkpoints itself (about 40 MiB of 4 KiB pages).
    static let defaultLimit: Int32 = 10_000
    let thresholdFrames: Int32
    let limitFrames: Int32

    private let path: String
    private let log: @Sendable (String) -> Void
    private let queue = DispatchQueue(label: "trellis.store.checkpoint", qos: .utility)
    /// Whether a background checkpoint is queued or running.
    private let pending = Atomic<Bool>(false)
    private let stopped = Atomic<Bool>(false)
    /// Checkpoints run, in the background and by the writer (for tests and figures).
    let backgroundRuns = Atomic<Int>(0)
    let writerRuns = Atomic<Int>(0)
    /// The second connection; touched only on `queue`.
    private var connection: Connection?
    private var lastError: String?

    /// Installs the hook on `db` (a write connection in WAL mode to the file at `path`).
    init(
        db: Connection, path: String, threshold: Int32 = defaultThreshold, limit: Int32 = defaultLimit,
        log: @escaping @Sendable (String) -> Void
    ) {
        self.path = path
        self.log = log
        thresholdFrames = threshold
        limitFrames = max(threshold, limit)
        sqlite3_wal_hook(db.handle, walHook, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Called by the hook after each commit with the WAL's size in pages.
    fileprivate func committed(_ db: OpaquePointer, frames: Int32) {
        if frames >= limitFrames {
            // Returns at once (SQLITE_BUSY) when the background checkpoint is running; a later
            // commit tries again.
            if sqlite3_wal_checkpoint_v2(db, nil, SQLITE_CHECKPOINT_PASSIVE, nil, nil) == SQLITE_OK {
                writerRuns.add(1, ordering: .relaxed)
            }
            return
        }
        guard frames >= thresholdFrames, !stopped.load(ordering: .relaxed),
            !pending.exchange(true, ordering: .acquiringAndReleasing)
        else { return }
        queue.async { [self] in
            defer { pending.store(false, ordering: .releasing) }
            guard !stopped.load(ordering: .relaxed) else { return }
            runInBackground()
        }
    }

    private func runInBackground() {
        do {
            if connection == nil {
                let opened = try Connection(path: path)
                // A connection opens the WAL at its first read. Until then a checkpoint through it
                // finds no WAL, does nothing and still returns SQLITE_OK: before this read, no
                // background checkpoint ever copied a page, and the writer copied the whole WAL
                // under the store's lock at the limit.
                try opened.execute("SELECT count(*) FROM sqlite_schema")
                connection = opened
            }
            guard let connection else { return }
            var logFrames: Int32 = -1
            let rc = sqlite3_wal_checkpoint_v2(connection.handle, nil, SQLITE_CHECKPOINT_PASSIVE, &logFrames, nil)
            guard rc == SQLITE_OK || rc == SQLITE_BUSY else { throw connection.error(rc, "checkpointing the WAL") }
            // `logFrames` stays -1 when the connection found no WAL: that checkpoint did nothing.
            if rc == SQLITE_OK, logFrames >= 0 { backgroundRuns.add(1, ordering: .relaxed) }
            lastError = nil
        } catch {
            // The writer checkpoints at the limit meanwhile; said once, not at every commit.
            let message =
                "background WAL checkpoint of \(path) failed: \(error); commits checkpoint at the limit instead"
            if message != lastError { log(message) }
            lastError = message
            connection = nil
        }
    }

    /// Removes the hook from `db` and closes the second connection once a running checkpoint
    /// is done. Call before closing `db`, so that its close checkpoints and removes the WAL.
    func stop(db: Connection) {
        sqlite3_wal_hook(db.handle, nil, nil)
        stopped.store(true, ordering: .relaxed)
        queue.sync { connection = nil }
    }
}

private func walHook(
    _ context: UnsafeMutableRawPointer?, _ db: OpaquePointer?, _ name: UnsafePointer<CChar>?, _ frames: Int32
) -> Int32 {
    guard let context, let db else { return SQLITE_OK }
    Unmanaged<WALCheckpointer>.fromOpaque(context).takeUnretainedValue().committed(db, frames: frames)
    return SQLITE_OK
}
