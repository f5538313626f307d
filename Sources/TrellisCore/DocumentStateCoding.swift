// The CBOR shape of a DocumentState, encoding version 2 (docs/PROTOCOL.md §3):
//
//   state = { "a": [[i, time], ...]?,      adds: per site, its latest write that adds to the document
//             "m": { key: field, ... }?,   the fields
//             "r": [[i, time], ...]?,      the document's remove context
//             "s": [site, ...],            site table, ascending; stamps name sites by index i
//             "v": 2,
//             "w": [[i, time], ...] }      per site, the latest stamp of any of its operations
//   field = { "b": [[i, time, number, seen], ...]?,   restart entries; seen = [[i, time, number], ...]
//             "e": [[i, time, value], ...]?,          value entries
//             "h": [[i, time, kind], ...]?,           withheld entries (kind 0 value, 1 map): stubs only
//             "m": { key: field, ... }?,              child fields
//             "o": [[i, time, number], ...]?,         removed totals
//             "p": [[i, time], ...]?,                 "map" entries
//             "t": [[i, time, number], ...]?,         counter totals
//             "x": [[i, time], ...]?,                 the field's remove context
//             "z": [i, ...]? }                        sites whose default (time zero) the remove
//                                                     context covers apart from their entry in x
//
// Every list is sorted by site index, one element per site (and one entry per site across b, e, h,
// p); absent parts are left out. A site in z has an entry above time zero in x. Times and sites
// are the Int64 bit patterns of their UInt64 values.

extension DocumentState {
    /// The version of the state encoding ``cbor()`` writes (docs/PROTOCOL.md §3).
    public static let encodingVersion: Int64 = 2

    /// Decodes a state from its CBOR value (the bytes of ``cbor()``, decoded by
    /// ``CBOR/decode(_:options:)``), and brings it to the normal form.
    ///
    /// A state without `"v"` is read as encoding version 1 (what earlier Trellis versions stored)
    /// and converted; its write vector is raised to cover every stamp it holds.
    ///
    /// - Throws: ``DocumentStateError`` naming the malformed part: wrong shapes, bad site indexes,
    ///   counter numbers that are not ints or finite doubles, values that cannot be stored, maps
    ///   nested too deep, and any stamp or context entry `(t, s)` with `t > max(w[s], r[s])`
    ///   (docs/DATA-MODEL.md rule 9). Input from peers is untrusted: never a trap.
    /// - Complexity: O(size of the state).
    public init(encoded value: Value) throws(DocumentStateError) {
        guard case .map(let m) = value else { throw DocumentStateError(message: "document state is not a map") }
        let sites = try Self.siteTable(of: m)
        switch m["v"] {
        case nil:
            self = try LegacyStateDecoder(sites: sites).state(m)
        case .int(Self.encodingVersion)?:
            self = try StateDecoder(sites: sites).state(m, keys: StateDecoder.documentKeys)
        case let version?:
            throw DocumentStateError(
                message: "document state encoding version \(version) is not supported (this node reads 1 and 2)")
        }
        normalizeDocument()
    }
}

extension DocumentState {
    /// The site table `"s"` of an encoded state's map (version 1 or 2, or a compact delta's).
    ///
    /// - Throws: ``DocumentStateError`` when it is missing or holds anything but integers.
    static func siteTable(of m: UTF8Map<Value>) throws(DocumentStateError) -> [SiteID] {
        guard case .array(let siteValues)? = m["s"] else {
            throw DocumentStateError(message: "document state has no site table")
        }
        var sites: [SiteID] = []
        sites.reserveCapacity(siteValues.count)
        for v in siteValues {
            guard case .int(let s) = v else { throw DocumentStateError(message: "site table holds \(v.typeName)") }
            sites.append(SiteID(bitPattern: s))
        }
        return sites
    }

