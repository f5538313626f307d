import Foundation
import Synchronization
import Trellis
import TrellisCore

// What serving peers costs local work: a node's single-write latency while 10 peers hold 100
// subscriptions each on the collection written, against the same node with no peers; and local
// write and read latency while the node merges a 100,000-document first sync, against idle.
// Latencies are wall time per call, in process, reported as p50 and p99.

/// Milliseconds per call of `body`, `count` calls, sorted.
private func latencies(_ count: Int, _ body: (Int) throws -> Void) rethrows -> [Double] {
    var samples: [Double] = []
    samples.reserveCapacity(count)
    for n in 0..<count {
        let start = DispatchTime.now().uptimeNanoseconds
        try body(n)
        samples.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6)
    }
    return samples.sorted()
}

/// The calling thread's scheduler times so far, in milliseconds (Linux `/proc/thread-self/schedstat`):
/// time on a core, and time runnable but waiting for one.
private func threadSchedulerTimes() -> (running: Double, waiting: Double) {
    let fd = open("/proc/thread-self/schedstat", O_RDONLY)
    guard fd >= 0 else { return (0, 0) }
    defer { close(fd) }
    var buffer = [UInt8](repeating: 0, count: 96)
    let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, 96) }
    guard count > 0 else { return (0, 0) }
    let fields = String(decoding: buffer.prefix(count), as: UTF8.self).split(separator: " ")
    guard fields.count >= 2, let running = Double(fields[0]), let waiting = Double(fields[1]) else { return (0, 0) }
    return (running / 1e6, waiting / 1e6)
}

/// One call of `body`, in milliseconds: its wall time, and of it the time the thread spent on a
/// core and runnable waiting for one.
private struct TimedCall {
    var wall: Double
    var running: Double
    var waiting: Double

    init(_ body: () throws -> Void) rethrows {
        let before = threadSchedulerTimes()
        let start = DispatchTime.now().uptimeNanoseconds
        try body()
        wall = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6
        let after = threadSchedulerTimes()
        running = after.running - before.running
        waiting = after.waiting - before.waiting
    }
}

/// Where the slowest 1 % of `calls` spent their time, in milliseconds on average: on a core,
/// runnable but waiting for one, and neither (blocked: a lock, I/O).
private func tail(of calls: [TimedCall]) -> (running: Double, waiting: Double, blocked: Double) {
    let slowest = calls.sorted { $0.wall < $1.wall }.suffix(max(1, calls.count / 100))
    let n = Double(slowest.count)
    let running = slowest.map(\.running).reduce(0, +) / n
    let waiting = slowest.map(\.waiting).reduce(0, +) / n
    let wall = slowest.map(\.wall).reduce(0, +) / n
    return (running, waiting, max(0, wall - running - waiting))
}

/// A tail's breakdown (``tail(of:)``) as text.
private func describe(_ t: (running: Double, waiting: Double, blocked: Double)) -> String {
    String(format: "%.3f ms on a core, %.3f ms waiting for one, %.3f ms blocked", t.running, t.waiting, t.blocked)
}

private func percentile(_ sorted: [Double], _ p: Double) -> Double {
    sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
}

/// The `p` percentile of sorted `samples` against that of sorted `baseline` (milliseconds).
private func latencyFigure(_ name: String, _ samples: [Double], _ p: Double, baseline: [Double], _ baselineName: String)
    -> Figure
{
    Figure(
        name: name, value: percentile(samples, p), unit: "ms", baseline: percentile(baseline, p),
        baselineName: baselineName)
}

/// Waits until `condition` holds, for at most `seconds`.
private func wait(_ what: String, seconds: Double = 600, _ condition: () throws -> Bool) throws {
    let deadline = Date().addingTimeInterval(seconds)
    while try !condition() {
        guard Date() < deadline else {
            throw CocoaError(.executableLoad, userInfo: [NSLocalizedDescriptionKey: "\(what) did not happen"])
        }
        usleep(2_000)
    }
}

func syncCostFigures(scratch: URL, documents: [Value]) throws -> [Figure] {
    try writeLatencyWithPeers(scratch: scratch) + latencyDuringMerge(scratch: scratch, documents: documents)
}

