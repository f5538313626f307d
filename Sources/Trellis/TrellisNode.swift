public import Foundation
public import TrellisCore
public import TrellisCrypto
public import TrellisNet
public import TrellisStore
public import TrellisSync

/// Options for a ``TrellisNode``.
public struct NodeOptions: Sendable {
    /// Store options (size limits, clock).
    public var store = StoreOptions()
    /// Where node events (sessions, refusals) are reported.
    public var log: @Sendable (String) -> Void = { _ in }
    /// LAN discovery: `nil` (the default for a library node) keeps it off; set it to find the
    /// nodes holding the same mesh key on the LAN and connect to them by themselves
    /// (docs/MESH.md). `trellis node` turns it on unless given `--no-discovery`.
    public var discovery: DiscoveryOptions?
    /// Most sessions at once (``ReplicatorConfiguration/maxSessions``): beyond it, new sessions
    /// are refused as busy unless with a static peer, and discovered peers subscribing to the
    /// same collections are dialed first.
    public var maxSessions = 64
    /// During a mesh-key changeover, the next mesh key (docs/SECURITY.md, "Changing the mesh
    /// key"): the node accepts dialers holding it as well as the current key, and when a peer
    /// refuses the current key it tries this one. ``TrellisNode/promoteNextMeshKey()`` makes it
    /// current.
    public var nextMeshKey: MeshKey?
    /// Limits on inbound connections before they prove the mesh key (per source, in all, the
    /// deadline for the first handshake message).
    public var preAuthLimits = PreAuthLimits()
    /// The bytes of inbound messages all sessions may hold at once: messages being received and
    /// those received but not yet merged (default 256 MiB, ``InboundBudget/defaultLimit``; at
    /// least 1). When they would go above it, the session holding the most is closed
    /// (docs/SECURITY.md, "Limits"). A message longer than this can never be received.
    public var inboundBufferBytes = InboundBudget.defaultLimit
    /// Which authenticated peers may have a session, inbound and outbound alike: any holder of
    /// the mesh key (the default), an allowlist of peer keys, or trust on first use (docs/SECURITY.md,
    /// "Admission"). ``TrellisNode/admissionMode`` changes it.
    public var admission: AdmissionMode = .meshKey
    /// The allowlist as ``admission`` holds it: `nil` for any other mode; setting a set selects
    /// ``AdmissionMode/allowlist(_:)``, setting `nil` ``AdmissionMode/meshKey``.
    @available(*, deprecated, renamed: "admission", message: "use admission = .allowlist(keys)")
    public var allowedPeers: Set<[UInt8]>? {
        get { if case .allowlist(let keys) = admission { keys } else { nil } }
        set { admission = newValue.map { .allowlist($0) } ?? .meshKey }
    }
    /// The name this node advertises to peers, inside the encrypted handshake (never in clear):
    /// 1 to 64 bytes of UTF-8, no control characters (``DeviceName``). Trust on first use pins
    /// peer keys to these names. `nil` (the default) advertises none; `trellis node` uses the
    /// host name unless given `--name`.
    public var deviceName: String?
    /// Asked about every peer the mode admitted, after the handshake and before any message
    /// (``ConnectionRequestHandler``; Ditto's `connectionRequestHandler`);
    /// ``Presence/connectionRequestHandler`` changes it.
    public var connectionRequestHandler: ConnectionRequestHandler?
    /// The decision timeout (5 s), the most connections waiting for a decision (16), and whether
    /// peers the mode refuses wait for ``TrellisNode/trust(peerKey:)``.
    public var admissionPolicy = AdmissionPolicy()
    /// Who may read and write which collection, per peer key, group or any admitted peer
    /// (docs/SECURITY.md, "Authorization"). The default, ``Authorization/open``, lets every
    /// admitted peer read and write everything; ``TrellisNode/setAuthorization(_:)`` changes it
    /// at run time. `trellis node --rules FILE` reads it from a rules file
    /// (``Authorization/init(json:)``).
    public var authorization = Authorization.open
    /// The quality of service of the node's replication work: the sync engine's queue, where
    /// remote batches are merged and peers' scans are read, and the threads of its links, dials,
    /// handshakes and discovery, which take the same Linux nice value (libdispatch runs
    /// `.background` at nice 10, `.utility` at 2, `.default` at 0). The default, `.background`,
    /// lets the application's own threads go first when the cores are busy, so its reads wait
    /// less for a merge or a peer's scan, while replication keeps a share of the cores (about a
    /// tenth of one against a thread at nice 0 that never sleeps); `.default` runs replication as
    /// the application's own work (docs/ARCHITECTURE.md, "Threads").
    public var replicationQoS: DispatchQoS = .background

