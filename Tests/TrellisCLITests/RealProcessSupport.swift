import Foundation
import Testing
import TrellisCore
import TrellisStore
import TrellisTestKit

/// Documents for the real-process tests: `doc-0000` … with bodies of varied sizes, and a `round`
/// field that tells which import wrote them.
struct Workload {
    /// How big the bodies are.
    enum Sizes {
        /// 75 % of 20–300 bytes, 22 % of 500–3,000 bytes, 3 % of 8–24 KB (about 1 KB on average).
        case varied
        /// 75 % of 20–300 bytes, the others of 300–1,000 bytes (about 300 bytes on average).
        case small
    }

    /// Each document's body (the part every round shares).
    let bodies: [String]

    /// `count` documents whose body sizes are drawn from `rng`.
    init(count: Int, sizes: Sizes = .varied, using rng: inout SeededRandom) {
        let alphabet = Array("abcdefghijklmnopqrstuvwxyz0123456789".utf8)
        bodies = (0..<count).map { index in
            let roll = rng.next() % 100
            let size: UInt64
            switch (sizes, roll) {
            case (_, 0..<75): size = 20 + rng.next() % 280
            case (.small, _): size = 300 + rng.next() % 700
            case (.varied, 75..<97): size = 500 + rng.next() % 2_500
            case (.varied, _): size = 8_000 + rng.next() % 16_000
            }
            return String(
                decoding: (0..<Int(size)).map { alphabet[($0 &* 7 &+ index) % alphabet.count] }, as: UTF8.self)
        }
    }

    /// The JSON lines of one import.
    func lines(round: Int) -> [String] {
        bodies.enumerated().map { index, body in
            #"{"_id":"\#(Self.id(index))","n":\#(index),"round":\#(round),"tags":[\#(index % 7),\#(index % 11)],"body":"\#(body)"}"#
        }
    }

    /// The `round` of a document's JSON text, `nil` when it has none.
    static func round(of json: String?) -> Int? {
        guard let json, let range = json.range(of: #""round":"#) else { return nil }
        return Int(json[range.upperBound...].prefix { $0.isNumber })
    }

    static func id(_ index: Int) -> String { String(format: "doc-%04d", index) }

    /// Writes the lines of one import to `path`.
    func write(round: Int, to path: String) throws {
        try lines(round: round).joined(separator: "\n").write(toFile: path, atomically: true, encoding: .utf8)
    }
}

/// What a store holds, read from outside the process that owns it (read-only; also while it runs).
struct StoreSnapshot {
    /// Every row of the collection by `_id` key: its `seq` and materialised JSON text.
    var rows: [String: (seq: Int64, value: String?)] = [:]
    /// The highest `seq` issued (the log's extent, ``DocumentStore/lastSeq``).
    var lastSeq: Int64 = 0
    /// The log's epoch.
    var epoch: [UInt8] = []
    /// The checkpoints held on the given peer's log, by subscription key.
    var checkpoints: [UTF8Key: Checkpoint] = [:]
    /// Remote documents kept to retry.
    var deferred: [DeferredDocument] = []

    static let empty = StoreSnapshot()

    /// Reads the store in `data` (`DIR/store.sqlite`), collection `items`. While a node writes
    /// it, the checkpoints are read first and the log's extent last, so the rows cover what the
    /// checkpoints cover and `lastSeq` covers every row.
    ///
    /// - Parameter peer: whose checkpoints to read.
    init(_ data: String, peer: [UInt8]? = nil) throws {
        let path = data + "/store.sqlite"
        guard FileManager.default.fileExists(atPath: path), let store = try Self.open(path) else { return }
        defer { store.close() }
        epoch = store.epoch
        if let peer { checkpoints = try store.checkpoints(peer: peer) }
        deferred = try store.deferredDocuments()
        for row in try SQLiteFile.query(path, "SELECT id, seq, value FROM documents WHERE collection = 'items'") {
            rows[row[0] ?? ""] = (Int64(row[1] ?? "") ?? -1, row[2])
        }
        lastSeq = store.lastSeq
    }

    private init() {}

    /// The store at `path`, opened read-only; `nil` for a store killed while it was first set up,
    /// before its first transaction committed (no site ID yet, no documents: the next writable
    /// open sets it up).
    static func open(_ path: String) throws -> DocumentStore? {
        var options = StoreOptions()
        options.readOnly = true
        options.log = { _ in }
        do {
            return try DocumentStore(path: path, options: options)
        } catch {
            guard "\(error)".hasSuffix("(no site ID)") else { throw error }
            let tables = try SQLiteFile.query(path, "SELECT name FROM sqlite_master WHERE name = 'documents'")
            if !tables.isEmpty, try !SQLiteFile.query(path, "SELECT 1 FROM documents LIMIT 1").isEmpty {
                throw ProcessError("\(path) holds documents but no site ID")
            }
            return nil
        }
    }

    /// The number of live documents in `data`'s `items` (0 before the store exists).
    static func count(_ data: String) -> Int {
        let rows = try? SQLiteFile.query(
            data + "/store.sqlite", "SELECT count(*) FROM documents WHERE collection = 'items' AND deleted = 0")
        return rows.flatMap { Int($0.first?.first.flatMap { $0 } ?? "") } ?? 0
    }

