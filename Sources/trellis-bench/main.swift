// trellis-bench: measures Trellis figures against baselines measured in the same run.
//
//   swift run -c release trellis-bench [--json] [--documents N] [--cars FILE] [--simulation] [--tombstones]
//       [--unset-fields] [--replication] [--import] [--links] [--handshakes] [--hostile [--runs N]]
//       [--sync-costs] [--wire [--verbose]] [--contacts] [--find [--runs N]] [--single [--runs N]]
//       [--writes [--runs N]] [--updates [--runs N]] [--refetch]
//
// Every figure is printed with its baseline and the ratio figure/baseline (higher is better for
// rates). With --json, each figure is one JSON object per line:
//   {"name": ..., "value": ..., "unit": ..., "baseline": ..., "ratio": ...}
import CSQLite
import Foundation
import Trellis
import TrellisCore
import TrellisStore
import TrellisSync

struct Figure {
    var name: String
    var value: Double
    var unit: String
    var baseline: Double?
    var baselineName: String?

    var ratio: Double? { baseline.map { value / $0 } }
}

/// Subscriptions that go nowhere: a ``Store`` over a bare document store, for the query figures.
final class NoSubscriptions: SubscriptionService {
    func subscribe(_ spec: SubscriptionSpec) throws {}
    func unsubscribe(_ spec: SubscriptionSpec) {}
}

// The raw baselines open SQLite before any store does: SQLite is set up as the stores set it,
// so that both run with the same process-wide settings.
DocumentStore.configureSQLite()

let args = Array(CommandLine.arguments.dropFirst())

/// The positive whole number `args[index]` gives for `flag`; exits with status 2 when there is none.
func positiveNumber(for flag: String, at index: Int) -> Int {
    guard index < args.count, let n = Int(args[index]), n > 0 else {
        FileHandle.standardError.write(Data("trellis-bench: \(flag) needs a positive number\n".utf8))
        exit(2)
    }
    return n
}
var jsonOutput = false
var documentCount = 100_000
var carsPath: String?
var simulationOnly = false
var tombstonesOnly = false
var unsetFieldsOnly = false
var replicationOnly = false
var importOnly = false
var linksOnly = false
var handshakesOnly = false
var hostileOnly = false
var syncCostsOnly = false
var wireOnly = false
var contactsOnly = false
var findOnly = false
var singleOnly = false
var writesOnly = false
var updatesOnly = false
var refetchOnly = false
var verbose = false
var replicationRuns = 1
var i = 0
while i < args.count {
    switch args[i] {
    case "--json": jsonOutput = true
    case "--simulation": simulationOnly = true
    case "--tombstones": tombstonesOnly = true
    case "--unset-fields": unsetFieldsOnly = true
    case "--replication": replicationOnly = true
    case "--import": importOnly = true
    case "--links": linksOnly = true
    case "--handshakes": handshakesOnly = true
    case "--hostile": hostileOnly = true
    case "--sync-costs": syncCostsOnly = true
    case "--wire": wireOnly = true
    case "--contacts": contactsOnly = true
    case "--find": findOnly = true
    case "--single": singleOnly = true
    case "--writes": writesOnly = true
    case "--updates": updatesOnly = true
    case "--refetch": refetchOnly = true
    case "--verbose": verbose = true
    case "--import-child":
        // Internal: one import in a child process (ImportBench.swift).
        guard i + 2 < args.count else { exit(2) }
        runImportChild(file: args[i + 1], database: args[i + 2])
    case "--documents":
        i += 1
        documentCount = positiveNumber(for: "--documents", at: i)
    case "--runs":
        i += 1
        replicationRuns = positiveNumber(for: "--runs", at: i)
    case "--cars":
        i += 1
        guard i < args.count else {
            FileHandle.standardError.write(Data("trellis-bench: --cars needs a file\n".utf8))
            exit(2)
        }
        carsPath = args[i]
    case "--help", "-h":
        print(
            "usage: trellis-bench [--json] [--documents N] [--cars FILE] [--simulation] [--tombstones] [--unset-fields]"
                + " [--replication [--runs N]] [--import] [--links] [--handshakes] [--hostile [--runs N]] [--sync-costs]"
                + " [--wire [--verbose]] [--contacts] [--find [--runs N]] [--single [--runs N]]"
                + " [--writes [--runs N]] [--updates [--runs N]] [--refetch]"
        )
        exit(0)
    default:
        FileHandle.standardError.write(Data("trellis-bench: unknown argument '\(args[i])'\n".utf8))
        exit(2)
    }
    i += 1
}

