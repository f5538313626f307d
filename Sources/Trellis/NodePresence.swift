public import Dispatch
public import TrellisCore
public import TrellisSync

/// A session between two nodes of the mesh, as presence reports it (Ditto's `DittoConnection`).
public struct PresenceConnection: Sendable, Hashable {
    /// `KEY1<->KEY2` with the two peer keys in hex, smaller first: the same on every node.
    public var id: String { "\(NodeStatus.hex(peerKey1))<->\(NodeStatus.hex(peerKey2))" }
    /// The two ends, smaller key first.
    public var peerKey1: [UInt8]
    public var peerKey2: [UInt8]
    /// How the two are connected: always `"tcp"` (a Noise-encrypted TCP session) today.
    public var type: String = "tcp"
}

/// One node in the presence graph (Ditto's `DittoPeer`).
public struct PresencePeer: Sendable, Equatable {
    /// The node's peer key (its static X25519 public key, 32 bytes).
    public var peerKey: [UInt8]
    /// The protocol version it speaks, when known.
    public var protocolVersion: Int?
    /// Whether this node can sync with it (same protocol version). An incompatible peer is
    /// listed, with ``isCompatible`` false, rather than left out.
    public var isCompatible: Bool
    /// Hops from the local node: 0 for the local node, 1 for a direct peer; `nil` for a peer with
    /// no path (an incompatible one).
    public var hops: Int?
    /// For a direct peer: its address as this node sees it (`host:port`); for an incompatible
    /// one, where it was seen.
    public var address: String?
    /// For a direct peer: whether this node dialed it.
    public var isOutbound: Bool?
    /// The sessions it has, as far as this node knows (its presence record).
    public var connections: [PresenceConnection]
    /// Whether its LAN discovery beacons reach this node (within the discovery cache lifetime,
    /// 15 s by default). Such a peer stays in the graph while its beacons arrive, with or
    /// without a session.
    public var isDiscovered = false

    /// ``peerKey`` as 64 lowercase hex digits.
    public var peerKeyString: String { NodeStatus.hex(peerKey) }
    /// Whether it has a session with the local node.
    public var isConnectedToLocalPeer: Bool { hops == 1 }
}

/// Who is in the mesh, as this node knows it (Ditto's `DittoPresenceGraph`): the local node,
/// its direct peers, peers reached over several hops (through presence records gossiped by
/// every node), peers heard by LAN discovery without a session, and peers that speak another
/// protocol version.
public struct PresenceGraph: Sendable, Equatable, CustomStringConvertible {
    public var localPeer: PresencePeer
    /// Every other known node: by hops, then by peer key; incompatible peers last.
    public var remotePeers: [PresencePeer]

    /// Every connection known in the mesh, each once.
    public var connections: Set<PresenceConnection> {
        Set(([localPeer] + remotePeers).flatMap(\.connections))
    }

    /// One line per peer: `KEY hops N ADDRESS [incompatible: protocol vN]`.
    public var description: String {
        var lines = ["\(localPeer.peerKeyString.prefix(16)) (this node), \(localPeer.connections.count) connection(s)"]
        for peer in remotePeers {
            var line = "\(peer.peerKeyString.prefix(16))"
            if let hops = peer.hops { line += hops == 1 ? " direct" : " \(hops) hops" }
            if let address = peer.address { line += " \(address)" }
            if let outbound = peer.isOutbound { line += outbound ? " outbound" : " inbound" }
            if peer.hops == nil && peer.isDiscovered && peer.isCompatible { line += " discovered, no session" }
            if !peer.isCompatible {
                line += " incompatible: protocol v\(peer.protocolVersion.map(String.init) ?? "?")"
            }
            lines.append(line)
        }
        return lines.joined(separator: "\n")
    }

