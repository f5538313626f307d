import Foundation
import Testing
import TrellisCore
import TrellisCrypto

/// Sealing beacons under the mesh key: a stranger can neither read nor forge one, and any change
/// on the way is refused with a clear error.
@Suite struct BeaconSealTests {
    let meshKey = SecretBytes(Array(repeating: 0x42, count: 32))
    /// The beacon of the vector in docs/PROTOCOL.md §5 (written when the protocol was version 2).
    let beacon = Beacon(
        protocolVersion: 2, peerKey: Array(repeating: 7, count: 32), port: 4040,
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

    /// The vector of docs/PROTOCOL.md §5, computed independently in Python (`hashlib.blake2b`
    /// for the key; HChaCha20 written out plus `cryptography`'s ChaCha20-Poly1305 for
    /// XChaCha20-Poly1305): mesh key 32 × 0x42, nonce 00 01 … 17.
    static let vector =
        "54524c4201000102030405060708090a0b0c0d0e0f1011121314151617648af15fc0cdfe9d943d5ea21a9a00a97e66e680d9"
        + "8137324797dfe70c4b68923fb1bf99220169a9d8a0c07ec400cb5bae7f231f713f7e50266ee6f2df50e285f51a36be00bd76d8"
        + "0496ced2a070b03f3cc0c5016b1e6fe39cae9761"

    @Test func theSealMatchesAnIndependentImplementation() throws {
        let seal = BeaconSeal(meshKey: meshKey)
        let sealed = seal.seal(beacon.encoded(), nonce: Array(0..<24))
        #expect(sealed.map { String(format: "%02x", $0) }.joined() == Self.vector)
        #expect(try seal.open(sealed) == beacon.encoded())
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
