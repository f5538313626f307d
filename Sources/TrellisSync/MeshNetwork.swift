import Foundation
import Synchronization
public import TrellisCrypto
public import TrellisNet

/// The TCP side of a node: a listener, and the dials the replicator schedules, each completed
/// connection handed to the ``SyncEngine``.
///
/// When and whom to dial (static peers and the peers LAN discovery found, jittered exponential
/// backoff from 0.25 s up to 30 s, never while a session with that peer exists) is decided by the
/// ``Replicator``; this type only connects and runs handshakes, each on its own thread, and runs
/// the discovery socket (MeshNetwork+Discovery.swift).
public final class MeshNetwork: Sendable {
    public let engine: SyncEngine
    let identity: KeyPair
    let meshKey: SecretBytes
    let log: @Sendable (String) -> Void
    /// The discovery socket while discovery runs (MeshNetwork+Discovery.swift).
    let discoverySocket = Mutex<DiscoverySocket?>(nil)
    /// How discovery was started, kept across ``stop()`` for ``start()``.
    let discoveryParameters = Mutex<DiscoveryParameters?>(nil)
    /// The TCP port listened on (0 when not listening); beacons announce it.
    var listeningPort: UInt16 { listener.withLock { $0?.port ?? 0 } }
    private let running = Atomic<Bool>(true)
    private let closed = Atomic<Bool>(false)
    private let listener: Mutex<TCPListener?> = Mutex(nil)
    /// What to listen on again after ``stop()``: the endpoint last listened on, with its bound port.
    private let listenEndpoint: Mutex<Endpoint?> = Mutex(nil)
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
        let previous = listener.withLock { current in
            defer { current = socketListener }
            return current
        }
        previous?.close()
        listenEndpoint.withLock { $0 = Endpoint(host: endpoint.host, port: socketListener.port) }
        engine.setListeningPort(socketListener.port)
        let thread = Thread { [weak self] in
            while let self, self.running.load(ordering: .acquiring) {
                let socket: TCPSocket
                do {
                    socket = try socketListener.accept()
                } catch {
                    let current = self.listener.withLock { $0 === socketListener }
                    if current && self.running.load(ordering: .acquiring) { self.log("accept failed: \(error)") }
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

    /// Whether the network runs (between ``start()`` and ``stop()``).
    public var isRunning: Bool { running.load(ordering: .acquiring) }

    /// Stops listening, dialing and discovery, and closes every session. Repeatable: ``start()``
    /// resumes.
    public func stop() {
        running.store(false, ordering: .releasing)
        let old = listener.withLock { current in
            defer { current = nil }
            return current
        }
        old?.close()
        pauseDiscovery()
        engine.stop()
    }

    /// Resumes after ``stop()``: listens again on the endpoint and port listened on before (if
    /// any), dials the static peers again, and runs discovery again if it ran. Does nothing when
    /// running.
    ///
    /// - Throws: ``SocketError`` when the port cannot be bound again (the network stays
    ///   stopped), or after ``close()``.
    public func start() throws {
        guard !closed.load(ordering: .acquiring) else {
            throw SocketError("start", message: "the node was closed; open a new one")
        }
        guard !running.load(ordering: .acquiring) else { return }
        running.store(true, ordering: .releasing)
        if let endpoint = listenEndpoint.withLock({ $0 }) {
            do {
                try listen(on: endpoint)
            } catch {
                running.store(false, ordering: .releasing)
                throw error
            }
        }
        engine.start()
        resumeDiscovery()
    }

    /// Stops for good: ``stop()``, and the engine's timer ends.
    public func close() {
        closed.store(true, ordering: .releasing)
        stop()
        engine.close()
    }
}
