/// An authenticated, encrypted, message-oriented connection to one peer.
///
/// ``SecureLink`` implements it over TCP; `MemoryLink` (TrellisTestKit) implements it in memory.
///
/// Sending never blocks on the network: ``send(_:)`` queues the message and returns the bytes now
/// queued. The queue has no size limit of its own; a producer keeps it bounded by pausing bulk
/// output once ``send(_:)`` returns ``highWater`` or more and resuming when `onDrain` runs (the
/// queue is back at ``lowWater`` or less). Receiving applies backpressure the other way: a link
/// reads nothing more from its peer while `onMessage` runs.
public protocol MessageLink: AnyObject, Sendable {
    /// The peer's static public key, as the secure channel authenticated it (32 bytes).
    var remotePeerKey: [UInt8] { get }
    /// `true` when this side dialed.
    var isInitiator: Bool { get }
    /// A human-readable address of the peer, for logs and `peers`.
    var remoteAddress: String { get }
    /// A number both ends of this connection hold and no other connection has (``SecureLink``:
    /// the first 8 bytes of the Noise handshake hash, big-endian), or `nil` when the link has
    /// none. A session resumed by digest takes it as its nonce (docs/PROTOCOL.md §2, step 1).
    var channelNonce: UInt64? { get }
    /// Starts delivery.
    ///
    /// Calling it more than once has no effect beyond the first call.
    ///
    /// - Parameters:
    ///   - onMessage: runs for each whole message, in order, on the link's own reader thread; the
    ///     reader reads nothing more from the peer until it returns (so a receiver that blocks in
    ///     `onMessage` is inbound backpressure).
    ///   - onDrain: runs (on any thread) each time the outbound queue falls to ``lowWater`` or
    ///     below after having reached ``highWater`` or more. It may run before the ``send(_:)``
    ///     that crossed ``highWater`` has returned to its caller, so a caller that pauses should
    ///     check ``queuedBytes`` when it pauses.
    ///   - onClose: runs exactly once, last (after every `onMessage` and `onDrain`), with the
    ///     reason the link ended.
    func start(
        onMessage: @escaping @Sendable ([UInt8]) -> Void,
        onDrain: @escaping @Sendable () -> Void,
        onClose: @escaping @Sendable (String) -> Void)
    /// Queues one message and returns at once (never blocks on the socket). Thread-safe; messages
    /// go out in the order their `send` calls took effect.
    ///
    /// - Parameter message: at most ``LinkLimits/maxMessageBytes`` bytes.
    /// - Returns: the bytes queued after adding this one (the caller compares with ``highWater``).
    /// - Throws: ``LinkError/closed`` once the link is closing or closed,
    ///   ``LinkError/messageTooLarge(_:)`` above ``LinkLimits/maxMessageBytes``.
    @discardableResult func send(_ message: [UInt8]) throws -> Int
    /// Bytes queued and not yet written to the socket (each message counts its length and its
    /// 4-byte length prefix).
    var queuedBytes: Int { get }
    /// The queue size, in bytes, at or above which a producer should pause bulk output.
    var highWater: Int { get }
    /// The queue size, in bytes, at or below which `onDrain` runs after ``highWater`` was reached.
    var lowWater: Int { get }
    /// Closes: wakes a blocked writer or reader, sends the authenticated close if the writer is
    /// free, and never waits for a stuck peer. Returns at once; `onClose` follows (when the link was
    /// started). Calling it again has no effect.
    func close()
    /// Why the link ended, by kind, once `onClose` has run (nil before, and for links that do not
    /// classify their ends).
    var closeReason: LinkCloseReason? { get }
    /// Tells the link its receiver is done with a message `onMessage` delivered, so that its bytes
    /// leave the node's inbound budget (``SecureLink/useInboundBudget(_:)``). Links without a
    /// budget do nothing. Thread-safe; at most once per message, after `onMessage` returned.
    ///
    /// - Parameter byteCount: the message's length, bytes.
    func consumed(_ byteCount: Int)
    /// Sets what runs, on the link's reader thread and at most about once a second, while a
    /// message is arriving but not yet whole: a slow link carrying a large message is alive
    /// (``Replicator/linkActive(_:now:)`` in TrellisCore). Call it before
    /// ``start(onMessage:onDrain:onClose:)``. Links that deliver whole messages at once ignore it.
    func onPartialMessage(_ handler: @escaping @Sendable () -> Void)
}

extension MessageLink {
    /// None (links that share nothing both ends could name the connection by).
    public var channelNonce: UInt64? { nil }
    /// No classification (in-memory links).
    public var closeReason: LinkCloseReason? { nil }
    /// No budget (in-memory links).
    public func consumed(_ byteCount: Int) {}
    /// Messages arrive whole (in-memory links).
    public func onPartialMessage(_ handler: @escaping @Sendable () -> Void) {}
    /// ``LinkLimits/highWater``.
    public var highWater: Int { LinkLimits.highWater }
    /// ``LinkLimits/lowWater``.
    public var lowWater: Int { LinkLimits.lowWater }

    /// Starts delivery for a receiver that does not pause on ``highWater``.
    ///
    /// Same as ``start(onMessage:onDrain:onClose:)`` with an `onDrain` that does nothing.
    public func start(onMessage: @escaping @Sendable ([UInt8]) -> Void, onClose: @escaping @Sendable (String) -> Void) {
        start(onMessage: onMessage, onDrain: {}, onClose: onClose)
    }
}

/// Sizes every ``MessageLink`` shares.
public enum LinkLimits {
    /// Outbound queue size, in bytes, at which a producer pauses bulk output: 8 MiB.
    ///
    /// A producer that pauses here keeps each link's memory to about this much plus one message.
    public static let highWater = 8 * 1024 * 1024
    /// Outbound queue size, in bytes, at which `onDrain` tells a paused producer to resume: 2 MiB,
    /// enough to keep a fast link busy while the producer prepares more.
    public static let lowWater = 2 * 1024 * 1024
    /// Largest application message, bytes: 64 MiB.
    public static let maxMessageBytes = 64 * 1024 * 1024
}

/// Errors of a ``MessageLink`` beyond socket and Noise errors.
public enum LinkError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The link is closing or closed; nothing more can be sent.
    case closed
    /// A message of this many bytes is above ``LinkLimits/maxMessageBytes``.
    case messageTooLarge(Int)
    /// The authenticated peer is not admitted (its key, name or a connection-request handler:
    /// docs/SECURITY.md, "Admission").
    case notAdmitted

    /// The error in words.
    public var description: String {
        switch self {
        case .closed: return "the link is closed"
        case .messageTooLarge(let n):
            return "message of \(n) bytes is above the \(LinkLimits.maxMessageBytes)-byte limit"
        case .notAdmitted: return "the peer was not admitted (see the refusal logged with its key)"
        }
    }
}
