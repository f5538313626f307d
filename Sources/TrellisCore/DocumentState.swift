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
    /// Raises this vector to cover `stamp`. - Returns: whether it changed.
    @discardableResult
    mutating func include(_ stamp: Stamp) -> Bool {
        if let t = self[stamp.site], t >= stamp.time { return false }
        self[stamp.site] = stamp.time
        return true
    }

    /// Pointwise maximum. - Returns: whether this vector changed.
    @discardableResult
    mutating func join(_ other: VersionVector) -> Bool {
        var changed = false
        for (site, time) in other where self[site].map({ $0 < time }) ?? true {
            self[site] = time
            changed = true
        }
        return changed
    }

    /// This vector joined with `other` (cheap when `other` is empty).
    func joined(_ other: VersionVector) -> VersionVector {
        guard !other.isEmpty else { return self }
        guard !isEmpty else { return other }
        var out = self
        out.join(other)
        return out
    }

    /// Whether a write with this stamp is covered (seen by a remover).
    func covers(_ stamp: Stamp) -> Bool {
        guard let t = self[stamp.site] else { return false }
        return stamp.time <= t
    }

    /// Whether a state whose causal context (its write vector joined with its remove context) is
    /// this vector has seen the write `stamp`, so that lacking it means it dropped it (removed or
    /// overwrote it): the join's dot-store rule (docs/DATA-MODEL.md, "Normal form, and why merge
    /// is a join"). Default data (HLC time zero) is never vouched for this way: a site writes it
    /// whatever it wrote before, so only remove contexts cover it.
    func saw(_ stamp: Stamp) -> Bool { stamp.time != .zero && covers(stamp) }
}

/// The causal contexts of the two states a join meets (each one's write vector joined with its
/// remove context): an entry or a counter total one side holds and the other lacks although the
/// other saw it was dropped there, and the join drops it.
///
/// A delta (``StateDelta``) vouches only for the stamps it adds to its base: `theirsAbove` is that
/// base, and what it covers is not taken as seen by the other side (δ-CRDT deltas, Almeida,
/// Shoker and Baquero 2018: a delta's context is only the dots it holds).
struct CausalContexts {
    var mine: VersionVector
    var theirs: VersionVector
    var theirsAbove: VersionVector = [:]

    /// Whether the other side saw the write `stamp` (and so dropped it if it lacks it).
    func theySaw(_ stamp: Stamp) -> Bool {
        theirs.saw(stamp) && (theirsAbove.isEmpty || !theirsAbove.covers(stamp))
    }

    /// Whether the other side's context covers `stamp` (counter totals, time zero included).
    func theyCover(_ stamp: Stamp) -> Bool {
        theirs.covers(stamp) && (theirsAbove.isEmpty || !theirsAbove.covers(stamp))
    }
}

/// The remove contexts in force at a field (docs/DATA-MODEL.md, "What a state holds"): the
/// document's `r` joined with the `removed` of every field on the path down to it.
///
/// A stamp above time zero is covered when the joined contexts cover it. Default data (time zero)
/// is covered only by the document's `r`, which covers the defaults of every site it names and is
/// never reaped, or by the field's own cover of the site's default (an entry at time zero in its
/// `removed`, or the site in its ``FieldNode/removedDefaults``): a field's context entry above zero does not cover defaults, so reaping it (after the TTL)
/// drops no cover of a default, and reaping commutes with the join (docs/DATA-MODEL.md, "Why
/// states agree").
struct ContextInForce {
    /// The joined contexts.
    private(set) var joined: VersionVector
    /// The document's remove context `r`.
    let document: VersionVector

    /// The context in force at the top-level fields: the document's `r`.
    init(document: VersionVector) {
        joined = document
        self.document = document
    }

    /// The context in force below a field whose remove context is `removed`.
    func joined(_ removed: VersionVector) -> ContextInForce {
        guard !removed.isEmpty else { return self }
        var out = self
        out.joined.join(removed)
        return out
    }

    var isEmpty: Bool { joined.isEmpty }

    /// The joined contexts' time for `site`.
    subscript(_ site: SiteID) -> HLCTimestamp? { joined[site] }

    /// Whether a counter total with `stamp` is covered (totals are never default data: one at time
    /// zero is judged like any other).
    func coversTotal(_ stamp: Stamp) -> Bool { joined.covers(stamp) }
}

// MARK: - Counter numbers

/// Arithmetic on counter numbers: `.int` (Int64) while exact, `.double` otherwise
/// (docs/DATA-MODEL.md rule 4).
enum CounterNumber {
    /// Whether `value` can be a counter amount, total or restart: an int or a finite double.
    static func isNumber(_ value: Value) -> Bool {
        switch value {
        case .int: return true
        case .double(let d): return d.isFinite
        default: return false
        }
    }

    /// `a + b`: an int when both are ints, else a double.
    ///
    /// - Returns: `nil` when the int sum overflows Int64 or the double sum is not finite.
    static func add(_ a: Value, _ b: Value) -> Value? {
        if case .int(let x) = a, case .int(let y) = b {
            let (sum, overflow) = x.addingReportingOverflow(y)
            return overflow ? nil : .int(sum)
        }
        guard let x = a.numberValue, let y = b.numberValue else { return nil }
        let sum = x + y
        return sum.isFinite ? .double(sum) : nil
    }

    /// `base + Σ (total − sub)` over `terms` in the given order: exact Int64 arithmetic when every
    /// number is an int and nothing overflows, otherwise doubles in the same order
    /// (`acc = Double(base); acc += Double(total) − Double(sub)`), clamped to the finite range.
    static func sum(base: Value, terms: [(total: Value, sub: Value)]) -> Value {
        if case .int(var acc) = base {
            var exact = true
            for term in terms {
                guard case .int(let total) = term.total, case .int(let sub) = term.sub else {
                    exact = false
                    break
                }
                let (difference, o1) = total.subtractingReportingOverflow(sub)
                let (next, o2) = acc.addingReportingOverflow(difference)
                if o1 || o2 {
                    exact = false
                    break
                }
                acc = next
            }
            if exact { return .int(acc) }
        }
        var acc = base.numberValue ?? 0
        for term in terms { acc += (term.total.numberValue ?? 0) - (term.sub.numberValue ?? 0) }
        if !acc.isFinite { acc = acc < 0 ? -.greatestFiniteMagnitude : .greatestFiniteMagnitude }
        return .double(acc)
    }
}

extension Value {
    /// Whether this can be a counter amount: an `.int` or a finite `.double`.
    public var isCounterNumber: Bool { CounterNumber.isNumber(self) }

    /// Adds two numbers the way counters do (docs/DATA-MODEL.md rule 4): an `.int` when both are
    /// ints, otherwise a `.double`.
    ///
    /// - Returns: `nil` when either is not a number, the int sum leaves Int64, or the double sum
    ///   is not finite.
    public static func counterSum(_ a: Value, _ b: Value) -> Value? {
        guard a.isCounterNumber, b.isCounterNumber else { return nil }
        return CounterNumber.add(a, b)
    }
}

/// Whether `a`'s canonical CBOR encoding precedes `b`'s, byte-wise (a proper prefix first): the
/// tie-break of equal stamps (docs/DATA-MODEL.md rule 3).
func cborPrecedes(_ a: Value, _ b: Value) -> Bool {
    CBOR.encode(a).lexicographicallyPrecedes(CBOR.encode(b))
}