/// The cars of vega_datasets (from --cars, or the demo's virtualenv), else synthetic cars-shaped rows.
func loadCars(_ carsPath: String?) -> [Value] {
    let candidates = [carsPath, ".venv/lib/python3.11/site-packages/vega_datasets/_data/cars.json"].compactMap { $0 }
    for path in candidates {
        if let data = FileManager.default.contents(atPath: path), case .array(let cars)? = try? JSON.parse(data) {
            return cars
        }
    }
    // Said on standard error: figures of synthetic rows do not compare with those of the cars.
    FileHandle.standardError.write(
        Data(
            ("trellis-bench: no cars.json (run scripts/setup.sh vega_datasets, or pass --cars FILE): "
                + "synthetic cars-shaped rows instead\n").utf8))
    let origins = ["USA", "Europe", "Japan"]
    return (0..<406).map { (n: Int) -> Value in
        var car = UTF8Map<Value>()
        car["Name"] = .string("car \(n)")
        car["Miles_per_Gallon"] = .double(Double(n % 40) + 0.5)
        car["Cylinders"] = .int(Int64(4 + n % 5))
        car["Displacement"] = .int(Int64(100 + n))
        car["Horsepower"] = .int(Int64(60 + n % 150))
        car["Weight_in_lbs"] = .int(Int64(2000 + n * 3))
        car["Acceleration"] = .double(12 + Double(n % 10) / 2)
        car["Year"] = .string("1970-01-01")
        car["Origin"] = .string(origins[n % 3])
        return .map(car)
    }
}

let cars = loadCars(carsPath)
/// The `_id` of the `n`th car document: `car-` and `n` in eight digits.
func carID(_ n: Int) -> String {
    let digits = String(n)
    return "car-" + String(repeating: "0", count: max(0, 8 - digits.count)) + digits
}

/// N documents: the cars repeated, each with a distinct `_id`.
let documents: [Value] = (0..<documentCount).map { n in
    guard case .map(var m) = cars[n % cars.count] else { return cars[0] }
    m["_id"] = .string(carID(n))
    return .map(m)
}
let jsonRows = documents.map { JSON.string($0) }

/// The seconds `body` takes. The files written before are flushed to the disk first (`sync`), so
/// that no figure pays for the writeback of the one before.
func seconds(_ body: () throws -> Void) rethrows -> Double {
    sync()
    let start = DispatchTime.now().uptimeNanoseconds
    try body()
    return Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
}

let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("trellis-bench-\(UUID().uuidString)")
try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
defer { try? FileManager.default.removeItem(at: scratch) }
func path(_ name: String) -> String { scratch.appendingPathComponent(name).path }

// MARK: Baseline: raw SQLite batched inserts of the same JSON rows (WAL, one transaction, prepared).

/// How the baselines open SQLite: as the store does, without SQLite's own mutexes (one
/// connection, one thread), so a raw call costs what the store's costs.
let rawOpenFlags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX

/// The settings the raw baselines write with, the store's: WAL, `synchronous` NORMAL (or FULL),
/// and no checkpoint in the writer below 10,000 pages (the store checkpoints from 1,000 pages on a
/// queue of its own, StoreOptions.walCheckpointPages).
func rawWriteSettings(full: Bool = false) -> String {
    "PRAGMA journal_mode=WAL; PRAGMA synchronous=\(full ? "FULL" : "NORMAL"); PRAGMA wal_autocheckpoint=10000;"
}

