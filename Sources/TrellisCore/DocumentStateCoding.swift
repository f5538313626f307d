// The CBOR shape of a DocumentState (docs/PROTOCOL.md §3):
//
//   { "s": [site, ...],                       site table; stamps name sites by index
//     "w": [[i, time], ...], "r": [[i, time], ...],   writes and the document's remove context
//     "m": { key: field, ... } }
//   field = { "r": [value, time, i]?,          register
//             "m": { key: field, ... }?, "ms": [time, i]?,   map entries and map stamp
//             "c": { "t": [[i, total, time, i], ...], "b": [value, time, i]?, "o": [[i, total, time, i], ...] }?,
//             "x": [[i, time], ...]? }         the field's remove context
//
// Times and sites are 64-bit integers (bit-cast from unsigned). Vectors are sorted by site index
// and the site table by site, so the encoding is deterministic.

extension DocumentState {
    static func collectSites(_ map: MapNode, into sites: inout Set<SiteID>) {
        for node in map.entries.values {
            if let r = node.register { sites.insert(r.stamp.site) }
            if let s = node.mapStamp { sites.insert(s.site) }
            if let m = node.map { collectSites(m, into: &sites) }
            if let c = node.counter {
                for (s, t) in c.totals {
                    sites.insert(s)
                    sites.insert(t.stamp.site)
                }
                if let r = c.restart { sites.insert(r.stamp.site) }
                for (s, t) in c.restartSeen {
                    sites.insert(s)
                    sites.insert(t.stamp.site)
                }
            }
            for s in node.removed.keys { sites.insert(s) }
        }
    }

    /// Decodes a state from its CBOR value (the bytes of ``cbor()``, decoded by ``CBOR/decode(_:options:)``).
    ///
    /// - Throws: ``DocumentStateError`` naming the malformed part; input from peers is untrusted
    ///   (non-finite numbers, bad site indexes, wrong shapes are all errors, never traps).
    public init(encoded value: Value) throws(DocumentStateError) {
        guard case .map(let m) = value else { throw DocumentStateError(message: "document state is not a map") }
        guard case .array(let siteValues)? = m["s"] else {
            throw DocumentStateError(message: "document state has no site table")
        }
        var sites: [SiteID] = []
        for v in siteValues {
            guard case .int(let s) = v else { throw DocumentStateError(message: "site table holds \(v.typeName)") }
            sites.append(SiteID(bitPattern: s))
        }
        let decoder = StateDecoder(sites: sites)
        let writes = try decoder.vector(m["w"], "w")
        let removed = try decoder.vector(m["r"], "r")
        let root = try decoder.map(m["m"] ?? .map([:]), depth: 0)
        self.init(root: root, writes: writes, removed: removed)
    }
}

private struct StateDecoder {
    let sites: [SiteID]
    static let maxDepth = Value.maximumDepth + 1

    func fail(_ message: String) -> DocumentStateError {
        DocumentStateError(message: "malformed document state: \(message)")
    }

    func site(_ v: Value) throws(DocumentStateError) -> SiteID {
        guard case .int(let i) = v, i >= 0, i < sites.count else { throw fail("bad site index \(v)") }
        return sites[Int(i)]
    }

    func time(_ v: Value) throws(DocumentStateError) -> HLCTimestamp {
        guard case .int(let t) = v else { throw fail("time is \(v.typeName)") }
        return HLCTimestamp(rawValue: UInt64(bitPattern: t))
    }

    func number(_ v: Value) throws(DocumentStateError) -> Double {
        switch v {
        case .double(let d) where d.isFinite: return d
        case .int(let i): return Double(i)
        default: throw fail("counter amount is \(v.typeName)")
        }
    }

    func finite(_ v: Value, _ key: String) throws(DocumentStateError) -> Value {
        do { try v.validate(path: key) } catch { throw fail(error.description) }
        return v
    }

    func vector(_ v: Value?, _ name: String) throws(DocumentStateError) -> VersionVector {
        guard let v else { return [:] }
        guard case .array(let entries) = v else { throw fail("'\(name)' is not an array") }
        var out: VersionVector = [:]
        for entry in entries {
            guard case .array(let pair) = entry, pair.count == 2 else {
                throw fail("'\(name)' entry is not [site, time]")
            }
            out.include(Stamp(time: try time(pair[1]), site: try site(pair[0])))
        }
        return out
    }

    func register(_ v: Value, _ key: String) throws(DocumentStateError) -> Register {
        guard case .array(let parts) = v, parts.count == 3 else {
            throw fail("register '\(key)' is not [value, time, site]")
        }
        return Register(
            value: try finite(parts[0], key), stamp: Stamp(time: try time(parts[1]), site: try site(parts[2])))
    }