    /// Decodes the state of a compact delta (docs/PROTOCOL.md §3, "Delta form"): the version-2
    /// shape without `"v"`, every time written as its difference below `reference`
    /// (``CompactTime``), and `"a"` left out when it equals `"w"`; brings it to the normal form.
    ///
    /// - Returns: the state, and its site table as written (what the delta's base indexes into).
    /// - Throws: ``DocumentStateError`` for what ``init(encoded:)`` refuses, a `"v"` part, and a
    ///   time that is not a difference ``CompactTime`` reads (malformed, or a time below 0).
    ///   Input from peers: never a trap.
    /// - Complexity: O(size of the state).
    static func decodeCompact(_ value: Value, reference: HLCTimestamp) throws(DocumentStateError)
        -> (state: DocumentState, sites: [SiteID])
    {
        guard case .map(let m) = value else { throw DocumentStateError(message: "document state is not a map") }
        let sites = try Self.siteTable(of: m)
        var state = try StateDecoder(sites: sites, reference: reference).state(m, keys: StateDecoder.compactKeys)
        state.normalizeDocument()
        return (state, sites)
    }
}

/// Reads the version-2 shape, checking every stamp against the state's own vectors.
private struct StateDecoder {
    let sites: [SiteID]
    /// Times are written as differences below `reference` (a compact delta's state: ``CompactTime``),
    /// or as themselves (`nil`).
    let reference: HLCTimestamp?
    /// `w` joined with `r`: no stamp inside the state may be above it.
    var bound: VersionVector = [:]
    static let maxDepth = Value.maximumDepth + 1

    init(sites: [SiteID], reference: HLCTimestamp? = nil) {
        self.sites = sites
        self.reference = reference
    }

    /// The state from the parts of its map, `keys` the parts it may have.
    func state(_ m: UTF8Map<Value>, keys: Set<UTF8Key>) throws(DocumentStateError) -> DocumentState {
        try checkKeys(m, keys, "the document")
        var decoder = self
        let writes = try decoder.vector(m["w"], "w", "the document", bounded: false)
        let removed = try decoder.vector(m["r"], "r", "the document", bounded: false)
        decoder.bound = writes.joined(removed)
        // A compact delta's state leaves out `a` when it equals `w`.
        let adds =
            reference != nil && m["a"] == nil ? writes : try decoder.vector(m["a"], "a", "the document", bounded: true)
        let root = try decoder.map(m["m"] ?? .map([:]), path: [])
        return DocumentState(root: root, writes: writes, removed: removed, adds: adds)
    }

    func fail(_ message: String) -> DocumentStateError {
        DocumentStateError(message: "malformed document state: \(message)")
    }

    static func describe(_ path: [String]) -> String {
        path.isEmpty ? "the document" : "field '\(path.joined(separator: "."))'"
    }

    /// The parts of a state, compared byte-wise like every key from outside.
    static let documentKeys: Set<UTF8Key> = ["a", "m", "r", "s", "v", "w"]
    /// The parts of a compact delta's state: no version.
    static let compactKeys: Set<UTF8Key> = ["a", "m", "r", "s", "w"]

    func checkKeys(_ m: UTF8Map<Value>, _ allowed: Set<UTF8Key>, _ place: @autoclosure () -> String)
        throws(DocumentStateError)
    {
        for key in m.keys where !allowed.contains(UTF8Key(key)) {
            throw fail("\(place()) has an unknown part '\(key)'")
        }
    }

    func site(_ v: Value, _ place: @autoclosure () -> String) throws(DocumentStateError) -> SiteID {
        guard case .int(let i) = v, i >= 0, i < sites.count else { throw fail("\(place()): bad site index \(v)") }
        return sites[Int(i)]
    }

    func time(_ v: Value, _ place: @autoclosure () -> String) throws(DocumentStateError) -> HLCTimestamp {
        guard case .int(let t) = v else { throw fail("\(place()): time is \(v.typeName)") }
        guard let reference else { return HLCTimestamp(rawValue: UInt64(bitPattern: t)) }
        guard let time = CompactTime.read(t, below: reference) else {
            throw fail(
                "\(place()): \(t) is not a time difference below \(reference.rawValue) that gives a time of 0 or more")
        }
        return time
    }

