import Foundation
import Testing
import TrellisCore
import TrellisTestKit

// MARK: Helpers

/// Bytes from a hex string ("a1 61 61 01" or "a1616101").
private func bytes(_ hex: String) -> [UInt8] {
    let digits = hex.filter { !$0.isWhitespace }.map { UInt8(String($0), radix: 16)! }
    return stride(from: 0, to: digits.count, by: 2).map { digits[$0] << 4 | digits[$0 + 1] }
}

private func hex(_ bytes: [UInt8]) -> String {
    bytes.map { String($0 >> 4, radix: 16) + String($0 & 0xf, radix: 16) }.joined()
}

/// The errors of decoding `input` as a `Value` and as a `CBORItem`; `nil` where it decoded.
private func decodeError(
    _ input: [UInt8], options: CBOR.DecodingOptions = CBOR.DecodingOptions()
) -> (value: CBORError?, item: CBORError?) {
    var valueError: CBORError?
    var itemError: CBORError?
    do throws(CBORError) { _ = try CBOR.decode(input, options: options) } catch { valueError = error }
    do throws(CBORError) { _ = try CBOR.decodeItem(input, options: options) } catch { itemError = error }
    return (valueError, itemError)
}

/// Expects both decoders to reject `input` with `code` (for well-formedness errors).
private func expectMalformed(
    _ input: [UInt8], _ code: CBORError.Code, offset: Int? = nil,
    options: CBOR.DecodingOptions = CBOR.DecodingOptions(),
    sourceLocation: SourceLocation = #_sourceLocation
) {
    let errors = decodeError(input, options: options)
    #expect(errors.value?.code == code, "decode(\(hex(input)))", sourceLocation: sourceLocation)
    #expect(errors.item?.code == code, "decodeItem(\(hex(input)))", sourceLocation: sourceLocation)
    if let offset {
        #expect(errors.value?.offset == offset, sourceLocation: sourceLocation)
        #expect(errors.item?.offset == offset, sourceLocation: sourceLocation)
    }
}

/// Expects `CBOR.decode` (to `Value`) to reject `input` with `code`.
private func expectValueError(
    _ input: [UInt8], _ code: CBORError.Code, options: CBOR.DecodingOptions = CBOR.DecodingOptions(),
    sourceLocation: SourceLocation = #_sourceLocation
) {
    #expect(
        decodeError(input, options: options).value?.code == code, "decode(\(hex(input)))",
        sourceLocation: sourceLocation)
}

/// Encodes, checks the exact bytes when given, decodes, and checks the value comes back identical.
private func expectRoundTrip(
    _ value: Value, _ expectedHex: String? = nil, sourceLocation: SourceLocation = #_sourceLocation
) {
    let encoded = CBOR.encode(value)
    if let expectedHex {
        #expect(hex(encoded) == expectedHex.filter { !$0.isWhitespace }, sourceLocation: sourceLocation)
    }
    do {
        let decoded = try CBOR.decode(encoded, options: CBOR.DecodingOptions(requireDeterministic: true))
        #expect(decoded == value, sourceLocation: sourceLocation)
    } catch {
        Issue.record("decoding \(hex(encoded)) failed: \(error)", sourceLocation: sourceLocation)
    }
}

// MARK: RFC 8949 Appendix A

/// RFC 8949 Appendix A, from `Tests/Vectors/cbor/rfc8949-appendix-a.json` (a list of
/// `{hex, cbor (base64), roundtrip, decoded | diagnostic}`).
@Suite struct CBORAppendixATests {
    static let vectorPath = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Tests/Vectors/cbor/rfc8949-appendix-a.json").path

    /// Vectors not checked, by hex, with the reason. Every vector is currently checked.
    static let exclusions: [String: String] = [:]

    /// Vectors the file lists as valid that RFC 8949 is explicit are not well-formed: they are
    /// checked to be rejected, with the code given. `f818` ("simple(24)") comes from RFC 7049's
    /// Appendix A; RFC 8949 §3.3 says a two-byte simple value below 32 is not well-formed and
    /// dropped the example (see also github.com/cbor/test-vectors issue 7).
    static let notWellFormed: [String: CBORError.Code] = ["f818": .invalidSimpleValue]

    /// Diagnostic notation the decoder cannot reproduce because it reads indefinite-length
    /// strings into definite ones (allowed, RFC 8949 §3.2.3): the expected text is the
    /// equivalent definite string, so the vector is still checked.
    static let definiteDiagnostics: [String: String] = [
        "(_ h'0102', h'030405')": "h'0102030405'"
    ]

    struct Vector {
        var hex: String
        var roundtrip: Bool
        var decoded: VectorJSON?
        var diagnostic: String?
    }

