import Testing
import TrellisCore

/// Dialing the peers discovery found: who dials first, the grace period, backoff, incompatible
/// peers, expiry.
@Suite struct ReplicatorDiscoveryTests {
    static let keyA: [UInt8] = Array(repeating: 1, count: 32)
    static let keyB: [UInt8] = Array(repeating: 2, count: 32)
    static let grace: Millis = 2_000

    func replicator(_ key: [UInt8], maxSessions: Int = 64) -> Replicator {
        var configuration = ReplicatorConfiguration(peerKey: key)
        configuration.maxSessions = maxSessions
        return Replicator(
            configuration: configuration,
            local: LocalLog(epoch: Array(repeating: 0xA, count: 16), site: 0x100 + SiteID(key[0]), lastSeq: 0),
            seed: 42)
    }

    static func key(_ byte: UInt8) -> [UInt8] { Array(repeating: byte, count: 32) }

    func hello(_ key: [UInt8]) -> WireMessage {
        .hello(
            Hello(
                version: WireMessage.protocolVersion, peerKey: key, site: 0x100 + SiteID(key[0]),
                epoch: Array(repeating: 0xC, count: 16),
                nonce: 1))
    }

    // MARK: Session slots

    /// With two slots, three discovered peers: while a slot is free, each is dialed; once both
    /// are taken (by dials in progress or sessions), the third waits until one frees.
    @Test func discoveredPeersWaitForAFreeSessionSlot() {
        var a = replicator(Self.keyA, maxSessions: 2)
        #expect(dials(a.discovered(peer(Self.key(2), host: "10.0.0.2"), grace: 0, now: 0)) == ["10.0.0.2:4040"])
        _ = a.dialFailed("10.0.0.2:4040", reason: "refused", now: 0)  // it waits for its backoff
        #expect(
            dials(a.discovered(peer(Self.key(3), host: "10.0.0.3"), grace: 0, sameCollections: true, now: 0))
                == ["10.0.0.3:4040"])
        #expect(
            dials(a.discovered(peer(Self.key(4), host: "10.0.0.4"), grace: 0, sameCollections: true, now: 0))
                == ["10.0.0.4:4040"])
        // Both slots are taken: the first peer's backoff is over, and it is not dialed.
        #expect(dials(a.tick(now: 60_000)).isEmpty)
        for (n, byte) in [(1, UInt8(3)), (2, UInt8(4))] {
            _ = a.linkOpened(
                LinkID(UInt64(n)), peerKey: Self.key(byte), initiator: true, address: "10.0.0.\(byte):4040",
                endpoint: "10.0.0.\(byte):4040", checkpoints: [:], now: 60_001)
            _ = a.received(hello(Self.key(byte)), on: LinkID(UInt64(n)), now: 60_001)
        }
        #expect(dials(a.tick(now: 61_000)).isEmpty)
        // One leaves for good: its slot goes to the waiting peer.
        _ = a.linkClosed(LinkID(1), reason: "gone", now: 61_001)
        a.discoveredPeerExpired(Self.key(3))
        #expect(dials(a.tick(now: 61_002)) == ["10.0.0.2:4040"])
    }

    /// When slots are limited, a peer subscribing to the same collections is dialed before one
    /// that does not, whatever their addresses.
    @Test func thePeerWithTheSameCollectionsIsDialedFirst() {
        var a = replicator(Self.keyA, maxSessions: 1)
        // Both found while the only slot is busy with a static peer's session.
        _ = a.linkOpened(
            LinkID(9), peerKey: Self.key(9), initiator: false, address: "s", endpoint: nil, checkpoints: [:], now: 0)
        _ = a.received(hello(Self.key(9)), on: LinkID(9), now: 0)
        #expect(
            dials(a.discovered(peer(Self.key(2), host: "10.0.0.2"), grace: 0, sameCollections: false, now: 0)).isEmpty)
        #expect(
            dials(a.discovered(peer(Self.key(3), host: "10.0.0.3"), grace: 0, sameCollections: true, now: 0)).isEmpty)
        _ = a.linkClosed(LinkID(9), reason: "gone", now: 1)
        #expect(dials(a.tick(now: 2)) == ["10.0.0.3:4040"])
    }

    /// A full node refuses a new session with `busy`, except with a static peer it dialed.
    @Test func aFullNodeRefusesNewSessionsButKeepsStaticPeers() {
        var a = replicator(Self.keyA, maxSessions: 1)
        _ = a.linkOpened(
            LinkID(1), peerKey: Self.key(2), initiator: false, address: "b", endpoint: nil, checkpoints: [:], now: 0)
        _ = a.received(hello(Self.key(2)), on: LinkID(1), now: 0)
        #expect(a.status.peers.filter { $0.phase == "established" }.count == 1)
        // Refused as the link opens, before this side sends its hello: the other side never
        // sees a session.
        let refused = a.linkOpened(
            LinkID(2), peerKey: Self.key(3), initiator: false, address: "c", endpoint: nil, checkpoints: [:], now: 1)
        #expect(
            refused.contains { if case .send(LinkID(2), .error("busy", _)) = $0 { true } else { false } }, "\(refused)")
        #expect(refused.contains { if case .close(LinkID(2), _) = $0 { true } else { false } })
        #expect(!refused.contains { if case .send(_, .hello) = $0 { true } else { false } })
        // A static peer is let in beyond the limit.
        let dialed = dials(a.addPeer("10.0.0.4:4040", now: 2))
        #expect(dialed == ["10.0.0.4:4040"])
        _ = a.linkOpened(
            LinkID(3), peerKey: Self.key(4), initiator: true, address: "10.0.0.4:4040", endpoint: "10.0.0.4:4040",
            checkpoints: [:], now: 3)
        let kept = a.received(hello(Self.key(4)), on: LinkID(3), now: 3)
        #expect(!kept.contains { if case .close = $0 { true } else { false } }, "\(kept)")
        #expect(a.status.peers.filter { $0.phase == "established" }.count == 2)
    }

    func peer(_ key: [UInt8], host: String = "10.0.0.2", port: UInt16 = 4040, compatible: Bool = true)
        -> DiscoveredPeer
    {
        DiscoveredPeer(
            peerKey: key, addresses: [host], port: port,
            protocolVersion: compatible ? WireMessage.protocolVersion : WireMessage.protocolVersion + 1,
            isCompatible: compatible, epoch: Array(repeating: 0xB, count: 16),
            collectionsDigest: Array(repeating: 0, count: 8), firstSeen: 0, lastSeen: 0)
    }

    func dials(_ directives: [ReplicatorDirective]) -> [String] {
        directives.compactMap { if case .dial(let e) = $0 { e } else { nil } }
    }

    @Test func theSmallerKeyDialsAtOnce() {
        var a = replicator(Self.keyA)
        #expect(dials(a.discovered(peer(Self.keyB), grace: Self.grace, now: 0)) == ["10.0.0.2:4040"])
        #expect(a.discoveredEndpoints == ["10.0.0.2:4040": Self.keyB])
    }

    @Test func theLargerKeyDialsOnlyAfterTheGracePeriod() {
        var b = replicator(Self.keyB)
        #expect(dials(b.discovered(peer(Self.keyA), grace: Self.grace, now: 0)).isEmpty)
        #expect(dials(b.tick(now: Self.grace - 1)).isEmpty)
        #expect(dials(b.tick(now: Self.grace)) == ["10.0.0.2:4040"])
    }

    @Test func noDialWhileASessionWithThePeerExists() {
        var b = replicator(Self.keyB)
        let link = LinkID(1)
        _ = b.linkOpened(
            link, peerKey: Self.keyA, initiator: false, address: "10.0.0.2:5000", endpoint: nil, checkpoints: [:],
            now: 0)
        _ = b.received(
            .hello(
                Hello(
                    version: WireMessage.protocolVersion, peerKey: Self.keyA, site: 9,
                    epoch: Array(repeating: 0xC, count: 16), nonce: 1)), on: link, now: 0)
        _ = b.discovered(peer(Self.keyA), grace: Self.grace, now: 0)
        #expect(dials(b.tick(now: 3 * Self.grace)).isEmpty)
        // The session ends: now the discovered peer is dialed.
        _ = b.linkClosed(link, reason: "gone", now: 3 * Self.grace)
        #expect(dials(b.tick(now: 3 * Self.grace + 1)) == ["10.0.0.2:4040"])
    }

    @Test func anIncompatibleOrNonListeningPeerIsNotDialed() {
        var a = replicator(Self.keyA)
        #expect(a.discovered(peer(Self.keyB, compatible: false), grace: Self.grace, now: 0).isEmpty)
        #expect(a.discovered(peer(Self.keyB, port: 0), grace: Self.grace, now: 0).isEmpty)
        #expect(dials(a.tick(now: 60_000)).isEmpty)
        #expect(a.discoveredEndpoints.isEmpty)
    }

    @Test func failedDialsBackOffAndAnExpiredPeerIsForgotten() {
        var a = replicator(Self.keyA)
        _ = a.discovered(peer(Self.keyB), grace: Self.grace, now: 0)
        _ = a.dialFailed("10.0.0.2:4040", reason: "refused", now: 0)
        #expect(dials(a.tick(now: 100)).isEmpty, "backoff (≥ 125 ms)")
        #expect(dials(a.tick(now: 400)) == ["10.0.0.2:4040"])
        _ = a.dialFailed("10.0.0.2:4040", reason: "refused", now: 400)
        a.discoveredPeerExpired(Self.keyB)
        #expect(dials(a.tick(now: 60_000)).isEmpty)
        #expect(a.status.endpoints.isEmpty)
    }

    @Test func aNewAddressReplacesTheOldOneButAStaticPeerStays() {
        var a = replicator(Self.keyA)
        _ = a.addPeer("10.0.0.2:4040", now: 0)
        _ = a.dialFailed("10.0.0.2:4040", reason: "refused", now: 0)
        _ = a.discovered(peer(Self.keyB), grace: Self.grace, now: 0)
        _ = a.discovered(peer(Self.keyB, host: "10.0.0.9", port: 4041), grace: Self.grace, now: 1)
        #expect(a.discoveredEndpoints == ["10.0.0.9:4041": Self.keyB])
        #expect(a.status.endpoints.map(\.address) == ["10.0.0.2:4040", "10.0.0.9:4041"])
        a.discoveredPeerExpired(Self.keyB)
        #expect(a.status.endpoints.map(\.address) == ["10.0.0.2:4040"], "the static peer is kept")
    }
}
