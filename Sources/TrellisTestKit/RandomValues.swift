public import TrellisCore

/// A random ``Value`` tree for property tests, biased towards edge cases.
///
/// Leaves include `Int64.min`/`.max`, 0, -1, `-0.0`, subnormal and huge doubles, empty strings,
/// non-Latin text and combining characters, and empty byte strings. Doubles are always finite
/// (Trellis rejects NaN and ±Infinity). Containers hold 0–4 elements.
///
/// - Parameters:
///   - depth: how many more levels of arrays and maps may appear below this one; 0 gives a leaf.
///   - rng: the source of randomness; pass a ``SeededRandom`` to make failures replayable.
public func randomValue(depth: Int, using rng: inout some RandomNumberGenerator) -> Value {
    let containerChance = depth > 0 ? 3 : 0
    switch Int.random(in: 0..<(8 + containerChance), using: &rng) {
    case 0: return .null
    case 1: return .bool(Bool.random(using: &rng))
    case 2, 3: return .int(randomInt64(using: &rng))
    case 4, 5: return .double(randomFiniteDouble(using: &rng))
    case 6: return .string(randomString(using: &rng))
    case 7: return .bytes(randomBytes(using: &rng))
    case 8:
        let count = Int.random(in: 0...4, using: &rng)
        return .array((0..<count).map { _ in randomValue(depth: depth - 1, using: &rng) })
    default:
        var entries = UTF8Map<Value>()
        for _ in 0..<Int.random(in: 0...4, using: &rng) {
            entries[randomString(using: &rng)] = randomValue(depth: depth - 1, using: &rng)
        }
        return .map(entries)
    }
}

/// A random `Int64`, often one of the edges (min, max, 0, ±1, around the CBOR argument widths).
public func randomInt64(using rng: inout some RandomNumberGenerator) -> Int64 {
    let edges: [Int64] = [
        .min, .max, 0, 1, -1, 23, 24, -24, -25, 255, 256, -256, -257, 65535, 65536,
        4_294_967_295, 4_294_967_296, -4_294_967_296, -4_294_967_297,
    ]
    switch Int.random(in: 0..<4, using: &rng) {
    case 0: return edges[Int.random(in: 0..<edges.count, using: &rng)]
    case 1: return Int64.random(in: -1000...1000, using: &rng)
    default:
        // Uniform bits with a random magnitude, so every argument width shows up.
        let bits = Int64(bitPattern: rng.next())
        return bits >> Int64.random(in: 0...63, using: &rng)
    }
}

/// A random finite `Double`, often an edge (±0, subnormals, extremes, values exact in binary16/32).
public func randomFiniteDouble(using rng: inout some RandomNumberGenerator) -> Double {
    let edges: [Double] = [
        0.0, -0.0, 1.0, -1.0, 1.5, 0.1, 65504.0, 65505.0, 100000.0, 1e300, -1e300,
        .leastNonzeroMagnitude, -.leastNonzeroMagnitude, .leastNormalMagnitude, .greatestFiniteMagnitude,
        -.greatestFiniteMagnitude, 5.960464477539063e-08, 6.103515625e-05, Double(Float.leastNonzeroMagnitude),
        Double(Float.greatestFiniteMagnitude), .pi,
    ]
    switch Int.random(in: 0..<4, using: &rng) {
    case 0: return edges[Int.random(in: 0..<edges.count, using: &rng)]
    case 1: return Double(Int.random(in: -100_000...100_000, using: &rng)) / 64
    case 2:
        // A random binary32 value, so the 32-bit encoding path is exercised.
        var single = Float(bitPattern: UInt32(truncatingIfNeeded: rng.next()))
        while !single.isFinite { single = Float(bitPattern: UInt32(truncatingIfNeeded: rng.next())) }
        return Double(single)
    default:
        var double = Double(bitPattern: rng.next())
        while !double.isFinite { double = Double(bitPattern: rng.next()) }
        return double
    }
}

/// A random string of 0–8 scalars drawn from ASCII, Latin-1, combining marks, CJK, emoji and
/// the edges of the Unicode range (never normalised).
public func randomString(using rng: inout some RandomNumberGenerator) -> String {
    let ranges: [ClosedRange<UInt32>] = [
        0x20...0x7e, 0x00...0x1f, 0xa0...0xff, 0x300...0x36f, 0x4e00...0x9fff, 0x1f600...0x1f64f,
        0xfff0...0xfffd, 0x10000...0x10ffff,
    ]
    var text = String.UnicodeScalarView()
    for _ in 0..<Int.random(in: 0...8, using: &rng) {
        let range = ranges[Int.random(in: 0..<ranges.count, using: &rng)]
        if let scalar = Unicode.Scalar(UInt32.random(in: range, using: &rng)) {
            text.append(scalar)
        }
    }
    return String(text)
}

/// 0–16 random bytes.
public func randomBytes(using rng: inout some RandomNumberGenerator) -> [UInt8] {
    (0..<Int.random(in: 0...16, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
}

/// Successive mutations of a JSON text, each one edit further (a byte removed, a JSON
/// punctuation or number byte inserted, or a byte replaced by printable ASCII): near-misses of
/// valid text for the checks that must decline or parse them.
///
/// - Returns: up to `count` texts, each the previous one with one more edit.
public func mutatedJSONTexts(
    of text: String, count: Int = 3, using rng: inout some RandomNumberGenerator
) -> [String] {
    var bytes = Array(text.utf8)
    var texts: [String] = []
    for _ in 0..<count {
        guard !bytes.isEmpty else { break }
        let at = Int.random(in: 0..<bytes.count, using: &rng)
        switch Int.random(in: 0..<3, using: &rng) {
        case 0: bytes.remove(at: at)
        case 1: bytes.insert(Array(" ,:{}[]\"\\-0.e1u".utf8).randomElement(using: &rng)!, at: at)
        default: bytes[at] = UInt8.random(in: 0x20...0x7E, using: &rng)
        }
        texts.append(String(decoding: bytes, as: UTF8.self))
    }
    return texts
}
