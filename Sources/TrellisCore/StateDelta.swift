// The delta form of a document state (docs/PROTOCOL.md §3, "Delta form"; docs/DELTAS.md).
// What this build writes, the compact form:
//
//   delta = [ R,                   the reference time: the highest time of the state's w and r
//             [[i, dt], ...],      the base: the causal context (w joined with r) of the sender's
//                                  state before the writes the delta carries, its sites as indexes
//                                  into the state's site table
//             state,               the sender's state after the writes, holding only the top-level
//                                  fields they changed: the whole-state shape without "v", "a" left
//                                  out when it equals "w"
//             bytes (16) ]         the StateDigest of the sender's whole state after them
//
// Every time in it (`dt`, and every time of the state) is written as its difference below R
// (CompactTime, in DocumentStateCoding.swift).
// It starts with `84` (an array of four): every other state form is a map. The old form, which
// builds before it wrote and this one still reads, starts with `a3 61 62` (a three-entry map whose
// first key is "b"):
//
//   delta = { "b": [[site, time], ...], "d": state (version 2), "h": bytes (16) }

/// A **delta** of a document's state: the top-level fields that local writes changed, taken from
/// the state after them, with the causal context of the state before them (the **base**).
///
/// A receiver whose state of the document covers the base (its `w` joined with its `r` is at or
/// above the base for every site) joins the delta with ``DocumentState/merge(_:)-(StateDelta)`` and
/// gets exactly what joining the sender's whole state would give: under the soundness argument of
/// docs/DATA-MODEL.md ("Normal form, and why merge is a join"), a state whose context covers the
/// base descends from every state the sender's state before the writes descends from, so it holds
/// all the delta leaves out, or has seen it removed. The delta vouches only for the stamps above its
/// base: an entry of the receiver that the delta lacks is dropped only when its stamp is in the
/// delta's context and not in the base (the δ-CRDT join of Almeida, Shoker and Baquero,
/// "Delta state replicated data types", 2018). A receiver whose state does not cover the base
/// asks for the whole state instead (docs/PROTOCOL.md §2 step 5, "Deltas").
public struct StateDelta: Sendable, Equatable {
    /// The causal context of the sender's state before the writes: what the receiver must cover.
    public var base: VersionVector
    /// The sender's state after the writes, restricted to the top-level fields they changed (its
    /// `w`, `r` and `a` whole).
    public var state: DocumentState
    /// The digest of the sender's whole state after the writes, as it stores and sends it: what
    /// the receiver remembers for echo suppression (docs/PROTOCOL.md §2 step 6).
    public var digest: StateDigest

    public init(base: VersionVector, state: DocumentState, digest: StateDigest) {
        self.base = base
        self.state = state
        self.digest = digest
    }

    /// The delta from `old` to `new`, two states of one document on this node where `new` is
    /// `old` after local writes only, or `nil` when none is worth sending: `old` holds nothing, the
    /// document is removed in `new`, either state holds anything stamped at time zero (default
    /// data, or a context naming it: a context does not vouch for default data, so a state that
    /// covers the base may lack it), either state withholds values (a document written after it
    /// was evicted travels whole, so receivers that hold the values send them back), or a changed
    /// field is gone from `new`.
    ///
    /// `new` should be the state as written, before its removed fields' remove contexts are
    /// reaped (``DocumentState/reapRemovedFields(before:)``): the delta vouches only for the
    /// stamps above its base, so the entries below it that the writes removed are removed at the
    /// receiver only by those contexts.
    ///
    /// - Parameters:
    ///   - previous: the delta stored with `old`, when `old` itself came from local writes after a
    ///     base: its base is kept and its fields are carried again, with the remove contexts it
    ///     carried, so one delta covers every write since that base.
    ///   - digest: ``StateDigest`` of `new` as stored and sent.
    /// - Complexity: O(size of both states).
    public static func make(from old: DocumentState, to new: DocumentState, previous: StateDelta?, digest: StateDigest)
        -> StateDelta?
    {
        guard !old.writes.isEmpty, !new.isDeleted, old.admitsDelta, new.admitsDelta else { return nil }
        let base = previous?.base ?? old.writes.joined(old.removed)
        guard !base.isEmpty, !base.values.contains(.zero) else { return nil }
        let newFields = new.root.entries
        let oldFields = old.root.entries
        let carried = previous?.state.root.entries.keys
        // A field gone from `new` (now or since the previous delta's base) went by a context the
        // delta would carry only in a field it holds: none is made. (The keys are searched, and
        // `old`'s counted in the walk below, without reading the fields.)
        if let carried { for key in carried where !newFields.keys.contains(key) { return nil } }
        // The fields that changed, in the map's own order (each one an append). Both maps are
        // sorted by key: `old`'s is walked beside `new`'s, and the fields compared in place.
        var root = MapNode()
        var next = 0
        var kept = 0
        newFields.storedKeys.withUnsafeBufferPointer { keys in
            newFields.storedValues.withUnsafeBufferPointer { nodes in
                oldFields.storedValues.withUnsafeBufferPointer { oldNodes in
                    for position in keys.indices {
                        let key = keys[position]
                        let (found, oldPosition) = oldFields.search(key, from: next)
                        next = found ? oldPosition + 1 : oldPosition
                        if found { kept += 1 }
                        if !found || oldNodes[oldPosition] != nodes[position] || carried?.contains(key) == true {
                            root.entries.insert(key, nodes[position], at: root.entries.count)
                        }
                    }
                }
            }
        }
        guard kept == oldFields.count else { return nil }
        var state = DocumentState(root: root, writes: new.writes, removed: new.removed, adds: new.adds)
        // A field carried from the previous delta keeps the remove contexts that delta carried:
        // `old`, as stored, may have reaped them since (their writes older than the TTL), and
        // without them a receiver keeps entries below the base that the sender removed.
        if let previous { state.merge(previous.state) }
        return StateDelta(base: base, state: state, digest: digest)
    }

