/// An authenticated, encrypted, message-oriented connection to one peer.
///
/// ``SecureLink`` implements it over TCP; tests may implement it in memory.
public protocol MessageLink: AnyObject, Sendable {
    /// The peer's static public key, as the secure channel authenticated it (32 bytes).
    var remotePeerKey: [UInt8] { get }
    /// `true` when this side dialed.
    var isInitiator: Bool { get }
    /// A human-readable address of the peer, for logs and `peers`.
    var remoteAddress: String { get }
    /// Starts delivery. `onMessage` runs for each whole message, in order, on the link's own
    /// reader thread; the reader reads nothing more until it returns (so a receiver that blocks
    /// in `onMessage` is inbound backpressure). `onDrain` runs (any thread) each time the outbound
    /// queue falls to or below ``LinkLimits/lowWater`` after having been above
    /// ``LinkLimits/highWater``. `onClose` runs exactly once, last.
    func start(
        onMessage: @escaping @Sendable ([UInt8]) -> Void, onDrain: @escaping @Sendable () -> Void,
        onClose: @escaping @Sendable (String) -> Void)
    /// Queues one message and returns at once (never blocks on the socket).
    ///
    /// - Returns: the bytes queued after adding this one (compare with ``LinkLimits/highWater``).
    /// - Throws: when the link is closed or the message is above the size limit.
    @discardableResult func send(_ message: [UInt8]) throws -> Int
    /// Bytes queued and not yet written.
    var queuedBytes: Int { get }
    /// Closes: never waits for a stuck peer. `onClose` follows.
    func close()
}

/// Outbound queue thresholds of a ``MessageLink``, bytes.
public enum LinkLimits {
    /// Above this, the sync engine stops producing bulk data for the link.
    public static let highWater = 8 << 20
    /// At or below this (after having been above ``highWater``), the link calls `onDrain`.
    public static let lowWater = 2 << 20
}