// MARK: - Field parts

/// One site's running counter total: the sum of all its increments of one counter, stamped by the
/// latest (also used for the totals a restart or a remove had seen).
public struct CounterTotal: Hashable, Sendable {
    /// The total: `.int` while every increment was an int, else `.double`.
    public internal(set) var total: Value
    /// The stamp of the increment that made this total; its site is the site the total belongs to.
    public internal(set) var stamp: Stamp

    public init(total: Value, stamp: Stamp) {
        self.total = total
        self.stamp = stamp
    }

    /// The later of two totals of one site: by stamp, ties by the greater CBOR encoding.
    static func later(_ a: CounterTotal?, _ b: CounterTotal?) -> CounterTotal? {
        guard let a else { return b }
        guard let b else { return a }
        if a.stamp != b.stamp { return a.stamp < b.stamp ? b : a }
        return a.total == b.total || !cborPrecedes(a.total, b.total) ? a : b
    }
}

extension Dictionary where Key == SiteID, Value == CounterTotal {
    /// Keeps the later of this site's total and `total`. - Returns: whether this changed.
    @discardableResult
    mutating func joinLater(_ total: CounterTotal) -> Bool {
        let site = total.stamp.site
        guard let current = self[site] else {
            self[site] = total
            return true
        }
        guard CounterTotal.later(current, total)! != current else { return false }
        self[site] = total
        return true
    }

    /// Per site, the later total. - Returns: whether this changed.
    @discardableResult
    mutating func joinLater(_ other: [SiteID: CounterTotal]) -> Bool {
        var changed = false
        for total in other.values where joinLater(total) { changed = true }
        return changed
    }
}

/// A counter restart: the number written and, per site, the running total the writer had seen
/// (only those amounts are not counted again, and only while this restart wins).
public struct Restart: Hashable, Sendable {
    /// The number written, exactly (`.int` or `.double`).
    public internal(set) var value: Value
    /// Per site, the running total the writer had seen.
    public internal(set) var seen: [SiteID: CounterTotal]

    public init(value: Value, seen: [SiteID: CounterTotal]) {
        self.value = value
        self.seen = seen
    }

    /// What ties between two restarts with one stamp compare: `[value, [[site, time, total], ...]]`.
    var tieKey: Value {
        .array([
            value,
            .array(
                seen.sorted { $0.key < $1.key }.map {
                    .array([
                        .int(Int64(bitPattern: $0.key)), .int(Int64(bitPattern: $0.value.stamp.time.rawValue)),
                        $0.value.total,
                    ])
                }),
        ])
    }
}

/// One site's latest write to a field.
public struct FieldEntry: Hashable, Sendable, Comparable {
    /// What the write put in the field.
    public enum Content: Hashable, Sendable {
        /// A leaf: a scalar or an array.
        case value(Value)
        /// The field became (or stayed) a map: a write below it, or a map value.
        case map
        /// A counter restart.
        case restart(Restart)
        /// A value write whose value this node does not keep (an eviction stub).
        case withheldValue
        /// A map write in an eviction stub.
        case withheldMap

        /// Order of contents at equal stamps (docs/DATA-MODEL.md rule 3).
        var rank: Int {
            switch self {
            case .withheldValue: return 0
            case .withheldMap: return 1
            case .map: return 2
            case .value: return 3
            case .restart: return 4
            }
        }
    }

    public internal(set) var stamp: Stamp
    public internal(set) var content: Content

    public init(stamp: Stamp, content: Content) {
        self.stamp = stamp
        self.content = content
    }

    /// The total order the join keeps the greater of: by stamp, then content rank, then the CBOR
    /// encoding of the value (or of ``Restart/tieKey``).
    public static func < (lhs: FieldEntry, rhs: FieldEntry) -> Bool {
        if lhs.stamp != rhs.stamp { return lhs.stamp < rhs.stamp }
        if lhs.content.rank != rhs.content.rank { return lhs.content.rank < rhs.content.rank }
        if lhs.content == rhs.content { return false }  // the same write (the common case in a join)
        switch (lhs.content, rhs.content) {
        case (.value(let a), .value(let b)): return cborPrecedes(a, b)
        case (.restart(let a), .restart(let b)): return cborPrecedes(a.tieKey, b.tieKey)
        default: return false
        }
    }

    /// Whether this is a value or "map" entry whose content an eviction stub withheld.
    var isWithheld: Bool {
        switch content {
        case .withheldValue, .withheldMap: return true
        default: return false
        }
    }

    /// The same write with its value dropped (for eviction stubs); restarts keep theirs.
    var withheld: FieldEntry {
        switch content {
        case .value: return FieldEntry(stamp: stamp, content: .withheldValue)
        case .map: return FieldEntry(stamp: stamp, content: .withheldMap)
        default: return self
        }
    }
}

/// A field's entries: per writing site, that site's latest write, and apart from it the site's
/// default data (HLC time zero) if the field holds it: a site writes default data whatever it wrote
/// before, so its time-zero entry is not ordered with its other entries, and a later entry does not
/// replace it (only a remove context covers it). One entry (the common case) is stored inline,
/// without a dictionary.
public struct FieldEntries: Hashable, Sendable, Sequence {
    /// Where an entry is kept: its site, and whether it is that site's default data.
    struct Slot: Hashable, Sendable {
        var site: SiteID
        var isDefault: Bool

        init(_ stamp: Stamp) {
            site = stamp.site
            isDefault = stamp.time == .zero
        }
    }

    private enum Storage: Hashable, Sendable {
        case none
        case one(FieldEntry)
        case many([Slot: FieldEntry])  // two or more
    }

    private var storage = Storage.none

    public init() {}

    public var isEmpty: Bool {
        if case .none = storage { return true }
        return false
    }

    public var count: Int {
        switch storage {
        case .none: return 0
        case .one: return 1
        case .many(let d): return d.count
        }
    }

    /// The entry of `site`, if it wrote this field: its latest write, else its default data.
    public subscript(site: SiteID) -> FieldEntry? {
        entry(inSlotOf: Stamp(time: HLCTimestamp(rawValue: 1), site: site))
            ?? entry(inSlotOf: Stamp(time: .zero, site: site))
    }

    /// Whether `site` wrote this field (an entry or default data).
    func names(_ site: SiteID) -> Bool {
        switch storage {
        case .none: return false
        case .one(let e): return e.stamp.site == site
        case .many(let d): return d.keys.contains { $0.site == site }
        }
    }

    /// The entry kept where one stamped `stamp` would be (its site's latest write, or its default
    /// data when `stamp` is at time zero).
    func entry(inSlotOf stamp: Stamp) -> FieldEntry? {
        switch storage {
        case .none: return nil
        case .one(let e): return Slot(e.stamp) == Slot(stamp) ? e : nil
        case .many(let d): return d[Slot(stamp)]
        }
    }

