// A large batched upsert checks and encodes its documents on a second thread while the store's
// writer stores the ones already prepared (docs/BENCHMARKS.md, "A large batch prepared ahead").
package import TrellisCore

/// Checks and encodes the documents of one batched upsert for the store
/// (``DocumentStore/prepareUpsert(_:)``) on a thread of its own (`trellis.prepare`), in order, a
/// few chunks ahead of the writer that takes them with ``next()``.
///
/// Checking a document and writing its JSON text were a quarter of a batched upsert's time on the
/// writer's thread. Here they run on another core while the writer stores the documents already
/// prepared, as `trellis import`'s reading thread prepares what it reads.
///
/// At most ``chunksAhead`` chunks of ``chunkSize`` documents wait for the writer. The chunks the
/// writer finished are freed by the preparing thread (``ChunkPipeline``). Use it from one thread,
/// and call ``stop()`` when done (the preparing thread ends then, or at the last document).
package final class UpsertsPreparedAhead {
    /// Documents prepared and handed over at a time: 256.
    package static let chunkSize = 256
    /// Chunks prepared and not yet taken, at most.
    static let chunksAhead = 4
    /// The fewest documents a batch has for its upsert to prepare them ahead: 1,024 (below it,
    /// starting a thread costs more than it saves).
    package static let minimumBatch = 1_024

    private let pipeline: ChunkPipeline<PreparedUpsert>

    /// Starts preparing `documents` on a new thread.
    package init(_ documents: [Value]) {
        pipeline = ChunkPipeline(threadName: "trellis.prepare", chunksAhead: Self.chunksAhead) { producer in
            var start = documents.startIndex
            while start < documents.endIndex {
                let end = min(documents.endIndex, start + Self.chunkSize)
                guard producer.hand(documents[start..<end].map(DocumentStore.prepareUpsert)) else { return }
                start = end
            }
        }
    }

    /// Whether the preparing thread has returned, asked of a closure that outlives this object.
    package var preparingThreadEnded: @Sendable () -> Bool { pipeline.producerEnded }

    /// The next document prepared, in the order given, or `nil` after the last (or once
    /// ``stop()`` was called).
    ///
    /// - Complexity: O(1) amortised; waits while the preparing thread has nothing ready.
    package func next() -> PreparedUpsert? { pipeline.next() }

    /// Ends the preparing thread at its next chunk; what it prepared and the writer did not take
    /// is dropped.
    package func stop() { pipeline.stop() }
}
