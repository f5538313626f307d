import Foundation
import Synchronization
public import TrellisCrypto
public import TrellisNet

/// The TCP side of a node: a listener and one dialer per static peer, each completed connection
/// handed to the ``SyncEngine``.
///
/// Dialers reconnect with jittered exponential backoff (0.25 s doubling up to ``maxBackoff``;
/// the delay resets after a session that lasted at least 10 s).
public final class MeshNetwork: Sendable {
    public let engine: SyncEngine
    private let identity: KeyPair
    private let meshKey: SecretBytes
    private let log: @Sendable (String) -> Void
    private let running = Atomic<Bool>(true)
    private let listener: Mutex<TCPListener?> = Mutex(nil)
    private let wakeups = Mutex<[Endpoint: DispatchSemaphore]>([:])
    private let pendingHandshakes = Atomic<Int>(0)
    /// Inbound handshakes allowed in progress at once; more connections are closed at once.
    public let maxPendingHandshakes = 32
    /// Longest wait between reconnect attempts, seconds.
    public let maxBackoff: Double
    /// Seconds a whole handshake may take.
    public let handshakeTimeout: Int

    public init(
        engine: SyncEngine, identity: KeyPair, meshKey: SecretBytes, maxBackoff: Double = 30,
        handshakeTimeout: Int = 10, log: @escaping @Sendable (String) -> Void = { _ in }
    ) {
        self.handshakeTimeout = handshakeTimeout
        ignoreSIGPIPE()
        self.engine = engine
        self.identity = identity
        self.meshKey = meshKey
        self.maxBackoff = maxBackoff
        self.log = log
    }

    /// Starts listening.
    ///
    /// - Returns: the bound port (useful with port 0).
    /// - Throws: ``SocketError`` when the address cannot be bound.
    @discardableResult
    public func listen(on endpoint: Endpoint) throws -> UInt16 {
        let socketListener = try TCPListener(endpoint: endpoint)
        listener.withLock { $0 = socketListener }
        let thread = Thread { [self] in
            while running.load(ordering: .acquiring) {
                let socket: TCPSocket
                do {
                    socket = try socketListener.accept()
                } catch {
                    if running.load(ordering: .acquiring) { log("accept failed: \(error)") }
                    return
                }
                // Handshake off the accept thread so a slow or silent client cannot block others,
                // and at most `maxPendingHandshakes` at once, so many of them cannot exhaust threads
                // and descriptors (each also has a deadline).
                guard pendingHandshakes.add(1, ordering: .acquiringAndReleasing).newValue <= maxPendingHandshakes
                else {
                    pendingHandshakes.subtract(1, ordering: .acquiringAndReleasing)
                    log("refused an inbound connection from \(socket.peerAddress): too many handshakes in progress")
                    socket.close()
                    continue
                }
                let handshakeThread = Thread { [self] in
                    defer { pendingHandshakes.subtract(1, ordering: .acquiringAndReleasing) }
                    do {
                        let link = try SecureLink.handshake(
                            socket: socket, initiator: false, identity: identity, meshKey: meshKey,
                            address: socket.peerAddress, timeout: handshakeTimeout)
                        engine.attach(link)
                    } catch {
                        log("refused an inbound connection from \(socket.peerAddress): \(error)")
                    }
                }
                handshakeThread.start()
            }
        }
        thread.name = "trellis.listen"
        thread.start()
        return socketListener.port
    }

    /// Keeps a connection to `endpoint`, reconnecting after failures.
    public func dial(_ endpoint: Endpoint) {
        let wake = DispatchSemaphore(value: 0)
        wakeups.withLock { $0[endpoint] = wake }
        let thread = Thread { [self] in
            var backoff = 0.25
            while running.load(ordering: .acquiring) {
                let started = Date()
                do {
                    let socket = try TCPSocket.connect(to: endpoint)
                    let link = try SecureLink.handshake(
                        socket: socket, initiator: true, identity: identity, meshKey: meshKey,
                        address: endpoint.description, timeout: handshakeTimeout)
                    let done = DispatchSemaphore(value: 0)
                    let closed = ClosedSignal(done)
                    engine.attach(ObservedLink(link, onClose: closed.fire))
                    done.wait()
                } catch {
                    log("cannot connect to \(endpoint): \(error)")
                }
                guard running.load(ordering: .acquiring) else { return }
                if Date().timeIntervalSince(started) >= 10 { backoff = 0.25 }
                let delay = backoff * Double.random(in: 0.5...1.5)
                backoff = min(maxBackoff, backoff * 2)
                _ = wake.wait(timeout: .now() + delay)
            }
        }
        thread.name = "trellis.dial.\(endpoint)"
        thread.start()
    }

    /// Stops listening and dialing and closes every session.
    public func stop() {
        running.store(false, ordering: .releasing)
        listener.withLock { $0?.close() }
        wakeups.withLock { for semaphore in $0.values { semaphore.signal() } }
        engine.close()
    }
}

private final class ClosedSignal: Sendable {
    let semaphore: DispatchSemaphore
    init(_ semaphore: DispatchSemaphore) { self.semaphore = semaphore }
    @Sendable func fire() { semaphore.signal() }
}

/// Wraps a link to learn when it closes (the dialer waits on it before reconnecting).
private final class ObservedLink: MessageLink {
    let base: any MessageLink
    let onClose: @Sendable () -> Void

    init(_ base: any MessageLink, onClose: @escaping @Sendable () -> Void) {
        self.base = base
        self.onClose = onClose
    }

    var remotePeerKey: [UInt8] { base.remotePeerKey }
    var isInitiator: Bool { base.isInitiator }
    var remoteAddress: String { base.remoteAddress }

    var queuedBytes: Int { base.queuedBytes }
    var highWater: Int { base.highWater }
    var lowWater: Int { base.lowWater }

    func start(
        onMessage: @escaping @Sendable ([UInt8]) -> Void, onDrain: @escaping @Sendable () -> Void,
        onClose close: @escaping @Sendable (String) -> Void
    ) {
        let notify = onClose
        base.start(onMessage: onMessage, onDrain: onDrain) { reason in
            close(reason)
            notify()
        }
    }

    func send(_ message: [UInt8]) throws -> Int { try base.send(message) }
    func close() { base.close() }
}