    /// Keeps the greater of the entry in its slot and `entry`. - Returns: whether this changed.
    @discardableResult
    mutating func note(_ entry: FieldEntry) -> Bool {
        let slot = Slot(entry.stamp)
        switch storage {
        case .none:
            storage = .one(entry)
            return true
        case .one(let current):
            if Slot(current.stamp) == slot {
                guard current < entry else { return false }
                storage = .one(entry)
            } else {
                storage = .many([Slot(current.stamp): current, slot: entry])
            }
            return true
        case .many(var d):
            if let current = d[slot], !(current < entry) { return false }
            storage = .none  // keeps `d` uniquely referenced while it changes
            d[slot] = entry
            storage = .many(d)
            return true
        }
    }

    /// Removes the entries `remove` selects. - Returns: whether any was removed.
    @discardableResult
    mutating func removeAll(where remove: (FieldEntry) -> Bool) -> Bool {
        switch storage {
        case .none: return false
        case .one(let e):
            guard remove(e) else { return false }
            storage = .none
            return true
        case .many(var d):
            guard d.values.contains(where: remove) else { return false }
            storage = .none
            d = d.filter { !remove($0.value) }
            storage = d.count == 1 ? .one(d.first!.value) : d.isEmpty ? .none : .many(d)
            return true
        }
    }

    /// Replaces every entry by `transform(entry)` (which must keep its stamp).
    mutating func update(_ transform: (FieldEntry) -> FieldEntry) {
        switch storage {
        case .none: break
        case .one(let e): storage = .one(transform(e))
        case .many(var d):
            storage = .none
            for site in Array(d.keys) { d[site] = transform(d[site]!) }
            storage = .many(d)
        }
    }

    public func makeIterator() -> Iterator {
        switch storage {
        case .none: return Iterator(single: nil, many: nil)
        case .one(let e): return Iterator(single: e, many: nil)
        case .many(let d): return Iterator(single: nil, many: d.values.makeIterator())
        }
    }

    /// Iterates the entries (in no particular order).
    public struct Iterator: IteratorProtocol {
        var single: FieldEntry?
        var many: Dictionary<Slot, FieldEntry>.Values.Iterator?

        public mutating func next() -> FieldEntry? {
            if let e = single {
                single = nil
                return e
            }
            return many?.next()
        }
    }
}

/// Which part of a field shows. At equal stamps a value shows before a counter, a counter before
/// a map (the raw values are that precedence).
enum PartKind: Int, Comparable {
    case map = 0
    case counter = 1
    case value = 2

    static func < (lhs: PartKind, rhs: PartKind) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// What a field shows: its value (`nil` when the winning write is withheld in an eviction stub),
/// the stamp that decided it and which part it comes from.
struct FieldPart {
    var value: Value?
    var stamp: Stamp
    var kind: PartKind

    func precedes(_ other: FieldPart) -> Bool {
        stamp != other.stamp ? stamp < other.stamp : kind < other.kind
    }
}

/// The replicated state of one field (docs/DATA-MODEL.md, "What a state holds").
public struct FieldNode: Hashable, Sendable {
    /// Per writing site, that site's latest write to this field.
    public internal(set) var entries = FieldEntries()
    /// The child fields (the field is or was a map).
    public internal(set) var map = MapNode()
    /// Counter: per site, its running total of increments.
    public internal(set) var totals: [SiteID: CounterTotal] = [:]
    /// Counter: per site, the latest running total a remove, an unset or a replacement had seen.
    public internal(set) var removedTotals: [SiteID: CounterTotal] = [:]
    /// The field's observed-remove context. An entry at time zero covers its site's default data
    /// (rule 3) in this field only; one above zero covers the site's writes from above zero up to
    /// it, in this field and below, and no default (protocol 5).
    public internal(set) var removed: VersionVector = [:]
    /// The sites whose default data (time zero) this field's remove context covers apart from
    /// their entry above zero in ``removed`` (docs/DATA-MODEL.md, "Why states agree"): reaping
    /// drops that entry, and the cover of the default must not go with it. A site whose default
    /// alone is covered has `removed[site] == .zero` instead, never both. Joined by union, never
    /// reaped, never dropped for a context above: at most one per site per field whose default
    /// was removed.
    public internal(set) var removedDefaults: Set<SiteID> = []

    public init() {}

    /// Nothing left: the normal form drops such a field.
    var isEmpty: Bool {
        entries.isEmpty && map.isEmpty && totals.isEmpty && removedTotals.isEmpty && removed.isEmpty
            && removedDefaults.isEmpty
    }

    /// Adds `(site, time)` to the remove context (time zero: the cover of the site's default
    /// data), keeping the cover of the default apart from an entry above zero.
    /// - Returns: whether the context changed.
    @discardableResult
    mutating func cover(_ site: SiteID, _ time: HLCTimestamp) -> Bool {
        guard let mine = removed[site] else {
            removed[site] = time
            return true
        }
        if time == .zero { return mine == .zero ? false : removedDefaults.insert(site).inserted }
        if mine == .zero {
            removed[site] = time
            removedDefaults.insert(site)
            return true
        }
        guard mine < time else { return false }
        removed[site] = time
        return true
    }

    /// Drops the remove context's entry of `site` above zero, keeping the cover of its default
    /// if the context held one apart.
    private mutating func uncover(_ site: SiteID) {
        removed[site] = removedDefaults.remove(site) == nil ? nil : .zero
    }

    /// Whether an entry of this field stamped `stamp` is covered, `context` being the context in
    /// force here (this field's `removed` joined in).
    func covers(_ stamp: Stamp, _ context: ContextInForce) -> Bool {
        Self.covers(stamp, context, removed, removedDefaults)
    }

    /// ``covers(_:_:)`` for a field whose remove context is `removed` and `removedDefaults`.
    private static func covers(
        _ stamp: Stamp, _ context: ContextInForce, _ removed: VersionVector, _ removedDefaults: Set<SiteID>
    ) -> Bool {
        guard stamp.time == .zero else { return context.joined.covers(stamp) }
        return context.document[stamp.site] != nil || removed[stamp.site] == .zero
            || removedDefaults.contains(stamp.site)
    }

    /// Keeps the greater of this site's entry and `entry`. - Returns: whether this changed.
    @discardableResult
    mutating func note(_ entry: FieldEntry) -> Bool { entries.note(entry) }

    // MARK: Join and normal form

