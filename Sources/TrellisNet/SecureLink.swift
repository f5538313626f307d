import Dispatch
import Foundation
internal import Glibc
import Synchronization
import TrellisCore
public import TrellisCrypto

/// A ``MessageLink`` over TCP, encrypted with `Noise_XXpsk0_25519_ChaChaPoly_SHA256`.
///
/// Wire format (docs/PROTOCOL.md §1):
/// - Every Noise message (handshake or transport) is framed as a 2-byte big-endian length and the
///   message (at most 65535 bytes, Noise spec rev 34 §3).
/// - The handshake is XXpsk0 (``LinkHandshake``) with prologue ``prologue`` and psk = the mesh
///   key; the dialer is the initiator. Handshake payloads are empty.
/// - After the handshake the transport plaintexts form one byte stream carrying application
///   messages, each a 4-byte big-endian length and that many bytes (at most
///   ``LinkLimits/maxMessageBytes``); one application message may span many transport messages
///   and one transport message may carry many application messages.
/// - A transport message with an empty plaintext is the authenticated close.
/// - A transport message whose plaintext is exactly `FF FF FF FF`, where a message's length prefix
///   would start, is the rekey marker: the sender rekeys (`Rekey()`, §11.3) after it, the receiver
///   after reading it. A sender sends one after ``rekeyInterval`` transport messages or
///   ``rekeyTime`` under one key, whichever comes first, at the next message boundary.
/// - Any transport message that fails to authenticate, a frame cut short, or a broken framing rule
///   ends the link; ``closeReason`` says which (tampered, replayed, reordered, truncated,
///   malformed), as it tells an authenticated close from a bare TCP FIN or RST.
///
/// Threads: each started link has a reader thread, which owns the receiving cipher state and runs
/// `onMessage`, and a writer thread, which owns the sending cipher state and drains the outbound
/// queue; ``send(_:)`` only appends to that queue. The writer never waits on the socket once the
/// link is closing, and ``close()`` shuts the socket down at once when the writer is waiting for
/// the peer, so a peer that stops reading can hold neither a caller of ``send(_:)`` nor one of
/// ``close()``.
public final class SecureLink: MessageLink {
    /// Bytes mixed into the handshake: the protocol and its version.
    public static let prologue = Array("trellis/3".utf8)
    /// Largest application message, bytes (``LinkLimits/maxMessageBytes``).
    public static let maxMessageBytes = LinkLimits.maxMessageBytes
    /// Transport messages a sender sends under one key before it rekeys (2^20).
    public static let rekeyInterval = 1 << 20
    /// Time a sender uses one key before it rekeys: 10 minutes.
    public static let rekeyTime: Duration = .seconds(600)
    /// Bytes the reader asks the socket for at once: one full transport message and its length.
    static let readChunk = 65537

    public let remotePeerKey: [UInt8]
    public let isInitiator: Bool
    public let remoteAddress: String
    /// The Noise handshake hash (channel binding).
    public let handshakeHash: [UInt8]
    /// The first 8 bytes of ``handshakeHash``, big-endian: both ends hold it, and no other
    /// connection has it (every handshake mixes in fresh ephemeral keys).
    public var channelNonce: UInt64? {
        handshakeHash.count >= 8 ? handshakeHash.prefix(8).reduce(0) { $0 << 8 | UInt64($1) } : nil
    }
    /// The device name the peer advertised in its handshake payload (``HandshakePayload``), or
    /// `nil` when it advertised none.
    public let remoteDeviceName: String?

    /// The connection (internal for tests that write raw frames).
    let socket: TCPSocket
    /// The two halves of the transport until ``start(onMessage:onDrain:onClose:)`` hands each to
    /// its thread (internal for tests that take the sender to forge traffic).
    let halves: Mutex<(sender: TransportSender, receiver: TransportReceiver)?>
    /// Signalled when the writer waits for messages (`writerIdle`) and something arrives.
    private let writerWakeup = DispatchSemaphore(value: 0)

