/// A 128-bit digest of a document state's bytes, used to recognise a state a peer sent us when
/// it would be sent straight back (echo suppression inside one session: one digest per document,
/// of the last state that peer sent on the session). The store also names subscription keys by
/// its high half (``SubscriptionSpec/scopeHash``).
///
/// Not cryptographic: two 64-bit multiply–xorshift lanes over 8-byte words (the construction of
/// SplitMix64's finaliser, Steele et al. 2014), with the length mixed in. A collision (another
/// state of the same document with the same digest) would keep that state from that peer alone:
/// it is not sent, and the peer's checkpoint moves past it, until the document changes again here.
public struct StateDigest: Hashable, Sendable {
    public let high: UInt64
    public let low: UInt64

    /// The digest with these halves.
    public init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    /// The digest of `bytes`.
    ///
    /// - Complexity: O(n) in the number of bytes.
    public init(_ bytes: [UInt8]) {
        var a: UInt64 = 0x243F_6A88_85A3_08D3
        var b: UInt64 = 0x1319_8A2E_0370_7344
        bytes.withUnsafeBytes { raw in
            let count = raw.count
            var offset = 0
            while offset + 8 <= count {
                let word = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
                a = Self.mix(a ^ word)
                b = Self.mix(b &+ word &* 0x9E37_79B9_7F4A_7C15)
                offset += 8
            }
            var tail: UInt64 = 0
            var shift: UInt64 = 0
            while offset < count {
                tail |= UInt64(raw[offset]) << shift
                shift += 8
                offset += 1
            }
            a = Self.mix(a ^ tail ^ UInt64(count))
            b = Self.mix(b &+ (tail ^ 0xA076_1D64_78BD_642F) &* 0x9E37_79B9_7F4A_7C15 &+ UInt64(count))
        }
        high = Self.mix(a ^ (b >> 7))
        low = Self.mix(b ^ (a << 9))
    }

    private static func mix(_ x: UInt64) -> UInt64 {
        var z = x &+ 0x9E37_79B9_7F4A_7C15
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// SplitMix64: a small, fast, seedable random number generator (Steele, Lea, Flood, "Fast
/// Splittable Pseudorandom Number Generators", OOPSLA 2014; constants from Vigna's reference
/// `splitmix64.c`). The pure core takes its randomness from one of these so that a seed fixes
/// every decision (jitter, nonces) in the simulator. Not for cryptography.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    /// The generator's state; the next output is a function of it alone.
    public private(set) var state: UInt64

    /// A generator whose sequence is fixed by `seed`.
    public init(seed: UInt64) { state = seed }

    /// The next 64 random bits.
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