    /// A stamp from `[i, time, ...]`, checked against ``bound``.
    func stamp(_ parts: [Value], _ place: @autoclosure () -> String) throws(DocumentStateError) -> Stamp {
        let stamp = Stamp(time: try time(parts[1], place()), site: try site(parts[0], place()))
        guard bound.covers(stamp) else {
            throw fail(
                "\(place()) holds a stamp (time \(stamp.time.rawValue), site \(String(stamp.site, radix: 16))) above "
                    + "the state's write vector and remove context: every stamp must be covered by them")
        }
        return stamp
    }

    func number(_ v: Value, _ place: @autoclosure () -> String) throws(DocumentStateError) -> Value {
        guard CounterNumber.isNumber(v) else { throw fail("\(place()): a counter number is \(v.typeName)") }
        return v
    }

    /// The elements of a list of arrays of `count` items each.
    func rows(_ v: Value, _ count: Int, _ name: String, _ place: @autoclosure () -> String) throws(DocumentStateError)
        -> [[Value]]
    {
        guard case .array(let items) = v else { throw fail("\(place()): '\(name)' is not an array") }
        var out: [[Value]] = []
        out.reserveCapacity(items.count)
        for item in items {
            guard case .array(let parts) = item, parts.count == count else {
                throw fail("\(place()): an element of '\(name)' is not an array of \(count)")
            }
            out.append(parts)
        }
        return out
    }

    func vector(_ v: Value?, _ name: String, _ place: @autoclosure () -> String, bounded: Bool)
        throws(DocumentStateError)
        -> VersionVector
    {
        guard let v else { return [:] }
        var out: VersionVector = [:]
        for parts in try rows(v, 2, name, place()) {
            if bounded {
                out.include(try stamp(parts, "\(place()) '\(name)'"))
            } else {
                out.include(Stamp(time: try time(parts[1], place()), site: try site(parts[0], place())))
            }
        }
        return out
    }

    func totals(_ v: Value?, _ name: String, _ place: @autoclosure () -> String) throws(DocumentStateError) -> [SiteID:
        CounterTotal]
    {
        guard let v else { return [:] }
        var out: [SiteID: CounterTotal] = [:]
        for parts in try rows(v, 3, name, place()) {
            let total = CounterTotal(
                total: try number(parts[2], place()), stamp: try stamp(parts, "\(place()) '\(name)'"))
            out[total.stamp.site] = CounterTotal.later(out[total.stamp.site], total)
        }
        return out
    }

    func map(_ v: Value, path: [String]) throws(DocumentStateError) -> MapNode {
        guard path.count < Self.maxDepth else { throw fail("maps nested deeper than \(Self.maxDepth)") }
        guard case .map(let entries) = v else { throw fail("\(Self.describe(path)) holds \(v.typeName), not fields") }
        var node = MapNode(minimumCapacity: entries.count)
        for (key, fieldValue) in entries {
            node[key] = try field(fieldValue, parent: path, key: key)
        }
        return node
    }

