/// Conversions between IEEE 754 binary16/32/64 bit patterns, done on the bits so that NaN
/// payloads and signs never depend on the hardware's conversion instructions.
enum CBORFloat {
    /// The binary64 value of a binary16 bit pattern (exact).
    static func double(fromHalf bits: UInt16) -> Double {
        let sign = UInt64(bits >> 15) << 63
        let exponent = Int(bits >> 10) & 0x1f
        let mantissa = UInt64(bits & 0x3ff)
        switch exponent {
        case 0:
            // Zero or subnormal: mantissa × 2^-24, exact in binary64.
            let magnitude = Double(mantissa) * 0x1p-24
            return sign == 0 ? magnitude : -magnitude
        case 0x1f:
            return Double(bitPattern: sign | 0x7ff << 52 | mantissa << 42)
        default:
            return Double(bitPattern: sign | UInt64(exponent - 15 + 1023) << 52 | mantissa << 42)
        }
    }

    /// The binary64 value of a binary32 bit pattern (exact).
    static func double(fromSingle bits: UInt32) -> Double {
        if bits & 0x7f80_0000 == 0x7f80_0000 {
            let sign = UInt64(bits >> 31) << 63
            return Double(bitPattern: sign | 0x7ff << 52 | UInt64(bits & 0x7f_ffff) << 29)
        }
        // Finite binary32 values convert to binary64 exactly.
        return Double(Float(bitPattern: bits))
    }

    /// The binary16 pattern holding exactly `value`'s bits, or `nil` when binary16 cannot.
    static func half(exactly value: Double) -> UInt16? {
        let bits = value.bitPattern
        let sign = UInt16(bits >> 63) << 15
        let exponent = Int(bits >> 52) & 0x7ff
        let mantissa = bits & 0xf_ffff_ffff_ffff
        if exponent == 0x7ff {
            guard mantissa & (1 << 42 - 1) == 0 else { return nil }
            return sign | 0x7c00 | UInt16(mantissa >> 42)
        }
        if exponent == 0 {
            // Zero; binary64 subnormals are far below binary16's range.
            return mantissa == 0 ? sign : nil
        }
        let e = exponent - 1023
        if e >= -14 && e <= 15 {
            guard mantissa & (1 << 42 - 1) == 0 else { return nil }
            return sign | UInt16(e + 15) << 10 | UInt16(mantissa >> 42)
        }
        if e >= -24 && e < -14 {
            // binary16 subnormal: m × 2^-24 with m < 2^10.
            let significand = mantissa | 1 << 52
            let shift = UInt64(28 - e)
            guard significand & (1 << shift - 1) == 0 else { return nil }
            return sign | UInt16(significand >> shift)
        }
        return nil
    }

    /// The binary32 pattern holding exactly `value`'s bits, or `nil` when binary32 cannot.
    static func single(exactly value: Double) -> UInt32? {
        let bits = value.bitPattern
        let sign = UInt32(bits >> 63) << 31
        let exponent = Int(bits >> 52) & 0x7ff
        let mantissa = bits & 0xf_ffff_ffff_ffff
        if exponent == 0x7ff {
            guard mantissa & (1 << 29 - 1) == 0 else { return nil }
            return sign | 0x7f80_0000 | UInt32(mantissa >> 29)
        }
        if exponent == 0 {
            return mantissa == 0 ? sign : nil
        }
        let e = exponent - 1023
        if e >= -126 && e <= 127 {
            guard mantissa & (1 << 29 - 1) == 0 else { return nil }
            return sign | UInt32(e + 127) << 23 | UInt32(mantissa >> 29)
        }
        if e >= -149 && e < -126 {
            // binary32 subnormal: m × 2^-149 with m < 2^23.
            let significand = mantissa | 1 << 52
            let shift = UInt64(-97 - e)
            guard significand & (1 << shift - 1) == 0 else { return nil }
            return sign | UInt32(significand >> shift)
        }
        return nil
    }

    /// The narrowest width that holds `value` bit-exactly (RFC 8949 §4.1 preferred serialisation).
    static func shortestWidth(_ value: Double) -> CBORItem.FloatWidth {
        if half(exactly: value) != nil { return .half }
        if single(exactly: value) != nil { return .single }
        return .double
    }
}