    /// Joins `other` into this field, keeping the normal form: what the joined context covers is
    /// not taken from `other`, and what it newly covers here is dropped.
    ///
    /// - Parameters:
    ///   - inherited: the joined context above this field.
    ///   - inheritedGrew: whether that context is larger than the one this field was normal under.
    ///   - causal: the causal contexts of the two states: an entry or total that one side holds and
    ///     the other lacks although it saw it is dropped (the dot-store rule).
    /// - Returns: whether this field changed.
    mutating func join(
        _ other: FieldNode, inherited: ContextInForce, inheritedGrew: Bool, causal: CausalContexts
    ) -> Bool {
        // The dot-store rule, both ways, each side judged by what the other held before the join:
        // an entry or total that one side holds and the other saw without holding it (in its
        // slot: the site's latest write, or its default data) was removed or overwritten there.
        // Default data (time zero) is left to remove contexts (`saw`); counter totals are never
        // default data, so a total at time zero is judged like any other (`covers`), which keeps
        // one total per site consistent with the rule in every order of joins.
        let theySawAndLack = { (entry: FieldEntry) in
            causal.theySaw(entry.stamp) && other.entries.entry(inSlotOf: entry.stamp)?.stamp != entry.stamp
        }
        let mine = entries
        let myTotals = totals
        let theirEntries = other.entries.filter {
            !causal.mine.saw($0.stamp) || mine.entry(inSlotOf: $0.stamp)?.stamp == $0.stamp
        }
        let theirTotals = other.totals.values.filter {
            !causal.mine.covers($0.stamp) || myTotals[$0.stamp.site]?.stamp == $0.stamp
        }
        var changed = false
        if entries.removeAll(where: theySawAndLack) { changed = true }
        if totals.contains(where: {
            causal.theyCover($0.value.stamp) && other.totals[$0.key]?.stamp != $0.value.stamp
        }) {
            totals = totals.filter {
                !causal.theyCover($0.value.stamp) || other.totals[$0.key]?.stamp == $0.value.stamp
            }
            changed = true
        }
        var grew = false
        for (site, time) in other.removed {
            // An entry above zero the context above covers is not taken; nor the cover of a
            // default the document's `r` covers.
            if time != .zero, inherited[site].map({ $0 < time }) ?? true, cover(site, time) { grew = true }
            if time == .zero || other.removedDefaults.contains(site), inherited.document[site] == nil,
                cover(site, .zero)
            {
                grew = true
            }
        }
        if grew { changed = true }
        if inheritedGrew || grew, normalizeHere(inherited) { changed = true }
        let context = inherited.joined(removed)
        for entry in theirEntries where !covers(entry.stamp, context) {
            if note(entry) { changed = true }
        }
        for total in theirTotals where !context.coversTotal(total.stamp) {
            if totals.joinLater(total) { changed = true }
        }
        if removedTotals.joinLater(other.removedTotals) { changed = true }
        if map.join(other.map, context: context, contextGrew: inheritedGrew || grew, causal: causal) { changed = true }
        return changed
    }

    /// Drops the entries of this field's remove context, and of every field below, whose time is
    /// before `horizon`, keeping the covers of default data (time zero, and ``removedDefaults``):
    /// only a remove context covers a default. - Returns: whether anything was dropped.
    mutating func reapContexts(before horizon: HLCTimestamp) -> Bool {
        var changed = false
        if removed.contains(where: { $0.value != .zero && $0.value < horizon }) {
            for (site, time) in removed where time != .zero && time < horizon { uncover(site) }
            changed = true
        }
        if map.updateEach({ $0.reapContexts(before: horizon) }) { changed = true }
        return changed
    }

    /// Drops what the context in force covers, in this field and below (docs/DATA-MODEL.md,
    /// "Normal form"). - Returns: whether anything was dropped.
    @discardableResult
    mutating func normalize(_ inherited: ContextInForce) -> Bool {
        var changed = normalizeHere(inherited)
        if map.normalize(inherited.joined(removed)) { changed = true }
        return changed
    }

    /// ``normalize(_:)`` without the children. An entry of the remove context above zero goes
    /// where the context above covers it; the cover of a site's default only where the
    /// document's `r` names the site (the contexts of the fields above do not cover defaults).
    private mutating func normalizeHere(_ inherited: ContextInForce) -> Bool {
        var changed = false
        if !removed.isEmpty, !inherited.isEmpty {
            for (site, time) in removed where time != .zero && inherited[site].map({ time <= $0 }) ?? false {
                uncover(site)
                changed = true
            }
            if !inherited.document.isEmpty {
                for (site, time) in removed where inherited.document[site] != nil {
                    if time == .zero {
                        removed[site] = nil
                        changed = true
                    } else if removedDefaults.remove(site) != nil {
                        changed = true
                    }
                }
            }
        }
        let context = inherited.joined(removed)
        guard !context.isEmpty else { return changed }
        let (own, apart) = (removed, removedDefaults)
        if entries.removeAll(where: { Self.covers($0.stamp, context, own, apart) }) { changed = true }
        if totals.contains(where: { context.coversTotal($0.value.stamp) }) {
            totals = totals.filter { !context.coversTotal($0.value.stamp) }
            changed = true
        }
        return changed
    }

    // MARK: Reading

    /// What the field shows under the inherited context, or `nil` when nothing in it is visible.
    ///
    /// - Complexity: O(size of the field).
    func part(_ inherited: ContextInForce) -> FieldPart? {
        let context = inherited.joined(removed)
        var bestValue: FieldEntry?
        var mapStamp: Stamp?
        var valuedMap = false
        var winner: FieldEntry?
        for entry in entries where !covers(entry.stamp, context) {
            switch entry.content {
            case .value, .withheldValue:
                if bestValue.map({ $0 < entry }) ?? true { bestValue = entry }
            case .map, .withheldMap:
                if mapStamp.map({ $0 < entry.stamp }) ?? true { mapStamp = entry.stamp }
                if case .map = entry.content { valuedMap = true }
            case .restart:
                if winner.map({ $0 < entry }) ?? true { winner = entry }
            }
        }
        var best: FieldPart?
        func offer(_ part: FieldPart) {
            if best.map({ $0.precedes(part) }) ?? true { best = part }
        }
        if let entry = bestValue {
            if case .value(let v) = entry.content {
                offer(FieldPart(value: v, stamp: entry.stamp, kind: .value))
            } else {
                offer(FieldPart(value: Value?.none, stamp: entry.stamp, kind: .value))
            }
        }
        if mapStamp != nil || !map.isEmpty {
            var latest = mapStamp
            var out: UTF8Map<Value> = [:]
            for (key, child) in map.entries {
                guard let p = child.part(context) else { continue }
                if let v = p.value { out[key] = v }
                if latest.map({ $0 < p.stamp }) ?? true { latest = p.stamp }
            }
            if let latest {
                let value: Value? = out.isEmpty && !valuedMap ? nil : .map(out)
                offer(FieldPart(value: value, stamp: latest, kind: .map))
            }
        }
        if let counter = counterPart(context, winner: winner) { offer(counter) }
        return best
    }

    /// The counter's value (docs/DATA-MODEL.md rule 4) and latest visible stamp.
    private func counterPart(_ context: ContextInForce, winner: FieldEntry?) -> FieldPart? {
        guard winner != nil || !totals.isEmpty else { return nil }
        var latest = winner?.stamp
        var base = Value.int(0)
        var seen: [SiteID: CounterTotal] = [:]
        if let winner, case .restart(let r) = winner.content {
            base = r.value
            seen = r.seen
        }
        var terms: [(total: Value, sub: Value)] = []
        for site in totals.keys.sorted() {
            let total = totals[site]!
            guard !context.coversTotal(total.stamp) else { continue }
            if latest.map({ $0 < total.stamp }) ?? true { latest = total.stamp }
            let sub = CounterTotal.later(seen[site], removedTotals[site])
            if let sub, !(sub.stamp < total.stamp) { continue }
            terms.append((total.total, sub?.total ?? .int(0)))
        }
        guard let latest else { return nil }
        return FieldPart(value: CounterNumber.sum(base: base, terms: terms), stamp: latest, kind: .counter)
    }

    /// This site's latest running total of this counter: its total, or what a restart or a
    /// remove last saw of it (the total itself may have been covered and dropped).
    func runningTotal(of site: SiteID) -> CounterTotal? {
        var latest = CounterTotal.later(totals[site], removedTotals[site])
        for entry in entries {
            if case .restart(let r) = entry.content { latest = CounterTotal.later(latest, r.seen[site]) }
        }
        return latest
    }

