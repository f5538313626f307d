/// Writes a ``Value`` as compact JSON into a byte buffer.
///
/// Output format (stable; stored documents and subscription keys depend on it):
/// - no whitespace; map keys sorted byte-wise by their UTF-8 (the order ``UTF8Map`` keeps);
/// - ints in decimal; doubles as ``JSON/formatDouble(_:)`` spells them;
/// - strings escape `"` `\` and the control characters U+0000–U+001F only: `\"` `\\` `\n` `\r`
///   `\t`, and `\u00xx` (lowercase hex) for the other controls; everything else is raw UTF-8;
/// - bytes as `{"$bytes":"<base64>"}` (RFC 4648 §4 alphabet, padded).
struct JSONWriter {
    private(set) var output: [UInt8] = []

    init(capacity: Int = 256) {
        output.reserveCapacity(capacity)
    }

    mutating func write(_ value: Value) {
        switch value {
        case .null: appendASCII("null")
        case .bool(let b): appendASCII(b ? "true" : "false")
        case .int(let i): writeInt(i)
        case .double(let d): output.append(contentsOf: JSON.formatDouble(d).utf8)
        case .string(let s): writeString(s)
        case .bytes(let b):
            appendASCII("{\"$bytes\":\"")
            writeBase64(b)
            appendASCII("\"}")
        case .array(let a):
            output.append(UInt8(ascii: "["))
            var first = true
            for element in a {
                if !first { output.append(UInt8(ascii: ",")) }
                first = false
                write(element)
            }
            output.append(UInt8(ascii: "]"))
        case .map(let m):
            // UTF8Map iterates in byte order of the keys: the output is sorted without sorting.
            output.append(UInt8(ascii: "{"))
            var first = true
            for (key, member) in m {
                if !first { output.append(UInt8(ascii: ",")) }
                first = false
                writeMember(key, member)
            }
            output.append(UInt8(ascii: "}"))
        }
    }

    private mutating func writeMember(_ key: String, _ value: Value) {
        writeString(key)
        output.append(UInt8(ascii: ":"))
        write(value)
    }

    @inline(__always)
    private mutating func appendASCII(_ text: StaticString) {
        output.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    private mutating func writeInt(_ i: Int64) {
        // Digits right to left into a stack buffer, then one append.
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 20) { digits in
            var magnitude = i.magnitude
            var k = 20
            repeat {
                k -= 1
                digits[k] = UInt8(ascii: "0") &+ UInt8(truncatingIfNeeded: magnitude % 10)
                magnitude /= 10
            } while magnitude != 0
            if i < 0 {
                k -= 1
                digits[k] = UInt8(ascii: "-")
            }
            output.append(contentsOf: UnsafeBufferPointer(rebasing: digits[k..<20]))
        }
    }

    private mutating func writeString(_ s: String) {
        output.append(UInt8(ascii: "\""))
        let done: Void? = s.utf8.withContiguousStorageIfAvailable { appendEscaped($0) }
        if done == nil {
            let copy = Array(s.utf8)
            copy.withUnsafeBufferPointer { appendEscaped($0) }
        }
        output.append(UInt8(ascii: "\""))
    }

    private static let hexDigits: StaticString = "0123456789abcdef"

    /// Appends UTF-8 text with JSON escapes, copying runs that need none in one go.
    private mutating func appendEscaped(_ text: UnsafeBufferPointer<UInt8>) {
        var runStart = 0
        var k = 0
        while k < text.count {
            if let base = text.baseAddress {
                while text.count - k >= 8 {
                    let word = UInt64(littleEndian: UnsafeRawPointer(base + k).loadUnaligned(as: UInt64.self))
                    let flags = JSONByteScan.flags(word, nonASCII: false)
                    if flags != 0 {
                        k += JSONByteScan.firstFlagged(flags)
                        break
                    }
                    k += 8
                }
                guard k < text.count else { break }
            }
            let b = text[k]
            guard b < 0x20 || b == UInt8(ascii: "\"") || b == UInt8(ascii: "\\") else {
                k += 1
                continue
            }
            if k > runStart { output.append(contentsOf: UnsafeBufferPointer(rebasing: text[runStart..<k])) }
            switch b {
            case UInt8(ascii: "\""): appendASCII("\\\"")
            case UInt8(ascii: "\\"): appendASCII("\\\\")
            case 0x0A: appendASCII("\\n")
            case 0x0D: appendASCII("\\r")
            case 0x09: appendASCII("\\t")
            default:
                appendASCII("\\u00")
                output.append(Self.hexDigits.utf8Start[Int(b >> 4)])
                output.append(Self.hexDigits.utf8Start[Int(b & 0xF)])
            }
            k += 1
            runStart = k
        }
        if k > runStart { output.append(contentsOf: UnsafeBufferPointer(rebasing: text[runStart..<k])) }
    }

    private static let base64Alphabet: StaticString = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    /// RFC 4648 §4 base64 with `=` padding (what Foundation's `base64EncodedString()` writes).
    private mutating func writeBase64(_ bytes: [UInt8]) {
        let alphabet = Self.base64Alphabet.utf8Start
        var k = 0
        while k + 3 <= bytes.count {
            let n = UInt32(bytes[k]) << 16 | UInt32(bytes[k + 1]) << 8 | UInt32(bytes[k + 2])
            output.append(alphabet[Int(n >> 18)])
            output.append(alphabet[Int(n >> 12 & 0x3F)])
            output.append(alphabet[Int(n >> 6 & 0x3F)])
            output.append(alphabet[Int(n & 0x3F)])
            k += 3
        }
        switch bytes.count - k {
        case 1:
            let n = UInt32(bytes[k]) << 16
            output.append(alphabet[Int(n >> 18)])
            output.append(alphabet[Int(n >> 12 & 0x3F)])
            appendASCII("==")
        case 2:
            let n = UInt32(bytes[k]) << 16 | UInt32(bytes[k + 1]) << 8
            output.append(alphabet[Int(n >> 18)])
            output.append(alphabet[Int(n >> 12 & 0x3F)])
            output.append(alphabet[Int(n >> 6 & 0x3F)])
            output.append(UInt8(ascii: "="))
        default:
            break
        }
    }
}

/// Finds bytes that JSON strings treat specially, eight at a time (SWAR: SIMD within a register).
enum JSONByteScan {
    private static let ones: UInt64 = 0x0101_0101_0101_0101
    private static let high: UInt64 = 0x8080_8080_8080_8080

    /// The high bit of each byte of `word` (little-endian: byte 0 is the lowest) that is `"`,
    /// `\`, below 0x20, or, when `nonASCII`, 0x80 or above.
    ///
    /// Borrows between bytes can flag bytes above one that is truly flagged, never below, so
    /// the lowest flag is exact (see ``firstFlagged(_:)``); the others may be false positives.
    @inline(__always)
    static func flags(_ word: UInt64, nonASCII: Bool) -> UInt64 {
        let quotes = word ^ (ones &* UInt64(UInt8(ascii: "\"")))
        let backslashes = word ^ (ones &* UInt64(UInt8(ascii: "\\")))
        // (x - 0x01…) & ~x has the high bit of each zero byte; (x - 0x20…) & ~x of each byte below 0x20.
        var found = (quotes &- ones) & ~quotes | (backslashes &- ones) & ~backslashes | (word &- ones &* 0x20) & ~word
        if nonASCII { found |= word }
        return found & high
    }

    /// The index (0–7) of the first flagged byte.
    @inline(__always)
    static func firstFlagged(_ flags: UInt64) -> Int {
        flags.trailingZeroBitCount >> 3
    }
}
