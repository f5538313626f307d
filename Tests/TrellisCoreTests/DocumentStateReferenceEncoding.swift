@testable import TrellisCore

/// A second, straightforward encoder of document states, kept as the specification the direct
/// encoder (`DocumentState.cbor()`) is checked against.
extension DocumentState {
    /// The state as a `Value`, built independently of `cbor()`: `CBOR.encode` of it must give the
    /// same bytes (the deterministic encoding sorts the keys).
    var referenceEncoding: Value {
        var sites = Set<SiteID>()
        for s in writes.keys { sites.insert(s) }
        for s in removed.keys { sites.insert(s) }
        Self.collectSites(root, into: &sites)
        let table = sites.sorted()
        var index: [SiteID: Int64] = [:]
        for (i, s) in table.enumerated() { index[s] = Int64(i) }
        var out: UTF8Map<Value> = [
            "s": .array(table.map { .int(Int64(bitPattern: $0)) }),
            "w": Self.referenceEncode(writes, index),
            "m": Self.referenceEncode(root, index),
        ]
        if !removed.isEmpty { out["r"] = Self.referenceEncode(removed, index) }
        return .map(out)
    }

    private static func referenceTime(_ t: HLCTimestamp) -> Value { .int(Int64(bitPattern: t.rawValue)) }

    private static func referenceEncode(_ vv: VersionVector, _ index: [SiteID: Int64]) -> Value {
        .array(
            vv.map { (index[$0.key]!, $0.value) }.sorted { $0.0 < $1.0 }.map {
                .array([.int($0.0), referenceTime($0.1)])
            })
    }

    private static func referenceEncode(_ map: MapNode, _ index: [SiteID: Int64]) -> Value {
        var out: UTF8Map<Value> = [:]
        out.reserveCapacity(map.entries.count)
        for (key, node) in map.entries {
            var field: UTF8Map<Value> = [:]
            if let r = node.register {
                field["r"] = .array([r.value, referenceTime(r.stamp.time), .int(index[r.stamp.site]!)])
            }
            if let m = node.map { field["m"] = referenceEncode(m, index) }
            if let s = node.mapStamp { field["ms"] = .array([referenceTime(s.time), .int(index[s.site]!)]) }
            if let c = node.counter {
                var counter: UTF8Map<Value> = [
                    "t": .array(
                        c.totals.map { (index[$0.key]!, $0.value) }.sorted { $0.0 < $1.0 }.map {
                            .array([
                                .int($0.0), .double($0.1.total), referenceTime($0.1.stamp.time),
                                .int(index[$0.1.stamp.site]!),
                            ])
                        })
                ]
                if let r = c.restart {
                    counter["b"] = .array([r.value, referenceTime(r.stamp.time), .int(index[r.stamp.site]!)])
                }
                if !c.restartSeen.isEmpty {
                    counter["o"] = .array(
                        c.restartSeen.map { (index[$0.key]!, $0.value) }.sorted { $0.0 < $1.0 }.map {
                            .array([
                                .int($0.0), .double($0.1.total), referenceTime($0.1.stamp.time),
                                .int(index[$0.1.stamp.site]!),
                            ])
                        })
                }
                field["c"] = .map(counter)
            }
            if !node.removed.isEmpty { field["x"] = referenceEncode(node.removed, index) }
            out[key] = .map(field)
        }
        return .map(out)
    }

}
