/// One generic CBOR data item (RFC 8949 §3), able to hold everything in RFC 8949 Appendix A.
///
/// ``CBOR/decodeItem(_:options:)`` reads indefinite-length strings, arrays and maps into their
/// definite-length equivalents; ``CBOR/encodeItem(_:)`` writes preferred serialisation (RFC 8949
/// §4.1), so an item decoded from non-preferred bytes re-encodes to the preferred form.
///
/// Equality is structural: text compares by its UTF-8 bytes (so precomposed "é" and "e\u{301}"
/// differ, unlike `String` equality), floats by bit pattern and width, maps by their ordered pairs.
public indirect enum CBORItem: Sendable {
    /// Major type 0: an unsigned integer.
    case unsigned(UInt64)
    /// Major type 1: the integer `-1 - n`, holding `n` (so `.negative(0)` is -1 and
    /// `.negative(UInt64.max)` is -2^64).
    case negative(UInt64)
    /// Major type 2.
    case byteString([UInt8])
    /// Major type 3, valid UTF-8 (the decoder rejects anything else).
    case textString(String)
    /// Major type 4.
    case array([CBORItem])
    /// Major type 5: key/value pairs in encoded order, keys of any type. Duplicate keys are kept
    /// as read (RFC 8949 §5.6 leaves them to the application).
    case map([(key: CBORItem, value: CBORItem)])
    /// Major type 6: tag number and tag content (bignums, tags 2 and 3, stay as tagged byte strings).
    case tagged(UInt64, CBORItem)
    /// Major type 7 simple values other than false, true, null and undefined: 0–19 and 32–255.
    /// 24–31 are reserved (RFC 8949 §3.3): the decoder never produces them and encoding one writes
    /// bytes that decoders reject.
    case simple(UInt8)
    /// Simple values 20 and 21.
    case bool(Bool)
    /// Simple value 22.
    case null
    /// Simple value 23.
    case undefined
    /// Major type 7 floating point, with the width it was read in. Encoding always uses the
    /// narrowest width that keeps the bits exactly, whatever `width` says.
    case float(Double, width: FloatWidth)

    /// The width of an encoded float (additional information 25, 26, 27).
    public enum FloatWidth: Int, Hashable, Sendable {
        /// IEEE 754 binary16, `0xf9`.
        case half = 16
        /// IEEE 754 binary32, `0xfa`.
        case single = 32
        /// IEEE 754 binary64, `0xfb`.
        case double = 64
    }
}

extension CBORItem {
    /// A float item in the narrowest width that holds `value` exactly (RFC 8949 §4.1).
    public static func float(_ value: Double) -> CBORItem {
        .float(value, width: CBORFloat.shortestWidth(value))
    }

    /// An integer item: major type 0 for `value >= 0`, otherwise major type 1.
    public static func int(_ value: Int64) -> CBORItem {
        value >= 0 ? .unsigned(UInt64(value)) : .negative(UInt64(bitPattern: ~value))
    }
}

extension CBORItem: Hashable {
    public static func == (lhs: CBORItem, rhs: CBORItem) -> Bool {
        switch (lhs, rhs) {
        case (.unsigned(let a), .unsigned(let b)): return a == b
        case (.negative(let a), .negative(let b)): return a == b
        case (.byteString(let a), .byteString(let b)): return a == b
        case (.textString(let a), .textString(let b)): return a.utf8.elementsEqual(b.utf8)
        case (.array(let a), .array(let b)): return a == b
        case (.map(let a), .map(let b)):
            guard a.count == b.count else { return false }
            for (x, y) in zip(a, b) where x.key != y.key || x.value != y.value { return false }
            return true
        case (.tagged(let tagA, let a), .tagged(let tagB, let b)): return tagA == tagB && a == b
        case (.simple(let a), .simple(let b)): return a == b
        case (.bool(let a), .bool(let b)): return a == b
        case (.null, .null), (.undefined, .undefined): return true
        case (.float(let a, let widthA), .float(let b, let widthB)):
            return a.bitPattern == b.bitPattern && widthA == widthB
        default: return false
        }
    }

