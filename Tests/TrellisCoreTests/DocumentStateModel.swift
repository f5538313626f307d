import TrellisCore

/// The reference model of docs/DATA-MODEL.md: what a replica shows, recomputed from the list of
/// operations it holds, without normal forms, dropped entries or removed totals.
///
/// Each operation records, when it is issued, what it wrote (per field: a value, "a map" or a
/// restart with the running totals its issuer had seen), which remove contexts it set (per scope:
/// the stamps of every operation its issuer held that wrote at or below that field, or of every
/// operation for a document remove) and, for an increment, the issuing site's new running total.
/// A replica holding a set of operations then shows, per field:
/// - per site, that site's latest write (by stamp, ties by the order of rule 3) and, apart from it,
///   the site's default data (time zero), each visible unless a context of a held operation whose
///   scope is the field or above it covers its stamp; a default only when a held operation's
///   issuer held that default at that very field and removed it (`defaultsRemoved`), or a held
///   document remove names its site (protocol 5). A site writes default data whatever it wrote
///   before, so its default is not ordered with its other writes and a later stamp does not
///   replace it (docs/DATA-MODEL.md, "What a state holds" and "Normal form"): the "a map" a
///   default records on its parents keeps a map showing after an eviction withheld the site's
///   earlier "map" entry there;
/// - value, map or counter, whichever has the latest visible stamp;
/// - a counter: the winning visible restart's value (or 0) plus, per site in ascending order, the
///   latest visible running total minus the later of what the winner had seen and the latest
///   covered running total of that site.
struct DocumentStateModel {
    /// A field path whose keys compare by their UTF-8 bytes.
    struct Path: Hashable, CustomStringConvertible {
        var keys: [String]

        init(_ keys: [String]) { self.keys = keys }

        static func == (a: Path, b: Path) -> Bool {
            a.keys.count == b.keys.count && zip(a.keys, b.keys).allSatisfy { $0.utf8.elementsEqual($1.utf8) }
        }

        func hash(into hasher: inout Hasher) {
            for key in keys {
                for byte in key.utf8 { hasher.combine(byte) }
                hasher.combine(0xFF as UInt8)  // not a UTF-8 byte: separates keys
            }
        }

        func hasPrefix(_ p: Path) -> Bool {
            p.keys.count <= keys.count && zip(p.keys, keys).allSatisfy { $0.utf8.elementsEqual($1.utf8) }
        }

        var fieldPath: FieldPath { FieldPath(components: keys.map { .key($0) }) }

        var description: String { keys.joined(separator: ".") }
    }

    struct Total {
        var total: Value
        var stamp: Stamp
    }

    enum Content {
        case value(Value)
        case map
        case restart(Value, seen: [SiteID: Total])
    }

    struct Op {
        var stamp: Stamp
        /// Field index → what the operation wrote there.
        var writes: [Int: Content] = [:]
        /// Remove contexts by scope: a field index, or -1 for the document.
        var kills: [(scope: Int, context: VersionVector)] = []
        /// The default data the operation removed: per field, the sites whose default data
        /// (time zero) at exactly that field its issuer held there. Only these, and the document's
        /// context, cover default data: a field's context above zero does not.
        var defaultsRemoved: [Int: Set<SiteID>] = [:]
        var increment: (path: Int, total: Value)?
        var adds = false
    }

    enum Kind: Int {
        case map = 0
        case counter = 1
        case value = 2
    }

    struct Part {
        var value: Value?
        var stamp: Stamp
        var kind: Kind

        func precedes(_ other: Part) -> Bool {
            stamp != other.stamp ? stamp < other.stamp : kind.rawValue < other.kind.rawValue
        }
    }

    /// Where a field keeps an entry: per site, its latest write, and apart from it its default data.
    struct Slot: Hashable {
        var site: SiteID
        var isDefault: Bool

        init(_ stamp: Stamp) {
            site = stamp.site
            isDefault = stamp.time == .zero
        }
    }

    /// What a replica holds: operations, and those whose values it withholds (an eviction stub).
    struct View {
        var held: Set<Int> = []
        var withheld: Set<Int> = []

        /// The view after merging `other`: an operation stays withheld only if no side holds its values.
        func merged(_ other: View) -> View {
            let valued = held.subtracting(withheld).union(other.held.subtracting(other.withheld))
            let all = held.union(other.held)
            return View(held: all, withheld: all.subtracting(valued))
        }
    }

    /// What a view shows: every field's part, and whether the document exists.
    struct Shown {
        var parts: [Part?]
        var live: Bool
    }

