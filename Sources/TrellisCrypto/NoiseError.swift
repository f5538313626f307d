/// An error from the Noise handshake, cipher states or transport.
///
/// `code` says what kind of failure it was (match on it); `message` says what exactly was wrong
/// and, where it helps, what to do. No input, however malformed, makes this module trap: bad bytes
/// always come back as one of these errors.
public struct NoiseError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The kinds of failure.
    public enum Code: String, Sendable, Equatable, CaseIterable {
        /// AEAD authentication failed: the ciphertext, its associated data (the handshake hash during
        /// a handshake), the key or the nonce do not match. A wrong pre-shared key shows up as this.
        case decryptionFailed
        /// A message is shorter than its pattern requires (missing key bytes or authentication tag).
        case badMessageLength
        /// A call out of order: writing when a read is due, reading after completion, splitting
        /// before completion, using a handshake that already failed, rekeying an empty cipher state.
        case wrongState
        /// The pre-shared key is missing, not 32 bytes, or given to a pattern without a `psk` token
        /// (Noise spec rev 34, §9).
        case invalidPSK
        /// A message would exceed 65535 bytes (Noise spec rev 34, §3).
        case messageTooLong
        /// The cipher state's nonce reached 2^64-1 and may not be used again (§5.1); rekey does not
        /// reset it, so the session has to be replaced.
        case nonceExhausted
        /// A key has the wrong length, or a Diffie-Hellman result was all zeros (the peer sent a
        /// low-order point; §12.1).
        case invalidKey
    }

    /// What kind of failure this is.
    public let code: Code
    /// A human-readable explanation with the relevant sizes or states.
    public let message: String

    /// Creates an error; `message` should say what was wrong.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    /// `"<code>: <message>"`.
    public var description: String { "NoiseError.\(code.rawValue): \(message)" }
}
