@testable import TrellisCore

/// A second, straightforward encoder of document states, kept as the specification the direct
/// encoder (`DocumentState.cbor()`) is checked against (docs/PROTOCOL.md §3).
extension DocumentState {
    /// The state as a `Value`, built independently of `cbor()`: `CBOR.encode` of it must give the
    /// same bytes (the deterministic encoding sorts the keys).
    var referenceEncoding: Value {
        var sites = Set<SiteID>()
        for s in writes.keys { sites.insert(s) }
        for s in removed.keys { sites.insert(s) }
        for s in adds.keys { sites.insert(s) }
        Self.referenceSites(root, into: &sites)
        let table = sites.sorted()
        var index: [SiteID: Int64] = [:]
        for (i, s) in table.enumerated() { index[s] = Int64(i) }
        var out: UTF8Map<Value> = [
            "s": .array(table.map { .int(Int64(bitPattern: $0)) }),
            "v": 2,
            "w": Self.referenceEncode(writes, index),
        ]
        if !adds.isEmpty { out["a"] = Self.referenceEncode(adds, index) }
        if !removed.isEmpty { out["r"] = Self.referenceEncode(removed, index) }
        if !root.entries.isEmpty { out["m"] = Self.referenceEncode(root, index) }
        return .map(out)
    }

    /// Every site named anywhere in the fields (apart from the direct encoder's own gathering).
    private static func referenceSites(_ map: MapNode, into sites: inout Set<SiteID>) {
        for node in map.entries.values {
            for entry in node.entries {
                sites.insert(entry.stamp.site)
                if case .restart(let r) = entry.content { for s in r.seen.keys { sites.insert(s) } }
            }
            for s in node.totals.keys { sites.insert(s) }
            for s in node.removedTotals.keys { sites.insert(s) }
            for s in node.removed.keys { sites.insert(s) }
            referenceSites(node.map, into: &sites)
        }
    }

    private static func referenceTime(_ t: HLCTimestamp) -> Value { .int(Int64(bitPattern: t.rawValue)) }

    private static func referenceEncode(_ vv: VersionVector, _ index: [SiteID: Int64]) -> Value {
        .array(
            vv.map { (index[$0.key]!, $0.value) }.sorted { $0.0 < $1.0 }.map {
                .array([.int($0.0), referenceTime($0.1)])
            })
    }

    private static func referenceEncode(_ totals: [SiteID: CounterTotal], _ index: [SiteID: Int64]) -> Value {
        .array(
            totals.map { (index[$0.key]!, $0.value) }.sorted { $0.0 < $1.0 }.map {
                .array([.int($0.0), referenceTime($0.1.stamp.time), $0.1.total])
            })
    }

    private static func referenceEncode(_ map: MapNode, _ index: [SiteID: Int64]) -> Value {
        var out: UTF8Map<Value> = [:]
        for (key, node) in map.entries {
            var field: UTF8Map<Value> = [:]
            // A site may have two entries in one list (its latest write and its default data): by time.
            var lists: [String: [(Int64, UInt64, Value)]] = [:]
            for entry in node.entries {
                let i = index[entry.stamp.site]!
                let time = referenceTime(entry.stamp.time)
                switch entry.content {
                case .value(let v): lists["e", default: []].append((i, entry.stamp.time.rawValue, [.int(i), time, v]))
                case .map: lists["p", default: []].append((i, entry.stamp.time.rawValue, [.int(i), time]))
                case .withheldValue: lists["h", default: []].append((i, entry.stamp.time.rawValue, [.int(i), time, 0]))
                case .withheldMap: lists["h", default: []].append((i, entry.stamp.time.rawValue, [.int(i), time, 1]))
                case .restart(let r):
                    lists["b", default: []].append(
                        (i, entry.stamp.time.rawValue, [.int(i), time, r.value, referenceEncode(r.seen, index)]))
                }
            }
            for (name, list) in lists {
                field[name] = .array(list.sorted { $0.0 != $1.0 ? $0.0 < $1.0 : $0.1 < $1.1 }.map(\.2))
            }
            if !node.map.entries.isEmpty { field["m"] = referenceEncode(node.map, index) }
            if !node.totals.isEmpty { field["t"] = referenceEncode(node.totals, index) }
            if !node.removedTotals.isEmpty { field["o"] = referenceEncode(node.removedTotals, index) }
            if !node.removed.isEmpty { field["x"] = referenceEncode(node.removed, index) }
            if !node.removedDefaults.isEmpty {
                field["z"] = .array(node.removedDefaults.map { index[$0]! }.sorted().map { .int($0) })
            }
            out[key] = .map(field)
        }
        return .map(out)
    }
}
