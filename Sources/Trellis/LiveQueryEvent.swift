/// What changed between two deliveries of a cursor live query (Ditto's `DittoLiveQueryEvent`).
///
/// The first callback of an observer carries `.initial`; every later one carries `.update`
/// describing the change from the results of the previous callback (`oldDocuments`) to the
/// results passed with the event.
public enum LiveQueryEvent: Sendable, Equatable, CustomStringConvertible {
    /// The first delivery: the results as they are when the observer starts.
    case initial
    /// A change from the previously delivered results.
    case update(LiveQueryUpdate)

    /// `true` for ``initial``.
    public var isInitial: Bool { self == .initial }

    /// The results this event turns `old` into, rebuilt from the event alone (new documents are
    /// taken from `new` only at the `insertions` and `updates` indexes). For `.initial`, `new`.
    ///
    /// Applying the event of a callback to the results of the previous callback gives the results
    /// of this one; tests use this to check events.
    ///
    /// - Parameters:
    ///   - old: the results of the previous callback (for `.update`, equal to `oldDocuments`).
    ///   - new: the results of this callback, read only at `insertions` and `updates`.
    /// - Returns: the rebuilt results, or `nil` when the indexes do not fit `old` and `new`.
    /// - Complexity: O(old.count + new.count).
    public func apply(to old: [Document], new: [Document]) -> [Document]? {
        guard case .update(let update) = self else { return new }
        return update.apply(to: old, new: new)
    }

    public var description: String {
        switch self {
        case .initial: return "initial"
        case .update(let update): return update.description
        }
    }
}

/// One move of a surviving document (Ditto's `DittoLiveQueryMove`).
public struct LiveQueryMove: Sendable, Hashable, CustomStringConvertible {
    /// The document's index in the old results.
    public var from: Int
    /// The document's index in the new results.
    public var to: Int

    /// A move from index `from` of the old results to index `to` of the new results.
    public init(from: Int, to: Int) {
        self.from = from
        self.to = to
    }

    public var description: String { "\(from)->\(to)" }
}

/// The change carried by ``LiveQueryEvent/update(_:)`` (Ditto's `DittoLiveQueryUpdate`).
///
/// Index semantics are those of a table view's batch update: `deletions` index the old results;
/// `insertions` and `updates` index the new results; `moves` map an old index to a new index.
/// Documents that survive and are not listed in `moves` keep their relative order (their absolute
/// index may still shift because of deletions, insertions and moves). A document present in both
/// results whose value changed, or that a commit covered by the event wrote again (even with the
/// same value), is listed in `updates` (and also in `moves` when it moved).
/// Every list is sorted ascending (`moves` by `from`).
public struct LiveQueryUpdate: Sendable, Equatable, CustomStringConvertible {
    /// The results delivered with the previous callback.
    public var oldDocuments: [Document]
    /// Indexes into the new results of documents that were not in the old results.
    public var insertions: [Int]
    /// Indexes into the old results of documents that are not in the new results.
    public var deletions: [Int]
    /// Indexes into the new results of documents present in both whose value changed or that a
    /// commit covered by this event wrote again.
    public var updates: [Int]
    /// `(from old index, to new index)` of surviving documents that changed relative order.
    public var moves: [LiveQueryMove]
    /// How many committed transactions this event covers (≥ 1). A plain `observeLocal` delivers
    /// one event per commit, so this is 1 unless the observer's queue filled up
    /// (``Store/liveQueryEventLimit``) and the commits after it were merged into one event; a
    /// next-signal observer merges the commits made before its signal. More than 1 means the
    /// intermediate results were not delivered.
    public var commitCount: Int

    /// An update with the given parts (live queries build them with ``diff(from:to:rewritten:commitCount:)``).
    ///
    /// - Parameter commitCount: the number of commits the event covers (≥ 1).
    public init(
        oldDocuments: [Document], insertions: [Int], deletions: [Int], updates: [Int], moves: [LiveQueryMove],
        commitCount: Int = 1
    ) {
        self.oldDocuments = oldDocuments
        self.insertions = insertions
        self.deletions = deletions
        self.updates = updates
        self.moves = moves
        self.commitCount = commitCount
    }

    /// `true` when the event changes nothing.
    public var isEmpty: Bool { insertions.isEmpty && deletions.isEmpty && updates.isEmpty && moves.isEmpty }

    public var description: String {
        "update insertions=\(insertions) deletions=\(deletions) updates=\(updates) moves=\(moves)"
            + (commitCount == 1 ? "" : " commits=\(commitCount)")
    }

