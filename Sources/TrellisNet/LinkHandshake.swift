internal import Glibc
import TrellisCrypto

/// Why a ``SecureLink`` handshake was refused or failed before the peer was authenticated, in words
/// a user can act on (docs/PROTOCOL.md §1, docs/SECURITY.md).
public struct HandshakeError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The kind of failure.
    public enum Reason: Sendable, Equatable {
        /// Responder: message 1 does not authenticate under any mesh key this node holds.
        case wrongMeshKey
        /// Initiator: the responder closed the connection without answering message 1; it holds
        /// another mesh key (or does not accept this node). A node holding a next mesh key retries
        /// with it.
        case refusedByPeer
        /// The peer speaks an older handshake (protocol version 2 or older: `Noise_XXpsk3`).
        case oldProtocol
        /// Responder: message 1 did not arrive within the first-message deadline.
        case firstMessageTimeout
        /// The whole handshake did not finish within its deadline.
        case timeout
    }

    /// The kind of failure.
    public let reason: Reason
    /// What happened and what to do, for logs and the user.
    public let message: String

    /// - Parameters:
    ///   - reason: the kind of failure.
    ///   - message: what happened and what to do.
    public init(_ reason: Reason, _ message: String) {
        self.reason = reason
        self.message = message
    }

    public var description: String { message }
}

/// The handshake of ``SecureLink``: `Noise_XXpsk0_25519_ChaChaPoly_SHA256` with the mesh key as
/// psk, framed as 2-byte lengths (docs/PROTOCOL.md §1).
///
/// With `psk0` the initiator's first message (its ephemeral key and the tag of an empty payload,
/// 48 bytes) already proves the mesh key: a responder checks it with two HKDFs and one AEAD tag and
/// refuses a stranger before generating an ephemeral key, doing any DH or revealing its static key.
enum LinkHandshake {
    /// The pattern on the wire.
    static let pattern = NoisePattern.xxpsk0
    /// The prologue of the older handshake, `Noise_XXpsk3` (protocol version 2 and before).
    static let oldPrologue = Array("trellis/1".utf8)

    /// Runs the handshake to the end and returns the transport.
    ///
    /// - Parameters:
    ///   - socket: a connected socket (not closed here; the caller closes it on failure).
    ///   - initiator: the dialing side.
    ///   - identity: this node's static key pair.
    ///   - meshKeys: initiator: the one mesh key to try; responder: every mesh key accepted (the
    ///     current one and, during a changeover, the next), tried in order on message 1.
    ///   - prologue: the protocol name and version mixed into the handshake.
    ///   - firstMessageDeadline: responder: when message 1 must have arrived.
    ///   - deadline: when the whole handshake must have finished.
    ///   - onFirstMessage: responder: called once message 1 proved a mesh key, with its index in
    ///     `meshKeys`, before this side does any DH with its static key.
    ///   - payload: this side's ``HandshakePayload``, sent in message 2 (responder) or 3
    ///     (initiator), both encrypted; message 1 stays empty.
    /// - Returns: the transport, and the peer's payload (empty when it sent none).
    /// - Throws: ``HandshakeError``, ``SocketError`` for I/O, ``NoiseError`` for malformed messages.
    static func run(
        socket: TCPSocket, initiator: Bool, identity: KeyPair, meshKeys: [SecretBytes], prologue: [UInt8],
        firstMessageDeadline: ContinuousClock.Instant, deadline: ContinuousClock.Instant,
        onFirstMessage: (Int) -> Void, payload: [UInt8] = []
    ) throws -> (transport: NoiseTransport, remotePayload: [UInt8]) {
        precondition(!meshKeys.isEmpty, "a handshake needs a mesh key")
        var handshake: HandshakeState
        if initiator {
            precondition(meshKeys.count == 1, "an initiator tries one mesh key per connection")
            handshake = try HandshakeState(
                pattern: pattern, role: .initiator, prologue: prologue, staticKeyPair: identity, psk: meshKeys[0])
            try writeFrame(socket, handshake.writeMessage(), deadline: deadline)
            let message2: [UInt8]
            do {
                message2 = try readFrame(socket, deadline: deadline)
            } catch let error as SocketError where error.call == "recv" {
                throw HandshakeError(
                    .refusedByPeer,
                    "the peer closed the connection without answering: it holds another mesh key or runs an "
                        + "older protocol version (check that both nodes use the same mesh key and protocol 3)")
            }
            let remote = try handshake.readMessage(message2)
            try writeFrame(socket, handshake.writeMessage(payload: payload), deadline: deadline)
            return (try handshake.split(), remote)
        } else {
            let message1: [UInt8]
            do {
                message1 = try readFrame(socket, deadline: min(firstMessageDeadline, deadline))
            } catch let error as SocketError where error.code == ETIMEDOUT && error.call == "poll" {
                throw HandshakeError(
                    .firstMessageTimeout, "no first handshake message within the first-message deadline")
            }
            (handshake, _) = try acceptFirstMessage(
                message1, identity: identity, meshKeys: meshKeys, prologue: prologue, onFirstMessage: onFirstMessage)
            try writeFrame(socket, handshake.writeMessage(payload: payload), deadline: deadline)
            let remote = try handshake.readMessage(readFrame(socket, deadline: deadline))
            return (try handshake.split(), remote)
        }
    }

