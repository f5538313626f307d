/// Timings of LAN discovery (docs/MESH.md, "Discovery"). Durations in milliseconds.
public struct DiscoveryConfiguration: Sendable, Equatable {
    /// This node's peer key (its own beacons are ignored).
    public var peerKey: [UInt8]
    /// Beacon interval while the mesh forms: at start and after the set of peers changes.
    public var fastInterval: Millis = 1_000
    /// How long the fast interval lasts after start or after a change of the peer set.
    public var fastPeriod: Millis = 10_000
    /// Beacon interval once the peer set is stable (with the jitter, three intervals in a row
    /// stay under ``cacheLifetime``: two lost beacons never make a peer flap).
    public var slowInterval: Millis = 4_000
    /// Each interval is multiplied by a random factor in `1 - jitter ... 1 + jitter`.
    public var jitter: Double = 0.2
    /// A peer whose beacons stop is forgotten after this long (more than three jittered slow
    /// intervals: two beacons in a row may be lost without the peer flapping).
    public var cacheLifetime: Millis = 15_000
    /// Source addresses kept per peer: those its latest beacon came from (IPv4 and IPv6, or two
    /// interfaces), in the order they arrived. Beyond it, more copies of that beacon are dropped.
    public var maxAddresses = 4
    /// Replay-window entries (sender key and boot nonce) remembered at most; the least recently
    /// used is dropped beyond it.
    public var replayMemory = 4_096
    /// Peers kept in the cache at most; beacons of further peers are dropped (and counted).
    public var maxPeers = 1_024

    public init(peerKey: [UInt8]) { self.peerKey = peerKey }

    /// How long a side whose peer key is the larger one waits before dialing a discovered peer
    /// itself (two fast intervals): by then the other side, which dials at once, has normally
    /// connected.
    public var dialGrace: Millis { 2 * fastInterval }

    /// How long the beacons of a peer's current boot must have stopped advancing before beacons
    /// of another boot nonce take its entry over (the longest jittered slow interval plus 1 s).
    /// A restarted peer is taken over as soon as its old boot's beacons stop; a replayed beacon of
    /// an earlier boot cannot take over a peer whose beacons keep coming.
    public var bootTakeover: Millis { Millis(Double(slowInterval) * (1 + jitter)) + 1_000 }
}

/// What this node puts in its beacons, as the shell last reported it.
public struct DiscoveryLocal: Sendable, Equatable {
    /// The TCP listening port (0 when not listening).
    public var port: UInt16
    /// The store's log epoch (16 bytes).
    public var epoch: [UInt8]
    /// The digest of the subscribed collection names (8 bytes, ``Beacon/collectionsDigest``).
    public var collectionsDigest: [UInt8]

    public init(port: UInt16, epoch: [UInt8], collectionsDigest: [UInt8]) {
        self.port = port
        self.epoch = epoch
        self.collectionsDigest = collectionsDigest
    }
}

/// One peer in the discovery cache: what its latest beacon said, and where beacons came from.
public struct DiscoveredPeer: Sendable, Equatable, Hashable {
    /// The peer's static public key (32 bytes).
    public var peerKey: [UInt8]
    /// Source addresses its beacons came from (numeric hosts; IPv6 link-local ones carry their
    /// `%interface` zone), IPv4 first, each in the order first seen.
    public var addresses: [String]
    /// Its TCP listening port (0: not listening, never dialed).
    public var port: UInt16
    /// Its wire protocol version.
    public var protocolVersion: Int
    /// Whether it speaks this node's protocol version (an incompatible peer is not dialed).
    public var isCompatible: Bool
    /// Its log epoch (16 bytes).
    public var epoch: [UInt8]
    /// The digest of its subscribed collection names (8 bytes).
    public var collectionsDigest: [UInt8]
    /// When its first and its latest accepted beacon arrived (the shell's monotonic milliseconds).
    public var firstSeen: Millis
    public var lastSeen: Millis

