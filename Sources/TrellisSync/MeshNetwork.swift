import Foundation
import Synchronization
public import TrellisCrypto
public import TrellisNet

/// The TCP side of a node: a listener, and the dials the replicator schedules, each completed
/// connection handed to the ``SyncEngine``.
///
/// When and whom to dial (static peers, jittered exponential backoff from 0.25 s up to 30 s,
/// never while a session with that peer exists) is decided by the ``Replicator``; this type
/// only connects and runs handshakes, each on its own thread.
public final class MeshNetwork: Sendable {
    public let engine: SyncEngine
    private let identity: KeyPair
    private let meshKey: SecretBytes
    private let log: @Sendable (String) -> Void
    private let running = Atomic<Bool>(true)
    private let listener: Mutex<TCPListener?> = Mutex(nil)
    private let pendingHandshakes = Atomic<Int>(0)
    /// Inbound handshakes allowed in progress at once; more connections are closed at once.
    public let maxPendingHandshakes = 32
    /// Seconds a whole handshake may take.
    public let handshakeTimeout: Int

    public init(
        engine: SyncEngine, identity: KeyPair, meshKey: SecretBytes, handshakeTimeout: Int = 10,
        log: @escaping @Sendable (String) -> Void = { _ in }
    ) {
        self.handshakeTimeout = handshakeTimeout
        ignoreSIGPIPE()
        self.engine = engine
        self.identity = identity
        self.meshKey = meshKey
        self.log = log
        engine.setDialer { [weak self] endpoint in self?.connect(endpoint) }
    }

    /// Starts listening.
    ///
    /// - Returns: the bound port (useful with port 0).
    /// - Throws: ``SocketError`` when the address cannot be bound.
    @discardableResult
    public func listen(on endpoint: Endpoint) throws -> UInt16 {
        let socketListener = try TCPListener(endpoint: endpoint)
        listener.withLock { $0 = socketListener }
        let thread = Thread { [weak self] in
            while let self, self.running.load(ordering: .acquiring) {
                let socket: TCPSocket
                do {
                    socket = try socketListener.accept()
                } catch {
                    if self.running.load(ordering: .acquiring) { self.log("accept failed: \(error)") }
                    return
                }
                self.handshake(inbound: socket)
            }
        }
        thread.name = "trellis.listen"
        thread.start()
        return socketListener.port
    }

    /// Handshake off the accept thread so a slow or silent client cannot block others, and at
    /// most ``maxPendingHandshakes`` at once, so many of them cannot exhaust threads and
    /// descriptors (each also has a deadline).
    private func handshake(inbound socket: TCPSocket) {
        guard pendingHandshakes.add(1, ordering: .acquiringAndReleasing).newValue <= maxPendingHandshakes else {
            pendingHandshakes.subtract(1, ordering: .acquiringAndReleasing)
            log("refused an inbound connection from \(socket.peerAddress): too many handshakes in progress")
            socket.close()
            return
        }
        let thread = Thread { [weak self] in
            guard let self else { return }
            defer { self.pendingHandshakes.subtract(1, ordering: .acquiringAndReleasing) }
            do {
                let link = try SecureLink.handshake(
                    socket: socket, initiator: false, identity: self.identity, meshKey: self.meshKey,
                    address: socket.peerAddress, timeout: self.handshakeTimeout)
                self.engine.attach(link)
            } catch {
                self.log("refused an inbound connection from \(socket.peerAddress): \(error)")
            }
        }
        thread.start()
    }

    /// Keeps a connection to `endpoint`: the replicator dials it whenever no session with the
    /// peer behind it exists.
    public func dial(_ endpoint: Endpoint) {
        engine.addPeer(endpoint.description)
    }

    /// Connects and runs the handshake for one dial the replicator asked for.
    private func connect(_ name: String) {
        guard running.load(ordering: .acquiring) else { return }
        let thread = Thread { [weak self] in
            guard let self else { return }
            do {
                let endpoint = try Endpoint(parsing: name)
                let socket = try TCPSocket.connect(to: endpoint)
                let link = try SecureLink.handshake(
                    socket: socket, initiator: true, identity: self.identity, meshKey: self.meshKey,
                    address: endpoint.description, timeout: self.handshakeTimeout)
                self.engine.attach(link, endpoint: name)
            } catch {
                self.engine.dialFailed(name, reason: "\(error)")
            }
        }
        thread.name = "trellis.dial.\(name)"
        thread.start()
    }

    /// Stops listening and dialing and closes every session.
    public func stop() {
        running.store(false, ordering: .releasing)
        listener.withLock { $0?.close() }
        engine.close()
    }
}
