import Testing
import TrellisCore

/// Dialing the peers discovery found: who dials first, the grace period, backoff, incompatible
/// peers, expiry.
@Suite struct ReplicatorDiscoveryTests {
    static let keyA: [UInt8] = Array(repeating: 1, count: 32)
    static let keyB: [UInt8] = Array(repeating: 2, count: 32)
    static let grace: Millis = 2_000

    func replicator(_ key: [UInt8]) -> Replicator {
        Replicator(
            configuration: ReplicatorConfiguration(peerKey: key),
            local: LocalLog(epoch: Array(repeating: 0xA, count: 16), site: 1, lastSeq: 0), seed: 42)
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