    // MARK: Encoding

    /// Whether `bytes` are in a delta form, compact or old (by their first bytes; not whether
    /// they decode).
    public static func isEncoded(_ bytes: [UInt8]) -> Bool { isCompact(bytes) || isOldForm(bytes) }

    /// Whether `bytes` are in the compact delta form: they start with `84` (an array of four;
    /// every other state form is a map).
    static func isCompact(_ bytes: [UInt8]) -> Bool { bytes.first == 0x84 }

    /// Whether `bytes` are in the old delta form: they start with `a3 61 62` (a map of three whose
    /// first key is `"b"`).
    static func isOldForm(_ bytes: [UInt8]) -> Bool { bytes.starts(with: [0xA3, 0x61, 0x62]) }

    /// The digest an encoded delta carries (its last 16 bytes: the byte string `h` that ends
    /// either form), or `nil` when the bytes are in no delta form or do not end so. Cheap: for
    /// echo suppression before the delta is decoded.
    ///
    /// - Complexity: O(1).
    public static func digest(in bytes: [UInt8]) -> StateDigest? {
        if isCompact(bytes) {
            // `84`, the reference, the base, the state, then `50` and 16 bytes.
            guard bytes.count >= 20, bytes[bytes.count - 17] == 0x50 else { return nil }
            return StateDigest(bytes: bytes[(bytes.count - 16)...])
        }
        guard isOldForm(bytes), bytes.count >= 22 else { return nil }
        let tail = bytes.count - 19
        guard bytes[tail] == 0x61, bytes[tail + 1] == 0x68, bytes[tail + 2] == 0x50 else { return nil }
        return StateDigest(bytes: bytes[(tail + 3)...])
    }

    /// The bytes of the delta: the compact form (docs/PROTOCOL.md §3, "Delta form"; RFC 8949
    /// §4.2.1 deterministic encoding), which is what nodes store and send.
    ///
    /// A delta the compact form cannot hold is written in the old form (``encodedInOldForm()``):
    /// one whose base is empty, names time 0, or is not covered by the state's own context (none
    /// of which a receiver can take, nor ``make(from:to:previous:digest:)`` makes), or whose
    /// state holds a time at or above 2⁶² (the year 4200; ``CompactTime``).
    ///
    /// - Complexity: O(size of the delta's state).
    public func encoded() -> [UInt8] {
        let context = state.writes.joined(state.removed)
        guard let reference = context.values.max(), CompactTime.canWrite(below: reference), !base.isEmpty,
            base.allSatisfy({ $0.value != .zero && context.covers(Stamp(time: $0.value, site: $0.key)) })
        else { return encodedInOldForm() }
        let layout = state.layout(reference: reference)
        var w = CBORWriter(capacity: 128)
        w.writeArrayHeader(count: 4)
        w.writeInt(Int64(bitPattern: reference.rawValue))
        // Every base site is in the context, so in the state's site table.
        let entries = base.map { (layout[$0.key]!, $0.value) }.sorted { $0.0 < $1.0 }
        w.writeArrayHeader(count: entries.count)
        for (i, time) in entries {
            w.writeArrayHeader(count: 2)
            w.writeInt(i)
            w.writeInt(layout.written(time))
        }
        state.write(into: &w, layout)
        w.writeBytes(digest.bytes)
        return w.bytes
    }

