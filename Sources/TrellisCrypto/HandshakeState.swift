/// The handshake patterns this module implements.
///
/// All are `XX` (spec rev 34, §7.5): each side sends its static key encrypted, so neither needs
/// the other's key in advance. `xxpsk3` adds a pre-shared key mixed in at the end of the third
/// message (§9, §10.2): without the right psk the responder cannot decrypt message 3. `xxpsk0`
/// mixes it in before the first message (§9.2), so message 1's payload tag already proves the psk
/// and a responder refuses a stranger before any DH with its static key and before revealing it.
public enum NoisePattern: String, Sendable, CaseIterable {
    /// `Noise_XX_25519_ChaChaPoly_SHA256`: `-> e`, `<- e, ee, s, es`, `-> s, se`.
    case xx = "XX"
    /// `Noise_XXpsk3_25519_ChaChaPoly_SHA256`: `-> e`, `<- e, ee, s, es`, `-> s, se, psk`.
    /// What Trellis used up to protocol version 2.
    case xxpsk3 = "XXpsk3"
    /// `Noise_XXpsk0_25519_ChaChaPoly_SHA256`: `-> psk, e`, `<- e, ee, s, es`, `-> s, se`.
    /// The one Trellis uses (protocol version 3), with the mesh key as psk.
    case xxpsk0 = "XXpsk0"

    /// The full Noise protocol name, e.g. `"Noise_XXpsk3_25519_ChaChaPoly_SHA256"` (§8).
    public var protocolName: String { "Noise_\(rawValue)_25519_ChaChaPoly_SHA256" }

    /// Whether the pattern has a `psk` token and so needs a pre-shared key (§9).
    public var usesPSK: Bool { self != .xx }

    /// The message patterns, in order, initiator first (§7.5, §10.2).
    var messagePatterns: [[Token]] {
        switch self {
        case .xx: return [[.e], [.e, .ee, .s, .es], [.s, .se]]
        case .xxpsk3: return [[.e], [.e, .ee, .s, .es], [.s, .se, .psk]]
        case .xxpsk0: return [[.psk, .e], [.e, .ee, .s, .es], [.s, .se]]
        }
    }

    /// The tokens of a handshake pattern (§7.1).
    enum Token: Sendable {
        case e, s, ee, es, se, psk
    }
}

/// Which side of the handshake a ``HandshakeState`` plays.
public enum NoiseRole: Sendable, Equatable {
    /// Sends the first handshake message (the dialer, in Trellis).
    case initiator
    /// Receives the first handshake message (the listener, in Trellis).
    case responder
}

/// A Noise `HandshakeState` (spec rev 34, §5.3) for ``NoisePattern/xx``, ``NoisePattern/xxpsk3``
/// and ``NoisePattern/xxpsk0`` over X25519, ChaChaPoly and SHA-256.
///
/// Sans-I/O: feed it the bytes the peer sent with ``readMessage(_:)``, send what
/// ``writeMessage(payload:)`` returns, and once ``isComplete`` call ``split()`` for the transport.
/// The caller frames messages (each is at most 65535 bytes). The initiator writes messages 1 and 3,
/// the responder writes message 2.
///
/// Errors: once ``readMessage(_:)`` throws for the peer's bytes, the handshake is dead (every later
/// call throws ``NoiseError/Code/wrongState``) and the connection should be closed. A
/// ``writeMessage(payload:)`` refused for a too-long payload leaves the state unchanged.
public struct HandshakeState: Sendable {
    private enum Phase: Sendable, Equatable {
        case running
        case complete
        case split
        case failed
    }

    /// The pattern being run.
    public let pattern: NoisePattern
    /// This side's role.
    public let role: NoiseRole

    private var symmetric: SymmetricState
    private let localStatic: KeyPair
    private var localEphemeral: KeyPair?
    private let fixedEphemeral: KeyPair?
    private var remoteStatic: [UInt8]?
    private var remoteEphemeral: [UInt8]?
    private let psk: SecretBytes?
    private var messageIndex = 0
    private var phase = Phase.running