/// Inserts the rows into a fresh table: in one transaction, or (`singly`) one transaction each,
/// with `synchronous` NORMAL or FULL. Returns the seconds taken.
func rawInsert(_ file: String, rows: [String], singly: Bool = false, full: Bool = false) -> Double {
    var db: OpaquePointer?
    sqlite3_open_v2(file, &db, rawOpenFlags, nil)
    defer { sqlite3_close(db) }
    sqlite3_exec(db, rawWriteSettings(full: full), nil, nil, nil)
    sqlite3_exec(db, "CREATE TABLE docs(id TEXT PRIMARY KEY, body TEXT NOT NULL) WITHOUT ROWID", nil, nil, nil)
    var stmt: OpaquePointer?
    sqlite3_prepare_v2(db, "INSERT INTO docs(id, body) VALUES (?, ?)", -1, &stmt, nil)
    defer { sqlite3_finalize(stmt) }
    // The `_id`s are made before the clock starts, as the documents Trellis is timed with are.
    let ids = rows.indices.map { carID($0) }
    return seconds {
        if !singly { sqlite3_exec(db, "BEGIN", nil, nil, nil) }
        for (id, row) in zip(ids, rows) {
            if singly { sqlite3_exec(db, "BEGIN", nil, nil, nil) }
            sqlite3_bind_text(
                stmt, 1, id, -1, unsafeBitCast(OpaquePointer(bitPattern: -1), to: sqlite3_destructor_type.self))
            sqlite3_bind_text(
                stmt, 2, row, -1, unsafeBitCast(OpaquePointer(bitPattern: -1), to: sqlite3_destructor_type.self))
            sqlite3_step(stmt)
            sqlite3_reset(stmt)
            if singly { sqlite3_exec(db, "COMMIT", nil, nil, nil) }
        }
        if !singly { sqlite3_exec(db, "COMMIT", nil, nil, nil) }
    }
}

/// Applies the whole change log of `source` into a new store at `file`, 256 documents per
/// transaction, as a peer's batches arrive. Returns the seconds taken.
func mergeSeconds(from source: DocumentStore, into file: String) throws -> Double {
    let log = try source.changes(in: "cars", after: 0, limit: .max, maxBytes: .max).records
    let remote = log.map { RemoteDocument(collection: $0.collection, id: $0.id, state: $0.state) }
    let store = try DocumentStore(path: file)
    // The WAL is checkpointed after the clock stops, so that the next figure does not pay for it.
    defer { try? store.checkpointWAL() }
    let peer: [UInt8] = Array(repeating: 1, count: 32)
    return try seconds {
        var start = 0
        while start < remote.count {
            let end = min(remote.count, start + 256)
            _ = try store.merge(
                Array(remote[start..<end]), from: peer,
                checkpoint: ("bench", Checkpoint(epoch: source.epoch, seq: Int64(end))))
            start = end
        }
    }
}

func fileSize(_ file: String) -> Double {
    var total = 0.0
    for suffix in ["", "-wal"] {
        if let attrs = try? FileManager.default.attributesOfItem(atPath: file + suffix), let n = attrs[.size] as? Int {
            total += Double(n)
        }
    }
    return total
}

var figures: [Figure] = []

