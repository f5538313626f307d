/// A site ID: the 64-bit identity that stamps a node's writes.
public typealias SiteID = UInt64

/// The stamp of a write: its HLC timestamp, tie-broken by the writer's site ID.
public struct Stamp: Hashable, Comparable, Sendable, CustomStringConvertible {
    public var time: HLCTimestamp
    public var site: SiteID

    public init(time: HLCTimestamp, site: SiteID) {
        self.time = time
        self.site = site
    }

    public static func < (lhs: Stamp, rhs: Stamp) -> Bool {
        lhs.time != rhs.time ? lhs.time < rhs.time : lhs.site < rhs.site
    }

    public var description: String { "\(time)@\(String(site, radix: 16))" }
}

/// A version vector: for each site, the highest HLC timestamp of its writes that something covers.
public typealias VersionVector = [SiteID: HLCTimestamp]

extension Dictionary where Key == SiteID, Value == HLCTimestamp {
    /// Raises this vector to cover `stamp`.
    mutating func include(_ stamp: Stamp) {
        if let t = self[stamp.site], t >= stamp.time { return }
        self[stamp.site] = stamp.time
    }

    /// Pointwise maximum. - Returns: whether this vector changed.
    @discardableResult
    mutating func join(_ other: VersionVector) -> Bool {
        var changed = false
        for (site, time) in other where (self[site].map { $0 < time } ?? true) {
            self[site] = time
            changed = true
        }
        return changed
    }

    /// Whether a write with this stamp is covered (seen by a remover).
    func covers(_ stamp: Stamp) -> Bool {
        guard let t = self[stamp.site] else { return false }
        return stamp.time <= t
    }
}

/// A last-writer-wins register: a value and the stamp of the write that set it.
public struct Register: Hashable, Sendable {
    public var value: Value
    public var stamp: Stamp

    public init(value: Value, stamp: Stamp) {
        self.value = value
        self.stamp = stamp
    }

    mutating func join(_ other: Register) -> Bool {
        // Equal stamps name the same write, so the same value.
        guard other.stamp > stamp else { return false }
        self = other
        return true
    }
}

/// A PN-counter: each site's running total of its increments, and the latest restart.
///
/// Value = restart value + Σ over sites (site total − that site's total the restart had seen).
/// A restart is a last-writer-wins write; increments concurrent with it (not seen by it) survive.
public struct Counter: Hashable, Sendable {
    /// Running total of each site's increments, stamped by its latest increment.
    public var totals: [SiteID: CounterTotal] = [:]
    /// The latest restart: its value (a number) and stamp.
    public var restart: Register?
    /// Per site, the latest of its totals any restart or remove had seen (that much is not counted
    /// again). Compared by stamp, not amount: totals fall with negative increments.
    public var restartSeen: [SiteID: CounterTotal] = [:]

    public init() {}

    /// Records every current total as seen by a restart.
    mutating func seeAllTotals() {
        for (site, total) in totals where (restartSeen[site].map { $0.stamp < total.stamp } ?? true) {
            restartSeen[site] = total
        }
    }

    /// The stamp of the latest restart or increment.
    var latestStamp: Stamp? {
        var latest = restart?.stamp
        for total in totals.values where latest.map({ $0 < total.stamp }) ?? true { latest = total.stamp }
        return latest
    }

    mutating func join(_ other: Counter) -> Bool {
        var changed = false
        for (site, total) in other.totals where (totals[site].map { $0.stamp < total.stamp } ?? true) {
            totals[site] = total
            changed = true
        }
        if let r = other.restart, restart.map({ $0.stamp < r.stamp }) ?? true {
            restart = r
            changed = true
        }
        // Each restart (or remove) saw some of each site's total; none of that counts again.
        for (site, seen) in other.restartSeen where (restartSeen[site].map { $0.stamp < seen.stamp } ?? true) {
            restartSeen[site] = seen
            changed = true
        }
        return changed
    }
}