    private struct Shared {
        /// Messages not yet taken by the writer.
        var queue: [[UInt8]] = []
        /// Bytes queued and not yet written (4-byte prefixes included).
        var queued = 0
        var drainArmed = false
        var started = false
        /// Set by ``close()`` or when a thread ends: `send` throws, the writer stops waiting.
        var closing = false
        /// The writer is waiting on `writerWakeup` for messages.
        var writerIdle = false
        /// The writer is waiting for the socket to take more bytes.
        var writerWaiting = false
        /// Why the link ended (the first reason wins).
        var reason: String?
        /// The kind of ``reason``.
        var kind: LinkCloseReason?
        /// `onClose` has been called (``closeReason`` is final).
        var reported = false
        /// Threads still running; the last one calls `onClose`.
        var running = 0
        var onDrain: (@Sendable () -> Void)?
        var onClose: (@Sendable (String) -> Void)?
    }
    private let shared = Mutex(Shared())
    /// This link's share of the node's inbound budget, once ``useInboundBudget(_:)`` opened it.
    private let inbound = Mutex<InboundBudget.Account?>(nil)
    /// Runs while a message is arriving, not yet whole (``onPartialMessage(_:)``).
    private let partialMessage = Mutex<(@Sendable () -> Void)?>(nil)
    /// Rekeys this side's sender has done (read by tests and benchmarks).
    let sentRekeys = Atomic<Int>(0)
    /// Rekeys this side's receiver has done, one per marker received.
    let receivedRekeys = Atomic<Int>(0)
    /// The most transport messages this side sent under one key before a rekey (marker included).
    let longestSendRun = Atomic<Int>(0)

    private init(
        socket: TCPSocket, transport: NoiseTransport, initiator: Bool, address: String, rekeyInterval: Int,
        remoteDeviceName: String?
    ) {
        self.socket = socket
        self.remoteDeviceName = remoteDeviceName
        self.remotePeerKey = transport.remoteStaticPublicKey
        self.handshakeHash = transport.handshakeHash
        self.isInitiator = initiator
        self.remoteAddress = address
        self.halves = Mutex(
            (
                TransportSender(
                    transport.sender, policy: RekeyPolicy(messages: rekeyInterval, interval: Self.rekeyTime)),
                TransportReceiver(transport.receiver)
            ))
    }

    /// Makes this side rekey sooner than ``rekeyInterval`` and ``rekeyTime`` (tests and
    /// benchmarks; the peer follows the markers whatever the schedule). Only before
    /// ``start(onMessage:onDrain:onClose:)``; later calls do nothing.
    ///
    /// - Parameters:
    ///   - messages: transport messages under one key, at least 1 (clamped to ``rekeyInterval``).
    ///   - time: time under one key (clamped to ``rekeyTime``).
    public func rekeySooner(messages: Int = rekeyInterval, time: Duration = rekeyTime) {
        let policy = RekeyPolicy(
            messages: max(1, min(messages, Self.rekeyInterval)), interval: min(time, Self.rekeyTime))
        halves.withLock { $0?.sender.policy = policy }
    }

    /// Counts this link's inbound bytes against a node-wide budget (``InboundBudget``): the
    /// message being assembled and delivered messages until ``consumed(_:)``. When the node's
    /// total would go above the budget's limit, the link holding the most is closed (kind
    /// ``LinkCloseReason/overLimit``). Only before ``start(onMessage:onDrain:onClose:)``; later
    /// calls, and calls after the first, do nothing.
    public func useInboundBudget(_ budget: InboundBudget) {
        let started = shared.withLock { $0.started }
        guard !started else { return }
        inbound.withLock { account in
            guard account == nil else { return }
            account = budget.open { [weak self] reason in self?.end(.overLimit, reason) }
        }
    }

    public func consumed(_ byteCount: Int) {
        inbound.withLock { $0 }?.consumed(4 + byteCount)
    }

