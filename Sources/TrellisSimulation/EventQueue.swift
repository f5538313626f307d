import TrellisCore

/// A min-heap of events ordered by virtual time, then by the order they were scheduled, so equal
/// times run in a fixed order and a seed fixes the whole run.
struct EventQueue<Event> {
    private struct Entry {
        var time: Millis
        var order: UInt64
        var event: Event

        func precedes(_ other: Entry) -> Bool { time != other.time ? time < other.time : order < other.order }
    }

    private var heap: [Entry] = []
    private var scheduled: UInt64 = 0

    var isEmpty: Bool { heap.isEmpty }
    var count: Int { heap.count }
    /// The time of the next event.
    var nextTime: Millis? { heap.first?.time }

    /// - Complexity: O(log n).
    mutating func schedule(_ event: Event, at time: Millis) {
        scheduled += 1
        heap.append(Entry(time: time, order: scheduled, event: event))
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].precedes(heap[parent]) else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    /// Removes and returns the earliest event.
    ///
    /// - Complexity: O(log n).
    mutating func pop() -> (time: Millis, event: Event)? {
        guard !heap.isEmpty else { return nil }
        heap.swapAt(0, heap.count - 1)
        let top = heap.removeLast()
        var parent = 0
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var best = parent
            if left < heap.count, heap[left].precedes(heap[best]) { best = left }
            if right < heap.count, heap[right].precedes(heap[best]) { best = right }
            guard best != parent else { break }
            heap.swapAt(parent, best)
            parent = best
        }
        return (top.time, top.event)
    }
}