    func field(_ v: Value, parent: [String], key: String) throws(DocumentStateError) -> FieldNode {
        let place = { Self.describe(parent + [key]) }
        guard case .map(let f) = v else { throw fail("\(place()) is \(v.typeName)") }
        var field = FieldNode()
        // One pass over the parts (no lookups per possible key); names match byte-wise.
        for (name, part) in f {
            switch UTF8Key(name) {
            case "e":
                for parts in try rows(part, 3, "e", place()) {
                    if (try? parts[2].validate()) == nil {
                        do { try parts[2].validate(path: (parent + [key]).joined(separator: ".")) } catch {
                            throw fail(error.description)
                        }
                    }
                    field.note(FieldEntry(stamp: try stamp(parts, place()), content: .value(parts[2])))
                }
            case "p":
                for parts in try rows(part, 2, "p", place()) {
                    field.note(FieldEntry(stamp: try stamp(parts, place()), content: .map))
                }
            case "h":
                for parts in try rows(part, 3, "h", place()) {
                    let content: FieldEntry.Content
                    switch parts[2] {
                    case .int(0): content = .withheldValue
                    case .int(1): content = .withheldMap
                    default: throw fail("\(place()): a withheld entry's kind is \(parts[2]), not 0 or 1")
                    }
                    field.note(FieldEntry(stamp: try stamp(parts, place()), content: content))
                }
            case "b":
                for parts in try rows(part, 4, "b", place()) {
                    let restart = Restart(
                        value: try number(parts[2], place()), seen: try totals(parts[3], "seen", "\(place()) restart"))
                    field.note(FieldEntry(stamp: try stamp(parts, place()), content: .restart(restart)))
                }
            case "t": field.totals = try totals(part, "t", place())
            case "o": field.removedTotals = try totals(part, "o", place())
            case "x": field.removed = try vector(part, "x", place(), bounded: true)
            case "z":
                guard case .array(let items) = part else { throw fail("\(place()): 'z' is not an array") }
                for item in items { field.removedDefaults.insert(try site(item, "\(place()) 'z'")) }
            case "m": field.map = try map(part, path: parent + [key])
            default: throw fail("\(place()) has an unknown part '\(name)'")
            }
        }
        for site in field.removedDefaults where (field.removed[site] ?? .zero) == .zero {
            throw fail(
                "\(place()): 'z' names site \(String(site, radix: 16)), which has no entry above time zero in 'x'")
        }
        return field
    }
}

/// Reads encoding version 1 (Trellis before protocol 2: one register, one map stamp and one
/// counter restart per field) and converts it.
private struct LegacyStateDecoder {
    let sites: [SiteID]
    /// Every stamp seen, so `w` can be raised to cover them (version 1 did not record unsets in `w`).
    final class Stamps { var all: VersionVector = [:] }
    let stamps = Stamps()

    func fail(_ message: String) -> DocumentStateError {
        DocumentStateError(message: "malformed document state (encoding version 1): \(message)")
    }

    func site(_ v: Value) throws(DocumentStateError) -> SiteID {
        guard case .int(let i) = v, i >= 0, i < sites.count else { throw fail("bad site index \(v)") }
        return sites[Int(i)]
    }

    func stamp(time: Value, site s: Value) throws(DocumentStateError) -> Stamp {
        guard case .int(let t) = time else { throw fail("time is \(time.typeName)") }
        let stamp = Stamp(time: HLCTimestamp(rawValue: UInt64(bitPattern: t)), site: try site(s))
        stamps.all.include(stamp)
        return stamp
    }

    func vector(_ v: Value?) throws(DocumentStateError) -> VersionVector {
        guard let v else { return [:] }
        guard case .array(let items) = v else { throw fail("a vector is not an array") }
        var out: VersionVector = [:]
        for item in items {
            guard case .array(let p) = item, p.count == 2 else { throw fail("a vector entry is not [site, time]") }
            out.include(try stamp(time: p[1], site: p[0]))
        }
        return out
    }

    /// `[value, time, i]`.
    func entry(_ v: Value, _ key: String) throws(DocumentStateError) -> (Value, Stamp) {
        guard case .array(let p) = v, p.count == 3 else { throw fail("register '\(key)' is not [value, time, site]") }
        do { try p[0].validate(path: key) } catch { throw fail(error.description) }
        return (p[0], try stamp(time: p[1], site: p[2]))
    }

    func totals(_ v: Value?, _ key: String) throws(DocumentStateError) -> [SiteID: CounterTotal] {
        guard let v else { return [:] }
        guard case .array(let items) = v else { throw fail("counter totals of '\(key)' are not an array") }
        var out: [SiteID: CounterTotal] = [:]
        for item in items {
            guard case .array(let p) = item, p.count == 4, CounterNumber.isNumber(p[1]) else {
                throw fail("counter total of '\(key)'")
            }
            let stamp = try stamp(time: p[2], site: p[3])
            guard try site(p[0]) == stamp.site else { throw fail("counter total of '\(key)' keyed by another site") }
            out[stamp.site] = CounterTotal.later(out[stamp.site], CounterTotal(total: p[1], stamp: stamp))
        }
        return out
    }