    public init() {}
}

/// One Trellis node: a local store in a data directory, its identity, and, once started, sync
/// with peers over encrypted TCP. (The counterpart of a `Ditto` instance.)
///
/// The data directory holds `store.sqlite` (with its WAL) and `identity.key` (the node's static
/// X25519 private key, mode 0600). The directory is locked (`DIR/lock`) for as long as the node's
/// store exists: another node on the same directory, in this process or another, is refused until
/// then, so there is never a second writer.
public final class TrellisNode: Sendable {
    public let store: Store
    public let identity: KeyPair
    public let directory: URL
    let engine: SyncEngine
    let network: MeshNetwork
    /// Subscriptions and their sync status per peer (Ditto's `ditto.sync`).
    public let sync: NodeSync
    /// Who is in the mesh: direct peers, peers several hops away, incompatible peers (Ditto's
    /// `ditto.presence`).
    public let presence: Presence

    /// Opens (creating if needed) a node in `directory`.
    ///
    /// - Throws: ``StoreError``, ``MeshKeyError`` (unreadable identity), or file-system errors.
    public init(directory: URL, meshKey: MeshKey, options: NodeOptions = NodeOptions()) throws {
        Sodium.initialize()
        try Files.makeDirectory(directory.path)
        // The store owns the lock: it is released only when the store is, that is when nothing
        // (the engine, a network thread, the app) can write through it any more.
        let lock = try DataDirectoryLock(directory: directory.path)
        self.directory = directory
        let identityFile = directory.appendingPathComponent("identity.key")
        identity = try Self.loadOrCreateIdentity(identityFile)
        let documents = try DocumentStore(
            path: directory.appendingPathComponent("store.sqlite").path, options: options.store, lock: lock)
        let sitePinsFile = directory.appendingPathComponent(Self.sitePinsFileName).path
        let sitePins = try Self.readSitePins(sitePinsFile)
        if let owner = sitePins.first(where: { $0.site == documents.siteID })?.peerKey, owner != identity.publicKey {
            // The store's site ID is bound to another key (this directory's identity key was
            // replaced, or the directory copied without it): peers that saw the site refuse it
            // under this key (docs/SECURITY.md, "Site IDs"), and a copy would share it with its
            // original. Writes from now on take a new site ID, bound to this key.
            try documents.rotateLog(
                reason: "its site ID is bound to peer key \(NodeStatus.hex(owner.prefix(8)))… in site-pins, and this "
                    + "node's key is \(NodeStatus.hex(identity.publicKey.prefix(8)))… (a new identity key, or a copied "
                    + "data directory): its writes take a new site ID")
        }
        var configuration = ReplicatorConfiguration(peerKey: identity.publicKey)
        configuration.maxSessions = max(1, options.maxSessions)
        configuration.authorization = options.authorization
        configuration.sitePins = sitePins
        engine = try SyncEngine(
            store: documents, peerKey: identity.publicKey, configuration: configuration, log: options.log,
            saveSitePins: { try Self.writeSitePins($0, to: sitePinsFile) },
            qos: options.replicationQoS)
        if let name = options.deviceName { try DeviceName.check(name) }
        let pinsFile = directory.appendingPathComponent(Self.pinsFileName).path
        network = MeshNetwork(
            engine: engine, identity: identity, meshKey: meshKey.secret, nextMeshKey: options.nextMeshKey?.secret,
            preAuthLimits: options.preAuthLimits,
            inboundBudget: InboundBudget(limit: max(1, options.inboundBufferBytes)),
            deviceName: options.deviceName,
            pins: try Self.readPins(pinsFile), pinsPath: pinsFile, savePins: { try Self.writePins($0, to: pinsFile) },
            log: options.log)
        network.admissionMode = options.admission
        network.admissionPolicy = options.admissionPolicy
        network.setConnectionRequestHandler(options.connectionRequestHandler)
        store = Store(documents: documents, subscriptions: engine)
        sync = NodeSync(engine: engine)
        presence = Presence(engine: engine, network: network)
        if let discovery = options.discovery {
            try network.startDiscovery(
                port: discovery.port, scope: discovery.scope, configuration: discovery.configuration(identity.publicKey)
            )
        }
    }

