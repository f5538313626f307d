import Testing
import TrellisCore
import TrellisTestKit

/// Recognising canonical document JSON without parsing it (``CanonicalJSON``): whatever it
/// accepts parses, validates and writes back to the same bytes, and what Trellis writes is
/// accepted.
@Suite struct CanonicalJSONTests {
    /// Checks the promise on one text: accepted means parse, validate, write back equal, and the
    /// `_id` text is the `_id`'s canonical JSON.
    func checkPromise(_ text: String) throws {
        guard let id = CanonicalJSON.documentID(of: text) else { return }
        let value = try JSON.parse(text)
        try value.validate()
        #expect(JSON.string(value) == text, "accepted \(text) but it writes back as \(JSON.string(value))")
        guard case .map(let fields) = value, let stored = fields["_id"] else {
            Issue.record("accepted \(text), which has no _id")
            return
        }
        #expect(JSON.string(stored) == id)
        #expect(CanonicalJSON.isDocument(text, idKey: id))
    }

    /// Random documents as Trellis writes them are accepted (unless they hold what the check
    /// leaves to the full parser: byte strings, keys with escapes), and every mutation of them
    /// that is still accepted keeps the promise.
    @Test func writtenDocumentsAreAcceptedAndMutationsKeepThePromise() throws {
        var (rng, seed) = SeededRandom.fromEnvironment(default: 0xC0FFEE)
        print("CanonicalJSONTests seed \(seed) (replay with \(SeededRandom.environmentVariable)=\(seed))")
        var accepted = 0
        for _ in 0..<3000 {
            var fields = UTF8Map<Value>()
            for _ in 0..<Int.random(in: 0...5, using: &rng) {
                fields[randomString(using: &rng)] = randomValue(depth: 3, using: &rng)
            }
            fields["_id"] = Bool.random(using: &rng) ? .string("car-\(rng.next() % 1000)") : .map(["k": 1])
            let value = Value.map(fields)
            let text = JSON.string(value)
            let unusual = text.contains("$bytes") || hasEscapedKey(value)
            if (try? value.validate()) != nil, !unusual {
                #expect(CanonicalJSON.isDocument(text, idKey: JSON.string(fields["_id"]!)), "declined \(text)")
                accepted += 1
            }
            try checkPromise(text)
            for mutated in mutatedJSONTexts(of: text, using: &rng) { try checkPromise(mutated) }
        }
        #expect(accepted > 500)
    }

    /// Whether a map anywhere in `value` has a key JSON writes with an escape.
    func hasEscapedKey(_ value: Value) -> Bool {
        switch value {
        case .map(let m):
            return m.contains { key, member in
                key.unicodeScalars.contains { $0.value < 0x20 || $0 == "\"" || $0 == "\\" } || hasEscapedKey(member)
            }
        case .array(let a): return a.contains { hasEscapedKey($0) }
        default: return false
        }
    }

    @Test(
        arguments: [
            "{\"_id\":\"d\",\"n\":1}", "{\"_id\":\"d\",\"a\":[1,2.5,\"z\",true,false,null,{}],\"m\":{\"k\":-7}}",
            "{\"_id\":{\"a\":1,\"b\":\"x\"},\"d\":-0.0,\"e\":1e-07,\"f\":1e+100,\"g\":0.1}",
            "{\"_id\":\"d\",\"s\":\"tab\\there \\u001f \\\" \\\\ é\"}",
            "{\"_id\":\"d\",\"n\":-9223372036854775808,\"p\":9223372036854775807}",
        ])
    func acceptsCanonicalDocuments(_ text: String) throws {
        #expect(CanonicalJSON.documentID(of: text) != nil, "declined \(text)")
        try checkPromise(text)
    }

    @Test(
        arguments: [
            ("{\"n\":1}", "no _id"),
            ("[1]", "not a map"),
            ("{\"_id\":\"d\", \"n\":1}", "whitespace"),
            ("{\"n\":1,\"_id\":\"d\"}", "keys out of order"),
            ("{\"_id\":\"d\",\"n\":1,\"n\":2}", "a duplicate key"),
            ("{\"_id\":\"d\",\"n\":1.50}", "a double spelled longer"),
            ("{\"_id\":\"d\",\"n\":1e2}", "a double spelled another way"),
            ("{\"_id\":\"d\",\"n\":1.0e0}", "an exponent Swift would not write"),
            ("{\"_id\":\"d\",\"n\":-0}", "-0 as an int"),
            ("{\"_id\":\"d\",\"n\":01}", "a leading zero"),
            ("{\"_id\":\"d\",\"n\":9223372036854775808}", "an int beyond Int64 (reads as a double)"),
            ("{\"_id\":\"d\",\"s\":\"\\u0041\"}", "an escape JSONWriter does not write"),
            ("{\"_id\":\"d\",\"s\":\"\\/\"}", "an escaped slash"),
            ("{\"_id\":\"d\",\"s\":\"\\u001F\"}", "uppercase hex"),
            ("{\"_id\":\"d\",\"s\":\"\\u000a\"}", "a control with a short escape"),
            ("{\"_id\":\"d\",\"s\":\"a\u{1}\"}", "a raw control character"),
            ("{\"_id\":\"d\",\"b\":{\"$bytes\":\"AA==\"}}", "a byte string (left to the parser)"),
            ("{\"_id\":\"d\",\"a\\n\":1}", "a key with an escape (left to the parser)"),
            ("{\"_id\":\"d\"}x", "trailing bytes"),
            ("{\"_id\":\"d\",\"n\":1", "cut short"),
            ("{\"_id\":\"d\",\"t\":tru}", "a broken literal"),
        ])
    func declines(_ text: String, _ why: String) throws {
        #expect(CanonicalJSON.documentID(of: text) == nil, "accepted \(text) (\(why))")
    }