/// One site's running counter total.
public struct CounterTotal: Hashable, Sendable {
    public var total: Double
    public var stamp: Stamp
}

/// The replicated state of one field: whichever of register, map or counter was written last
/// (and is not removed) is what the field shows.
///
/// `removed` is the field's observed-remove context: everything under the field at or below it
/// was seen by an unset (or by a write that replaced the field) and is gone.
public struct FieldNode: Hashable, Sendable {
    public var register: Register?
    public var map: MapNode?
    /// The latest write that made this field a map.
    public var mapStamp: Stamp?
    public var counter: Counter?
    public var removed: VersionVector = [:]

    public init() {}

    /// Every write under this field, per site (the context an unset or replacement records).
    func versionVector(into vv: inout VersionVector) {
        if let r = register { vv.include(r.stamp) }
        if let s = mapStamp { vv.include(s) }
        if let map { for node in map.entries.values { node.versionVector(into: &vv) } }
        if let counter {
            if let r = counter.restart { vv.include(r.stamp) }
            for total in counter.totals.values { vv.include(total.stamp) }
        }
    }

    mutating func join(_ other: FieldNode) -> Bool {
        var changed = false
        if let r = other.register {
            if register == nil {
                register = r
                changed = true
            } else if register!.join(r) {
                changed = true
            }
        }
        if let s = other.mapStamp, mapStamp.map({ $0 < s }) ?? true {
            mapStamp = s
            changed = true
        }
        if let m = other.map {
            if map == nil {
                map = m
                changed = true
            } else if map!.join(m) {
                changed = true
            }
        }
        if let c = other.counter {
            if counter == nil {
                counter = c
                changed = true
            } else if counter!.join(c) {
                changed = true
            }
        }
        if removed.join(other.removed) { changed = true }
        return changed
    }

    /// The field as applications see it under the inherited remove context, with the stamp of its
    /// latest visible write (which decides between register, map and counter); `nil` when nothing
    /// under it is visible.
    func materialize(_ inherited: VersionVector) -> (value: Value, stamp: Stamp)? {
        visible(inherited).map { ($0.value, $0.stamp) }
    }

    /// Which part of the field shows.
    enum Kind { case register, map, counter }

    /// The visible value, the stamp deciding it, and which part it comes from. On equal stamps
    /// (one write that both set a register and restarted a counter) the register shows.
    func visible(_ inherited: VersionVector) -> (value: Value, stamp: Stamp, kind: Kind)? {
        var context = inherited
        if !removed.isEmpty { context.join(removed) }
        var best: (value: Value, stamp: Stamp, kind: Kind)?
        func offer(_ value: Value, _ stamp: Stamp, _ kind: Kind) {
            if best.map({ $0.stamp < stamp }) ?? true { best = (value, stamp, kind) }
        }
        if let r = register, !context.covers(r.stamp) { offer(r.value, r.stamp, .register) }
        if let map {
            var latest = mapStamp.flatMap { context.covers($0) ? nil : $0 }
            var out = UTF8Map<Value>()
            for (key, node) in map.entries {
                guard let (value, stamp) = node.materialize(context) else { continue }
                out[key] = value
                if latest.map({ $0 < stamp }) ?? true { latest = stamp }
            }
            if let latest { offer(.map(out), latest, .map) }
        }
        if let counter {
            var latest: Stamp?
            var sum = 0.0
            if let r = counter.restart, !context.covers(r.stamp) {
                sum = r.value.numberValue ?? 0
                latest = r.stamp
            }
            for (site, total) in counter.totals where !context.covers(total.stamp) {
                sum += total.total - (counter.restartSeen[site]?.total ?? 0)
                if latest.map({ $0 < total.stamp }) ?? true { latest = total.stamp }
            }
            if let latest { offer(.double(sum), latest, .counter) }
        }
        return best
    }
}

/// A map merged per key.
public struct MapNode: Hashable, Sendable {
    public var entries: [String: FieldNode] = [:]