    public func hash(into hasher: inout Hasher) {
        switch self {
        case .unsigned(let n):
            hasher.combine(0)
            hasher.combine(n)
        case .negative(let n):
            hasher.combine(1)
            hasher.combine(n)
        case .byteString(let b):
            hasher.combine(2)
            hasher.combine(b)
        case .textString(let s):
            hasher.combine(3)
            hasher.combine(s.utf8.count)
            for byte in s.utf8 { hasher.combine(byte) }
        case .array(let a):
            hasher.combine(4)
            hasher.combine(a)
        case .map(let pairs):
            hasher.combine(5)
            hasher.combine(pairs.count)
            for pair in pairs {
                hasher.combine(pair.key)
                hasher.combine(pair.value)
            }
        case .tagged(let tag, let item):
            hasher.combine(6)
            hasher.combine(tag)
            hasher.combine(item)
        case .simple(let n):
            hasher.combine(7)
            hasher.combine(n)
        case .bool(let b):
            hasher.combine(8)
            hasher.combine(b)
        case .null: hasher.combine(9)
        case .undefined: hasher.combine(10)
        case .float(let d, let width):
            hasher.combine(11)
            hasher.combine(d.bitPattern)
            hasher.combine(width)
        }
    }
}

extension CBORItem: CustomStringConvertible {
    /// RFC 8949 §8 diagnostic notation, e.g. `{1: 2, "a": [h'01', 1.5]}`, `0("2013-03-21")`,
    /// `simple(16)`, `NaN`. Widths and indefinite lengths are not annotated.
    public var description: String {
        var out = ""
        writeDiagnostic(into: &out)
        return out
    }

    private func writeDiagnostic(into out: inout String) {
        switch self {
        case .unsigned(let n):
            out += String(n)
        case .negative(let n):
            // -1 - n without overflow: print n + 1 with a minus sign.
            out += n == .max ? "-18446744073709551616" : "-" + String(n + 1)
        case .byteString(let bytes):
            out += "h'"
            for byte in bytes {
                out.unicodeScalars.append(Self.hexDigit(byte >> 4))
                out.unicodeScalars.append(Self.hexDigit(byte & 0xf))
            }
            out += "'"
        case .textString(let text):
            out += "\""
            for scalar in text.unicodeScalars {
                switch scalar {
                case "\"": out += "\\\""
                case "\\": out += "\\\\"
                case "\n": out += "\\n"
                case "\r": out += "\\r"
                case "\t": out += "\\t"
                case _ where scalar.value < 0x20 || scalar.value == 0x7f:
                    out += "\\u00"
                    out.unicodeScalars.append(Self.hexDigit(UInt8(scalar.value >> 4)))
                    out.unicodeScalars.append(Self.hexDigit(UInt8(scalar.value & 0xf)))
                default: out.unicodeScalars.append(scalar)
                }
            }
            out += "\""
        case .array(let items):
            out += "["
            for (i, item) in items.enumerated() {
                if i > 0 { out += ", " }
                item.writeDiagnostic(into: &out)
            }
            out += "]"
        case .map(let pairs):
            out += "{"
            for (i, pair) in pairs.enumerated() {
                if i > 0 { out += ", " }
                pair.key.writeDiagnostic(into: &out)
                out += ": "
                pair.value.writeDiagnostic(into: &out)
            }
            out += "}"
        case .tagged(let tag, let item):
            out += String(tag) + "("
            item.writeDiagnostic(into: &out)
            out += ")"
        case .simple(let n): out += "simple(\(n))"
        case .bool(let b): out += b ? "true" : "false"
        case .null: out += "null"
        case .undefined: out += "undefined"
        case .float(let d, _):
            if d.isNaN {
                out += "NaN"
            } else if d.isInfinite {
                out += d < 0 ? "-Infinity" : "Infinity"
            } else {
                // Swift prints the shortest round-tripping digits; diagnostic notation wants a
                // fraction so that floats never read as integers ("1.0", "1.0e+300").
                let text = d.description
                if text.contains(".") {
                    out += text
                } else if let e = text.firstIndex(of: "e") {
                    out += text[..<e] + ".0" + text[e...]
                } else {
                    out += text + ".0"
                }
            }
        }
    }

    private static func hexDigit(_ nibble: UInt8) -> Unicode.Scalar {
        Unicode.Scalar(nibble < 10 ? 0x30 + nibble : 0x57 + nibble)
    }
}
