internal import CSodium

/// An X25519 (Curve25519) key pair: the Noise `DH` functions for `25519` (spec rev 34, §12.1).
///
/// The private key is 32 bytes held in ``SecretBytes``; the public key is 32 bytes
/// (`crypto_scalarmult_BYTES`). In Trellis the static public key is the node's *peer key*.
public struct KeyPair: Sendable {
    /// The 32-byte public key, `crypto_scalarmult_base(privateKey)`.
    public let publicKey: [UInt8]
    /// The 32-byte private scalar (clamped by libsodium when used, stored as given).
    public let privateKey: SecretBytes

    /// Length in bytes of X25519 public keys and DH outputs (`crypto_scalarmult_BYTES`, Noise `DHLEN`).
    public static var publicKeyLength: Int { Sizes.dh }
    /// Length in bytes of X25519 private keys (`crypto_scalarmult_SCALARBYTES`).
    public static var privateKeyLength: Int { Sizes.scalar }

    /// Generates a fresh key pair from libsodium's CSPRNG (Noise `GENERATE_KEYPAIR()`, §4.1).
    public static func generate() -> KeyPair {
        while true {
            let secret = SecretBytes.random(count: Sizes.scalar)
            // Derivation only fails for a scalar that clamps to a zero result, which a random scalar
            // practically never does; draw again rather than fail.
            if let pair = try? KeyPair(privateKey: secret) { return pair }
        }
    }

    /// Derives the public key from a private key with `crypto_scalarmult_base`.
    ///
    /// - Parameter privateKey: 32 bytes.
    /// - Throws: ``NoiseError/Code/invalidKey`` if the key is not 32 bytes or derives an all-zero
    ///   public key.
    public init(privateKey: SecretBytes) throws(NoiseError) {
        Sodium.initialize()
        guard privateKey.count == Sizes.scalar else {
            throw NoiseError(.invalidKey, "X25519 private key must be \(Sizes.scalar) bytes, got \(privateKey.count)")
        }
        var publicKey = [UInt8](repeating: 0, count: Sizes.dh)
        let result = privateKey.withUnsafeBytes { scalar in
            publicKey.withUnsafeMutableBytes { crypto_scalarmult_base($0.bytePointer, scalar.bytePointer) }
        }
        guard result == 0 else {
            throw NoiseError(.invalidKey, "X25519 private key derives no valid public key")
        }
        self.publicKey = publicKey
        self.privateKey = privateKey
    }

    /// Copies `privateKey` into ``SecretBytes`` and derives the public key; see ``init(privateKey:)-(SecretBytes)``.
    public init(privateKey: [UInt8]) throws(NoiseError) {
        try self.init(privateKey: SecretBytes(privateKey))
    }

    /// X25519 Diffie-Hellman with a peer's public key (`crypto_scalarmult`; Noise `DH(key_pair,
    /// public_key)`, §4.1 and §12.1).
    ///
    /// - Parameter remotePublicKey: 32 bytes.
    /// - Returns: The 32-byte shared secret.
    /// - Throws: ``NoiseError/Code/invalidKey`` if the public key is not 32 bytes or the result is all
    ///   zeros (a low-order point; libsodium also rejects those).
    public func dh(with remotePublicKey: [UInt8]) throws(NoiseError) -> SecretBytes {
        guard remotePublicKey.count == Sizes.dh else {
            throw NoiseError(.invalidKey, "X25519 public key must be \(Sizes.dh) bytes, got \(remotePublicKey.count)")
        }
        var result: Int32 = -1
        let shared = SecretBytes(count: Sizes.dh) { out in
            privateKey.withUnsafeBytes { scalar in
                remotePublicKey.withUnsafeBytes { point in
                    let q = out.bytePointer
                    result = crypto_scalarmult(q, scalar.bytePointer, point.bytePointer)
                    if result == 0, sodium_is_zero(q, out.count) == 1 { result = -1 }
                }
            }
        }
        guard result == 0 else {
            throw NoiseError(.invalidKey, "X25519 with the peer's public key gave an all-zero result (low-order point)")
        }
        return shared
    }
}
