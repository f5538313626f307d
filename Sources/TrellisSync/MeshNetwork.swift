import Foundation
import Synchronization
import TrellisCore
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
    /// The mesh keys: the current one and, during a changeover, the next.
    private let keys: Mutex<MeshKeys>
    /// The current mesh key (beacons are sealed with the one current when discovery starts).
    var meshKey: SecretBytes { keys.withLock { $0.current } }
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
    /// Inbound connections before authentication (``PreAuthLimits``), with the sockets to cut.
    private let preAuth: Mutex<(table: PreAuthTable, sockets: [Int: TCPSocket], counters: PreAuthCounters)>
    /// Which refusals are logged (``RefusalLog``).
    private let refusalLog = Mutex(RefusalLog())
    /// Limits on inbound connections before they prove the mesh key.
    public let preAuthLimits: PreAuthLimits
    /// Seconds a whole handshake may take.
    public let handshakeTimeout: Int
    /// The bytes of inbound messages all this node's links may hold at once (``InboundBudget``).
    public let inboundBudget: InboundBudget

    /// - Parameters:
    ///   - engine: the sync engine sessions are handed to.
    ///   - identity: this node's static key pair.
    ///   - meshKey: the current mesh key (32 bytes).
    ///   - nextMeshKey: during a changeover, the next mesh key (docs/SECURITY.md, "Changing the
    ///     mesh key"): accepted from dialers besides the current one, and tried when a peer refuses
    ///     the current one.
    ///   - handshakeTimeout: seconds a whole handshake may take.
    ///   - preAuthLimits: limits on inbound connections before they prove a mesh key.
    ///   - inboundBudget: the bytes of inbound messages all links may hold at once.
    ///   - deviceName: the name advertised to peers inside the handshake (a valid ``DeviceName``),
    ///     or `nil`.
    ///   - pins: the pins of trust on first use read from the pins file.
    ///   - pinsPath: the pins file, for messages.
    ///   - savePins: writes the pins file when they change; `nil` keeps them in memory.
    ///   - log: where refusals and failures are reported.
    public init(
        engine: SyncEngine, identity: KeyPair, meshKey: SecretBytes, nextMeshKey: SecretBytes? = nil,
        handshakeTimeout: Int = 10, preAuthLimits: PreAuthLimits = PreAuthLimits(),
        inboundBudget: InboundBudget = InboundBudget(), deviceName: String? = nil,
        pins: [PeerPin] = [], pinsPath: String = "known-peers",
        savePins: (@Sendable ([PeerPin]) throws -> Void)? = nil,
        log: @escaping @Sendable (String) -> Void = { _ in }
    ) {
        self.deviceName = deviceName
        self.admission = Admission(pins: pins, pinsPath: pinsPath, savePins: savePins, log: log)
        self.handshakeTimeout = handshakeTimeout
        self.preAuthLimits = preAuthLimits
        self.inboundBudget = inboundBudget
        preAuth = Mutex((PreAuthTable(limits: preAuthLimits), [:], PreAuthCounters()))
        ignoreSIGPIPE()
        self.engine = engine
        self.identity = identity
        self.keys = Mutex(MeshKeys(current: meshKey, next: nextMeshKey))
        self.log = log
        engine.setDialer { [weak self] endpoint in self?.connect(endpoint) }
    }

    /// Who may have a session (docs/SECURITY.md, "Admission").
    let admission: Admission
    /// The device name this node advertises inside handshakes (``HandshakePayload``), or `nil`.
    public let deviceName: String?

    /// Admits only these peer keys (``AdmissionMode/allowlist(_:)``), or with `nil` any holder of
    /// the mesh key, for handshakes from now on. Sessions already open are not closed.
    ///
    /// - Parameter keys: 32-byte peer keys (``TrellisNode``'s `peerKey`), or `nil`.
    public func setAllowedPeers(_ keys: Set<[UInt8]>?) {
        admission.mode = keys.map { .allowlist($0) } ?? .meshKey
    }

    /// The admission mode, for handshakes from now on (sessions already open stay).
    public var admissionMode: AdmissionMode {
        get { admission.mode }
        set { admission.mode = newValue }
    }

    /// The decision timeout, the most pending decisions, whether refused peers wait for `trust`.
    public var admissionPolicy: AdmissionPolicy {
        get { admission.policy }
        set { admission.policy = newValue }
    }

    /// The pins of trust on first use (``PinFile``), in file order.
    public var pins: [PeerPin] { admission.pins }

    /// Sets (or with `nil` removes) the connection-request handler, asked after the mode admitted a
    /// peer (``ConnectionRequestHandler``).
    public func setConnectionRequestHandler(_ handler: ConnectionRequestHandler?) {
        admission.setHandler(handler)
    }

    /// The connection-request handler, if one is set.
    public var connectionRequestHandler: ConnectionRequestHandler? { admission.handler }

    /// Connections waiting for a decision now, oldest first.
    public var pendingConnections: [PendingConnection] { admission.pending }

    /// Admits a peer key (``AdmissionMode``): answers its waiting connections with allow, adds it
    /// to the allowlist, or under trust on first use pins it to the name it was last seen with.
    ///
    /// - Parameter key: a 32-byte peer key.
    /// - Returns: what was done, in words.
    /// - Throws: ``DeviceNameError`` when the pins file cannot be written.
    public func trust(peerKey key: [UInt8]) throws -> String {
        try admission.trust(peerKey: key)
    }

    /// Withdraws trust from a peer key: denies its waiting connections, removes it from the
    /// allowlist or forgets its pins, and closes its sessions.
    ///
    /// - Parameter key: a 32-byte peer key.
    /// - Returns: what was done, in words.
    /// - Throws: ``DeviceNameError`` when the pins file cannot be written.
    public func distrust(peerKey key: [UInt8]) throws -> String {
        var done = try admission.distrust(peerKey: key)
        let closed = engine.closeLinks(to: key)
        if closed > 0 { done += (done.isEmpty ? "" : "; ") + "closed \(closed) session(s)" }
        return done.isEmpty ? "nothing to do: \(PeerInfo.hex(key)) is neither trusted, waiting nor connected" : done
    }

    /// The peer key a device name stands for, or `nil` when unknown.
    ///
    /// - Parameters:
    ///   - name: a device name.
    ///   - waitingFirst: `true` (for trusting): the newest waiting connection or peer seen with that
    ///     name before its pin; `false` (for distrusting): its pin first.
    public func peerKey(named name: String, waitingFirst: Bool) -> [UInt8]? {
        admission.peerKey(named: name, waitingFirst: waitingFirst)
    }

    /// The device name a peer key was last seen with, if any.
    public func deviceName(of key: [UInt8]) -> String? { admission.deviceName(of: key) }

    /// Whether `link` may have a session: the mode, then the handler; blocks while pending.
    private func admits(_ link: SecureLink) -> Bool {
        let request = ConnectionRequest(
            peerKey: link.remotePeerKey, address: link.remoteAddress, deviceName: link.remoteDeviceName,
            direction: link.isInitiator ? .outbound : .inbound)
        return admission.decide(request) { self.logRefusal($0, from: request.peerKeyHex) } == .allow
    }

    /// What the accept path did with inbound connections before authentication so far.
    public var preAuthCounters: PreAuthCounters { preAuth.withLock { $0.counters } }

    /// Whether a next mesh key is held (a changeover is under way).
    public var hasNextMeshKey: Bool { keys.withLock { $0.next != nil } }

    /// Sets (or with nil, drops) the next mesh key, for new handshakes from now on.
    ///
    /// - Parameter key: the next mesh key (32 bytes), or nil.
    public func setNextMeshKey(_ key: SecretBytes?) {
        keys.withLock { $0.next = key }
    }

    /// Makes the next mesh key the current one and forgets the old one: from now on handshakes
    /// under the old key are refused. Established sessions stay.
    ///
    /// - Returns: false (and nothing changes) when no next key is held.
    @discardableResult
    public func promoteNextMeshKey() -> Bool {
        keys.withLock { keys in
            guard let next = keys.next else { return false }
            keys.current = next
            keys.next = nil
            return true
        }
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
            Thread.nameCurrent("trellis.listen")
            self?.engine.adoptThreadNice()
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
        thread.start()
        return socketListener.port
    }

    /// Handshake off the accept thread so a slow or silent client cannot block others, within
    /// ``preAuthLimits``: a connection that has not proved a mesh key yet counts against its
    /// source's limit and the total, and is cut when message 1 is late or when a newer connection
    /// needs its place; once message 1 proved a key it counts only against the proved limit.
    private func handshake(inbound socket: TCPSocket) {
        let address = socket.peerAddress
        let host = (try? Endpoint(parsing: address))?.host ?? address
        let source = PreAuthTable.source(of: host)
        let (id, evicted) = preAuth.withLock { state -> (Int, TCPSocket?) in
            state.counters.accepted += 1
            let (id, evict) = state.table.admit(source: source)
            state.sockets[id] = socket
            guard let evict else { return (id, nil) }
            state.counters.evicted += 1
            return (id, state.sockets.removeValue(forKey: evict))
        }
        if let evicted {
            evicted.close()
            logRefusal(
                "cut an unauthenticated connection from \(evicted.peerAddress) to make room (\(source))", from: source)
        }
        let thread = Thread { [weak self] in
            guard let self else { return }
            Thread.nameCurrent("trellis.accept")
            self.engine.adoptThreadNice()
            let proved = Mutex(false)
            do {
                let keys = self.keys.withLock { $0.accepted }
                let link = try SecureLink.handshake(
                    socket: socket, initiator: false, identity: self.identity, meshKeys: keys, address: address,
                    timeout: .seconds(self.handshakeTimeout),
                    firstMessageTimeout: self.preAuthLimits.firstMessageTimeout, deviceName: self.deviceName
                ) { index in
                    let outcome = self.preAuth.withLock { state in
                        state.sockets[id] = nil
                        let outcome = state.table.prove(id)
                        if outcome == .overLimit { state.counters.provedRefused += 1 }
                        return outcome
                    }
                    proved.withLock { $0 = outcome == .proved }
                    if outcome != .proved { socket.close() }
                    if index > 0 { self.log("\(address) proved the next mesh key") }
                }
                self.finishInbound(id, proved: proved.withLock { $0 }) { $0.completed += 1 }
                // Decided after the handshake's places are given back: a decision may wait.
                guard self.admits(link), self.running.load(ordering: .acquiring) else { return link.close() }
                link.useInboundBudget(self.inboundBudget)
                self.engine.attach(link)
            } catch {
                let wasProved = proved.withLock { $0 }
                // Evicted, or refused as over the proved limit: counted already.
                let evictedMeanwhile = !wasProved && !self.preAuth.withLock { $0.table.isUnproved(id) }
                self.finishInbound(id, proved: wasProved) { counters in
                    guard !evictedMeanwhile else { return }
                    switch (error as? HandshakeError)?.reason {
                    case .firstMessageTimeout: counters.firstMessageTimeouts += 1
                    case .wrongMeshKey, .oldProtocol: counters.wrongKey += 1
                    default: counters.failed += 1
                    }
                }
                if !evictedMeanwhile {
                    self.logRefusal("refused an inbound connection from \(address): \(error)", from: source)
                }
            }
        }
        thread.start()
    }

    /// Forgets inbound connection `id` and updates the counters.
    private func finishInbound(_ id: Int, proved: Bool, _ count: (inout PreAuthCounters) -> Void) {
        preAuth.withLock { state in
            state.table.finish(id, proved: proved)
            state.sockets[id] = nil
            count(&state.counters)
        }
    }

    /// Logs a refused connection from `source` (a peer key, or the host of an unauthenticated
    /// connection) as ``RefusalLog`` allows; the lines left out are counted in the next one.
    private func logRefusal(_ line: String, from source: String) {
        let now = ContinuousClock.now
        guard let suppressed = refusalLog.withLock({ $0.admit(from: source, at: now) }) else { return }
        log(suppressed > 0 ? "\(line) (and \(suppressed) more refusals not logged)" : line)
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
            Thread.nameCurrent("trellis.dial")
            self.engine.adoptThreadNice()
            do {
                let endpoint = try Endpoint(parsing: name)
                let keys = self.keys.withLock { $0.accepted }
                var link: SecureLink?
                // The current key first; a peer that refuses it may already use the next one.
                for (index, key) in keys.enumerated() where link == nil {
                    do {
                        let socket = try TCPSocket.connect(to: endpoint)
                        link = try SecureLink.handshake(
                            socket: socket, initiator: true, identity: self.identity, meshKeys: [key],
                            address: endpoint.description, timeout: .seconds(self.handshakeTimeout),
                            firstMessageTimeout: .seconds(self.handshakeTimeout), deviceName: self.deviceName)
                    } catch let error as HandshakeError where error.reason == .refusedByPeer && index + 1 < keys.count {
                        continue
                    }
                }
                guard let link else { throw HandshakeError(.refusedByPeer, "no mesh key to dial with") }
                guard self.admits(link), self.running.load(ordering: .acquiring) else {
                    link.close()
                    throw LinkError.notAdmitted
                }
                link.useInboundBudget(self.inboundBudget)
                self.engine.attach(link, endpoint: name)
            } catch {
                self.engine.dialFailed(name, reason: "\(error)")
            }
        }
        thread.start()
    }

    /// Whether the network runs (between ``start()`` and ``stop()``).
    public var isRunning: Bool { running.load(ordering: .acquiring) }

    /// Stops listening, dialing and discovery, denies the connections waiting for a decision, and
    /// closes every session. Repeatable: ``start()`` resumes.
    public func stop() {
        running.store(false, ordering: .releasing)
        let old = listener.withLock { current in
            defer { current = nil }
            return current
        }
        old?.close()
        pauseDiscovery()
        admission.denyWaiting()
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

/// The mesh keys a node holds: the current one and, during a changeover, the next.
struct MeshKeys: Sendable {
    var current: SecretBytes
    var next: SecretBytes?

    /// The keys tried, current first.
    var accepted: [SecretBytes] { [current] + (next.map { [$0] } ?? []) }
}

/// Which refused connections are logged: each source (a peer key, or the host of an
/// unauthenticated connection) at most once a second, and at most
/// ``RefusalLog/linesPerSecond`` lines a second in all, so that a stranger reconnecting in a loop
/// cannot fill the log, nor hide the refusal of another peer.
struct RefusalLog {
    /// The most refusal lines logged within one second.
    static let linesPerSecond = 5
    /// When each source was last logged (pruned to the last second past 64 sources).
    private var last: [String: ContinuousClock.Instant] = [:]
    /// The second lines are counted in, and how many were logged in it.
    private var window: (start: ContinuousClock.Instant, lines: Int)?
    /// The refusals left out since the last line logged.
    private var suppressed = 0

    /// Whether a refusal from `source` at `now` is logged: the number of refusals left out since
    /// the last line logged, or `nil` when this one is left out (and counted).
    ///
    /// - Complexity: amortised O(1).
    mutating func admit(from source: String, at now: ContinuousClock.Instant) -> Int? {
        if let logged = last[source], now - logged < .seconds(1) {
            suppressed += 1
            return nil
        }
        if let window, now - window.start < .seconds(1) {
            guard window.lines < Self.linesPerSecond else {
                suppressed += 1
                return nil
            }
            self.window = (window.start, window.lines + 1)
        } else {
            window = (now, 1)
        }
        if last.count >= 64 { last = last.filter { now - $0.value < .seconds(1) } }
        last[source] = now
        defer { suppressed = 0 }
        return suppressed
    }
}