    /// Every site's latest running total (what a restart or a remove records as seen).
    func runningTotals() -> [SiteID: CounterTotal] {
        var out = removedTotals
        out.joinLater(totals)
        for entry in entries {
            if case .restart(let r) = entry.content { out.joinLater(r.seen) }
        }
        return out
    }

    /// What an unset or a replacement of this field removes of what this replica holds under it,
    /// in one pass: the stamps above time zero of every write, per site, go into `vv` (the
    /// removal's context, ``kill(seen:)``); the default data (entries at time zero) is covered at
    /// once, each in its own field's remove context.
    mutating func takeRemoved(into vv: inout VersionVector) {
        for entry in entries {
            if entry.stamp.time == .zero { cover(entry.stamp.site, .zero) } else { vv.include(entry.stamp) }
        }
        for total in totals.values { vv.include(total.stamp) }
        _ = map.updateEach { child in
            child.takeRemoved(into: &vv)
            return false
        }
    }

    /// How many entries in this field and below are withheld (eviction stubs, rule 8).
    var withheldEntryCount: Int {
        entries.reduce(0) { count, entry in entry.isWithheld ? count + 1 : count }
            + map.entries.values.reduce(0) { $0 + $1.withheldEntryCount }
    }

    /// The withheld entries in this field and below, with the path of their field.
    func withheldEntries(at path: String, into out: inout [(path: String, stamp: Stamp)]) {
        for entry in entries where entry.isWithheld { out.append((path, entry.stamp)) }
        for (key, child) in map.entries { child.withheldEntries(at: path + "." + key, into: &out) }
    }

    /// Whether anything under this field (an entry, a total, a context) names `site`.
    func mentions(_ site: SiteID) -> Bool {
        if entries.names(site) || totals[site] != nil || removedTotals[site] != nil || removed[site] != nil {
            return true
        }
        return map.entries.values.contains { $0.mentions(site) }
    }

    // MARK: Local operations

    /// Records, in this counter and every counter below, the running totals seen now.
    mutating func recordRemovedTotals() {
        if !totals.isEmpty || !removedTotals.isEmpty || entries.contains(where: { $0.isRestart }) {
            removedTotals = runningTotals()
        }
        map.updateEach {
            $0.recordRemovedTotals()
            return true
        }
    }

    /// Removes what this replica held under this field: its stamps above zero (`vv`, from
    /// ``takeRemoved(into:)``, which also covered the default data it held) join the field's
    /// remove context, and its counters record the totals seen.
    mutating func kill(seen vv: VersionVector) {
        for (site, time) in vv { cover(site, time) }
        recordRemovedTotals()
    }

    /// Replaces every value and "map" entry by a withheld one (restarts and totals stay).
    mutating func withholdValues() {
        if entries.contains(where: { $0.withheld != $0 }) { entries.update { $0.withheld } }
        map.updateEach {
            $0.withholdValues()
            return true
        }
    }
}

extension FieldEntry {
    var isRestart: Bool {
        if case .restart = content { return true }
        return false
    }
}

/// A map merged per key: the child fields by key.
///
/// Keys are byte strings (docs/DATA-MODEL.md, "Keys are byte strings"): "é" (U+00E9) and "e" +
/// U+0301 are two children, whatever order their writes arrive in. Entries change only through
/// the subscript, ``modify(_:create:_:)``, ``updateEach(_:)`` and ``join(_:context:contextGrew:)``,
/// which change children in place and drop those left empty (normal form).
public struct MapNode: Hashable, Sendable {
    /// The child fields, in ascending byte order of their keys.
    public internal(set) var entries = UTF8Map<FieldNode>()

    public init() {}

    /// An empty map with room for `minimumCapacity` children (added in ascending key order, each
    /// is an append).
    init(minimumCapacity: Int) {
        entries.reserveCapacity(minimumCapacity)
    }

    var isEmpty: Bool { entries.isEmpty }

    /// The child at `key` (compared byte-wise); setting `nil` removes it.
    ///
    /// - Complexity: O(log n) to read or replace; adding or removing a key shifts the keys after it.
    subscript(key: String) -> FieldNode? {
        get { entries[key] }
        set { entries[key] = newValue }
    }

    /// Runs `body` on the child at `key` in place (on a new, empty child when there is none, if
    /// `create`); a child left empty is dropped (normal form). - Returns: `body`'s result, or
    /// `nil` when there was no child and not `create`.
    ///
    /// - Complexity: O(log n) plus `body`; adding or dropping a key shifts the keys after it.
    @discardableResult
    mutating func modify<R>(_ key: String, create: Bool = true, _ body: (inout FieldNode) throws -> R) rethrows -> R? {
        let (found, position) = entries.search(key)
        if found {
            let (result, emptied) = try entries.modifyMember(at: position) { node in
                let result = try body(&node)
                return (result, node.isEmpty)
            }
            if emptied { entries.remove(at: position) }
            return result
        }
        guard create else { return nil }
        var node = FieldNode()
        let result = try body(&node)
        if !node.isEmpty { entries.insert(key, node, at: position) }
        return result
    }

    /// Changes every child in place, dropping those left empty. - Returns: whether any `body`
    /// returned `true`.
    ///
    /// - Complexity: O(n) plus the calls of `body`.
    @discardableResult
    mutating func updateEach(_ body: (inout FieldNode) -> Bool) -> Bool {
        guard !entries.isEmpty else { return false }
        var changed = false
        var emptied = false
        for position in entries.indices {
            entries.modifyMember(at: position) { node in
                if body(&node) { changed = true }
                if node.isEmpty { emptied = true }
            }
        }
        if emptied { entries.removeMembers(where: \.isEmpty) }
        return changed
    }

    /// Joins `other`'s children into these (see ``FieldNode/join(_:inherited:inheritedGrew:causal:)``);
    /// the children `other` does not have are joined with nothing, so that what the context newly
    /// covers, or what `other` saw and dropped, leaves them.
    ///
    /// Both maps are walked in key order: children in both join in place; children only in
    /// `other` are appended when they sort after every child here, otherwise inserted in one pass
    /// at the end.
    ///
    /// - Returns: whether anything changed.
    /// - Complexity: O(n + m) for `m` children of `other` and `n` of these, plus the joins and
    ///   O(n + m) to insert new children.
    mutating func join(_ other: MapNode, context: ContextInForce, contextGrew: Bool, causal: CausalContexts) -> Bool {
        if other.isEmpty, isEmpty { return false }
        if isEmpty { entries.reserveCapacity(other.entries.count) }
        var changed = false
        var emptied = false
        var added: [(index: Int, key: String, member: FieldNode)] = []
        /// This map's first position not yet visited.
        var next = 0
        /// Children the other side lacks: what the context newly covers, or what the other side saw
        /// (so dropped), goes.
        func joinMine(before end: Int) {
            for position in next..<end {
                entries.modifyMember(at: position) { node in
                    if node.join(FieldNode(), inherited: context, inheritedGrew: contextGrew, causal: causal) {
                        changed = true
                    }
                    if node.isEmpty { emptied = true }
                }
            }
        }
        for (key, theirs) in other.entries {
            let (found, position) = entries.search(key, from: next)
            joinMine(before: position)
            if found {
                entries.modifyMember(at: position) { node in
                    if node.join(theirs, inherited: context, inheritedGrew: contextGrew, causal: causal) {
                        changed = true
                    }
                    if node.isEmpty { emptied = true }
                }
                next = position + 1
            } else {
                var node = FieldNode()
                if node.join(theirs, inherited: context, inheritedGrew: contextGrew, causal: causal) { changed = true }
                if node.isEmpty {
                    next = position
                } else if position == entries.count {
                    // After every key here (always, when joining into an empty map): append. The
                    // keys in `added` sort before it and their positions stay valid.
                    entries.insert(key, node, at: position)
                    next = position + 1
                } else {
                    added.append((position, key, node))
                    next = position
                }
            }
        }
        joinMine(before: entries.count)
        if !added.isEmpty { entries.insert(sorted: added) }
        if emptied { entries.removeMembers(where: \.isEmpty) }
        return changed
    }

