// Live query figures for trellis-bench (docs/BENCHMARKS.md, "Live queries"), each with a baseline
// measured in the same run:
//   1. a write on one node to the live-query callback on another over encrypted loopback TCP
//      (p50, p99), against a raw loopback TCP round trip;
//   2. local write latency with 1,000 live queries on distinct predicates, against none;
//   3. resident memory per registered live query, against a bare store observer;
//   4. write latency and memory after 20,000 live queries were created and stopped (F12),
//      against before.
import Foundation
import Synchronization
import Trellis
import TrellisStore

/// glibc's `malloc_trim`: returns free heap pages to the system, so that an RSS delta measures
/// what was allocated since (freed memory would otherwise be reused unseen).
@_silgen_name("malloc_trim") func mallocTrim(_ pad: Int) -> Int32

/// The value at quantile `q` (0...1) of `samples`, nearest rank.
func quantile(_ samples: [Double], _ q: Double) -> Double {
    let sorted = samples.sorted()
    guard !sorted.isEmpty else { return .nan }
    let rank = Int((q * Double(sorted.count)).rounded(.up)) - 1
    return sorted[min(sorted.count - 1, max(0, rank))]
}

func nowNanos() -> UInt64 { DispatchTime.now().uptimeNanoseconds }

/// Resident set size in bytes, from /proc/self/statm (after trimming the heap).
func residentBytes() -> Double {
    _ = mallocTrim(0)
    guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return .nan }
    let fields = text.split(separator: " ")
    guard fields.count > 1, let pages = Double(fields[1]) else { return .nan }
    return pages * Double(sysconf(Int32(_SC_PAGESIZE)))
}

func readFully(_ fd: Int32, _ buffer: inout [UInt8]) -> Bool {
    var got = 0
    while got < buffer.count {
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress! + got, $0.count - got) }
        if n <= 0 { return false }
        got += n
    }
    return true
}

/// Round trips of 64 bytes over a loopback TCP connection inside this process, in milliseconds.
func loopbackRoundTrips(_ count: Int) throws -> [Double] {
    let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) }
    }
    listen(listener, 1)
    _ = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) }
    }
    let client = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(client, $0, length) }
    }
    guard connected == 0 else { throw CocoaError(.fileReadUnknown) }
    let server = accept(listener, nil, nil)
    var one: Int32 = 1
    for fd in [client, server] { setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(4)) }
    let echo = Thread {
        var buffer = [UInt8](repeating: 0, count: 64)
        while readFully(server, &buffer) {
            _ = buffer.withUnsafeBytes { write(server, $0.baseAddress, $0.count) }
        }
        close(server)
    }
    echo.start()
    var samples: [Double] = []
    var buffer = [UInt8](repeating: 7, count: 64)
    for round in 0..<(count + 50) {
        let start = nowNanos()
        _ = buffer.withUnsafeBytes { write(client, $0.baseAddress, $0.count) }
        guard readFully(client, &buffer) else { break }
        if round >= 50 { samples.append(Double(nowNanos() - start) / 1e6) }
    }
    close(client)
    close(listener)
    return samples
}

/// Figure 1: sequential writes on a sender node, each timed until the receiver's live-query
/// callback sees it, over the encrypted (Noise) loopback TCP link. Milliseconds.
func remoteLiveQueryLatencies(_ count: Int, scratch: URL) throws -> [Double] {
    let key = MeshKey.generate()
    let sender = try TrellisNode(directory: scratch.appendingPathComponent("sender"), meshKey: key)
    let receiver = try TrellisNode(directory: scratch.appendingPathComponent("receiver"), meshKey: key)
    defer {
        sender.stop()
        receiver.stop()
    }
    let port = try receiver.listen(on: .init(host: "127.0.0.1", port: 0))
    let subscription = try receiver.store.collection("probe").findAll().subscribe()
    defer { subscription.cancel() }
    sender.connect(to: .init(host: "127.0.0.1", port: port))
    let deadline = Date().addingTimeInterval(20)
    while (sender.peers.isEmpty || receiver.peers.isEmpty) && Date() < deadline { usleep(1_000) }
    guard !sender.peers.isEmpty else { throw CocoaError(.fileReadUnknown) }
    usleep(100_000)  // let the subscription reach the sender

    let expected = Atomic<Int64>(-1)
    let arrived = DispatchSemaphore(value: 0)
    let live = try receiver.store.collection("probe").findByID("p").observeLocal { doc, _ in
        if case .int(let n)? = doc?["n"], n == expected.load(ordering: .acquiring) { arrived.signal() }
    }
    defer { live.stop() }
    var samples: [Double] = []
    let probe = sender.store.collection("probe")
    for round in 0..<(count + 20) {
        expected.store(Int64(round), ordering: .releasing)
        let start = nowNanos()
        try probe.upsert(["_id": "p", "n": .int(Int64(round))])
        guard arrived.wait(timeout: .now() + 10) == .success else { throw CocoaError(.fileReadUnknown) }
        if round >= 20 { samples.append(Double(nowNanos() - start) / 1e6) }
    }
    return samples
}

/// Figure 2: per-write latency of single-document upserts, microseconds.
func localWriteLatencies(_ collection: Trellis.TrellisCollection, count: Int) throws -> [Double] {
    var samples: [Double] = []
    for round in 0..<count {
        let start = nowNanos()
        try collection.upsert(["_id": .string("w\(round % 200)"), "n": .int(Int64(round % 2_000))])
        samples.append(Double(nowNanos() - start) / 1e3)
    }
    return samples
}

