/// The sans-I/O state machine of one sync session with one peer (docs/PROTOCOL.md).
///
/// It reads no socket, store or clock: the shell feeds it events (``start()``,
/// ``receive(_:)``, ``subscribe(_:)``, ``scanned(subscription:documents:upTo:exhausted:)``,
/// ``applied(subscription:upTo:)``, ``localChanged()``) and carries out the ``Directive``s it
/// returns, in order.
///
/// Flow: `hello` both ways → each side sends its subscriptions with the checkpoint it holds →
/// for each subscription of the peer, this side scans its own log in `seq` order from the
/// checkpoint and sends bounded batches, at most ``Configuration/maxInFlight`` unacknowledged per
/// subscription → after catching up, every local commit triggers a new scan (live push).
public struct SyncSession: Sendable {
    public struct Configuration: Sendable {
        /// This node's hello.
        public var hello: Hello
        /// The peer key the secure channel authenticated; the peer's hello must carry the same.
        public var remotePeerKey: [UInt8]
        /// Change-log entries scanned per batch.
        public var batchSize: Int = 256
        /// Batches sent and not yet acknowledged, per subscription.
        public var maxInFlight: Int = 4
        /// Subscriptions one peer may ask this node to serve; more is a protocol error.
        public var maxSubscriptions: Int = 1024

        public init(hello: Hello, remotePeerKey: [UInt8]) {
            self.hello = hello
            self.remotePeerKey = remotePeerKey
        }
    }

    /// What the shell must do.
    public enum Directive: Sendable, Equatable {
        /// Send this message to the peer.
        case send(WireMessage)
        /// The peer said hello: register the session, then call ``subscribe(_:)`` with the
        /// subscriptions (and checkpoints) this node wants from it.
        case established(Hello)
        /// Read up to `limit` change-log entries of `spec.collection` after `after`, keep those matching
        /// `spec` (tombstones always kept), and call ``scanned(subscription:documents:upTo:exhausted:)``.
        case scan(subscription: String, spec: SubscriptionSpec, after: Int64, limit: Int)
        /// Merge these documents and store checkpoint `upTo` for the subscription in one transaction,
        /// then call ``applied(subscription:upTo:)``.
        case apply(subscription: String, documents: [WireDocument], upTo: Int64)
        /// The peer's subscription set changed (for forwarding upstream).
        case remoteSubscriptionsChanged([WireSubscription])
        /// Close the connection.
        case close(reason: String)
    }

    enum Phase: Sendable { case awaitingHello, established, closed }

    struct Outbound: Sendable {
        var spec: SubscriptionSpec
        var cursor: Int64
        var inFlight = 0
        var scanning = false
        /// More entries may be waiting after `cursor` (a commit happened or the last scan was full).
        var pending = true
        /// The last `upTo` sent, to skip empty batches that advance nothing.
        var lastSent: Int64
    }

    public let configuration: Configuration
    private(set) var phase = Phase.awaitingHello
    /// The peer's hello, once received.
    public private(set) var remote: Hello?
    /// By subscription key, in byte order (keys are byte strings).
    private var outbound = UTF8Map<Outbound>()
    /// Keys of the subscriptions this side sent; batches for others are dropped.
    private var inbound: Set<UTF8Key> = []

    public init(configuration: Configuration) {
        self.configuration = configuration
    }

    public var isEstablished: Bool { phase == .established }

    /// The peer's subscriptions this side serves, by key.
    public var servedSubscriptions: [SubscriptionSpec] { outbound.values.map(\.spec) }

    /// Opens the session: sends this node's hello.
    public mutating func start() -> [Directive] {
        [.send(.hello(configuration.hello))]
    }

    private mutating func fail(_ code: String, _ message: String) -> [Directive] {
        phase = .closed
        return [.send(.error(code: code, message: message)), .close(reason: "\(code): \(message)")]
    }