    /// Doubles without an exponent are judged from their digits alone (up to 15 significant
    /// digits, from 0.001): on random decimals of every length, with and without trailing zeros,
    /// around the limits, the judgement is exactly what parsing and writing the double again says.
    @Test func plainDecimalsAreJudgedAsTheWriterSpellsThem() throws {
        var (rng, seed) = SeededRandom.fromEnvironment(default: 0xD0_0B1E)
        print("CanonicalJSONTests decimals seed \(seed) (replay with \(SeededRandom.environmentVariable)=\(seed))")
        func digits(_ count: Int, leading: Bool) -> String {
            String(
                (0..<count).map { k in
                    let low = k == 0 && leading ? 1 : 0
                    return Character(String(Int.random(in: low...9, using: &rng)))
                })
        }
        var checked = 0
        var canonical = 0
        for _ in 0..<60_000 {
            let integer = Bool.random(using: &rng) ? "0" : digits(Int.random(in: 1...17, using: &rng), leading: true)
            var fraction = String(repeating: "0", count: Int.random(in: 0...5, using: &rng))
            fraction += digits(Int.random(in: 0...17, using: &rng), leading: false)
            fraction += String(repeating: "0", count: Int.random(in: 0...2, using: &rng))
            if fraction.isEmpty { fraction = "0" }
            let number = (Bool.random(using: &rng) ? "-" : "") + integer + "." + fraction
            let text = "{\"_id\":\"d\",\"n\":\(number)}"
            let expected = (try? JSON.string(JSON.parse(text))) == text
            #expect(CanonicalJSON.isDocument(text, idKey: "\"d\"") == expected, "\(number)")
            checked += 1
            if expected { canonical += 1 }
        }
        for number in [
            "0.001", "0.0001", "0.0012", "0.1", "0.0", "-0.0", "1.0", "10.0", "10.00", "999999999999999.0",
            "99999999999999.9", "123456789012345.0", "1.5", "1.50", "0.30000000000000004", "0.3",
            "100000000000000.5", "9007199254740992.0", "0.000123",
        ] {
            let text = "{\"_id\":\"d\",\"n\":\(number)}"
            let expected = (try? JSON.string(JSON.parse(text))) == text
            #expect(CanonicalJSON.isDocument(text, idKey: "\"d\"") == expected, "\(number)")
        }
        #expect(checked == 60_000 && canonical > 5_000, "\(canonical) of \(checked) canonical")
    }

    /// Nesting: as deep as ``Value/maximumDepth`` allows is accepted, one level more is not.
    @Test func nestingLimit() throws {
        func nested(_ levels: Int) -> String {
            "{\"_id\":\"d\",\"x\":" + String(repeating: "[", count: levels) + String(repeating: "]", count: levels)
                + "}"
        }
        #expect(CanonicalJSON.documentID(of: nested(Value.maximumDepth - 1)) != nil)
        #expect(CanonicalJSON.documentID(of: nested(Value.maximumDepth)) == nil)
        #expect((try? JSON.parse(nested(Value.maximumDepth)).validate()) == nil)
    }

    /// A document key read back without the parser names the `_id` the parser reads, for every
    /// key the store writes (strings with escapes, quotes, control characters and non-ASCII text,
    /// maps) and for text that is not a key at all.
    @Test func documentKeysReadBackAsTheParserReadsThem() throws {
        var (rng, seed) = SeededRandom.fromEnvironment(default: 0x1D5)
        print("CanonicalJSONTests seed \(seed) (replay with \(SeededRandom.environmentVariable)=\(seed))")
        var ids: [Value] = ["d", "a\"b", "back\\slash", "tab\t", "\u{1}", "é", "日本", ["k": 1], ["a": ["b": "c"]]]
        for _ in 0..<500 { ids.append(.string(randomString(using: &rng))) }
        for id in ids {
            guard let key = id.documentKey else { continue }
            #expect(try Value.id(ofDocumentKey: key) == JSON.parse(key), "key \(key), seed \(seed)")
            #expect(try Value.id(ofDocumentKey: key) == id, "key \(key), seed \(seed)")
        }
        for text in ["\"", "\"unterminated", "plain", "\"a\"b\""] {
            #expect(throws: JSONError.self, "\(text)") { try Value.id(ofDocumentKey: text) }
        }
    }

    /// The `_id` must be the one the peer named beside the state.
    @Test func theIDMustMatch() {
        #expect(CanonicalJSON.isDocument("{\"_id\":\"d\",\"n\":1}", idKey: "\"d\""))
        #expect(!CanonicalJSON.isDocument("{\"_id\":\"d\",\"n\":1}", idKey: "\"e\""))
        #expect(!CanonicalJSON.isDocument("{\"_id\":\"d\",\"n\":1}", idKey: "d"))
    }
}