    public init(
        peerKey: [UInt8], addresses: [String], port: UInt16, protocolVersion: Int, isCompatible: Bool,
        epoch: [UInt8], collectionsDigest: [UInt8], firstSeen: Millis, lastSeen: Millis
    ) {
        self.peerKey = peerKey
        self.addresses = addresses
        self.port = port
        self.protocolVersion = protocolVersion
        self.isCompatible = isCompatible
        self.epoch = epoch
        self.collectionsDigest = collectionsDigest
        self.firstSeen = firstSeen
        self.lastSeen = lastSeen
    }

    /// The `host:port` to dial: the first of ``addresses`` (IPv4 preferred), or `nil` when the
    /// peer does not listen.
    public var endpoint: String? {
        guard port != 0, let host = addresses.first else { return nil }
        return host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
    }

    /// The peer key as lowercase hex.
    public var keyHex: String { peerKey.map { Replicator.hex($0) }.joined() }
}

/// What the shell must do for ``Discovery``.
public enum DiscoveryDirective: Sendable, Equatable {
    /// Seal this beacon and send it on every interface discovery uses.
    case send(Beacon)
    /// A peer entered the cache, or what it announces changed (address, port, version, epoch,
    /// collections).
    case updated(DiscoveredPeer)
    /// A peer's cache entry expired: no beacon from it for the cache lifetime.
    case expired(DiscoveredPeer)
}

/// Counts of beacons received and what became of them.
public struct DiscoveryStatistics: Sendable, Equatable {
    public var sent = 0
    public var accepted = 0
    /// This node's own beacons (looped back, or from another interface of this host).
    public var own = 0
    /// Beacons refused by the replay window: a counter not above the last one seen for their
    /// sender and boot (or one more copy of it from yet another address), or an earlier boot
    /// while the current one's beacons keep coming.
    public var replayed = 0
    /// Datagrams that were not sealed with this mesh's key, malformed, or from one peer too many.
    public var rejected = 0
    /// Datagrams dropped unread because too many waited for the engine (a flood).
    public var dropped = 0
    /// The latest rejection's reason.
    public var lastRejection: String?

    public init() {}
}

/// LAN discovery as a pure state machine: when to send beacons, which beacons to accept (the
/// replay window), and the cache of peers seen. It reads no socket or clock: the shell passes
/// `now` (monotonic milliseconds) and a seed for the jitter, sends the beacons it is told to, and
/// feeds it the beacons it opened.
///
/// Beacons go out every ``DiscoveryConfiguration/fastInterval`` for
/// ``DiscoveryConfiguration/fastPeriod`` after start and after every change of the peer set
/// (a peer appears or expires), else every ``DiscoveryConfiguration/slowInterval``; each interval
/// is jittered. A newly seen peer also makes the next beacon go out within half a fast interval
/// (jittered), so a node that starts late is answered quickly.
public struct Discovery: Sendable {
    public let configuration: DiscoveryConfiguration
    /// The boot nonce this node's beacons carry.
    public let bootNonce: UInt64
    /// What this node's beacons announce; the shell updates it.
    public var local: DiscoveryLocal
    public private(set) var statistics = DiscoveryStatistics()
    private var rng: SplitMix64
    private var counter: UInt64 = 0
    private var nextSend: Millis
    private var fastUntil: Millis
    private var cache: [[UInt8]: DiscoveredPeer] = [:]
    private var windows: [[UInt8]: Window] = [:]
    private var windowUse: UInt64 = 0

    /// The replay window of one sender: its boot nonce, the highest counter accepted, the source
    /// addresses that beacon came from (the same beacon may arrive over IPv4 and IPv6, or over
    /// two interfaces), and when it was last used.
    struct Window: Sendable {
        var bootNonce: UInt64
        var counter: UInt64
        /// In arrival order, at most ``DiscoveryConfiguration/maxAddresses``.
        var addresses: [String]
        var used: UInt64
        /// When the counter last advanced (or the boot was adopted).
        var advanced: Millis
        /// Boot nonces this entry left, with the highest counter seen under each (at most 4): one
        /// comes back only with a counter above it.
        var retired: [UInt64: UInt64] = [:]
    }