    /// `Initialize(...)` (§5.3): starts a handshake.
    ///
    /// - Parameters:
    ///   - pattern: ``NoisePattern/xx``, ``NoisePattern/xxpsk3`` or ``NoisePattern/xxpsk0``.
    ///   - role: ``NoiseRole/initiator`` or ``NoiseRole/responder``.
    ///   - prologue: Bytes both sides must agree on, mixed into the handshake hash (§6); Trellis puts
    ///     its protocol name and version here. Any length.
    ///   - staticKeyPair: This node's long-term X25519 key pair (its peer key).
    ///   - psk: The 32-byte pre-shared key; required for ``NoisePattern/xxpsk3`` and
    ///     ``NoisePattern/xxpsk0``, forbidden for ``NoisePattern/xx``.
    ///   - fixedEphemeralKeyPair: Use this ephemeral key instead of generating one. **Only for test
    ///     vectors**: reusing an ephemeral key destroys the handshake's security.
    /// - Throws: ``NoiseError/Code/invalidPSK`` if the psk is missing, not 32 bytes, or not wanted.
    public init(
        pattern: NoisePattern,
        role: NoiseRole,
        prologue: [UInt8] = [],
        staticKeyPair: KeyPair,
        psk: SecretBytes? = nil,
        fixedEphemeralKeyPair: KeyPair? = nil
    ) throws(NoiseError) {
        if pattern.usesPSK {
            guard let psk else {
                throw NoiseError(.invalidPSK, "\(pattern.protocolName) needs a 32-byte pre-shared key; none was given")
            }
            guard psk.count == HandshakeState.pskLength else {
                throw NoiseError(
                    .invalidPSK, "pre-shared key must be \(HandshakeState.pskLength) bytes, got \(psk.count)")
            }
        } else if psk != nil {
            throw NoiseError(
                .invalidPSK, "\(pattern.protocolName) has no psk token; pass psk: nil or use a psk pattern")
        }
        self.pattern = pattern
        self.role = role
        self.localStatic = staticKeyPair
        self.fixedEphemeral = fixedEphemeralKeyPair
        self.psk = psk
        self.symmetric = SymmetricState(protocolName: pattern.protocolName)
        // XX has no pre-messages, so only the prologue is mixed in before message 1.
        symmetric.mixHash(prologue)
    }

    /// Length in bytes of a Noise pre-shared key (§9): 32.
    public static let pskLength = 32

    /// Whether all handshake messages have been written and read; ``split()`` may then be called.
    public var isComplete: Bool { phase == .complete || phase == .split }

    /// Whether the next call must be ``writeMessage(payload:)`` (false when a read is due, the
    /// handshake is complete, or it failed).
    public var isWriteTurn: Bool {
        guard phase == .running else { return false }
        return (messageIndex % 2 == 0) == (role == .initiator)
    }

    /// The peer's static public key (32 bytes, its peer key) once received: after message 2 for
    /// the initiator, after message 3 for the responder; nil before. Authenticate it (e.g. against
    /// an allowlist) before trusting the session.
    public var remoteStaticPublicKey: [UInt8]? { remoteStatic }

    /// This side's static public key (32 bytes).
    public var localStaticPublicKey: [UInt8] { localStatic.publicKey }

    /// The handshake hash `h` (32 bytes, `GetHandshakeHash()`, §5.2). Once the handshake is complete
    /// both sides hold the same value, usable for channel binding (§11.2).
    public var handshakeHash: [UInt8] { symmetric.handshakeHash }