    static func loadVectors() throws -> [Vector] {
        let data = try #require(
            FileManager.default.contents(atPath: vectorPath),
            "RFC 8949 Appendix A vectors missing: expected \(vectorPath)")
        guard case .array(let entries) = try VectorJSON.parse(Array(data)) else {
            Issue.record("\(vectorPath) is not a JSON array")
            return []
        }
        return try entries.map { entry in
            guard case .string(let hex)? = entry["hex"], case .bool(let roundtrip)? = entry["roundtrip"] else {
                throw VectorJSON.ParseError(offset: 0, message: "vector without hex/roundtrip")
            }
            var diagnostic: String?
            if case .string(let text)? = entry["diagnostic"] { diagnostic = text }
            return Vector(hex: hex, roundtrip: roundtrip, decoded: entry["decoded"], diagnostic: diagnostic)
        }
    }

    @Test func decodesEveryVectorAndReencodesRoundTripOnes() throws {
        let vectors = try Self.loadVectors()
        #expect(vectors.count == 82, "the RFC 8949 Appendix A file has 82 vectors")
        var checked = 0
        for vector in vectors where Self.exclusions[vector.hex] == nil {
            let input = bytes(vector.hex)
            if let code = Self.notWellFormed[vector.hex] {
                #expect(decodeError(input).item?.code == code, "\(vector.hex) must be rejected")
                checked += 1
                continue
            }
            let item: CBORItem
            do {
                item = try CBOR.decodeItem(input)
            } catch {
                Issue.record("\(vector.hex): \(error)")
                continue
            }
            if let decoded = vector.decoded {
                #expect(matches(item, decoded), "\(vector.hex) decoded to \(item), expected \(decoded)")
            } else if let diagnostic = vector.diagnostic {
                let expected = Self.definiteDiagnostics[diagnostic] ?? diagnostic
                #expect(item.description == expected, "\(vector.hex)")
            } else {
                Issue.record("\(vector.hex) has neither decoded nor diagnostic")
                continue
            }
            let reencoded = CBOR.encodeItem(item)
            if vector.roundtrip {
                #expect(hex(reencoded) == vector.hex, "\(vector.hex) re-encoded as \(hex(reencoded))")
            } else {
                // Not preferred serialisation: re-encoding gives the preferred form, no longer and stable.
                #expect(reencoded != input && reencoded.count <= input.count, "\(vector.hex) → \(hex(reencoded))")
                let again = try CBOR.decodeItem(reencoded)
                #expect(CBOR.encodeItem(again) == reencoded)
                #expect(again.description == item.description)
            }
            checked += 1
        }
        #expect(checked == vectors.count - Self.exclusions.count)
    }

    /// `Value` errors expected for Appendix A vectors that have no `Value` equivalent; every
    /// other vector must decode.
    static let valueErrors: [String: CBORError.Code] = [
        "1bffffffffffffffff": .integerOutOfRange, "3bffffffffffffffff": .integerOutOfRange,
        "c249010000000000000000": .unsupportedTag, "c349010000000000000000": .unsupportedTag,
        "f97c00": .nonFiniteNumber, "f97e00": .nonFiniteNumber, "f9fc00": .nonFiniteNumber,
        "fa7f800000": .nonFiniteNumber, "fa7fc00000": .nonFiniteNumber, "faff800000": .nonFiniteNumber,
        "fb7ff0000000000000": .nonFiniteNumber, "fb7ff8000000000000": .nonFiniteNumber,
        "fbfff0000000000000": .nonFiniteNumber,
        "f7": .unsupportedSimpleValue, "f0": .unsupportedSimpleValue, "f818": .invalidSimpleValue,
        "f8ff": .unsupportedSimpleValue,
        "c074323031332d30332d32315432303a30343a30305a": .unsupportedTag, "c11a514b67b0": .unsupportedTag,
        "c1fb41d452d9ec200000": .unsupportedTag, "d74401020304": .unsupportedTag,
        "d818456449455446": .unsupportedTag,
        "d82076687474703a2f2f7777772e6578616d706c652e636f6d": .unsupportedTag,
        "a201020304": .nonTextMapKey,
    ]

    @Test func decodesVectorsAsValuesOrNamesWhyNot() throws {
        let vectors = try Self.loadVectors()
        var decodedCount = 0
        for vector in vectors {
            let input = bytes(vector.hex)
            if let error = decodeError(input).value {
                #expect(error.code == Self.valueErrors[vector.hex], "\(vector.hex): \(error)")
            } else {
                let value = try CBOR.decode(input)
                #expect(Self.valueErrors[vector.hex] == nil, "\(vector.hex) should not decode to a Value")
                // The value equals the generic item, read back from its deterministic encoding.
                let encoded = CBOR.encode(value)
                #expect(try CBOR.decode(encoded) == value)
                if let decoded = vector.decoded {
                    #expect(matches(try CBOR.decodeItem(encoded), decoded), "\(vector.hex) as \(value)")
                }
                decodedCount += 1
            }
        }
        #expect(decodedCount == vectors.count - Self.valueErrors.count)
    }

    /// Compares a decoded item with the vector file's JSON: integers by exact decimal text (bignum
    /// tags 2 and 3 included), floats by bit pattern, strings by UTF-8 bytes, maps by key lookup.
    func matches(_ item: CBORItem, _ json: VectorJSON) -> Bool {
        switch json {
        case .null: return item == .null
        case .bool(let b): return item == .bool(b)
        case .number(let text):
            if text.contains(where: { ".eE".contains($0) }) {
                guard case .float(let d, _) = item, let expected = Double(text) else { return false }
                return d.bitPattern == expected.bitPattern
            }
            return integerText(item) == text
        case .string(let s):
            guard case .textString(let t) = item else { return false }
            return t.utf8.elementsEqual(s.utf8)
        case .array(let elements):
            guard case .array(let items) = item, items.count == elements.count else { return false }
            return zip(items, elements).allSatisfy { matches($0, $1) }
        case .object(let members):
            guard case .map(let pairs) = item, pairs.count == members.count else { return false }
            return members.allSatisfy { name, expected in
                pairs.contains { $0.key == .textString(name) && matches($0.value, expected) }
            }
        }
    }

    func integerText(_ item: CBORItem) -> String? {
        func magnitude(_ bignum: [UInt8]) -> UInt128? {
            guard bignum.count < 16 else { return nil }
            return bignum.reduce(UInt128(0)) { $0 << 8 | UInt128($1) }
        }
        switch item {
        case .unsigned(let n): return String(n)
        case .negative(let n): return "-" + String(UInt128(n) + 1)
        case .tagged(2, .byteString(let b)): return magnitude(b).map { String($0) }
        case .tagged(3, .byteString(let b)): return magnitude(b).map { "-" + String($0 + 1) }
        default: return nil
        }
    }
}