    /// A node dropped without ``stop()`` stops its networking, so its threads end and release
    /// the store (and with it the directory's lock).
    deinit { network.close() }

    /// Reads `DIR/identity.key`, or makes a new identity there when the file does not exist.
    ///
    /// - Throws: ``MeshKeyError`` when the file is not private (mode other than 0600), empty,
    ///   truncated or otherwise not a 32-byte key, or cannot be written.
    static func loadOrCreateIdentity(_ file: URL) throws -> KeyPair {
        // A leftover temporary file is an interrupted write: the key file itself is whole (the
        // old one, or none at all), and the leftover holds key bytes, so it goes.
        unlink(Files.secretTemporary(file.path))
        var info = stat()
        if lstat(file.path, &info) == 0 {
            let secret: SecretBytes
            do { secret = try Files.readSecret(file.path, what: "identity key file") } catch {
                throw MeshKeyError("\(error)")
            }
            guard secret.count == KeyPair.privateKeyLength else {
                throw MeshKeyError(
                    "identity key file \(file.path) holds \(secret.count) bytes, not a \(KeyPair.privateKeyLength)-byte "
                        + "key (\(secret.count == 0 ? "empty" : "truncated or not a key")); restore it from a backup, or "
                        + "delete it to give this node a new identity (peers then see a new peer key, and its writes a new site ID)"
                )
            }
            do { return try KeyPair(privateKey: secret) } catch {
                throw MeshKeyError("identity key file \(file.path) does not hold a usable key: \(error)")
            }
        }
        let pair = KeyPair.generate()
        do {
            try pair.privateKey.withUnsafeBytes { bytes in try Files.writeSecret(bytes, to: file.path) }
        } catch {
            throw MeshKeyError("cannot write the identity key: \(error)")
        }
        return pair
    }

    /// Sets (or with nil, drops) the next mesh key of a changeover, for handshakes from now on
    /// (``NodeOptions/nextMeshKey``).
    ///
    /// - Parameter key: the next mesh key, or nil.
    public func setNextMeshKey(_ key: MeshKey?) {
        network.setNextMeshKey(key?.secret)
    }

    /// Admits only these peer keys from now on (``AdmissionMode/allowlist(_:)``), or with `nil` any
    /// holder of the mesh key (docs/SECURITY.md, "Admission"). Sessions already open stay until
    /// they end.
    ///
    /// - Parameter keys: 32-byte peer keys, or `nil`.
    public func setAllowedPeers(_ keys: Set<[UInt8]>?) { network.setAllowedPeers(keys) }

    /// Ends a mesh-key changeover on this node: the next mesh key becomes the current one and the
    /// old one is forgotten, so from now on peers holding only the old key are refused (they see
    /// "the peer closed the connection without answering: it holds another mesh key"). Sessions
    /// already established stay until they end. LAN discovery keeps sealing beacons with the key
    /// that was current when it started until it is started again.
    ///
    /// - Returns: false (and nothing changes) when the node holds no next mesh key.
    @discardableResult
    public func promoteNextMeshKey() -> Bool {
        network.promoteNextMeshKey()
    }

    /// This node's peer key (static public key), hex.
    public var peerKeyHex: String { NodeStatus.hex(identity.publicKey) }

    /// The peer key written as ``peerKeyHex`` writes it: 64 hex digits (either case), or `nil`.
    public static func peerKey(hex text: String) -> [UInt8]? { PinFile.peerKey(hex: text) }

    /// Starts accepting connections on `endpoint` (and starts sync if it was stopped: see
    /// ``startSync()``). After ``stopSync()``, ``startSync()`` listens again on the same address
    /// and port.
    ///
    /// - Returns: the bound port.
    /// - Throws: ``SocketError`` when the address cannot be bound.
    @discardableResult
    public func listen(on endpoint: Endpoint) throws -> UInt16 {
        try network.start()
        return try network.listen(on: endpoint)
    }

    /// Keeps a connection to a static peer: dialed whenever sync is active and no session with
    /// the peer behind it exists (jittered exponential backoff, 0.25 s to 30 s). Added while sync
    /// is stopped, it is dialed at the next ``startSync()``.
    public func connect(to endpoint: Endpoint) {
        network.dial(endpoint)
    }

