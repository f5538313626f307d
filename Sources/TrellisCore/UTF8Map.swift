/// An ordered map from string keys compared by their UTF-8 bytes: the map type of ``Value/map(_:)``
/// and of every map whose keys come from users.
///
/// Keys are byte strings (docs/DATA-MODEL.md): a precomposed "é" (U+00E9) and "e" + U+0301 are
/// two keys here, as they are in SQLite, JSON text and CBOR, whereas `[String: …]` would make
/// them one. Nothing is normalised.
///
/// The surface follows `Dictionary` so code reads the same: `map["name"]` gets and sets (setting
/// `nil` removes), `keys`, `values`, `count`, `isEmpty`, iteration as `(key:value:)` pairs,
/// `removeValue(forKey:)`, `updateValue(_:forKey:)`, `mapValues`, dictionary literals and
/// `init(uniqueKeysWithValues:)`. Unlike `Dictionary` it is ordered: entries are kept sorted by
/// the keys' UTF-8 bytes (``UTF8Key/compare(_:_:)``), so iteration, `keys`, `description` and
/// JSON output are deterministic, and two maps with the same entries iterate alike.
///
/// Storage is two parallel arrays (keys, members) sorted by key:
/// - lookup is a binary search, O(log n) comparisons;
/// - inserting a key greater than every key present (copying from another sorted map, building
///   from sorted input) appends, O(1) amortised; inserting or removing elsewhere shifts the tail,
///   O(n);
/// - building from an unsorted sequence sorts once, O(n log n), and says what happens to
///   duplicate keys: ``init(uniqueKeysWithValues:)`` traps (a programming error, as with
///   `Dictionary`), ``init(checkingUniqueKeysWithValues:)`` throws ``DuplicateKeyError``, and
///   ``init(_:uniquingKeysWith:)`` combines.
///
/// For a hashed set or dictionary of keys (collection names, `_id` keys) use ``UTF8Key``.
public struct UTF8Map<Mapped> {
    /// Keys in ascending byte order, no two equal byte-wise.
    @usableFromInline var storedKeys: [String]
    /// `storedValues[i]` is the member of `storedKeys[i]`.
    @usableFromInline var storedValues: [Mapped]

    /// An empty map.
    @inlinable
    public init() {
        storedKeys = []
        storedValues = []
    }

    /// An empty map with room for `minimumCapacity` entries.
    public init(minimumCapacity: Int) {
        self.init()
        reserveCapacity(minimumCapacity)
    }

    /// A map from pairs whose keys are all different byte-wise, in any order.
    ///
    /// - Precondition: no key appears twice (byte-wise); a duplicate traps, as with `Dictionary`.
    ///   For input from outside the program use ``init(checkingUniqueKeysWithValues:)``.
    /// - Complexity: O(n) when the keys come sorted, O(n log n) otherwise.
    public init<S: Sequence>(uniqueKeysWithValues pairs: S) where S.Element == (String, Mapped) {
        self.init(sortingPairs: Array(pairs)) { key, _, _ in
            preconditionFailure("UTF8Map(uniqueKeysWithValues:): duplicate key \(key.debugDescription)")
        }
    }

    /// A map from pairs whose keys must all be different byte-wise, in any order.
    ///
    /// - Throws: ``DuplicateKeyError`` naming the first key (in byte order) that appears twice.
    /// - Complexity: O(n) when the keys come sorted, O(n log n) otherwise.
    public init<S: Sequence>(checkingUniqueKeysWithValues pairs: S) throws(DuplicateKeyError)
    where S.Element == (String, Mapped) {
        var duplicate: String?
        self.init(sortingPairs: Array(pairs)) { key, first, _ in
            if duplicate == nil { duplicate = key }
            return first
        }
        if let duplicate { throw DuplicateKeyError(key: duplicate) }
    }

    /// A map from pairs in any order, combining the members of a key that appears more than once.
    ///
    /// - Parameter combine: called with the member seen earlier in `pairs` and the later one, for
    ///   each repeat of a key (byte-wise), in the order of `pairs`; returns the member to keep.
    /// - Complexity: O(n) when the keys come sorted, O(n log n) otherwise.
    public init<S: Sequence>(
        _ pairs: S, uniquingKeysWith combine: (Mapped, Mapped) throws -> Mapped
    ) rethrows where S.Element == (String, Mapped) {
        try self.init(sortingPairs: Array(pairs)) { _, first, second in try combine(first, second) }
    }

