// Tombstones (F04): a store that created and removed `removed` documents and keeps `live` ones,
// before and after reaping, against a store that only ever held the `live` ones (the baseline,
// measured in the same run): file size, pages in use, enumeration (`documents(in:)`), a peer's
// initial sync scan (the change log from 0), the rate at which a peer's acknowledgements of the
// removes are recorded (the reaper keeps a remove no peer has), and the reaping rate. And removed
// fields: the state of one document whose keys were set and unset `cycles` times, before and after
// the TTL.
import CSQLite
import Foundation
import Synchronization
import TrellisCore
import TrellisStore

/// Pages in use (page count minus free pages) times the page size, read from the file.
func usedBytes(_ file: String) -> Double {
    var db: OpaquePointer?
    guard sqlite3_open_v2(file, &db, SQLITE_OPEN_READONLY, nil) == SQLITE_OK else { return 0 }
    defer { sqlite3_close(db) }
    func pragma(_ name: String) -> Double {
        var st: OpaquePointer?
        sqlite3_prepare_v2(db, "PRAGMA \(name)", -1, &st, nil)
        defer { sqlite3_finalize(st) }
        return sqlite3_step(st) == SQLITE_ROW ? Double(sqlite3_column_int64(st, 0)) : 0
    }
    return (pragma("page_count") - pragma("freelist_count")) * pragma("page_size")
}

func tombstoneFigures(scratch: URL, removed: Int, live: Int = 1_000) throws -> [Figure] {
    let offset = Atomic<UInt64>(0)
    var options = StoreOptions()
    options.now = { UInt64(Date().timeIntervalSince1970 * 1000) + offset.load(ordering: .relaxed) }
    options.elapsed = options.now  // the offset stands for time passing
    options.log = { _ in }
    let file = scratch.appendingPathComponent("tombstones.sqlite").path
    let baselineFile = scratch.appendingPathComponent("live-only.sqlite").path
    let store = try DocumentStore(path: file, options: options)
    let baseline = try DocumentStore(path: baselineFile, options: options)
    func doc(_ prefix: String, _ n: Int) -> Value {
        ["_id": .string(String(format: "\(prefix)-%08d", n)), "name": "someone", "n": .int(Int64(n))]
    }
    let liveDocs = (0..<live).map { doc("live", $0) }
    try baseline.upsert(liveDocs, in: "t")
    for start in stride(from: 0, to: removed, by: 5_000) {
        try store.upsert((start..<min(removed, start + 5_000)).map { doc("gone", $0) }, in: "t")
    }
    try store.upsert(liveDocs, in: "t")
    for start in stride(from: 0, to: removed, by: 5_000) {
        try store.remove(
            in: "t", matching: try Query("_id >= 'gone' && _id < 'gonf' && n < \(start + 5_000)"))
    }
    let count = try store.count(in: "t")
    precondition(count == live)
    // A peer took the removes: the reaper keeps a tombstone of this node's until one has. The
    // acknowledgements come as a replicator passes them, a batch's worth (256) at a time; the
    // pages that find them are read first, outside the timing.
    var acknowledgedUpTo: Int64 = 0
    var batches: [[AcknowledgedEntry]] = []
    while true {
        let page = try store.changes(in: "t", after: acknowledgedUpTo, limit: 256, maxBytes: .max)
        batches.append(
            page.records.filter(\.isDeleted).map {
                AcknowledgedEntry(collection: "t", key: $0.key, seq: $0.seq, isTombstone: true)
            })
        acknowledgedUpTo = page.scannedUpTo
        if page.exhausted { break }
    }
    let acknowledgeSeconds = try seconds { for batch in batches { try store.acknowledge(batch) } }

    func measure(_ s: DocumentStore) throws -> (find: Double, scan: Double) {
        let rounds = 5
        let find = try rate(rounds: rounds) {
            let found = try s.documents(in: "t").count
            precondition(found == live)
        }
        let scan = try rate(rounds: rounds) {
            var after: Int64 = 0
            while true {
                let page = try s.changes(in: "t", after: after, limit: 256, maxBytes: 4 << 20)
                after = page.scannedUpTo
                if page.exhausted { break }
            }
        }
        return (find, scan)
    }
    try baseline.checkpointWAL()
    try store.checkpointWAL()
    let base = try measure(baseline)
    let before = try measure(store)
    let bytesBefore = fileSize(file)
    let usedBefore = usedBytes(file)
    offset.store(options.tombstoneTTL + 60_000, ordering: .relaxed)
    var reaped = 0
    let reapSeconds = try seconds {
        while true {
            let result = try store.reapExpiredTombstones(limit: 1_000)
            reaped += result.reaped
            if !result.more { break }
        }
    }
    precondition(reaped == removed, "reaped \(reaped) of \(removed)")
    try store.checkpointWAL()
    let after = try measure(store)
    let baseBytes = fileSize(baselineFile)
    let r = "\(removed / 1000)k_removed"
    return [
        Figure(name: "tomb_live_only_file_bytes", value: baseBytes, unit: "bytes"),
        Figure(
            name: "tomb_\(r)_file_bytes_before_reap", value: bytesBefore, unit: "bytes", baseline: baseBytes,
            baselineName: "tomb_live_only_file_bytes"),
        Figure(
            name: "tomb_\(r)_used_bytes_before_reap", value: usedBefore, unit: "bytes", baseline: baseBytes,
            baselineName: "tomb_live_only_file_bytes"),
        Figure(
            name: "tomb_\(r)_used_bytes_after_reap", value: usedBytes(file), unit: "bytes", baseline: baseBytes,
            baselineName: "tomb_live_only_file_bytes"),
        Figure(
            name: "tomb_\(r)_file_bytes_after_reap", value: fileSize(file), unit: "bytes", baseline: baseBytes,
            baselineName: "tomb_live_only_file_bytes"),
        Figure(name: "tomb_live_only_find_all_per_s", value: base.find, unit: "finds/s"),
        Figure(
            name: "tomb_\(r)_find_all_per_s_before_reap", value: before.find, unit: "finds/s", baseline: base.find,
            baselineName: "tomb_live_only_find_all_per_s"),
        Figure(
            name: "tomb_\(r)_find_all_per_s_after_reap", value: after.find, unit: "finds/s", baseline: base.find,
            baselineName: "tomb_live_only_find_all_per_s"),
        Figure(name: "tomb_live_only_log_scan_per_s", value: base.scan, unit: "scans/s"),
        Figure(
            name: "tomb_\(r)_log_scan_per_s_before_reap", value: before.scan, unit: "scans/s", baseline: base.scan,
            baselineName: "tomb_live_only_log_scan_per_s"),
        Figure(
            name: "tomb_\(r)_log_scan_per_s_after_reap", value: after.scan, unit: "scans/s", baseline: base.scan,
            baselineName: "tomb_live_only_log_scan_per_s"),
        Figure(name: "tomb_reaped_per_s", value: Double(reaped) / reapSeconds, unit: "tombstones/s"),
        Figure(
            name: "tomb_acknowledged_per_s", value: Double(removed) / acknowledgeSeconds, unit: "tombstones/s"),
        Figure(
            name: "tomb_residue_bytes_per_removed_doc",
            value: (usedBytes(file) - usedBytes(baselineFile)) / Double(removed),
            unit: "bytes"),
    ]
}