    func map(_ v: Value, depth: Int) throws(DocumentStateError) -> MapNode {
        guard depth <= Value.maximumDepth else { throw fail("maps nested too deep") }
        guard case .map(let entries) = v else { throw fail("map node is \(v.typeName)") }
        var node = MapNode(minimumCapacity: entries.count)
        for (key, fieldValue) in entries {
            guard case .map(let f) = fieldValue else { throw fail("field '\(key)' is \(fieldValue.typeName)") }
            var field = FieldNode()
            if let c = f["c"] {
                guard case .map(let cm) = c else { throw fail("counter '\(key)' is not a map") }
                field.totals = try totals(cm["t"], key)
                let seen = try totals(cm["o"], key)
                // Version 1 subtracted these whatever restart won: keep that as removed totals.
                field.removedTotals = seen
                if let b = cm["b"] {
                    let (value, stamp) = try entry(b, key)
                    guard CounterNumber.isNumber(value) else { throw fail("counter restart of '\(key)'") }
                    field.note(FieldEntry(stamp: stamp, content: .restart(Restart(value: value, seen: seen))))
                }
            }
            if let s = f["ms"] {
                guard case .array(let p) = s, p.count == 2 else { throw fail("map stamp of '\(key)'") }
                field.note(FieldEntry(stamp: try stamp(time: p[0], site: p[1]), content: .map))
            }
            if let r = f["r"] {
                // On equal stamps version 1 showed the register (a set that also restarted at 0).
                let (value, stamp) = try entry(r, key)
                field.entries.removeAll { $0.stamp == stamp }
                field.note(FieldEntry(stamp: stamp, content: .value(value)))
            }
            if let m = f["m"] { field.map = try map(m, depth: depth + 1) }
            field.removed = try vector(f["x"])
            node[key] = field
        }
        return node
    }

    func state(_ m: UTF8Map<Value>) throws(DocumentStateError) -> DocumentState {
        let writes = try vector(m["w"])
        let removed = try vector(m["r"])
        let root = try map(m["m"] ?? .map([:]), depth: 0)
        // Version 1's `w` held only writes that add; unset stamps were only in field contexts.
        var all = writes
        all.join(stamps.all)
        return DocumentState(root: root, writes: all, removed: removed, adds: writes)
    }
}

// MARK: - Direct encoding

extension DocumentState {
    /// Every site named anywhere in the fields, each field read in place.
    static func collectSites(_ map: MapNode, into sites: inout SiteSet) {
        map.entries.forEachMember { node in
            for entry in node.entries {
                sites.insert(entry.stamp.site)
                if case .restart(let r) = entry.content { for s in r.seen.keys { sites.insert(s) } }
            }
            for s in node.totals.keys { sites.insert(s) }
            for s in node.removedTotals.keys { sites.insert(s) }
            for s in node.removed.keys { sites.insert(s) }
            collectSites(node.map, into: &sites)
        }
    }

    /// The state's CBOR bytes (encoding version 2, docs/PROTOCOL.md §3; RFC 8949 §4.2.1
    /// deterministic encoding), written straight into a buffer without building a `Value` tree.
    ///
    /// - Complexity: O(size of the state), plus sorting each map's keys and each list's sites.
    public func cbor() -> [UInt8] {
        var w = CBORWriter(capacity: 256)
        write(into: &w, layout(reference: nil))
        return w.bytes
    }

    /// The site table of the state's encoding, and how its times are written.
    ///
    /// - Parameter reference: `nil` for the whole-state encoding; for a compact delta's state, the
    ///   time every time is written against (``CompactTime``).
    /// - Complexity: O(size of the state), plus sorting its sites.
    func layout(reference: HLCTimestamp?) -> StateLayout {
        var sites = SiteSet()
        for s in writes.keys { sites.insert(s) }
        for s in removed.keys { sites.insert(s) }
        for s in adds.keys { sites.insert(s) }
        Self.collectSites(root, into: &sites)
        return StateLayout(table: sites.sorted(), reference: reference)
    }