    /// `WriteMessage(payload, message_buffer)` (§5.3): processes the next message pattern's tokens
    /// and appends the (possibly encrypted) payload.
    ///
    /// - Parameter payload: Application data to carry in this handshake message. It is encrypted
    ///   except in message 1 of `xx` and `xxpsk3` (no key yet there; do not put secrets in it); in
    ///   `xxpsk0` message 1 is encrypted under a key derived from the psk alone (no forward secrecy).
    /// - Returns: The message to send, at most 65535 bytes.
    /// - Throws: ``NoiseError/Code/wrongState`` when it is not this side's turn to write,
    ///   ``NoiseError/Code/messageTooLong`` when the message would exceed 65535 bytes, and
    ///   ``NoiseError/Code/invalidKey`` if a DH with the peer's key gives all zeros. After
    ///   `messageTooLong` or `wrongState` the state is unchanged and a smaller payload may be tried;
    ///   after `invalidKey` the handshake is failed for good.
    public mutating func writeMessage(payload: [UInt8] = []) throws(NoiseError) -> [UInt8] {
        try checkRunning(writing: true)
        var next = self
        let message: [UInt8]
        do throws(NoiseError) {
            message = try next.processWrite(payload: payload)
        } catch {
            // Only a bad key from the peer (an all-zero DH result) gets here: the handshake is over.
            phase = .failed
            throw error
        }
        guard message.count <= noiseMaxMessageLength else {
            let maxPayload = payload.count - (message.count - noiseMaxMessageLength)
            throw NoiseError(
                .messageTooLong,
                "handshake message would be \(message.count) bytes, over the \(noiseMaxMessageLength)-byte "
                    + "limit; send a payload of at most \(maxPayload) bytes")
        }
        self = next
        return message
    }

    /// `ReadMessage(message, payload_buffer)` (§5.3): processes a message from the peer.
    ///
    /// - Parameter message: The bytes received, at most 65535.
    /// - Returns: The decrypted payload.
    /// - Throws: ``NoiseError/Code/wrongState`` when a write is due or the handshake is over,
    ///   ``NoiseError/Code/messageTooLong`` over 65535 bytes, ``NoiseError/Code/badMessageLength``
    ///   when it is too short for its pattern, ``NoiseError/Code/decryptionFailed`` when a key or
    ///   payload does not authenticate (with `xxpsk3`, a different psk fails here on message 3;
    ///   with `xxpsk0`, on message 1, before the responder has done any DH),
    ///   ``NoiseError/Code/invalidKey`` for a low-order public key. After any of these except
    ///   `wrongState`, the handshake is failed for good.
    public mutating func readMessage(_ message: [UInt8]) throws(NoiseError) -> [UInt8] {
        try checkRunning(writing: false)
        do throws(NoiseError) {
            guard message.count <= noiseMaxMessageLength else {
                throw NoiseError(
                    .messageTooLong, "handshake message is \(message.count) bytes, over \(noiseMaxMessageLength)")
            }
            return try processRead(message)
        } catch {
            phase = .failed
            throw error
        }
    }

    /// Ends the handshake (`Split()`, §5.2) and returns this side's transport cipher states. Can be
    /// called once; the handshake hash and remote static key stay readable afterwards.
    ///
    /// - Throws: ``NoiseError/Code/wrongState`` if the handshake is not complete or was already split.
    public mutating func split() throws(NoiseError) -> NoiseTransport {
        switch phase {
        case .complete:
            break
        case .split:
            throw NoiseError(.wrongState, "split() was already called for this handshake")
        case .running:
            throw NoiseError(
                .wrongState, "handshake is not complete (\(messageIndex) of \(pattern.messagePatterns.count) messages)")
        case .failed:
            throw NoiseError(.wrongState, "handshake failed earlier; start a new one")
        }
        guard let remoteStatic else {
            throw NoiseError(.wrongState, "handshake completed without the peer's static key")
        }
        let (initiatorToResponder, responderToInitiator) = symmetric.split()
        phase = .split
        let hash = symmetric.handshakeHash
        // The handshake keeps no secret it no longer needs once split (§5.3: delete the HandshakeState).
        symmetric.discardSecrets()
        localEphemeral = nil
        switch role {
        case .initiator:
            return NoiseTransport(
                sender: initiatorToResponder, receiver: responderToInitiator, handshakeHash: hash,
                remoteStaticPublicKey: remoteStatic)
        case .responder:
            return NoiseTransport(
                sender: responderToInitiator, receiver: initiatorToResponder, handshakeHash: hash,
                remoteStaticPublicKey: remoteStatic)
        }
    }

    // MARK: - Token processing (§5.3)

    private func checkRunning(writing: Bool) throws(NoiseError) {
        switch phase {
        case .running:
            if isWriteTurn != writing {
                throw NoiseError(
                    .wrongState,
                    "message \(messageIndex + 1) must be \(writing ? "read" : "written") by the \(roleName) "
                        + "now, not \(writing ? "written" : "read")")
            }
        case .complete, .split:
            throw NoiseError(.wrongState, "handshake is complete; use split() and the NoiseTransport")
        case .failed:
            throw NoiseError(.wrongState, "handshake failed earlier; start a new one")
        }
    }