    /// Why the link ended, once `onClose` has run.
    public var closeReason: LinkCloseReason? {
        shared.withLock { $0.reported ? $0.kind : nil }
    }

    /// Runs the handshake (`Noise_XXpsk0`, ``LinkHandshake``) on a connected socket with one mesh
    /// key.
    ///
    /// On failure the socket is shut down and nothing else keeps it: its descriptor is released as
    /// soon as the caller drops it.
    ///
    /// - Parameters:
    ///   - socket: a connected socket; the link owns it from now on.
    ///   - initiator: `true` on the dialing side.
    ///   - identity: this node's static key pair.
    ///   - meshKey: the 32-byte mesh key (the psk).
    ///   - address: the peer's address for logs (``remoteAddress``).
    ///   - admit: decides whether the authenticated remote peer key may join (an allowlist).
    ///   - timeout: seconds the whole handshake may take (a peer dripping one byte at a time cannot
    ///     extend it).
    /// - Returns: a link, not yet started.
    /// - Throws: ``HandshakeError`` when the peer holds another mesh key, speaks an older protocol
    ///   or is too slow, ``SocketError`` for I/O, ``NoiseError`` when the peer sends malformed
    ///   handshake messages, ``LinkError/notAdmitted`` when `admit` refuses the peer.
    public static func handshake(
        socket: TCPSocket, initiator: Bool, identity: KeyPair, meshKey: SecretBytes, address: String,
        admit: ([UInt8]) -> Bool = { _ in true }, timeout: Int = 10
    ) throws -> SecureLink {
        try handshake(
            socket: socket, initiator: initiator, identity: identity, meshKeys: [meshKey], address: address,
            admit: admit, timeout: .seconds(timeout), firstMessageTimeout: .seconds(timeout))
    }

    /// Runs the handshake (`Noise_XXpsk0`, ``LinkHandshake``) on a connected socket: as initiator
    /// with one mesh key, as responder accepting any of several (a mesh-key changeover).
    ///
    /// On failure the socket is shut down and nothing else keeps it: its descriptor is released as
    /// soon as the caller drops it.
    ///
    /// - Parameters:
    ///   - socket: a connected socket; the link owns it from now on.
    ///   - initiator: `true` on the dialing side.
    ///   - identity: this node's static key pair.
    ///   - meshKeys: initiator: exactly one mesh key (32 bytes); responder: every mesh key accepted,
    ///     tried in order on message 1 (at most a few: each costs two HKDFs and one AEAD tag check).
    ///   - address: the peer's address for logs (``remoteAddress``).
    ///   - admit: decides whether the authenticated remote peer key may join (an allowlist).
    ///   - timeout: how long the whole handshake may take, from now.
    ///   - firstMessageTimeout: responder: how long message 1 may take to arrive, from now (a
    ///     stranger holding the connection idle is cut then).
    ///   - onFirstMessage: responder: called once message 1 proved a mesh key, with that key's index
    ///     in `meshKeys`, before this side does any DH with its static key.
    ///   - deviceName: the name this node advertises to the peer inside the handshake (a valid
    ///     ``DeviceName``), or `nil` for none; the peer's is ``remoteDeviceName``.
    /// - Returns: a link, not yet started.
    /// - Throws: as ``handshake(socket:initiator:identity:meshKey:address:admit:timeout:)``, and
    ///   ``DeviceNameError`` when the peer's handshake payload is malformed.
    public static func handshake(
        socket: TCPSocket, initiator: Bool, identity: KeyPair, meshKeys: [SecretBytes], address: String,
        admit: ([UInt8]) -> Bool = { _ in true }, timeout: Duration, firstMessageTimeout: Duration,
        deviceName: String? = nil, onFirstMessage: (Int) -> Void = { _ in }
    ) throws -> SecureLink {
        try handshake(
            socket: socket, initiator: initiator, identity: identity, meshKeys: meshKeys, address: address,
            admit: admit, timeout: timeout, firstMessageTimeout: firstMessageTimeout, onFirstMessage: onFirstMessage,
            rekeyInterval: rekeyInterval, deviceName: deviceName)
    }

