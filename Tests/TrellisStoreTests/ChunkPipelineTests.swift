import Foundation
import Synchronization
import Testing
import TrellisTestKit

@testable import TrellisStore

/// The producer thread a few chunks ahead of one consumer that `UpsertsPreparedAhead` and
/// `DocumentReadAhead` are built on (`ChunkPipeline`).
@Suite struct ChunkPipelineTests {
    /// Every item arrives once, in order, across chunks of any size (empty ones too), then `nil`
    /// for good; the producer's thread ends.
    @Test func itemsArriveInOrderThenNil() {
        let sizes = [3, 0, 1, 7, 0, 2, 5]
        let pipeline = ChunkPipeline<Int>(threadName: "trellis.test", chunksAhead: 2) { producer in
            var n = 0
            for size in sizes {
                guard producer.hand(Array(n..<n + size)) else { return }
                n += size
            }
        }
        var taken: [Int] = []
        while let item = pipeline.next() { taken.append(item) }
        #expect(taken == Array(0..<sizes.reduce(0, +)))
        #expect(pipeline.next() == nil && pipeline.next() == nil)
        #expect(eventually(pipeline.producerEnded))
    }

    /// The producer waits while `chunksAhead` chunks are ready: it never runs further ahead than
    /// those and the one the consumer reads from.
    @Test func theProducerRunsAtMostChunksAheadOfTheConsumer() {
        let handed = Atomic<Int>(0)
        let pipeline = ChunkPipeline<Int>(threadName: "trellis.test", chunksAhead: 3) { producer in
            for chunk in 0..<50 {
                guard producer.hand([chunk]) else { return }
                handed.add(1, ordering: .relaxed)
            }
        }
        for k in 0..<50 {
            #expect(pipeline.next() == k)
            Thread.sleep(forTimeInterval: 0.001)
            // Taken: k + 1; ready: at most 3; and the producer may be in one more hand-over.
            #expect(handed.load(ordering: .relaxed) <= k + 1 + 3)
        }
        #expect(pipeline.next() == nil)
    }

    /// `stop()` drops what is ready (and the rest of the chunk being read), answers `nil` from
    /// then on, and ends a producer that waits to hand over or checks between items; stopping
    /// twice, or dropping the pipeline, is the same.
    @Test func stopEndsTheProducerAndTheItems() {
        for way in 0..<3 {
            var ended: @Sendable () -> Bool = { false }
            do {
                let pipeline = ChunkPipeline<Int>(threadName: "trellis.test", chunksAhead: 1) { producer in
                    var n = 0
                    while !producer.isStopped {
                        guard producer.hand(Array(n..<n + 4)) else { return }
                        n += 4
                    }
                }
                ended = pipeline.producerEnded
                #expect(pipeline.next() == 0)
                #expect(pipeline.next() == 1)
                switch way {
                case 0: pipeline.stop()
                case 1:
                    pipeline.stop()
                    pipeline.stop()
                default: break  // dropped
                }
                if way < 2 {
                    #expect(pipeline.next() == nil)
                    #expect(pipeline.next() == nil)
                }
            }
            #expect(eventually(ended), "way \(way)")
        }
    }

    /// The chunks the consumer finished are freed on the producer's thread, not the consumer's.
    @Test func finishedChunksAreFreedByTheProducer() {
        final class Log: Sendable { let freedOn = Mutex<[String]>([]) }
        final class Tracked: Sendable {
            let log: Log
            init(_ log: Log) { self.log = log }
            deinit {
                let name = currentThreadName()
                log.freedOn.withLock { $0.append(name) }
            }
        }
        let log = Log()
        let pipeline = ChunkPipeline<Tracked>(threadName: "trellis.freer", chunksAhead: 1) { producer in
            for _ in 0..<10 {
                guard producer.hand([Tracked(log)]) else { return }
            }
        }
        var taken = 0
        while pipeline.next() != nil { taken += 1 }
        #expect(taken == 10)
        let names = log.freedOn.withLock { $0 }
        // All but the last one or two (freed when the producer had ended, or with the pipeline).
        #expect(names.count >= 8 && names.prefix(8).allSatisfy { $0 == "trellis.freer" }, "\(names)")
    }
}