    /// Builds the graph from a replicator status snapshot (``Replicator/status``; a simulated
    /// node's too).
    ///
    /// - Complexity: O(records + neighbours listed).
    public init(_ status: ReplicatorStatus) {
        let records = status.presence
        let own = records.first
        var hops: [[UInt8]: Int] = [:]
        if let own {
            hops[own.peerKey] = 0
            var frontier = [own.peerKey]
            let byKey = Dictionary(records.map { ($0.peerKey, $0) }, uniquingKeysWith: { a, _ in a })
            var distance = 0
            while !frontier.isEmpty {
                distance += 1
                var next: [[UInt8]] = []
                for key in frontier {
                    for neighbor in byKey[key]?.neighbors ?? [] where hops[neighbor] == nil {
                        hops[neighbor] = distance
                        next.append(neighbor)
                    }
                }
                frontier = next
            }
        }
        var edges: [[UInt8]: Set<PresenceConnection>] = [:]
        for record in records {
            for neighbor in record.neighbors {
                let (a, b) =
                    record.peerKey.lexicographicallyPrecedes(neighbor)
                    ? (record.peerKey, neighbor) : (neighbor, record.peerKey)
                let connection = PresenceConnection(peerKey1: a, peerKey2: b)
                edges[a, default: []].insert(connection)
                edges[b, default: []].insert(connection)
            }
        }
        let direct = Dictionary(
            status.peers.filter { $0.phase == "established" }.map { ($0.peerKey, $0) }, uniquingKeysWith: { a, _ in a })
        func peer(_ key: [UInt8], version: Int?) -> PresencePeer {
            PresencePeer(
                peerKey: key, protocolVersion: version, isCompatible: true, hops: hops[key],
                address: direct[key]?.address, isOutbound: direct[key]?.initiator,
                connections: (edges[key] ?? []).sorted { $0.id < $1.id })
        }
        let versions = Dictionary(records.map { ($0.peerKey, $0.version) }, uniquingKeysWith: { a, _ in a })
        localPeer = peer(own?.peerKey ?? [], version: WireMessage.protocolVersion)
        let known = Set(hops.keys).subtracting([own?.peerKey ?? []])
        remotePeers = known.map { peer($0, version: versions[$0]) }.sorted { a, b in
            let (ha, hb) = (a.hops ?? .max, b.hops ?? .max)
            return ha != hb ? ha < hb : a.peerKey.lexicographicallyPrecedes(b.peerKey)
        }
        let discovered = Dictionary(status.discovered.map { ($0.peerKey, $0) }, uniquingKeysWith: { a, _ in a })
        for i in remotePeers.indices where discovered[remotePeers[i].peerKey] != nil {
            remotePeers[i].isDiscovered = true
        }
        // Heard on the LAN, no session (yet, or none possible: another protocol version, or
        // not listening): present all the same.
        for peer in status.discovered where hops[peer.peerKey] == nil && peer.peerKey != own?.peerKey {
            var entry = PresencePeer(
                peerKey: peer.peerKey, protocolVersion: peer.protocolVersion, isCompatible: peer.isCompatible,
                hops: nil,
                address: peer.endpoint ?? peer.addresses.first, isOutbound: nil, connections: [])
            entry.isDiscovered = true
            remotePeers.append(entry)
        }
        let listed = Set(remotePeers.map(\.peerKey))
        for incompatible in status.incompatible
        where hops[incompatible.peerKey] == nil && !listed.contains(incompatible.peerKey) {
            remotePeers.append(
                PresencePeer(
                    peerKey: incompatible.peerKey, protocolVersion: incompatible.version, isCompatible: false,
                    hops: nil, address: incompatible.address, isOutbound: nil, connections: []))
        }
    }
}

/// The presence side of a node (``TrellisNode/presence``, Ditto's `ditto.presence`).
public final class Presence: Sendable {
    let engine: SyncEngine
    let network: MeshNetwork?

    init(engine: SyncEngine, network: MeshNetwork? = nil) {
        self.engine = engine
        self.network = network
    }

    /// Asked about every peer the admission mode admitted, after the handshake and before any
    /// message is read or sent; it must answer within ``AdmissionPolicy/decisionTimeout`` (5 s by
    /// default) or the connection is denied (Ditto's `presence.connectionRequestHandler`). `nil`
    /// (the default) admits whoever the mode admits. Applies to handshakes from now on.
    public var connectionRequestHandler: ConnectionRequestHandler? {
        get { network?.connectionRequestHandler }
        set { network?.setConnectionRequestHandler(newValue) }
    }

    /// Connections waiting for a decision (the handler's, or a user's ``TrellisNode/trust(peerKey:)``),
    /// oldest first, with the seconds left before they are denied.
    public var pendingConnections: [PendingConnection] { network?.pendingConnections ?? [] }

    /// The mesh as this node knows it now.
    ///
    /// - Complexity: O(nodes + connections known).
    public var graph: PresenceGraph { PresenceGraph(engine.status) }

    /// Calls `handler` on `queue` with the graph now, then whenever it changes (checked every
    /// ``SyncEngine/statusInterval`` ms). Calls come in order, one at a time.
    ///
    /// - Returns: keep it; ``StatusObserver/stop()`` or dropping it ends the observation.
    public func observe(deliverOn queue: DispatchQueue? = nil, _ handler: @escaping @Sendable (PresenceGraph) -> Void)
        -> StatusObserver
    {
        Trellis.observe(engine, deliverOn: queue, map: { PresenceGraph($0) }, handler)
    }
}