if simulationOnly {
    printFigures(
        try simulationFigures(meshSizes: [16, 64, 256], seedsPerSize: 5),
        heading: "trellis-bench --simulation: simulated meshes, release build expected")
    exit(0)
}
if wireOnly {
    printFigures(
        try wireFigures(verbose: verbose),
        heading: "trellis-bench --wire: sync messages of an idle reconnect and of one-field changes, counted on the "
            + "simulator (message bytes; the encrypted link adds at most \(linkOverheadPerMessage) B per message)")
    exit(0)
}
if linksOnly {
    printFigures(
        try linkFigures(), heading: "trellis-bench --links: encrypted links over loopback, release build expected")
    exit(0)
}
if hostileOnly {
    let figures = try hostileFigures(scratch: scratch, runs: replicationRuns == 1 ? 5 : replicationRuns)
    try? FileManager.default.removeItem(at: scratch)
    printFigures(
        figures,
        heading: "trellis-bench --hostile: an honest node joins a node holding 2,000 documents, idle and while "
            + "strangers hold 100 connections to it, release build expected")
    exit(0)
}
if contactsOnly {
    printFigures(
        try contactsFigures(scratch: scratch),
        heading: "trellis-bench --contacts: 100,000 contacts enumerated, release build expected")
    exit(0)
}
if handshakesOnly {
    printFigures(
        try handshakeFigures(),
        heading: "trellis-bench --handshakes: Noise handshakes in process (no I/O), release build expected")
    exit(0)
}
if unsetFieldsOnly {
    printFigures(
        try unsetFieldFigures(scratch: scratch, cycles: documentCount),
        heading: "trellis-bench --unset-fields: one document's keys set and unset \(documentCount) times")
    exit(0)
}
if tombstonesOnly {
    printFigures(
        try tombstoneFigures(scratch: scratch, removed: documentCount)
            + unsetFieldFigures(scratch: scratch, cycles: documentCount),
        heading: "trellis-bench --tombstones: \(documentCount) documents created and removed, release build expected")
    exit(0)
}
// The baseline most store figures are divided by: three runs, each into a fresh file, and the
// median (one run of 0.2 s moved by a third between full runs, docs/BENCHMARKS.md).
let baselineTime = (0..<3).map { rawInsert(path($0 == 0 ? "raw.sqlite" : "raw-\($0).sqlite"), rows: jsonRows) }
    .sorted()[1]
