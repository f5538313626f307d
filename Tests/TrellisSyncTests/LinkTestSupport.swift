import Foundation
import Synchronization
import Testing
import TrellisCrypto
import TrellisTestKit

@testable import TrellisNet

/// A process (not started) that runs `scripts/NAME` with ``Repository/python``, the interpreter
/// that holds the interop packages scripts/setup.sh installs.
///
/// - Parameters:
///   - script: the file name under scripts/.
///   - arguments: the script's arguments.
func pythonScript(_ script: String, _ arguments: [String]) -> Process {
    let process = Process()
    let python = Repository.python.split(separator: " ").map(String.init)
    process.executableURL = URL(fileURLWithPath: python[0])
    process.arguments =
        Array(python.dropFirst()) + [Repository.root.appendingPathComponent("scripts/\(script)").path] + arguments
    return process
}

/// Two ``SecureLink``s connected over loopback, after a real XXpsk3 handshake.
///
/// - Parameter rekeyInterval: transport messages between rekeys on both ends.
/// - Returns: the dialing end and the accepting end, neither started.
func securePair(rekeyInterval: Int = SecureLink.rekeyInterval) throws -> (client: SecureLink, server: SecureLink) {
    Sodium.initialize()
    let meshKey = SecretBytes.random(count: 32)
    let listener = try TCPListener(endpoint: Endpoint(host: "127.0.0.1", port: 0))
    defer { listener.close() }
    let accepted = Mutex<Result<SecureLink, any Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    let serverIdentity = KeyPair.generate()
    Thread {
        let result = Result { () throws -> SecureLink in
            let socket = try listener.accept()
            return try SecureLink.handshake(
                socket: socket, initiator: false, identity: serverIdentity, meshKey: meshKey, address: "client",
                admit: { _ in true }, timeout: 10, rekeyInterval: rekeyInterval)
        }
        accepted.withLock { $0 = result }
        done.signal()
    }.start()
    let socket = try TCPSocket.connect(to: Endpoint(host: "127.0.0.1", port: listener.port))
    let client = try SecureLink.handshake(
        socket: socket, initiator: true, identity: .generate(), meshKey: meshKey, address: "server",
        admit: { _ in true }, timeout: 10, rekeyInterval: rekeyInterval)
    done.wait()
    let server = try accepted.withLock { $0! }.get()
    return (client, server)
}

/// Records what a started ``MessageLink`` delivers.
final class LinkRecorder: Sendable {
    private struct State {
        var messages: [[UInt8]] = []
        var drains = 0
        var closeReasons: [String] = []
        var eventsAfterClose = 0
    }
    private let state = Mutex(State())
    private let closed = DispatchSemaphore(value: 0)
    /// Runs before each message is recorded (to block the reader, for example).
    private let beforeMessage: @Sendable ([UInt8]) -> Void

    init(beforeMessage: @escaping @Sendable ([UInt8]) -> Void = { _ in }) {
        self.beforeMessage = beforeMessage
    }

    func start(_ link: any MessageLink) {
        link.start(
            onMessage: { [self] message in
                beforeMessage(message)
                state.withLock { s in
                    if !s.closeReasons.isEmpty { s.eventsAfterClose += 1 }
                    s.messages.append(message)
                }
            },
            onDrain: { [self] in
                state.withLock { s in
                    if !s.closeReasons.isEmpty { s.eventsAfterClose += 1 }
                    s.drains += 1
                }
            },
            onClose: { [self] reason in
                state.withLock { $0.closeReasons.append(reason) }
                closed.signal()
            })
    }

    var messages: [[UInt8]] { state.withLock { $0.messages } }
    var messageCount: Int { state.withLock { $0.messages.count } }
    var drains: Int { state.withLock { $0.drains } }
    var closeReasons: [String] { state.withLock { $0.closeReasons } }
    /// `onMessage` or `onDrain` calls that came after `onClose` (must stay 0).
    var eventsAfterClose: Int { state.withLock { $0.eventsAfterClose } }

    /// Waits for `onClose`, at most `seconds`.
    ///
    /// - Returns: whether it ran.
    func waitForClose(seconds: Double = 20) -> Bool {
        closed.wait(timeout: .now() + seconds) == .success
    }
}

/// Runs `body` on its own thread and waits for it at most `seconds`.
///
/// - Returns: `body`'s result, or nil when it had not returned in time (the thread is left to
///   finish on its own).
func finishes<T: Sendable>(within seconds: Double, _ body: @escaping @Sendable () throws -> T) -> T? {
    let result = Mutex<Result<T, any Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    Thread {
        let value = Result { try body() }
        result.withLock { $0 = value }
        done.signal()
    }.start()
    guard done.wait(timeout: .now() + seconds) == .success else { return nil }
    switch result.withLock({ $0! }) {
    case .success(let value): return value
    case .failure(let error):
        Issue.record("failed: \(error)")
        return nil
    }
}

/// Deterministic bytes for message `index` of a test: `count` bytes that differ between messages.
func testMessage(_ index: Int, count: Int) -> [UInt8] {
    var generator = SeededRandom(seed: UInt64(index) &* 0x9E37_79B9 &+ UInt64(count))
    var bytes = [UInt8](repeating: 0, count: count)
    bytes.withUnsafeMutableBytes { buffer in
        var offset = 0
        while offset + 8 <= buffer.count {
            buffer.storeBytes(of: generator.next(), toByteOffset: offset, as: UInt64.self)
            offset += 8
        }
        var last = generator.next()
        while offset < buffer.count {
            buffer[offset] = UInt8(truncatingIfNeeded: last)
            last >>= 8
            offset += 1
        }
    }
    return bytes
}
