/// Dialing the peers LAN discovery found (``Discovery``): they are dialed like static peers (same
/// jittered backoff, never while a session with their peer key exists) and forgotten when their
/// cache entry expires.
extension Replicator {
    /// A discovered peer appeared or what it announces changed: keep a connection to its
    /// ``DiscoveredPeer/endpoint``.
    ///
    /// To spare both sides dialing at once, the side with the smaller peer key dials at once and
    /// the other only after `grace` if no session exists by then (two links between one pair
    /// would still end as one session). A peer that does not listen, or speaks another protocol
    /// version, is not dialed. An address the peer no longer announces is dropped (unless it is
    /// also a static peer).
    ///
    /// - Parameters:
    ///   - peer: the cache entry.
    ///   - grace: how long the side with the larger peer key waits before its first dial.
    ///   - sameCollections: whether the peer subscribes to the same collections as this node
    ///     (its beacon's digest equals ours): dialed first when session slots are limited
    ///     (``ReplicatorConfiguration/maxSessions``).
    public mutating func discovered(_ peer: DiscoveredPeer, grace: Millis, sameCollections: Bool = false, now: Millis)
        -> [ReplicatorDirective]
    {
        guard !stopped, peer.peerKey != configuration.peerKey else { return [] }
        let target = peer.isCompatible ? peer.endpoint : nil
        forgetDiscovered(peer.peerKey, except: target)
        guard let target else { return [] }
        if endpoints[target] != nil {
            endpoints[target]?.discoveredKey = peer.peerKey
            endpoints[target]?.preferred = sameCollections
            if endpoints[target]?.knownKey == nil { endpoints[target]?.knownKey = peer.peerKey }
            return []
        }
        let dialsFirst = configuration.peerKey.lexicographicallyPrecedes(peer.peerKey)
        var e = Endpoint(next: dialsFirst ? now : now + grace, backoff: configuration.dialBackoffInitial)
        e.isStatic = false
        e.discoveredKey = peer.peerKey
        e.knownKey = peer.peerKey
        e.preferred = sameCollections
        endpoints[target] = e
        return dialsFirst ? tick(now: now) : []
    }

    /// A discovered peer's cache entry expired: stop dialing it (an open session stays until it
    /// ends by itself).
    public mutating func discoveredPeerExpired(_ peerKey: [UInt8]) {
        forgetDiscovered(peerKey, except: nil)
    }

    /// The addresses dialed because discovery found them, by peer key (for status and tests).
    public var discoveredEndpoints: [String: [UInt8]] {
        endpoints.compactMapValues { $0.discoveredKey }
    }

    private mutating func forgetDiscovered(_ peerKey: [UInt8], except kept: String?) {
        for name in endpoints.keys.sorted() where name != kept && endpoints[name]?.discoveredKey == peerKey {
            if endpoints[name]?.isStatic == true {
                endpoints[name]?.discoveredKey = nil
            } else {
                endpoints.removeValue(forKey: name)
            }
        }
    }
}
