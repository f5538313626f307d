import Foundation
import Synchronization
import Trellis
import TrellisCore
import TrellisNet

// Honest join under hostile connections: how long a fresh node takes to connect to a node and
// receive all its documents, with no attack and while strangers hold 100 TCP connections open
// to it (from 100 loopback addresses, each reopened as soon as the node cuts it, none sending a
// byte). Idle and attacked joins alternate; the medians are reported.

/// Strangers holding TCP connections to a port, each reopened as soon as it is cut.
private final class Strangers: @unchecked Sendable {
    private final class Flags: Sendable {
        let stop = Atomic<Bool>(false)
        let connects = Atomic<Int>(0)
    }
    private let flags = Flags()
    private var thread: Thread?

    /// Opens `count` connections to 127.0.0.1:`port`, the i-th from 127.0.0.(2 + i).
    init(port: UInt16, count: Int) {
        let flags = self.flags
        let thread = Thread {
            func open(_ index: Int) -> Int32 {
                let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
                var local = sockaddr_in()
                local.sin_family = sa_family_t(AF_INET)
                local.sin_addr.s_addr = inet_addr("127.0.0.\(2 + index % 250)")
                var remote = sockaddr_in()
                remote.sin_family = sa_family_t(AF_INET)
                remote.sin_port = port.bigEndian
                remote.sin_addr.s_addr = inet_addr("127.0.0.1")
                _ = withUnsafePointer(to: &local) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                    }
                }
                _ = withUnsafePointer(to: &remote) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                    }
                }
                flags.connects.add(1, ordering: .relaxed)
                return fd
            }
            var polls = (0..<count).map { pollfd(fd: open($0), events: Int16(POLLIN), revents: 0) }
            var scratch = [UInt8](repeating: 0, count: 64)
            while !flags.stop.load(ordering: .relaxed) {
                _ = poll(&polls, nfds_t(polls.count), 20)
                for index in polls.indices where polls[index].revents != 0 {
                    // Readable with no data (or an error): the node cut it. Open it again.
                    if recv(polls[index].fd, &scratch, scratch.count, Int32(MSG_DONTWAIT)) <= 0 {
                        close(polls[index].fd)
                        polls[index].fd = open(index)
                    }
                    polls[index].revents = 0
                }
            }
            for entry in polls { close(entry.fd) }
        }
        self.thread = thread
        thread.start()
    }

    /// Connects made so far.
    var connectCount: Int { flags.connects.load(ordering: .relaxed) }

    func stop() {
        flags.stop.store(true, ordering: .relaxed)
        while thread?.isFinished == false { usleep(1_000) }
    }
}

func hostileFigures(scratch: URL, documents: Int = 2_000, connections: Int = 100, runs: Int = 5) throws -> [Figure] {
    let meshKey = MeshKey.generate()
    let served = try TrellisNode(directory: scratch.appendingPathComponent("hostile-a"), meshKey: meshKey)
    defer { served.close() }
    let rows: [Value] = (0..<documents).map { ["_id": .string("car-\($0)"), "n": .int(Int64($0)), "name": "a car"] }
    _ = try served.store.documents.upsert(rows, in: "cars", writeStrategy: .merge)
    let port = try served.listen(on: Endpoint(host: "127.0.0.1", port: 0))

    var round = 0
    /// Seconds from a fresh node's connect to its holding every document.
    func join() throws -> Double {
        round += 1
        let directory = scratch.appendingPathComponent("hostile-b-\(round)")
        let honest = try TrellisNode(directory: directory, meshKey: meshKey)
        defer {
            honest.close()
            try? FileManager.default.removeItem(at: directory)
        }
        let subscription = try honest.store.collection("cars").findAll().subscribe()
        defer { subscription.cancel() }
        let start = ContinuousClock.now
        honest.connect(to: Endpoint(host: "127.0.0.1", port: port))
        while try honest.store.documents.count(in: "cars") < documents {
            guard ContinuousClock.now - start < .seconds(120) else {
                throw CocoaError(.executableLoad, userInfo: [NSLocalizedDescriptionKey: "no honest join within 120 s"])
            }
            usleep(1_000)
        }
        let elapsed = ContinuousClock.now - start
        return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    }
    var idle: [Double] = []
    var attacked: [Double] = []
    var connects = 0
    for _ in 0..<runs {
        idle.append(try join())
        let strangers = Strangers(port: port, count: connections)
        usleep(200_000)  // every connection open and churning before the honest node dials
        defer { strangers.stop() }
        attacked.append(try join())
        connects += strangers.connectCount
    }
    func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }
    print(
        "honest join, \(runs) alternated runs: idle \(idle.map { String(format: "%.3f", $0) }) s, "
            + "with \(connections) hostile connections \(attacked.map { String(format: "%.3f", $0) }) s "
            + "(\(connects) stranger connects)")
    return [
        Figure(
            name: "honest_join_with_\(connections)_hostile_connections_s", value: median(attacked), unit: "s",
            baseline: median(idle), baselineName: "honest_join_idle_s")
    ]
}