    /// Writes the state's map with `layout` (from ``layout(reference:)`` of this state): encoding
    /// version 2, or with a reference time the compact delta's state (no `"v"`, times written as
    /// differences below the reference by ``CompactTime``, `"a"` left out when it equals `"w"` and
    /// written even when empty otherwise).
    ///
    /// - Complexity: O(size of the state), plus sorting each map's keys and each list's sites.
    func write(into w: inout CBORWriter, _ layout: StateLayout) {
        let version = layout.reference == nil
        let writesAdds = version ? !adds.isEmpty : adds != writes
        // Keys in deterministic order: "a", "m", "r", "s", "v", "w" (one byte each, byte-wise).
        w.writeMapHeader(
            count: 2 + (version ? 1 : 0) + (writesAdds ? 1 : 0) + (root.isEmpty ? 0 : 1) + (removed.isEmpty ? 0 : 1))
        if writesAdds {
            w.writeText("a")
            Self.write(adds, layout, into: &w)
        }
        if !root.isEmpty {
            w.writeText("m")
            Self.write(root, layout, into: &w)
        }
        if !removed.isEmpty {
            w.writeText("r")
            Self.write(removed, layout, into: &w)
        }
        w.writeText("s")
        w.writeArrayHeader(count: layout.table.count)
        for s in layout.table { w.writeInt(Int64(bitPattern: s)) }
        if version {
            w.writeText("v")
            w.writeInt(Self.encodingVersion)
        }
        w.writeText("w")
        Self.write(writes, layout, into: &w)
    }

    private static func writeTime(_ t: HLCTimestamp, _ layout: StateLayout, into w: inout CBORWriter) {
        w.writeInt(layout.written(t))
    }

    /// Writes `vv` as `[[i, time], ...]` in site-index order; a one-entry vector (the usual one)
    /// without building and sorting a list.
    private static func write(_ vv: VersionVector, _ index: StateLayout, into w: inout CBORWriter) {
        func one(_ i: Int64, _ t: HLCTimestamp) {
            w.writeArrayHeader(count: 2)
            w.writeInt(i)
            writeTime(t, index, into: &w)
        }
        w.writeArrayHeader(count: vv.count)
        if vv.count == 1, let (site, t) = vv.first { return one(index[site]!, t) }
        for (i, t) in vv.map({ (index[$0.key]!, $0.value) }).sorted(by: { $0.0 < $1.0 }) { one(i, t) }
    }

    private static func write(_ totals: [SiteID: CounterTotal], _ index: StateLayout, into w: inout CBORWriter) {
        let entries = totals.map { (index[$0.key]!, $0.value) }.sorted { $0.0 < $1.0 }
        w.writeArrayHeader(count: entries.count)
        for (i, total) in entries {
            w.writeArrayHeader(count: 3)
            w.writeInt(i)
            writeTime(total.stamp.time, index, into: &w)
            w.write(total.total)
        }
    }

    /// Writes `map`'s fields in CBOR's deterministic key order (shorter UTF-8 first, then
    /// byte-wise; RFC 8949 §4.2.1), each read in place. The map keeps its keys in byte order, so
    /// ordering its positions by key length, then by position, gives that order.
    private static func write(_ map: MapNode, _ index: StateLayout, into w: inout CBORWriter) {
        let keys = map.entries.storedKeys
        let lengths = keys.map(\.utf8.count)
        var order = Array(keys.indices)
        order.sort { lengths[$0] != lengths[$1] ? lengths[$0] < lengths[$1] : $0 < $1 }
        w.writeMapHeader(count: order.count)
        map.entries.storedValues.withUnsafeBufferPointer { nodes in
            for position in order {
                w.writeText(keys[position])
                write(nodes[position], index, into: &w)
            }
        }
    }

    /// The list a field entry is written in.
    private enum EntryList {
        case restarts, values, withheld, maps

