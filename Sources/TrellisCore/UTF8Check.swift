/// Well-formed UTF-8, byte by byte (Unicode §3.9, Table 3-7; RFC 3629 §4): no overlong forms, no
/// surrogates, nothing above U+10FFFF, no truncated sequences. Shared by the JSON and CBOR decoders,
/// which must refuse invalid text rather than repair it.
package enum UTF8Check {
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

    /// The offset of the first byte of `bytes` that does not start a well-formed sequence, or
    /// `nil` when all of it is well-formed UTF-8. Text that is all ASCII (the common case) is
    /// told by one pass that ORs it eight bytes at a time; other text is then read sequence by
    /// sequence.
    ///
    /// - Complexity: O(n) in the number of bytes; no allocation.
    package static func firstInvalid(_ bytes: UnsafeRawBufferPointer) -> Int? {
        guard let base = bytes.baseAddress else { return nil }
        let n = bytes.count
        var high: UInt64 = 0
        var i = 0
        while n - i >= 8 {
            high |= base.loadUnaligned(fromByteOffset: i, as: UInt64.self)
            i += 8
        }
        while i < n {
            high |= UInt64(base.load(fromByteOffset: i, as: UInt8.self))
            i += 1
        }
        if high & 0x8080_8080_8080_8080 == 0 { return nil }
        i = 0
        while i < n {
            if bytes[i] < 0x80 {
                i += 1
                continue
            }
            guard let length = sequenceLength(bytes, at: i) else { return i }
            i += length
        }
        return nil
    }

    /// Appends the UTF-8 of `scalar`, a Unicode scalar value (not a surrogate, at most
    /// U+10FFFF), to `bytes`: what JSON's `\u` escapes decode to.
    @inline(__always)
    package static func append(_ scalar: UInt32, to bytes: inout [UInt8]) {
        switch scalar {
        case 0..<0x80:
            bytes.append(UInt8(scalar))
        case 0x80..<0x800:
            bytes.append(UInt8(0xC0 | scalar >> 6))
            bytes.append(UInt8(0x80 | scalar & 0x3F))
        case 0x800..<0x10000:
            bytes.append(UInt8(0xE0 | scalar >> 12))
            bytes.append(UInt8(0x80 | scalar >> 6 & 0x3F))
            bytes.append(UInt8(0x80 | scalar & 0x3F))
        default:
            bytes.append(UInt8(0xF0 | scalar >> 18))
            bytes.append(UInt8(0x80 | scalar >> 12 & 0x3F))
            bytes.append(UInt8(0x80 | scalar >> 6 & 0x3F))
            bytes.append(UInt8(0x80 | scalar & 0x3F))
        }
    }

    /// The value of the hexadecimal digit `b` (`0-9`, `a-f`, `A-F`), or `nil`.
    @inline(__always)
    package static func hexDigit(_ b: UInt8) -> UInt8? {
        switch b {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return b - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return b - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return b - UInt8(ascii: "A") + 10
        default: return nil
        }
    }

    /// The byte a JSON one-character escape stands for: `b` is the character after the backslash
    /// (`"`, `\`, `/`, `b`, `f`, `n`, `r`, `t`); `nil` for any other, `u` included (RFC 8259 §7).
    @inline(__always)
    package static func jsonEscape(_ b: UInt8) -> UInt8? {
        switch b {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): return b
        case UInt8(ascii: "b"): return 0x08
        case UInt8(ascii: "f"): return 0x0C
        case UInt8(ascii: "n"): return 0x0A
        case UInt8(ascii: "r"): return 0x0D
        case UInt8(ascii: "t"): return 0x09
        default: return nil
        }
    }
}