let baselineRate = Double(documentCount) / baselineTime
figures.append(Figure(name: "sqlite_raw_inserts_per_s", value: baselineRate, unit: "rows/s"))
if importOnly {
    figures += try importFigures(scratch: scratch, rows: jsonRows, baseline: baselineRate)
    printFigures(figures, heading: "trellis-bench --import: \(documentCount) documents, release build expected")
    exit(0)
}
if syncCostsOnly {
    printFigures(
        try syncCostFigures(scratch: scratch, documents: documents),
        heading: "trellis-bench --sync-costs: local latency with 10 peers x 100 subscriptions, and during a "
            + "\(documentCount)-document merge, release build expected")
    exit(0)
}
if singleOnly {
    // One transaction per document: raw SQLite against Trellis upserts, each into a fresh file,
    // alternated; with --runs N, N pairs.
    let count = min(documentCount, 5_000)
    for run in 0..<replicationRuns {
        let raw =
            Double(count)
            / rawInsert(path("raw-single-\(run).sqlite"), rows: Array(jsonRows.prefix(count)), singly: true)
        let store = try DocumentStore(path: path("single-\(run).sqlite"))
        let rate =
            try Double(count)
            / seconds { for document in documents.prefix(count) { try store.upsert(document, in: "cars") } }
        figures.append(Figure(name: "sqlite_raw_single_inserts_per_s", value: raw, unit: "rows/s"))
        figures.append(
            Figure(
                name: "local_upserts_single_per_s", value: rate, unit: "docs/s", baseline: raw,
                baselineName: "sqlite_raw_single_inserts_per_s"))
    }
    printFigures(figures, heading: "trellis-bench --single: one transaction per document, \(count) documents")
    exit(0)
}
if refetchOnly {
    printFigures(
        try refetchFigures(documents: documents),
        heading: "trellis-bench --refetch: \(documentCount) evicted documents asked for again, on the simulator")
    exit(0)
}
if writesOnly {
    // Batched upserts and remote merges alone: raw batched inserts, Trellis batched upserts, and
    // the merge of their log into an empty store, each into a fresh file; with --runs N, N rounds,
    // each against its own baseline.
    for run in 0..<replicationRuns {
        let raw = Double(documentCount) / rawInsert(path("raw-writes-\(run).sqlite"), rows: jsonRows)
        let store = try DocumentStore(path: path("writes-\(run).sqlite"))
        let batched = try Double(documentCount) / seconds { try store.upsert(documents, in: "cars") }
        let merged = try Double(documentCount) / mergeSeconds(from: store, into: path("writes-merge-\(run).sqlite"))
        try store.checkpointWAL()
        let floor = try schemaFloorSeconds(from: path("writes-\(run).sqlite"), into: path("writes-floor-\(run).sqlite"))
        figures.append(Figure(name: "sqlite_raw_inserts_per_s", value: raw, unit: "rows/s"))
        figures.append(
            Figure(
                name: "sqlite_trellis_rows_inserts_per_s", value: Double(floor.rows) / floor.seconds, unit: "rows/s",
                baseline: raw, baselineName: "sqlite_raw_inserts_per_s"))
        figures.append(
            Figure(
                name: "local_upserts_batched_per_s", value: batched, unit: "docs/s", baseline: raw,
                baselineName: "sqlite_raw_inserts_per_s"))
        figures.append(
            Figure(
                name: "remote_merges_per_s", value: merged, unit: "docs/s", baseline: raw,
                baselineName: "sqlite_raw_inserts_per_s"))
    }
    printFigures(
        figures, heading: "trellis-bench --writes: batched upserts and remote merges, \(documentCount) documents")
    exit(0)
}
/// How many stored cars the one-field update figures change.
let updateCount = min(documentCount, 20_000)
if updatesOnly {
    // Local one-field updates alone: raw batched inserts and the updates of a fresh store, in
    // turns; with --runs N, N pairs, each against its own baseline; then the delta's own work.
    var rates: [Double] = []
    for run in 0..<replicationRuns {
        let raw = Double(documentCount) / rawInsert(path("raw-updates-\(run).sqlite"), rows: jsonRows)
        let rate = try oneFieldUpdateRate(
            file: path("updates-\(run).sqlite"), documents: documents, count: updateCount)
        figures.append(Figure(name: "sqlite_raw_inserts_per_s", value: raw, unit: "rows/s"))
        figures.append(
            Figure(
                name: "local_updates_one_field_batched_per_s", value: rate, unit: "docs/s", baseline: raw,
                baselineName: "sqlite_raw_inserts_per_s"))
        rates.append(rate)
    }
    // The delta's own work against the median run's updates.
    figures += try deltaFigures(documents: documents, updateRate: rates.sorted()[rates.count / 2])
    printFigures(
        figures, heading: "trellis-bench --updates: one field of \(updateCount) documents, 1,000 to a transaction")
    exit(0)
}
if findOnly {
    // The query figures alone, on a store of batched upserts; with --runs N, N rounds of them.
    let store = try DocumentStore(path: path("batched.sqlite"))
    try store.upsert(documents, in: "cars")
    for _ in 0..<replicationRuns { figures += try findFigures(store: store, raw: path("raw.sqlite")) }
    printFigures(figures, heading: "trellis-bench --find: an indexed equality, \(documentCount) documents")
    exit(0)
}
if replicationOnly {
    // With --runs N, N pairs of (raw inserts, two-node sync) alternate, and the pair with the
    // median ratio is reported: on a shared machine both halves of one pair see the same load.
    var runs = [try replicationFigure(scratch: scratch, documents: documents, baseline: baselineRate)]
    for run in 1..<replicationRuns {
        let runBaseline = Double(documentCount) / rawInsert(path("raw-\(run).sqlite"), rows: jsonRows)
        let runScratch = scratch.appendingPathComponent("run-\(run)")
        try FileManager.default.createDirectory(at: runScratch, withIntermediateDirectories: true)
        runs.append(try replicationFigure(scratch: runScratch, documents: documents, baseline: runBaseline))
    }
    // Every replication figure carries its own run's baseline.
    let ratios = runs.map { $0.ratio! }
    if replicationRuns > 1 {
        FileHandle.standardError.write(
            Data(
                ("replication ratios: " + ratios.map { String(format: "%.3f", $0) }.joined(separator: " ") + "\n").utf8)
        )
    }
    let median = runs[runs.indices.sorted { ratios[$0] < ratios[$1] }[runs.count / 2]]
    figures = [Figure(name: "sqlite_raw_inserts_per_s", value: median.baseline!, unit: "rows/s"), median]
    printFigures(
        figures,
        heading: "trellis-bench --replication: two nodes, \(documentCount) documents, release build expected")
    exit(0)
}