// MARK: Value mapping

@Suite struct CBORValueTests {
    @Test func integersUseMajorTypes0And1InShortestForm() {
        expectRoundTrip(.int(0), "00")
        expectRoundTrip(.int(23), "17")
        expectRoundTrip(.int(24), "1818")
        expectRoundTrip(.int(-1), "20")
        expectRoundTrip(.int(-24), "37")
        expectRoundTrip(.int(-25), "3818")
        expectRoundTrip(.int(65536), "1a00010000")
        expectRoundTrip(.int(Int64.max), "1b7fffffffffffffff")
        expectRoundTrip(.int(Int64.min), "3b7fffffffffffffff")
    }

    @Test func integersOutsideInt64AreRejected() throws {
        expectValueError(bytes("1b8000000000000000"), .integerOutOfRange)
        expectValueError(bytes("3b8000000000000000"), .integerOutOfRange)
        #expect(try CBOR.decode(bytes("3b7fffffffffffffff")) == .int(.min))
    }

    @Test func doublesStayDoublesInTheirNarrowestExactWidth() throws {
        expectRoundTrip(.double(1.0), "f93c00")
        expectRoundTrip(.double(0.0), "f90000")
        expectRoundTrip(.double(-0.0), "f98000")
        expectRoundTrip(.double(1.5), "f93e00")
        expectRoundTrip(.double(65504.0), "f97bff")
        expectRoundTrip(.double(100000.0), "fa47c35000")
        expectRoundTrip(.double(1.1), "fb3ff199999999999a")
        expectRoundTrip(.double(1e300), "fb7e37e43c8800759c")
        expectRoundTrip(.double(-4.0), "f9c400")
        #expect(try CBOR.decode(bytes("f93c00")) == .double(1.0))
        #expect(try CBOR.decode(bytes("f93c00")) != .int(1))
        #expect(CBOR.encode(.int(1)) != CBOR.encode(.double(1.0)))
        let negativeZero = try CBOR.decode(bytes("f98000"))
        guard case .double(let d) = negativeZero else {
            Issue.record("expected a double, got \(negativeZero)")
            return
        }
        #expect(d == 0 && d.sign == .minus)
    }

    @Test func subnormalsKeepTheirExactBits() {
        expectRoundTrip(.double(.leastNonzeroMagnitude), "fb0000000000000001")
        expectRoundTrip(.double(-.leastNonzeroMagnitude), "fb8000000000000001")
        expectRoundTrip(.double(Double(Float.leastNonzeroMagnitude)), "fa00000001")
        expectRoundTrip(.double(Double(Float.leastNormalMagnitude) / 2), "fa00400000")
        expectRoundTrip(.double(5.960464477539063e-08), "f90001")  // smallest binary16 subnormal
        expectRoundTrip(.double(6.097555160522461e-05), "f903ff")  // largest binary16 subnormal
        expectRoundTrip(.double(.leastNormalMagnitude), "fb0010000000000000")
        expectRoundTrip(.double(.greatestFiniteMagnitude), "fb7fefffffffffffff")
    }

