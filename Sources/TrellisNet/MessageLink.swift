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
    /// Starts delivering messages. `onMessage` is called for each whole message in order;
    /// `onClose` exactly once, with the reason, after which nothing more is delivered.
    func start(onMessage: @escaping @Sendable ([UInt8]) -> Void, onClose: @escaping @Sendable (String) -> Void)
    /// Sends one message. Thread-safe.
    ///
    /// - Throws: when the link is closed or the message is above the size limit.
    func send(_ message: [UInt8]) throws
    /// Closes the link; `onClose` follows.
    func close()
}
