import Foundation
import Testing
import TrellisCore
import TrellisTestKit

/// Review of the decoding fast paths of ab60cd3: ``CanonicalJSON`` judging a double written
/// without an exponent from its digits, and ``SingleWriteState/decode(_:)`` reading the form with
/// a deterministic CBOR reader instead of encoding it again.
@Suite struct SpeedReviewCoreTests {
    /// Whether the canonical check's verdict on `{"_id":"d","n":<number>}` is what parsing and
    /// writing the text again says.
    static func judgedAsWritten(_ number: String) -> (judged: Bool, written: Bool) {
        let text = "{\"_id\":\"d\",\"n\":\(number)}"
        let written = (try? JSON.string(JSON.parse(text))) == text
        return (CanonicalJSON.isDocument(text, idKey: "\"d\""), written)
    }

    /// Numbers chosen by hand around every limit of the fast path: 15 and 16 significant digits,
    /// 0.001 and below, 1e15, 2^53, trailing and leading zeros, negative zero, long fractions.
    @Test(arguments: [
        "0.001", "0.0010", "0.00100", "0.0009", "0.00099", "0.000999999999999999", "0.00100000000000001",
        "0.001000000000000", "0.00123456789012345", "0.00123456789012346", "0.0012345678901234",
        "0.123456789012345", "0.1234567890123456", "0.12345678901234567", "0.1000000000000000",
        "0.1", "0.10", "0.01", "0.010", "0.0", "0.00", "-0.0", "-0.00", "-0.001", "-0.0001", "-0.5",
        "-0.50", "1.0", "1.00", "-1.0", "-1.00", "10.0", "100.0", "1000000.0", "100000000000000.0",
        "1000000000000000.0", "999999999999999.0", "9999999999999999.0", "99999999999999.9",
        "99999999999999.90", "999999999999999.9", "123456789012345.0", "12345678901234.5",
        "1234567890123.45", "1.23456789012345", "1.234567890123456", "1.2345678901234567",
        "9007199254740992.0", "9007199254740993.0", "9007199254740991.0", "4503599627370496.5",
        "18446744073709551615.0", "18446744073709551616.0", "0.30000000000000004", "0.3",
        "0.1000000000000001", "1.000000000000001", "1.00000000000001", "5e-324", "0.5e1", "1.5E2",
        "1.7976931348623157e308", "2.0", "2.00000000000000", "2.000000000000000",
        "0.000123", "0.0001", "0.00001", "1.0e-05", "1e-05", "0.001e0",
        "12.5", "12.50", "0.003", "0.0030", "18.0", "18.00", "018.0", "-018.0", "00.5", "-00.5",
        "1.", "-.5", ".5", "1.5.5", "-", "-1.0-", "1.0000000000000000000000000000000000000000001",
        "0.00100000000000000000000000000000000000000000000000000000000000000000000000000000000000001",
        "123456789.123456", "123456789.12345", "1234567890.12345", "999999999999999.5",
        "0.999999999999999", "0.9999999999999999", "0.99999999999999999", "9.99999999999999",
        "9.999999999999999", "-9.99999999999999", "-999999999999999.0", "-99999999999999.0",
    ])
    func limitsAreJudgedAsWritten(number: String) {
        let verdict = Self.judgedAsWritten(number)
        #expect(verdict.judged == verdict.written, "\(number): judged \(verdict.judged), written \(verdict.written)")
    }