func liveQueryFigures(scratch: URL) throws -> [Figure] {
    var out: [Figure] = []

    // 1. Remote write → live-query callback.
    let rtt = try loopbackRoundTrips(500)
    let remote = try remoteLiveQueryLatencies(500, scratch: scratch)
    out.append(Figure(name: "tcp_loopback_rtt_p50_ms", value: quantile(rtt, 0.5), unit: "ms"))
    out.append(Figure(name: "tcp_loopback_rtt_p99_ms", value: quantile(rtt, 0.99), unit: "ms"))
    out.append(
        Figure(
            name: "live_query_remote_p50_ms", value: quantile(remote, 0.5), unit: "ms", baseline: quantile(rtt, 0.5),
            baselineName: "tcp_loopback_rtt_p50_ms"))
    out.append(
        Figure(
            name: "live_query_remote_p99_ms", value: quantile(remote, 0.99), unit: "ms",
            baseline: quantile(rtt, 0.99), baselineName: "tcp_loopback_rtt_p99_ms"))

    // 2. Local write latency with 1,000 live queries on distinct predicates against none.
    let node = try TrellisNode(directory: scratch.appendingPathComponent("local"), meshKey: .generate())
    let writes = node.store.collection("writes")
    _ = try localWriteLatencies(writes, count: 500)  // warm up
    let bare = try localWriteLatencies(writes, count: 3_000)
    var queries: [LiveQuery] = []
    for n in 0..<1_000 {
        queries.append(try writes.find("n == \(n)").observeLocal { _, _ in })
    }
    _ = try localWriteLatencies(writes, count: 500)
    let loaded = try localWriteLatencies(writes, count: 3_000)
    for query in queries { query.stop() }
    queries.removeAll()
    out.append(Figure(name: "local_write_p50_us", value: quantile(bare, 0.5), unit: "us"))
    out.append(
        Figure(
            name: "local_write_p50_us_1000_queries", value: quantile(loaded, 0.5), unit: "us",
            baseline: quantile(bare, 0.5), baselineName: "local_write_p50_us"))
    out.append(Figure(name: "local_write_p99_us", value: quantile(bare, 0.99), unit: "us"))
    out.append(
        Figure(
            name: "local_write_p99_us_1000_queries", value: quantile(loaded, 0.99), unit: "us",
            baseline: quantile(bare, 0.99), baselineName: "local_write_p99_us"))
    let bareMean = bare.reduce(0, +) / Double(bare.count)
    let loadedMean = loaded.reduce(0, +) / Double(loaded.count)
    out.append(Figure(name: "local_write_mean_us", value: bareMean, unit: "us"))
    out.append(
        Figure(
            name: "local_write_mean_us_1000_queries", value: loadedMean, unit: "us", baseline: bareMean,
            baselineName: "local_write_mean_us"))

    // 3. Memory per registered live query (1,000 on distinct predicates, each matching one
    // document) against a bare store observer closure.
    let memory = node.store.collection("memory")
    try memory.upsert((0..<1_000).map { ["_id": .string("m\($0)"), "n": .int(Int64($0))] })
    var tokens: [UInt64] = []
    let beforeObservers = residentBytes()
    for _ in 0..<1_000 { tokens.append(node.store.documents.addObserver { _ in }) }
    let perObserver = (residentBytes() - beforeObservers) / 1_000
    for token in tokens { node.store.documents.removeObserver(token) }
    let delivered = Atomic<Int>(0)
    let beforeQueries = residentBytes()
    for n in 0..<1_000 {
        queries.append(try memory.find("n == \(n)").observeLocal { _, _ in delivered.add(1, ordering: .relaxed) })
    }
    while delivered.load(ordering: .relaxed) < 1_000 { usleep(1_000) }
    let perQuery = (residentBytes() - beforeQueries) / 1_000
    out.append(Figure(name: "store_observer_rss_bytes", value: perObserver, unit: "bytes"))
    out.append(
        Figure(
            name: "live_query_rss_bytes", value: perQuery, unit: "bytes", baseline: perObserver,
            baselineName: "store_observer_rss_bytes"))
    for query in queries { query.stop() }
    queries.removeAll()

    // 4. F12: after 20,000 live queries were created and stopped (10,000 argument changes of one
    // query, 10,000 short-lived ones dropped at once), write latency and memory against before.
    _ = try localWriteLatencies(writes, count: 500)
    let beforeChurn = try localWriteLatencies(writes, count: 3_000)
    let rssBeforeChurn = residentBytes()
    var changing: LiveQuery?
    for n in 0..<10_000 {
        changing?.stop()
        changing = try memory.find("n == $args.n", args: ["n": .int(Int64(n % 1_000))]).observeLocal { _, _ in }
    }
    changing = nil
    for n in 0..<10_000 { _ = try memory.find("n == \(n % 1_000)").observeLocal { _, _ in } }
    // Initial callbacks still queued hold their observation until they run (and are skipped).
    LiveQuery.defaultDeliveryQueue.sync {}
    let churnGrowth = (residentBytes() - rssBeforeChurn) / 20_000
    precondition(node.store.liveQueryCount == 0, "live queries leaked: \(node.store.liveQueryCount)")
    let afterChurn = try localWriteLatencies(writes, count: 3_000)
    out.append(Figure(name: "local_write_p50_us_before_churn", value: quantile(beforeChurn, 0.5), unit: "us"))
    out.append(
        Figure(
            name: "local_write_p50_us_after_churn", value: quantile(afterChurn, 0.5), unit: "us",
            baseline: quantile(beforeChurn, 0.5), baselineName: "local_write_p50_us_before_churn"))
    out.append(
        Figure(
            name: "rss_growth_bytes_per_stopped_query", value: churnGrowth, unit: "bytes", baseline: perQuery,
            baselineName: "live_query_rss_bytes"))
    node.stop()
    return out
}
