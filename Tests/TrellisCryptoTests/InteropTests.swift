import Foundation
import Testing
import TrellisCrypto

/// Handshakes against an independent implementation: PyPI's `noiseprotocol`, driven by
/// `scripts/noise_peer.py` over stdin/stdout with 2-byte big-endian length prefixes.
///
/// If python3 or the `noise` module is missing, these tests fail (they do not skip) and say to run
/// scripts/test.sh, which installs the module.
@Suite("Interop with Python noiseprotocol", .serialized)
struct InteropTests {
    static let psk = SecretBytes((0..<32).map { UInt8($0 &* 7 &+ 3) })
    static let prologue = Array("trellis/1 noise interop".utf8)

    struct PeerError: Error, CustomStringConvertible {
        let message: String
        var description: String { message }
    }

    /// One running `noise_peer.py`.
    final class Peer {
        let process = Process()
        let input = Pipe()
        let output = Pipe()
        let errors = Pipe()
        let watchdog: DispatchWorkItem

        init(arguments: [String], timeout: Double = 60) throws {
            // A peer that exits early must not kill the test process with SIGPIPE on our next write.
            signal(SIGPIPE, SIG_IGN)
            let script = TestPaths.noisePeerScript.path
            guard FileManager.default.fileExists(atPath: script) else {
                throw PeerError(message: "interop peer script missing at \(script)")
            }
            // scripts/test.sh sets TRELLIS_PYTHON to its virtual environment's interpreter.
            let python = ProcessInfo.processInfo.environment["TRELLIS_PYTHON"]
            process.executableURL = URL(fileURLWithPath: python ?? "/usr/bin/env")
            process.arguments = (python == nil ? ["python3", script] : [script]) + arguments
            process.standardInput = input
            process.standardOutput = output
            process.standardError = errors
            let process = self.process
            watchdog = DispatchWorkItem { if process.isRunning { process.terminate() } }
            try process.run()
            DispatchQueue.global().asyncAfter(deadline: .now() + timeout, execute: watchdog)
        }

        /// Sends one frame. A peer that already exited is not an error here: the next ``receive()``
        /// returns nil and ``recordEarlyExit(_:)`` reports why it exited.
        func send(_ message: [UInt8]) {
            precondition(message.count <= 65535)
            let frame = [UInt8(message.count >> 8), UInt8(message.count & 0xFF)] + message
            try? input.fileHandleForWriting.write(contentsOf: Data(frame))
        }

        /// Reads one frame; nil if the peer closed its output first.
        func receive() throws -> [UInt8]? {
            guard let header = try readExactly(2) else { return nil }
            return try readExactly(Int(header[0]) << 8 | Int(header[1]))
        }

        private func readExactly(_ count: Int) throws -> [UInt8]? {
            var bytes: [UInt8] = []
            while bytes.count < count {
                guard let chunk = try output.fileHandleForReading.read(upToCount: count - bytes.count),
                    !chunk.isEmpty
                else { return nil }
                bytes += chunk
            }
            return bytes
        }

        /// Closes stdin, waits for exit, and returns (exit status, stderr text).
        func finish() throws -> (Int32, String) {
            try? input.fileHandleForWriting.close()
            let stderrData = errors.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            watchdog.cancel()
            return (process.terminationStatus, String(decoding: stderrData, as: UTF8.self))
        }

        /// Records why the peer stopped talking, with the fix for a missing module or python3.
        func recordEarlyExit(_ step: String) throws {
            let (status, stderr) = try finish()
            switch status {
            case 3:
                let message =
                    "Python module `noise` (PyPI `noiseprotocol`) is missing, so the interop test cannot run: "
                    + "run scripts/test.sh, which installs it (or `python3 -m pip install noiseprotocol`). "
                    + "Peer said: \(stderr)"
                Issue.record(Comment(rawValue: message))
            case 127:
                Issue.record("python3 was not found on PATH; run scripts/test.sh, which installs what tests need")
            default:
                Issue.record("noise_peer.py stopped during \(step) with status \(status): \(stderr)")
            }
        }
    }

