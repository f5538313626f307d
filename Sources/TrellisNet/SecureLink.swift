import Dispatch
import Foundation
import Synchronization
public import TrellisCrypto

/// A ``MessageLink`` over TCP, encrypted with `Noise_XXpsk3_25519_ChaChaPoly_SHA256`.
///
/// Wire format (docs/PROTOCOL.md):
/// - Every Noise message (handshake or transport) is framed as a 2-byte big-endian length and the
///   message (at most 65535 bytes, Noise spec rev 34 §3).
/// - The handshake is XXpsk3 with prologue ``prologue`` and psk = the mesh key; the dialer is the
///   initiator. Handshake payloads are empty.
/// - After the handshake the transport plaintexts form one byte stream carrying application
///   messages, each a 4-byte big-endian length and that many bytes (at most
///   ``maxMessageBytes``); one application message may span many transport messages.
/// - A transport message with an empty plaintext is the authenticated close.
/// - Each direction rekeys (`Rekey()`, §11.3) after every ``rekeyInterval`` transport messages.
public final class SecureLink: MessageLink {
    /// Bytes mixed into the handshake: the protocol and its version.
    public static let prologue = Array("trellis/1".utf8)
    /// Largest application message, bytes.
    public static let maxMessageBytes = 64 * 1024 * 1024
    /// Transport messages per direction between rekeys.
    public static let rekeyInterval = 1 << 16

    public let remotePeerKey: [UInt8]
    public let isInitiator: Bool
    public let remoteAddress: String
    /// The Noise handshake hash (channel binding).
    public let handshakeHash: [UInt8]

    private let socket: TCPSocket
    private struct Sender {
        var transport: NoiseTransport
        var count = 0
        var closed = false
    }
    private let sender: Mutex<Sender>
    // Used only by the reader thread once started.
    private let receiver: Mutex<NoiseTransport>
    private let started = Atomic<Bool>(false)

    private init(socket: TCPSocket, transport: NoiseTransport, initiator: Bool, address: String) {
        self.socket = socket
        self.remotePeerKey = transport.remoteStaticPublicKey
        self.handshakeHash = transport.handshakeHash
        self.isInitiator = initiator
        self.remoteAddress = address
        self.sender = Mutex(Sender(transport: transport))
        self.receiver = Mutex(transport)
    }