    /// Handles one message from the peer.
    public mutating func receive(_ message: WireMessage) -> [Directive] {
        switch (phase, message) {
        case (.closed, _):
            return []
        case (_, .error(let code, let text)):
            phase = .closed
            return [.close(reason: "peer closed the session: \(code): \(text)")]
        case (.awaitingHello, .hello(let hello)):
            guard hello.version == WireMessage.protocolVersion else {
                return fail(
                    "version",
                    "protocol version \(hello.version) is not supported; this node speaks \(WireMessage.protocolVersion)"
                )
            }
            guard hello.peerKey == configuration.remotePeerKey else {
                return fail("identity", "hello names a peer key other than the one the channel authenticated")
            }
            remote = hello
            phase = .established
            return [.established(hello)]
        case (.awaitingHello, _):
            return fail("protocol", "expected hello first")
        case (.established, .hello):
            return fail("protocol", "hello sent twice")
        case (.established, .subscriptions(let subs)):
            guard subs.count <= configuration.maxSubscriptions else {
                return fail(
                    "limit",
                    "\(subs.count) subscriptions; this node serves at most \(configuration.maxSubscriptions) per peer")
            }
            var next = UTF8Map<Outbound>()
            var directives: [Directive] = []
            for sub in subs {
                let key = sub.spec.key
                if var existing = outbound[key] {
                    // A checkpoint below the cursor means the peer wants entries again (it evicted
                    // documents, or lost unacknowledged batches): rescan from there. Re-sent entries
                    // merge as no-ops.
                    if sub.since < existing.cursor {
                        existing.cursor = sub.since
                        existing.lastSent = sub.since
                        existing.pending = true
                    }
                    next[key] = existing
                } else {
                    next[key] = Outbound(spec: sub.spec, cursor: sub.since, lastSent: sub.since)
                }
            }
            outbound = next
            directives.append(.remoteSubscriptionsChanged(subs))
            for key in outbound.keys { directives += scanIfReady(key) }
            return directives
        case (.established, .batch(let sub, let docs, let upTo)):
            guard inbound.contains(UTF8Key(sub)) else { return [] }
            return [.apply(subscription: sub, documents: docs, upTo: upTo)]
        case (.established, .ack(let sub, _)):
            guard var out = outbound[sub] else { return [] }
            out.inFlight = max(0, out.inFlight - 1)
            outbound[sub] = out
            return scanIfReady(sub)
        }
    }

    private mutating func scanIfReady(_ key: String) -> [Directive] {
        guard phase == .established, var out = outbound[key], out.pending, !out.scanning,
            out.inFlight < configuration.maxInFlight
        else { return [] }
        out.scanning = true
        out.pending = false
        outbound[key] = out
        return [.scan(subscription: key, spec: out.spec, after: out.cursor, limit: configuration.batchSize)]
    }

    /// Sends this node's subscription set (replacing the previous one).
    public mutating func subscribe(_ subscriptions: [WireSubscription]) -> [Directive] {
        guard phase == .established else { return [] }
        inbound = Set(subscriptions.map { UTF8Key($0.spec.key) })
        return [.send(.subscriptions(subscriptions))]
    }

    /// The result of a ``Directive/scan(subscription:spec:after:limit:)``.
    ///
    /// - Parameters:
    ///   - documents: matching entries, in `seq` order.
    ///   - upTo: the last `seq` scanned (the new cursor).
    ///   - exhausted: `true` when the scan reached the end of the log.
    public mutating func scanned(
        subscription key: String, documents: [WireDocument], upTo: Int64, exhausted: Bool
    ) -> [Directive] {
        guard phase == .established, var out = outbound[key] else { return [] }
        out.scanning = false
        out.cursor = max(out.cursor, upTo)
        if !exhausted { out.pending = true }
        var directives: [Directive] = []
        // An empty batch still advances the receiver's checkpoint past filtered-out entries,
        // but only once the scan is exhausted (so a long filtered range costs one message).
        if !documents.isEmpty || (exhausted && out.cursor > out.lastSent) {
            directives.append(.send(.batch(subscription: key, documents: documents, upTo: out.cursor)))
            out.inFlight += 1
            out.lastSent = out.cursor
        }
        outbound[key] = out
        return directives + scanIfReady(key)
    }

    /// A batch from the peer is durably merged: acknowledge it.
    public mutating func applied(subscription: String, upTo: Int64) -> [Directive] {
        guard phase == .established else { return [] }
        return [.send(.ack(subscription: subscription, upTo: upTo))]
    }

    /// The local store committed a change: scan again for every subscription of the peer.
    public mutating func localChanged() -> [Directive] {
        guard phase == .established else { return [] }
        var directives: [Directive] = []
        for key in outbound.keys {
            outbound[key]?.pending = true
            directives += scanIfReady(key)
        }
        return directives
    }

    /// The connection ended.
    public mutating func closed() {
        phase = .closed
    }
}