/// The encoded state of one document whose `cycles` distinct keys were each set and unset (1,000
/// per transaction), before the TTL and after it (one more write reaps the remove contexts),
/// against the same document written only with its live fields.
func unsetFieldFigures(scratch: URL, cycles: Int) throws -> [Figure] {
    let offset = Atomic<UInt64>(0)
    var options = StoreOptions()
    options.now = { UInt64(Date().timeIntervalSince1970 * 1000) + offset.load(ordering: .relaxed) }
    options.elapsed = options.now  // the offset stands for time passing
    options.log = { _ in }
    let store = try DocumentStore(path: scratch.appendingPathComponent("unset-fields.sqlite").path, options: options)
    try store.upsert(["_id": "d", "name": "someone"], in: "t")
    for start in stride(from: 0, to: cycles, by: 1_000) {
        let keys = (start..<min(cycles, start + 1_000)).map { FieldPath.key("k\($0)") }
        try store.update(id: "d", in: "t", operations: keys.map { .set($0, .int(1), isDefault: false) })
        try store.update(id: "d", in: "t", operations: keys.map { .unset($0) })
    }
    try store.upsert(["_id": "d", "n": 1], in: "t")
    let before = Double(try store.state(id: "d", in: "t")?.cbor().count ?? 0)
    offset.store(options.tombstoneTTL + 1, ordering: .relaxed)
    try store.upsert(["_id": "d", "n": 2], in: "t")
    let after = Double(try store.state(id: "d", in: "t")?.cbor().count ?? 0)
    let live = try DocumentStore(path: scratch.appendingPathComponent("live-fields.sqlite").path, options: options)
    try live.upsert(["_id": "d", "name": "someone"], in: "t")
    try live.upsert(["_id": "d", "n": 2], in: "t")
    let baseline = Double(try live.state(id: "d", in: "t")?.cbor().count ?? 0)
    return [
        Figure(name: "unset_live_fields_state_bytes", value: baseline, unit: "bytes"),
        Figure(
            name: "unset_\(cycles)_state_bytes_before_ttl", value: before, unit: "bytes", baseline: baseline,
            baselineName: "unset_live_fields_state_bytes"),
        Figure(
            name: "unset_\(cycles)_state_bytes_after_ttl", value: after, unit: "bytes", baseline: baseline,
            baselineName: "unset_live_fields_state_bytes"),
    ]
}