    /// A map from parallel arrays of keys and their members, in any order, combining the members
    /// of a key that appears more than once (the later one is `combine`'s second argument).
    ///
    /// Keys that already ascend strictly by byte order (all JSON Trellis writes) are taken as
    /// they are, arrays and all.
    ///
    /// - Precondition: `members` has as many elements as `keys`.
    /// - Complexity: O(n) when the keys come sorted, O(n log n) otherwise.
    init(keys: [String], members: [Mapped], uniquingKeysWith combine: (Mapped, Mapped) throws -> Mapped) rethrows {
        try self.init(keys: keys, members: members) { _, first, second in try combine(first, second) }
    }

    /// Splits pairs into keys and members for ``init(keys:members:combine:)``.
    private init(
        sortingPairs pairs: [(String, Mapped)], combine: (String, Mapped, Mapped) throws -> Mapped
    ) rethrows {
        // Closures, not key paths: a key path into a tuple of the generic `Mapped` is instantiated
        // at run time on every call (swift_getKeyPath), which cost more than the sort itself.
        try self.init(keys: pairs.map { $0.0 }, members: pairs.map { $0.1 }, combine: combine)
    }

    /// Sorts keys stably by their bytes, with their members, and merges runs of equal keys with
    /// `combine`; keys already in strictly ascending order are stored as they come.
    private init(
        keys: [String], members: [Mapped], combine: (String, Mapped, Mapped) throws -> Mapped
    ) rethrows {
        precondition(keys.count == members.count, "UTF8Map: \(keys.count) keys for \(members.count) members")
        var sorted = true
        for i in keys.indices.dropFirst() where UTF8Key.compare(keys[i - 1], keys[i]) >= 0 {
            sorted = false
            break
        }
        self.init()
        if sorted {
            storedKeys = keys
            storedValues = members
            return
        }
        reserveCapacity(keys.count)
        // Sort positions with the original position as a tie-break, so repeats combine in input order.
        var order = Array(keys.indices)
        order.sort { a, b in
            let c = UTF8Key.compare(keys[a], keys[b])
            return c != 0 ? c < 0 : a < b
        }
        for position in order {
            let (key, member) = (keys[position], members[position])
            if let last = storedKeys.last, UTF8Key.equal(last, key) {
                storedValues[storedValues.count - 1] = try combine(key, storedValues[storedValues.count - 1], member)
            } else {
                storedKeys.append(key)
                storedValues.append(member)
            }
        }
    }

    // MARK: Lookup

    /// The position of `key` if present, otherwise where it would be inserted.
    ///
    /// - Complexity: O(log n) comparisons; O(1) when `key` sorts after every key present.
    @inlinable
    func search(_ key: String) -> (found: Bool, index: Int) {
        guard let last = storedKeys.last else { return (false, 0) }
        let c = UTF8Key.compare(last, key)
        if c < 0 { return (false, storedKeys.count) }
        if c == 0 { return (true, storedKeys.count - 1) }
        return search(key, between: 0, storedKeys.count - 1)
    }

    /// Binary search for `key` among the positions `low...high`, where the key at `high` sorts
    /// after `key`: its position if present, otherwise where it would be inserted.
    ///
    /// - Complexity: O(log(high − low)) comparisons.
    @inlinable
    func search(_ key: String, between low: Int, _ high: Int) -> (found: Bool, index: Int) {
        var low = low
        var high = high
        while low < high {
            let mid = low + (high - low) / 2
            let d = UTF8Key.compare(storedKeys[mid], key)
            if d == 0 { return (true, mid) }
            if d < 0 { low = mid + 1 } else { high = mid }
        }
        return (false, low)
    }

    /// The position of `key`, or `nil` when the map has no such key (byte-wise).
    ///
    /// - Complexity: O(log n).
    @inlinable
    public func index(forKey key: String) -> Int? {
        let (found, index) = search(key)
        return found ? index : nil
    }

    /// The member for `key` (compared byte-wise), or `nil`; setting `nil` removes the key.
    ///
    /// - Complexity: get O(log n); set O(log n) to replace, O(1) amortised to add a key that sorts
    ///   after every key present, O(n) to add or remove elsewhere.
    @inlinable
    public subscript(key: String) -> Mapped? {
        get {
            let (found, index) = search(key)
            return found ? storedValues[index] : nil
        }
        set {
            // No `switch (found, newValue)`: building that tuple copies the member.
            let (found, index) = search(key)
            if let newValue {
                if found {
                    storedValues[index] = newValue
                } else {
                    insert(key, newValue, at: index)
                }
            } else if found {
                storedKeys.remove(at: index)
                storedValues.remove(at: index)
            }
        }
    }