    func map(_ v: Value, depth: Int) throws(DocumentStateError) -> MapNode {
        guard depth < Self.maxDepth else { throw fail("maps nested deeper than \(Self.maxDepth)") }
        guard case .map(let entries) = v else { throw fail("map node is \(v.typeName)") }
        var node = MapNode()
        node.entries.reserveCapacity(entries.count)
        for (key, fieldValue) in entries {
            guard case .map(let f) = fieldValue else { throw fail("field '\(key)' is \(fieldValue.typeName)") }
            var field = FieldNode()
            if let r = f["r"] { field.register = try register(r, key) }
            if let m = f["m"] { field.map = try map(m, depth: depth + 1) }
            if let s = f["ms"] {
                guard case .array(let parts) = s, parts.count == 2 else { throw fail("map stamp of '\(key)'") }
                field.mapStamp = Stamp(time: try time(parts[0]), site: try site(parts[1]))
            }
            if let c = f["c"] {
                guard case .map(let cm) = c else { throw fail("counter '\(key)' is not a map") }
                var counter = Counter()
                if case .array(let totals)? = cm["t"] {
                    for t in totals {
                        guard case .array(let p) = t, p.count == 4 else { throw fail("counter total of '\(key)'") }
                        counter.totals[try site(p[0])] = CounterTotal(
                            total: try number(p[1]), stamp: Stamp(time: try time(p[2]), site: try site(p[3])))
                    }
                }
                if let b = cm["b"] { counter.restart = try register(b, key) }
                if case .array(let seen)? = cm["o"] {
                    for o in seen {
                        guard case .array(let p) = o, p.count == 4 else { throw fail("counter restart of '\(key)'") }
                        counter.restartSeen[try site(p[0])] = CounterTotal(
                            total: try number(p[1]), stamp: Stamp(time: try time(p[2]), site: try site(p[3])))
                    }
                }
                field.counter = counter
            }
            field.removed = try vector(f["x"], "x")
            node.entries[key] = field
        }
        return node
    }
}

// MARK: - Direct encoding

extension DocumentState {
    /// The state's CBOR bytes (the shape above, RFC 8949 §4.2.1 deterministic encoding), written
    /// straight into a buffer without building an intermediate `Value` tree.
    ///
    /// - Complexity: O(size of the state), plus sorting each map's keys.
    public func cbor() -> [UInt8] {
        var sites = Set<SiteID>()
        for s in writes.keys { sites.insert(s) }
        for s in removed.keys { sites.insert(s) }
        Self.collectSites(root, into: &sites)
        let table = sites.sorted()
        var index: [SiteID: Int64] = [:]
        index.reserveCapacity(table.count)
        for (i, s) in table.enumerated() { index[s] = Int64(i) }
        var w = CBORWriter(capacity: 256)
        // Keys in deterministic order: "m", "r", "s", "w" (one byte each, bytewise).
        w.writeMapHeader(count: removed.isEmpty ? 3 : 4)
        w.writeText("m")
        Self.write(root, index, into: &w)
        if !removed.isEmpty {
            w.writeText("r")
            Self.write(removed, index, into: &w)
        }
        w.writeText("s")
        w.writeArrayHeader(count: table.count)
        for s in table { w.writeInt(Int64(bitPattern: s)) }
        w.writeText("w")
        Self.write(writes, index, into: &w)
        return w.bytes
    }

    private static func writeTime(_ t: HLCTimestamp, into w: inout CBORWriter) {
        w.writeInt(Int64(bitPattern: t.rawValue))
    }

    private static func write(_ vv: VersionVector, _ index: [SiteID: Int64], into w: inout CBORWriter) {
        let entries = vv.map { (index[$0.key]!, $0.value) }.sorted { $0.0 < $1.0 }
        w.writeArrayHeader(count: entries.count)
        for (i, t) in entries {
            w.writeArrayHeader(count: 2)
            w.writeInt(i)
            writeTime(t, into: &w)
        }
    }

    private static func write(_ r: Register, _ index: [SiteID: Int64], into w: inout CBORWriter) {
        w.writeArrayHeader(count: 3)
        w.write(r.value)
        writeTime(r.stamp.time, into: &w)
        w.writeInt(index[r.stamp.site]!)
    }

    private static func write(
        _ totals: [SiteID: CounterTotal], _ index: [SiteID: Int64], into w: inout CBORWriter
    ) {
        let entries = totals.map { (index[$0.key]!, $0.value) }.sorted { $0.0 < $1.0 }
        w.writeArrayHeader(count: entries.count)
        for (i, total) in entries {
            w.writeArrayHeader(count: 4)
            w.writeInt(i)
            w.writeDouble(total.total)
            writeTime(total.stamp.time, into: &w)
            w.writeInt(index[total.stamp.site]!)
        }
    }

    private static func write(_ map: MapNode, _ index: [SiteID: Int64], into w: inout CBORWriter) {
        let keys = map.entries.keys.sorted(by: CBORWriter.keyPrecedes)
        w.writeMapHeader(count: keys.count)
        for key in keys {
            let node = map.entries[key]!
            w.writeText(key)
            // Field keys in deterministic order: "c", "m", "r", "x", then "ms".
            var count = 0
            if node.counter != nil { count += 1 }
            if node.map != nil { count += 1 }
            if node.register != nil { count += 1 }
            if !node.removed.isEmpty { count += 1 }
            if node.mapStamp != nil { count += 1 }
            w.writeMapHeader(count: count)
            if let c = node.counter {
                w.writeText("c")
                // Counter keys: "b", "o", "t".
                w.writeMapHeader(count: 1 + (c.restart == nil ? 0 : 1) + (c.restartSeen.isEmpty ? 0 : 1))
                if let r = c.restart {
                    w.writeText("b")
                    write(r, index, into: &w)
                }
                if !c.restartSeen.isEmpty {
                    w.writeText("o")
                    write(c.restartSeen, index, into: &w)
                }
                w.writeText("t")
                write(c.totals, index, into: &w)
            }
            if let m = node.map {
                w.writeText("m")
                write(m, index, into: &w)
            }
            if let r = node.register {
                w.writeText("r")
                write(r, index, into: &w)
            }
            if !node.removed.isEmpty {
                w.writeText("x")
                write(node.removed, index, into: &w)
            }
            if let s = node.mapStamp {
                w.writeText("ms")
                w.writeArrayHeader(count: 2)
                writeTime(s.time, into: &w)
                w.writeInt(index[s.site]!)
            }
        }
    }
}
