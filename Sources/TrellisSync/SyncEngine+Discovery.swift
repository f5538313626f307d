import Foundation
public import TrellisCore
import TrellisCrypto

/// LAN discovery inside the engine: the pure ``Discovery`` state machine runs on the engine's
/// queue, ticked with the replicator; the peers it finds are handed to the replicator to dial.
/// The UDP side (sealing, sockets) is ``MeshNetwork/startDiscovery(port:scope:configuration:)``.
extension SyncEngine {
    /// The discovery state machine and what the engine needs around it.
    struct DiscoveryState {
        var machine: Discovery
        var send: @Sendable (Beacon) -> Void
        var collections: [String]
    }

    /// Starts discovery (again: a running one is replaced, its cache forgotten): beacons are
    /// built on the engine's queue and handed to `send` (which seals and sends them; it must not
    /// block).
    ///
    /// - Parameters:
    ///   - configuration: timings (its `peerKey` is replaced by this node's).
    ///   - port: the TCP port beacons announce (0 until the node listens).
    ///   - send: called on the engine's queue with each beacon due.
    public func startDiscovery(
        configuration: DiscoveryConfiguration, port: UInt16, send: @escaping @Sendable (Beacon) -> Void
    ) {
        onEngine {
            // Started again: the previous cache is forgotten (its peers are no longer dialed).
            for peer in discovery?.machine.peers ?? [] { host.discoveredPeerExpired(peer.peerKey) }
            var config = configuration
            config.peerKey = peerKey
            let collections = Self.collectionNames(host.replicator.subscriptions)
            let local = DiscoveryLocal(
                port: port, epoch: host.replicator.local.epoch, collectionsDigest: Self.digest(collections))
            discovery = DiscoveryState(
                machine: Discovery(
                    configuration: config, local: local, bootNonce: UInt64.random(in: .min ... .max),
                    seed: UInt64.random(in: .min ... .max), now: Self.monotonicMillis()),
                send: send, collections: collections)
            discoveryTick()
        }
    }

    /// Stops sending beacons and forgets the discovered peers (open sessions stay).
    public func stopDiscovery() {
        onEngine {
            guard let state = discovery else { return }
            discovery = nil
            for peer in state.machine.peers { host.discoveredPeerExpired(peer.peerKey) }
            if !state.machine.peers.isEmpty { discoveryObserver?([]) }
        }
    }

    /// The TCP port beacons announce (``MeshNetwork/listen(on:)`` sets it).
    public func setListeningPort(_ port: UInt16) {
        onEngine { discovery?.machine.local.port = port }
    }

    /// A beacon that opened under the mesh key arrived from `host` (its numeric source address).
    /// Dropped unread when ``maxDiscoveryBacklog`` datagrams already wait (counted).
    public func discoveryReceived(_ beacon: Beacon, from address: String) {
        guard admitDiscoveryDatagram() else { return }
        queue.async { [self] in
            discoveryBacklog.subtract(1, ordering: .relaxed)
            guard discovery != nil else { return }
            run(discovery!.machine.received(beacon, from: address, now: Self.monotonicMillis()))
        }
    }

    /// A datagram on the discovery port was not a beacon of this mesh (counted, not logged).
    public func discoveryRejected(_ reason: String) {
        guard admitDiscoveryDatagram() else { return }
        queue.async { [self] in
            discoveryBacklog.subtract(1, ordering: .relaxed)
            discovery?.machine.rejected(reason)
        }
    }

    private func admitDiscoveryDatagram() -> Bool {
        guard discoveryBacklog.add(1, ordering: .relaxed).newValue <= Self.maxDiscoveryBacklog else {
            discoveryBacklog.subtract(1, ordering: .relaxed)
            discoveryDropped.add(1, ordering: .relaxed)
            return false
        }
        return true
    }

    /// The peers discovery currently knows (the cache: peers heard from within the cache
    /// lifetime), by peer key; empty when discovery is off.
    public var discoveredPeers: [DiscoveredPeer] { onEngine { discovery?.machine.peers ?? [] } }

    /// Calls `observer` with the whole discovery cache (``discoveredPeers``) whenever a peer
    /// enters it, announces something new, or leaves it (expiry, or discovery stopping); not for
    /// a beacon that only refreshes a peer's `lastSeen`. One observer at a time (`nil` removes
    /// it). It runs on the engine's queue: it must not block, and may call the engine.
    public func observeDiscovery(_ observer: (@Sendable ([DiscoveredPeer]) -> Void)?) {
        onEngine { discoveryObserver = observer }
    }

    /// Counts of beacons sent, accepted and dropped; `nil` when discovery is off.
    public var discoveryStatistics: DiscoveryStatistics? {
        onEngine {
            guard var statistics = discovery?.machine.statistics else { return nil }
            statistics.dropped = discoveryDropped.load(ordering: .relaxed)
            return statistics
        }
    }

    /// The collections named in this node's subscriptions, sorted byte-wise, without repeats.
    static func collectionNames(_ subscriptions: [SubscriptionSpec]) -> [String] {
        Set(subscriptions.map(\.collection)).sorted { UTF8Key($0) < UTF8Key($1) }
    }

    /// ``Beacon/collectionsDigest``: the first 8 bytes of SHA-256 over the names, each followed
    /// by a 0 byte.
    static func digest(_ collections: [String]) -> [UInt8] {
        Array(SHA256.hash(collections.flatMap { Array($0.utf8) + [0] }).prefix(Beacon.digestLength))
    }

    /// Runs on every engine tick (100 ms): refreshes what beacons announce, then advances the
    /// state machine.
    func discoveryTick() {
        guard discovery != nil else { return }
        let collections = Self.collectionNames(host.replicator.subscriptions)
        if collections != discovery!.collections {
            discovery!.collections = collections
            discovery!.machine.local.collectionsDigest = Self.digest(collections)
        }
        discovery!.machine.local.epoch = host.replicator.local.epoch
        run(discovery!.machine.tick(now: Self.monotonicMillis()))
    }

    private func run(_ directives: [DiscoveryDirective]) {
        guard let state = discovery else { return }
        for directive in directives {
            switch directive {
            case .send(let beacon):
                state.send(beacon)
            case .updated(let peer):
                if peer.firstSeen == peer.lastSeen {
                    let place = peer.endpoint ?? "\(peer.addresses.first ?? "?") (not listening)"
                    let compatibility =
                        peer.isCompatible
                        ? "" : "; it speaks protocol version \(peer.protocolVersion), not dialed"
                    log("discovered peer \(peer.keyHex.prefix(16)) at \(place)\(compatibility)")
                }
                host.discovered(
                    peer, grace: state.machine.configuration.dialGrace,
                    sameCollections: peer.collectionsDigest == state.machine.local.collectionsDigest)
            case .expired(let peer):
                log(
                    "discovered peer \(peer.keyHex.prefix(16)) vanished: no beacon for \(state.machine.configuration.cacheLifetime / 1000) s"
                )
                host.discoveredPeerExpired(peer.peerKey)
            }
        }
        if directives.contains(where: { if case .send = $0 { false } else { true } }) {
            discoveryObserver?(discovery?.machine.peers ?? [])
        }
        scheduleScans()
    }
}