/// Single upserts (one transaction each) on a node, with no peers and then while 10 peers each
/// hold 100 subscriptions on the collection (queries `n == K`, each matching one document, so
/// every write reaches the subscriptions whose K it matches and wakes the scans of all).
private func writeLatencyWithPeers(scratch: URL, writes: Int = 2_000) throws -> [Figure] {
    let key = MeshKey.generate()
    let node = try TrellisNode(directory: scratch.appendingPathComponent("cost-a"), meshKey: key)
    defer { node.close() }
    let items = node.store.collection("items")
    func write(_ round: Int) -> (Int) throws -> Void {
        { n in
            _ = try items.upsert([
                "_id": .string("w\(n % 500)"), "n": .int(Int64(n % 1_000)), "round": .int(Int64(round)),
            ])
        }
    }
    _ = try latencies(500, write(0))  // warm up: the documents exist, statements are prepared
    let idleCalls = try (0..<writes).map { n in try TimedCall { try write(1)(n) } }
    let idle = idleCalls.map(\.wall).sorted()
    // The same writes while two threads only burn CPU (no store, no lock): what the scheduler of
    // this machine's two cores alone adds to a write, when the peers' work (which runs in this
    // process) keeps both cores busy.
    let busy = try besideTwoSpinningThreads {
        try (0..<writes).map { n in try TimedCall { try write(1)(n) }.wall }.sorted()
    }

    let port = try node.listen(on: Endpoint(host: "127.0.0.1", port: 0))
    var peers: [TrellisNode] = []
    var subscriptions: [Subscription] = []
    defer {
        for subscription in subscriptions { subscription.cancel() }
        for peer in peers { peer.close() }
    }
    for p in 0..<10 {
        let peer = try TrellisNode(directory: scratch.appendingPathComponent("cost-peer-\(p)"), meshKey: key)
        peers.append(peer)
        for s in 0..<100 {
            subscriptions.append(try peer.store.collection("items").find("n == \(p * 100 + s)").subscribe())
        }
        peer.connect(to: Endpoint(host: "127.0.0.1", port: port))
    }
    try wait("10 peers with 100 subscriptions each") {
        node.peers.count == 10 && node.peers.allSatisfy { $0.description.contains("serving 100 subscription") }
    }
    try wait("the peers' initial syncs") { peers.allSatisfy { $0.sync.status.isInitialSyncComplete } }
    let servedCalls = try (0..<writes).map { n in try TimedCall { try write(2)(n) } }
    let served = servedCalls.map(\.wall).sorted()
    FileHandle.standardError.write(
        Data(
            ("write latency: idle p50 \(percentile(idle, 0.5)) ms p99 \(percentile(idle, 0.99)) ms; "
                + "beside two spinning threads p50 \(percentile(busy, 0.5)) ms p99 \(percentile(busy, 0.99)) ms; "
                + "10 peers x 100 subscriptions p50 \(percentile(served, 0.5)) ms p99 \(percentile(served, 0.99)) ms"
                + "\n  slowest 1 %: idle \(describe(tail(of: idleCalls))); with peers \(describe(tail(of: servedCalls)))\n")
                .utf8))
    return [
        latencyFigure(
            "write_latency_p50_10_peers_x_100_subs_ms", served, 0.5, baseline: idle, "write_latency_p50_no_peers_ms"),
        latencyFigure(
            "write_latency_p99_10_peers_x_100_subs_ms", served, 0.99, baseline: idle, "write_latency_p99_no_peers_ms"),
        latencyFigure(
            "write_latency_p99_10_peers_x_100_subs_against_spinning_ms", served, 0.99, baseline: busy,
            "write_latency_p99_no_peers_beside_two_spinning_threads_ms"),
    ]
}

/// Runs `body` while two threads only burn CPU (no store, no lock), and stops them after.
private func besideTwoSpinningThreads<R>(_ body: () throws -> R) rethrows -> R {
    let spinning = Atomic<Bool>(true)
    let stopped = DispatchGroup()
    for _ in 0..<2 {
        stopped.enter()
        Thread {
            var x: UInt64 = 1
            while spinning.load(ordering: .relaxed) { x = x &* 6_364_136_223_846_793_005 &+ 1 }
            if x == 0 { print(x) }
            stopped.leave()
        }.start()
    }
    defer {
        spinning.store(false, ordering: .relaxed)
        stopped.wait()
    }
    return try body()
}

