import Testing
import TrellisCore

/// LAN discovery's state machine, driven with a fake clock: beacon timing, the replay window and
/// the peer cache. No sockets.
@Suite struct DiscoveryTests {
    static let own: [UInt8] = Array(repeating: 1, count: 32)
    static let keyB: [UInt8] = Array(repeating: 2, count: 32)
    static let keyC: [UInt8] = Array(repeating: 3, count: 32)
    static let epoch: [UInt8] = Array(repeating: 0xE, count: 16)
    static let digest: [UInt8] = Array(repeating: 0xD, count: 8)

    func discovery(now: Millis = 0, configure: (inout DiscoveryConfiguration) -> Void = { _ in }) -> Discovery {
        var config = DiscoveryConfiguration(peerKey: Self.own)
        configure(&config)
        return Discovery(
            configuration: config, local: DiscoveryLocal(port: 4040, epoch: Self.epoch, collectionsDigest: Self.digest),
            bootNonce: 99, seed: 7, now: now)
    }

    func beacon(
        _ key: [UInt8] = keyB, boot: UInt64 = 5, counter: UInt64 = 1, port: UInt16 = 4040,
        version: Int = WireMessage.protocolVersion
    ) -> Beacon {
        Beacon(
            protocolVersion: UInt16(version), peerKey: key, port: port, epoch: Self.epoch,
            collectionsDigest: Self.digest, bootNonce: boot, counter: counter)
    }

    /// The times at which beacons go out between `from` and `to`, ticking every 10 ms.
    func sendTimes(_ d: inout Discovery, from: Millis, to: Millis) -> [Millis] {
        var times: [Millis] = []
        for now in stride(from: from, through: to, by: 10) {
            for case .send in d.tick(now: now) { times.append(now) }
        }
        return times
    }

    // MARK: Beacon plaintext

    @Test func beaconRoundTrips() throws {
        let b = beacon(counter: 0x0102_0304_0506_0708)
        let bytes = b.encoded()
        #expect(bytes.count == Beacon.encodedLength)
        #expect(bytes.count == 76)
        #expect(try Beacon(decoding: bytes) == b)
        #expect(Array(bytes[0..<2]) == [0, UInt8(WireMessage.protocolVersion)])
        #expect(Array(bytes[68..<76]) == [1, 2, 3, 4, 5, 6, 7, 8])
    }

    @Test func beaconOfAnyOtherLengthIsRefused() {
        let bytes = beacon().encoded()
        for length in 0..<bytes.count + 3 where length != bytes.count {
            let input =
                length <= bytes.count
                ? Array(bytes.prefix(length)) : bytes + Array(repeating: 0, count: length - bytes.count)
            #expect(throws: BeaconError.self) { try Beacon(decoding: input) }
        }
    }

    @Test func beaconWithZeroKeyOrZeroCounterIsRefused() {
        var zeroKey = beacon().encoded()
        for i in 2..<34 { zeroKey[i] = 0 }
        #expect(throws: BeaconError("beacon names an all-zero peer key")) { try Beacon(decoding: zeroKey) }
        #expect(throws: BeaconError.self) { try Beacon(decoding: Array(beacon(counter: 1).encoded().dropLast()) + [0]) }
    }

    // MARK: Timing

    @Test func firstBeaconGoesAtOnceThenFastThenSlow() {
        var d = discovery()
        let times = sendTimes(&d, from: 0, to: 40_000)
        #expect(times.first == 0)
        let gaps = zip(times.dropFirst(), times).map { $0 - $1 }
        let fast = zip(times.dropFirst(), gaps).filter { $0.0 <= 10_000 }.map(\.1)
        let slow = zip(times.dropFirst(), gaps).filter { $0.0 > 12_000 }.map(\.1)
        #expect(fast.count >= 8)
        #expect(fast.allSatisfy { (800...1_210).contains($0) }, "fast gaps \(fast)")
        #expect(!slow.isEmpty && slow.allSatisfy { (4_000...6_010).contains($0) }, "slow gaps \(slow)")
        #expect(Set(gaps).count > 3, "jittered")
    }

