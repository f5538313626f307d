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

/// A last-writer-wins register: a value and the stamp of the write that set it.
public struct Register: Hashable, Sendable {
    public var value: Value
    public var stamp: Stamp

    public init(value: Value, stamp: Stamp) {
        self.value = value
        self.stamp = stamp
    }
}

/// A version vector: for each site, the highest HLC timestamp of its writes that a state covers.
public typealias VersionVector = [SiteID: HLCTimestamp]

/// The replicated (CRDT) state of one document.
///
/// - `fields`: one last-writer-wins register per top-level field (the document's `_id` is the
///   key of the document, not a field). A later write is decided by (HLC, site ID).
/// - `writes`: the version vector of every write the state holds.
/// - `removed`: the causal context of removes: a register whose stamp is at or below
///   `removed[stamp.site]` was seen by a remover and is gone. This is the observed-remove
///   (add-wins) rule of DESIGN.md: a write the remover had not seen is above its context and survives,
///   and writing to a removed `_id` brings the document back.
///
/// The document is live when some write is not covered by the remove context.
///
/// ``merge(_:)`` is a join: commutative, associative and idempotent (registers join by maximum stamp,
/// version vectors by pointwise maximum; visibility is derived from the joined state).
public struct DocumentState: Hashable, Sendable {
    public var fields: [String: Register]
    public var writes: VersionVector
    public var removed: VersionVector

    public init(fields: [String: Register] = [:], writes: VersionVector = [:], removed: VersionVector = [:]) {
        self.fields = fields
        self.writes = writes
        self.removed = removed
    }

    /// Whether a register survives the remove context.
    @inline(__always)
    func isVisible(_ stamp: Stamp) -> Bool {
        guard let context = removed[stamp.site] else { return true }
        return stamp.time > context
    }

    /// `true` when every write this state holds was seen by a remove (or it holds none).
    public var isDeleted: Bool {
        for (site, time) in writes {
            if let context = removed[site], time <= context { continue }
            return false
        }
        return true
    }

    /// Records a local write of `value` to top-level field `key`.
    ///
    /// The register changes only if `stamp` is later than the one it holds.
    public mutating func set(_ key: String, to value: Value, stamp: Stamp) {
        if let current = fields[key], current.stamp >= stamp { return }
        fields[key] = Register(value: value, stamp: stamp)
        noteWrite(stamp)
    }

    /// Records that the document was written at `stamp` even if no field changed (an upsert of
    /// only `_id` creates the document).
    public mutating func noteWrite(_ stamp: Stamp) {
        if let t = writes[stamp.site], t >= stamp.time { return }
        writes[stamp.site] = stamp.time
    }

    /// Removes the document as the local node sees it: every write this state holds becomes
    /// covered by the remove context. Concurrent writes not yet seen will survive the merge.
    public mutating func remove() {
        for (site, time) in writes {
            if let t = removed[site], t >= time { continue }
            removed[site] = time
        }
    }

    /// Joins another replica's state of the same document into this one.
    ///
    /// - Returns: `true` when this state changed.
    /// - Complexity: O(fields + sites) of `other`.
    @discardableResult
    public mutating func merge(_ other: DocumentState) -> Bool {
        var changed = false
        for (key, register) in other.fields {
            if let current = fields[key], current.stamp >= register.stamp {
                // LWW: equal stamps name the same write, so the same value.
                continue
            }
            fields[key] = register
            changed = true
        }
        for (site, time) in other.writes where (writes[site].map { $0 < time } ?? true) {
            writes[site] = time
            changed = true
        }
        for (site, time) in other.removed where (removed[site].map { $0 < time } ?? true) {
            removed[site] = time
            changed = true
        }
        return changed
    }

    /// The document as applications see it: a map of the visible fields plus `_id`, or `nil` when
    /// the document is removed.
    public func materialize(id: Value) -> Value? {
        guard !isDeleted else { return nil }
        var out: [String: Value] = [:]
        out.reserveCapacity(fields.count + 1)
        for (key, register) in fields where isVisible(register.stamp) {
            out[key] = register.value
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

// MARK: - Encoding as a Value (stored and sent as CBOR)

extension DocumentState {
    /// The state as a ``Value`` for CBOR: `{"f": {key: [value, time, site]}, "w": [[site, time]...],
    /// "r": [[site, time]...]}` with times and sites as 64-bit integers (bit-cast from unsigned).
    /// Version vectors are sorted by site so the encoding is deterministic.
    public var encoded: Value {
        var f: [String: Value] = [:]
        f.reserveCapacity(fields.count)
        for (key, r) in fields {
            f[key] = .array([
                r.value, .int(Int64(bitPattern: r.stamp.time.rawValue)), .int(Int64(bitPattern: r.stamp.site)),
            ])
        }
        func vv(_ v: VersionVector) -> Value {
            .array(
                v.sorted { $0.key < $1.key }.map {
                    .array([.int(Int64(bitPattern: $0.key)), .int(Int64(bitPattern: $0.value.rawValue))])
                })
        }
        return .map(["f": .map(f), "w": vv(writes), "r": vv(removed)])
    }

    /// Decodes ``encoded``.
    ///
    /// - Throws: ``DocumentStateError`` naming the malformed part; input from peers is untrusted.
    public init(encoded value: Value) throws(DocumentStateError) {
        guard case .map(let m) = value, case .map(let f)? = m["f"] else {
            throw DocumentStateError(message: "document state is not a map with 'f'")
        }
        var fields: [String: Register] = [:]
        fields.reserveCapacity(f.count)
        for (key, entry) in f {
            guard case .array(let parts) = entry, parts.count == 3,
                case .int(let time) = parts[1], case .int(let site) = parts[2]
            else { throw DocumentStateError(message: "field '\(key)' is not [value, time, site]") }
            try parts[0].validateFinite(key)
            fields[key] = Register(
                value: parts[0],
                stamp: Stamp(time: HLCTimestamp(rawValue: UInt64(bitPattern: time)), site: SiteID(bitPattern: site)))
        }
        func vv(_ name: String) throws(DocumentStateError) -> VersionVector {
            guard let v = m[name] else { return [:] }
            guard case .array(let entries) = v else { throw DocumentStateError(message: "'\(name)' is not an array") }
            var out: VersionVector = [:]
            for entry in entries {
                guard case .array(let pair) = entry, pair.count == 2, case .int(let site) = pair[0],
                    case .int(let time) = pair[1]
                else { throw DocumentStateError(message: "'\(name)' entry is not [site, time]") }
                let s = SiteID(bitPattern: site)
                let t = HLCTimestamp(rawValue: UInt64(bitPattern: time))
                if let existing = out[s], existing >= t { continue }
                out[s] = t
            }
            return out
        }
        self.init(fields: fields, writes: try vv("w"), removed: try vv("r"))
    }
}

extension Value {
    fileprivate func validateFinite(_ key: String) throws(DocumentStateError) {
        do { try validate(path: key) } catch { throw DocumentStateError(message: error.description) }
    }
}

/// A document state that does not decode.
public struct DocumentStateError: Error, Equatable, Sendable, CustomStringConvertible {
    public var message: String
    public var description: String { "malformed document state: \(message)" }
}