    /// Random decimals of many shapes (digits of random doubles as `description` writes them,
    /// each mutated: a zero added or taken away, a digit changed, carried; random digit strings
    /// with leading and trailing zeros): the canonical check agrees with parse-and-write on every
    /// one. `TRELLIS_DECIMALS` sets how many (default 300,000).
    @Test func randomDecimalsAreJudgedAsWritten() {
        var (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        let count = ProcessInfo.processInfo.environment["TRELLIS_DECIMALS"].flatMap { Int($0) } ?? 300_000
        print("SpeedReviewCoreTests decimals seed \(seed) (replay with \(SeededRandom.environmentVariable)=\(seed))")
        func digits(_ n: Int, leading: Bool) -> String {
            String(
                (0..<n).map { k in
                    Character(String(Int.random(in: (k == 0 && leading ? 1 : 0)...9, using: &rng)))
                })
        }
        var failures: [String] = []
        var canonical = 0
        for _ in 0..<count {
            var number: String
            switch Int.random(in: 0..<4, using: &rng) {
            case 0:
                // A double's own spelling, when it has no exponent.
                let exponent = Double.random(in: -4...17, using: &rng)
                var double = Double.random(in: 1..<10, using: &rng) * pow(10, exponent.rounded(.down))
                if Bool.random(using: &rng) { double = (double * 1000).rounded() / 1000 }
                number = JSON.string(.double(double))
            case 1:
                // A whole number, with one or more zeros.
                number = digits(Int.random(in: 1...18, using: &rng), leading: true) + "."
                number += String(repeating: "0", count: Int.random(in: 1...3, using: &rng))
            case 2:
                // Around 0.001: few leading zeros, many digits.
                number = "0." + String(repeating: "0", count: Int.random(in: 0...4, using: &rng))
                number += digits(Int.random(in: 1...20, using: &rng), leading: false)
            default:
                let integer =
                    Bool.random(using: &rng) ? "0" : digits(Int.random(in: 1...17, using: &rng), leading: true)
                var fraction = String(repeating: "0", count: Int.random(in: 0...6, using: &rng))
                fraction += digits(Int.random(in: 0...18, using: &rng), leading: false)
                fraction += String(repeating: "0", count: Int.random(in: 0...3, using: &rng))
                number = integer + "." + (fraction.isEmpty ? "0" : fraction)
            }
            if number.contains("e") { continue }
            // Mutations: append a zero, drop the last digit, change the last digit.
            switch Int.random(in: 0..<5, using: &rng) {
            case 0: number += "0"
            case 1:
                if number.last != ".", !number.hasSuffix(".0") { number.removeLast() }
            case 2:
                number.removeLast()
                number += String(Int.random(in: 0...9, using: &rng))
            case 3:
                number += String(repeating: "9", count: Int.random(in: 1...4, using: &rng))
            default: break
            }
            if Bool.random(using: &rng) { number = "-" + number }
            let verdict = Self.judgedAsWritten(number)
            if verdict.written { canonical += 1 }
            if verdict.judged != verdict.written, failures.count < 20 {
                failures.append("\(number): judged \(verdict.judged), written \(verdict.written)")
            }
        }
        #expect(failures.isEmpty, "seed \(seed): \(failures)")
        #expect(canonical > count / 10, "\(canonical) of \(count) canonical")
    }

    // MARK: The single-write state's quick reader

    /// What the general CBOR path of ``SingleWriteState/decode(_:)`` reads from `bytes` (the
    /// reference the quick reader must agree with): `nil` when it throws.
    static func generally(_ bytes: [UInt8]) -> SingleWriteState?? {
        guard SingleWriteState.isEncoded(bytes) else { return .some(nil) }
        guard case .map(let m)? = try? CBOR.decode(bytes), m.count == 2, case .string(let json)? = m["j"],
            case .array(let parts)? = m["u"], parts.count == 2, case .int(let time) = parts[0],
            case .int(let site) = parts[1]
        else { return nil }
        return .some(
            SingleWriteState(
                stamp: Stamp(time: HLCTimestamp(rawValue: UInt64(bitPattern: time)), site: SiteID(bitPattern: site)),
                json: json))
    }

    /// What ``SingleWriteState/decode(_:)`` answers: `nil` when it throws.
    static func quickly(_ bytes: [UInt8]) -> SingleWriteState?? {
        do { return .some(try SingleWriteState.decode(bytes)) } catch { return nil }
    }

    /// Checks ``SingleWriteState/decode(_:)`` against the general path on `bytes`.
    static func expectAlike(_ bytes: [UInt8], _ what: @autoclosure () -> String) {
        let quick = Self.quickly(bytes)
        let general = generally(bytes)
        #expect(quick == general, "\(what()): \(bytes.map { String(format: "%02x", $0) }.joined())")
    }

    static func head(_ major: UInt8, _ argument: UInt64, width: Int) -> [UInt8] {
        switch width {
        case 0: return [major << 5 | UInt8(argument)]
        case 1: return [major << 5 | 24, UInt8(argument)]
        case 2: return [major << 5 | 25] + (0..<2).reversed().map { UInt8(truncatingIfNeeded: argument >> ($0 * 8)) }
        case 4: return [major << 5 | 26] + (0..<4).reversed().map { UInt8(truncatingIfNeeded: argument >> ($0 * 8)) }
        default: return [major << 5 | 27] + (0..<8).reversed().map { UInt8(truncatingIfNeeded: argument >> ($0 * 8)) }
        }
    }

    /// Odd spellings of the form, by hand: longer heads everywhere, indefinite-length texts and
    /// arrays, a map head with the wrong count, trailing bytes, ill-formed UTF-8, tags, floats and
    /// integers beyond Int64 in the stamp.
    @Test func oddSpellingsDecodeAsTheGeneralReaderReadsThem() {
        let json = Array("{\"_id\":\"d\",\"n\":1}".utf8)
        let j: [UInt8] = [0x61, 0x6A]
        let u: [UInt8] = [0x61, 0x75]
        let text = [0x60 + UInt8(json.count)] + json
        let stamp: [UInt8] = [0x82, 0x1A, 0x03, 0xE8, 0x00, 0x00, 0x01]
        let good = [0xA2] + j + text + u + stamp
        let pre: [UInt8] = [0xA2] + j + text + u
        Self.expectAlike(good, "the form")
        Self.expectAlike(good + [0x00], "a trailing byte")
        Self.expectAlike(Array(good.dropLast()), "one byte short")
        Self.expectAlike([0xA3] + j + text + u + stamp, "a map head of three")
        Self.expectAlike([0xA3] + j + text + u + stamp + [0x61, 0x78, 0x01], "three entries")
        Self.expectAlike([0xA1] + j + text, "a map head of one")
        Self.expectAlike(
            [0xA2] + j + Self.head(3, UInt64(json.count), width: 1) + json + u + stamp, "text in a 1-byte head")
        Self.expectAlike(
            [0xA2] + j + Self.head(3, UInt64(json.count), width: 2) + json + u + stamp, "text in a 2-byte head")
        Self.expectAlike([0xA2] + j + [0x7F, 0x60 + UInt8(json.count)] + json + [0xFF] + u + stamp, "indefinite text")
        let chunked: [UInt8] = [0x7F, 0x65] + json[0..<5] + [0x60 + UInt8(json.count - 5)] + json[5...] + [0xFF]
        Self.expectAlike([0xA2] + j + chunked + u + stamp, "indefinite text in two chunks")
        Self.expectAlike([0xA2] + j + text + [0x78, 0x01, 0x75] + stamp, "key u in a 1-byte head")
        Self.expectAlike([0xA2, 0x7F, 0x61, 0x6A, 0xFF] + text + u + stamp, "key j indefinite")
        Self.expectAlike(pre + [0x9F, 0x1A, 0x03, 0xE8, 0x00, 0x00, 0x01, 0xFF], "indefinite stamp")
        Self.expectAlike(pre + [0x98, 0x02, 0x1A, 0x03, 0xE8, 0x00, 0x00, 0x01], "array head 1-byte")
        Self.expectAlike(pre + [0x82, 0x1A, 0x03, 0xE8, 0x00, 0x00, 0x18, 0x01], "site 1-byte head")
        Self.expectAlike(pre + [0x82, 0x1A, 0x03, 0xE8, 0x00, 0x00, 0x18, 0x18], "site 24")
        Self.expectAlike(pre + [0x82, 0x1A, 0x03, 0xE8, 0x00, 0x00, 0x20], "site -1")
        Self.expectAlike(pre + [0x82, 0x1B, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x01], "time 2^63")
        Self.expectAlike(pre + [0x82, 0x3B, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01], "time Int64.min")
        Self.expectAlike(pre + [0x82, 0x3B, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x01], "time below Int64.min")
        Self.expectAlike(pre + [0x82, 0xF9, 0x3C, 0x00, 0x01], "a half float time")
        Self.expectAlike(pre + [0x82, 0xC1, 0x01, 0x01], "a tagged time")
        Self.expectAlike([0xA2] + j + [0xC0] + text + u + stamp, "a tagged text")
        Self.expectAlike([0xA2] + j + [0x42, 0x7B, 0x7D] + u + stamp, "a byte string json")
        Self.expectAlike([0xA2] + j + [0x63, 0x22, 0xFF, 0x22] + u + stamp, "ill-formed UTF-8")
        Self.expectAlike([0xA2] + j + [0x63, 0xED, 0xA0, 0x80] + u + stamp, "an encoded surrogate")
        Self.expectAlike([0xA2] + j + [0x62, 0xC0, 0x80] + u + stamp, "an overlong NUL")
        Self.expectAlike([0xA2] + j + [0x61, 0x00] + u + stamp, "a NUL json")
        Self.expectAlike([0xA2] + j + [0x60] + u + stamp, "an empty json")
        Self.expectAlike([0xA2] + u + stamp + j + text, "u before j")
        Self.expectAlike([0xA2] + j + text + j + text, "j twice")
        Self.expectAlike(pre + [0x82, 0x1A, 0x03, 0xE8, 0x00, 0x00, 0x01, 0xFF], "a stray break")
        Self.expectAlike(pre + [0x83, 0x01, 0x01, 0x01], "three stamp parts")
        Self.expectAlike(pre + [0x81, 0x01], "one stamp part")
        Self.expectAlike([0xBF] + j + text + u + stamp + [0xFF], "indefinite map")
        Self.expectAlike([0xB8, 0x02] + j + text + u + stamp, "map head in a 1-byte head")
    }

    /// Random byte changes of encoded forms (flips, cuts, insertions, heads made longer): the
    /// quick reader never answers other than the general one.
    @Test func mutatedFormsDecodeAsTheGeneralReaderReadsThem() {
        var (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        print("SpeedReviewCoreTests CBOR seed \(seed) (replay with \(SeededRandom.environmentVariable)=\(seed))")
        let jsons = [
            "{\"_id\":\"d\",\"n\":1}", "{\"_id\":\"\u{E9}\u{1F600}\",\"s\":\"x\"}", "{\"_id\":1}",
            "{\"_id\":\"" + String(repeating: "a", count: 300) + "\"}", "",
        ]
        var mismatches = 0
        for _ in 0..<20_000 {
            let json = jsons.randomElement(using: &rng)!
            let time = UInt64.random(in: 0 ... .max, using: &rng) >> UInt64.random(in: 0...63, using: &rng)
            let site = Int64.random(in: .min ... .max, using: &rng) >> Int64.random(in: 0...63, using: &rng)
            var bytes = SingleWriteState(
                stamp: Stamp(time: HLCTimestamp(rawValue: time), site: SiteID(bitPattern: site)), json: json
            ).encoded()
            for _ in 0..<Int.random(in: 1...3, using: &rng) {
                let at = Int.random(in: 3..<max(4, bytes.count), using: &rng)
                switch Int.random(in: 0..<5, using: &rng) {
                case 0: if at < bytes.count { bytes[at] ^= UInt8(1) << UInt8.random(in: 0...7, using: &rng) }
                case 1: bytes = Array(bytes.prefix(at))
                case 2: bytes.insert(UInt8.random(in: 0 ... .max, using: &rng), at: min(at, bytes.count))
                case 3: if at < bytes.count { bytes.remove(at: at) }
                default: bytes.append(UInt8.random(in: 0 ... .max, using: &rng))
                }
            }
            if Self.quickly(bytes) != Self.generally(bytes) {
                mismatches += 1
                Self.expectAlike(bytes, "seed \(seed)")
                if mismatches > 5 { break }
            }
        }
        #expect(mismatches == 0, "seed \(seed)")
    }
}