    @Test func beaconsCountUpAndCarryTheLocalState() {
        var d = discovery()
        d.local.port = 5555
        var beacons: [Beacon] = []
        for now in stride(from: Millis(0), through: 5_000, by: 10) {
            for case .send(let b) in d.tick(now: now) { beacons.append(b) }
        }
        #expect(beacons.map(\.counter) == Array(1...UInt64(beacons.count)))
        #expect(beacons.allSatisfy { $0.port == 5555 && $0.peerKey == Self.own && $0.bootNonce == 99 })
    }

    @Test func aNewPeerBringsBackFastBeaconsAndAQuickAnswer() {
        var d = discovery()
        _ = sendTimes(&d, from: 0, to: 30_000)  // stable: slow interval now
        _ = d.received(beacon(), from: "10.0.0.2", now: 30_005)
        let times = sendTimes(&d, from: 30_010, to: 40_000)
        #expect(times.first! <= 30_005 + 600, "answered quickly: \(times)")
        #expect(times.count >= 8, "fast again: \(times)")
    }

    // MARK: Cache

    @Test func ownBeaconsAreIgnored() {
        var d = discovery()
        #expect(d.received(beacon(Self.own), from: "10.0.0.1", now: 1).isEmpty)
        #expect(d.peers.isEmpty)
        #expect(d.statistics.own == 1)
    }

    @Test func aPeerIsCachedAndExpiresAfterTheCacheLifetime() throws {
        var d = discovery()
        let first = d.received(beacon(), from: "10.0.0.2", now: 100)
        let peer = try #require(d.peers.first)
        #expect(first == [.updated(peer)])
        #expect(peer.endpoint == "10.0.0.2:4040")
        #expect(peer.isCompatible)
        #expect(peer.lastSeen == 100)
        #expect(d.received(beacon(counter: 2), from: "10.0.0.2", now: 5_000).isEmpty, "nothing new")
        #expect(d.peers.first?.lastSeen == 5_000)
        #expect(!d.tick(now: 19_999).contains(.expired(d.peers[0])))
        #expect(d.peers.count == 1)
        let expired = d.tick(now: 20_000).filter { if case .expired = $0 { true } else { false } }
        #expect(expired.count == 1)
        #expect(d.peers.isEmpty)
    }

    @Test func replayedAndOldCountersAreDropped() {
        var d = discovery()
        _ = d.received(beacon(counter: 5), from: "10.0.0.2", now: 0)
        #expect(d.received(beacon(counter: 5), from: "10.0.0.2", now: 10).isEmpty)
        #expect(d.received(beacon(counter: 4), from: "10.0.0.2", now: 20).isEmpty)
        #expect(d.statistics.replayed == 2)
        #expect(d.peers.first?.lastSeen == 0, "a replay does not keep a peer alive")
        _ = d.received(beacon(counter: 6), from: "10.0.0.2", now: 30)
        #expect(d.peers.first?.lastSeen == 30)
    }

    @Test func theSameBeaconOverAnotherAddressAddsTheAddress() throws {
        var d = discovery()
        _ = d.received(beacon(counter: 1), from: "fe80::2%eth0", now: 0)
        let update = d.received(beacon(counter: 1), from: "10.0.0.2", now: 1)
        let peer = try #require(d.peers.first)
        #expect(update == [.updated(peer)])
        #expect(peer.addresses == ["10.0.0.2", "fe80::2%eth0"])
        #expect(peer.endpoint == "10.0.0.2:4040")
        #expect(d.received(beacon(counter: 1), from: "10.0.0.2", now: 2).isEmpty)
        #expect(d.statistics.replayed == 1)
    }

    @Test func ipv6EndpointsAreBracketed() {
        var d = discovery()
        _ = d.received(beacon(port: 7000), from: "fe80::2%eth0", now: 0)
        #expect(d.peers.first?.endpoint == "[fe80::2%eth0]:7000")
        _ = d.received(beacon(counter: 2, port: 0), from: "fe80::2%eth0", now: 1)
        #expect(d.peers.first?.endpoint == nil, "a peer that does not listen is not dialable")
    }

