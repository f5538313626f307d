import Foundation
import Testing
import TrellisCore
import TrellisTestKit

// MARK: Helpers

/// The message of the error `JSON.parse` throws for `bytes`, or `nil` when it parses.
private func parseError(_ bytes: [UInt8]) -> String? {
    do throws(JSONError) {
        _ = try JSON.parse(bytes)
        return nil
    } catch {
        return error.message
    }
}

private func parseError(_ text: String) -> String? {
    parseError(Array(text.utf8))
}

/// Parses `text` through every entry point and expects the same `value` from each.
private func expectParse(_ text: String, _ value: Value, sourceLocation: SourceLocation = #_sourceLocation) {
    let bytes = Array(text.utf8)
    do {
        #expect(try JSON.parse(text) == value, "\(text.debugDescription)", sourceLocation: sourceLocation)
        #expect(try JSON.parse(bytes) == value, sourceLocation: sourceLocation)
        #expect(try JSON.parse(Data(bytes)) == value, sourceLocation: sourceLocation)
        let viaBuffer = try bytes.withUnsafeBytes { buffer throws(JSONError) in try JSON.parse(buffer) }
        #expect(viaBuffer == value, sourceLocation: sourceLocation)
    } catch {
        Issue.record("\(text.debugDescription) did not parse: \(error)", sourceLocation: sourceLocation)
    }
}

/// Expects `JSON.parse` to reject `bytes` with exactly `message`.
private func expectError(
    _ bytes: [UInt8], _ message: String, sourceLocation: SourceLocation = #_sourceLocation
) {
    #expect(parseError(bytes) == message, "input \(bytes)", sourceLocation: sourceLocation)
}

private func expectError(_ text: String, _ message: String, sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(parseError(text) == message, "input \(text.debugDescription)", sourceLocation: sourceLocation)
}

// MARK: Reference: the Foundation-based conversion JSON.swift used before the hand-written parser

/// The previous `JSON.parse`/`JSON.string`, kept verbatim as the reference the new code must
/// agree with (see the property tests).
private enum FoundationJSON {
    static func parse(_ data: Data) throws(JSONError) -> Value {
        let object: Any
        do {
            object = try JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed])
        } catch {
            throw JSONError(message: "\(error)")
        }
        return try value(fromFoundation: object)
    }

    static func value(fromFoundation object: Any) throws(JSONError) -> Value {
        switch object {
        case is NSNull:
            return .null
        case let s as String:
            return .string(s)
        case let n as NSNumber:
            let type = String(cString: n.objCType)
            switch type {
            case "c", "B":
                return .bool(n.boolValue)
            case "d", "f":
                let d = n.doubleValue
                guard d.isFinite else { throw JSONError(message: "number out of range: \(n)") }
                return .double(d)
            case "Q":
                return .double(n.doubleValue)
            default:
                return .int(n.int64Value)
            }
        case let a as [Any]:
            var out: [Value] = []
            for element in a { out.append(try value(fromFoundation: element)) }
            return .array(out)
        case let m as [String: Any]:
            if m.count == 1, let b64 = m["$bytes"] as? String, let data = Data(base64Encoded: b64) {
                return .bytes([UInt8](data))
            }
            var out: UTF8Map<Value> = [:]
            for (k, v) in m { out[k] = try value(fromFoundation: v) }
            return .map(out)
        default:
            throw JSONError(message: "unsupported JSON value \(type(of: object))")
        }
    }

    static func string(_ value: Value, sortedKeys: Bool = true) -> String {
        var out = ""
        write(value, into: &out, sortedKeys: sortedKeys)
        return out
    }

    static func write(_ value: Value, into out: inout String, sortedKeys: Bool) {
        switch value {
        case .null: out += "null"
        case .bool(let b): out += b ? "true" : "false"
        case .int(let i): out += String(i)
        case .double(let d): out += formatDouble(d)
        case .string(let s): writeString(s, into: &out)
        case .bytes(let b):
            out += "{\"$bytes\":\""
            out += Data(b).base64EncodedString()
            out += "\"}"
        case .array(let a):
            out += "["
            for (i, element) in a.enumerated() {
                if i > 0 { out += "," }
                write(element, into: &out, sortedKeys: sortedKeys)
            }
            out += "]"
        case .map(let m):
            out += "{"
            let keys =
                sortedKeys ? m.keys.sorted(by: { $0.utf8.lexicographicallyPrecedes($1.utf8) }) : Array(m.keys)
            for (i, key) in keys.enumerated() {
                if i > 0 { out += "," }
                writeString(key, into: &out)
                out += ":"
                write(m[key]!, into: &out, sortedKeys: sortedKeys)
            }
            out += "}"
        }
    }

    static func formatDouble(_ d: Double) -> String {
        guard d.isFinite else { return "null" }
        var s = "\(d)"
        if !s.contains(".") && !s.contains("e") && !s.contains("E") { s += ".0" }
        return s
    }

    static func writeString(_ s: String, into out: inout String) {
        out += "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case let c where c.value < 0x20:
                let hex = String(c.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default:
                out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }

    /// Whether `JSONSerialization` reads this number literal as an `NSDecimalNumber`. It does so
    /// for literals with many digits (and negative integers of 19 digits); `doubleValue` of
    /// those is not correctly rounded, and 19-digit negative integers come out as doubles.
    static func usesDecimal(_ literal: String) -> Bool {
        let object = try? JSONSerialization.jsonObject(with: Data(literal.utf8), options: [.fragmentsAllowed])
        return object is NSDecimalNumber
    }
}

// MARK: Writer

@Suite struct JSONWriterTests {
    @Test func scalars() {
        #expect(JSON.string(.null) == "null")
        #expect(JSON.string(.bool(true)) == "true")
        #expect(JSON.string(.bool(false)) == "false")
        #expect(JSON.string(.int(0)) == "0")
        #expect(JSON.string(.int(-1)) == "-1")
        #expect(JSON.string(.int(1234567890)) == "1234567890")
        #expect(JSON.string(.int(.max)) == "9223372036854775807")
        #expect(JSON.string(.int(.min)) == "-9223372036854775808")
    }

