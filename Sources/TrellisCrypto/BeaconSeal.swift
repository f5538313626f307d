internal import CSodium

/// Seals and opens LAN discovery beacons under a key derived from the mesh key, so that a host
/// without the mesh key can neither read a beacon nor forge one (docs/PROTOCOL.md §5).
///
/// A sealed beacon is: the header `"TRLB"` and format version 1 (5 bytes, authenticated as
/// associated data), a random 24-byte nonce, then the plaintext encrypted with
/// XChaCha20-Poly1305 (libsodium `crypto_aead_xchacha20poly1305_ietf`) and its 16-byte tag.
/// The key is BLAKE2b-256 keyed with the mesh key over the ASCII string `"trellis beacon v1"`
/// (libsodium `crypto_generichash`), so it differs from every key of the Noise channel.
public final class BeaconSeal: Sendable {
    private let key: SecretBytes

    /// The header that starts every sealed beacon of format version 1.
    public static let header: [UInt8] = Array("TRLB".utf8) + [1]
    /// The context string the beacon key is derived with.
    public static let context = Array("trellis beacon v1".utf8)
    /// Length of the random nonce, in bytes (read from libsodium).
    public static let nonceLength = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    /// Length of the authentication tag, in bytes (read from libsodium).
    public static let tagLength = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)
    /// Bytes a sealed beacon adds to its plaintext: header, nonce and tag (45).
    public static var overhead: Int { header.count + nonceLength + tagLength }
    /// The largest sealed beacon accepted, in bytes; longer datagrams are refused unread.
    public static let maxSealedLength = 512

    /// Derives the beacon key from the mesh key.
    ///
    /// - Parameter meshKey: the 32-byte mesh key (the Noise psk).
    public init(meshKey: SecretBytes) {
        Sodium.initialize()
        let keyLength = Int(crypto_aead_xchacha20poly1305_ietf_KEYBYTES)
        key = SecretBytes(count: keyLength) { out in
            meshKey.withUnsafeBytes { mesh in
                Self.context.withUnsafeBytes { context in
                    _ = crypto_generichash(
                        out.bytePointer, out.count, context.bytePointer, UInt64(context.count), mesh.bytePointer,
                        mesh.count)
                }
            }
        }
    }

    /// Seals `plaintext` with a fresh random nonce.
    ///
    /// - Returns: the datagram: header, nonce, ciphertext and tag (`plaintext.count + overhead` bytes).
    public func seal(_ plaintext: [UInt8]) -> [UInt8] {
        var nonce = [UInt8](repeating: 0, count: Self.nonceLength)
        nonce.withUnsafeMutableBytes { Sodium.randomBytes(into: $0) }
        return seal(plaintext, nonce: nonce)
    }

    /// Seals `plaintext` with the given nonce (for tests and test vectors; a nonce must never be
    /// used twice with one key).
    ///
    /// - Precondition: `nonce` is ``nonceLength`` bytes.
    public func seal(_ plaintext: [UInt8], nonce: [UInt8]) -> [UInt8] {
        precondition(nonce.count == Self.nonceLength, "a beacon nonce is \(Self.nonceLength) bytes")
        var cipher = [UInt8](repeating: 0, count: plaintext.count + Self.tagLength)
        var cipherLength: UInt64 = 0
        cipher.withUnsafeMutableBytes { c in
            plaintext.withUnsafeBytes { p in
                Self.header.withUnsafeBytes { ad in
                    nonce.withUnsafeBytes { n in
                        key.withUnsafeBytes { k in
                            _ = crypto_aead_xchacha20poly1305_ietf_encrypt(
                                c.bytePointer, &cipherLength, p.bytePointer, UInt64(p.count), ad.bytePointer,
                                UInt64(ad.count), nil, n.bytePointer, k.bytePointer)
                        }
                    }
                }
            }
        }
        return Self.header + nonce + cipher
    }

    /// Opens a sealed beacon.
    ///
    /// - Returns: the plaintext.
    /// - Throws: ``BeaconSealError`` naming the problem: too short or too long, another header
    ///   (not a Trellis beacon, or another format version), or a tag that does not verify (another
    ///   mesh key, or a changed byte).
    public func open(_ datagram: [UInt8]) throws(BeaconSealError) -> [UInt8] {
        guard datagram.count >= Self.overhead else {
            throw .malformed("beacon of \(datagram.count) bytes is shorter than its \(Self.overhead)-byte envelope")
        }
        guard datagram.count <= Self.maxSealedLength else {
            throw .malformed("beacon of \(datagram.count) bytes is longer than \(Self.maxSealedLength)")
        }
        guard datagram.starts(with: Self.header.prefix(4)) else { throw .malformed("not a Trellis beacon") }
        guard datagram[4] == Self.header[4] else {
            throw .malformed("beacon format version \(datagram[4]) is not supported (this node reads 1)")
        }
        let nonce = Array(datagram[Self.header.count..<Self.header.count + Self.nonceLength])
        let cipher = Array(datagram[(Self.header.count + Self.nonceLength)...])
        var plain = [UInt8](repeating: 0, count: cipher.count - Self.tagLength)
        var plainLength: UInt64 = 0
        let rc = plain.withUnsafeMutableBytes { p in
            cipher.withUnsafeBytes { c in
                Self.header.withUnsafeBytes { ad in
                    nonce.withUnsafeBytes { n in
                        key.withUnsafeBytes { k in
                            crypto_aead_xchacha20poly1305_ietf_decrypt(
                                p.bytePointer, &plainLength, nil, c.bytePointer, UInt64(c.count), ad.bytePointer,
                                UInt64(ad.count), n.bytePointer, k.bytePointer)
                        }
                    }
                }
            }
        }
        guard rc == 0 else { throw .unauthenticated }
        return plain
    }
}

/// Why a datagram is not a beacon of this mesh.
public enum BeaconSealError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Not a sealed beacon of a format this node reads.
    case malformed(String)
    /// The tag did not verify: sealed under another mesh key, or changed on the way.
    case unauthenticated

    public var description: String {
        switch self {
        case .malformed(let message): return message
        case .unauthenticated: return "beacon not sealed with this mesh's key (or changed on the way)"
        }
    }
}
