import Foundation
import Trellis
import TrellisCore

// Replication figure: two nodes over Noise-encrypted loopback TCP, a whole collection pulled by
// an empty node, against raw batched SQLite inserts of the same JSON measured in the same run.

/// Documents per second for node B to pull `documents` from node A: from B's connect until B's
/// sync status says the initial sync is complete and B holds every document.
func replicationFigure(scratch: URL, documents: [Value], baseline: Double) throws -> Figure {
    let (a, b) = try nodePair(scratch: scratch, prefix: "repl", documents: documents)
    defer {
        a.close()
        b.close()
    }
    let port = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
    let subscription = try b.store.collection("cars").findAll().subscribe()
    defer { subscription.cancel() }
    let cpuBefore = processCPUSeconds()
    let started = Date()
    b.connect(to: Endpoint(host: "127.0.0.1", port: port))
    while true {
        let status = b.sync.status
        if status.isInitialSyncComplete, !status.peers.isEmpty,
            try b.store.documents.count(in: "cars") == documents.count
        {
            break
        }
        guard Date().timeIntervalSince(started) < 600 else {
            throw CocoaError(.executableLoad, userInfo: [NSLocalizedDescriptionKey: "replication did not finish"])
        }
        usleep(2_000)
    }
    let elapsed = Date().timeIntervalSince(started)
    let cpu = processCPUSeconds() - cpuBefore
    FileHandle.standardError.write(Data("replication: \(elapsed) s wall, \(cpu) s CPU, \(cpu / elapsed) cores\n".utf8))
    return Figure(
        name: "two_node_replication_per_s", value: Double(documents.count) / elapsed, unit: "docs/s",
        baseline: baseline, baselineName: "sqlite_raw_inserts_per_s")
}

/// Two nodes under one new mesh key, in `scratch/PREFIX-a` and `scratch/PREFIX-b`, the first
/// holding `documents` in `cars`. The caller closes them.
func nodePair(scratch: URL, prefix: String, documents: [Value]) throws -> (TrellisNode, TrellisNode) {
    let key = MeshKey.generate()
    let a = try TrellisNode(directory: scratch.appendingPathComponent("\(prefix)-a"), meshKey: key)
    let b = try TrellisNode(directory: scratch.appendingPathComponent("\(prefix)-b"), meshKey: key)
    _ = try a.store.collection("cars").upsert(documents)
    return (a, b)
}

/// User plus system CPU time of this process so far, in seconds.
func processCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    func seconds(_ t: timeval) -> Double { Double(t.tv_sec) + Double(t.tv_usec) / 1e6 }
    return seconds(usage.ru_utime) + seconds(usage.ru_stime)
}