    /// Starts LAN discovery (if ``NodeOptions/discovery`` did not already): beacons announce
    /// the port this node listens on, so start it after ``listen(on:)``. Started while sync is
    /// stopped, it runs from the next ``startSync()``.
    ///
    /// - Throws: ``SocketError`` when the discovery port cannot be bound.
    public func startDiscovery(_ options: DiscoveryOptions = DiscoveryOptions()) throws {
        try network.startDiscovery(
            port: options.port, scope: options.scope, configuration: options.configuration(identity.publicKey))
    }

    /// Stops LAN discovery; sessions with discovered peers stay until they end.
    public func stopDiscovery() {
        network.stopDiscovery()
    }

    /// Starts (or resumes) sync, as Ditto's `startSync()`: listens again where the node listened
    /// before ``stopSync()``, runs discovery again if it ran, dials the static peers at once
    /// (backoff reset), and serves and asks for subscriptions on every new session. A node syncs from its creation, so calling this
    /// first is harmless; it does nothing while sync is active. Repeatable.
    ///
    /// - Throws: ``SocketError`` when the listening port cannot be bound again; sync stays
    ///   stopped then.
    public func startSync() throws {
        try network.start()
    }

    /// Stops sync, as Ditto's `stopSync()`: closes every session and the listener and stops
    /// dialing and discovery (its cache is forgotten). Subscriptions, static peers, the store and live queries stay; local writes go on
    /// and are sent at the next ``startSync()``. Repeatable.
    public func stopSync() {
        network.stop()
    }

    /// Whether sync is active (between ``startSync()`` and ``stopSync()``; a new node is active).
    public var isSyncActive: Bool { network.isRunning }

    /// Stops all networking (``stopSync()``). The local store stays usable.
    public func stop() {
        network.stop()
    }

    /// Stops all networking for good and closes the store cleanly (``DocumentStore/close()``):
    /// the next open knows that no commit can have been lost. Call it before a process exits; the
    /// node cannot be used afterwards (store calls throw ``StoreError/closed``, ``startSync()``
    /// does not resume).
    public func close() {
        network.close()
        store.documents.close()
    }

    /// The directly connected peers.
    public var peers: [PeerInfo] { engine.peers }

    /// The peers LAN discovery currently knows (heard from within the cache lifetime), by peer
    /// key: key, source addresses, TCP port, protocol version, compatibility, epoch, last seen.
    /// Empty when discovery is off.
    public var discoveredPeers: [DiscoveredPeer] { engine.discoveredPeers }

    /// Calls `observer` with ``discoveredPeers`` whenever a peer appears, announces something
    /// new, or leaves the cache (not when a beacon only refreshes it); `nil` removes it. One
    /// observer at a time; it runs on the sync engine's queue and must not block.
    public func observeDiscovery(_ observer: (@Sendable ([DiscoveredPeer]) -> Void)?) {
        engine.observeDiscovery(observer)
    }

    /// Beacons sent, accepted and dropped; `nil` when discovery is off.
    public var discoveryStatistics: DiscoveryStatistics? { engine.discoveryStatistics }

    /// This node's own subscriptions.
    public var subscriptions: [SubscriptionSpec] { engine.subscriptions }
}

/// The 32-byte secret shared by all nodes of one mesh (the Noise psk).
public struct MeshKey: Sendable {
    public let secret: SecretBytes

    /// Generates a random mesh key.
    public static func generate() -> MeshKey {
        Sodium.initialize()
        return MeshKey(secret: SecretBytes.random(count: 32))
    }

    init(secret: SecretBytes) { self.secret = secret }

    /// Reads a key file: 64 hex digits (surrounding whitespace ignored) or 32 raw bytes.
    ///
    /// The file must be private (mode 0600 or stricter); the bytes read are wiped once parsed.
    ///
    /// - Throws: ``MeshKeyError`` naming the file and what is wrong with it: missing, readable or
    ///   writable by group or others (with the `chmod 600` fix), empty, truncated, not hex, or all
    ///   zero.
    public init(contentsOf file: URL) throws {
        let raw: SecretBytes
        do { raw = try Files.readSecret(file.path, what: "mesh key file") } catch {
            throw MeshKeyError("\(error)")
        }
        guard let secret = raw.withUnsafeBytes({ Self.parse($0) }) else {
            throw MeshKeyError(
                "mesh key file \(file.path) "
                    + (raw.count == 0 ? "is empty" : "holds \(raw.count) bytes that are not 64 hex digits")
                    + "; copy it again from a node of the mesh, or make a new mesh key with `trellis keygen`")
        }
        guard secret.withUnsafeBytes({ $0.contains(where: { $0 != 0 }) }) else {
            throw MeshKeyError(
                "mesh key file \(file.path) holds an all-zero key; make a random one with `trellis keygen`")
        }
        self.secret = secret
    }