    public init() {}

    mutating func join(_ other: MapNode) -> Bool {
        var changed = false
        for (key, node) in other.entries {
            if entries[key] == nil {
                entries[key] = node
                changed = true
            } else if entries[key]!.join(node) {
                changed = true
            }
        }
        return changed
    }
}

/// The replicated (CRDT) state of one document (docs/DATA-MODEL.md).
///
/// - Maps, the document root included, merge per key; leaves and arrays are last-writer-wins
///   registers decided by (HLC, site ID); counters sum each site's increments.
/// - Removes are **add-wins (observed-remove)**: removing the document, or unsetting a field, takes
///   away exactly the writes the remover had seen (recorded as a version vector, the remove
///   context); a concurrent write it had not seen survives, and writing to a removed `_id` brings the
///   document back with only the new writes.
/// - ``merge(_:)`` is a join (commutative, associative, idempotent): every part merges by maximum
///   stamp or pointwise maximum, and what applications see is derived from the joined state.
public struct DocumentState: Hashable, Sendable {
    public var root: MapNode
    /// Every write the state holds, per site.
    public var writes: VersionVector
    /// The document's remove context.
    public var removed: VersionVector

    public init(root: MapNode = MapNode(), writes: VersionVector = [:], removed: VersionVector = [:]) {
        self.root = root
        self.writes = writes
        self.removed = removed
    }

    /// `true` when every write this state holds was seen by a remove (or it holds none).
    public var isDeleted: Bool {
        for (site, time) in writes {
            if let context = removed[site], time <= context { continue }
            return false
        }
        return true
    }

    /// Records a write at `stamp` even if no field changes (an upsert of only `_id` creates the document).
    public mutating func noteWrite(_ stamp: Stamp) {
        writes.include(stamp)
    }

    // MARK: Local operations

    /// Navigates to the field at `path` and runs `body` on it. With `create`, missing maps on the
    /// way are created (and every map on the way records the write); without, a missing step
    /// skips `body` and returns `nil`.
    @discardableResult
    private mutating func withField<R>(
        _ path: FieldPath, stamp: Stamp, create: Bool = true, _ body: (inout FieldNode) throws(DocumentStateError) -> R
    ) throws(DocumentStateError) -> R? {
        guard case .key(let first)? = path.components.first else {
            throw DocumentStateError(message: "a path must start with a field name, not '\(path)'")
        }
        return try Self.withField(in: &root, first, path.components.dropFirst(), stamp: stamp, create: create, body)
    }

    private static func withField<R>(
        in map: inout MapNode, _ key: String, _ rest: ArraySlice<FieldPath.Component>, stamp: Stamp, create: Bool,
        _ body: (inout FieldNode) throws(DocumentStateError) -> R
    ) throws(DocumentStateError) -> R? {
        guard create || map.entries[key] != nil else { return nil }
        var node = map.entries.removeValue(forKey: key) ?? FieldNode()
        defer { map.entries[key] = node }
        guard let next = rest.first else { return try body(&node) }
        guard case .key(let childKey) = next else {
            throw DocumentStateError(
                message: "'\(key)' holds an array, which is one register: set the whole array, not an element")
        }
        guard create || node.map != nil else { return nil }
        if create, node.mapStamp.map({ $0 < stamp }) ?? true { node.mapStamp = stamp }
        var child = node.map ?? MapNode()
        defer { node.map = child }
        return try withField(in: &child, childKey, rest.dropFirst(), stamp: stamp, create: create, body)
    }

    /// Sets the field at `path` to `value`, replacing whatever it held (a map value replaces the
    /// map: keys not in it are removed).
    ///
    /// - Throws: ``DocumentStateError`` for a path through an array index.
    public mutating func set(_ path: FieldPath, to value: Value, stamp: Stamp) throws(DocumentStateError) {
        try checkParents(of: path)
        try withField(path, stamp: stamp) { node in
            if Self.restartIfCounter(&node, with: value, stamp: stamp) { return }
            Self.kill(&node, stamp: stamp, includingOwnStamp: false)
            Self.write(value, into: &node, stamp: stamp, replace: true)
        }
        writes.include(stamp)
    }