        init(_ content: FieldEntry.Content) {
            switch content {
            case .restart: self = .restarts
            case .value: self = .values
            case .withheldValue, .withheldMap: self = .withheld
            case .map: self = .maps
            }
        }
    }

    private static func write(_ node: FieldNode, _ index: StateLayout, into w: inout CBORWriter) {
        var (restarts, values, withheld, maps) = (0, 0, 0, 0)
        for entry in node.entries {
            switch EntryList(entry.content) {
            case .restarts: restarts += 1
            case .values: values += 1
            case .withheld: withheld += 1
            case .maps: maps += 1
            }
        }
        // Field keys in deterministic order: "b", "e", "h", "m", "o", "p", "t", "x", "z".
        var count = restarts > 0 ? 1 : 0
        if values > 0 { count += 1 }
        if withheld > 0 { count += 1 }
        if maps > 0 { count += 1 }
        if !node.map.isEmpty { count += 1 }
        if !node.removedTotals.isEmpty { count += 1 }
        if !node.totals.isEmpty { count += 1 }
        if !node.removed.isEmpty { count += 1 }
        if !node.removedDefaults.isEmpty { count += 1 }
        w.writeMapHeader(count: count)
        if restarts > 0 {
            w.writeText("b")
            write(node, .restarts, restarts, index, into: &w) { entry, w in
                guard case .restart(let r) = entry.content else { return }
                w.write(r.value)
                write(r.seen, index, into: &w)
            }
        }
        if values > 0 {
            w.writeText("e")
            write(node, .values, values, index, into: &w) { entry, w in
                if case .value(let v) = entry.content { w.write(v) }
            }
        }
        if withheld > 0 {
            w.writeText("h")
            write(node, .withheld, withheld, index, into: &w) { entry, w in
                w.writeInt(entry.content == .withheldMap ? 1 : 0)
            }
        }
        if !node.map.isEmpty {
            w.writeText("m")
            write(node.map, index, into: &w)
        }
        if !node.removedTotals.isEmpty {
            w.writeText("o")
            write(node.removedTotals, index, into: &w)
        }
        if maps > 0 {
            w.writeText("p")
            write(node, .maps, maps, index, into: &w) { _, _ in }
        }
        if !node.totals.isEmpty {
            w.writeText("t")
            write(node.totals, index, into: &w)
        }
        if !node.removed.isEmpty {
            w.writeText("x")
            write(node.removed, index, into: &w)
        }
        if !node.removedDefaults.isEmpty {
            w.writeText("z")
            let indexes = node.removedDefaults.map { index[$0]! }.sorted()
            w.writeArrayHeader(count: indexes.count)
            for i in indexes { w.writeInt(i) }
        }
    }

    /// Writes the `count` entries of one list as `[[i, time, rest...], ...]` in site-index order;
    /// `rest` writes what follows the stamp.
    private static func write(
        _ node: FieldNode, _ list: EntryList, _ count: Int, _ index: StateLayout, into w: inout CBORWriter,
        _ rest: (FieldEntry, inout CBORWriter) -> Void
    ) {
        let extra: Int
        switch list {
        case .restarts: extra = 2
        case .values, .withheld: extra = 1
        case .maps: extra = 0
        }
        func one(_ i: Int64, _ entry: FieldEntry) {
            w.writeArrayHeader(count: 2 + extra)
            w.writeInt(i)
            writeTime(entry.stamp.time, index, into: &w)
            rest(entry, &w)
        }
        w.writeArrayHeader(count: count)
        if count == 1, let entry = node.entries.first(where: { EntryList($0.content) == list }) {
            one(index[entry.stamp.site]!, entry)
            return
        }
        let entries = node.entries.filter { EntryList($0.content) == list }.map { (index[$0.stamp.site]!, $0) }
        // A site may have two entries in one list (its latest write and its default data).
        for (i, entry) in entries.sorted(by: { $0.0 != $1.0 ? $0.0 < $1.0 : $0.1.stamp.time < $1.1.stamp.time }) {
            one(i, entry)
        }
    }
}