    /// ``handshake(socket:initiator:identity:meshKey:address:admit:timeout:)`` with another rekey
    /// interval (tests; both ends must use the same).
    static func handshake(
        socket: TCPSocket, initiator: Bool, identity: KeyPair, meshKey: SecretBytes, address: String,
        admit: ([UInt8]) -> Bool, timeout: Int, rekeyInterval: Int
    ) throws -> SecureLink {
        try handshake(
            socket: socket, initiator: initiator, identity: identity, meshKeys: [meshKey], address: address,
            admit: admit, timeout: .seconds(timeout), firstMessageTimeout: .seconds(timeout), onFirstMessage: { _ in },
            rekeyInterval: rekeyInterval)
    }

    static func handshake(
        socket: TCPSocket, initiator: Bool, identity: KeyPair, meshKeys: [SecretBytes], address: String,
        admit: ([UInt8]) -> Bool, timeout: Duration, firstMessageTimeout: Duration, onFirstMessage: (Int) -> Void,
        rekeyInterval: Int, deviceName: String? = nil
    ) throws -> SecureLink {
        // No timer holds the socket: every read and write polls against these deadlines, so a
        // connection that fails or finishes releases its descriptor at once.
        let start = ContinuousClock.now
        do {
            let (transport, payload) = try LinkHandshake.run(
                socket: socket, initiator: initiator, identity: identity, meshKeys: meshKeys, prologue: prologue,
                firstMessageDeadline: start + firstMessageTimeout, deadline: start + timeout,
                onFirstMessage: onFirstMessage, payload: HandshakePayload.encode(deviceName: deviceName))
            let name = try HandshakePayload.decodeDeviceName(payload)
            guard admit(transport.remoteStaticPublicKey) else { throw LinkError.notAdmitted }
            return SecureLink(
                socket: socket, transport: transport, initiator: initiator, address: address,
                rekeyInterval: rekeyInterval, remoteDeviceName: name)
        } catch let error as SocketError where error.code == ETIMEDOUT && error.call == "poll" {
            socket.close()
            throw HandshakeError(.timeout, "handshake not finished within \(timeout)")
        } catch {
            socket.close()
            throw error
        }
    }

    // MARK: MessageLink

    public func onPartialMessage(_ handler: @escaping @Sendable () -> Void) {
        partialMessage.withLock { $0 = handler }
    }

    public func start(
        onMessage: @escaping @Sendable ([UInt8]) -> Void,
        onDrain: @escaping @Sendable () -> Void,
        onClose: @escaping @Sendable (String) -> Void
    ) {
        let first = shared.withLock { s in
            guard !s.started else { return false }
            s.started = true
            s.running = 2
            s.onDrain = onDrain
            s.onClose = onClose
            return true
        }
        guard first,
            let (sender, receiver) = halves.withLock({ h in
                defer { h = nil }
                return h
            }).map({ ($0.sender, $0.receiver) })
        else { return }
        // Named from inside, with `Thread.nameCurrent` (Foundation's names do not reliably reach
        // Linux, which shows these in top -H, perf and /proc/PID/task/TID/comm).
        let reader = Thread { [self] in
            Thread.nameCurrent("trellis.read")
            var receiver = receiver
            let (kind, reason) = readLoop(&receiver, onMessage)
            end(kind, reason)
            threadFinished()
        }
        let writer = Thread { [self] in
            Thread.nameCurrent("trellis.write")
            var sender = sender
            if let (kind, reason) = writeLoop(&sender) { end(kind, reason) }
            threadFinished()
        }
        reader.start()
        writer.start()
    }