    /// The difference between two result lists, as a live query reports it.
    ///
    /// Documents are matched by `_id`; a result list never holds an `_id` twice. Moves are the
    /// fewest that explain the new order: the surviving documents outside a longest increasing
    /// subsequence of their new positions.
    ///
    /// - Parameters:
    ///   - old: the previous results.
    ///   - new: the results now.
    ///   - rewritten: `_id`s of documents the commits wrote; those present in both lists are
    ///     listed in `updates` even when their value is the same.
    ///   - commitCount: the number of commits the event covers (≥ 1).
    /// - Complexity: O((n + m) log(n + m)) for n old and m new documents.
    public static func diff(
        from old: [Document], to new: [Document], rewritten: Set<Value> = [], commitCount: Int = 1
    ) -> LiveQueryUpdate {
        var newIndex: [Value: Int] = [:]
        newIndex.reserveCapacity(new.count)
        for (index, document) in new.enumerated() { newIndex[document.id] = index }
        var oldIndex: [Value: Int] = [:]
        oldIndex.reserveCapacity(old.count)
        for (index, document) in old.enumerated() { oldIndex[document.id] = index }

        var deletions: [Int] = []
        var survivors: [(from: Int, to: Int)] = []  // in old order
        for (index, document) in old.enumerated() {
            if let to = newIndex[document.id] {
                survivors.append((index, to))
            } else {
                deletions.append(index)
            }
        }
        var insertions: [Int] = []
        var updates: [Int] = []
        for (index, document) in new.enumerated() {
            if let from = oldIndex[document.id] {
                if old[from] != document || rewritten.contains(document.id) { updates.append(index) }
            } else {
                insertions.append(index)
            }
        }
        let keep = longestIncreasingSubsequence(survivors.map(\.to))
        var moves: [LiveQueryMove] = []
        for (position, survivor) in survivors.enumerated() where !keep.contains(position) {
            moves.append(LiveQueryMove(from: survivor.from, to: survivor.to))
        }
        return LiveQueryUpdate(
            oldDocuments: old, insertions: insertions, deletions: deletions, updates: updates, moves: moves,
            commitCount: commitCount)
    }

    /// Positions (into `values`) of one longest strictly increasing subsequence.
    static func longestIncreasingSubsequence(_ values: [Int]) -> Set<Int> {
        guard !values.isEmpty else { return [] }
        var tails: [Int] = []  // positions; values[tails[k]] is the smallest tail of length k+1
        var previous = [Int](repeating: -1, count: values.count)
        for (position, value) in values.enumerated() {
            var low = 0
            var high = tails.count
            while low < high {
                let mid = (low + high) / 2
                if values[tails[mid]] < value { low = mid + 1 } else { high = mid }
            }
            if low > 0 { previous[position] = tails[low - 1] }
            if low == tails.count { tails.append(position) } else { tails[low] = position }
        }
        var out: Set<Int> = []
        var cursor = tails[tails.count - 1]
        while cursor >= 0 {
            out.insert(cursor)
            cursor = previous[cursor]
        }
        return out
    }

    /// The new results rebuilt from `old` and this update; see ``LiveQueryEvent/apply(to:new:)``.
    public func apply(to old: [Document], new: [Document]) -> [Document]? {
        let count = old.count - deletions.count + insertions.count
        guard count == new.count, deletions.allSatisfy({ old.indices.contains($0) }) else { return nil }
        var slots = [Document?](repeating: nil, count: count)
        for index in insertions {
            guard slots.indices.contains(index), slots[index] == nil else { return nil }
            slots[index] = new[index]
        }
        var moved = Set<Int>()
        for move in moves {
            guard old.indices.contains(move.from), slots.indices.contains(move.to), slots[move.to] == nil else {
                return nil
            }
            slots[move.to] = old[move.from]
            moved.insert(move.from)
        }
        let deleted = Set(deletions)
        var rest = old.indices.lazy.filter { !deleted.contains($0) && !moved.contains($0) }.makeIterator()
        for index in slots.indices where slots[index] == nil {
            guard let from = rest.next() else { return nil }
            slots[index] = old[from]
        }
        guard rest.next() == nil else { return nil }
        for index in updates {
            guard slots.indices.contains(index) else { return nil }
            slots[index] = new[index]
        }
        return slots.map { $0! }
    }
}

/// What changed for a single-document live query (Ditto's `DittoSingleDocumentLiveQueryEvent`).
public struct SingleDocumentLiveQueryEvent: Sendable, Equatable, CustomStringConvertible {
    /// `true` for the first delivery.
    public var isInitial: Bool
    /// The document as delivered with the previous callback (`nil` on the initial event and
    /// while the document did not exist locally).
    public var oldDocument: Document?
    /// How many committed transactions that wrote the document this event covers: 0 for the
    /// initial event, 1 for each later event of a plain `observeLocal` unless its queue filled up
    /// (``Store/liveQueryEventLimit``), more when commits were merged (see
    /// ``LiveQueryUpdate/commitCount``).
    public var commitCount: Int

    /// An event; live queries build them.
    ///
    /// - Parameter commitCount: commits covered; by default 0 for an initial event, else 1.
    public init(isInitial: Bool, oldDocument: Document?, commitCount: Int? = nil) {
        self.isInitial = isInitial
        self.oldDocument = oldDocument
        self.commitCount = commitCount ?? (isInitial ? 0 : 1)
    }

    public var description: String {
        isInitial
            ? "initial"
            : "update old=\(oldDocument?.json ?? "null")" + (commitCount == 1 ? "" : " commits=\(commitCount)")
    }
}