    /// Parses the `key=HEX` lines the peer prints to stderr.
    static func report(_ stderr: String) -> [String: [UInt8]] {
        var values: [String: [UInt8]] = [:]
        for line in stderr.split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1)
            if parts.count == 2, let bytes = Hex.decode(String(parts[1])) { values[String(parts[0])] = bytes }
        }
        return values
    }

    static func peerArguments(role: String, pattern: NoisePattern = .xxpsk3, extra: [String] = []) -> [String] {
        [
            "--role", role, "--pattern", pattern.rawValue, "--psk", Hex.encode(psk.copyBytes()), "--prologue",
            Hex.encode(prologue),
        ] + extra
    }

    /// Sends each plaintext and checks the peer's transformed reply; rekeys before later rounds.
    static func exchange(
        _ transport: inout NoiseTransport, with peer: Peer, plaintexts: [[UInt8]], rekey: Bool,
        expected: ([UInt8]) -> [UInt8]
    ) throws {
        for (round, plaintext) in plaintexts.enumerated() {
            if rekey && round > 0 {
                transport.rekeySend()
                transport.rekeyReceive()
            }
            peer.send(try transport.encrypt(plaintext))
            guard let reply = try peer.receive() else {
                try peer.recordEarlyExit("transport round \(round)")
                return
            }
            #expect(try transport.decrypt(reply) == expected(plaintext), "round \(round)")
        }
    }

    @Test(
        "Swift initiator, Python responder: handshake, round trip, rekey, same handshake hash",
        arguments: [NoisePattern.xxpsk3, .xxpsk0])
    func swiftInitiator(pattern: NoisePattern) throws {
        let local = KeyPair.generate()
        let peerStatic = KeyPair.generate()
        let peer = try Peer(
            arguments: Self.peerArguments(
                role: "responder", pattern: pattern,
                extra: ["--static", Hex.encode(peerStatic.privateKey.copyBytes()), "--rounds", "3", "--rekey"]))
        var handshake = try HandshakeState(
            pattern: pattern, role: .initiator, prologue: Self.prologue, staticKeyPair: local, psk: Self.psk)

        peer.send(try handshake.writeMessage(payload: []))
        guard let message2 = try peer.receive() else { return try peer.recordEarlyExit("the handshake") }
        _ = try handshake.readMessage(message2)
        peer.send(try handshake.writeMessage(payload: []))
        #expect(handshake.isComplete)
        var transport = try handshake.split()
        #expect(transport.remoteStaticPublicKey == peerStatic.publicKey)

        let plaintexts = [Array("hello from trellis".utf8), [], Array(repeating: 0x5A, count: 60000)]
        try Self.exchange(&transport, with: peer, plaintexts: plaintexts, rekey: true) { Array($0.reversed()) }

        let (status, stderr) = try peer.finish()
        #expect(status == 0, "noise_peer.py exited with \(status): \(stderr)")
        let report = Self.report(stderr)
        #expect(report["handshake_hash"] == transport.handshakeHash, "handshake hashes differ; peer said: \(stderr)")
        #expect(report["remote_static"] == local.publicKey)
        #expect(report["static_public"] == peerStatic.publicKey)
    }

    @Test(
        "Swift responder, Python initiator: handshake, round trip, same handshake hash",
        arguments: [NoisePattern.xxpsk3, .xxpsk0])
    func swiftResponder(pattern: NoisePattern) throws {
        let local = KeyPair.generate()
        let peer = try Peer(
            arguments: Self.peerArguments(role: "initiator", pattern: pattern, extra: ["--transform", "upper"]))
        var handshake = try HandshakeState(
            pattern: pattern, role: .responder, prologue: Self.prologue, staticKeyPair: local, psk: Self.psk)

        guard let message1 = try peer.receive() else { return try peer.recordEarlyExit("the handshake") }
        _ = try handshake.readMessage(message1)
        peer.send(try handshake.writeMessage(payload: []))
        guard let message3 = try peer.receive() else { return try peer.recordEarlyExit("the handshake") }
        _ = try handshake.readMessage(message3)
        var transport = try handshake.split()

        try Self.exchange(&transport, with: peer, plaintexts: [Array("mesh sync".utf8)], rekey: false) {
            Array(String(decoding: $0, as: UTF8.self).uppercased().utf8)
        }
        let (status, stderr) = try peer.finish()
        #expect(status == 0, "noise_peer.py exited with \(status): \(stderr)")
        let report = Self.report(stderr)
        #expect(report["handshake_hash"] == transport.handshakeHash, "handshake hashes differ; peer said: \(stderr)")
        #expect(report["static_public"] == transport.remoteStaticPublicKey)
        #expect(report["remote_static"] == local.publicKey)
    }

    @Test("plain XX (no psk) against Python too")
    func plainXX() throws {
        let peer = try Peer(arguments: [
            "--role", "responder", "--pattern", "XX", "--prologue", Hex.encode(Self.prologue),
        ])
        var handshake = try HandshakeState(
            pattern: .xx, role: .initiator, prologue: Self.prologue, staticKeyPair: .generate())
        peer.send(try handshake.writeMessage(payload: Array("hi".utf8)))
        guard let message2 = try peer.receive() else { return try peer.recordEarlyExit("the handshake") }
        _ = try handshake.readMessage(message2)
        peer.send(try handshake.writeMessage(payload: []))
        var transport = try handshake.split()
        try Self.exchange(&transport, with: peer, plaintexts: [Array("abc".utf8)], rekey: false) {
            Array($0.reversed())
        }
        let (status, stderr) = try peer.finish()
        #expect(status == 0, "noise_peer.py exited with \(status): \(stderr)")
        #expect(Self.report(stderr)["handshake_hash"] == transport.handshakeHash)
    }

    @Test("a Python peer with a different psk cannot complete the handshake")
    func pythonWrongPSK() throws {
        let other = SecretBytes([UInt8](repeating: 0xEE, count: 32))
        let peer = try Peer(arguments: [
            "--role", "responder", "--psk", Hex.encode(other.copyBytes()), "--prologue", Hex.encode(Self.prologue),
        ])
        var handshake = try HandshakeState(
            pattern: .xxpsk3, role: .initiator, prologue: Self.prologue, staticKeyPair: .generate(), psk: Self.psk)
        peer.send(try handshake.writeMessage(payload: []))
        // The psk enters only with message 3's `psk` token, so messages 1 and 2 still go through...
        guard let message2 = try peer.receive() else { return try peer.recordEarlyExit("the handshake") }
        _ = try handshake.readMessage(message2)
        peer.send(try handshake.writeMessage(payload: []))
        #expect(handshake.isComplete)
        // ...and the peer rejects message 3: it never answers the transport message.
        var transport = try handshake.split()
        peer.send(try transport.encrypt(Array("are you there?".utf8)))
        let reply = try peer.receive()
        #expect(reply == nil, "the peer answered although the psks differ")
        let (status, stderr) = try peer.finish()
        if status == 3 || status == 127 {
            Issue.record("interop prerequisites missing (status \(status)): run scripts/test.sh. \(stderr)")
        }
        #expect(status == 4, "expected a protocol error from noise_peer.py, got \(status): \(stderr)")
    }

    /// A Python XXpsk0 peer holding another psk (32 × 0xEE).
    static func strangerPSK0(role: String) throws -> Peer {
        try Peer(arguments: [
            "--role", role, "--pattern", "XXpsk0", "--psk", String(repeating: "ee", count: 32), "--prologue",
            Hex.encode(prologue),
        ])
    }

    @Test("XXpsk0: a Python initiator with a different psk is refused at message 1, before any DH")
    func pythonWrongPSKAtMessage1() throws {
        let peer = try Self.strangerPSK0(role: "initiator")
        var handshake = try HandshakeState(
            pattern: .xxpsk0, role: .responder, prologue: Self.prologue, staticKeyPair: .generate(), psk: Self.psk)
        guard let message1 = try peer.receive() else { return try peer.recordEarlyExit("the handshake") }
        #expect(message1.count == 48, "e (32 bytes) and the empty payload's tag (16 bytes)")
        // The responder has written nothing yet, so it has done no DH with its static key and sent
        // no key: the refusal comes from the payload tag alone.
        #expect(throws: NoiseError.self) { _ = try handshake.readMessage(message1) }
        #expect(!handshake.isWriteTurn)
        #expect(handshake.remoteStaticPublicKey == nil)
        _ = try peer.finish()
    }

    @Test("XXpsk0: a Swift initiator with a different psk is refused by the Python responder at message 1")
    func swiftWrongPSKAtMessage1() throws {
        let peer = try Self.strangerPSK0(role: "responder")
        var handshake = try HandshakeState(
            pattern: .xxpsk0, role: .initiator, prologue: Self.prologue, staticKeyPair: .generate(), psk: Self.psk)
        peer.send(try handshake.writeMessage(payload: []))
        let reply = try peer.receive()
        #expect(reply == nil, "the responder answered message 1 although the psks differ")
        let (status, stderr) = try peer.finish()
        if status == 3 || status == 127 {
            Issue.record("interop prerequisites missing (status \(status)): run scripts/test.sh. \(stderr)")
        }
        #expect(status == 4, "expected a protocol error from noise_peer.py, got \(status): \(stderr)")
    }
}