    /// The bytes of the delta in the old form, as builds before the compact form wrote it and
    /// still read it (docs/PROTOCOL.md §3, "Delta form"; RFC 8949 §4.2.1 deterministic: keys `b`,
    /// `d`, `h`; the base sorted by site).
    ///
    /// - Complexity: O(size of the delta's state).
    public func encodedInOldForm() -> [UInt8] {
        var w = CBORWriter(capacity: 128)
        w.writeMapHeader(count: 3)
        w.writeText("b")
        let sites = base.keys.sorted()
        w.writeArrayHeader(count: sites.count)
        for site in sites {
            w.writeArrayHeader(count: 2)
            w.writeInt(Int64(bitPattern: site))
            w.writeInt(Int64(bitPattern: base[site]!.rawValue))
        }
        w.writeText("d")
        var out = CBORWriter(appendingTo: w.bytes + state.cbor())
        out.writeText("h")
        out.writeBytes(digest.bytes)
        return out.bytes
    }

    /// Decodes a delta in either form (compact or old).
    ///
    /// - Throws: ``DocumentStateError`` when the bytes are not a delta of either shape, its state
    ///   does not decode (as ``DocumentState/init(encoded:)`` checks it), or its base is above the
    ///   state's own causal context (a sender's state only grows) or names a site twice. In the
    ///   compact form also: a reference that is not the highest time of the state's `w` and `r`,
    ///   a time below 0 once subtracted from it, a base site index outside the state's site table,
    ///   an empty base, or a base naming time 0. Input from peers: never a trap.
    /// - Complexity: O(size of the bytes).
    public init(bytes: [UInt8]) throws(DocumentStateError) {
        let value: Value
        do { value = try CBOR.decode(bytes) } catch {
            throw DocumentStateError(message: "delta does not decode: \(error)")
        }
        if case .array(let parts) = value {
            try self.init(compact: parts)
            return
        }
        guard case .map(let m) = value, m.count == 3, case .array(let rows)? = m["b"], let d = m["d"],
            case .bytes(let h)? = m["h"], h.count == 16
        else {
            throw DocumentStateError(message: "delta is not {b: base, d: state, h: 16-byte digest}")
        }
        let state = try DocumentState(encoded: d)
        let context = state.writes.joined(state.removed)
        var base = VersionVector()
        for row in rows {
            guard case .array(let pair) = row, pair.count == 2, case .int(let site) = pair[0],
                case .int(let time) = pair[1]
            else { throw DocumentStateError(message: "delta base entry is not [site, time]") }
            let stamp = Stamp(time: HLCTimestamp(rawValue: UInt64(bitPattern: time)), site: SiteID(bitPattern: site))
            try Self.add(stamp, to: &base, within: context)
        }
        self.init(base: base, state: state, digest: StateDigest(bytes: h[...]))
    }

    /// Decodes the compact form from the four parts of its array: `[R, base, state, h]`.
    private init(compact parts: [Value]) throws(DocumentStateError) {
        guard parts.count == 4, case .int(let r) = parts[0], r > 0, case .array(let rows) = parts[1],
            case .bytes(let h) = parts[3], h.count == 16
        else {
            throw DocumentStateError(message: "delta is not [reference > 0, base, state, 16-byte digest]")
        }
        let reference = HLCTimestamp(rawValue: UInt64(bitPattern: r))
        let (state, sites) = try DocumentState.decodeCompact(parts[2], reference: reference)
        let context = state.writes.joined(state.removed)
        guard context.values.max() == reference else {
            throw DocumentStateError(
                message: "delta reference time \(reference.rawValue) is not the highest time of its state's w and r")
        }
        guard !rows.isEmpty else { throw DocumentStateError(message: "delta base is empty") }
        var base = VersionVector()
        for row in rows {
            guard case .array(let pair) = row, pair.count == 2, case .int(let i) = pair[0], i >= 0, i < sites.count,
                case .int(let n) = pair[1]
            else { throw DocumentStateError(message: "delta base entry is not [site index, time difference]") }
            guard let time = CompactTime.read(n, below: reference), time != .zero else {
                throw DocumentStateError(
                    message:
                        "delta base time difference \(n) gives no time above 0 below the reference \(reference.rawValue)"
                )
            }
            try Self.add(Stamp(time: time, site: sites[Int(i)]), to: &base, within: context)
        }
        self.init(base: base, state: state, digest: StateDigest(bytes: h[...]))
    }