    /// The member for `key`, or `defaultValue` when absent; mutating through it stores the result.
    ///
    /// - Complexity: as the key subscript.
    @inlinable
    public subscript(key: String, default defaultValue: @autoclosure () -> Mapped) -> Mapped {
        get { self[key] ?? defaultValue() }
        set { self[key] = newValue }
    }

    /// Sets the member of `key`, returning the member it replaced (`nil` when the key is new).
    ///
    /// - Complexity: as setting through the subscript.
    @inlinable
    @discardableResult
    public mutating func updateValue(_ member: Mapped, forKey key: String) -> Mapped? {
        let (found, index) = search(key)
        if found {
            let old = storedValues[index]
            storedValues[index] = member
            return old
        }
        insert(key, member, at: index)
        return nil
    }

    /// Inserts a key the map does not hold at `index`, where ``search(_:)`` or
    /// ``search(_:from:)`` places it; at the end it appends (cheaper than `Array.insert`).
    ///
    /// - Complexity: O(n − index); O(1) amortised at the end.
    @inlinable
    mutating func insert(_ key: String, _ member: Mapped, at index: Int) {
        if index == storedKeys.count {
            storedKeys.append(key)
            storedValues.append(member)
        } else {
            storedKeys.insert(key, at: index)
            storedValues.insert(member, at: index)
        }
    }

    /// Removes `key`, returning its member (`nil` when absent).
    ///
    /// - Complexity: O(n) (the entries after it shift), O(log n) for the last key.
    @inlinable
    @discardableResult
    public mutating func removeValue(forKey key: String) -> Mapped? {
        guard let index = index(forKey: key) else { return nil }
        storedKeys.remove(at: index)
        return storedValues.remove(at: index)
    }

    /// Removes every entry.
    public mutating func removeAll(keepingCapacity keepCapacity: Bool = false) {
        storedKeys.removeAll(keepingCapacity: keepCapacity)
        storedValues.removeAll(keepingCapacity: keepCapacity)
    }

    /// Reserves room for `minimumCapacity` entries.
    public mutating func reserveCapacity(_ minimumCapacity: Int) {
        storedKeys.reserveCapacity(minimumCapacity)
        storedValues.reserveCapacity(minimumCapacity)
    }

    // MARK: Views

    /// The keys in ascending byte order.
    @inlinable
    public var keys: Keys { Keys(storage: storedKeys) }

    /// The members, in the order of their keys.
    @inlinable
    public var values: [Mapped] { storedValues }

    /// The keys of a ``UTF8Map`` in ascending byte order; `contains` is a byte-wise binary search.
    public struct Keys: RandomAccessCollection, Sendable {
        @usableFromInline let storage: [String]

        @inlinable init(storage: [String]) { self.storage = storage }

        @inlinable public var startIndex: Int { 0 }
        @inlinable public var endIndex: Int { storage.count }
        @inlinable public subscript(position: Int) -> String { storage[position] }

        /// Whether the map has `key`, compared byte-wise (not by canonical equivalence, as
        /// `Sequence.contains` on strings would).
        ///
        /// - Complexity: O(log n).
        @inlinable
        public func contains(_ key: String) -> Bool {
            var low = 0
            var high = storage.count
            while low < high {
                let mid = low + (high - low) / 2
                let d = UTF8Key.compare(storage[mid], key)
                if d == 0 { return true }
                if d < 0 { low = mid + 1 } else { high = mid }
            }
            return false
        }

        @inlinable
        public func _customContainsEquatableElement(_ element: String) -> Bool? { contains(element) }
    }

    // MARK: Transformations

    /// The same keys with each member transformed.
    ///
    /// - Complexity: O(n) calls of `transform`.
    @inlinable
    public func mapValues<T, E: Error>(_ transform: (Mapped) throws(E) -> T) throws(E) -> UTF8Map<T> {
        var out = UTF8Map<T>()
        out.storedKeys = storedKeys
        out.storedValues.reserveCapacity(storedValues.count)
        for member in storedValues { out.storedValues.append(try transform(member)) }
        return out
    }

    /// The keys whose transformed member is not `nil`, with those members.
    ///
    /// - Complexity: O(n).
    public func compactMapValues<T, E: Error>(_ transform: (Mapped) throws(E) -> T?) throws(E) -> UTF8Map<T> {
        var out = UTF8Map<T>(minimumCapacity: count)
        for (key, member) in zip(storedKeys, storedValues) {
            if let t = try transform(member) {
                out.storedKeys.append(key)
                out.storedValues.append(t)
            }
        }
        return out
    }

