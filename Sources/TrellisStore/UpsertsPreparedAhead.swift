// A large batched upsert checks and encodes its documents on a second thread while the store's
// writer stores the ones already prepared (docs/BENCHMARKS.md, "A large batch prepared ahead").
internal import Foundation
import Synchronization
package import TrellisCore

/// Checks and encodes the documents of one batched upsert for the store
/// (``DocumentStore/prepareUpsert(_:)``) on a thread of its own, in order, a few chunks ahead of
/// the writer that takes them with ``next()``.
///
/// Checking a document and writing its JSON text were a quarter of a batched upsert's time on the
/// writer's thread. Here they run on another core while the writer stores the documents already
/// prepared, as `trellis import`'s reading thread prepares what it reads.
///
/// At most ``chunksAhead`` chunks of ``chunkSize`` documents wait for the writer. The chunks the
/// writer finished are freed by the preparing thread. Use it from one thread, and call ``stop()``
/// when done (the preparing thread ends then, or at the last document).
package final class UpsertsPreparedAhead {
    /// Documents prepared and handed over at a time: 256.
    package static let chunkSize = 256
    /// Chunks prepared and not yet taken, at most.
    static let chunksAhead = 4
    /// The fewest documents a batch has for its upsert to prepare them ahead: 1,024 (below it,
    /// starting a thread costs more than it saves).
    package static let minimumBatch = 1_024

    /// What the two threads share.
    private final class Shared: @unchecked Sendable {
        /// Guards the fields below, and the waits for them.
        let condition = NSCondition()
        var ready: [[PreparedUpsert]] = []
        /// Chunks the writer finished, for the preparing thread to free.
        var spent: [[PreparedUpsert]] = []
        var finished = false
        var stopped = false
        /// Set by the preparing thread as it returns.
        let ended = Atomic<Bool>(false)
    }

    private let shared = Shared()
    private var current: [PreparedUpsert] = []
    private var index = 0

    /// Starts preparing `documents` on a new thread.
    package init(_ documents: [Value]) {
        let shared = shared
        let thread = Thread {
            Thread.nameCurrent("trellis.prepare")
            Self.prepare(documents, into: shared)
            shared.ended.store(true, ordering: .releasing)
        }
        thread.start()
    }

    deinit { stop() }

    /// Whether the preparing thread has returned, asked of a closure that outlives this object.
    package var preparingThreadEnded: @Sendable () -> Bool {
        let shared = shared
        return { shared.ended.load(ordering: .acquiring) }
    }

    /// The next document prepared, in the order given, or `nil` after the last (or once
    /// ``stop()`` was called and what was ready is taken).
    ///
    /// - Complexity: O(1) amortised; waits while the preparing thread has nothing ready.
    package func next() -> PreparedUpsert? {
        if index < current.count {
            index += 1
            return current[index - 1]
        }
        shared.condition.lock()
        defer { shared.condition.unlock() }
        if !current.isEmpty { shared.spent.append(current) }
        current = []
        index = 0
        // A stopped preparer hands over nothing more (and never sets `finished`).
        while shared.ready.isEmpty && !shared.finished && !shared.stopped { shared.condition.wait() }
        guard !shared.ready.isEmpty else { return nil }
        current = shared.ready.removeFirst()
        shared.condition.broadcast()
        index = 1
        return current[0]
    }

    /// Ends the preparing thread at its next chunk; what it prepared and the writer did not take
    /// is dropped.
    package func stop() {
        shared.condition.lock()
        shared.stopped = true
        shared.condition.broadcast()
        shared.condition.unlock()
    }

    /// The preparing thread's loop: a chunk at a time, waiting while ``chunksAhead`` are ready.
    private static func prepare(_ documents: [Value], into shared: Shared) {
        var start = documents.startIndex
        while start < documents.endIndex {
            let end = min(documents.endIndex, start + chunkSize)
            let chunk = documents[start..<end].map(DocumentStore.prepareUpsert)
            shared.condition.lock()
            while shared.ready.count >= chunksAhead && !shared.stopped { shared.condition.wait() }
            let stopped = shared.stopped
            if !stopped {
                shared.ready.append(chunk)
                shared.condition.broadcast()
            }
            let spent = shared.spent
            shared.spent = []
            shared.condition.unlock()
            _ = consume spent  // freed here, outside the lock and off the writer's thread
            if stopped { return }
            start = end
        }
        shared.condition.lock()
        shared.finished = true
        shared.condition.broadcast()
        shared.condition.unlock()
    }
}
