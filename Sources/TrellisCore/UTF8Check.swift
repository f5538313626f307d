/// Well-formed UTF-8, byte by byte (Unicode §3.9, Table 3-7; RFC 3629 §4): no overlong forms, no
/// surrogates, nothing above U+10FFFF, no truncated sequences. Shared by the JSON and CBOR decoders,
/// which must refuse invalid text rather than repair it.
enum UTF8Check {
    /// The length of the well-formed multi-byte sequence that starts at `i` (whose first byte is
    /// ≥ 0x80), or `nil` when it is not well formed.
    @inline(__always)
    static func sequenceLength(_ bytes: UnsafeRawBufferPointer, at i: Int) -> Int? {
        let lead = bytes[i]
        let length: Int
        var low: UInt8 = 0x80
        var high: UInt8 = 0xBF
        switch lead {
        case 0xC2...0xDF: length = 2
        case 0xE0:
            length = 3
            low = 0xA0
        case 0xE1...0xEC, 0xEE...0xEF: length = 3
        case 0xED:
            length = 3
            high = 0x9F
        case 0xF0:
            length = 4
            low = 0x90
        case 0xF1...0xF3: length = 4
        case 0xF4:
            length = 4
            high = 0x8F
        default: return nil
        }
        guard bytes.count - i >= length else { return nil }
        let second = bytes[i + 1]
        guard second >= low && second <= high else { return nil }
        for k in 2..<length where bytes[i + k] & 0xC0 != 0x80 { return nil }
        return length
    }
}