    /// The entries that satisfy `isIncluded`, as a map.
    ///
    /// - Complexity: O(n).
    public func filter<E: Error>(_ isIncluded: (Element) throws(E) -> Bool) throws(E) -> UTF8Map {
        var out = UTF8Map()
        for (key, member) in zip(storedKeys, storedValues) where try isIncluded((key, member)) {
            out.storedKeys.append(key)
            out.storedValues.append(member)
        }
        return out
    }

    /// Adds the entries of `other`; for a key in both, `combine(mine, theirs)` decides.
    ///
    /// - Complexity: O(n + m) (a merge of two sorted lists).
    public mutating func merge(_ other: UTF8Map, uniquingKeysWith combine: (Mapped, Mapped) throws -> Mapped) rethrows {
        self = try merging(other, uniquingKeysWith: combine)
    }

    /// This map with the entries of `other` added; for a key in both, `combine(mine, theirs)`
    /// decides.
    ///
    /// - Complexity: O(n + m) (a merge of two sorted lists).
    public func merging(_ other: UTF8Map, uniquingKeysWith combine: (Mapped, Mapped) throws -> Mapped) rethrows
        -> UTF8Map
    {
        if other.isEmpty { return self }
        if isEmpty { return other }
        var out = UTF8Map(minimumCapacity: count + other.count)
        var i = 0
        var j = 0
        while i < count || j < other.count {
            let c =
                i == count ? 1 : j == other.count ? -1 : UTF8Key.compare(storedKeys[i], other.storedKeys[j])
            if c < 0 {
                out.storedKeys.append(storedKeys[i])
                out.storedValues.append(storedValues[i])
                i += 1
            } else if c > 0 {
                out.storedKeys.append(other.storedKeys[j])
                out.storedValues.append(other.storedValues[j])
                j += 1
            } else {
                out.storedKeys.append(storedKeys[i])
                out.storedValues.append(try combine(storedValues[i], other.storedValues[j]))
                i += 1
                j += 1
            }
        }
        return out
    }
}

// MARK: - In place by position (the CRDT's maps)

extension UTF8Map {
    /// The position of `key` among the keys at or after `start`, or where it would be inserted
    /// there. Keys before `start` must all sort before `key`.
    ///
    /// Walking two sorted maps in step, the key is usually at `start`: that is tried first.
    ///
    /// - Complexity: O(1) when `key` is at `start`, belongs there, or sorts after every key;
    ///   otherwise O(log(n − start)) comparisons.
    func search(_ key: String, from start: Int) -> (found: Bool, index: Int) {
        guard start < storedKeys.count else { return (false, storedKeys.count) }
        let first = UTF8Key.compare(storedKeys[start], key)
        if first >= 0 { return (first == 0, start) }
        let last = UTF8Key.compare(storedKeys[storedKeys.count - 1], key)
        if last < 0 { return (false, storedKeys.count) }
        if last == 0 { return (true, storedKeys.count - 1) }
        return search(key, between: start + 1, storedKeys.count - 1)
    }

    /// Runs `body` on every member, each read in place (no copy of a member), in key order.
    ///
    /// - Complexity: O(n) calls of `body`.
    @inlinable
    func forEachMember(_ body: (borrowing Mapped) -> Void) {
        _ = allMembers {
            body($0)
            return true
        }
    }

    /// Whether `body` holds for every member, each read in place (no copy of a member), in key
    /// order; stops at the first member it does not hold for.
    ///
    /// - Complexity: O(n) calls of `body` at most.
    @inlinable
    func allMembers(_ body: (borrowing Mapped) -> Bool) -> Bool {
        storedValues.withUnsafeBufferPointer { members in
            for position in members.indices where !body(members[position]) { return false }
            return true
        }
    }

    /// Runs `body` on the member at `position`, in place (no copy of the member while the map's
    /// storage is uniquely referenced).
    @inlinable
    mutating func modifyMember<R, E: Error>(at position: Int, _ body: (inout Mapped) throws(E) -> R) throws(E) -> R {
        try body(&storedValues[position])
    }

    /// Removes the entry at `position`.
    ///
    /// - Complexity: O(n − position).
    mutating func remove(at position: Int) {
        storedKeys.remove(at: position)
        storedValues.remove(at: position)
    }

