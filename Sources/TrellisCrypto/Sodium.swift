internal import CSodium

/// Entry point for process-wide libsodium set-up.
///
/// Every public initialiser in `TrellisCrypto` calls ``initialize()`` itself, so callers only need
/// it when they want initialisation to happen at a moment of their choosing (for example at start-up).
public enum Sodium {
    /// The result of the one and only `sodium_init()` call; Swift runs a `static let` initialiser
    /// exactly once, even under concurrent first access.
    private static let initResult: Int32 = sodium_init()

    /// Initialises libsodium (`sodium_init()`) once per process. Safe to call from any thread, any
    /// number of times; calls after the first return immediately.
    ///
    /// `sodium_init()` only fails when the operating system gives no source of randomness; nothing in
    /// this module can work then, so that case stops the process with a message instead of
    /// returning an error every caller would have to handle.
    public static func initialize() {
        precondition(initResult >= 0, "sodium_init() failed: libsodium found no usable source of randomness")
    }

    /// Overwrites `buffer` with zeros in a way the compiler cannot remove (`sodium_memzero`): for
    /// key material read into ordinary memory (a file buffer, a parsed copy) once it is used.
    ///
    /// - Parameter buffer: the bytes to wipe; may be empty.
    public static func wipe(_ buffer: UnsafeMutableRawBufferPointer) {
        guard let base = buffer.baseAddress, buffer.count > 0 else { return }
        sodium_memzero(base, buffer.count)
    }

    /// Wipes an array's bytes in place (``wipe(_:)-(UnsafeMutableRawBufferPointer)``); copies the
    /// array made earlier are not reached.
    ///
    /// - Parameter bytes: the array to zero; its count is unchanged.
    public static func wipe(_ bytes: inout [UInt8]) {
        bytes.withUnsafeMutableBytes { wipe($0) }
    }

    /// Fills `buffer` from libsodium's CSPRNG (`randombytes_buf`).
    static func randomBytes(into buffer: UnsafeMutableRawBufferPointer) {
        initialize()
        guard let base = buffer.baseAddress, buffer.count > 0 else { return }
        randombytes_buf(base, buffer.count)
    }
}

/// Secret bytes (private keys, pre-shared keys, chaining and cipher keys) kept in one heap buffer
/// that is wiped with `sodium_memzero` when the last reference goes away.
///
/// The buffer is written only while the instance is being initialised and is read-only afterwards,
/// which is why the type can be shared between tasks. Copies made with ``copyBytes()`` are ordinary
/// arrays and are *not* wiped; prefer ``withUnsafeBytes(_:)``.
///
/// Equality is constant-time (`sodium_memcmp`) for equal lengths.
public final class SecretBytes: @unchecked Sendable {
    // Invariant that justifies @unchecked Sendable: `storage` is fully written inside `init` and
    // never mutated again until `deinit`, which wipes and frees it.
    private let storage: UnsafeMutableRawBufferPointer

    /// Number of secret bytes held.
    public var count: Int { storage.count }

    /// Creates a secret of `count` bytes and lets `body` fill the zeroed buffer in place, so the
    /// secret never exists outside wiped memory.
    ///
    /// - Parameters:
    ///   - count: Length in bytes (≥ 0).
    ///   - body: Writes the secret into the buffer it is given.
    /// - Throws: Whatever `body` throws; the buffer is wiped and freed first.
    public init(count: Int, initializingWith body: (UnsafeMutableRawBufferPointer) throws -> Void) rethrows {
        precondition(count >= 0, "SecretBytes count must not be negative")
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: count, alignment: 16)
        buffer.initializeMemory(as: UInt8.self, repeating: 0)
        do {
            try body(buffer)
        } catch {
            SecretBytes.wipe(buffer)
            buffer.deallocate()
            throw error
        }
        storage = buffer
    }

    /// Copies `bytes` into wiped-on-release memory. The caller's array is not (cannot be) wiped.
    public convenience init(_ bytes: [UInt8]) {
        self.init(count: bytes.count) { buffer in
            bytes.withUnsafeBytes { source in buffer.copyMemory(from: source) }
        }
    }

    /// Creates `count` bytes from libsodium's CSPRNG (`randombytes_buf`).
    public static func random(count: Int) -> SecretBytes {
        SecretBytes(count: count) { Sodium.randomBytes(into: $0) }
    }

    deinit {
        SecretBytes.wipe(storage)
        storage.deallocate()
    }

    /// Calls `body` with a read-only view of the secret. Do not let the pointer escape.
    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try body(UnsafeRawBufferPointer(storage))
    }

    /// Returns an ordinary (not wiped) copy of the bytes, e.g. to write a key file.
    public func copyBytes() -> [UInt8] {
        [UInt8](UnsafeRawBufferPointer(storage))
    }

    private static func wipe(_ buffer: UnsafeMutableRawBufferPointer) {
        guard let base = buffer.baseAddress, buffer.count > 0 else { return }
        sodium_memzero(base, buffer.count)
    }
}

extension SecretBytes: Equatable {
    /// Constant-time comparison (`sodium_memcmp`) when the lengths are equal; lengths are not secret.
    public static func == (lhs: SecretBytes, rhs: SecretBytes) -> Bool {
        guard lhs.count == rhs.count else { return false }
        guard lhs.count > 0 else { return true }
        return lhs.withUnsafeBytes { a in
            rhs.withUnsafeBytes { b in
                guard let pa = a.baseAddress, let pb = b.baseAddress else { return false }
                return sodium_memcmp(pa, pb, a.count) == 0
            }
        }
    }
}

extension SecretBytes: CustomStringConvertible, CustomDebugStringConvertible {
    /// Never prints the secret: `SecretBytes(32 bytes)`.
    public var description: String { "SecretBytes(\(count) bytes)" }
    /// Same as ``description``: the secret is never printed.
    public var debugDescription: String { description }
}

/// SHA-256 (FIPS 180-4) through libsodium's `crypto_hash_sha256`.
public enum SHA256 {
    /// The 32-byte digest of `bytes`.
    public static func hash(_ bytes: [UInt8]) -> [UInt8] {
        Sodium.initialize()
        return sha256(bytes)
    }
}