// MARK: Trellis local upserts, batched in one transaction.

let batchedStore = try DocumentStore(path: path("batched.sqlite"))
let batchedTime = try seconds { try batchedStore.upsert(documents, in: "cars") }
figures.append(
    Figure(
        name: "local_upserts_batched_per_s", value: Double(documentCount) / batchedTime, unit: "docs/s",
        baseline: baselineRate, baselineName: "sqlite_raw_inserts_per_s"))

// MARK: The schema floor: the rows of the batched upserts inserted again by hand (SchemaFloorBench.swift).

try batchedStore.checkpointWAL()
let schemaFloor = try schemaFloorSeconds(from: path("batched.sqlite"), into: path("floor.sqlite"))
figures.append(
    Figure(
        name: "sqlite_trellis_rows_inserts_per_s", value: Double(schemaFloor.rows) / schemaFloor.seconds,
        unit: "rows/s", baseline: baselineRate, baselineName: "sqlite_raw_inserts_per_s"))

// MARK: Trellis local upserts, one transaction each (as Ditto's upsert).

let singleCount = min(documentCount, 5_000)
let singleStore = try DocumentStore(path: path("single.sqlite"))
let singleTime = try seconds {
    for document in documents.prefix(singleCount) { try singleStore.upsert(document, in: "cars") }
}
try singleStore.checkpointWAL()
figures.append(
    Figure(
        name: "local_upserts_single_per_s", value: Double(singleCount) / singleTime, unit: "docs/s",
        baseline: baselineRate, baselineName: "sqlite_raw_inserts_per_s"))

// MARK: Durability: synchronous=FULL (an fsync per commit) against the default NORMAL.

// One transaction per document is where FULL costs: raw SQLite first, then Trellis, each against
// its NORMAL counterpart measured in this run. Fewer documents: each commit waits for the disk.
let durableCount = min(documentCount, 2_000)
let rawSingleRate =
    Double(durableCount)
    / rawInsert(path("raw-single.sqlite"), rows: Array(jsonRows.prefix(durableCount)), singly: true)
let rawSingleFullRate =
    Double(durableCount)
    / rawInsert(path("raw-single-full.sqlite"), rows: Array(jsonRows.prefix(durableCount)), singly: true, full: true)
figures.append(Figure(name: "sqlite_raw_single_inserts_per_s", value: rawSingleRate, unit: "rows/s"))
figures.append(
    Figure(
        name: "sqlite_raw_single_inserts_full_per_s", value: rawSingleFullRate, unit: "rows/s",
        baseline: rawSingleRate, baselineName: "sqlite_raw_single_inserts_per_s"))

var fullOptions = StoreOptions()
fullOptions.durability = .full
let singleNormalStore = try DocumentStore(path: path("single-normal.sqlite"))
let singleNormalRate =
    try Double(durableCount)
    / seconds { for document in documents.prefix(durableCount) { try singleNormalStore.upsert(document, in: "cars") } }
let singleFullStore = try DocumentStore(path: path("single-full.sqlite"), options: fullOptions)
let singleFullRate =
    try Double(durableCount)
    / seconds { for document in documents.prefix(durableCount) { try singleFullStore.upsert(document, in: "cars") } }
figures.append(
    Figure(
        name: "local_upserts_single_normal_per_s", value: singleNormalRate, unit: "docs/s", baseline: rawSingleRate,
        baselineName: "sqlite_raw_single_inserts_per_s"))
figures.append(
    Figure(
        name: "local_upserts_single_full_per_s", value: singleFullRate, unit: "docs/s", baseline: singleNormalRate,
        baselineName: "local_upserts_single_normal_per_s"))
let batchedFullStore = try DocumentStore(path: path("batched-full.sqlite"), options: fullOptions)
let batchedFullTime = try seconds { try batchedFullStore.upsert(documents, in: "cars") }
try batchedFullStore.checkpointWAL()
figures.append(
    Figure(
        name: "local_upserts_batched_full_per_s", value: Double(documentCount) / batchedFullTime, unit: "docs/s",
        baseline: Double(documentCount) / batchedTime, baselineName: "local_upserts_batched_per_s"))

