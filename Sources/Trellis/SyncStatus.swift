public import Dispatch
public import Foundation
import Synchronization
public import TrellisCore
import TrellisSync

/// How one subscription is being filled from one peer in the current session
/// (``SyncStatus``).
public struct SubscriptionSyncStatus: Sendable, Equatable {
    /// The subscription (collection, query, arguments).
    public var subscription: SubscriptionSpec
    /// When the last batch for it arrived from this peer; `nil` before the first one.
    public var lastReceived: Date?
    /// Documents received from this peer for it in this session (tombstones included).
    public var documentsReceived: Int
    /// How far behind this node is: the peer's count of its log entries still to send after the
    /// last batch (an upper bound on documents still to come; tombstones and entries of the
    /// collection outside the query count too). 0 when caught up; `nil` before the first batch.
    public var documentsBehind: Int64?
    /// Whether the peer has sent everything it held for this subscription at least once in this
    /// session. Later changes keep arriving as they happen.
    public var isInitialSyncComplete: Bool
    /// Progress of the initial sync, 0...1 (received against received plus behind); 1 once
    /// complete; `nil` before the first batch.
    public var progress: Double?
    /// Why the peer cannot serve it, if it cannot (its query does not parse there, …).
    public var error: String?
}

/// How one directly connected peer fills this node's subscriptions.
public struct PeerSyncStatus: Sendable, Equatable {
    /// The peer's key (its static X25519 public key, 32 bytes).
    public var peerKey: [UInt8]
    /// The peer's address as this node sees it (`host:port`).
    public var address: String
    /// One entry per subscription this node asks the peer for.
    public var subscriptions: [SubscriptionSyncStatus]

    /// ``peerKey`` as 64 lowercase hex digits.
    public var peerKeyString: String { NodeStatus.hex(peerKey) }
}

/// Sync status of a node (``NodeSync/status``): per connected peer and subscription, when data
/// last arrived, how far behind the node is, and whether the initial sync is complete.
public struct SyncStatus: Sendable, Equatable, CustomStringConvertible {
    /// The peers with an established session, by address.
    public var peers: [PeerSyncStatus]

    /// Whether every subscription asked of every connected peer has completed its initial sync
    /// (`true` with no peer).
    public var isInitialSyncComplete: Bool {
        peers.allSatisfy { $0.subscriptions.allSatisfy { $0.isInitialSyncComplete || $0.error != nil } }
    }

    /// One line per peer and subscription: `PEER ADDRESS SUBSCRIPTION: STATE`.
    public var description: String {
        guard !peers.isEmpty else { return "no peer connected" }
        var lines: [String] = []
        for peer in peers {
            lines.append("\(peer.peerKeyString.prefix(16)) \(peer.address)")
            for s in peer.subscriptions {
                var state: String
                if let error = s.error {
                    state = "cannot be served: \(error)"
                } else if s.isInitialSyncComplete {
                    state = "up to date (\(s.documentsReceived) document(s) received)"
                } else if let progress = s.progress {
                    state = "initial sync \(Int(progress * 100)) % (\(s.documentsReceived) received, "
                    state += "at most \(s.documentsBehind ?? 0) to come)"
                } else {
                    state = "waiting for the first batch"
                }
                lines.append("  \(s.subscription): \(state)")
            }
        }
        return lines.joined(separator: "\n")
    }

    init(_ status: ReplicatorStatus, now: Millis) {
        let wallNow = Date()
        peers = status.peers.filter { $0.phase == "established" }.map { peer in
            PeerSyncStatus(
                peerKey: peer.peerKey, address: peer.address,
                subscriptions: peer.asked.map { asked in
                    let progress = asked.progress ?? SyncProgress()
                    return SubscriptionSyncStatus(
                        subscription: asked.spec,
                        lastReceived: progress.lastReceived.map {
                            wallNow.addingTimeInterval(-Double(now - $0) / 1000)
                        },
                        documentsReceived: progress.documents,
                        documentsBehind: progress.initialSyncComplete ? 0 : progress.left,
                        isInitialSyncComplete: progress.initialSyncComplete, progress: progress.fraction,
                        error: asked.error)
                })
        }
    }
}

/// A registered observer (``NodeSync/observeStatus(deliverOn:_:)``,
/// ``Presence/observe(deliverOn:_:)``): keep it; ``stop()`` or dropping it ends the
/// observation (a call already under way finishes).
public final class StatusObserver: Sendable {
    private let stopBody: Mutex<(@Sendable () -> Void)?>
    let active = Atomic<Bool>(true)

    init(stop: @escaping @Sendable () -> Void) {
        stopBody = Mutex(stop)
    }

    /// Ends the observation. Idempotent.
    public func stop() {
        active.store(false, ordering: .releasing)
        let body = stopBody.withLock { body in
            defer { body = nil }
            return body
        }
        body?()
    }

    deinit { stop() }
}

/// The sync side of a node (``TrellisNode/sync``, Ditto's `ditto.sync`): its subscriptions and
/// their status per peer.
public final class NodeSync: Sendable {
    let engine: SyncEngine

    init(engine: SyncEngine) { self.engine = engine }

    /// This node's own subscriptions.
    public var subscriptions: [SubscriptionSpec] { engine.subscriptions }

    /// Sync status now: per connected peer and subscription.
    ///
    /// - Complexity: O(peers × subscriptions).
    public var status: SyncStatus { SyncStatus(engine.status, now: SyncEngine.now()) }

    /// Calls `handler` on `queue` with the status now, then whenever it changes (checked every
    /// ``SyncEngine/statusInterval`` ms, so a fast first sync reports its progress about four
    /// times a second). Calls come in order, one at a time.
    ///
    /// - Returns: keep it; ``StatusObserver/stop()`` or dropping it ends the observation.
    public func observeStatus(
        deliverOn queue: DispatchQueue? = nil, _ handler: @escaping @Sendable (SyncStatus) -> Void
    ) -> StatusObserver {
        observe(engine, deliverOn: queue, map: { SyncStatus($0, now: SyncEngine.now()) }, handler)
    }
}

/// Registers a status observer that maps the replicator's status and calls `handler` only when
/// the mapped value changed.
func observe<T: Sendable & Equatable>(
    _ engine: SyncEngine, deliverOn queue: DispatchQueue?, map: @escaping @Sendable (ReplicatorStatus) -> T,
    _ handler: @escaping @Sendable (T) -> Void
) -> StatusObserver {
    let last = Mutex<T?>(nil)
    let token = Mutex<UInt64?>(nil)
    let observer = StatusObserver {
        if let t = token.withLock({ $0 }) { engine.removeStatusObserver(t) }
    }
    let registered = engine.addStatusObserver { [weak observer] status in
        guard let observer, observer.active.load(ordering: .acquiring) else { return }
        let value = map(status)
        let changed = last.withLock { previous in
            defer { previous = value }
            return previous != value
        }
        guard changed else { return }
        if let queue {
            queue.async { if observer.active.load(ordering: .acquiring) { handler(value) } }
        } else {
            handler(value)
        }
    }
    token.withLock { $0 = registered }
    if !observer.active.load(ordering: .acquiring) { engine.removeStatusObserver(registered) }
    return observer
}