    @Test(arguments: [
        (1.0, "1.0"), (-0.0, "-0.0"), (0.0, "0.0"), (1e-07, "1e-07"), (1e+100, "1e+100"), (0.1, "0.1"),
        (-1.5, "-1.5"), (100.0, "100.0"), (12345678.0, "12345678.0"), (1e15, "1000000000000000.0"),
        (1e16, "1e+16"), (9007199254740992.0, "9007199254740992.0"), (1e-05, "1e-05"), (0.0001, "0.0001"),
        (Double.leastNonzeroMagnitude, "5e-324"), (1.7976931348623157e308, "1.7976931348623157e+308"),
        (0.30000000000000004, "0.30000000000000004"),
    ])
    func doubles(value: Double, text: String) throws {
        #expect(JSON.string(.double(value)) == text)
        // And it reads back as the same double, never as an int.
        let back = try JSON.parse(text)
        #expect(back == .double(value), "\(text) read back as \(back)")
    }

    @Test func nonFiniteDoublesWriteNull() {
        // Values are validated before they are stored; the writer never emits NaN or Infinity.
        #expect(JSON.string(.double(.nan)) == "null")
        #expect(JSON.string(.double(.infinity)) == "null")
        #expect(JSON.string(.double(-.infinity)) == "null")
    }

    @Test func escapes() {
        #expect(JSON.string(.string("")) == #""""#)
        #expect(JSON.string(.string("a\"b\\c")) == #""a\"b\\c""#)
        #expect(JSON.string(.string("\n\r\t")) == #""\n\r\t""#)
        // Other controls as \u00xx in lowercase hex; \b and \f are not used.
        #expect(JSON.string(.string("\u{0}\u{1}\u{8}\u{c}\u{1f}")) == #""\u0000\u0001\u0008\u000c\u001f""#)
        // '/', DEL and everything else stay raw.
        #expect(JSON.string(.string("/\u{7f}")) == "\"/\u{7f}\"")
        #expect(JSON.string(.string("x\u{0}y\"z")) == #""x\u0000y\"z""#)
    }

    /// Every byte that needs an escape, at every position of a string around the eight-byte
    /// scanning windows, comes out as the previous writer wrote it.
    @Test func escapesAtEveryOffset() {
        for special in ["\"", "\\", "\n", "\r", "\t", "\u{0}", "\u{1f}", "\u{7f}", "é", "😀"] {
            for offset in 0..<24 {
                let text = String(repeating: "a", count: offset) + special + String(repeating: "b", count: 24 - offset)
                #expect(JSON.string(.string(text)) == FoundationJSON.string(.string(text)), "\(text.debugDescription)")
            }
        }
    }

    @Test func nonLatinTextIsRawUTF8() {
        let text = "日本語 Ελληνικά 😀 e\u{301} \u{2028} \u{FFFF} \u{10FFFF}"
        #expect(JSON.string(.string(text)) == "\"\(text)\"")
        #expect(JSON.bytes(.string(text)) == [UInt8](("\"" + text + "\"").utf8))
        // A long run with no escapes, then one escape at the end.
        let long = String(repeating: "ab😀", count: 100) + "\n"
        #expect(JSON.string(.string(long)) == "\"" + String(repeating: "ab😀", count: 100) + "\\n\"")
    }

    @Test func keysSortByUTF8Bytes() {
        #expect(JSON.string(["b": 1, "a": 2, "B": 3, "": 4, "aa": 5]) == #"{"":4,"B":3,"a":2,"aa":5,"b":1}"#)
        // Precomposed é (C3 A9) sorts after every ASCII key; decomposed e + U+0301 (65 CC 81)
        // sorts right after "e". (Swift's `<` on String would order canonically instead.)
        #expect(JSON.string(["z": 1, "\u{E9}": 2, "f": 3]) == "{\"f\":3,\"z\":1,\"\u{E9}\":2}")
        #expect(JSON.string(["z": 1, "e\u{301}": 2, "f": 3, "e": 4]) == "{\"e\":4,\"e\u{301}\":2,\"f\":3,\"z\":1}")
        // Byte order, not scalar order: U+FFFF (EF BF BF) before U+10000 (F0 90 80 80), and
        // U+E000 (EE 80 80) before both.
        #expect(
            JSON.string(["\u{10000}": 1, "\u{FFFF}": 2, "\u{E000}": 3])
                == "{\"\u{E000}\":3,\"\u{FFFF}\":2,\"\u{10000}\":1}")
        // Keys that share their first eight bytes, and a key that is a prefix of another.
        #expect(
            JSON.string(["abcdefghB": 1, "abcdefgh": 2, "abcdefghA": 3, "abcdefgh\u{0}": 4, "abc": 5])
                == #"{"abc":5,"abcdefgh":2,"abcdefgh\u0000":4,"abcdefghA":3,"abcdefghB":1}"#)
    }

    @Test func containers() {
        #expect(JSON.string(.array([])) == "[]")
        #expect(JSON.string(.map([:])) == "{}")
        #expect(JSON.string([1, "two", [3.0, nil], ["k": [true]]]) == #"[1,"two",[3.0,null],{"k":[true]}]"#)
    }

    @Test func bytesAsBase64Object() {
        #expect(JSON.string(.bytes([0, 1, 2, 255])) == #"{"$bytes":"AAEC/w=="}"#)
        #expect(JSON.string(.bytes([])) == #"{"$bytes":""}"#)
        #expect(JSON.string(.bytes([0xfb])) == #"{"$bytes":"+w=="}"#)
        #expect(JSON.string(.bytes([0xfb, 0xff])) == #"{"$bytes":"+/8="}"#)
        #expect(JSON.string(.bytes([0xfb, 0xff, 0xbf])) == #"{"$bytes":"+/+/"}"#)
        // The base64 is exactly what Foundation writes, for every length and byte.
        var rng = SeededRandom(seed: 0xB64)
        for length in 0..<64 {
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &rng) }
            #expect(JSON.string(.bytes(bytes)) == "{\"$bytes\":\"\(Data(bytes).base64EncodedString())\"}")
        }
    }

    @Test func bytesAndStringAgree() {
        let value: Value = ["name": "Ωμέγα", "n": [1, 2.5, nil], "b": .bytes([1, 2])]
        #expect(JSON.bytes(value) == Array(JSON.string(value).utf8))
    }

    /// The new writer's output is byte-for-byte the old one's, for random values.
    @Test func matchesPreviousWriter() {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("JSON writer reference seed: \(seed) (replay: TRELLIS_SEED=\(seed))")
        for _ in 0..<2000 {
            let value = randomValue(depth: 4, using: &rng)
            let new = JSON.string(value)
            let old = FoundationJSON.string(value)
            #expect(new == old, "seed \(seed)")
            if new != old { return }
        }
    }
}

