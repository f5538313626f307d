// A producer thread a few chunks ahead of one consumer: what a large batched upsert
// (UpsertsPreparedAhead) and `trellis import` (DocumentReadAhead, in Trellis) are built on.
internal import Foundation
import Synchronization
import TrellisCore

/// Items made in order on a thread of its own, in chunks, and taken one at a time, in the same
/// order, by one consumer with ``next()``.
///
/// At most `chunksAhead` chunks wait for the consumer (and one more may be made, waiting to be
/// handed over); the producer waits while they do. The chunks the consumer finished go back to
/// the producer's thread, which frees them at its next hand-over, so the consumer (a store's
/// writer) does not spend its time releasing items; those it finishes once the producer has
/// returned, it frees itself. ``stop()`` drops what waits and ends the producer at its next
/// hand-over.
///
/// Use it from one consumer thread. The producer is the closure given to ``init(threadName:
/// chunksAhead:produce:)``; it hands chunks over with ``Producer/hand(_:)`` and returns when it
/// has made everything, or as soon as a hand-over answers `false`.
///
/// - Complexity: ``next()`` is O(1) amortised, and waits while nothing is ready.
package final class ChunkPipeline<Element> {
    /// What the two threads share.
    fileprivate final class Shared: @unchecked Sendable {
        /// Guards the fields below, and the waits for them.
        let condition = NSCondition()
        var ready: [[Element]] = []
        /// Chunks the consumer finished, for the producer's thread to free.
        var spent: [[Element]] = []
        /// Set as the producer's thread returns (everything it made is in `ready` or taken).
        var finished = false
        /// Set by ``stop()``; also read without the lock, between the producer's items.
        let stopped = Atomic<Bool>(false)
        let chunksAhead: Int

        init(chunksAhead: Int) { self.chunksAhead = chunksAhead }
    }

    /// The producer's side, given to the closure that makes the chunks.
    package struct Producer: @unchecked Sendable {
        fileprivate let shared: Shared

        /// Whether the consumer stopped: the producer may return at once.
        package var isStopped: Bool { shared.stopped.load(ordering: .relaxed) }

        /// Hands `chunk` to the consumer, waiting while `chunksAhead` chunks are ready, then frees
        /// the chunks the consumer finished (outside the lock).
        ///
        /// - Returns: `false`, with `chunk` dropped, once the consumer stopped. An empty chunk is
        ///   not handed over.
        package func hand(_ chunk: [Element]) -> Bool {
            guard !chunk.isEmpty else { return !isStopped }
            var spent: [[Element]] = []
            shared.condition.lock()
            while !isStopped && shared.ready.count >= shared.chunksAhead { shared.condition.wait() }
            let handed = !isStopped
            if handed {
                shared.ready.append(chunk)
                shared.condition.broadcast()
            }
            swap(&spent, &shared.spent)
            shared.condition.unlock()
            spent = []  // freed here, outside the lock and off the consumer's thread
            return handed
        }
    }

    private let shared: Shared
    private var current: [Element] = []
    private var index = 0

    /// Starts `produce` on a new thread named `threadName` (as `top -H` and /proc show it).
    ///
    /// - Parameters:
    ///   - chunksAhead: the most chunks ready and not yet taken (at least 1).
    ///   - produce: makes the items in order and hands them over in chunks (``Producer/hand(_:)``);
    ///     its return ends the items.
    package init(
        threadName: String, chunksAhead: Int, produce: @escaping @Sendable (Producer) -> Void
    ) {
        let shared = Shared(chunksAhead: max(1, chunksAhead))
        self.shared = shared
        let thread = Thread {
            Thread.nameCurrent(threadName)
            produce(Producer(shared: shared))
            shared.condition.lock()
            shared.finished = true
            shared.condition.broadcast()
            shared.condition.unlock()
        }
        thread.start()
    }

    deinit { stop() }

    /// Whether the producer's thread has returned, asked of a closure that outlives this object
    /// (so a test can drop the pipeline and watch its own thread).
    package var producerEnded: @Sendable () -> Bool {
        let shared = shared
        return {
            shared.condition.lock()
            defer { shared.condition.unlock() }
            return shared.finished
        }
    }

    /// The next item, in the order made; `nil` once the producer returned and everything it made
    /// was taken, or once ``stop()`` was called.
    ///
    /// - Complexity: O(1) amortised; waits while the producer has nothing ready.
    package func next() -> Element? {
        if index < current.count {
            index += 1
            return current[index - 1]
        }
        shared.condition.lock()
        defer { shared.condition.unlock() }
        // The finished chunk goes to the producer's thread to be freed, unless the producer has
        // returned: then it is freed here. So the last chunks (up to `chunksAhead` + 1, all of a
        // batch that never made the producer wait) are freed on the consumer's thread.
        if !current.isEmpty && !shared.finished { shared.spent.append(current) }
        current = []
        index = 0
        while shared.ready.isEmpty && !shared.finished && !shared.stopped.load(ordering: .relaxed) {
            shared.condition.wait()
        }
        guard !shared.stopped.load(ordering: .relaxed), !shared.ready.isEmpty else { return nil }
        current = shared.ready.removeFirst()
        shared.condition.broadcast()
        index = 1
        return current[0]
    }

    /// Stops: what is ready and not taken is dropped, ``next()`` answers `nil` from now on, and the
    /// producer's next hand-over answers `false`. Idempotent.
    package func stop() {
        current = []
        index = 0
        var dropped: [[Element]] = []
        shared.condition.lock()
        shared.stopped.store(true, ordering: .relaxed)
        swap(&dropped, &shared.ready)
        shared.spent = []
        shared.condition.broadcast()
        shared.condition.unlock()
        dropped = []  // freed outside the lock
    }
}