    /// Runs the XXpsk3 handshake on a connected socket.
    ///
    /// - Parameters:
    ///   - initiator: `true` on the dialing side.
    ///   - identity: this node's static key pair.
    ///   - meshKey: the 32-byte mesh key (the psk).
    ///   - admit: decides whether the authenticated remote peer key may join (an allowlist).
    ///   - timeout: seconds to wait for each handshake message.
    /// - Throws: ``SocketError`` for I/O, ``NoiseError`` when the peer does not hold the mesh key
    ///   (`decryptionFailed`) or sends malformed handshake messages, ``LinkError`` when refused.
    public static func handshake(
        socket: TCPSocket, initiator: Bool, identity: KeyPair, meshKey: SecretBytes, address: String,
        admit: ([UInt8]) -> Bool = { _ in true }, timeout: Int = 10
    ) throws -> SecureLink {
        socket.setReceiveTimeout(seconds: timeout)
        // The whole handshake has `timeout` seconds, not each read: a peer dripping one byte at a
        // time cannot hold the connection (and its thread) open.
        let finished = Mutex(false)
        DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(timeout)) {
            finished.withLock { done in if !done { socket.close() } }
        }
        defer { finished.withLock { $0 = true } }
        var handshake = try HandshakeState(
            pattern: .xxpsk3, role: initiator ? .initiator : .responder, prologue: prologue,
            staticKeyPair: identity, psk: meshKey)
        do {
            while !handshake.isComplete {
                if handshake.isWriteTurn {
                    try writeFrame(socket, handshake.writeMessage())
                } else {
                    _ = try handshake.readMessage(readFrame(socket))
                }
            }
        } catch {
            socket.close()
            throw error
        }
        let transport = try handshake.split()
        guard admit(transport.remoteStaticPublicKey) else {
            socket.close()
            throw LinkError.notAdmitted
        }
        socket.setReceiveTimeout(seconds: 0)
        return SecureLink(socket: socket, transport: transport, initiator: initiator, address: address)
    }

    static func writeFrame(_ socket: TCPSocket, _ message: [UInt8]) throws {
        var frame = [UInt8(message.count >> 8), UInt8(message.count & 0xFF)]
        frame += message
        try socket.write(frame)
    }

    static func readFrame(_ socket: TCPSocket) throws -> [UInt8] {
        let header = try socket.read(exactly: 2)
        let length = Int(header[0]) << 8 | Int(header[1])
        return try socket.read(exactly: length)
    }

    public var queuedBytes: Int { 0 }

    public func start(
        onMessage: @escaping @Sendable ([UInt8]) -> Void, onDrain: @escaping @Sendable () -> Void,
        onClose: @escaping @Sendable (String) -> Void
    ) {
        guard !started.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let thread = Thread { [self] in
            let reason = readLoop(onMessage)
            socket.close()
            sender.withLock { $0.closed = true }
            onClose(reason)
        }
        thread.name = "trellis.link.\(remoteAddress)"
        thread.start()
    }

    private func readLoop(_ onMessage: @Sendable ([UInt8]) -> Void) -> String {
        var buffer: [UInt8] = []
        var count = 0
        while true {
            let plaintext: [UInt8]
            do {
                let frame = try Self.readFrame(socket)
                plaintext = try receiver.withLock { transport in try transport.decrypt(frame) }
            } catch let error as NoiseError {
                return "\(error)"
            } catch {
                return "\(error)"
            }
            count += 1
            if count % Self.rekeyInterval == 0 { receiver.withLock { $0.rekeyReceive() } }
            if plaintext.isEmpty { return "peer closed the connection" }
            buffer += plaintext
            // Deliver every whole application message in the buffer.
            var offset = 0
            while buffer.count - offset >= 4 {
                let length =
                    Int(buffer[offset]) << 24 | Int(buffer[offset + 1]) << 16 | Int(buffer[offset + 2]) << 8
                    | Int(buffer[offset + 3])
                guard length <= Self.maxMessageBytes else {
                    return "peer sent a \(length)-byte message, above the \(Self.maxMessageBytes)-byte limit"
                }
                guard buffer.count - offset - 4 >= length else { break }
                onMessage(Array(buffer[(offset + 4)..<(offset + 4 + length)]))
                offset += 4 + length
            }
            if offset > 0 { buffer.removeFirst(offset) }
        }
    }

    /// Sends one application message, split into transport messages.
    ///
    /// - Throws: ``LinkError/closed`` after close, ``LinkError/messageTooLarge(_:)``, or I/O errors.
    @discardableResult
    public func send(_ message: [UInt8]) throws -> Int {
        guard message.count <= Self.maxMessageBytes else { throw LinkError.messageTooLarge(message.count) }
        var stream = [
            UInt8(truncatingIfNeeded: message.count >> 24), UInt8(truncatingIfNeeded: message.count >> 16),
            UInt8(truncatingIfNeeded: message.count >> 8), UInt8(truncatingIfNeeded: message.count),
        ]
        stream += message
        try sender.withLock { s in
            guard !s.closed else { throw LinkError.closed }
            var offset = 0
            var out: [UInt8] = []
            out.reserveCapacity(stream.count + (stream.count / NoiseTransport.maxPlaintextLength + 1) * 18)
            while offset < stream.count {
                let end = min(stream.count, offset + NoiseTransport.maxPlaintextLength)
                let ciphertext = try s.transport.encrypt(Array(stream[offset..<end]))
                out.append(UInt8(ciphertext.count >> 8))
                out.append(UInt8(ciphertext.count & 0xFF))
                out += ciphertext
                offset = end
                s.count += 1
                if s.count % Self.rekeyInterval == 0 { s.transport.rekeySend() }
            }
            try socket.write(out)
        }
        return 0
    }

    /// Sends the authenticated close (an empty transport message) and shuts the socket down.
    public func close() {
        sender.withLock { s in
            guard !s.closed else { return }
            s.closed = true
            if let ciphertext = try? s.transport.encrypt([]) {
                try? socket.write([UInt8(ciphertext.count >> 8), UInt8(ciphertext.count & 0xFF)] + ciphertext)
            }
        }
        socket.close()
    }
}

/// Errors of a ``SecureLink`` beyond socket and Noise errors.
public enum LinkError: Error, Sendable, CustomStringConvertible {
    case closed
    case messageTooLarge(Int)
    case notAdmitted

    public var description: String {
        switch self {
        case .closed: return "the link is closed"
        case .messageTooLarge(let n):
            return "message of \(n) bytes is above the \(SecureLink.maxMessageBytes)-byte limit"
        case .notAdmitted: return "the peer's key is not on the allowlist"
        }
    }
}