    @discardableResult
    mutating func normalize(_ context: ContextInForce) -> Bool {
        updateEach { $0.normalize(context) }
    }

    /// The visible fields with values.
    ///
    /// - Complexity: O(size of the map).
    func materialize(_ context: ContextInForce) -> UTF8Map<Value> {
        entries.compactMapValues { $0.part(context)?.value }
    }
}

// MARK: - Document state

/// The replicated (CRDT) state of one document (docs/DATA-MODEL.md).
///
/// - Fields keep, per writing site, that site's latest write; a field shows the latest write not
///   covered by a remove context (add-wins, observed-remove). Maps, the document root included,
///   merge per key; counters sum each site's running total, exactly.
/// - Removes and unsets keep stamps and contexts, never the values they removed.
/// - ``merge(_:)`` is a join (commutative, associative, idempotent), and every operation leaves
///   the state in one normal form, so replicas that hold the same writes hold the same bytes.
public struct DocumentState: Hashable, Sendable {
    /// The document's fields.
    public internal(set) var root: MapNode
    /// Per site, the latest stamp of any of its operations on this document (writes and unsets).
    public internal(set) var writes: VersionVector
    /// The document's remove context.
    public internal(set) var removed: VersionVector
    /// Per site, its latest write that adds to the document (not an unset or a remove), kept while
    /// ``removed`` does not cover it: the document exists while this is not empty.
    public internal(set) var adds: VersionVector

    /// Whether this state has seen an operation `other` has not, by their causal contexts: a site
    /// `other`'s ``writes`` and ``removed`` do not name, or a write or remove of a site above what
    /// they hold for it. Withheld values (docs/DATA-MODEL.md rule 8) and remove records reaped on
    /// one of the two do not count, nor default data (time zero) a site `other` names wrote again:
    /// a context does not vouch for it. For a state known to be within this one (a delta that
    /// added nothing to it), `false` means the two are equal but for those.
    ///
    /// - Complexity: O(sites of this state).
    public func hasSeenMore(than other: DocumentState) -> Bool {
        func beyond(_ vector: VersionVector) -> Bool {
            vector.contains { site, time in
                let (w, r) = (other.writes[site], other.removed[site])
                guard w != nil || r != nil else { return true }
                return time > max(w ?? .zero, r ?? .zero)
            }
        }
        return beyond(writes) || beyond(removed)
    }

    /// An empty state: no document.
    public init() {
        root = MapNode()
        writes = [:]
        removed = [:]
        adds = [:]
    }

    init(root: MapNode, writes: VersionVector, removed: VersionVector, adds: VersionVector) {
        self.root = root
        self.writes = writes
        self.removed = removed
        self.adds = adds
    }

    /// The state of a document made by one write: `fields` upserted at `stamp` into nothing.
    ///
    /// - Complexity: O(size of `fields`).
    public init(fields: UTF8Map<Value>, stamp: Stamp) {
        self.init()
        merge(fields: fields, stamp: stamp)
    }

    /// `true` when every write that added to the document was seen by a remove (or there is none).
    public var isDeleted: Bool {
        !adds.contains { !removed.covers(Stamp(time: $0.value, site: $0.key)) }
    }

    /// Records a write at `stamp` even if no field changes (an upsert of only `_id` creates the
    /// document).
    public mutating func noteWrite(_ stamp: Stamp) {
        adds.include(stamp)
        writes.include(stamp)
        normalizeDocument()
    }

    // MARK: Paths

    /// The keys of a path that names a field (no array index).
    private static func keys(of path: FieldPath) throws(DocumentStateError) -> [String] {
        var keys: [String] = []
        for component in path.components {
            switch component {
            case .key(let k): keys.append(k)
            case .index:
                guard let last = keys.last else {
                    throw DocumentStateError(message: "a path must start with a field name, not '\(path)'")
                }
                throw DocumentStateError(
                    message: "'\(last)' holds an array, which is one register: set the whole array, not an element")
            }
        }
        guard !keys.isEmpty else {
            throw DocumentStateError(message: "a path must start with a field name, not '\(path)'")
        }
        return keys
    }

    /// What each prefix of `keys` shows, as far as the path leads through maps: the last element
    /// is the part at the last key reached (`nil` when it shows nothing).
    private func parts(along keys: [String]) -> [FieldPart?] {
        var out: [FieldPart?] = []
        var map = root
        var context = ContextInForce(document: removed)
        for key in keys {
            guard let node = map[key] else {
                out.append(nil)
                break
            }
            let part = node.part(context)
            out.append(part)
            guard let part, part.kind == .map else { break }
            context = context.joined(node.removed)
            map = node.map
        }
        return out
    }

    /// Every field on the way to `keys` must show a map or nothing: writing `s.x` never turns a
    /// string `s` into a map silently. - Returns: what the field at `keys` shows.
    private func checkedTarget(_ keys: [String], _ path: FieldPath) throws(DocumentStateError) -> FieldPart? {
        let parts = parts(along: keys)
        for (i, part) in parts.enumerated() where i < keys.count - 1 {
            guard let part else { return nil }
            guard part.kind != .map else { continue }
            let prefix = FieldPath(components: keys[...i].map { .key($0) })
            guard let value = part.value else {
                throw DocumentStateError(
                    message: "cannot write '\(path)': '\(prefix)' holds a value evicted from this node")
            }
            throw DocumentStateError(message: "cannot write '\(path)': '\(prefix)' holds \(value.typeName), not a map")
        }
        return parts.count == keys.count ? parts.last! : nil
    }

    /// Navigates to the field at `keys` and runs `body` on it with the context in force above it.
    /// With `stamp`, missing maps on the way are created and every map on the way records a "map"
    /// entry; without, a missing step skips `body` and returns `nil`.
    @discardableResult
    private mutating func withField<R>(
        _ keys: [String], stamp: Stamp?, _ body: (inout FieldNode, ContextInForce) -> R
    ) -> R? {
        Self.withField(in: &root, keys[...], context: ContextInForce(document: removed), stamp: stamp, body)
    }

    private static func withField<R>(
        in map: inout MapNode, _ keys: ArraySlice<String>, context: ContextInForce, stamp: Stamp?,
        _ body: (inout FieldNode, ContextInForce) -> R
    ) -> R? {
        let rest = keys.dropFirst()
        let result = map.modify(keys.first!, create: stamp != nil) { node -> R? in
            guard !rest.isEmpty else { return body(&node, context) }
            if let stamp { node.note(FieldEntry(stamp: stamp, content: .map)) }
            return withField(in: &node.map, rest, context: context.joined(node.removed), stamp: stamp, body)
        }
        return result ?? nil
    }