    /// Every map on the way to `path` must be a map or absent: writing `s.x` never turns a string
    /// `s` into a map silently.
    private func checkParents(of path: FieldPath) throws(DocumentStateError) {
        guard path.components.count > 1 else { return }
        for length in 1..<path.components.count {
            let prefix = FieldPath(components: Array(path.components.prefix(length)))
            guard let value = value(at: prefix) else { return }
            guard case .map = value else {
                throw DocumentStateError(
                    message: "cannot write '\(path)': '\(prefix)' holds \(value.typeName), not a map")
            }
        }
    }

    /// Writing a number to a field that shows a counter restarts the counter at that number
    /// (Ditto's `RESTART WITH`): increments the writer had seen are not counted again, concurrent
    /// ones still are.
    ///
    /// - Returns: whether the write was a restart.
    static func restartIfCounter(_ node: inout FieldNode, with value: Value, stamp: Stamp) -> Bool {
        guard let number = value.numberValue, var counter = node.counter, node.visible([:])?.kind == .counter else {
            return false
        }
        counter.restart = Register(value: .double(number), stamp: stamp)
        counter.seeAllTotals()
        node.counter = counter
        return true
    }

    /// Removes everything under a field that this replica has seen: its writes join the field's
    /// remove context, and counters restart at 0 having seen their current totals (so a concurrent
    /// increment from elsewhere counts only itself when it arrives).
    ///
    /// - Parameter includingOwnStamp: the operation's own stamp joins the context too (unset,
    ///   remove), hiding the counter restarts it writes.
    static func kill(_ node: inout FieldNode, stamp: Stamp, includingOwnStamp: Bool) {
        var seen = VersionVector()
        node.versionVector(into: &seen)
        if includingOwnStamp { seen.include(stamp) }
        node.removed.join(seen)
        restartCounters(&node, stamp: stamp)
    }

    static func restartCounters(_ node: inout FieldNode, stamp: Stamp) {
        if var counter = node.counter, counter.restart.map({ $0.stamp < stamp }) ?? true {
            counter.restart = Register(value: .double(0), stamp: stamp)
            counter.seeAllTotals()
            node.counter = counter
        }
        if var map = node.map {
            for key in Array(map.entries.keys) {
                restartCounters(&map.entries[key]!, stamp: stamp)
            }
            node.map = map
        }
    }

    /// Writes top-level fields as Ditto's `merge` upsert does: nested maps merge per key, every
    /// other value replaces the field.
    public mutating func merge(fields: UTF8Map<Value>, stamp: Stamp) {
        for (key, value) in fields {
            var node = root.entries[key] ?? FieldNode()
            Self.write(value, into: &node, stamp: stamp, replace: false)
            root.entries[key] = node
        }
        writes.include(stamp)
    }

    private static func write(_ value: Value, into node: inout FieldNode, stamp: Stamp, replace: Bool) {
        if case .map(let entries) = value {
            if node.mapStamp.map({ $0 < stamp }) ?? true { node.mapStamp = stamp }
            var map = node.map ?? MapNode()
            for (key, child) in entries {
                var childNode = map.entries[key] ?? FieldNode()
                write(child, into: &childNode, stamp: stamp, replace: replace)
                map.entries[key] = childNode
            }
            node.map = map
        } else {
            if !replace {
                if restartIfCounter(&node, with: value, stamp: stamp) { return }
                // A leaf replaces whatever was there (a map): it is seen and removed.
                kill(&node, stamp: stamp, includingOwnStamp: false)
            }
            node.register = Register(value: value, stamp: stamp)
        }
    }

