internal import CSodium

/// A Noise `CipherState` (spec rev 34, §5.1) over ChaChaPoly (§12.3):
/// `crypto_aead_chacha20poly1305_ietf` with a 32-byte key `k` and a 64-bit counter `n`.
///
/// The 96-bit AEAD nonce is 4 zero bytes followed by `n` in little-endian order. Each successful
/// encryption or decryption increments `n`; `n = 2^64-1` is reserved, so once it is reached every
/// further call throws ``NoiseError/Code/nonceExhausted``.
///
/// This is a value type: copying it copies the counter, and using two copies with the same key
/// would reuse nonces. Keep exactly one live copy per direction.
public struct CipherState: Sendable {
    /// The key, or nil before `InitializeKey` has been called with a key (then the state passes data
    /// through unencrypted, as the spec requires during the first handshake messages).
    private var key: SecretBytes?
    /// The next nonce to use.
    public private(set) var nonce: UInt64

    /// The ChaChaPoly key length in bytes (`crypto_aead_chacha20poly1305_ietf_KEYBYTES`).
    public static var keyLength: Int { Sizes.cipherKey }
    /// The authentication tag length in bytes (`crypto_aead_chacha20poly1305_ietf_ABYTES`).
    public static var tagLength: Int { Sizes.tag }

    /// Creates an empty cipher state (`InitializeKey(empty)`, §5.1).
    public init() {
        Sodium.initialize()
        key = nil
        nonce = 0
    }

    /// Creates a cipher state keyed with `key` and nonce 0 (`InitializeKey(key)`, §5.1).
    ///
    /// - Throws: ``NoiseError/Code/invalidKey`` unless `key` is 32 bytes.
    public init(key: SecretBytes) throws(NoiseError) {
        guard key.count == Sizes.cipherKey else {
            throw NoiseError(.invalidKey, "cipher key must be \(Sizes.cipherKey) bytes, got \(key.count)")
        }
        self.init(uncheckedKey: key)
    }

    /// A keyed cipher state whose key length the caller guarantees.
    init(uncheckedKey key: SecretBytes) {
        precondition(key.count == Sizes.cipherKey, "cipher key must be \(Sizes.cipherKey) bytes")
        self.init()
        self.key = key
    }

    /// Whether a key is set (`HasKey()`, §5.1).
    public var hasKey: Bool { key != nil }

    /// Sets the nonce (`SetNonce(nonce)`, §5.1). Only useful for tests and out-of-order transports.
    public mutating func setNonce(_ nonce: UInt64) {
        self.nonce = nonce
    }

    /// `EncryptWithAd(ad, plaintext)` (§5.1): with a key, returns ChaChaPoly ciphertext
    /// (`plaintext.count + 16` bytes: ciphertext then tag) and increments the nonce; without a key,
    /// returns `plaintext` unchanged.
    ///
    /// - Parameters:
    ///   - ad: Associated data, any length.
    ///   - plaintext: Any length (Noise messages themselves are capped at 65535 bytes by callers).
    /// - Throws: ``NoiseError/Code/nonceExhausted`` when the nonce is 2^64-1.
    public mutating func encryptWithAd(_ ad: [UInt8], _ plaintext: [UInt8]) throws(NoiseError) -> [UInt8] {
        guard let key else { return plaintext }
        guard nonce != UInt64.max else {
            throw NoiseError(.nonceExhausted, "nonce 2^64-1 reached; this cipher state can no longer encrypt")
        }
        let ciphertext = CipherState.encrypt(key: key, nonce: nonce, ad: ad, plaintext: plaintext)
        nonce += 1
        return ciphertext
    }

    /// `DecryptWithAd(ad, ciphertext)` (§5.1): with a key, authenticates and decrypts ChaChaPoly
    /// ciphertext (`plaintext` + 16-byte tag) and increments the nonce; without a key, returns
    /// `ciphertext` unchanged. On failure the nonce is not incremented.
    ///
    /// - Throws: ``NoiseError/Code/badMessageLength`` if shorter than the tag,
    ///   ``NoiseError/Code/decryptionFailed`` if authentication fails,
    ///   ``NoiseError/Code/nonceExhausted`` when the nonce is 2^64-1.
    public mutating func decryptWithAd(_ ad: [UInt8], _ ciphertext: [UInt8]) throws(NoiseError) -> [UInt8] {
        guard let key else { return ciphertext }
        guard nonce != UInt64.max else {
            throw NoiseError(.nonceExhausted, "nonce 2^64-1 reached; this cipher state can no longer decrypt")
        }
        let plaintext = try CipherState.decrypt(key: key, nonce: nonce, ad: ad, ciphertext: ciphertext)
        nonce += 1
        return plaintext
    }