    /// Parses a key file's content: 64 hex digits between optional ASCII whitespace, or exactly
    /// 32 bytes; nil otherwise. No copy outside ``SecretBytes`` is made.
    static func parse(_ raw: UnsafeRawBufferPointer) -> SecretBytes? {
        func isSpace(_ c: UInt8) -> Bool { c == 0x20 || (0x09...0x0D).contains(c) }
        var start = 0
        var end = raw.count
        while start < end, isSpace(raw[start]) { start += 1 }
        while end > start, isSpace(raw[end - 1]) { end -= 1 }
        if end - start == 64,
            (start..<end).allSatisfy({ hexValue(raw[$0]) != nil })
        {
            return SecretBytes(count: 32) { out in
                for index in 0..<32 {
                    out[index] = hexValue(raw[start + 2 * index])! << 4 | hexValue(raw[start + 2 * index + 1])!
                }
            }
        }
        guard raw.count == 32 else { return nil }
        return SecretBytes(count: 32) { $0.copyMemory(from: raw) }
    }

    /// Writes the key as 64 hex digits and a newline to `file`: mode 0600, atomically
    /// (``Files/writeSecret(_:to:)``); the hex text is wiped afterwards.
    ///
    /// - Throws: ``MeshKeyError`` naming the file and the system's reason.
    public func write(to file: URL) throws {
        let digits = Array("0123456789abcdef".utf8)
        var text = [UInt8](repeating: 0x0A, count: 2 * secret.count + 1)
        defer { Sodium.wipe(&text) }
        secret.withUnsafeBytes { bytes in
            for (index, byte) in bytes.enumerated() {
                text[2 * index] = digits[Int(byte >> 4)]
                text[2 * index + 1] = digits[Int(byte & 0x0F)]
            }
        }
        do {
            try text.withUnsafeBytes { bytes in try Files.writeSecret(bytes, to: file.path) }
        } catch {
            throw MeshKeyError("cannot write the mesh key: \(error)")
        }
    }

    static func hexValue(_ c: UInt8) -> UInt8? {
        switch c {
        case 48...57: return c - 48
        case 97...102: return c - 87
        case 65...70: return c - 55
        default: return nil
        }
    }
}

/// A key file that cannot be used.
public struct MeshKeyError: Error, Sendable, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}

/// A `host:port` address to listen on or dial.
public typealias Endpoint = TrellisNet.Endpoint
/// Why a link ended, by kind (``NodeStatus/linkCloses``).
public typealias LinkCloseReason = TrellisNet.LinkCloseReason
/// A peer found by LAN discovery.
public typealias DiscoveredPeer = TrellisCore.DiscoveredPeer
/// Where discovery beacons go.
public typealias DiscoveryScope = TrellisNet.DiscoveryScope

/// How a node runs LAN discovery (``NodeOptions/discovery``).
public struct DiscoveryOptions: Sendable {
    /// The UDP port every node of the LAN sends beacons to and listens on.
    public var port: UInt16 = DiscoveryOptions.defaultPort
    /// Where beacons go: every interface (the default), or loopback only (for tests and for
    /// several nodes on one host that must not be seen from the LAN).
    public var scope: DiscoveryScope = .allInterfaces
    /// Beacon intervals and cache lifetime (docs/MESH.md); `nil` for the defaults. Its
    /// `peerKey` is replaced by the node's.
    public var timings: DiscoveryConfiguration?

    /// The default discovery port, 4041 (the TCP port is 4040).
    public static let defaultPort: UInt16 = 4041

    public init(port: UInt16 = DiscoveryOptions.defaultPort, scope: DiscoveryScope = .allInterfaces) {
        self.port = port
        self.scope = scope
    }

    func configuration(_ peerKey: [UInt8]) -> DiscoveryConfiguration {
        var config = timings ?? DiscoveryConfiguration(peerKey: peerKey)
        config.peerKey = peerKey
        return config
    }
}
