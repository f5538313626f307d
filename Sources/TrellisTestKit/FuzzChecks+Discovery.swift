import TrellisCore
import TrellisCrypto

// The fuzz check for LAN discovery beacons: the envelope, the plaintext decoder and the state
// machine fed whatever arrives on the discovery port.

extension FuzzChecks {
    /// The beacon key of the fuzz check (mesh key 32 × 0x5A).
    static let beaconSeal = BeaconSeal(meshKey: SecretBytes(Array(repeating: 0x5A, count: 32)))

    /// `BeaconSeal.open` and `Beacon(decoding:)` (docs/PROTOCOL.md §5) on the input as it came,
    /// then the input sealed under the check's key (so the fuzzer reaches the plaintext decoder
    /// through the envelope), then ``Discovery`` fed the input cut into 76-byte beacons. Checks:
    /// nothing traps; a sealed input opens to itself; a plaintext that decodes re-encodes to the
    /// same bytes; the state machine never caches its own key, never caches more peers than its
    /// bound, drops a beacon received twice from one address, and expires everything after the
    /// cache lifetime.
    public static func beacon(_ input: [UInt8]) throws(FuzzCheckFailure) {
        let fail = failing("FuzzBeacon", input)
        _ = try? beaconSeal.open(input)
        if input.count + BeaconSeal.overhead <= BeaconSeal.maxSealedLength {
            let sealed = beaconSeal.seal(input, nonce: Array(repeating: 7, count: BeaconSeal.nonceLength))
            guard (try? beaconSeal.open(sealed)) == input else { throw fail("a sealed input does not open to itself") }
        }
        if let beacon = try? Beacon(decoding: input), beacon.encoded() != input {
            throw fail("beacon \(beacon) re-encodes as \(hex(beacon.encoded()))")
        }
        let own = [UInt8](repeating: 1, count: 32)
        var config = DiscoveryConfiguration(peerKey: own)
        config.maxPeers = 4
        config.replayMemory = 3
        var discovery = Discovery(
            configuration: config,
            local: DiscoveryLocal(
                port: 4040, epoch: Array(repeating: 0, count: 16), collectionsDigest: Array(repeating: 0, count: 8)),
            bootNonce: 1, seed: 1, now: 0)
        var now: Millis = 0
        var offset = 0
        while offset + Beacon.encodedLength <= input.count {
            let chunk = Array(input[offset..<offset + Beacon.encodedLength])
            offset += Beacon.encodedLength
            now += Millis(chunk[0]) * 100
            _ = discovery.tick(now: now)
            guard let beacon = try? Beacon(decoding: chunk) else {
                discovery.rejected("malformed")
                continue
            }
            let host = chunk[1] & 1 == 0 ? "10.0.0.\(chunk[1])" : "fe80::\(chunk[1])%eth0"
            _ = discovery.received(beacon, from: host, now: now)
            // The same beacon again from the same address is a replay (or the node's own).
            let before = discovery.statistics
            guard discovery.received(beacon, from: host, now: now).isEmpty,
                discovery.statistics.replayed + discovery.statistics.own == before.replayed + before.own + 1
            else { throw fail("beacon \(beacon) from \(host) was accepted twice") }
            guard !discovery.peers.contains(where: { $0.peerKey == own }) else { throw fail("its own key was cached") }
            guard discovery.peers.count <= config.maxPeers else { throw fail("the cache passed its bound") }
        }
        _ = discovery.tick(now: now + config.cacheLifetime)
        guard discovery.peers.isEmpty else { throw fail("peers outlived the cache lifetime") }
    }
}