    /// - Parameters:
    ///   - configuration: timings.
    ///   - local: what this node's beacons announce.
    ///   - bootNonce: random per start of the node.
    ///   - seed: fixes the jitter.
    ///   - now: the start time: the first beacon is due at once.
    public init(
        configuration: DiscoveryConfiguration, local: DiscoveryLocal, bootNonce: UInt64, seed: UInt64, now: Millis
    ) {
        self.configuration = configuration
        self.local = local
        self.bootNonce = bootNonce
        self.rng = SplitMix64(seed: seed)
        nextSend = now
        fastUntil = now + configuration.fastPeriod
    }

    /// The peers in the cache, by peer key.
    ///
    /// - Complexity: O(n log n) in the number of cached peers.
    public var peers: [DiscoveredPeer] {
        cache.values.sorted { $0.peerKey.lexicographicallyPrecedes($1.peerKey) }
    }

    /// Advances time: sends a beacon when one is due, expires peers not heard from for the cache
    /// lifetime.
    ///
    /// - Complexity: O(n) in the number of cached peers.
    public mutating func tick(now: Millis) -> [DiscoveryDirective] {
        var directives: [DiscoveryDirective] = []
        for key in cache.keys.sorted(by: { $0.lexicographicallyPrecedes($1) }) {
            guard let peer = cache[key], now - peer.lastSeen >= configuration.cacheLifetime else { continue }
            cache.removeValue(forKey: key)
            directives.append(.expired(peer))
            peerSetChanged(now: now)
        }
        if now >= nextSend {
            counter += 1
            statistics.sent += 1
            directives.append(
                .send(
                    Beacon(
                        protocolVersion: UInt16(WireMessage.protocolVersion), peerKey: configuration.peerKey,
                        port: local.port, epoch: local.epoch, collectionsDigest: local.collectionsDigest,
                        bootNonce: bootNonce, counter: counter)))
            nextSend = now + jittered(now < fastUntil ? configuration.fastInterval : configuration.slowInterval)
        }
        return directives
    }

    /// A beacon arrived and opened under the mesh key.
    ///
    /// - Parameters:
    ///   - beacon: the decoded plaintext.
    ///   - host: the datagram's numeric source address (IPv6 link-local with its `%zone`).
    /// - Returns: ``DiscoveryDirective/updated(_:)`` when the peer is new or announces something
    ///   new; nothing for own, replayed or unchanged beacons.
    /// - Complexity: O(1) amortised; O(n) in the replay memory when it is full.
    public mutating func received(_ beacon: Beacon, from host: String, now: Millis) -> [DiscoveryDirective] {
        guard beacon.peerKey != configuration.peerKey else {
            statistics.own += 1
            return []
        }
        guard let addresses = accept(beacon, from: host, now: now) else {
            statistics.replayed += 1
            return []
        }
        let version = Int(beacon.protocolVersion)
        guard var peer = cache[beacon.peerKey] else {
            guard cache.count < configuration.maxPeers else {
                rejected("beacon from a new peer dropped: the cache holds \(configuration.maxPeers) peers already")
                return []
            }
            statistics.accepted += 1
            let peer = DiscoveredPeer(
                peerKey: beacon.peerKey, addresses: [host], port: beacon.port, protocolVersion: version,
                isCompatible: version == WireMessage.protocolVersion, epoch: beacon.epoch,
                collectionsDigest: beacon.collectionsDigest, firstSeen: now, lastSeen: now)
            cache[beacon.peerKey] = peer
            peerSetChanged(now: now)
            // Answer soon, so that a node that starts late is seen within a fast interval.
            nextSend = min(nextSend, now + jittered(configuration.fastInterval) / 2)
            return [.updated(peer)]
        }
        statistics.accepted += 1
        let before = peer
        peer.lastSeen = now
        // The addresses the latest beacon came from, IPv4 first, each family in arrival order: a
        // copy of an earlier beacon replayed from elsewhere is forgotten at the peer's next one.
        peer.addresses = addresses.filter { !Self.isIPv6($0) } + addresses.filter(Self.isIPv6)
        peer.port = beacon.port
        peer.protocolVersion = version
        peer.isCompatible = version == WireMessage.protocolVersion
        peer.epoch = beacon.epoch
        peer.collectionsDigest = beacon.collectionsDigest
        cache[beacon.peerKey] = peer
        var unchanged = before
        unchanged.lastSeen = now
        return unchanged == peer ? [] : [.updated(peer)]
    }

