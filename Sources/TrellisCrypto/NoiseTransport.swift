/// The transport phase of a Noise session (spec rev 34, §5 `Split()` and §11): one
/// ``CipherState`` for sending and one for receiving, as this side's role requires.
///
/// Every transport message is at most 65535 bytes including its 16-byte tag, so a plaintext is at
/// most ``maxPlaintextLength`` (65519) bytes; split larger application messages. Messages must be
/// decrypted in the order they were encrypted (the nonce is an implicit counter); a failed
/// decryption leaves the receive nonce unchanged, but the session should be closed.
///
/// Value type: keep a single copy (two copies sending would reuse nonces).
public struct NoiseTransport: Sendable {
    /// Encrypts what this side sends (initiator: the first `Split()` output, responder: the second).
    public private(set) var sender: CipherState
    /// Decrypts what this side receives.
    public private(set) var receiver: CipherState
    /// The handshake hash (32 bytes) both sides share, for channel binding (§11.2).
    public let handshakeHash: [UInt8]
    /// The peer's static public key (32 bytes, its peer key), authenticated by the handshake.
    public let remoteStaticPublicKey: [UInt8]

    /// The Noise maximum message length in bytes (§3): 65535.
    public static var maxMessageLength: Int { noiseMaxMessageLength }
    /// The largest plaintext one transport message can carry: 65535 minus the 16-byte tag.
    public static var maxPlaintextLength: Int { noiseMaxMessageLength - Sizes.tag }

    /// Builds a transport from two cipher states; normally obtained from ``HandshakeState/split()``.
    public init(sender: CipherState, receiver: CipherState, handshakeHash: [UInt8], remoteStaticPublicKey: [UInt8]) {
        self.sender = sender
        self.receiver = receiver
        self.handshakeHash = handshakeHash
        self.remoteStaticPublicKey = remoteStaticPublicKey
    }

    /// Encrypts one transport message (`EncryptWithAd(empty, plaintext)`, §5.1) with the send key.
    ///
    /// - Parameter plaintext: At most ``maxPlaintextLength`` (65519) bytes.
    /// - Returns: `plaintext.count + 16` bytes.
    /// - Throws: ``NoiseError/Code/messageTooLong`` over 65519 bytes of plaintext,
    ///   ``NoiseError/Code/nonceExhausted`` after 2^64-1 messages.
    public mutating func encrypt(_ plaintext: [UInt8]) throws(NoiseError) -> [UInt8] {
        guard plaintext.count <= NoiseTransport.maxPlaintextLength else {
            throw NoiseError(
                .messageTooLong,
                "plaintext is \(plaintext.count) bytes; a transport message carries at most "
                    + "\(NoiseTransport.maxPlaintextLength), so split it")
        }
        return try sender.encryptWithAd([], plaintext)
    }

    /// Decrypts one transport message (`DecryptWithAd(empty, ciphertext)`, §5.1) with the receive key.
    ///
    /// - Parameter ciphertext: 16 to 65535 bytes.
    /// - Returns: The plaintext, `ciphertext.count - 16` bytes.
    /// - Throws: ``NoiseError/Code/messageTooLong`` over 65535 bytes,
    ///   ``NoiseError/Code/badMessageLength`` under 16, ``NoiseError/Code/decryptionFailed`` when it
    ///   does not authenticate, ``NoiseError/Code/nonceExhausted`` after 2^64-1 messages.
    public mutating func decrypt(_ ciphertext: [UInt8]) throws(NoiseError) -> [UInt8] {
        guard ciphertext.count <= noiseMaxMessageLength else {
            throw NoiseError(
                .messageTooLong,
                "transport message is \(ciphertext.count) bytes, over the \(noiseMaxMessageLength)-byte limit")
        }
        return try receiver.decryptWithAd([], ciphertext)
    }

    /// Rekeys the sending cipher state (`Rekey()`, §5.1, §11.3). The peer must call
    /// ``rekeyReceive()`` at the same point in the message stream.
    public mutating func rekeySend() {
        sender.rekeyTransport()
    }

    /// Rekeys the receiving cipher state (`Rekey()`, §5.1, §11.3), matching the peer's
    /// ``rekeySend()``.
    public mutating func rekeyReceive() {
        receiver.rekeyTransport()
    }
}

extension CipherState {
    /// Rekey for transport cipher states, which always have a key (a keyless state is left alone).
    mutating func rekeyTransport() {
        if hasKey { try? rekey() }
    }
}
