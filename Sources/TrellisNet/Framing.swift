import TrellisCrypto

/// Splits a TCP byte stream into Noise messages, each framed as a 2-byte big-endian length and
/// that many bytes (docs/PROTOCOL.md §1; Noise spec rev 34 §3 caps a message at 65535 bytes).
///
/// Feed it whatever each read returned, one byte or many frames at a time; it hands out every
/// complete frame in order and keeps only the unfinished tail (at most 65536 bytes).
public struct FrameDecoder: Sendable {
    /// Bytes of a frame not yet complete (its header included).
    private var partial: [UInt8] = []

    /// A decoder at the start of a stream.
    public init() {}

    /// Bytes held for a frame not yet complete.
    public var bufferedBytes: Int { partial.count }

    /// Consumes `bytes` and calls `body` with each complete frame's message (header stripped).
    ///
    /// - Parameters:
    ///   - bytes: the next bytes of the stream.
    ///   - body: receives each message, 0 to 65535 bytes; when it throws, decoding stops and the
    ///     error propagates (the decoder should then be discarded).
    /// - Complexity: O(`bytes.count`) plus O(message length) per frame.
    public mutating func feed<E: Error>(
        _ bytes: ArraySlice<UInt8>, _ body: ([UInt8]) throws(E) -> Void
    ) throws(E) {
        var index = bytes.startIndex
        // Finish a frame begun by earlier reads.
        if !partial.isEmpty {
            if partial.count < 2 {
                let take = min(2 - partial.count, bytes.endIndex - index)
                partial += bytes[index..<(index + take)]
                index += take
                if partial.count < 2 { return }
            }
            let total = 2 + (Int(partial[0]) << 8 | Int(partial[1]))
            let take = min(total - partial.count, bytes.endIndex - index)
            partial += bytes[index..<(index + take)]
            index += take
            guard partial.count == total else { return }
            let message = Array(partial[2...])
            partial = []
            try body(message)
        }
        // Whole frames straight from the read, without copying them into `partial`.
        while bytes.endIndex - index >= 2 {
            let length = Int(bytes[index]) << 8 | Int(bytes[index + 1])
            guard bytes.endIndex - index - 2 >= length else { break }
            try body(Array(bytes[(index + 2)..<(index + 2 + length)]))
            index += 2 + length
        }
        if index < bytes.endIndex { partial += bytes[index...] }
    }
}

/// Why a ``MessageAssembler`` stopped.
public struct FramingError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The length the peer announced, bytes.
    public var announced: Int
    /// The largest length allowed, bytes.
    public var limit: Int

    /// The error in words, naming both lengths.
    public var description: String {
        "peer announced a \(announced)-byte message, above the \(limit)-byte limit"
    }
}

/// Reassembles application messages from the plaintext byte stream of a link: each message is a
/// 4-byte big-endian length and that many bytes (docs/PROTOCOL.md §1). A message may span many
/// transport messages and one transport message may carry many messages.
///
/// Memory is linear in the message being assembled: the buffer is reserved from the announced
/// length (the allocator commits pages only as bytes arrive) and filled by appending; no bytes are
/// moved once stored.
public struct MessageAssembler: Sendable {
    /// The largest message accepted, bytes.
    public let limit: Int
    private var header: [UInt8] = []
    private var expected: Int?
    private var message: [UInt8] = []

    /// An assembler at the start of a stream.
    ///
    /// - Parameter limit: the largest message accepted, bytes (``LinkLimits/maxMessageBytes`` on
    ///   a link).
    public init(limit: Int = LinkLimits.maxMessageBytes) {
        self.limit = limit
    }

    /// Bytes held for the message being assembled (its length prefix included).
    public var bufferedBytes: Int { header.count + message.count }

    /// Whether the next byte appended starts a message's length prefix.
    public var isAtMessageBoundary: Bool { header.isEmpty && expected == nil }

    /// Consumes `bytes` and calls `deliver` with each whole message, in order.
    ///
    /// - Throws: ``FramingError`` when a length prefix is above ``limit`` (the stream is then
    ///   unusable; messages before it were delivered).
    /// - Complexity: O(`bytes.count`).
    public mutating func append(_ bytes: [UInt8], _ deliver: ([UInt8]) -> Void) throws(FramingError) {
        var index = 0
        while index < bytes.count {
            guard let length = expected else {
                let take = min(4 - header.count, bytes.count - index)
                header += bytes[index..<(index + take)]
                index += take
                guard header.count == 4 else { return }
                let length = Int(header[0]) << 24 | Int(header[1]) << 16 | Int(header[2]) << 8 | Int(header[3])
                header.removeAll(keepingCapacity: true)
                guard length <= limit else { throw FramingError(announced: length, limit: limit) }
                if length == 0 {
                    deliver([])
                } else {
                    expected = length
                    message = []
                    message.reserveCapacity(length)
                }
                continue
            }
            let take = min(length - message.count, bytes.count - index)
            message += bytes[index..<(index + take)]
            index += take
            if message.count == length {
                let whole = message
                message = []
                expected = nil
                deliver(whole)
            }
        }
    }
}