    // MARK: Local operations

    /// Sets the field at `path` to `value`, replacing whatever it held (a map value replaces the
    /// map: keys not in it are removed). A number written to a field that shows a counter
    /// restarts the counter at that number (Ditto's `RESTART WITH`), also inside a map value.
    ///
    /// - Throws: ``DocumentStateError`` for a path through an array index or below a field that is
    ///   not a map.
    /// - Complexity: O(size of the field plus `value`).
    public mutating func set(_ path: FieldPath, to value: Value, stamp: Stamp) throws(DocumentStateError) {
        let keys = try Self.keys(of: path)
        _ = try checkedTarget(keys, path)
        withField(keys, stamp: stamp) { node, context in
            Self.write(value, into: &node, context: context, stamp: stamp, replace: true)
        }
        adds.include(stamp)
        writes.include(stamp)
        normalize(key: keys[0])
    }

    /// Writes top-level fields as Ditto's `merge` upsert does: nested maps merge per key, every
    /// other value replaces the field (a number restarts a field that shows a counter).
    ///
    /// - Complexity: O(size of the fields written and of the fields they land on).
    public mutating func merge(fields: UTF8Map<Value>, stamp: Stamp) {
        if root.isEmpty { root = MapNode(minimumCapacity: fields.count) }
        for (key, value) in fields {
            root.modify(key) { node in
                Self.write(value, into: &node, context: ContextInForce(document: removed), stamp: stamp, replace: false)
                node.normalize(ContextInForce(document: removed))
            }
        }
        adds.include(stamp)
        writes.include(stamp)
    }

    /// Writes `value` into `node`. A leaf replaces everything the field held (it is covered); a
    /// map value records a "map" entry and writes its keys (with `replace`, first covering
    /// everything the field held); a number over a visible counter restarts it.
    private static func write(
        _ value: Value, into node: inout FieldNode, context: ContextInForce, stamp: Stamp, replace: Bool
    ) {
        if node.isEmpty {
            // A new field: nothing to restart or cover.
            if case .map(let children) = value {
                node.note(FieldEntry(stamp: stamp, content: .map))
                node.map = MapNode(minimumCapacity: children.count)
                for (key, child) in children {
                    node.map.modify(key) { write(child, into: &$0, context: context, stamp: stamp, replace: false) }
                }
            } else {
                node.note(FieldEntry(stamp: stamp, content: .value(value)))
            }
            return
        }
        if CounterNumber.isNumber(value), node.part(context)?.kind == .counter {
            node.note(FieldEntry(stamp: stamp, content: .restart(Restart(value: value, seen: node.runningTotals()))))
            return
        }
        var seen = VersionVector()
        if case .map(let children) = value {
            if replace {
                node.takeRemoved(into: &seen)
            }
            node.note(FieldEntry(stamp: stamp, content: .map))
            // Children decide restarts against what they showed before this write.
            let inner = context.joined(node.removed)
            for (key, child) in children {
                node.map.modify(key) { write(child, into: &$0, context: inner, stamp: stamp, replace: false) }
            }
            if replace { node.kill(seen: seen) }
        } else {
            node.takeRemoved(into: &seen)
            node.note(FieldEntry(stamp: stamp, content: .value(value)))
            node.kill(seen: seen)
        }
    }

    /// Removes the field at `path` (observed-remove: concurrent writes not seen here survive).
    /// The unset's stamp is recorded in ``writes``, also when there was nothing to remove.
    ///
    /// - Returns: whether the field was visible before.
    /// - Complexity: O(size of the field).
    @discardableResult
    public mutating func unset(_ path: FieldPath, stamp: Stamp) throws(DocumentStateError) -> Bool {
        let keys = try Self.keys(of: path)
        let existed = value(at: path) != nil
        withField(keys, stamp: nil) { node, _ in
            var seen = VersionVector()
            node.takeRemoved(into: &seen)
            node.kill(seen: seen)
        }
        writes.include(stamp)
        normalize(key: keys[0])
        return existed
    }

    /// Adds `amount` to the counter at `path` (Ditto's `increment(by:)`). A field that shows a
    /// number becomes a counter starting from that number (a restart at it); a field that shows
    /// nothing, a counter starting from 0.
    ///
    /// - Parameter amount: an `.int` or a finite `.double`; ints keep the counter exact.
    /// - Throws: ``DocumentStateError`` when the field holds something other than a number or a
    ///   value evicted from this node, the amount is not a finite number, or this site's running
    ///   total would leave Int64 (or the finite doubles).
    /// - Complexity: O(size of the field).
    public mutating func increment(_ path: FieldPath, by amount: Value, stamp: Stamp) throws(DocumentStateError) {
        guard CounterNumber.isNumber(amount) else {
            throw DocumentStateError(
                message: "cannot increment '\(path)' by \(amount): the amount must be a finite number")
        }
        let keys = try Self.keys(of: path)
        let shown = try checkedTarget(keys, path)
        var restartAt: Value?
        if let shown, shown.kind != .counter {
            guard let value = shown.value else {
                throw DocumentStateError(
                    message:
                        "cannot increment '\(path)': its value was evicted from this node; fetch the document first")
            }
            guard CounterNumber.isNumber(value), shown.kind == .value else {
                throw DocumentStateError(message: "cannot increment '\(path)': it holds \(value.typeName)")
            }
            restartAt = value
        }
        let previous = node(at: keys)?.runningTotal(of: stamp.site)?.total ?? .int(0)
        guard let next = CounterNumber.add(previous, amount) else {
            let range = previous.intValue != nil && amount.intValue != nil ? "Int64" : "the finite doubles"
            throw DocumentStateError(
                message: "cannot increment '\(path)' by \(amount): this node's total \(previous) would leave \(range)")
        }
        withField(keys, stamp: stamp) { node, _ in
            if let restartAt {
                node.note(
                    FieldEntry(stamp: stamp, content: .restart(Restart(value: restartAt, seen: node.runningTotals()))))
            }
            node.totals[stamp.site] = CounterTotal(total: next, stamp: stamp)
        }
        adds.include(stamp)
        writes.include(stamp)
        normalize(key: keys[0])
    }

    /// The node at `keys`, if the state has one.
    private func node(at keys: [String]) -> FieldNode? {
        var node = root[keys[0]]
        for key in keys.dropFirst() { node = node?.map[key] }
        return node
    }

    /// Removes the document as the local node sees it: every write this state holds becomes
    /// covered by the remove context (a tombstone); counters record the totals seen.
    ///
    /// - Complexity: O(size of the state).
    public mutating func remove(stamp: Stamp) {
        root.updateEach {
            $0.recordRemovedTotals()
            return true
        }
        removed.join(writes)
        removed.include(stamp)
        normalizeDocument()
    }

