import TrellisCore

/// How a document's CRDT state is kept in the `state` column.
///
/// Most documents were written by one write (an import, one upsert): every field holds one entry
/// with the same stamp, nothing was removed and no field is a counter. Such a state is exactly
/// "the materialised value upserted at one stamp into nothing" (``DocumentState/init(fields:stamp:)``),
/// so the column keeps only that stamp, `{"u": [time, site]}` (about 24 bytes), and the values come
/// from the `value` column. Every other state is kept whole (``DocumentState/cbor()``). Peers
/// receive a compact row as the stamp and the JSON (``SingleWriteState``), every other row whole.
enum StoredState {
    /// The column bytes for `state`, whose materialised value is `materialized`.
    static func bytes(for state: DocumentState, materialized: Value?) -> [UInt8] {
        if let stamp = uniformStamp(state), case .map(var fields)? = materialized {
            fields.removeValue(forKey: "_id")
            if expand(fields: fields, stamp: stamp) == state {
                return compact(stamp)
            }
        }
        return state.cbor()
    }

    /// The compact form of a state made by one write at `stamp`: `{"u": [time, site]}`.
    ///
    /// Written field by field: the bytes ``CBOR/encode(_:)`` gives that map, without building it.
    static func compact(_ stamp: Stamp) -> [UInt8] {
        var writer = CBORWriter(capacity: 24)
        writer.bytes.append(contentsOf: compactPrefix)
        writer.writeArrayHeader(count: 2)
        writer.writeInt(Int64(bitPattern: stamp.time.rawValue))
        writer.writeInt(Int64(bitPattern: stamp.site))
        return writer.bytes
    }

    /// How compact column bytes start: a one-entry CBOR map, its key the text "u".
    private static let compactPrefix: [UInt8] = [0xA1, 0x61, 0x75]

    /// The stamp of compact column bytes, or `nil` when they are not compact.
    ///
    /// - Throws: CBOR errors, or ``DocumentStateError`` when the compact form is malformed.
    static func compactStamp(_ bytes: [UInt8]) throws -> Stamp? {
        guard isCompact(bytes) else { return nil }
        guard let (time, site) = try CBOR.decodeIntegerPair(bytes, from: compactPrefix.count) else {
            throw DocumentStateError(message: "malformed compact state")
        }
        return Stamp(time: HLCTimestamp(rawValue: UInt64(bitPattern: time)), site: SiteID(bitPattern: site))
    }

    /// Whether column bytes hold the compact form (a one-entry CBOR map with key "u").
    static func isCompact(_ bytes: [UInt8]) -> Bool { bytes.starts(with: compactPrefix) }

    /// The state from the column bytes and the stored JSON value.
    ///
    /// - Throws: CBOR, JSON or ``DocumentStateError`` errors for corrupt rows.
    static func decode(_ bytes: [UInt8], value: String?) throws -> DocumentState {
        guard let stamp = try compactStamp(bytes) else { return try DocumentState(encoded: CBOR.decode(bytes)) }
        guard let value, case .map(var fields) = try JSON.parse(value) else {
            throw DocumentStateError(message: "malformed compact state")
        }
        fields.removeValue(forKey: "_id")
        return expand(fields: fields, stamp: stamp)
    }

    /// The one stamp of a state written by a single write, if it is one.
    static func uniformStamp(_ state: DocumentState) -> Stamp? {
        guard state.removed.isEmpty, state.writes.count == 1, state.adds == state.writes,
            let (site, time) = state.writes.first
        else { return nil }
        return Stamp(time: time, site: site)
    }

    /// The state of one upsert of `fields` at `stamp` into nothing.
    static func expand(fields: UTF8Map<Value>, stamp: Stamp) -> DocumentState {
        DocumentState(fields: fields, stamp: stamp)
    }
}