    /// Every field the tests write, parents before children.
    let paths: [Path]
    let index: [Path: Int]
    /// `under[i][j]`: field i is field j or below it.
    let under: [[Bool]]
    let children: [[Int]]
    var ops: [Op] = []

    init(paths keys: [[String]]) {
        let paths = keys.map(Path.init)
        self.paths = paths
        var index: [Path: Int] = [:]
        for (i, p) in paths.enumerated() { index[p] = i }
        self.index = index
        under = paths.map { p in paths.map { p.hasPrefix($0) } }
        children = paths.map { p in
            paths.indices.filter { paths[$0].keys.count == p.keys.count + 1 && paths[$0].hasPrefix(p) }
        }
    }

    static func covers(_ vv: VersionVector, _ stamp: Stamp) -> Bool { vv[stamp.site].map { stamp.time <= $0 } ?? false }

    static func join(_ vv: inout VersionVector, _ other: VersionVector) {
        for (site, time) in other where vv[site].map({ $0 < time }) ?? true { vv[site] = time }
    }

    static func cborLess(_ a: Value, _ b: Value) -> Bool {
        CBOR.encode(a).lexicographicallyPrecedes(CBOR.encode(b))
    }

    /// Rank and tie key of an entry as the view holds it (rule 3).
    static func order(_ content: Content, withheld: Bool) -> (rank: Int, key: Value) {
        switch content {
        case .value(let v): return withheld ? (0, .null) : (3, v)
        case .map: return withheld ? (1, .null) : (2, .null)
        case .restart(let v, let seen):
            let list: [Value] = seen.sorted { $0.key < $1.key }.map {
                [
                    .int(Int64(bitPattern: $0.key)), .int(Int64(bitPattern: $0.value.stamp.time.rawValue)),
                    $0.value.total,
                ]
            }
            return (4, [v, .array(list)])
        }
    }

    /// Whether entry `a` (stamp, order) is below entry `b`.
    static func below(_ a: (Stamp, (rank: Int, key: Value)), _ b: (Stamp, (rank: Int, key: Value))) -> Bool {
        if a.0 != b.0 { return a.0 < b.0 }
        if a.1.rank != b.1.rank { return a.1.rank < b.1.rank }
        return cborLess(a.1.key, b.1.key)
    }

    // MARK: Reading a view

    func evaluate(_ view: View) -> Shown {
        let n = paths.count
        var rootContext: VersionVector = [:]
        var contexts = [VersionVector](repeating: [:], count: n)
        var defaultsCovered = [Set<SiteID>](repeating: [], count: n)
        var latest = [[Slot: (op: Int, content: Content)]](repeating: [:], count: n)
        var incs = [[SiteID: [Total]]](repeating: [:], count: n)
        for i in view.held {
            let op = ops[i]
            for (j, sites) in op.defaultsRemoved { defaultsCovered[j].formUnion(sites) }
            for (scope, context) in op.kills {
                if scope < 0 {
                    Self.join(&rootContext, context)
                } else {
                    for j in 0..<n where under[j][scope] { Self.join(&contexts[j], context) }
                }
            }
            for (p, content) in op.writes {
                let slot = Slot(op.stamp)
                if let (j, other) = latest[p][slot] {
                    let a = (ops[j].stamp, Self.order(other, withheld: view.withheld.contains(j)))
                    let b = (op.stamp, Self.order(content, withheld: view.withheld.contains(i)))
                    if !Self.below(a, b) { continue }
                }
                latest[p][slot] = (i, content)
            }
            if let inc = op.increment {
                incs[inc.path][op.stamp.site, default: []].append(Total(total: inc.total, stamp: op.stamp))
            }
        }
        for j in 0..<n { Self.join(&contexts[j], rootContext) }
        let live = view.held.contains { ops[$0].adds && !Self.covers(rootContext, ops[$0].stamp) }
        var parts = [Part?](repeating: nil, count: n)
        for p in (0..<n).reversed() {  // children first
            let covered = defaultsCovered[p].union(rootContext.keys)
            parts[p] = part(p, latest[p], incs[p], contexts[p], defaults: covered, parts, view)
        }
        return Shown(parts: parts, live: live)
    }