    @discardableResult
    public func send(_ message: [UInt8]) throws -> Int {
        guard message.count <= LinkLimits.maxMessageBytes else { throw LinkError.messageTooLarge(message.count) }
        let (queued, wake) = try shared.withLock { s throws(LinkError) in
            guard !s.closing else { throw LinkError.closed }
            s.queue.append(message)
            s.queued += 4 + message.count
            if s.queued >= highWater { s.drainArmed = true }
            defer { s.writerIdle = false }
            return (s.queued, s.writerIdle)
        }
        if wake { writerWakeup.signal() }
        return queued
    }

    public var queuedBytes: Int { shared.withLock { $0.queued } }

    public func close() {
        let (shutdownNow, wake) = shared.withLock { s in
            guard !s.closing else { return (false, false) }
            s.closing = true
            if s.reason == nil {
                s.reason = "closed by this node"
                s.kind = .closedHere
            }
            defer { s.writerIdle = false }
            // A writer waiting for the peer would wait for good: shut down now. A free writer
            // sends what the socket takes at once, then the authenticated close, then shuts down.
            return (s.writerWaiting || !s.started, s.writerIdle)
        }
        if shutdownNow { socket.close() }
        if wake { writerWakeup.signal() }
        inbound.withLock { $0 }?.close()
    }

    // MARK: Threads

    /// Records why the link ended (unless a reason is already known), shuts the socket down and
    /// wakes the writer.
    private func end(_ kind: LinkCloseReason, _ reason: String) {
        let wake = shared.withLock { s in
            if s.reason == nil {
                s.reason = reason
                s.kind = kind
            }
            s.closing = true
            defer { s.writerIdle = false }
            return s.writerIdle
        }
        socket.close()
        if wake { writerWakeup.signal() }
        inbound.withLock { $0 }?.close()
    }

    /// Called by each thread as it ends; the last one runs `onClose`.
    private func threadFinished() {
        let close = shared.withLock { s -> (@Sendable (String) -> Void, String)? in
            s.running -= 1
            guard s.running == 0, let onClose = s.onClose else { return nil }
            s.reported = true
            s.onClose = nil
            s.onDrain = nil
            return (onClose, s.reason ?? "closed")
        }
        if let (onClose, reason) = close { onClose(reason) }
    }

    private struct PeerClosed: Error {}

    /// A transport message the receiver refuses, and why.
    private struct Refused: Error {
        var kind: LinkCloseReason
        var detail: String
    }