    /// Responder: checks message 1 under each mesh key in turn.
    ///
    /// - Returns: the handshake state after message 1, and the index of the mesh key it proved.
    /// - Throws: ``HandshakeError`` (`wrongMeshKey` when no key authenticates it, `oldProtocol`
    ///   when it is the first message of the older `XXpsk3` handshake, whose tag anyone can check
    ///   since it depends on no key), ``NoiseError`` for other malformed messages.
    /// - Complexity: O(k) HKDF and AEAD operations for k mesh keys, one more for the older
    ///   handshake; no DH.
    static func acceptFirstMessage(
        _ message1: [UInt8], identity: KeyPair, meshKeys: [SecretBytes], prologue: [UInt8],
        onFirstMessage: (Int) -> Void
    ) throws -> (HandshakeState, Int) {
        for (index, key) in meshKeys.enumerated() {
            var handshake = try HandshakeState(
                pattern: pattern, role: .responder, prologue: prologue, staticKeyPair: identity, psk: key)
            guard try readFirstMessage(&handshake, message1) else { continue }
            onFirstMessage(index)
            return (handshake, index)
        }
        // XXpsk3 mixes no psk before message 3, so its message 1 verifies under any key.
        var old = try HandshakeState(
            pattern: .xxpsk3, role: .responder, prologue: oldPrologue, staticKeyPair: identity, psk: meshKeys[0])
        if (try? old.readMessage(message1)) != nil {
            throw HandshakeError(
                .oldProtocol,
                "the peer speaks an older protocol version (Trellis protocol 2 or older, Noise XXpsk3); this node "
                    + "speaks protocol 3 (Noise XXpsk0): upgrade the peer")
        }
        let keys: String = meshKeys.count > 1 ? "either of this node's mesh keys" : "this node's mesh key"
        throw HandshakeError(
            .wrongMeshKey,
            "the peer's first handshake message does not authenticate under \(keys): it holds another mesh key")
    }

    /// Reads message 1 under one key.
    ///
    /// - Returns: false when its tag does not verify (the peer holds another key).
    /// - Throws: ``NoiseError`` when it is malformed otherwise.
    private static func readFirstMessage(_ handshake: inout HandshakeState, _ message1: [UInt8]) throws(NoiseError)
        -> Bool
    {
        do {
            _ = try handshake.readMessage(message1)
            return true
        } catch {
            if error.code == .decryptionFailed { return false }
            throw error
        }
    }

    static func writeFrame(_ socket: TCPSocket, _ message: [UInt8], deadline: ContinuousClock.Instant) throws {
        var frame = [UInt8(message.count >> 8), UInt8(message.count & 0xFF)]
        frame += message
        try socket.write(frame, deadline: deadline)
    }

    static func readFrame(_ socket: TCPSocket, deadline: ContinuousClock.Instant) throws -> [UInt8] {
        let header = try socket.read(exactly: 2, deadline: deadline)
        let length = Int(header[0]) << 8 | Int(header[1])
        return try socket.read(exactly: length, deadline: deadline)
    }
}