/// The rekey marker (docs/PROTOCOL.md §1): a transport message whose whole plaintext is these 4
/// bytes, sent where the next message's length prefix would start. 0xFFFFFFFF is above every
/// message limit, so no message begins with it; after the transport message that carries it, the
/// sender calls `Rekey()` on its sending cipher state and the receiver on its receiving one
/// (Noise spec rev 34 §11.3 leaves the signal to the application).
let rekeyMarker: [UInt8] = [0xFF, 0xFF, 0xFF, 0xFF]

/// When a sender rekeys: after ``messages`` transport messages or ``interval`` under one key,
/// whichever comes first, at the next message boundary.
struct RekeyPolicy: Sendable {
    /// Transport messages sent under one key before a rekey is due.
    var messages: Int
    /// Time under one key before a rekey is due.
    var interval: Duration
}

/// The sending half of a Noise transport on a link: its `CipherState` and the rekey schedule.
/// Owned by one writer; no other copy of the cipher state exists.
struct TransportSender: Sendable {
    private var cipher: CipherState
    private var sinceRekey = 0
    private var keyedAt: ContinuousClock.Instant
    var policy: RekeyPolicy
    /// Rekeys done so far.
    private(set) var rekeys = 0
    /// The most transport messages sealed under one key so far, the rekey marker included.
    private(set) var longestRun = 0

    init(_ cipher: CipherState, policy: RekeyPolicy, now: ContinuousClock.Instant = .now) {
        self.cipher = cipher
        self.policy = policy
        self.keyedAt = now
    }

    /// Whether the policy's count or time has been reached since the last rekey.
    func rekeyDue(now: ContinuousClock.Instant) -> Bool {
        sinceRekey >= policy.messages || now - keyedAt >= policy.interval
    }

    /// Encrypts one transport message and frames it (2-byte length, ciphertext).
    ///
    /// - Parameter plaintext: at most `NoiseTransport.maxPlaintextLength` (65519) bytes; empty is
    ///   the authenticated close.
    /// - Throws: ``NoiseError`` when the nonce is exhausted.
    mutating func seal(_ plaintext: [UInt8]) throws(NoiseError) -> [UInt8] {
        precondition(plaintext.count <= NoiseTransport.maxPlaintextLength, "transport plaintext too long")
        let ciphertext = try cipher.encryptWithAd([], plaintext)
        sinceRekey += 1
        var frame: [UInt8] = []
        frame.reserveCapacity(2 + ciphertext.count)
        frame.append(UInt8(ciphertext.count >> 8))
        frame.append(UInt8(ciphertext.count & 0xFF))
        frame += ciphertext
        return frame
    }

    /// Seals the rekey marker, then rekeys: the frame returned is the last one under the old key.
    /// Call only at a message boundary of the outbound stream.
    ///
    /// - Throws: ``NoiseError`` when the nonce is exhausted.
    mutating func sealRekey(now: ContinuousClock.Instant) throws(NoiseError) -> [UInt8] {
        let frame = try seal(rekeyMarker)
        longestRun = max(longestRun, sinceRekey)
        try cipher.rekey()
        sinceRekey = 0
        keyedAt = now
        rekeys += 1
        return frame
    }
}

/// The receiving half of a Noise transport on a link, mirroring ``TransportSender``. Owned by one
/// reader.
struct TransportReceiver: Sendable {
    private var cipher: CipherState

    /// Nonces before the current one tried when a message fails (replay diagnosis).
    static let replayWindow: UInt64 = 64
    /// Nonces after the current one tried when a message fails (reordering diagnosis).
    static let reorderWindow: UInt64 = 8

    init(_ cipher: CipherState) {
        self.cipher = cipher
    }

    /// Authenticates and decrypts one transport message (the frame's content, length stripped).
    ///
    /// - Throws: ``NoiseError`` when it does not authenticate or is shorter than the tag.
    mutating func open(_ message: [UInt8]) throws(NoiseError) -> [UInt8] {
        try cipher.decryptWithAd([], message)
    }

    /// Rekeys after a rekey marker.
    mutating func rekey() throws(NoiseError) {
        try cipher.rekey()
    }

    /// Why `message` failed to authenticate: a copy of one of the last ``replayWindow`` messages
    /// (``LinkCloseReason/replayed``), one of the next ``reorderWindow`` (``LinkCloseReason/reordered``),
    /// or neither (``LinkCloseReason/tampered``). Messages sealed before the last rekey count as
    /// tampered.
    ///
    /// - Complexity: up to ``replayWindow`` + ``reorderWindow`` decryptions of `message`; run
    ///   only on a link that is closing.
    func diagnose(_ message: [UInt8]) -> LinkCloseReason {
        let nonce = cipher.nonce
        for back in 1...Self.replayWindow where back <= nonce {
            if cipher.authenticates([], message, atNonce: nonce - back) { return .replayed }
        }
        for ahead in 1...Self.reorderWindow where nonce < UInt64.max - ahead {
            if cipher.authenticates([], message, atNonce: nonce + ahead) { return .reordered }
        }
        return .tampered
    }
}