    private var roleName: String { role == .initiator ? "initiator" : "responder" }

    private mutating func processWrite(payload: [UInt8]) throws(NoiseError) -> [UInt8] {
        var buffer: [UInt8] = []
        for token in pattern.messagePatterns[messageIndex] {
            switch token {
            case .e:
                let ephemeral = fixedEphemeral ?? KeyPair.generate()
                localEphemeral = ephemeral
                buffer += ephemeral.publicKey
                symmetric.mixHash(ephemeral.publicKey)
                if pattern.usesPSK { symmetric.mixKey(public: ephemeral.publicKey) }
            case .s:
                buffer += try symmetric.encryptAndHash(localStatic.publicKey)
            case .ee, .es, .se:
                try mixDH(token)
            case .psk:
                try mixPSK()
            }
        }
        buffer += try symmetric.encryptAndHash(payload)
        advance()
        return buffer
    }

    private mutating func processRead(_ message: [UInt8]) throws(NoiseError) -> [UInt8] {
        var offset = 0
        func take(_ count: Int, _ what: String) throws(NoiseError) -> [UInt8] {
            guard message.count - offset >= count else {
                throw NoiseError(
                    .badMessageLength,
                    "handshake message \(messageIndex + 1) is \(message.count) bytes, too short for \(what) "
                        + "(\(count) bytes needed at offset \(offset))")
            }
            defer { offset += count }
            return Array(message[offset..<offset + count])
        }
        for token in pattern.messagePatterns[messageIndex] {
            switch token {
            case .e:
                let publicKey = try take(Sizes.dh, "the ephemeral key")
                remoteEphemeral = publicKey
                symmetric.mixHash(publicKey)
                if pattern.usesPSK { symmetric.mixKey(public: publicKey) }
            case .s:
                let length = Sizes.dh + (symmetric.cipherState.hasKey ? Sizes.tag : 0)
                let encrypted = try take(length, "the static key")
                remoteStatic = try symmetric.decryptAndHash(encrypted)
            case .ee, .es, .se:
                try mixDH(token)
            case .psk:
                try mixPSK()
            }
        }
        if symmetric.cipherState.hasKey, message.count - offset < Sizes.tag {
            throw NoiseError(
                .badMessageLength,
                "handshake message \(messageIndex + 1) is \(message.count) bytes, too short for the payload's "
                    + "\(Sizes.tag)-byte authentication tag")
        }
        let payload = try symmetric.decryptAndHash(Array(message[offset...]))
        advance()
        return payload
    }

    /// `ee`, `es`, `se` (§5.3): `MixKey(DH(...))` with the keys the token and role call for.
    private mutating func mixDH(_ token: NoisePattern.Token) throws(NoiseError) {
        let local: KeyPair?
        let remote: [UInt8]?
        switch (token, role) {
        case (.ee, _):
            (local, remote) = (localEphemeral, remoteEphemeral)
        case (.es, .initiator):
            (local, remote) = (localEphemeral, remoteStatic)
        case (.es, .responder):
            (local, remote) = (localStatic, remoteEphemeral)
        case (.se, .initiator):
            (local, remote) = (localStatic, remoteEphemeral)
        case (.se, .responder):
            (local, remote) = (localEphemeral, remoteStatic)
        default:
            throw NoiseError(.wrongState, "token \(token) is not a DH token")
        }
        guard let local, let remote else {
            throw NoiseError(.wrongState, "DH token \(token) reached before both keys are known")
        }
        symmetric.mixKey(try local.dh(with: remote))
    }

    /// `psk` (§9.2): `MixKeyAndHash(psk)`.
    private mutating func mixPSK() throws(NoiseError) {
        guard let psk else { throw NoiseError(.invalidPSK, "psk token reached without a pre-shared key") }
        symmetric.mixKeyAndHash(psk)
    }

    private mutating func advance() {
        messageIndex += 1
        if messageIndex == pattern.messagePatterns.count { phase = .complete }
    }
}