    /// Reads frames, decrypts them and delivers whole messages until the stream ends.
    ///
    /// - Returns: why it ended, by kind and in words.
    private func readLoop(
        _ receiver: inout TransportReceiver, _ onMessage: @Sendable ([UInt8]) -> Void
    ) -> (LinkCloseReason, String) {
        var frames = FrameDecoder()
        var assembler = MessageAssembler(limit: LinkLimits.maxMessageBytes)
        let account = inbound.withLock { $0 }
        // With a budget, a delivered message counts until the receiver consumed it, and the
        // reader waits while this link's unconsumed messages hold too much.
        func deliver(_ message: [UInt8]) {
            account?.delivered(4 + message.count)
            onMessage(message)
            account?.waitForRoom()
        }
        var buffer = [UInt8](repeating: 0, count: Self.readChunk)
        let partial = partialMessage.withLock { $0 }
        var lastPartial: UInt64 = 0
        while true {
            // A message still arriving (a large one on a slow link): tell the receiver, about once
            // a second, that the peer is alive.
            if let partial, frames.bufferedBytes > 0 || !assembler.isAtMessageBoundary {
                let now = DispatchTime.now().uptimeNanoseconds
                if now &- lastPartial >= 1_000_000_000 {
                    lastPartial = now
                    partial()
                }
            }
            let count: Int
            do {
                count = try buffer.withUnsafeMutableBytes { try socket.receive(into: $0) }
            } catch {
                if frames.bufferedBytes > 0 {
                    return (
                        .truncated,
                        "connection ended inside a frame (\(frames.bufferedBytes) bytes of it read): \(error)"
                    )
                }
                if (error as? SocketError)?.code == ECONNRESET {
                    return (.unauthenticatedClose, "connection reset without an authenticated close")
                }
                return (.failed, "\(error)")
            }
            if count == 0 {
                if frames.bufferedBytes > 0 {
                    return (
                        .truncated,
                        "connection ended inside a frame (\(frames.bufferedBytes) bytes of it read), "
                            + "without an authenticated close"
                    )
                }
                return (.unauthenticatedClose, "connection closed by peer without an authenticated close")
            }
            do {
                try frames.feed(buffer[0..<count]) { (message: [UInt8]) throws(any Error) in
                    let plaintext: [UInt8]
                    do throws(NoiseError) {
                        plaintext = try receiver.open(message)
                    } catch {
                        switch error.code {
                        case .decryptionFailed:
                            let kind = receiver.diagnose(message)
                            throw Refused(
                                kind: kind,
                                detail: "a \(message.count)-byte transport message did not authenticate ("
                                    + (kind == .replayed
                                        ? "a copy of an earlier one" : kind == .reordered ? "out of order" : "altered")
                                    + "); the link is closed")
                        case .badMessageLength, .messageTooLong: throw Refused(kind: .malformed, detail: "\(error)")
                        default: throw Refused(kind: .failed, detail: "\(error)")
                        }
                    }
                    if plaintext.isEmpty { throw PeerClosed() }
                    if assembler.isAtMessageBoundary, plaintext == rekeyMarker {
                        try receiver.rekey()
                        receivedRekeys.add(1, ordering: .relaxed)
                        return
                    }
                    if let reason = account?.grow(by: plaintext.count) {
                        throw Refused(kind: .overLimit, detail: reason)
                    }
                    try assembler.append(plaintext, deliver)
                }
            } catch is PeerClosed {
                return (.peerClosed, "peer closed the connection")
            } catch let refused as Refused {
                return (refused.kind, refused.detail)
            } catch let error as FramingError {
                return (.malformed, "\(error)")
            } catch {
                return (.failed, "\(error)")
            }
        }
    }

    /// The kind of a socket error the writer met: a reset or broken pipe is a connection the peer
    /// (or someone on the path) ended without the authenticated close.
    private static func kind(ofWriteError error: any Error) -> LinkCloseReason {
        guard let error = error as? SocketError else { return .failed }
        return error.code == ECONNRESET || error.code == EPIPE ? .unauthenticatedClose : .failed
    }

    /// Encrypts and writes queued messages until the link closes.
    ///
    /// - Returns: the error that ended the link, or nil when it ended because it was closing.
    private func writeLoop(_ sender: inout TransportSender) -> (LinkCloseReason, String)? {
        var stream = OutboundStream()
        while true {
            if stream.isAtMessageBoundary, sender.rekeyDue(now: .now) {
                do {
                    guard try write(sender.sealRekey(now: .now)) else {
                        socket.close()
                        return nil
                    }
                } catch {
                    return (Self.kind(ofWriteError: error), "\(error)")
                }
                sentRekeys.add(1, ordering: .relaxed)
                longestSendRun.store(sender.longestRun, ordering: .relaxed)
            }
            // When a rekey is due, the chunk ends with the message it is in, so the marker can follow.
            let chunk = stream.nextChunk(endingAtBoundary: sender.rekeyDue(now: .now)) {
                shared.withLock { s in
                    defer { s.queue = [] }
                    return s.queue
                }
            }
            if chunk.isEmpty {
                enum Next { case more, wait, finish }
                let next = shared.withLock { s -> Next in
                    if !s.queue.isEmpty { return .more }
                    if s.closing { return .finish }
                    s.writerIdle = true
                    return .wait
                }
                switch next {
                case .more: continue
                case .wait:
                    writerWakeup.wait()
                    continue
                case .finish:
                    // The authenticated close, if the socket takes it at once; then shut down.
                    if let frame = try? sender.seal([]) {
                        _ = try? frame.withUnsafeBytes { bytes throws(SocketError) in
                            try socket.sendWithoutWaiting(bytes)
                        }
                    }
                    socket.close()
                    return nil
                }
            }
            let frame: [UInt8]
            do {
                frame = try sender.seal(chunk)
            } catch {
                return (.failed, "\(error)")
            }
            do {
                guard try write(frame) else {
                    socket.close()
                    return nil
                }
            } catch {
                return (Self.kind(ofWriteError: error), "\(error)")
            }
            let drain = shared.withLock { s -> (@Sendable () -> Void)? in
                s.queued -= chunk.count
                guard s.drainArmed, s.queued <= lowWater, !s.closing else { return nil }
                s.drainArmed = false
                return s.onDrain
            }
            drain?()
        }
    }