    @Test func everyBinary16PatternDecodesExactlyAndReencodesIdentically() throws {
        for bits in UInt16.min...UInt16.max {
            let input: [UInt8] = [0xf9, UInt8(bits >> 8), UInt8(bits & 0xff)]
            let item = try CBOR.decodeItem(input)
            guard case .float(let d, .half) = item else {
                Issue.record("\(hex(input)) decoded to \(item)")
                continue
            }
            #if !(os(macOS) && arch(x86_64))
                let reference = Double(Float16(bitPattern: bits))
                if !reference.isNaN { #expect(d.bitPattern == reference.bitPattern, "\(hex(input))") }
            #endif
            #expect(CBOR.encodeItem(item) == input, "\(hex(input))")
        }
    }

    @Test func binary32PatternsReencodeInTheNarrowestExactWidth() throws {
        var rng = SeededRandom(seed: 0x5EED_F32)
        for _ in 0..<20_000 {
            let bits = UInt32(truncatingIfNeeded: rng.next())
            let input: [UInt8] = [
                0xfa, UInt8(bits >> 24), UInt8(bits >> 16 & 0xff), UInt8(bits >> 8 & 0xff),
                UInt8(bits & 0xff),
            ]
            let item = try CBOR.decodeItem(input)
            guard case .float(let d, .single) = item else {
                Issue.record("\(hex(input)) decoded to \(item)")
                continue
            }
            let float = Float(bitPattern: bits)
            if !float.isNaN { #expect(d == Double(float)) }
            let reencoded = CBOR.encodeItem(item)
            #expect(reencoded == input || (reencoded.count == 3 && reencoded[0] == 0xf9), "\(hex(input))")
            guard case .float(let back, _) = try CBOR.decodeItem(reencoded) else { continue }
            #expect(back.bitPattern == d.bitPattern)
        }
    }

    @Test func nonFiniteNumbersAreRejectedWithAClearError() {
        for input in ["f97e00", "f97c00", "f9fc00", "fa7fc00000", "fb7ff8000000000000", "fb7ff8000000000001"] {
            let error = decodeError(bytes(input)).value
            #expect(error?.code == .nonFiniteNumber)
            #expect(error?.description.contains("finite") == true)
        }
        #expect(CBOR.encode(.double(.nan)) == bytes("f97e00"))
        #expect(CBOR.encode(.double(.infinity)) == bytes("f97c00"))
        #expect(CBOR.encode(.double(-.infinity)) == bytes("f9fc00"))
        #expect(CBOR.encodeItem(.float(.nan)) == bytes("f97e00"))
    }

    @Test func stringsKeepTheirExactUTF8Bytes() throws {
        let precomposed = "\u{e9}"
        let decomposed = "e\u{301}"
        #expect(precomposed == decomposed, "Swift String equality is canonical equivalence")
        expectRoundTrip(.string(precomposed), "62c3a9")
        expectRoundTrip(.string(decomposed), "6365cc81")
        #expect(try CBOR.decode(bytes("62c3a9")) != CBOR.decode(bytes("6365cc81")))
        #expect(try CBOR.decodeItem(bytes("62c3a9")) != CBOR.decodeItem(bytes("6365cc81")))
        expectRoundTrip(.string(""), "60")
        expectRoundTrip(.string("水"), "63e6b0b4")
        expectRoundTrip(.string("\u{10151}"), "64f0908591")
        expectRoundTrip(.string("한국어 👩‍👩‍👧 Ελληνικά"))
        expectRoundTrip(.string("\u{0}\u{7f}\"\\"), "6400 7f 22 5c")
        expectRoundTrip(.string(String(repeating: "a", count: 24)), "7818" + String(repeating: "61", count: 24))
        expectRoundTrip(.string(String(repeating: "ü", count: 200)))
    }

    @Test func invalidUTF8IsRejectedNeverRepaired() throws {
        for input in [
            "61ff", "61c0", "62c080", "62c361", "63eda080", "64f4908080", "65f888808080", "61fe", "628080",
            "a161ff01",  // as a map key
        ] {
            expectMalformed(bytes(input), .invalidUTF8)
        }
        // Each chunk of an indefinite-length text string must be valid on its own (RFC 8949 §3.2.3).
        expectMalformed(bytes("7f61c361a9ff"), .invalidUTF8)
        #expect(try CBOR.decode(bytes("7f62c3a9ff")) == .string("\u{e9}"))
    }

    /// The decoder's UTF-8 validation agrees with the standard library's on every 1- and 2-byte
    /// sequence and on random 3- to 6-byte ones biased towards non-ASCII bytes.
    @Test func utf8ValidationAgreesWithTheStandardLibrary() {
        func check(_ content: [UInt8]) {
            let stdlib = String(validating: content, as: UTF8.self)
            let decoded = try? CBOR.decodeItem([0x60 | UInt8(content.count)] + content)
            #expect((decoded == nil) == (stdlib == nil), "\(hex(content))")
            if let stdlib { #expect(decoded == .textString(stdlib)) }
        }
        for a in UInt8.min...UInt8.max {
            check([a])
            for b in UInt8.min...UInt8.max { check([a, b]) }
        }
        var rng = SeededRandom(seed: 0x07F8)
        for _ in 0..<100_000 {
            let content = (0..<Int.random(in: 3...6, using: &rng)).map { _ in
                Bool.random(using: &rng)
                    ? UInt8.random(in: 0x80...0xff, using: &rng)
                    : [0xe0, 0xed, 0xf0, 0xf4, 0x80, 0x9f, 0xa0, 0xbf, 0x8f, 0x90][Int.random(in: 0..<10, using: &rng)]
            }
            check(content)
        }
    }

    @Test func bytesArraysAndNestedMaps() {
        expectRoundTrip(.bytes([]), "40")
        expectRoundTrip(.bytes([1, 2, 3, 4]), "4401020304")
        expectRoundTrip(.bytes(Array(repeating: 0xff, count: 300)), "59012c" + String(repeating: "ff", count: 300))
        expectRoundTrip(.array([]), "80")
        expectRoundTrip(.map([:]), "a0")
        expectRoundTrip(["": 1], "a16001")
        expectRoundTrip([1, [2, 3], [4, 5]], "8301820203820405")
        expectRoundTrip(["a": 1, "b": [2, 3]], "a26161016162820203")
        expectRoundTrip(
            ["doc": ["tags": ["x", nil, true], "n": -2.5, "": [:], "raw": .bytes([0])], "list": [[[["deep"]]]]])
        expectRoundTrip(.array((0..<1000).map { .int(Int64($0)) }))
    }

    @Test func nonTextKeysAndDuplicateKeysAreRejected() throws {
        expectValueError(bytes("a10102"), .nonTextMapKey)
        expectValueError(bytes("a1400102"), .nonTextMapKey)
        expectValueError(bytes("a2616101616102"), .duplicateMapKey)
        expectValueError(bytes("bf616101616102ff"), .duplicateMapKey)
        // A repeat after other keys is found too, and reported at the repeat.
        let error = decodeError(bytes("a3616101616202616103")).value
        #expect(error?.code == .duplicateMapKey)
        #expect(error?.offset == 7)
        // Keys are byte strings: canonically equivalent keys with different bytes are two keys.
        let both = try CBOR.decode(bytes("a262c3a9016365cc8102"))
        #expect(both.mapValue?.count == 2)
        #expect(both["\u{E9}"] == 1 && both["e\u{301}"] == 2)
        #expect(CBOR.encode(both) == bytes("a262c3a9016365cc8102"))
        // The generic decoder keeps every pair, in order.
        let item = try CBOR.decodeItem(bytes("a2616101616102"))
        #expect(item == .map([(.textString("a"), .unsigned(1)), (.textString("a"), .unsigned(2))]))
    }

    @Test func tagsUndefinedAndOtherSimpleValuesHaveNoValueEquivalent() throws {
        expectValueError(bytes("c11a514b67b0"), .unsupportedTag)
        expectValueError(bytes("f7"), .unsupportedSimpleValue)
        expectValueError(bytes("f0"), .unsupportedSimpleValue)
        expectValueError(bytes("f820"), .unsupportedSimpleValue)
        #expect(try CBOR.decode(bytes("83f4f5f6")) == [false, true, nil])
    }

    @Test func mapKeysAreSortedByEncodedBytesWhateverTheInsertionOrder() {
        let keys = ["b", "a", "aa", "", "z", "ab", "ü", "zzz", "B", String(repeating: "k", count: 24)]
        var forward: UTF8Map<Value> = [:]
        for (i, key) in keys.enumerated() { forward[key] = .int(Int64(i)) }
        var backward: UTF8Map<Value> = [:]
        for (i, key) in keys.enumerated().reversed() { backward[key] = .int(Int64(i)) }
        var roomy = UTF8Map<Value>(minimumCapacity: 1000)
        for (i, key) in keys.enumerated().shuffled() { roomy[key] = .int(Int64(i)) }
        let encoded = CBOR.encode(.map(forward))
        #expect(CBOR.encode(.map(backward)) == encoded)
        #expect(CBOR.encode(.map(roomy)) == encoded)
        // "" < "B" < "a" < "b" < "z" < "aa" < "ab" < "ü" (c3bc) < "zzz" < 24 × "k" (head 7818).
        let expected =
            "aa" + "6003" + "614208" + "616101" + "616200" + "617a04" + "62616102" + "62616205" + "62c3bc06"
            + "637a7a7a07" + "7818" + String(repeating: "6b", count: 24) + "09"
        #expect(hex(encoded) == expected)
        #expect(
            (try? CBOR.decode(encoded, options: CBOR.DecodingOptions(requireDeterministic: true))) == .map(forward))
    }

    @Test func encodeIntoAppendsToAnExistingBuffer() throws {
        var buffer: [UInt8] = [0x82]
        buffer.reserveCapacity(64)
        CBOR.encode(.int(1), into: &buffer)
        CBOR.encode(["a": "b"], into: &buffer)
        #expect(hex(buffer) == "8201a161616162")
        #expect(try CBOR.decode(buffer) == [1, ["a": "b"]])
    }

    @Test func writerBuildsMessagesFieldByField() throws {
        var writer = CBORWriter()
        writer.writeMapHeader(count: 2)
        writer.writeText("id")
        writer.writeInt(7)
        writer.writeText("ok")
        writer.writeBool(true)
        #expect(hex(writer.bytes) == "a262696407626f6bf5")
        #expect(try CBOR.decode(writer.bytes) == ["id": 7, "ok": true])
    }

    @Test func nonDeterministicEncodingsDecodeUnlessDeterminismIsRequired() throws {
        let strict = CBOR.DecodingOptions(requireDeterministic: true)
        let cases: [(String, Value)] = [
            ("1800", 0), ("190017", 23), ("1a000000ff", 255), ("1b00000000ffffffff", 4_294_967_295),
            ("3800", -1), ("fa3f800000", 1.0), ("fb3ff0000000000000", 1.0), ("5f4101ff", .bytes([1])),
            ("9f01ff", [1]), ("bf616101ff", ["a": 1]), ("a2616201616101", ["a": 1, "b": 1]),
            ("780161", "a"),
        ]
        for (input, value) in cases {
            let encoded = bytes(input)
            #expect(try CBOR.decode(encoded) == value, "\(input)")
            #expect(decodeError(encoded, options: strict).value?.code == .notDeterministic, "\(input)")
            #expect(decodeError(encoded, options: strict).item?.code == .notDeterministic, "\(input)")
        }
        // Keys in the wrong order: "aa" (2 bytes) must follow "b" (1 byte).
        let unsorted = bytes("a2626161016162 02")
        #expect(try CBOR.decode(unsorted) == ["aa": 1, "b": 2])
        #expect(decodeError(unsorted, options: strict).value?.code == .notDeterministic)
        #expect(try CBOR.decode(bytes("a2616202626161 01"), options: strict) == ["aa": 1, "b": 2])
    }
}

// MARK: Robustness

@Suite struct CBORRobustnessTests {
    static let samples: [Value] = [
        0, -1, 1.5, 1e300, "hello", "\u{e9}", .bytes([1, 2, 3]), [1, [2, 3]], ["a": 1, "b": [2, 3]],
        ["doc": ["tags": ["x", nil, true], "n": -2.5, "": [:]], "i": .int(.min)],
    ]

    @Test func everyProperPrefixOfAValidEncodingIsRejected() throws {
        var rng = SeededRandom(seed: 0xC0FFEE)
        var encodings = Self.samples.map { CBOR.encode($0) }
        encodings += (0..<200).map { _ in CBOR.encode(randomValue(depth: 4, using: &rng)) }
        encodings += [
            "7f657374726561646d696e67ff", "9f018202039f0405ffff", "bf6346756ef563416d7421ff",
            "5f42010243030405ff", "c249010000000000000000", "f8ff",
        ].map(bytes)
        var prefixes = 0
        for encoding in encodings {
            for length in 0..<encoding.count {
                let prefix = Array(encoding[..<length])
                let errors = decodeError(prefix)
                #expect(errors.item != nil, "prefix \(hex(prefix)) of \(hex(encoding)) decoded")
                if let code = errors.item?.code {
                    #expect(code == .unexpectedEnd || code == .lengthExceedsInput, "\(hex(prefix)): \(code)")
                }
                prefixes += 1
            }
        }
        #expect(prefixes > 1000)
    }

    @Test func trailingBytesAreRejected() {
        expectMalformed(bytes("0000"), .trailingBytes, offset: 1)
        expectMalformed(bytes("8001"), .trailingBytes, offset: 1)
        expectMalformed(bytes("f6ff"), .trailingBytes, offset: 1)
        expectMalformed([], .unexpectedEnd, offset: 0)
    }

    @Test func reservedAdditionalInformationIsRejected() {
        for major in UInt8(0)...7 {
            for info in UInt8(28)...30 {
                expectMalformed([major << 5 | info, 0, 0, 0, 0, 0, 0, 0, 0], .reservedAdditionalInfo, offset: 0)
            }
        }
        expectMalformed(bytes("811c"), .reservedAdditionalInfo, offset: 1)
    }

    @Test func breakOutsideIndefiniteItemsIsRejected() {
        expectMalformed(bytes("ff"), .unexpectedBreak, offset: 0)
        expectMalformed(bytes("81ff"), .unexpectedBreak, offset: 1)
        expectMalformed(bytes("a1ff00"), .unexpectedBreak, offset: 1)
        expectMalformed(bytes("a16161ff"), .unexpectedBreak, offset: 3)
        expectMalformed(bytes("bf6161ff"), .unexpectedBreak, offset: 3)  // break where a value belongs
        let error = decodeError(bytes("c1ff")).item
        #expect(error?.code == .unexpectedBreak && error?.offset == 1)
    }

    @Test func indefiniteLengthWhereNotAllowedIsRejected() {
        expectMalformed(bytes("1f"), .invalidIndefiniteLength)
        expectMalformed(bytes("3f"), .invalidIndefiniteLength)
        expectMalformed(bytes("df00"), .invalidIndefiniteLength)
        expectMalformed(bytes("5f5f4101ffff"), .invalidIndefiniteChunk, offset: 1)
        expectMalformed(bytes("5f6161ff"), .invalidIndefiniteChunk, offset: 1)
        expectMalformed(bytes("7f4161ff"), .invalidIndefiniteChunk, offset: 1)
        expectMalformed(bytes("5f00ff"), .invalidIndefiniteChunk, offset: 1)
        expectMalformed(bytes("5f41"), .lengthExceedsInput, offset: 1)
        expectMalformed(bytes("9f01"), .unexpectedEnd, offset: 2)
    }

    @Test func twoByteSimpleValuesBelow32AreRejected() throws {
        for value in UInt8(0)..<32 { expectMalformed([0xf8, value], .invalidSimpleValue, offset: 0) }
        #expect(try CBOR.decodeItem(bytes("f820")) == .simple(32))
    }

    @Test func hugeDeclaredLengthsFailBeforeAllocating() throws {
        for input in [
            "5bffffffffffffffff", "7bffffffffffffffff", "9bffffffffffffffff", "bbffffffffffffffff",
            "5b7fffffffffffffff", "5affffffff", "9a7fffffff00", "ba7fffffff0000", "9b00000001000000000101",
            "a2000000", "5f5bffffffffffffffff",
        ] {
            let errors = decodeError(bytes(input))
            #expect(errors.item?.code == .lengthExceedsInput, "\(input): \(String(describing: errors.item))")
            #expect(errors.value?.code == .lengthExceedsInput, "\(input): \(String(describing: errors.value))")
        }
        // A length that fits what remains is fine; one more byte is not.
        #expect(try CBOR.decode(bytes("43010203")) == .bytes([1, 2, 3]))
        expectMalformed(bytes("44010203"), .lengthExceedsInput, offset: 0)
    }

    @Test func depthBombsAreRejected() {
        let arrays = [UInt8](repeating: 0x81, count: 10_000) + [0x00]
        expectMalformed(arrays, .depthLimitExceeded, offset: CBOR.defaultMaxDepth)
        let indefinite = [UInt8](repeating: 0x9f, count: 10_000)
        expectMalformed(indefinite, .depthLimitExceeded)
        let maps = [UInt8]((0..<10_000).flatMap { _ -> [UInt8] in [0xa1, 0x60] }) + [0x00]
        expectMalformed(maps, .depthLimitExceeded)
        let tags = [UInt8](repeating: 0xc1, count: 10_000) + [0x00]
        #expect(decodeError(tags).item?.code == .depthLimitExceeded)
        #expect(decodeError(tags).value?.code == .unsupportedTag)
    }

    @Test func depthLimitIsExactAndConfigurable() throws {
        let limit = CBOR.defaultMaxDepth
        let atLimit = [UInt8](repeating: 0x81, count: limit) + [0x00]
        #expect(try CBOR.decodeItem(atLimit).description.hasPrefix("[[["))
        _ = try CBOR.decode(atLimit)
        expectMalformed([UInt8](repeating: 0x81, count: limit + 1) + [0x00], .depthLimitExceeded, offset: limit)
        let shallow = CBOR.DecodingOptions(maxDepth: 2)
        #expect(try CBOR.decode(bytes("818100"), options: shallow) == [[0]])
        expectMalformed(bytes("81818100"), .depthLimitExceeded, offset: 2, options: shallow)
        let flat = CBOR.DecodingOptions(maxDepth: 0)
        #expect(try CBOR.decode(bytes("00"), options: flat) == 0)
        expectMalformed(bytes("80"), .depthLimitExceeded, offset: 0, options: flat)
    }

    @Test func randomBytesNeverCrashTheDecoders() {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("CBOR random-bytes seed: \(seed) (replay: TRELLIS_SEED=\(seed))")
        var accepted = 0
        for _ in 0..<100_000 {
            let length = Int.random(in: 0...24, using: &rng)
            let input = (0..<length).map { _ in UInt8.random(in: 0...255, using: &rng) }
            if checkDecoders(on: input, seed: seed) { accepted += 1 }
        }
        #expect(accepted > 0, "some random inputs are valid CBOR (seed \(seed))")
    }

    @Test func mutatedEncodingsNeverCrashTheDecoders() {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("CBOR mutation seed: \(seed) (replay: TRELLIS_SEED=\(seed))")
        for _ in 0..<20_000 {
            var input = CBOR.encode(randomValue(depth: 3, using: &rng))
            for _ in 0..<Int.random(in: 1...3, using: &rng) {
                let position = Int.random(in: 0..<input.count + 1, using: &rng)
                switch Int.random(in: 0..<3, using: &rng) {
                case 0 where position < input.count: input[position] = UInt8.random(in: 0...255, using: &rng)
                case 1 where position < input.count: input.remove(at: position)
                default: input.insert(UInt8.random(in: 0...255, using: &rng), at: position)
                }
            }
            _ = checkDecoders(on: input, seed: seed)
        }
    }

    /// Runs the fuzz target's check (whatever decodes must re-encode and decode to the same
    /// thing). Returns whether the generic decoder accepted the input.
    private func checkDecoders(on input: [UInt8], seed: UInt64) -> Bool {
        #expect(throws: Never.self, "seed \(seed)") { try FuzzChecks.cbor(input) }
        return (try? CBOR.decodeItem(input)) != nil
    }
}

// MARK: Properties

@Suite struct CBORPropertyTests {
    @Test func randomValuesRoundTripAndEncodeDeterministically() throws {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("CBOR round-trip seed: \(seed) (replay: TRELLIS_SEED=\(seed))")
        let strict = CBOR.DecodingOptions(requireDeterministic: true)
        for iteration in 0..<3_000 {
            let value = randomValue(depth: 4, using: &rng)
            let encoded = CBOR.encode(value)
            #expect(CBOR.encode(value) == encoded)
            #expect(CBOR.encode(rebuilt(value)) == encoded, "map order leaked, iteration \(iteration), seed \(seed)")
            let decoded = try CBOR.decode(encoded, options: strict)
            #expect(decoded == value, "iteration \(iteration), seed \(seed): \(hex(encoded))")
            // The generic item reads the same bytes and writes them back unchanged.
            #expect(CBOR.encodeItem(try CBOR.decodeItem(encoded, options: strict)) == encoded)
            if decoded != value { break }
        }
    }

    /// The same value with every map rebuilt in a different insertion order and capacity.
    private func rebuilt(_ value: Value) -> Value {
        switch value {
        case .array(let items): return .array(items.map(rebuilt))
        case .map(let entries):
            var copy = UTF8Map<Value>(minimumCapacity: entries.count * 4 + 7)
            for (key, element) in entries.reversed() { copy[key] = rebuilt(element) }
            return .map(copy)
        default: return value
        }
    }

    @Test func seededRandomIsSplitMix64AndReadsTheEnvironment() {
        var rng = SeededRandom(seed: 0)
        #expect(rng.next() == 0xE220_A839_7B1D_CDAF)
        #expect(rng.next() == 0x6E78_9E6A_A1B9_65F4)
        #expect(SeededRandom.parseSeed("42") == 42)
        #expect(SeededRandom.parseSeed("0xff") == 255)
        #expect(SeededRandom.parseSeed("seed") == nil)
        let (fromEnvironment, seed) = SeededRandom.fromEnvironment(default: 1, environment: ["TRELLIS_SEED": "7"])
        #expect(seed == 7 && fromEnvironment.state == 7)
        #expect(SeededRandom.fromEnvironment(default: 1, environment: [:]).1 == 1)
        var a = SeededRandom(seed: 99)
        var b = SeededRandom(seed: 99)
        #expect(randomValue(depth: 4, using: &a) == randomValue(depth: 4, using: &b))
    }
}