// MARK: Parser

@Suite struct JSONParserTests {
    @Test func literalsAndWhitespace() {
        expectParse("null", .null)
        expectParse("true", .bool(true))
        expectParse("false", .bool(false))
        expectParse(" \t\r\n true \n\t\r ", .bool(true))
        expectParse("[ 1 , { \"a\" : null } ]", [1, ["a": nil]])
        expectParse("\n{\r\"a\"\t:\n[\r]\t}\n", ["a": []])
        // A leading UTF-8 byte order mark is skipped (RFC 8259 §8.1 allows it).
        expectParse("\u{FEFF}{\"a\":1}", ["a": 1])
    }

    @Test func fragmentsAtTopLevel() {
        expectParse("1", 1)
        expectParse("\"x\"", "x")
        expectParse("[]", [])
        expectParse("{}", .map([:]))
        expectParse("[[[]]]", [[[]]])
    }

    @Test func stringEscapes() {
        expectParse(#""\"\\\/\b\f\n\r\t""#, .string("\"\\/\u{8}\u{c}\n\r\t"))
        expectParse(#""\u0041\u00e9\u00E9\u4e2d\u0000""#, .string("Aéé中\u{0}"))
        expectParse(#""\uD83D\uDE00\ud83d\ude00""#, .string("😀😀"))
        expectParse(#""\uDBFF\uDFFF""#, .string("\u{10FFFF}"))
        expectParse(#""\uFFFF""#, .string("\u{FFFF}"))
        expectParse(#""plain \"quoted\" text""#, "plain \"quoted\" text")
        expectParse("\"raw 日本 😀 e\u{301} \u{7f}\"", .string("raw 日本 😀 e\u{301} \u{7f}"))
        // Escapes inside a long run (exercises the eight-bytes-at-a-time scan on both sides).
        expectParse(
            #""abcdefghijklmnop\nabcdefghijklmnop\u00e9abcdefghijklmnop""#,
            .string("abcdefghijklmnop\nabcdefghijklmnop\u{e9}abcdefghijklmnop"))
        // Escaped text that would be invalid if taken raw: never normalised.
        expectParse(#""e\u0301""#, .string("e\u{301}"))
    }

    /// Quotes, escapes, control characters and multi-byte scalars at every position of a string
    /// around the eight-byte scanning windows.
    @Test func specialBytesAtEveryOffset() {
        for offset in 0..<24 {
            let before = String(repeating: "a", count: offset)
            let after = String(repeating: "b", count: 24 - offset)
            expectParse("\"\(before)\"", .string(before))
            expectParse("[\"\(before)\",\"\(after)\"]", [.string(before), .string(after)])
            expectParse("\"\(before)\\n\(after)\"", .string(before + "\n" + after))
            expectParse("\"\(before)\\\"\(after)\"", .string(before + "\"" + after))
            expectParse("\"\(before)\\u00e9\(after)\"", .string(before + "é" + after))
            expectParse("\"\(before)é😀\(after)\"", .string(before + "é😀" + after))
            expectParse("\"\(before)\u{7f}\(after)\"", .string(before + "\u{7f}" + after))
            expectError("\"\(before)\u{1}\(after)\"", "unescaped control character U+0001 at offset \(offset + 1)")
            expectError("\"\(before)\\n\u{1f}\(after)\"", "unescaped control character U+001F at offset \(offset + 3)")
            expectError(
                [0x22] + Array(before.utf8) + [0xc3, 0x28] + Array(after.utf8) + [0x22],
                "invalid UTF-8 at offset \(offset + 1)")
            expectError("\"\(before)", "expected '\"' at offset \(offset + 1)")
        }
    }

    @Test func numbersKeepTheirSpelling() {
        expectParse("0", .int(0))
        expectParse("1", .int(1))
        expectParse("-1", .int(-1))
        expectParse("-0", .int(0))  // an integer literal: int zero (ints have no sign of zero)
        expectParse("-0.0", .double(-0.0))
        expectParse("0.0", .double(0.0))
        expectParse("1.0", .double(1.0))
        expectParse("1e2", .double(100))
        expectParse("1E2", .double(100))
        expectParse("1e+2", .double(100))
        expectParse("1e-2", .double(0.01))
        expectParse("-0e0", .double(-0.0))
        expectParse("0e5", .double(0.0))
        expectParse("123.456e-2", .double(1.23456))
        expectParse("9223372036854775807", .int(.max))
        expectParse("-9223372036854775808", .int(.min))
        // Integer literals beyond Int64 are refused (read as doubles they would lose digits
        // without a word); with a fraction they are doubles.
        for literal in [
            "9223372036854775808", "-9223372036854775809", "18446744073709551616",
            "1" + String(repeating: "0", count: 23),
        ] {
            #expect(parseError(literal)?.contains("the integer \(literal) is outside int64") == true, "\(literal)")
        }
        expectParse("9223372036854775808.0", .double(9223372036854775808.0))
        expectParse("-9223372036854775809.0", .double(-9223372036854775809.0))
        expectParse("18446744073709551616.0", .double(18446744073709551616.0))
        expectParse("100000000000000000000000.0", .double(1e23))
        #expect(
            parseError("{\"tweet_id\":12345678901234567891}")
                == "the integer 12345678901234567891 is outside int64 (-9223372036854775808 to "
                + "9223372036854775807): write it as a string to keep every digit, or with a fraction "
                + "(12345678901234567891.0) to store it as a rounded double at offset 12")
        // Correct rounding, including the halfway and subnormal edges.
        expectParse("0.1", .double(0.1))
        expectParse("0.30000000000000004", .double(0.1 + 0.2))
        expectParse("9007199254740993", .int(9007199254740993))
        expectParse("9007199254740993.0", .double(9007199254740992.0))
        expectParse("2.2250738585072011e-308", .double(Double(bitPattern: 0x000F_FFFF_FFFF_FFFF)))
        expectParse("4.9e-324", .double(.leastNonzeroMagnitude))
        expectParse("2.4e-324", .double(0))
        expectParse("-1e-400", .double(-0.0))
        expectParse("1.7976931348623157e308", .double(.greatestFiniteMagnitude))
        expectParse("1e-99999999999999999999", .double(0))
        expectParse("0." + String(repeating: "0", count: 400) + "1e400", .double(0.1))
        expectParse(String(repeating: "1", count: 400) + "e-399", .double(1.1111111111111112))
    }

    @Test func duplicateKeysLastWins() throws {
        expectParse(#"{"a":1,"a":2}"#, ["a": 2])
        expectParse(#"{"a":2,"b":0,"a":1}"#, ["a": 1, "b": 0])
        // Keys are byte strings: two spellings of the same text (precomposed and decomposed é) are
        // two keys, both kept with their bytes, in byte order (U+00E9 is c3 a9, e + U+0301 is 65 cc 81).
        let both = try JSON.parse("{\"\u{E9}\":1,\"e\u{301}\":2}")
        #expect(both.mapValue?.count == 2)
        #expect(both.mapValue?.keys.map { Array($0.utf8) } == [[0x65, 0xCC, 0x81], [0xC3, 0xA9]])
        #expect(both["\u{E9}"] == 1 && both["e\u{301}"] == 2)
        #expect(JSON.string(both) == "{\"e\u{301}\":2,\"\u{E9}\":1}")
        #expect(try JSON.parse(JSON.string(both)) == both)
        // A repeat of the same bytes is still a repeat: the last one wins.
        expectParse("{\"e\u{301}\":1,\"\u{E9}\":2,\"e\u{301}\":3}", .map(["e\u{301}": 3, "\u{E9}": 2]))
        // Apart, in different objects, both spellings keep their bytes.
        let value = try JSON.parse("[{\"\u{E9}\":1},{\"e\u{301}\":2}]")
        guard case .array(let items) = value else {
            Issue.record("not an array")
            return
        }
        #expect(items[0].mapValue?.keys.first.map { Array($0.utf8) } == [0xC3, 0xA9])
        #expect(items[1].mapValue?.keys.first.map { Array($0.utf8) } == [0x65, 0xCC, 0x81])
    }

    @Test func bytesObject() {
        expectParse(#"{"$bytes":"AAEC/w=="}"#, .bytes([0, 1, 2, 255]))
        expectParse(#"{ "$bytes" : "" }"#, .bytes([]))
        expectParse(#"{"$bytes":"AAE=","$bytes":"AAEC"}"#, .bytes([0, 1, 2]))
        // Anything else stays a map: more keys, not a string, invalid or unpadded base64.
        expectParse(#"{"$bytes":"AAE=","x":1}"#, ["$bytes": "AAE=", "x": 1])
        expectParse(#"{"$bytes":5}"#, ["$bytes": 5])
        expectParse(#"{"$bytes":"AAE"}"#, ["$bytes": "AAE"])
        expectParse(#"{"$bytes":"!!"}"#, ["$bytes": "!!"])
        expectParse(#"{"$Bytes":"AAE="}"#, ["$Bytes": "AAE="])
    }

    @Test(arguments: [
        // Values
        ("", "expected a value at offset 0"),
        ("   ", "expected a value at offset 3"),
        ("+1", "expected a value at offset 0"),
        (".5", "expected a value at offset 0"),
        ("NaN", "expected a value at offset 0"),
        ("Infinity", "expected a value at offset 0"),
        ("-Infinity", "expected a digit at offset 1"),
        ("'a'", "expected a value at offset 0"),
        ("nul", "expected 'null' at offset 0"),
        ("nulL", "expected 'null' at offset 0"),
        ("tru", "expected 'true' at offset 0"),
        ("fals", "expected 'false' at offset 0"),
        ("True", "expected a value at offset 0"),
        ("\u{a0}1", "expected a value at offset 0"),
        ("\u{FEFF}\u{FEFF}1", "expected a value at offset 3"),
        ("1 \u{FEFF}", "expected end of input at offset 2"),
        // Trailing input
        ("1 2", "expected end of input at offset 2"),
        ("truex", "expected end of input at offset 4"),
        ("[1]]", "expected end of input at offset 3"),
        ("{}x", "expected end of input at offset 2"),
        ("[1]\u{0}", "expected end of input at offset 3"),
        // Numbers
        ("01", "leading zero in number at offset 0"),
        ("-01", "leading zero in number at offset 1"),
        ("00", "leading zero in number at offset 0"),
        ("-", "expected a digit at offset 1"),
        ("-a", "expected a digit at offset 1"),
        ("1.", "expected a digit after '.' at offset 2"),
        ("1.e5", "expected a digit after '.' at offset 2"),
        ("1e", "expected a digit in the exponent at offset 2"),
        ("1e+", "expected a digit in the exponent at offset 3"),
        ("1E-x", "expected a digit in the exponent at offset 3"),
        ("0x10", "expected end of input at offset 1"),
        ("1.5.5", "expected end of input at offset 3"),
        ("123abc", "expected end of input at offset 3"),
        ("1e400", "number out of range at offset 0"),
        ("[0, -1e400]", "number out of range at offset 4"),
        ("1.7976931348623159e308", "number out of range at offset 0"),
        ("1" + String(repeating: "0", count: 309) + ".0", "number out of range at offset 0"),
        // Arrays
        ("[", "expected a value at offset 1"),
        ("[1", "expected ',' or ']' at offset 2"),
        ("[1,", "expected a value at offset 3"),
        ("[1,]", "expected a value at offset 3"),
        ("[,1]", "expected a value at offset 1"),
        ("[1,,2]", "expected a value at offset 3"),
        ("[1 2]", "expected ',' or ']' at offset 3"),
        ("[1}", "expected ',' or ']' at offset 2"),
        ("]", "expected a value at offset 0"),
        // Objects
        ("{", "expected a string key or '}' at offset 1"),
        ("{1:2}", "expected a string key or '}' at offset 1"),
        ("{a:1}", "expected a string key or '}' at offset 1"),
        ("{\"a\"}", "expected ':' at offset 4"),
        ("{\"a\" 1}", "expected ':' at offset 5"),
        ("{\"a\":}", "expected a value at offset 5"),
        ("{\"a\":1,}", "expected a string key at offset 7"),
        ("{\"a\":1 \"b\":2}", "expected ',' or '}' at offset 7"),
        ("{\"a\":1,\"b\":2]", "expected ',' or '}' at offset 12"),
        ("{\"name\":\"x\",\"n\":12 ", "expected ',' or '}' at offset 19"),
        ("{,}", "expected a string key or '}' at offset 1"),
        // Strings
        ("\"abc", "expected '\"' at offset 4"),
        ("\"abc\\", "expected an escape character at offset 5"),
        ("\"a\\x\"", "expected an escape character (one of \" \\ / b f n r t u) at offset 3"),
        ("\"\\U0041\"", "expected an escape character (one of \" \\ / b f n r t u) at offset 2"),
        ("\"\\'\"", "expected an escape character (one of \" \\ / b f n r t u) at offset 2"),
        ("\"\\u12\"", "expected a hex digit at offset 5"),
        ("\"\\u12G4\"", "expected a hex digit at offset 5"),
        ("\"\\u123", "expected a hex digit at offset 6"),
        ("\"a\tb\"", "unescaped control character U+0009 at offset 2"),
        ("\"a\nb\"", "unescaped control character U+000A at offset 2"),
        ("\"\u{0}\"", "unescaped control character U+0000 at offset 1"),
        ("\"\u{1f}\"", "unescaped control character U+001F at offset 1"),
        ("\"a\\n\u{1}\"", "unescaped control character U+0001 at offset 4"),
        // Lone surrogates
        (
            #""\uD800""#,
            #"lone surrogate \uD800 (a \uD800-\uDBFF escape must be followed by \uDC00-\uDFFF) at offset 1"#
        ),
        (
            #""\udbff""#,
            #"lone surrogate \uDBFF (a \uD800-\uDBFF escape must be followed by \uDC00-\uDFFF) at offset 1"#
        ),
        (
            #""x\uDC00""#,
            #"lone surrogate \uDC00 (a \uD800-\uDBFF escape must be followed by \uDC00-\uDFFF) at offset 2"#
        ),
        (
            #""\uDFFF""#,
            #"lone surrogate \uDFFF (a \uD800-\uDBFF escape must be followed by \uDC00-\uDFFF) at offset 1"#
        ),
        (
            #""\uD800x""#,
            #"lone surrogate \uD800 (a \uD800-\uDBFF escape must be followed by \uDC00-\uDFFF) at offset 1"#
        ),
        (
            #""\uD800\n""#,
            #"lone surrogate \uD800 (a \uD800-\uDBFF escape must be followed by \uDC00-\uDFFF) at offset 1"#
        ),
        (
            #""\uD800\uD800""#,
            #"lone surrogate \uD800 (a \uD800-\uDBFF escape must be followed by \uDC00-\uDFFF) at offset 1"#
        ),
        (
            #""\uD800\u0041""#,
            #"lone surrogate \uD800 (a \uD800-\uDBFF escape must be followed by \uDC00-\uDFFF) at offset 1"#
        ),
        (#""\uD800\uDC0""#, "expected a hex digit at offset 12"),
    ])
    func errors(text: String, message: String) {
        expectError(text, message)
    }

    @Test(
        arguments: [
            ([0x22, 0xff, 0x22], 1),  // never a UTF-8 byte
            ([0x22, 0x80, 0x22], 1),  // continuation byte without a lead
            ([0x22, 0xc0, 0x80, 0x22], 1),  // overlong NUL
            ([0x22, 0xc1, 0xbf, 0x22], 1),  // overlong
            ([0x22, 0xe0, 0x80, 0x80, 0x22], 1),  // overlong 3-byte
            ([0x22, 0xf0, 0x80, 0x80, 0x80, 0x22], 1),  // overlong 4-byte
            ([0x22, 0xed, 0xa0, 0x80, 0x22], 1),  // UTF-8 encoded surrogate U+D800
            ([0x22, 0xed, 0xbf, 0xbf, 0x22], 1),  // U+DFFF
            ([0x22, 0xf4, 0x90, 0x80, 0x80, 0x22], 1),  // above U+10FFFF
            ([0x22, 0xf5, 0x80, 0x80, 0x80, 0x22], 1),
            ([0x22, 0x61, 0xc3, 0x22], 2),  // truncated sequence before the quote
            ([0x22, 0xe6, 0x97, 0x22], 1),
            ([0x22, 0xe6, 0x97], 1),  // truncated at the end of input
            ([0x22, 0xc3, 0xa9, 0xc3, 0x28, 0x22], 3),  // bad continuation after a good scalar
            ([0x22, 0x5c, 0x6e, 0xff, 0x22], 3),  // after an escape
            ([0x7b, 0x22, 0xff, 0x22, 0x3a, 0x31, 0x7d], 2),  // in a key
            ([0x22] + Array(repeating: 0x61, count: 20) + [0xfe, 0x22], 21),  // after a long ASCII run
        ] as [([UInt8], Int)])
    func invalidUTF8(bytes: [UInt8], offset: Int) {
        expectError(bytes, "invalid UTF-8 at offset \(offset)")
    }

    /// A text that is one string literal takes the parser's shortcut; the same literal after a
    /// space takes the parser's full path. The two read alike (or both refuse) for every content
    /// of one and two bytes, and for three- and four-byte sequences that are well formed, cut
    /// short, overlong, surrogates or beyond U+10FFFF, beside quotes, backslashes and the end.
    @Test func aLoneStringLiteralReadsAsTheFullParserReadsIt() {
        var failures: [String] = []
        var accepted = 0
        func agree(_ text: [UInt8]) {
            let fast = try? JSON.parse(text)
            let full = try? JSON.parse([0x20] + text)
            if fast != full { failures.append("\(text): \(String(describing: fast)), not \(String(describing: full))") }
            if fast != nil {
                accepted += 1
                if String(validating: text, as: UTF8.self) == nil { failures.append("\(text) is not UTF-8") }
            }
        }
        for a in UInt8.min...UInt8.max {
            agree([0x22, a, 0x22])
            agree([0x22, a])
            agree([a, 0x22])
            for b in UInt8.min...UInt8.max { agree([0x22, a, b, 0x22]) }
        }
        // Stored `_id` keys, which query results and log entries read their `_id`s from this way:
        // escapes, composite keys, damaged keys (a space before the text is the full path's
        // oracle, so no key here starts with a byte order mark, which is accepted only first).
        for key in [
            #""d5""#, #""""#, #""a\"b""#, #""\u00e9""#, #""名前 😀""#, "\"tab\t\"", #"{"a":1,"b":"x"}"#, #""a"#,
            #"a""#, #"""#, "", " \"a\"", #""a" "#, #""a"b""#, "null", "12",
        ] {
            agree(Array(key.utf8))
        }
        let continuations: [UInt8] = [0x22, 0x5C, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF]
        for lead: UInt8 in [0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xF7, 0xF8, 0xFF] {
            for second in continuations {
                for third in continuations {
                    agree([0x22, lead, second, third, 0x22])
                    agree([0x22, 0x61, lead, second, third])
                    for fourth in continuations { agree([0x22, lead, second, third, fourth, 0x22]) }
                }
            }
        }
        #expect(failures.isEmpty, "\(failures.prefix(10))")
        #expect(accepted > 2_000)
    }

    @Test func validUTF8Edges() throws {
        // The first and last scalar of each UTF-8 length, and the edges around the surrogates.
        for scalar: UInt32 in [0x80, 0x7ff, 0x800, 0xd7ff, 0xe000, 0xfffd, 0xffff, 0x10000, 0x10ffff] {
            let text = String(Unicode.Scalar(scalar)!)
            expectParse("\"\(text)\"", .string(text))
            expectParse("{\"\(text)\":\"\(text)\"}", .map([text: .string(text)]))
        }
    }

    @Test func bytesOutsideStringsAreSyntaxErrors() {
        expectError([0xff], "expected a value at offset 0")
        expectError([0x5b, 0x31, 0x5d, 0x20, 0xff], "expected end of input at offset 4")
        // UTF-16 is not detected: JSON exchanged between systems is UTF-8 (RFC 8259 §8.1).
        expectError([0xff, 0xfe, 0x31, 0x00], "expected a value at offset 0")
        expectError([0x31, 0x00], "expected end of input at offset 1")
    }

    @Test func nestingLimit() throws {
        let limit = JSON.maximumDepth
        #expect(limit == 512)
        let deepest = String(repeating: "[", count: limit) + String(repeating: "]", count: limit)
        var value = try JSON.parse(deepest)
        var depth = 0
        while case .array(let a) = value {
            depth += 1
            guard let first = a.first else { break }
            value = first
        }
        #expect(depth == limit)
        let tooDeep = String(repeating: "[", count: limit + 1) + String(repeating: "]", count: limit + 1)
        expectError(tooDeep, "arrays and objects nested deeper than 512 at offset 512")
        let objects = String(repeating: "{\"a\":", count: limit + 1) + "1" + String(repeating: "}", count: limit + 1)
        expectError(objects, "arrays and objects nested deeper than 512 at offset \(5 * limit)")
        let mixed = String(repeating: "[{\"k\":", count: limit / 2) + "{}" + String(repeating: "}]", count: limit / 2)
        expectError(mixed, "arrays and objects nested deeper than 512 at offset \(6 * (limit / 2))")
        // Hostile input: far deeper than any stack would take if the parser recursed.
        expectError(String(repeating: "[", count: 1_000_000), "arrays and objects nested deeper than 512 at offset 512")
        // Depth is about nesting, not about how many containers there are.
        let wide = "[" + Array(repeating: "[[1],{\"a\":[]}]", count: 5000).joined(separator: ",") + "]"
        guard case .array(let items) = try JSON.parse(wide) else {
            Issue.record("not an array")
            return
        }
        #expect(items.count == 5000)
    }

    @Test func errorOffsetsCountBytesNotCharacters() {
        // "é" is two bytes, "😀" four: the offset is the byte offset in the UTF-8.
        expectError("[\"é😀\" 1]", "expected ',' or ']' at offset 10")
    }
}

// MARK: Properties

@Suite struct JSONPropertyTests {
    /// `parse(string(v)) == v` for random values (doubles compared by bit pattern), through every
    /// entry point.
    @Test func roundTripRandomValues() throws {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("JSON round-trip seed: \(seed) (replay: TRELLIS_SEED=\(seed))")
        for _ in 0..<3000 {
            let value = randomValue(depth: 4, using: &rng)
            let text = JSON.string(value)
            let back = try JSON.parse(text)
            #expect(back == value, "seed \(seed): \(text)")
            #expect(try JSON.parse(JSON.bytes(value)) == value, "seed \(seed)")
            if back != value { return }
        }
    }

    /// Every double, written and read back, keeps its bits (this is where the Foundation parser
    /// failed for about one double in five).
    @Test func doublesRoundTripBitExactly() throws {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("JSON double round-trip seed: \(seed) (replay: TRELLIS_SEED=\(seed))")
        for _ in 0..<20000 {
            let d = randomFiniteDouble(using: &rng)
            let text = JSON.string(.double(d))
            let back = try JSON.parse(text)
            guard back == .double(d) else {
                Issue.record("seed \(seed): \(text) read back as \(back)")
                return
            }
        }
    }

    /// Number literals of every shape convert exactly as the standard library's correctly
    /// rounded `Double(_:)` does (and integer literals that fit become `.int`).
    @Test func numbersAgreeWithStandardLibrary() throws {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("JSON number seed: \(seed) (replay: TRELLIS_SEED=\(seed))")
        var doubles = 0
        for _ in 0..<20000 {
            let literal = randomNumberLiteral(using: &rng)
            let expected: Value
            if let i = Int64(literal) {
                expected = .int(i)
            } else if !literal.contains(where: { ".eE".contains($0) }) {
                #expect(parseError(literal)?.contains("is outside int64") == true, "seed \(seed): \(literal)")
                continue
            } else {
                let d = try #require(Double(literal))
                guard d.isFinite else {
                    #expect(parseError(literal) == "number out of range at offset 0", "seed \(seed): \(literal)")
                    continue
                }
                expected = .double(d)
                doubles += 1
            }
            let parsed = try JSON.parse(literal)
            guard parsed == expected else {
                Issue.record("seed \(seed): \(literal) parsed as \(parsed), expected \(expected)")
                return
            }
        }
        #expect(doubles > 1000)
    }

    /// On random JSON texts the new parser gives exactly what the Foundation-based conversion
    /// gave, except for number literals that `JSONSerialization` reads as `NSDecimalNumber`
    /// (those are checked against the standard library instead, and counted).
    @Test func agreesWithFoundation() throws {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("JSON Foundation-agreement seed: \(seed) (replay: TRELLIS_SEED=\(seed))")
        var compared = 0
        var refused = 0
        for _ in 0..<2000 {
            var text = ""
            randomJSONText(depth: 4, into: &text, using: &rng)
            if let message = parseError(text) {
                // An integer literal beyond Int64, which Foundation rounds: refused.
                #expect(message.contains("is outside int64"), "seed \(seed): \(text): \(message)")
                refused += 1
                continue
            }
            let new = try JSON.parse(text)
            let old = try FoundationJSON.parse(Data(text.utf8))
            #expect(new == old, "seed \(seed): \(text)")
            if new != old { return }
            compared += 1
        }
        #expect(compared + refused == 2000 && compared > 1000)

        // The literals Foundation reads as decimals: the new parser is correctly rounded there,
        // the old one was not always (and turned 19-digit negative integers into doubles).
        var decimals = 0
        var oldWrong = 0
        for _ in 0..<2000 {
            let literal = randomNumberLiteral(using: &rng)
            guard FoundationJSON.usesDecimal(literal), let d = Double(literal), d.isFinite else { continue }
            if Int64(literal) == nil, !literal.contains(where: { ".eE".contains($0) }) { continue }  // refused
            decimals += 1
            let expected: Value = Int64(literal).map { .int($0) } ?? .double(d)
            #expect(try JSON.parse(literal) == expected, "seed \(seed): \(literal)")
            if try FoundationJSON.parse(Data(literal.utf8)) != expected { oldWrong += 1 }
        }
        print("JSON: \(decimals) decimal literals, Foundation's value differed on \(oldWrong)")
        #expect(decimals > 0)
    }

    /// Random bytes never crash the parser; whatever it accepts writes and reads back the same.
    @Test func randomBytesNeverCrash() throws {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("JSON random-bytes seed: \(seed) (replay: TRELLIS_SEED=\(seed))")
        let alphabet =
            Array("{}[]\",:0123456789-+.eEtrufalsn \\u\t\n".utf8) + [0x00, 0x1f, 0x80, 0xc3, 0xa9, 0xed, 0xff]
        var accepted = 0
        for i in 0..<12000 {
            let count = Int.random(in: 0...24, using: &rng)
            let bytes: [UInt8] = (0..<count).map { _ in
                i % 2 == 0
                    ? UInt8.random(in: 0...255, using: &rng)
                    : alphabet[Int.random(in: 0..<alphabet.count, using: &rng)]
            }
            if try checkParser(on: bytes, seed: seed) { accepted += 1 }
        }
        #expect(accepted > 0, "some random inputs are JSON (seed \(seed))")
    }

    /// Mutated JSON texts never crash the parser; where both accept, the new parser agrees with
    /// Foundation (up to Foundation's decimal rounding), and it accepts nothing Foundation rejects.
    @Test func mutatedJSONNeverCrashes() throws {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("JSON mutation seed: \(seed) (replay: TRELLIS_SEED=\(seed))")
        var accepted = 0
        var rejected = 0
        for _ in 0..<12000 {
            var bytes = JSON.bytes(randomValue(depth: 3, using: &rng))
            for _ in 0..<Int.random(in: 1...3, using: &rng) {
                mutate(&bytes, using: &rng)
            }
            if try checkParser(on: bytes, seed: seed) {
                accepted += 1
                let new = try JSON.parse(bytes)
                do {
                    let old = try FoundationJSON.parse(Data(bytes))
                    #expect(sameUpToDecimalRounding(new, old), "seed \(seed): \(bytes)")
                } catch {
                    Issue.record("seed \(seed): Foundation rejects what the parser accepts: \(bytes): \(error)")
                }
            } else {
                rejected += 1
            }
        }
        #expect(accepted > 0 && rejected > 0, "seed \(seed)")
    }
}

// MARK: Property helpers

/// Parses `bytes`; on success checks the value writes and reads back unchanged, on failure that
/// the message names an offset inside the input. Returns whether it parsed.
private func checkParser(on bytes: [UInt8], seed: UInt64) throws -> Bool {
    do throws(JSONError) {
        let value = try JSON.parse(bytes)
        #expect(try JSON.parse(JSON.bytes(value)) == value, "seed \(seed): \(bytes)")
        return true
    } catch {
        let offset = error.message.split(separator: " ").last.flatMap { Int($0) }
        #expect(offset.map { (0...bytes.count).contains($0) } == true, "seed \(seed): \(error.message)")
        return false
    }
}

/// Structural equality where a double from Foundation may be off by its decimal conversion (seen
/// up to about 5 ulp; 1e-13 relative allows for more), and a 19-digit negative integer may have
/// come back from Foundation as a double. The new parser's numbers are checked exactly elsewhere.
private func sameUpToDecimalRounding(_ new: Value, _ old: Value) -> Bool {
    switch (new, old) {
    case (.double(let a), .double(let b)):
        return a.bitPattern == b.bitPattern || closeEnough(a, b)
    case (.int(let a), .double(let b)):
        return a < -999_999_999_999_999_999 && closeEnough(Double(a), b)
    case (.array(let a), .array(let b)):
        return a.count == b.count && zip(a, b).allSatisfy { sameUpToDecimalRounding($0, $1) }
    case (.map(let a), .map(let b)):
        return a.count == b.count
            && a.allSatisfy { key, value in b[key].map { sameUpToDecimalRounding(value, $0) } ?? false }
    default:
        return new == old
    }
}

private func closeEnough(_ a: Double, _ b: Double) -> Bool {
    abs(a - b) <= max(abs(a), abs(b)) * 1e-13 + Double.leastNormalMagnitude
}

private func mutate(_ bytes: inout [UInt8], using rng: inout some RandomNumberGenerator) {
    let interesting: [UInt8] = Array("{}[]\",:.-+eE0\\u".utf8) + [0x00, 0x20, 0x80, 0xff, 0xc3, 0xed]
    let position = bytes.isEmpty ? 0 : Int.random(in: 0..<bytes.count, using: &rng)
    switch Int.random(in: 0..<5, using: &rng) {
    case 0 where !bytes.isEmpty:
        bytes.remove(at: position)
    case 1:
        bytes.insert(interesting[Int.random(in: 0..<interesting.count, using: &rng)], at: position)
    case 2 where !bytes.isEmpty:
        bytes[position] = interesting[Int.random(in: 0..<interesting.count, using: &rng)]
    case 3 where !bytes.isEmpty:
        bytes[position] ^= UInt8(1) << UInt8.random(in: 0...7, using: &rng)
    default:
        bytes.removeLast(Int.random(in: 0...min(bytes.count, 4), using: &rng))
    }
}

/// A random number literal in RFC 8259 grammar: ints of every width, fractions, exponents of
/// both signs and cases, long digit strings, the Int64 edges, underflow and overflow.
private func randomNumberLiteral(using rng: inout some RandomNumberGenerator) -> String {
    func digits(_ count: Int) -> String {
        String((0..<count).map { _ in Character(String(Int.random(in: 0...9, using: &rng))) })
    }
    let sign = Bool.random(using: &rng) ? "-" : ""
    switch Int.random(in: 0..<8, using: &rng) {
    case 0: return String(randomInt64(using: &rng))
    case 1:
        let edges = [
            "9223372036854775807", "-9223372036854775808", "9223372036854775808", "-9223372036854775809",
            "18446744073709551615", "18446744073709551616", "-0", "0", "1e400", "-1e-400", "4.9e-324",
            "2.4703282292062328e-324", "1.7976931348623158e308",
        ]
        return edges.randomElement(using: &rng)!
    case 2: return "\(randomFiniteDouble(using: &rng))"
    default:
        let integer =
            Int.random(in: 0..<4, using: &rng) == 0
            ? "0" : "\(Int.random(in: 1...9, using: &rng))" + digits(Int.random(in: 0...20, using: &rng))
        var literal = sign + integer
        if Bool.random(using: &rng) { literal += "." + digits(Int.random(in: 1...20, using: &rng)) }
        if Bool.random(using: &rng) {
            literal += ["e", "E"].randomElement(using: &rng)! + ["", "+", "-"].randomElement(using: &rng)!
            literal += String(Int.random(in: 0...330, using: &rng))
        }
        return literal
    }
}

/// A random JSON text with random whitespace, all escapes, raw non-ASCII text, duplicate keys
/// and `$bytes` objects, whose number literals all avoid `JSONSerialization`'s decimal path.
private func randomJSONText(depth: Int, into text: inout String, using rng: inout some RandomNumberGenerator) {
    func space() {
        for _ in 0..<Int.random(in: 0...2, using: &rng) {
            text += [" ", "\t", "\n", "\r"].randomElement(using: &rng)!
        }
    }
    space()
    switch Int.random(in: 0..<(depth > 0 ? 9 : 6), using: &rng) {
    case 0: text += ["null", "true", "false"].randomElement(using: &rng)!
    case 1, 2:
        var literal = randomNumberLiteral(using: &rng)
        while FoundationJSON.usesDecimal(literal) || !(Double(literal)?.isFinite ?? false) {
            literal = randomNumberLiteral(using: &rng)
        }
        text += literal
    case 3, 4: text += randomStringLiteral(using: &rng)
    case 5: text += JSON.string(.bytes(randomBytes(using: &rng)))
    case 6, 7:
        text += "{"
        let count = Int.random(in: 0...4, using: &rng)
        for i in 0..<count {
            if i > 0 { text += "," }
            space()
            text += Int.random(in: 0..<6, using: &rng) == 0 ? "\"dup\"" : randomStringLiteral(using: &rng)
            space()
            text += ":"
            randomJSONText(depth: depth - 1, into: &text, using: &rng)
        }
        space()
        text += "}"
    default:
        text += "["
        let count = Int.random(in: 0...4, using: &rng)
        for i in 0..<count {
            if i > 0 { text += "," }
            randomJSONText(depth: depth - 1, into: &text, using: &rng)
        }
        space()
        text += "]"
    }
    space()
}

/// A random JSON string literal mixing raw text (any scalar but `"`, `\` and controls) with
/// every kind of escape, including surrogate pairs in either hex case.
private func randomStringLiteral(using rng: inout some RandomNumberGenerator) -> String {
    var literal = "\""
    for _ in 0..<Int.random(in: 0...6, using: &rng) {
        switch Int.random(in: 0..<4, using: &rng) {
        case 0:
            literal += [#"\""#, #"\\"#, #"\/"#, #"\b"#, #"\f"#, #"\n"#, #"\r"#, #"\t"#].randomElement(using: &rng)!
        case 1:
            var scalar = UInt32.random(in: 0...0x10FFFF, using: &rng)
            if Bool.random(using: &rng) { scalar &= 0xFFFF }
            if (0xD800..<0xE000).contains(scalar) { scalar = 0xE9 }
            let units = Array(String(Unicode.Scalar(scalar)!).utf16)
            let uppercase = Bool.random(using: &rng)
            for unit in units {
                let hex = String(unit, radix: 16, uppercase: uppercase)
                literal += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            }
        default:
            for scalar in randomString(using: &rng).unicodeScalars {
                switch scalar {
                case "\"", "\\": literal += "\\" + String(scalar)
                case let c where c.value < 0x20:
                    literal += "\\u00" + (c.value < 0x10 ? "0" : "") + String(c.value, radix: 16)
                default: literal.unicodeScalars.append(scalar)
                }
            }
        }
    }
    return literal + "\""
}