    /// Whether default data (stamped at HLC time zero by `site`) may be written at `path`: the
    /// field shows nothing, nothing in it names `site`, no remove context on the way to it (the
    /// document's included) names `site`, and no field on the way holds a default of `site`
    /// other than "a map" (the write records "a map" there with the same stamp; docs/DATA-MODEL.md
    /// rule 3). With a `nil` path, whether the whole document holds nothing of `site`.
    ///
    /// A context naming `site` may once have covered a default of it there: writing again could
    /// give two different values one stamp.
    ///
    /// - Complexity: O(size of the field).
    public func admitsDefaultData(at path: FieldPath?, site: SiteID) -> Bool {
        guard removed[site] == nil else { return false }
        guard let path else { return writes[site] == nil }
        guard let keys = try? Self.keys(of: path) else { return false }
        if !isDeleted, let shown = parts(along: keys).last, shown != nil { return false }
        var map = root
        for (i, key) in keys.enumerated() {
            guard let node = map[key] else { return true }
            if i == keys.count - 1 { return !node.mentions(site) }
            guard node.removed[site] == nil else { return false }
            // The write records "a map" here stamped at time zero: a default of the site here
            // that is not "a map" holds that stamp already (a value, say), and would keep it.
            if node.entries.contains(where: {
                $0.stamp.site == site && $0.stamp.time == .zero && $0.content != .map && $0.content != .withheldMap
            }) {
                return false
            }
            map = node.map
        }
        return true
    }

    /// How many value and "map" entries of this state are withheld: written to an eviction stub,
    /// they travel without their values (rule 8) until a state holding the values joins them.
    ///
    /// - Complexity: O(size of the state).
    public var withheldEntryCount: Int {
        root.entries.values.reduce(0) { $0 + $1.withheldEntryCount }
    }

    /// The withheld entries of this state: each one's field path (dotted, map keys as they are)
    /// and stamp. For diagnostics (the simulator names them in a violation).
    ///
    /// - Complexity: O(size of the state).
    public var withheldEntries: [(path: String, stamp: Stamp)] {
        var out: [(path: String, stamp: Stamp)] = []
        for (key, field) in root.entries { field.withheldEntries(at: key, into: &out) }
        return out
    }

    /// A copy for a document evicted from this node: every stamp, context, counter total and
    /// restart, with every value dropped (entries stay, withheld). It shows only counters; merging
    /// the full state into it restores the full state exactly (docs/DATA-MODEL.md rule 8).
    ///
    /// - Complexity: O(size of the state).
    public func evictionStub() -> DocumentState {
        var stub = self
        stub.root.updateEach {
            $0.withholdValues()
            return true
        }
        return stub
    }

    // MARK: Merge and normal form

    /// Joins another replica's state of the same document into this one, keeping the normal form.
    ///
    /// The join of a dot store with its causal context (docs/DATA-MODEL.md, "Normal form, and why
    /// merge is a join"): an entry or counter total that one state holds and the other lacks,
    /// although the other's write vector or remove context covers it, was removed or overwritten
    /// there, and is dropped; what either side's remove contexts cover is dropped as before.
    ///
    /// - Returns: `true` when this state changed (exactly: `false` when `other` adds nothing).
    /// - Complexity: O(size of `other` plus size of this state).
    @discardableResult
    public mutating func merge(_ other: DocumentState) -> Bool {
        merge(other, above: [:])
    }

    /// ``merge(_:)`` of a state that vouches only for the stamps its context holds above `base`
    /// (a ``StateDelta``'s fields; `base` empty: a whole state).
    mutating func merge(_ other: DocumentState, above base: VersionVector) -> Bool {
        let causal = CausalContexts(
            mine: writes.joined(removed), theirs: other.writes.joined(other.removed), theirsAbove: base)
        var changed = writes.join(other.writes)
        let grew = removed.join(other.removed)
        if grew {
            changed = true
            if adds.contains(where: { removed.covers(Stamp(time: $0.value, site: $0.key)) }) {
                adds = adds.filter { !removed.covers(Stamp(time: $0.value, site: $0.key)) }
            }
        }
        for (site, time) in other.adds where !removed.covers(Stamp(time: time, site: site)) {
            if adds.include(Stamp(time: time, site: site)) { changed = true }
        }
        if root.join(other.root, context: ContextInForce(document: removed), contextGrew: grew, causal: causal) {
            changed = true
        }
        return changed
    }

    /// Reaps the remove contexts of removed fields (docs/DATA-MODEL.md, "Tombstones and
    /// reaping"): drops every entry of a field's remove context above time zero whose time is
    /// before `horizon`, keeping the covers of default data (``FieldNode/removedDefaults``, and
    /// entries at time zero), and the fields left with nothing. The document's own remove context
    /// `r` stays (a removed document is reaped whole, by its row).
    ///
    /// What is dropped is still recorded by the write vector, and the join's dot-store rule drops
    /// it on every replica that saw it, so what the document shows does not change and a peer that
    /// still holds a removed entry cannot bring it back. Reaping commutes with ``merge(_:)``: it
    /// filters context entries above zero by their own time, contexts join per site by maximum,
    /// and an entry above zero covers no default data (the covers of defaults are kept apart and
    /// never reaped; `TimeZeroContextReapTests`).
    ///
    /// - Parameter horizon: the reap horizon (the store passes its time minus
    ///   `StoreOptions.tombstoneTTL`); this type never reads a clock.
    /// - Returns: whether anything was dropped.
    /// - Complexity: O(size of the state).
    @discardableResult
    public mutating func reapRemovedFields(before horizon: HLCTimestamp) -> Bool {
        root.updateEach { $0.reapContexts(before: horizon) }
    }

    /// Brings the whole state to its normal form.
    mutating func normalizeDocument() {
        if !removed.isEmpty {
            if adds.contains(where: { removed.covers(Stamp(time: $0.value, site: $0.key)) }) {
                adds = adds.filter { !removed.covers(Stamp(time: $0.value, site: $0.key)) }
            }
        }
        root.normalize(ContextInForce(document: removed))
    }

    /// Brings one top-level field to its normal form (the rest is untouched by the operation).
    private mutating func normalize(key: String) {
        root.modify(key, create: false) { $0.normalize(ContextInForce(document: removed)) }
    }

    // MARK: Reading

    /// The visible value at a field path (array indexes look inside arrays), `nil` when absent or
    /// withheld in an eviction stub.
    public func value(at path: FieldPath) -> Value? {
        guard !isDeleted, case .key(let first)? = path.components.first,
            let value = root[first]?.part(ContextInForce(document: removed))?.value
        else { return nil }
        return value.value(at: FieldPath(components: Array(path.components.dropFirst())))
    }

    /// The stamp of the write that decides what the field at `path` shows (for a map, its latest
    /// visible write at or below it), `nil` when it shows nothing.
    public func stamp(at path: FieldPath) -> Stamp? {
        guard !isDeleted, let keys = try? Self.keys(of: path) else { return nil }
        let parts = parts(along: keys)
        guard parts.count == keys.count else { return nil }
        return parts.last!?.stamp
    }

    /// The document as applications see it: a map of the visible fields that have values plus
    /// `_id`, or `nil` when the document is removed.
    ///
    /// - Complexity: O(size of the state).
    public func materialize(id: Value) -> Value? {
        guard !isDeleted else { return nil }
        var out = root.materialize(ContextInForce(document: removed))
        out["_id"] = id
        return .map(out)
    }

    /// The highest HLC timestamp in this state, for advancing the local clock on receive and for
    /// the drift check. Every stamp inside the state is at most this (decoding refuses states
    /// where one is not).
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
