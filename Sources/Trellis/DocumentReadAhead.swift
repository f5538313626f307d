import Foundation
import Synchronization
public import TrellisCore
public import TrellisStore

/// Reads a ``DocumentFileReader`` ahead on a thread of its own: while the caller stores one
/// document, the next ones are read and parsed on another core (`trellis import`: parsing was a
/// fifth of an import's time, docs/BENCHMARKS.md "Imports read ahead").
///
/// It yields what the reader yields, in the same order: the same documents, the same errors
/// (a ``FileError/recoverable`` one is followed by the documents after it, any other ends the
/// reading), then `nil`. ``place``, ``bytesRead`` and ``count`` describe the document ``next()``
/// last returned or refused, as the reader's would. Memory follows the bytes read ahead, not
/// the file: a chunk ends after ``chunkSize`` documents or once it took ``chunkBytes`` of the
/// file (a chunk holds at least one document), and at most four are held at once (the one the
/// caller reads from, two waiting, one being read), besides the one or two the caller finished
/// and the reading thread has not freed yet. The reading
/// thread also frees the chunks the caller finished, so the caller's thread does not spend its
/// time releasing parsed documents (a tenth of an import's writing, docs/BENCHMARKS.md).
///
/// With `preparingUpserts`, the reading thread also checks and encodes each document for the
/// store (``DocumentStore/prepareUpsert(_:)``), and ``nextPrepared()`` returns it so.
/// `trellis import` streams those into
/// ``DocumentStore/upsert(in:streamingPrepared:progressInterval:progress:refused:)``, and the
/// store's thread only writes (docs/BENCHMARKS.md, "Imports encode ahead").
///
/// Use it from one thread; ``close()`` (or deinit) stops the reading thread.
///
/// ```swift
/// let documents = DocumentReadAhead(try DocumentFileReader(path: "cars.jsonl"))
/// while let car = try documents.next() { print(car["Name"] ?? "?") }
/// ```
public final class DocumentReadAhead {
    /// Documents handed over at a time: 256.
    public static let chunkSize = 256
    /// Chunks read ahead and not yet taken, at most.
    static let chunksAhead = 2
    /// Bytes of the file a chunk takes at most (past its first document): 1 MiB.
    public static let chunkBytes = 1 << 20

    /// The file's path as the reader names it.
    public let path: String
    /// The file's size in bytes when it was opened.
    public let size: Int
    /// Bytes the reader had consumed when it yielded the document ``next()`` last returned.
    public private(set) var bytesRead = 0
    /// How many documents ``next()`` returned so far.
    public private(set) var count = 0
    /// Where the document ``next()`` last returned, or last refused, is in the file (as
    /// ``DocumentFileReader/place``).
    public private(set) var place = ""

    /// One thing the reader yielded, with where it stood then.
    private struct Item {
        var result: Result<Value?, FileError>
        /// The document checked and encoded for an upsert, when the reading thread prepares them.
        var prepared: PreparedUpsert?
        var place: String
        var bytesRead: Int
        var count: Int

        /// Whether nothing follows it: the end, or an error that is not recoverable.
        var endsReading: Bool {
            switch result {
            case .success(nil): true
            case .failure(let error): !error.recoverable
            case .success: false
            }
        }
    }

    private let pipeline: ChunkPipeline<Item>
    /// A reader handed to the reading thread, which alone uses it afterwards.
    private struct Handover: @unchecked Sendable { let reader: DocumentFileReader }
    /// The last item, once it ended the reading (`nil` or an error that is not recoverable).
    private var last: Item?

    /// Starts reading `reader` ahead. The reading thread holds the reader, not this object.
    ///
    /// - Parameter preparingUpserts: whether the reading thread also prepares each document for
    ///   ``DocumentStore/upsert(in:streamingPrepared:progressInterval:progress:refused:)``
    ///   (``nextPrepared()``).
    public init(_ reader: DocumentFileReader, preparingUpserts: Bool = false) {
        path = reader.path
        size = reader.size
        // The reader goes to the reading thread, which alone uses it from now on.
        let handover = Handover(reader: reader)
        pipeline = ChunkPipeline(threadName: "trellis.import", chunksAhead: Self.chunksAhead) { producer in
            Self.read(handover.reader, into: producer, preparing: preparingUpserts)
        }
    }

    deinit { close() }

    /// Whether this reader's thread has returned, asked of a closure that outlives the reader (so
    /// a test can drop the reader and watch its own thread, not every thread of that name).
    package var readingThreadEnded: @Sendable () -> Bool { pipeline.producerEnded }

    /// The next document, or `nil` after the last.
    ///
    /// - Throws: what the reader's ``DocumentFileReader/next()`` threw at this place.
    /// - Complexity: O(1) amortised; waits while the reading thread has nothing ready.
    public func next() throws(FileError) -> Value? {
        try take(nextItem())
    }

    /// The next document checked and encoded for an upsert (by the reading thread when this was
    /// made `preparingUpserts`), or `nil` after the last.
    ///
    /// - Throws: as ``next()``.
    /// - Complexity: as ``next()``; O(size of the document) when the reading thread did not
    ///   prepare it.
    public func nextPrepared() throws(FileError) -> PreparedUpsert? {
        let item = nextItem()
        guard let document = try take(item) else { return nil }
        return item.prepared ?? DocumentStore.prepareUpsert(document)
    }

    private func nextItem() -> Item {
        if let last { return last }
        // `nil` only once closed: from then on the reading has ended.
        let item = pipeline.next() ?? end
        if item.endsReading { last = item }
        return item
    }

    /// Stops the reading thread (it finishes the document it is parsing) and drops what it read
    /// ahead; ``next()`` returns `nil` from then on.
    public func close() {
        pipeline.stop()
        // Also after an error that ended the reading: closed, it answers the end.
        last = end
    }

    /// The end of the reading, where the caller stands.
    private var end: Item { Item(result: .success(nil), place: place, bytesRead: bytesRead, count: count) }

    private func take(_ item: Item) throws(FileError) -> Value? {
        place = item.place
        bytesRead = item.bytesRead
        count = item.count
        return try item.result.get()
    }

    /// The reading thread: chunks of items until the reader ends or the caller stops.
    private static func read(
        _ reader: DocumentFileReader, into producer: ChunkPipeline<Item>.Producer, preparing: Bool
    ) {
        var done = false
        while !done {
            var chunk: [Item] = []
            chunk.reserveCapacity(chunkSize)
            let chunkStart = reader.bytesRead
            // Cut by bytes too, so memory follows the bytes read ahead, not a count of documents
            // of any size; and stop between documents once the caller closed.
            while chunk.count < chunkSize, reader.bytesRead - chunkStart < chunkBytes, !done {
                if producer.isStopped { return }
                let result: Result<Value?, FileError>
                do { result = .success(try reader.next()) } catch { result = .failure(error) }
                var item = Item(result: result, place: reader.place, bytesRead: reader.bytesRead, count: reader.count)
                if preparing, case .success(let document?) = result {
                    item.prepared = DocumentStore.prepareUpsert(document)
                }
                done = item.endsReading
                chunk.append(item)
            }
            guard producer.hand(chunk) else { return }
        }
    }
}