    private func part(
        _ p: Int, _ latest: [Slot: (op: Int, content: Content)], _ incs: [SiteID: [Total]], _ ctx: VersionVector,
        defaults: Set<SiteID>, _ parts: [Part?], _ view: View
    ) -> Part? {
        var best: Part?
        func offer(_ part: Part) {
            if best.map({ $0.precedes(part) }) ?? true { best = part }
        }
        var valueWinner: (stamp: Stamp, order: (rank: Int, key: Value), value: Value?)?
        var mapStamp: Stamp?
        var valuedMap = false
        var winner: (stamp: Stamp, order: (rank: Int, key: Value), value: Value, seen: [SiteID: Total])?
        for (_, (i, content)) in latest {
            let stamp = ops[i].stamp
            guard stamp.time == .zero ? !defaults.contains(stamp.site) : !Self.covers(ctx, stamp) else { continue }
            let withheld = view.withheld.contains(i)
            let order = Self.order(content, withheld: withheld)
            switch content {
            case .value(let v):
                if let w = valueWinner, !Self.below((w.stamp, w.order), (stamp, order)) { continue }
                valueWinner = (stamp, order, withheld ? Value?.none : v)
            case .map:
                if mapStamp.map({ $0 < stamp }) ?? true { mapStamp = stamp }
                if !withheld { valuedMap = true }
            case .restart(let v, let seen):
                if let w = winner, !Self.below((w.stamp, w.order), (stamp, order)) { continue }
                winner = (stamp, order, v, seen)
            }
        }
        if let w = valueWinner { offer(Part(value: w.value, stamp: w.stamp, kind: .value)) }
        // Map part.
        var mapLatest = mapStamp
        var fields: UTF8Map<Value> = [:]
        for child in children[p] {
            guard let c = parts[child] else { continue }
            if let v = c.value { fields[paths[child].keys.last!] = v }
            if mapLatest.map({ $0 < c.stamp }) ?? true { mapLatest = c.stamp }
        }
        if let m = mapLatest {
            offer(Part(value: fields.isEmpty && !valuedMap ? Value?.none : .map(fields), stamp: m, kind: .map))
        }
        // Counter part.
        var counterLatest = winner?.stamp
        var terms: [(Value, Value)] = []
        for site in incs.keys.sorted() {
            let list = incs[site]!.sorted { $0.stamp < $1.stamp }
            guard let visible = list.last, !Self.covers(ctx, visible.stamp) else { continue }
            if counterLatest.map({ $0 < visible.stamp }) ?? true { counterLatest = visible.stamp }
            var sub = list.last { Self.covers(ctx, $0.stamp) }
            if let seen = winner?.seen[site], sub.map({ $0.stamp < seen.stamp }) ?? true { sub = seen }
            if let sub, !(sub.stamp < visible.stamp) { continue }
            terms.append((visible.total, sub?.total ?? .int(0)))
        }
        if let latestCounter = counterLatest {
            offer(Part(value: Self.sum(base: winner?.value ?? .int(0), terms), stamp: latestCounter, kind: .counter))
        }
        return best
    }

    /// The shown counter value: exact ints, else doubles in the given (ascending site) order.
    static func sum(base: Value, _ terms: [(Value, Value)]) -> Value {
        if case .int(var acc) = base {
            var exact = true
            for (t, s) in terms {
                guard case .int(let a) = t, case .int(let b) = s else {
                    exact = false
                    break
                }
                let (d, o1) = a.subtractingReportingOverflow(b)
                let (n, o2) = acc.addingReportingOverflow(d)
                if o1 || o2 {
                    exact = false
                    break
                }
                acc = n
            }
            if exact { return .int(acc) }
        }
        var acc = base.numberValue!
        for (t, s) in terms { acc += t.numberValue! - s.numberValue! }
        return .double(acc)
    }

    /// What the view shows (`nil`: removed or never written).
    func display(_ view: View, id: Value) -> Value? {
        let shown = evaluate(view)
        guard shown.live else { return nil }
        var out: UTF8Map<Value> = ["_id": id]
        for (i, p) in paths.enumerated() where p.keys.count == 1 {
            if let v = shown.parts[i]?.value { out[p.keys[0]] = v }
        }
        return .map(out)
    }

    /// The part at `p` when every field on the way shows a map (`ok` false when one does not).
    func reach(_ p: Path, _ shown: Shown) -> (ok: Bool, part: Part?) {
        guard shown.live else { return (true, nil) }
        for n in 1...p.keys.count {
            let part = shown.parts[index[Path(Array(p.keys.prefix(n)))]!]
            if n == p.keys.count { return (true, part) }
            guard let part else { return (true, nil) }
            if part.kind != .map { return (false, part) }
        }
        return (true, nil)
    }

    // MARK: Issuing operations

    /// Per site, its latest running total at `p` in the view (a restart's seen totals).
    func runningTotals(_ p: Int, _ view: View) -> [SiteID: Total] {
        var out: [SiteID: Total] = [:]
        for i in view.held {
            guard let inc = ops[i].increment, inc.path == p else { continue }
            let site = ops[i].stamp.site
            if out[site].map({ $0.stamp < ops[i].stamp }) ?? true {
                out[site] = Total(total: inc.total, stamp: ops[i].stamp)
            }
        }
        return out
    }