    /// Whether `ciphertext` authenticates under this key at nonce `nonce`, without changing the
    /// state: for telling apart why a transport message failed (an earlier nonce means a replay,
    /// a later one a reordering, none a forgery or damage). Never used to accept data.
    ///
    /// - Parameters:
    ///   - ad: the associated data it was sealed with.
    ///   - ciphertext: ciphertext and 16-byte tag.
    ///   - nonce: the nonce to try (not 2^64-1).
    /// - Returns: false without a key, for a nonce of 2^64-1, or when it does not authenticate.
    public func authenticates(_ ad: [UInt8], _ ciphertext: [UInt8], atNonce nonce: UInt64) -> Bool {
        guard let key, nonce != UInt64.max else { return false }
        return (try? CipherState.decrypt(key: key, nonce: nonce, ad: ad, ciphertext: ciphertext)) != nil
    }

    /// `Rekey()` (§5.1, §11.3): replaces the key with the first 32 bytes of
    /// `ENCRYPT(k, 2^64-1, empty, 32 zero bytes)`. The nonce is left as it is.
    ///
    /// - Throws: ``NoiseError/Code/wrongState`` if the state has no key.
    public mutating func rekey() throws(NoiseError) {
        guard let key else {
            throw NoiseError(.wrongState, "cannot rekey a cipher state that has no key")
        }
        self.key = CipherState.rekeyed(key)
    }

    /// The key Rekey produces from `key` (ChaChaPoly `REKEY`, §4.2).
    static func rekeyed(_ key: SecretBytes) -> SecretBytes {
        let zeros = [UInt8](repeating: 0, count: Sizes.cipherKey)
        var block = encrypt(key: key, nonce: UInt64.max, ad: [], plaintext: zeros)
        defer { block.withUnsafeMutableBytes { sodium_memzero($0.bytePointer, $0.count) } }
        return SecretBytes(count: Sizes.cipherKey) { out in
            block.withUnsafeBytes { out.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0.prefix(Sizes.cipherKey))) }
        }
    }

    /// Builds the 96-bit IETF nonce: 32 zero bits, then `n` little-endian (§12.3).
    private static func nonceBytes(_ n: UInt64) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: Sizes.nonce)
        let littleEndian = n.littleEndian
        withUnsafeBytes(of: littleEndian) { counter in
            for index in 0..<counter.count { bytes[Sizes.nonce - counter.count + index] = counter[index] }
        }
        return bytes
    }

    /// ChaChaPoly `ENCRYPT(k, n, ad, plaintext)` (§4.2).
    private static func encrypt(key: SecretBytes, nonce: UInt64, ad: [UInt8], plaintext: [UInt8]) -> [UInt8] {
        let npub = nonceBytes(nonce)
        var output = [UInt8](repeating: 0, count: plaintext.count + Sizes.tag)
        var outputLength: UInt64 = 0
        key.withUnsafeBytes { k in
            plaintext.withUnsafeBytes { m in
                ad.withUnsafeBytes { a in
                    npub.withUnsafeBytes { n in
                        output.withUnsafeMutableBytes { c in
                            _ = crypto_aead_chacha20poly1305_ietf_encrypt(
                                c.bytePointer, &outputLength,
                                m.bytePointer, UInt64(m.count),
                                a.bytePointer, UInt64(a.count),
                                nil, n.bytePointer, k.bytePointer)
                        }
                    }
                }
            }
        }
        return output
    }

    /// ChaChaPoly `DECRYPT(k, n, ad, ciphertext)` (§4.2).
    private static func decrypt(
        key: SecretBytes, nonce: UInt64, ad: [UInt8], ciphertext: [UInt8]
    ) throws(NoiseError) -> [UInt8] {
        guard ciphertext.count >= Sizes.tag else {
            throw NoiseError(
                .badMessageLength,
                "ciphertext is \(ciphertext.count) bytes, shorter than the \(Sizes.tag)-byte authentication tag")
        }
        let npub = nonceBytes(nonce)
        var output = [UInt8](repeating: 0, count: ciphertext.count - Sizes.tag)
        var outputLength: UInt64 = 0
        let result = key.withUnsafeBytes { k in
            ciphertext.withUnsafeBytes { c in
                ad.withUnsafeBytes { a in
                    npub.withUnsafeBytes { n in
                        output.withUnsafeMutableBytes { m in
                            crypto_aead_chacha20poly1305_ietf_decrypt(
                                m.bytePointer, &outputLength, nil,
                                c.bytePointer, UInt64(c.count),
                                a.bytePointer, UInt64(a.count),
                                n.bytePointer, k.bytePointer)
                        }
                    }
                }
            }
        }
        guard result == 0 else {
            throw NoiseError(
                .decryptionFailed,
                "authentication failed for a \(ciphertext.count)-byte ciphertext at nonce \(nonce) "
                    + "(wrong key or pre-shared key, tampered data, or messages out of order)")
        }
        return output
    }
}
