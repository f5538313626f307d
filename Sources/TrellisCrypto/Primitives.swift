internal import CSodium

/// Sizes read from libsodium's headers, never hard-coded.
enum Sizes {
    /// X25519 public key and shared-secret length (Noise `DHLEN`).
    static let dh = Int(crypto_scalarmult_BYTES)
    /// X25519 private key length.
    static let scalar = Int(crypto_scalarmult_SCALARBYTES)
    /// ChaCha20-Poly1305 (IETF) key length.
    static let cipherKey = Int(crypto_aead_chacha20poly1305_ietf_KEYBYTES)
    /// ChaCha20-Poly1305 (IETF) nonce length.
    static let nonce = Int(crypto_aead_chacha20poly1305_ietf_NPUBBYTES)
    /// Poly1305 authentication tag length.
    static let tag = Int(crypto_aead_chacha20poly1305_ietf_ABYTES)
    /// SHA-256 output length (Noise `HASHLEN`).
    static let hash = Int(crypto_hash_sha256_BYTES)
    /// HMAC-SHA256 output length.
    static let hmac = Int(crypto_auth_hmacsha256_BYTES)
}

/// The Noise protocol's message size limit (spec rev 34, §3): a protocol constant, not a C size.
let noiseMaxMessageLength = 65535

/// A byte that zero-length C arguments point at: libsodium declares its pointer parameters
/// `nonnull`, even where the length is 0. Nothing ever reads or writes through it.
nonisolated(unsafe) private let placeholderByte: UnsafeMutablePointer<UInt8> = {
    let pointer = UnsafeMutablePointer<UInt8>.allocate(capacity: 1)
    pointer.initialize(to: 0)
    return pointer
}()

extension UnsafeRawBufferPointer {
    /// The bytes as a non-null C pointer (a placeholder for an empty buffer, with length 0).
    var bytePointer: UnsafePointer<UInt8> {
        guard let base = baseAddress, count > 0 else { return UnsafePointer(placeholderByte) }
        return base.assumingMemoryBound(to: UInt8.self)
    }
}

extension UnsafeMutableRawBufferPointer {
    /// The bytes as a non-null C pointer (a placeholder for an empty buffer, with length 0).
    var bytePointer: UnsafeMutablePointer<UInt8> {
        guard let base = baseAddress, count > 0 else { return placeholderByte }
        return base.assumingMemoryBound(to: UInt8.self)
    }
}

/// SHA-256 over the concatenation of `parts` (Noise `HASH`, spec rev 34, §4.3).
func sha256(_ parts: [UInt8]...) -> [UInt8] {
    var state = crypto_hash_sha256_state()
    defer { sodium_memzero(&state, MemoryLayout<crypto_hash_sha256_state>.size) }
    crypto_hash_sha256_init(&state)
    for part in parts {
        part.withUnsafeBytes { _ = crypto_hash_sha256_update(&state, $0.bytePointer, UInt64($0.count)) }
    }
    var out = [UInt8](repeating: 0, count: Sizes.hash)
    out.withUnsafeMutableBytes { _ = crypto_hash_sha256_final(&state, $0.bytePointer) }
    return out
}

/// HMAC-SHA256 with a key of any length (spec rev 34, §4.3 `HMAC-HASH`), writing into `output`,
/// which must hold `Sizes.hmac` bytes. The message is the concatenation of `parts`.
func hmacSHA256(
    key: UnsafeRawBufferPointer, parts: [UnsafeRawBufferPointer], into output: UnsafeMutableRawBufferPointer
) {
    precondition(output.count == Sizes.hmac)
    var state = crypto_auth_hmacsha256_state()
    defer { sodium_memzero(&state, MemoryLayout<crypto_auth_hmacsha256_state>.size) }
    crypto_auth_hmacsha256_init(&state, key.bytePointer, key.count)
    for part in parts {
        _ = crypto_auth_hmacsha256_update(&state, part.bytePointer, UInt64(part.count))
    }
    _ = crypto_auth_hmacsha256_final(&state, output.bytePointer)
}

/// Noise `HKDF(chaining_key, input_key_material, num_outputs)` (spec rev 34, §4.3), built from
/// HMAC-SHA256 as RFC 5869 with an empty info string. Returns `outputs` (2 or 3) secrets of
/// `HASHLEN` bytes each.
///
/// The outputs all use the same HMAC key (`temp_key`), so its padded inner and outer blocks are
/// hashed once and the keyed state is copied for each output: two SHA-256 compressions fewer per
/// output after the first, same bytes. The temporary key and every state are wiped.
///
/// - Complexity: 4 + 2 + 2 × `outputs` SHA-256 compressions for a 32-byte chaining key and input
///   of at most 55 bytes.
func hkdf(chainingKey: SecretBytes, inputKeyMaterial: UnsafeRawBufferPointer, outputs: Int) -> [SecretBytes] {
    precondition(outputs == 2 || outputs == 3)
    var keyed = crypto_auth_hmacsha256_state()
    defer { sodium_memzero(&keyed, MemoryLayout<crypto_auth_hmacsha256_state>.size) }
    withUnsafeTemporaryAllocation(byteCount: Sizes.hmac, alignment: 16) { tempKey in
        defer { sodium_memzero(tempKey.bytePointer, tempKey.count) }
        chainingKey.withUnsafeBytes { ck in hmacSHA256(key: ck, parts: [inputKeyMaterial], into: tempKey) }
        crypto_auth_hmacsha256_init(&keyed, tempKey.bytePointer, tempKey.count)
    }
    var results: [SecretBytes] = []
    results.reserveCapacity(outputs)
    for index in 1...outputs {
        var counter = UInt8(index)
        let previous = results.last
        let next = SecretBytes(count: Sizes.hmac) { out in
            var state = keyed
            defer { sodium_memzero(&state, MemoryLayout<crypto_auth_hmacsha256_state>.size) }
            previous?.withUnsafeBytes { prev in
                _ = crypto_auth_hmacsha256_update(&state, prev.bytePointer, UInt64(prev.count))
            }
            _ = crypto_auth_hmacsha256_update(&state, &counter, 1)
            _ = crypto_auth_hmacsha256_final(&state, out.bytePointer)
        }
        results.append(next)
    }
    return results
}

/// Returns the first `Sizes.cipherKey` bytes of a hash-sized secret (Noise truncates `temp_k` to 32
/// bytes when `HASHLEN` is 64; with SHA-256 this is the whole value).
func truncatedCipherKey(_ secret: SecretBytes) -> SecretBytes {
    if secret.count == Sizes.cipherKey { return secret }
    return SecretBytes(count: Sizes.cipherKey) { out in
        secret.withUnsafeBytes { out.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0.prefix(Sizes.cipherKey))) }
    }
}