    /// The stamps of every held operation that wrote at or below `p`.
    func versionVector(under p: Int, _ view: View) -> VersionVector {
        var vv: VersionVector = [:]
        for i in view.held {
            let op = ops[i]
            let writes = op.writes.keys.contains { under[$0][p] } || (op.increment.map { under[$0.path][p] } ?? false)
            if writes, vv[op.stamp.site].map({ $0 < op.stamp.time }) ?? true { vv[op.stamp.site] = op.stamp.time }
        }
        return vv
    }

    /// The defaults a remove at `p` removes: per field at or below it, the sites whose default data
    /// the view holds there.
    func defaults(under p: Int, _ view: View) -> [Int: Set<SiteID>] {
        var out: [Int: Set<SiteID>] = [:]
        for i in view.held where ops[i].stamp.time == .zero {
            for j in ops[i].writes.keys where under[j][p] { out[j, default: []].insert(ops[i].stamp.site) }
        }
        return out
    }

    /// Records a remove at `p` into `op`: its context, and the defaults it removes.
    private func kill(_ p: Int, _ view: View, into op: inout Op) {
        op.kills.append((p, versionVector(under: p, view)))
        for (j, sites) in defaults(under: p, view) { op.defaultsRemoved[j, default: []].formUnion(sites) }
    }

    /// Records "a map" on every parent of `p`.
    private func writeParents(of p: Path, into op: inout Op) {
        for n in stride(from: p.keys.count - 1, to: 0, by: -1) {
            let q = index[Path(Array(p.keys.prefix(n)))]!
            if op.writes[q] == nil { op.writes[q] = .map }
        }
    }

    /// Writes `value` at `p` as set (`replace`) or upsert does.
    private func write(_ value: Value, at p: Path, replace: Bool, view: View, shown: Shown, into op: inout Op) {
        let i = index[p]!
        let part = shown.live ? shown.parts[i] : nil
        if value.isCounterNumber, part?.kind == .counter {
            op.writes[i] = .restart(value, seen: runningTotals(i, view))
            return
        }
        if case .map(let children) = value {
            op.writes[i] = .map
            for (key, child) in children {
                write(child, at: Path(p.keys + [key]), replace: false, view: view, shown: shown, into: &op)
            }
            if replace { kill(i, view, into: &op) }
        } else {
            op.writes[i] = .value(value)
            kill(i, view, into: &op)
        }
    }

    /// `set`: `nil` when the implementation must refuse it (a parent that is not a map).
    func set(_ p: Path, _ value: Value, stamp: Stamp, view: View) -> Op? {
        let shown = evaluate(view)
        guard reach(p, shown).ok else { return nil }
        var op = Op(stamp: stamp, adds: true)
        writeParents(of: p, into: &op)
        write(value, at: p, replace: true, view: view, shown: shown, into: &op)
        return op
    }

    func upsert(_ fields: UTF8Map<Value>, stamp: Stamp, view: View) -> Op {
        let shown = evaluate(view)
        var op = Op(stamp: stamp, adds: true)
        for (key, value) in fields {
            write(value, at: Path([key]), replace: false, view: view, shown: shown, into: &op)
        }
        return op
    }

    func unset(_ p: Path, stamp: Stamp, view: View) -> Op {
        var op = Op(stamp: stamp)
        kill(index[p]!, view, into: &op)
        return op
    }

    /// `increment`: `nil` when the implementation must refuse it.
    func increment(_ p: Path, by amount: Value, stamp: Stamp, view: View) -> Op? {
        let (ok, part) = reach(p, evaluate(view))
        guard ok else { return nil }
        let i = index[p]!
        var op = Op(stamp: stamp, adds: true)
        writeParents(of: p, into: &op)
        if let part, part.kind != .counter {
            guard part.kind == .value, let v = part.value, v.isCounterNumber else { return nil }
            op.writes[i] = .restart(v, seen: runningTotals(i, view))
        }
        let previous = runningTotals(i, view)[stamp.site]?.total ?? .int(0)
        guard let next = Value.counterSum(previous, amount) else { return nil }
        op.increment = (i, next)
        return op
    }

    func remove(stamp: Stamp, view: View) -> Op {
        var vv: VersionVector = [:]
        for i in view.held where vv[ops[i].stamp.site].map({ $0 < ops[i].stamp.time }) ?? true {
            vv[ops[i].stamp.site] = ops[i].stamp.time
        }
        if vv[stamp.site].map({ $0 < stamp.time }) ?? true { vv[stamp.site] = stamp.time }
        var op = Op(stamp: stamp)
        op.kills.append((-1, vv))
        return op
    }
}