    /// Adds a base entry, checking that its site is new to the base and that the delta's own
    /// context covers it.
    private static func add(_ stamp: Stamp, to base: inout VersionVector, within context: VersionVector)
        throws(DocumentStateError)
    {
        guard base[stamp.site] == nil else {
            throw DocumentStateError(message: "delta base names site \(String(stamp.site, radix: 16)) twice")
        }
        guard context.covers(stamp) else {
            throw DocumentStateError(message: "delta base \(stamp) is above the delta's own context")
        }
        base[stamp.site] = stamp.time
    }
}

extension DocumentState {
    /// Whether this state can take a delta on `base`: its `w` joined with its `r` is at or above
    /// `base` for every site, `base` names no time zero (default data, which a context does not
    /// vouch for), and this state withholds no value (an eviction stub takes whole states, which
    /// restore its values; rule 8). A delta on that base can then be joined
    /// (``merge(_:)-(StateDelta)``).
    ///
    /// - Complexity: O(sites of `base`), plus O(size of the state) to look for withheld values.
    public func covers(base: VersionVector) -> Bool {
        guard !base.isEmpty, withheldEntryCount == 0 else { return false }
        for (site, time) in base {
            guard time != .zero, max(writes[site] ?? .zero, removed[site] ?? .zero) >= time else { return false }
        }
        return true
    }

    /// Joins a delta into this state, which must cover its base (``covers(base:)``): the result is
    /// what joining the sender's whole state would give.
    ///
    /// - Returns: `true` when this state changed.
    /// - Precondition: `covers(base: delta.base)`; the store checks it and asks for the whole state
    ///   otherwise. Joining a delta without it is still a join of valid states but may miss what
    ///   the delta leaves out.
    /// - Complexity: O(size of the delta plus size of this state).
    @discardableResult
    public mutating func merge(_ delta: StateDelta) -> Bool {
        merge(delta.state, above: delta.base)
    }
}

extension DocumentState {
    /// Whether anything in this state is stamped at time zero: an entry (default data), a
    /// counter total or a context or vector entry.
    var holdsTimeZero: Bool { holdsTimeZero(orWithheld: false) }

    /// Whether a delta may start or end at this state: it holds nothing stamped at time zero
    /// (``holdsTimeZero``) and no withheld entry (``withheldEntryCount``), told in one walk.
    ///
    /// - Complexity: O(size of the state) at most.
    var admitsDelta: Bool { !holdsTimeZero(orWithheld: true) }

    /// Whether anything in this state is stamped at time zero or, with `orWithheld`, is a
    /// withheld entry. One walk that stops at the first such thing and reads the fields in place.
    private func holdsTimeZero(orWithheld: Bool) -> Bool {
        writes.values.contains(.zero) || removed.values.contains(.zero) || adds.values.contains(.zero)
            || !root.entries.allMembers { !$0.holdsTimeZero(orWithheld: orWithheld) }
    }
}

extension FieldNode {
    /// ``DocumentState/holdsTimeZero`` for this field and the fields below it; with `orWithheld`,
    /// a withheld entry counts too.
    func holdsTimeZero(orWithheld: Bool) -> Bool {
        entries.contains { $0.stamp.time == .zero || (orWithheld && $0.isWithheld) }
            || totals.values.contains { $0.stamp.time == .zero }
            || removedTotals.values.contains { $0.stamp.time == .zero } || removed.values.contains(.zero)
            || !removedDefaults.isEmpty
            || !map.entries.allMembers { !$0.holdsTimeZero(orWithheld: orWithheld) }
    }
}

extension StateDigest {
    /// The digest from its 16 bytes (``bytes``).
    ///
    /// - Precondition: exactly 16 bytes.
    public init(bytes: ArraySlice<UInt8>) {
        precondition(bytes.count == 16)
        var high: UInt64 = 0
        var low: UInt64 = 0
        for (i, byte) in bytes.enumerated() {
            if i < 8 { high = high << 8 | UInt64(byte) } else { low = low << 8 | UInt64(byte) }
        }
        self.init(high: high, low: low)
    }

    /// The 16 bytes of the digest, high half first, big-endian.
    public var bytes: [UInt8] {
        (0..<8).map { UInt8(truncatingIfNeeded: high >> (56 - 8 * $0)) }
            + (0..<8).map { UInt8(truncatingIfNeeded: low >> (56 - 8 * $0)) }
    }
}