    /// A datagram was dropped before it could be read (not this mesh's key, malformed): counts it.
    public mutating func rejected(_ reason: String) {
        statistics.rejected += 1
        statistics.lastRejection = reason
    }

    // MARK: Internals

    /// The replay window: per sender, beacons of its current boot nonce are accepted only with a
    /// counter above the last one accepted, or with the same counter from a source address that
    /// beacon has not come from yet (at most ``DiscoveryConfiguration/maxAddresses``). Another
    /// boot nonce takes the entry over only once the current boot's counter has not advanced for
    /// ``DiscoveryConfiguration/bootTakeover`` (the peer restarted), and a boot nonce the entry
    /// left comes back only with a counter above the highest seen under it.
    ///
    /// - Returns: the source addresses of the accepted beacon's counter, or `nil` when refused.
    private mutating func accept(_ beacon: Beacon, from host: String, now: Millis) -> [String]? {
        windowUse += 1
        if var window = windows[beacon.peerKey] {
            if window.bootNonce == beacon.bootNonce {
                if beacon.counter > window.counter {
                    window.counter = beacon.counter
                    window.addresses = [host]
                    window.advanced = now
                } else if beacon.counter == window.counter, !window.addresses.contains(host),
                    window.addresses.count < configuration.maxAddresses
                {
                    window.addresses.append(host)
                } else {
                    return nil
                }
            } else {
                guard now - window.advanced >= configuration.bootTakeover else { return nil }
                if let highest = window.retired[beacon.bootNonce], beacon.counter <= highest { return nil }
                window.retired[window.bootNonce] = window.counter
                window.retired[beacon.bootNonce] = nil
                if window.retired.count > 4, let oldest = window.retired.min(by: { $0.value < $1.value })?.key {
                    window.retired[oldest] = nil
                }
                window.bootNonce = beacon.bootNonce
                window.counter = beacon.counter
                window.addresses = [host]
                window.advanced = now
            }
            window.used = windowUse
            windows[beacon.peerKey] = window
            return window.addresses
        }
        if windows.count >= configuration.replayMemory,
            let oldest = windows.min(by: { $0.value.used < $1.value.used })?.key
        {
            windows.removeValue(forKey: oldest)
        }
        windows[beacon.peerKey] = Window(
            bootNonce: beacon.bootNonce, counter: beacon.counter, addresses: [host], used: windowUse, advanced: now)
        return [host]
    }

    static func isIPv6(_ host: String) -> Bool { host.utf8.contains(UInt8(ascii: ":")) }

    private mutating func peerSetChanged(now: Millis) {
        fastUntil = now + configuration.fastPeriod
        nextSend = min(nextSend, now + jittered(configuration.fastInterval))
    }

    private mutating func jittered(_ interval: Millis) -> Millis {
        let factor = Double.random(in: (1 - configuration.jitter)...(1 + configuration.jitter), using: &rng)
        return max(1, Millis(Double(interval) * factor))
    }
}