// MARK: Remote merges: apply the batched store's log into an empty store, 256 per transaction.

let mergeTime = try mergeSeconds(from: batchedStore, into: path("merge.sqlite"))
figures.append(
    Figure(
        name: "remote_merges_per_s", value: Double(documentCount) / mergeTime, unit: "docs/s",
        baseline: baselineRate, baselineName: "sqlite_raw_inserts_per_s"))

// MARK: Local updates of one field, batched: each also keeps the delta of what it changed
// (docs/DELTAS.md). The delta's own work (compare, encode, digest) is timed apart on the same
// states, as a share of the update. A store of its own: the figures below measure the stored
// bytes and the queries of the store of the upserts, which updates would change.

let updateRate = try oneFieldUpdateRate(file: path("updates.sqlite"), documents: documents, count: updateCount)
figures.append(
    Figure(
        name: "local_updates_one_field_batched_per_s", value: updateRate, unit: "docs/s",
        baseline: baselineRate, baselineName: "sqlite_raw_inserts_per_s"))
figures += try deltaFigures(documents: documents, updateRate: updateRate)

// MARK: Storage: bytes per document against raw JSON (before `find` adds its index).

let rawJSONBytes = Double(jsonRows.reduce(0) { $0 + $1.utf8.count }) / Double(documentCount)
try? batchedStore.checkpointWAL()
figures.append(Figure(name: "raw_json_bytes_per_doc", value: rawJSONBytes, unit: "bytes"))
figures.append(
    Figure(
        name: "stored_bytes_per_doc", value: fileSize(path("batched.sqlite")) / Double(documentCount), unit: "bytes",
        baseline: rawJSONBytes, baselineName: "raw_json_bytes_per_doc"))

// MARK: Query: an equality on an indexed field, Trellis `find` against the same query by hand.

figures += try findFigures(store: batchedStore, raw: path("raw.sqlite"))

// MARK: Two nodes over encrypted loopback (ReplicationBench.swift)

figures.append(try replicationFigure(scratch: scratch, documents: documents, baseline: baselineRate))

// MARK: Import (ImportBench.swift)

figures += try importFigures(scratch: scratch, rows: jsonRows, baseline: baselineRate)

// MARK: Live queries (LiveQueryBench.swift)

figures += try liveQueryFigures(scratch: scratch)

// MARK: Links (LinkBench.swift)

figures += try linkFigures()

// MARK: Contacts (ContactsBench.swift)

figures += try contactsFigures(scratch: scratch)

// MARK: Tombstones (TombstoneBench.swift)

figures += try tombstoneFigures(scratch: scratch, removed: documentCount)

// MARK: Output

printFigures(figures)

/// Prints the figures as a table, or as JSON lines with --json.
@MainActor func printFigures(_ figures: [Figure], heading: String? = nil) {
    if jsonOutput {
        for f in figures {
            var object: UTF8Map<Value> = ["name": .string(f.name), "value": .double(f.value), "unit": .string(f.unit)]
            if let b = f.baseline, let r = f.ratio {
                object["baseline"] = .double(b)
                object["ratio"] = .double(r)
                object["baseline_name"] = .string(f.baselineName ?? "")
            }
            print(JSON.string(.map(object)))
        }
    } else {
        print(
            heading
                ?? "trellis-bench: \(documentCount) cars-shaped documents (\(cars.count) distinct cars), release build expected"
        )
        for f in figures {
            let value = String(format: "%14.3f %-10@", f.value, f.unit)
            if let r = f.ratio, let name = f.baselineName {
                print(
                    "  \(f.name.padding(toLength: 40, withPad: " ", startingAt: 0)) \(value)  ratio \(String(format: "%.3f", r)) vs \(name)"
                )
            } else {
                print("  \(f.name.padding(toLength: 40, withPad: " ", startingAt: 0)) \(value)")
            }
        }
    }
}
