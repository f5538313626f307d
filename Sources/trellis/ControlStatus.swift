import Foundation
import Synchronization
import Trellis
import TrellisCore

/// When each peer's session was first seen, and when a peer that left was last seen, for
/// `trellis status`: the node looks at its peers every 250 ms (and at each status request), so
/// the times are right to within that.
final class PeerTimes: @unchecked Sendable {
    // Unchecked: `timer` is set once and only cancelled after (a dispatch source is thread-safe);
    // the rest is in the mutex.
    private struct State {
        var connected: [[UInt8]: Date] = [:]
        var gone: [[UInt8]: Date] = [:]
    }
    /// The most peers remembered as gone (the oldest are forgotten first).
    static let maxGone = 64

    private let state = Mutex(State())
    private let timer: any DispatchSourceTimer

    /// Starts looking at `node`'s peers.
    init(node: TrellisNode) {
        timer = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "trellis.control.peer-times"))
        timer.schedule(deadline: .now(), repeating: .milliseconds(250))
        timer.setEventHandler { [weak self, weak node] in
            guard let self, let node else { return }
            self.update(connected: Set(node.peers.map(\.peerKey)))
        }
        timer.resume()
    }

    func stop() { timer.cancel() }

    /// Notes the peers connected now: new ones get this time as their start, those missing
    /// from `keys` are gone as of now.
    func update(connected keys: Set<[UInt8]>, now: Date = Date()) {
        state.withLock { s in
            for key in keys where s.connected[key] == nil {
                s.connected[key] = now
                s.gone[key] = nil
            }
            for key in s.connected.keys where !keys.contains(key) {
                s.connected[key] = nil
                s.gone[key] = now
            }
            if s.gone.count > Self.maxGone {
                for (key, _) in s.gone.sorted(by: { $0.value < $1.value }).prefix(s.gone.count - Self.maxGone) {
                    s.gone[key] = nil
                }
            }
        }
    }

    /// Connected peers with the time their session was first seen, and peers gone with the time
    /// they were last seen, each in time order.
    func snapshot() -> (connected: [([UInt8], Date)], gone: [([UInt8], Date)]) {
        state.withLock { s in
            (
                s.connected.sorted { $0.value < $1.value }.map { ($0.key, $0.value) },
                s.gone.sorted { $0.value < $1.value }.map { ($0.key, $0.value) }
            )
        }
    }
}

/// What `trellis status` prints: the shell's `status`, then when each peer connected or was last
/// seen; or all of it as one JSON object (`--json`).
enum StatusReport {
    static func text(_ status: NodeStatus, _ times: PeerTimes) -> String {
        times.update(connected: Set(status.peers.map(\.peerKey)))
        var lines = [status.description]
        let (connected, gone) = times.snapshot()
        lines.append("peer times: \(connected.count) connected, \(gone.count) gone")
        for (key, since) in connected { lines.append("  \(hex(key).prefix(16)) connected since \(time(since))") }
        for (key, seen) in gone { lines.append("  \(hex(key).prefix(16)) last seen \(time(seen))") }
        return lines.joined(separator: "\n") + "\n"
    }

    /// One JSON object (keys sorted; times ISO 8601 UTC; peer keys in full hex).
    static func json(_ status: NodeStatus, _ times: PeerTimes) throws -> String {
        times.update(connected: Set(status.peers.map(\.peerKey)))
        let (connected, gone) = times.snapshot()
        let since = Dictionary(connected.map { (hex($0.0), time($0.1)) }, uniquingKeysWith: { a, _ in a })
        func spec(_ s: SubscriptionSpec) -> [String: Any] {
            var object: [String: Any] = ["collection": s.collection, "query": s.query]
            if !s.args.isEmpty { object["args"] = JSON.string(.map(s.args)) }
            return object
        }
        let object: [String: Any] = [
            "node": [
                "peerKey": hex(status.peerKey), "site": String(format: "%016llx", status.site),
                "epoch": hex(status.epoch), "lastSeq": status.lastSeq,
            ],
            "peers": status.peers.map { peer -> [String: Any] in
                var object: [String: Any] = [
                    "peerKey": peer.keyHex, "address": peer.address,
                    "direction": peer.isInitiator ? "outbound" : "inbound", "phase": peer.phase,
                    "served": peer.servedSubscriptions.map(spec),
                ]
                object["connectedSince"] = since[peer.keyHex]
                return object
            },
            "gone": gone.map { ["peerKey": hex($0.0), "lastSeen": time($0.1)] },
            "subscriptions": status.subscriptions.map(spec),
            "sync": status.sync.peers.map { peer -> [String: Any] in
                [
                    "peerKey": hex(peer.peerKey), "address": peer.address,
                    "subscriptions": peer.subscriptions.map { s -> [String: Any] in
                        var object: [String: Any] = [
                            "subscription": spec(s.subscription), "initialSyncComplete": s.isInitialSyncComplete,
                            "documentsReceived": s.documentsReceived,
                        ]
                        object["progress"] = s.progress
                        object["documentsBehind"] = s.documentsBehind
                        object["lastReceived"] = s.lastReceived.map(time)
                        object["error"] = s.error
                        return object
                    },
                ]
            },
            "inboundBuffer": [
                "heldBytes": status.inboundBuffer.held, "peakBytes": status.inboundBuffer.peak,
                "limitBytes": status.inboundBuffer.limit,
            ],
            "deferred": status.deferred.count, "damaged": status.damaged.count,
        ]
        let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
        return String(decoding: data, as: UTF8.self) + "\n"
    }

    static func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

    static func time(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.string(from: date)
    }
}