    /// Inserts keys the map does not hold, each at the index (in the map as it is now) that
    /// ``search(_:from:)`` gave; `insertions` are in ascending key order.
    ///
    /// - Complexity: O(k · n) for a few insertions, otherwise O(n + k): entries move, none is copied.
    mutating func insert(sorted insertions: [(index: Int, key: String, member: Mapped)]) {
        if insertions.count < 4 {
            for (shift, insertion) in insertions.enumerated() {
                insert(insertion.key, insertion.member, at: insertion.index + shift)
            }
            return
        }
        // Build both arrays back to front, moving entries out of the old ones, then reverse.
        var oldKeys: [String] = []
        var oldValues: [Mapped] = []
        swap(&oldKeys, &storedKeys)
        swap(&oldValues, &storedValues)
        storedKeys.reserveCapacity(oldKeys.count + insertions.count)
        storedValues.reserveCapacity(oldKeys.count + insertions.count)
        var next = insertions.count - 1
        while next >= 0 || !oldKeys.isEmpty {
            if next >= 0, insertions[next].index >= oldKeys.count {
                storedKeys.append(insertions[next].key)
                storedValues.append(insertions[next].member)
                next -= 1
            } else {
                storedKeys.append(oldKeys.removeLast())
                storedValues.append(oldValues.removeLast())
            }
        }
        storedKeys.reverse()
        storedValues.reverse()
    }

    /// Removes the entries whose member satisfies `shouldRemove`, keeping the others in order.
    ///
    /// - Complexity: O(n); entries move by swapping, none is copied.
    mutating func removeMembers(where shouldRemove: (Mapped) throws -> Bool) rethrows {
        var kept = 0
        for i in storedValues.indices where !(try shouldRemove(storedValues[i])) {
            if kept != i {
                storedKeys.swapAt(kept, i)
                storedValues.swapAt(kept, i)
            }
            kept += 1
        }
        storedKeys.removeSubrange(kept...)
        storedValues.removeSubrange(kept...)
    }
}

// MARK: - Collection

extension UTF8Map: RandomAccessCollection {
    public typealias Element = (key: String, value: Mapped)
    public typealias Index = Int
    public typealias Indices = Range<Int>

    @inlinable public var startIndex: Int { 0 }
    @inlinable public var endIndex: Int { storedKeys.count }
    @inlinable public var count: Int { storedKeys.count }
    @inlinable public var isEmpty: Bool { storedKeys.isEmpty }

    /// The entry at a position (positions run in key order).
    @inlinable
    public subscript(position: Int) -> Element { (storedKeys[position], storedValues[position]) }

    @inlinable
    public func index(after i: Int) -> Int { i + 1 }

    @inlinable
    public func index(before i: Int) -> Int { i - 1 }
}

extension UTF8Map: ExpressibleByDictionaryLiteral {
    /// A map from a literal; the keys may come in any order.
    ///
    /// - Precondition: no key appears twice (byte-wise), as with `Dictionary`.
    public init(dictionaryLiteral elements: (String, Mapped)...) {
        self.init(uniqueKeysWithValues: elements)
    }
}

extension UTF8Map: Equatable where Mapped: Equatable {
    /// Same keys (byte-wise) with equal members.
    ///
    /// - Complexity: O(n).
    public static func == (lhs: UTF8Map, rhs: UTF8Map) -> Bool {
        guard lhs.count == rhs.count else { return false }
        for i in 0..<lhs.count {
            guard UTF8Key.equal(lhs.storedKeys[i], rhs.storedKeys[i]), lhs.storedValues[i] == rhs.storedValues[i]
            else { return false }
        }
        return true
    }
}

extension UTF8Map: Hashable where Mapped: Hashable {
    /// Hashes the count, then every key's bytes and member in key order.
    ///
    /// - Complexity: O(n).
    public func hash(into hasher: inout Hasher) {
        hasher.combine(count)
        for i in 0..<count {
            UTF8Key.hash(storedKeys[i], into: &hasher)
            hasher.combine(storedValues[i])
        }
    }
}

extension UTF8Map: Sendable where Mapped: Sendable {}

extension UTF8Map: CustomStringConvertible, CustomDebugStringConvertible {
    /// `["a": 1, "b": 2]` in key order, like `Dictionary`.
    public var description: String {
        guard !isEmpty else { return "[:]" }
        var out = "["
        for (i, (key, member)) in zip(storedKeys, storedValues).enumerated() {
            if i > 0 { out += ", " }
            debugPrint(key, terminator: "", to: &out)
            out += ": "
            debugPrint(member, terminator: "", to: &out)
        }
        return out + "]"
    }

    public var debugDescription: String { description }
}

/// Two entries with the same key (byte-wise) where keys must be unique.
public struct DuplicateKeyError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The repeated key.
    public var key: String

    public init(key: String) { self.key = key }

    public var description: String { "key \(key.debugDescription) appears twice" }
}
