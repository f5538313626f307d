import Foundation
import Testing
import TrellisCrypto

/// Hex helpers for vectors and diagnostics.
enum Hex {
    /// Decodes lowercase or uppercase hex; records an issue and returns nil on bad input.
    static func decode(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard digits.count % 2 == 0 else {
            Issue.record("odd-length hex string: \(text)", sourceLocation: sourceLocation)
            return nil
        }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        var index = 0
        while index < digits.count {
            guard let high = nibble(digits[index]), let low = nibble(digits[index + 1]) else {
                Issue.record("not hex: \(text)", sourceLocation: sourceLocation)
                return nil
            }
            bytes.append(high << 4 | low)
            index += 2
        }
        return bytes
    }

    static func encode(_ bytes: [UInt8]) -> String {
        bytes.map { String(format: "%02x", $0) }.joined()
    }

    private static func nibble(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return c - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}

/// Paths found relative to this source file, so tests work from any working directory.
enum TestPaths {
    /// The package root: the nearest ancestor of this file holding Package.swift.
    static let repositoryRoot: URL = {
        var url = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        while url.path != "/" {
            if FileManager.default.fileExists(atPath: url.appendingPathComponent("Package.swift").path) {
                return url
            }
            url = url.deletingLastPathComponent()
        }
        // Fall back to Tests/TrellisCryptoTests/<file> → root.
        return URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
    }()

    /// `Tests/Vectors/noise/` in the repository (the published cacophony and snow vector files).
    static var noiseVectors: URL {
        repositoryRoot.appendingPathComponent("Tests/Vectors/noise", isDirectory: true)
    }

    /// `scripts/noise_peer.py` in the repository.
    static var noisePeerScript: URL {
        repositoryRoot.appendingPathComponent("scripts/noise_peer.py")
    }
}

/// A small deterministic generator (SplitMix64) for randomised tests; the seed is printed and can
/// be replayed with the `TRELLIS_SEED` environment variable.
struct SeededGenerator: RandomNumberGenerator {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// The seed from `TRELLIS_SEED` if set (decimal), else a fresh random one; printed either way.
    static func fromEnvironment(test: String) -> (SeededGenerator, UInt64) {
        let seed: UInt64
        if let text = ProcessInfo.processInfo.environment["TRELLIS_SEED"], let value = UInt64(text) {
            seed = value
        } else {
            seed = UInt64.random(in: 0...UInt64.max)
        }
        print("\(test): seed \(seed) (replay with TRELLIS_SEED=\(seed))")
        return (SeededGenerator(seed: seed), seed)
    }

    mutating func bytes(count: Int) -> [UInt8] {
        (0..<count).map { _ in UInt8.random(in: 0...255, using: &self) }
    }
}

/// Runs a complete handshake between two in-process states and returns both transports.
struct HandshakePair {
    var initiator: HandshakeState
    var responder: HandshakeState

    init(
        pattern: NoisePattern = .xxpsk3,
        initiatorPSK: SecretBytes? = SecretBytes(Array(repeating: 7, count: 32)),
        responderPSK: SecretBytes? = SecretBytes(Array(repeating: 7, count: 32)),
        prologue: [UInt8] = Array("trellis/1".utf8),
        initiatorStatic: KeyPair = .generate(),
        responderStatic: KeyPair = .generate()
    ) throws {
        initiator = try HandshakeState(
            pattern: pattern, role: .initiator, prologue: prologue, staticKeyPair: initiatorStatic,
            psk: initiatorPSK)
        responder = try HandshakeState(
            pattern: pattern, role: .responder, prologue: prologue, staticKeyPair: responderStatic,
            psk: responderPSK)
    }

    /// Message 1, initiator → responder.
    mutating func message1(_ payload: [UInt8] = []) throws -> [UInt8] {
        try initiator.writeMessage(payload: payload)
    }

    /// Message 2, responder → initiator (after message 1 was read).
    mutating func message2(_ payload: [UInt8] = []) throws -> [UInt8] {
        try responder.writeMessage(payload: payload)
    }

    /// Message 3, initiator → responder (after message 2 was read).
    mutating func message3(_ payload: [UInt8] = []) throws -> [UInt8] {
        try initiator.writeMessage(payload: payload)
    }

    /// Runs all three messages and splits both sides.
    mutating func complete() throws -> (initiator: NoiseTransport, responder: NoiseTransport) {
        _ = try responder.readMessage(try message1())
        _ = try initiator.readMessage(try message2())
        _ = try responder.readMessage(try message3())
        return (try initiator.split(), try responder.split())
    }
}