    /// The only checkpoint (the tests subscribe once), if any.
    var checkpoint: Checkpoint? { checkpoints.values.first }
}

/// Checks shared by the real-process tests.
enum Consistency {
    /// Faults of a receiver's store against the source's documents and its own earlier snapshot:
    /// a row the source never had or with another value; a row of `earlier` gone or written again
    /// (a new `seq`: a batch applied twice); two rows with one `seq`; the log's extent or the
    /// checkpoint moving back; a checkpoint on another epoch than the source's, or covering a
    /// source document the receiver does not hold (skipped, never to come).
    static func faults(_ now: StoreSnapshot, source: StoreSnapshot, earlier: StoreSnapshot) -> [String] {
        var faults: [String] = []
        let foreign = now.rows.filter { key, row in source.rows[key]?.value != row.value }.keys.sorted()
        if !foreign.isEmpty { faults.append("rows not as the source holds them: \(foreign.prefix(5))") }
        let rewritten = earlier.rows.filter { key, row in now.rows[key]?.seq != row.seq }.keys.sorted()
        if !rewritten.isEmpty {
            faults.append(
                "rows lost or applied again (new seq): "
                    + rewritten.prefix(5).map { "\($0) \(earlier.rows[$0]!.seq) -> \(now.rows[$0]?.seq ?? -1)" }
                    .joined(separator: ", "))
        }
        if Set(now.rows.values.map(\.seq)).count != now.rows.count { faults.append("two rows share a seq") }
        if let top = now.rows.values.map(\.seq).max(), top > now.lastSeq {
            faults.append("a row has seq \(top) above the log's extent \(now.lastSeq)")
        }
        if now.lastSeq < earlier.lastSeq { faults.append("lastSeq went back: \(earlier.lastSeq) -> \(now.lastSeq)") }
        if let before = earlier.checkpoint {
            guard let after = now.checkpoint else { return faults + ["the checkpoint disappeared"] }
            if after.epoch == before.epoch, after.seq < before.seq {
                faults.append("the checkpoint went back: \(before.seq) -> \(after.seq)")
            }
        }
        if let checkpoint = now.checkpoint {
            if checkpoint.epoch != source.epoch {
                faults.append("the checkpoint is on another epoch than the source's")
            }
            let skipped = source.rows.filter { key, row in row.seq <= checkpoint.seq && now.rows[key] == nil }
            if !skipped.isEmpty {
                faults.append(
                    "the checkpoint (seq \(checkpoint.seq)) covers \(skipped.count) documents never received: "
                        + "\(skipped.keys.sorted().prefix(5))")
            }
        }
        return faults
    }
}

/// Writes a new mesh key in `dir` and returns its path.
func makeMeshKey(in dir: TemporaryDirectory, _ name: String = "mesh.key") throws -> String {
    let path = dir.path(name)
    let result = try TrellisProcess.run(["keygen", path])
    guard result.status == 0 else { throw ProcessError("keygen: \(result.stderr)") }
    return path
}

/// Imports the lines of `workload` (round `round`) into `data` with `trellis import`.
func importWorkload(_ workload: Workload, round: Int, into data: String, file: String) throws {
    try workload.write(round: round, to: file)
    let result = try TrellisProcess.run(["import", "--data", data, "items", file], timeout: 120)
    guard result.status == 0 else { throw ProcessError("import into \(data): \(result.stderr)") }
}

/// The generator of a randomised test: seeded from `TRELLIS_SEED` when set, else at random; the
/// seed is printed with the way to replay it.
func seededRandom(_ test: String) -> SeededRandom {
    let (rng, seed) = SeededRandom.fromEnvironment(default: .random(in: .min ... .max))
    print("\(test): seed \(seed) (replay with TRELLIS_SEED=\(seed))")
    return rng
}

/// Milliseconds since `start`.
func millis(since start: Date) -> Int { Int(Date().timeIntervalSince(start) * 1000) }

extension TrellisProcess {
    /// Sends a shell command and returns what it printed, or `nil` when no answer came within
    /// `timeout` seconds. The end of the answer is marked by a `get` of a document that does not
    /// exist (it prints `null`).
    func ask(_ command: String, timeout: Double = 10) -> String? {
        let before = stdout.utf8.count
        send(command)
        send(#"get items "end-of-answer""#)
        guard eventually(timeout: timeout, { stdout.utf8.count > before && stdout.hasSuffix("null\n") }) else {
            return nil
        }
        let answer = String(decoding: stdout.utf8.dropFirst(before), as: UTF8.self)
        return String(answer.dropLast("null\n".count))
    }
}

/// The number of documents in `collection` of a data directory, by `trellis find --count` (which
/// works beside a running node), or `nil` when it fails.
func findCount(_ data: String, _ collection: String) -> Int? {
    guard let r = try? TrellisProcess.run(["find", "--data", data, collection, "--count"]), r.status == 0 else {
        return nil
    }
    return Int(r.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
}