/// The sites a state names, gathered for its site table: a short list while they are few (a
/// state names one or two sites most often, and a list needs no hashing), a set beyond 16.
struct SiteSet {
    private var list: [SiteID] = []
    private var set: Set<SiteID>?

    mutating func insert(_ site: SiteID) {
        if set != nil {
            set!.insert(site)
        } else if !list.contains(site) {
            list.append(site)
            if list.count > 16 { set = Set(list) }
        }
    }

    /// The sites, ascending.
    func sorted() -> [SiteID] { set.map { $0.sorted() } ?? list.sorted() }
}

/// How a state is written: its site table, each site's index in it, and the reference time of a
/// compact delta's state.
struct StateLayout {
    /// The sites the state names, ascending.
    let table: [SiteID]
    /// `nil`: times are written as themselves; otherwise as differences below it (``CompactTime``).
    let reference: HLCTimestamp?

    /// The index of `site` in ``table``, `nil` when the state does not name it.
    ///
    /// - Complexity: O(log n) for `n` sites; a state names few, most often one or two.
    subscript(_ site: SiteID) -> Int64? {
        var low = 0
        var high = table.count
        while low < high {
            let middle = (low + high) / 2
            if table[middle] < site { low = middle + 1 } else { high = middle }
        }
        return low < table.count && table[low] == site ? Int64(low) : nil
    }

    /// The integer `t` is written as: the `Int64` bit pattern of `t`, or its difference below the
    /// reference (``CompactTime/written(_:below:)``).
    func written(_ t: HLCTimestamp) -> Int64 {
        guard let reference else { return Int64(bitPattern: t.rawValue) }
        return CompactTime.written(t, below: reference)
    }
}

/// A time of a compact delta, written as its difference below the delta's reference time `R`
/// (docs/PROTOCOL.md §3, "Delta form"). With `d = R − t`, the time is written as the CBOR
/// integer
///
/// - `2 · (d >> 16)` when the low 16 bits of `d` are 0 (`t` is whole milliseconds below `R`,
///   with the same logical counter: the usual case, 1 to 5 bytes for up to 24 days);
/// - `2 · d + 1` otherwise.
///
/// So `R` itself is `0`, one byte, where an HLC time of today is a 9-byte integer. Every such
/// integer is at or above 0 while `R` is below 2⁶² (all times until the year 4200): the compact
/// form is written only then.
enum CompactTime {
    /// Whether times below `reference` can all be written: it is below 2⁶².
    static func canWrite(below reference: HLCTimestamp) -> Bool { reference.rawValue < 1 << 62 }

    /// The integer `t` is written as, for `t` at or below `reference` and `reference` below 2⁶²
    /// (``canWrite(below:)``). A time above the reference is written as −1, which reads as no time.
    ///
    /// - Complexity: O(1).
    static func written(_ t: HLCTimestamp, below reference: HLCTimestamp) -> Int64 {
        guard t <= reference else { return -1 }
        let d = reference.rawValue - t.rawValue
        return Int64(bitPattern: d & 0xFFFF == 0 ? (d >> 16) << 1 : d << 1 | 1)
    }

    /// The time `n` stands for, or `nil` when `n` is below 0, is not the shortest writing of a
    /// difference (odd, with the low 16 bits of `d` 0), or gives a time below 0 (`d` above
    /// `reference`).
    ///
    /// - Complexity: O(1).
    static func read(_ n: Int64, below reference: HLCTimestamp) -> HLCTimestamp? {
        guard n >= 0 else { return nil }
        let u = UInt64(n)
        let d: UInt64
        if u & 1 == 0 {
            guard u >> 1 < 1 << 48 else { return nil }
            d = (u >> 1) << 16
        } else {
            d = u >> 1
            guard d & 0xFFFF != 0 else { return nil }
        }
        guard d <= reference.rawValue else { return nil }
        return HLCTimestamp(rawValue: reference.rawValue - d)
    }
}
