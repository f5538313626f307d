internal import CSodium

/// A Noise `SymmetricState` (spec rev 34, §5.2) with SHA-256 (§12.5): the chaining key `ck`, the
/// handshake hash `h` and a ``CipherState``.
///
/// `HASH` is `crypto_hash_sha256`; `HMAC-HASH` is `crypto_auth_hmacsha256_init/update/final`, which
/// accept keys of any length; `HKDF` is built from it as in §4.3.
public struct SymmetricState: Sendable {
    private var chainingKey: SecretBytes
    /// The handshake hash `h`: 32 bytes (`HASHLEN`).
    public private(set) var handshakeHash: [UInt8]
    /// The cipher state used by ``encryptAndHash(_:)`` and ``decryptAndHash(_:)``.
    public private(set) var cipherState: CipherState

    /// The hash output length in bytes (`crypto_hash_sha256_BYTES`, Noise `HASHLEN`).
    public static var hashLength: Int { Sizes.hash }

    /// `InitializeSymmetric(protocol_name)` (§5.2): `h` is the name zero-padded to 32 bytes if it
    /// fits, otherwise `SHA-256(name)`; `ck = h`; the cipher state is empty.
    ///
    /// - Parameter protocolName: e.g. `"Noise_XXpsk3_25519_ChaChaPoly_SHA256"` (UTF-8 bytes are used).
    public init(protocolName: String) {
        Sodium.initialize()
        let name = Array(protocolName.utf8)
        let h: [UInt8]
        if name.count <= Sizes.hash {
            h = name + [UInt8](repeating: 0, count: Sizes.hash - name.count)
        } else {
            h = sha256(name)
        }
        handshakeHash = h
        chainingKey = SecretBytes(h)
        cipherState = CipherState()
    }

    /// `MixKey(input_key_material)` (§5.2): `ck, temp_k = HKDF(ck, ikm, 2)`, then
    /// `InitializeKey(temp_k)` (first 32 bytes).
    public mutating func mixKey(_ inputKeyMaterial: SecretBytes) {
        inputKeyMaterial.withUnsafeBytes { mixKey(raw: $0) }
    }

    /// `MixKey` with public input (used for `e` tokens in psk handshakes, §9.2).
    mutating func mixKey(public inputKeyMaterial: [UInt8]) {
        inputKeyMaterial.withUnsafeBytes { mixKey(raw: $0) }
    }

    private mutating func mixKey(raw inputKeyMaterial: UnsafeRawBufferPointer) {
        let outputs = hkdf(chainingKey: chainingKey, inputKeyMaterial: inputKeyMaterial, outputs: 2)
        chainingKey = outputs[0]
        cipherState = CipherState(uncheckedKey: truncatedCipherKey(outputs[1]))
    }

    /// `MixHash(data)` (§5.2): `h = SHA-256(h || data)`.
    public mutating func mixHash(_ data: [UInt8]) {
        handshakeHash = sha256(handshakeHash, data)
    }

    /// `MixKeyAndHash(input_key_material)` (§5.2), used for `psk` tokens:
    /// `ck, temp_h, temp_k = HKDF(ck, ikm, 3)`, `MixHash(temp_h)`, `InitializeKey(temp_k)`.
    public mutating func mixKeyAndHash(_ inputKeyMaterial: SecretBytes) {
        let outputs = inputKeyMaterial.withUnsafeBytes {
            hkdf(chainingKey: chainingKey, inputKeyMaterial: $0, outputs: 3)
        }
        chainingKey = outputs[0]
        mixHash(outputs[1].copyBytes())
        cipherState = CipherState(uncheckedKey: truncatedCipherKey(outputs[2]))
    }

    /// `EncryptAndHash(plaintext)` (§5.2): encrypts with `h` as associated data (or passes the
    /// plaintext through before any key is mixed in), then mixes the result into `h`.
    ///
    /// - Throws: ``NoiseError/Code/nonceExhausted`` from the cipher state.
    public mutating func encryptAndHash(_ plaintext: [UInt8]) throws(NoiseError) -> [UInt8] {
        let ciphertext = try cipherState.encryptWithAd(handshakeHash, plaintext)
        mixHash(ciphertext)
        return ciphertext
    }

    /// `DecryptAndHash(ciphertext)` (§5.2): decrypts with `h` as associated data, then mixes the
    /// ciphertext into `h`.
    ///
    /// - Throws: ``NoiseError/Code/decryptionFailed`` or ``NoiseError/Code/badMessageLength`` from the
    ///   cipher state.
    public mutating func decryptAndHash(_ ciphertext: [UInt8]) throws(NoiseError) -> [UInt8] {
        let plaintext = try cipherState.decryptWithAd(handshakeHash, ciphertext)
        mixHash(ciphertext)
        return plaintext
    }

    /// `Split()` (§5.2): `temp_k1, temp_k2 = HKDF(ck, empty, 2)`; returns two keyed cipher states,
    /// the first for initiator-to-responder traffic, the second for responder-to-initiator.
    public func split() -> (CipherState, CipherState) {
        let empty: [UInt8] = []
        let outputs = empty.withUnsafeBytes { hkdf(chainingKey: chainingKey, inputKeyMaterial: $0, outputs: 2) }
        return (
            CipherState(uncheckedKey: truncatedCipherKey(outputs[0])),
            CipherState(uncheckedKey: truncatedCipherKey(outputs[1]))
        )
    }

    /// Drops the chaining key and cipher key (after `Split()`), keeping only the handshake hash.
    mutating func discardSecrets() {
        chainingKey = SecretBytes(count: 0) { _ in }
        cipherState = CipherState()
    }
}