    /// Removes the field at `path` (observed-remove: concurrent writes not seen here survive).
    ///
    /// - Returns: whether the field was visible before.
    @discardableResult
    public mutating func unset(_ path: FieldPath, stamp: Stamp) throws(DocumentStateError) -> Bool {
        let existed = value(at: path) != nil
        try withField(path, stamp: stamp, create: false) { node in
            Self.kill(&node, stamp: stamp, includingOwnStamp: true)
        }
        return existed
    }

    /// Adds `amount` to the counter at `path` (Ditto's `increment(by:)`). A field holding a number
    /// becomes a counter starting from that number; a missing field, a counter starting from 0.
    ///
    /// - Throws: ``DocumentStateError`` when the field holds something other than a number, or the
    ///   amount is not finite.
    public mutating func increment(_ path: FieldPath, by amount: Double, stamp: Stamp) throws(DocumentStateError) {
        guard amount.isFinite else { throw DocumentStateError(message: "cannot increment '\(path)' by \(amount)") }
        try checkParents(of: path)
        let current = value(at: path)
        switch current {
        case nil, .int?, .double?: break
        case let other?: throw DocumentStateError(message: "cannot increment '\(path)': it holds \(other.typeName)")
        }
        try withField(path, stamp: stamp) { node in
            var counter = node.counter ?? Counter()
            let counterIsCurrent = current != nil && node.visible([:])?.kind == .counter
            if !counterIsCurrent {
                // Start (again) from what the field shows; earlier totals are not counted twice.
                counter.restart = Register(value: .double(current?.numberValue ?? 0), stamp: stamp)
                counter.seeAllTotals()
            }
            let previous = counter.totals[stamp.site]?.total ?? 0
            counter.totals[stamp.site] = CounterTotal(total: previous + amount, stamp: stamp)
            node.counter = counter
        }
        writes.include(stamp)
    }

    /// Removes the document as the local node sees it: every write this state holds becomes
    /// covered by the remove context (a tombstone); counters restart having seen their totals.
    public mutating func remove(stamp: Stamp) {
        removed.join(writes)
        removed.include(stamp)
        for key in Array(root.entries.keys) {
            Self.restartCounters(&root.entries[key]!, stamp: stamp)
        }
    }

    /// Joins another replica's state of the same document into this one.
    ///
    /// - Returns: `true` when this state changed.
    /// - Complexity: O(size of `other`).
    @discardableResult
    public mutating func merge(_ other: DocumentState) -> Bool {
        var changed = root.join(other.root)
        if writes.join(other.writes) { changed = true }
        if removed.join(other.removed) { changed = true }
        return changed
    }

    /// The visible value at a field path (array indexes look inside arrays), `nil` when absent.
    public func value(at path: FieldPath) -> Value? {
        guard !isDeleted, case .key(let first)? = path.components.first,
            let (value, _) = root.entries[first]?.materialize(removed)
        else { return nil }
        return value.value(at: FieldPath(components: Array(path.components.dropFirst())))
    }

    /// The document as applications see it: a map of the visible fields plus `_id`, or `nil` when
    /// the document is removed.
    ///
    /// - Complexity: O(size of the state).
    public func materialize(id: Value) -> Value? {
        guard !isDeleted else { return nil }
        var out = UTF8Map<Value>()
        out.reserveCapacity(root.entries.count + 1)
        for (key, node) in root.entries {
            if let (value, _) = node.materialize(removed) { out[key] = value }
        }
        out["_id"] = id
        return .map(out)
    }

    /// The highest HLC timestamp in this state, for advancing the local clock on receive.
    public var maxTime: HLCTimestamp {
        var m = HLCTimestamp.zero
        for t in writes.values where t > m { m = t }
        for t in removed.values where t > m { m = t }
        return m
    }
}

/// A document state that does not decode, or an operation it cannot take.
public struct DocumentStateError: Error, Equatable, Sendable, CustomStringConvertible {
    public var message: String
    public init(message: String) { self.message = message }
    public var description: String { message }
}