    /// A restarted peer (new boot nonce) takes its entry over once its old boot's beacons have
    /// stopped for `bootTakeover`; not before, so a replayed beacon of an earlier boot cannot
    /// take over a peer whose beacons keep coming.
    @Test func aNewBootNonceReplacesTheWindowAndTheAddressesOnceTheOldBootIsSilent() {
        var d = discovery()
        let takeover = d.configuration.bootTakeover
        _ = d.received(beacon(boot: 1, counter: 50), from: "10.0.0.2", now: 0)
        #expect(d.received(beacon(boot: 2, counter: 1, port: 4041), from: "10.0.0.3", now: 10).isEmpty)
        #expect(d.peers.first?.addresses == ["10.0.0.2"])
        let restarted = d.received(beacon(boot: 2, counter: 2, port: 4041), from: "10.0.0.3", now: takeover)
        #expect(restarted.count == 1)
        #expect(d.peers.first?.addresses == ["10.0.0.3"])
        #expect(d.peers.first?.endpoint == "10.0.0.3:4041")
        #expect(d.received(beacon(boot: 2, counter: 2), from: "10.0.0.3", now: takeover + 1).isEmpty)
        // The earlier boot does not come back with what was seen of it.
        #expect(d.received(beacon(boot: 1, counter: 50), from: "10.0.0.9", now: 3 * takeover).isEmpty)
        #expect(d.statistics.replayed == 3)
    }

    /// The attack that used to partition a mesh: beacons replayed from another source address,
    /// of an earlier boot and of the current one. The fake address is gone at the real peer's
    /// next beacon, and an entry never holds more than `maxAddresses` addresses.
    @Test func replayedBeaconsFromElsewhereCannotKeepAFakeAddress() {
        var d = discovery()
        let fake = "127.0.0.9"
        _ = d.received(beacon(boot: 1, counter: 7), from: fake, now: 0)  // an earlier boot, replayed
        _ = d.received(beacon(boot: 2, counter: 3), from: "10.0.0.2", now: d.configuration.bootTakeover)
        _ = d.received(beacon(boot: 2, counter: 3), from: fake, now: d.configuration.bootTakeover + 1)
        #expect(d.peers.first?.endpoint == "10.0.0.2:4040", "the real source came first")
        for n in 0..<100 {
            _ = d.received(beacon(boot: 2, counter: 3), from: "127.0.1.\(n)", now: d.configuration.bootTakeover + 2)
        }
        #expect(d.peers.first?.addresses.count == d.configuration.maxAddresses)
        _ = d.received(beacon(boot: 2, counter: 4), from: "10.0.0.2", now: d.configuration.bootTakeover + 4_000)
        #expect(d.peers.first?.addresses == ["10.0.0.2"])
        // Replaying the earlier boot again changes nothing while the real peer's beacons come.
        #expect(d.received(beacon(boot: 1, counter: 7), from: fake, now: d.configuration.bootTakeover + 5_000).isEmpty)
        #expect(d.peers.first?.addresses == ["10.0.0.2"])
    }

    @Test func anIncompatiblePeerIsCachedAsIncompatible() {
        var d = discovery()
        _ = d.received(beacon(version: WireMessage.protocolVersion + 1), from: "10.0.0.2", now: 0)
        #expect(d.peers.first?.isCompatible == false)
        #expect(d.peers.first?.protocolVersion == WireMessage.protocolVersion + 1)
    }

    @Test func theReplayMemoryAndTheCacheAreBounded() {
        var d = discovery {
            $0.replayMemory = 2
            $0.maxPeers = 2
        }
        _ = d.received(beacon(Self.keyB), from: "10.0.0.2", now: 0)
        _ = d.received(beacon(Self.keyC), from: "10.0.0.3", now: 0)
        #expect(d.received(beacon(Array(repeating: 4, count: 32)), from: "10.0.0.4", now: 0).isEmpty)
        #expect(d.statistics.rejected == 1)
        #expect(d.peers.count == 2)
    }
}