    /// Writes one whole frame, waiting for the socket as long as the link is not closing.
    ///
    /// - Returns: false when the link is closing and the socket would make it wait.
    /// - Throws: ``SocketError`` when the connection failed or was shut down.
    private func write(_ frame: [UInt8]) throws -> Bool {
        var offset = 0
        while offset < frame.count {
            let n = try frame.withUnsafeBytes { bytes in
                try socket.sendWithoutWaiting(UnsafeRawBufferPointer(rebasing: bytes[offset...]))
            }
            if n > 0 {
                offset += n
                continue
            }
            let wait = shared.withLock { s in
                guard !s.closing else { return false }
                s.writerWaiting = true
                return true
            }
            guard wait else { return false }
            socket.waitUntilWritable()
            shared.withLock { $0.writerWaiting = false }
        }
        return true
    }
}

/// The writer's view of the outbound byte stream: messages taken from the queue, cut into
/// transport plaintexts of at most `NoiseTransport.maxPlaintextLength` bytes, each message preceded
/// by its 4-byte big-endian length.
struct OutboundStream {
    private var messages: [[UInt8]] = []
    private var next = 0
    private var current: [UInt8]?
    /// Position in the current message's stream: 0..<4 inside the prefix, then 4 + message offset.
    private var offset = 0

    /// Whether the next chunk starts with a message's length prefix (where a rekey marker may go).
    var isAtMessageBoundary: Bool { current == nil }

    /// The next transport plaintext: as many queued bytes as fit, spanning messages; empty when
    /// nothing is queued.
    ///
    /// - Parameters:
    ///   - endingAtBoundary: end the chunk where a message ends rather than start the next one
    ///     in it (a rekey marker is due).
    ///   - refill: takes the messages queued since the last call (called only when the messages
    ///     taken so far are used up).
    mutating func nextChunk(endingAtBoundary: Bool = false, refill: () -> [[UInt8]]) -> [UInt8] {
        let capacity = NoiseTransport.maxPlaintextLength
        var chunk: [UInt8] = []
        while chunk.count < capacity {
            if current == nil {
                if endingAtBoundary && !chunk.isEmpty { break }
                if next == messages.count {
                    messages = refill()
                    next = 0
                    if messages.isEmpty { break }
                }
                current = messages[next]
                messages[next] = []
                next += 1
                offset = 0
                if chunk.isEmpty { chunk.reserveCapacity(min(capacity, 4 + current!.count)) }
            }
            let message = current!
            let room = capacity - chunk.count
            if offset < 4 {
                let count = UInt32(message.count)
                let prefix = [
                    UInt8(count >> 24), UInt8((count >> 16) & 0xFF), UInt8((count >> 8) & 0xFF), UInt8(count & 0xFF),
                ]
                let take = min(4 - offset, room)
                chunk += prefix[offset..<(offset + take)]
                offset += take
            } else {
                let start = offset - 4
                let take = min(message.count - start, room)
                chunk += message[start..<(start + take)]
                offset += take
            }
            if offset == 4 + message.count { current = nil }
        }
        return chunk
    }
}