/// Local single upserts (another collection) and `findByID` reads on node B while B merges a
/// first sync of `documents` from node A (`merges` times, each to a new B), against the same
/// operations on the first B before its sync.
private func latencyDuringMerge(scratch: URL, documents: [Value], merges: Int = 3) throws -> [Figure] {
    let key = MeshKey.generate()
    let a = try TrellisNode(directory: scratch.appendingPathComponent("merge-a"), meshKey: key)
    defer { a.close() }
    _ = try a.store.collection("cars").upsert(documents)
    let port = try a.listen(on: Endpoint(host: "127.0.0.1", port: 0))
    /// A receiving node, its `notes` holding 100 documents that the operations measured touch.
    func receiver(_ round: Int) throws -> TrellisNode {
        let b = try TrellisNode(directory: scratch.appendingPathComponent("merge-b\(round)"), meshKey: key)
        let notes = b.store.collection("notes")
        for n in 0..<100 { _ = try notes.upsert(["_id": .string("n\(n)"), "v": .int(Int64(n))]) }
        return b
    }
    func write(_ b: TrellisNode, _ n: Int) throws {
        _ = try b.store.collection("notes").upsert(["_id": .string("n\(n % 100)"), "v": .int(Int64(n))])
    }
    func read(_ b: TrellisNode, _ n: Int) throws {
        _ = try b.store.collection("notes").findByID(.string("n\(n % 100)")).exec()
    }
    let first = try receiver(0)
    // Idle: the same mix, interleaved.
    var idleWrites: [Double] = []
    var idleReads: [Double] = []
    for n in 0..<2_000 {
        // Timed as the writes during the merge are (with the scheduler's times read around each).
        idleWrites.append(try TimedCall { try write(first, n) }.wall)
        idleReads += try latencies(1) { _ in try read(first, n) }
    }
    // Busy: the same mix, paced as during the merge, while two threads only burn CPU (no store,
    // no lock): what the scheduler of this machine's two cores alone adds to a write or a read.
    var busyWrites: [Double] = []
    var busyReads: [Double] = []
    try besideTwoSpinningThreads {
        for n in 0..<1_500 {
            busyWrites.append(try TimedCall { try write(first, n) }.wall)
            busyReads += try latencies(1) { _ in try read(first, n) }
            usleep(500)
        }
    }
    // During the merge: `merges` first syncs, each to a new receiver, so that the p99s rest on a
    // few hundred samples (one merge of 100,000 documents gives about 150).
    var mergeWrites: [Double] = []
    var mergeReads: [Double] = []
    var mergeWriteCalls: [TimedCall] = []
    for round in 0..<merges {
        let b = round == 0 ? first : try receiver(round)
        defer { b.close() }
        let subscription = try b.store.collection("cars").findAll().subscribe()
        defer { subscription.cancel() }
        b.connect(to: Endpoint(host: "127.0.0.1", port: port))
        try wait("the first batch") { try b.store.documents.count(in: "cars") > 0 }
        var n = 0
        while try b.store.documents.count(in: "cars") < documents.count * 9 / 10 {
            let call = try TimedCall { try write(b, n) }
            mergeWriteCalls.append(call)
            mergeWrites.append(call.wall)
            mergeReads += try latencies(1) { _ in try read(b, n) }
            n += 1
            usleep(500)
        }
        try wait("the whole sync") { try b.store.documents.count(in: "cars") == documents.count }
    }
    idleWrites.sort()
    idleReads.sort()
    busyWrites.sort()
    busyReads.sort()
    mergeWrites.sort()
    mergeReads.sort()
    FileHandle.standardError.write(
        Data(
            ("during the merge (\(mergeWrites.count) samples): write p50 \(percentile(mergeWrites, 0.5)) ms p99 "
                + "\(percentile(mergeWrites, 0.99)) ms (idle p50 \(percentile(idleWrites, 0.5)) p99 "
                + "\(percentile(idleWrites, 0.99)); beside two spinning threads p50 \(percentile(busyWrites, 0.5)) p99 "
                + "\(percentile(busyWrites, 0.99))), read p99 \(percentile(mergeReads, 0.99)) ms "
                + "(idle \(percentile(idleReads, 0.99)); beside two spinning threads "
                + "\(percentile(busyReads, 0.99)))\n  slowest 1 % of the writes during the merge: "
                + "\(describe(tail(of: mergeWriteCalls)))\n").utf8))
    return [
        latencyFigure(
            "write_latency_p99_during_merge_ms", mergeWrites, 0.99, baseline: idleWrites, "write_latency_p99_idle_ms"),
        latencyFigure(
            "write_latency_p99_during_merge_against_spinning_ms", mergeWrites, 0.99, baseline: busyWrites,
            "write_latency_p99_beside_two_spinning_threads_ms"),
        latencyFigure(
            "read_latency_p99_during_merge_ms", mergeReads, 0.99, baseline: idleReads, "read_latency_p99_idle_ms"),
        latencyFigure(
            "read_latency_p99_during_merge_against_spinning_ms", mergeReads, 0.99, baseline: busyReads,
            "read_latency_p99_beside_two_spinning_threads_ms"),
    ]
}
