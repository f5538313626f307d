import Foundation
import TrellisCore
import TrellisStore

/// Local updates of one field, batched: the first `count` of `documents` upserted into a store at
/// `file`, then `Horsepower` set in each, 1,000 updates to a transaction. Each update also keeps
/// the delta of what it changed (docs/DELTAS.md). Returns updates per second; the batches are made
/// before the clock starts.
func oneFieldUpdateRate(file: String, documents: [Value], count: Int) throws -> Double {
    let store = try DocumentStore(path: file)
    try store.upsert(Array(documents.prefix(count)), in: "cars")
    try store.checkpointWAL()
    let batches = stride(from: 0, to: count, by: 1_000).map { start in
        (start..<min(count, start + 1_000)).map { n in
            (
                Value.string(carID(n)),
                [DocumentMutation.set(FieldPath(components: [.key("Horsepower")]), .int(Int64(n)), isDefault: false)]
            )
        }
    }
    let time = try seconds {
        for batch in batches { _ = try store.update(batch, in: "cars") }
    }
    return Double(count) / time
}

/// The delta's own work (compare, encode, digest) on the states of one-field updates of the first
/// 5,000 of `documents`, against `updateRate`, and the delta's bytes.
func deltaFigures(documents: [Value], updateRate: Double) throws -> [Figure] {
    var pairs: [(DocumentState, DocumentState, [UInt8])] = []
    for n in 0..<min(5_000, documents.count) {
        guard case .map(var fields) = documents[n] else { continue }
        fields["_id"] = nil
        let old = DocumentState(fields: fields, stamp: Stamp(time: HLCTimestamp(millis: 1_000, logical: 0), site: 1))
        var new = old
        try new.set(
            FieldPath(components: [.key("Horsepower")]), to: .int(Int64(n)),
            stamp: Stamp(time: HLCTimestamp(millis: 1_001, logical: 0), site: 1))
        pairs.append((old, new, new.cbor()))  // the store encodes the state anyway
    }
    var bytes = 0
    let time = seconds {
        for (old, new, encoded) in pairs {
            let digest = StateDigest(encoded)
            bytes += StateDelta.make(from: old, to: new, previous: nil, digest: digest)?.encoded().count ?? 0
        }
    }
    return [
        Figure(
            name: "delta_made_per_s", value: Double(pairs.count) / time, unit: "deltas/s",
            baseline: updateRate, baselineName: "local_updates_one_field_batched_per_s"),
        Figure(name: "delta_bytes_one_field_of_a_car", value: Double(bytes) / Double(pairs.count), unit: "B"),
    ]
}
