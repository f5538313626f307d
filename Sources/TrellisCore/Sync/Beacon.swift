/// The plaintext of one LAN discovery beacon (docs/PROTOCOL.md §5): who sends it, where its TCP
/// listener is, and which log and collections it holds. Sealed by `BeaconSeal` (TrellisCrypto)
/// before it travels; this type only encodes and decodes the 76 bytes inside.
///
/// Layout, big-endian: protocol version (2), peer key (32), TCP port (2), epoch (16),
/// collections digest (8), boot nonce (8), counter (8).
public struct Beacon: Sendable, Equatable, Hashable {
    /// The sender's wire protocol version (``WireMessage/protocolVersion``); any value decodes, so
    /// a peer of another version is shown as incompatible rather than dropped.
    public var protocolVersion: UInt16
    /// The sender's static public key (32 bytes, never all zero).
    public var peerKey: [UInt8]
    /// The sender's TCP listening port; 0 when it does not listen (it is then never dialed).
    public var port: UInt16
    /// The epoch of the sender's change log (16 bytes).
    public var epoch: [UInt8]
    /// The first 8 bytes of SHA-256 over the sender's sorted subscribed collection names, each
    /// followed by a 0 byte.
    public var collectionsDigest: [UInt8]
    /// Random per start of the sender's node: with ``counter``, the receiver's replay window.
    public var bootNonce: UInt64
    /// Increases with every beacon the sender sends in one boot (from 1).
    public var counter: UInt64

    /// Length of the encoded plaintext, in bytes.
    public static let encodedLength = 2 + 32 + 2 + 16 + 8 + 8 + 8
    /// Length of a peer key, an epoch and a collections digest, in bytes.
    public static let peerKeyLength = 32
    public static let epochLength = 16
    public static let digestLength = 8

    /// - Precondition: `peerKey`, `epoch` and `collectionsDigest` have their documented lengths.
    public init(
        protocolVersion: UInt16, peerKey: [UInt8], port: UInt16, epoch: [UInt8], collectionsDigest: [UInt8],
        bootNonce: UInt64, counter: UInt64
    ) {
        precondition(peerKey.count == Self.peerKeyLength, "a beacon's peer key is 32 bytes")
        precondition(epoch.count == Self.epochLength, "a beacon's epoch is 16 bytes")
        precondition(collectionsDigest.count == Self.digestLength, "a beacon's collections digest is 8 bytes")
        self.protocolVersion = protocolVersion
        self.peerKey = peerKey
        self.port = port
        self.epoch = epoch
        self.collectionsDigest = collectionsDigest
        self.bootNonce = bootNonce
        self.counter = counter
    }

    /// The 76-byte plaintext.
    public func encoded() -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(Self.encodedLength)
        Self.append(UInt64(protocolVersion), bytes: 2, to: &out)
        out += peerKey
        Self.append(UInt64(port), bytes: 2, to: &out)
        out += epoch
        out += collectionsDigest
        Self.append(bootNonce, bytes: 8, to: &out)
        Self.append(counter, bytes: 8, to: &out)
        return out
    }

    /// Decodes a plaintext, checking every field.
    ///
    /// - Throws: ``BeaconError`` naming the problem: wrong length, an all-zero peer key, a zero
    ///   counter.
    public init(decoding bytes: [UInt8]) throws(BeaconError) {
        guard bytes.count == Self.encodedLength else {
            throw BeaconError("beacon plaintext is \(bytes.count) bytes, not \(Self.encodedLength)")
        }
        var offset = 0
        func take(_ n: Int) -> [UInt8] {
            defer { offset += n }
            return Array(bytes[offset..<offset + n])
        }
        func number(_ n: Int) -> UInt64 { take(n).reduce(0) { $0 << 8 | UInt64($1) } }
        let version = UInt16(number(2))
        let key = take(Self.peerKeyLength)
        let port = UInt16(number(2))
        let epoch = take(Self.epochLength)
        let digest = take(Self.digestLength)
        let boot = number(8)
        let counter = number(8)
        guard key.contains(where: { $0 != 0 }) else { throw BeaconError("beacon names an all-zero peer key") }
        guard counter > 0 else { throw BeaconError("beacon counter is 0 (counters start at 1)") }
        self.init(
            protocolVersion: version, peerKey: key, port: port, epoch: epoch, collectionsDigest: digest,
            bootNonce: boot, counter: counter)
    }

    private static func append(_ value: UInt64, bytes: Int, to out: inout [UInt8]) {
        for i in (0..<bytes).reversed() { out.append(UInt8(truncatingIfNeeded: value >> (8 * UInt64(i)))) }
    }
}

/// A beacon that cannot be used: malformed, not sealed with this mesh's key, or replayed.
public struct BeaconError: Error, Sendable, Equatable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}
