import Testing
import TrellisCore
import TrellisTestKit

/// A query result's stored JSON, parsed when read (``StoredJSON``, ``JSONScan``): what the
/// one-pass check vouches for parses, a member read by scanning is the parsed member, and the
/// value read later is the parsed text.
@Suite struct StoredJSONTests {
    /// Checks the promises on one text.
    func checkPromises(_ text: String) {
        let parsed = try? JSON.parse(text)
        if JSONScan.certainlyParses(text) { #expect(parsed != nil, "vouched for \(text), which does not parse") }
        let stored = StoredJSON(checking: text)
        #expect((stored == nil) == (parsed == nil), "\(text): checked \(stored != nil), parses \(parsed != nil)")
        guard let stored, let parsed else { return }
        guard case .map(let fields) = parsed else { return }
        for key in Array(fields.keys) + ["missing"] {
            switch JSONScan.member(key, in: text) {
            case .found(let value): #expect(value == fields[key], "\(text): member \(key) scanned as \(value)")
            case .absent: #expect(fields[key] == nil, "\(text): member \(key) scanned as absent")
            case .unsure: break
            }
            #expect(stored.member(key) == fields[key])
        }
        #expect(stored.value == parsed)
        #expect(stored.isParsed)
    }

    /// Random documents as Trellis writes them are vouched for unless they hold what the check
    /// leaves to the parser, and mutations of them keep the promises.
    @Test func writtenDocumentsAreVouchedForAndMutationsKeepThePromises() {
        var (rng, seed) = SeededRandom.fromEnvironment(default: 0x5EED_0015)
        print("StoredJSONTests seed \(seed) (replay with \(SeededRandom.environmentVariable)=\(seed))")
        var vouched = 0
        for _ in 0..<2000 {
            var fields = UTF8Map<Value>()
            for _ in 0..<Int.random(in: 0...6, using: &rng) {
                fields[randomString(using: &rng)] = randomValue(depth: 3, using: &rng)
            }
            fields["_id"] = .string("car-\(rng.next() % 1000)")
            let text = JSON.string(.map(fields))
            if JSONScan.certainlyParses(text) { vouched += 1 }
            checkPromises(text)
            for mutated in mutatedJSONTexts(of: text, using: &rng) { checkPromises(mutated) }
        }
        #expect(vouched > 500)
    }

    @Test func theCheckDeclinesWhatItCannotVouchFor() {
        // Each of these parses; the check leaves them to the parser.
        for text in [
            #"{"a": 1}"#, #"{"a":"\u00e9"}"#, #"{"a":1e3}"#, #"{"a":1E-2}"#,
            "{\"a\":0." + String(repeating: "1", count: 400) + "}",
        ] {
            #expect(!JSONScan.certainlyParses(text), "\(text)")
            #expect(StoredJSON(checking: text)?.isParsed == true, "\(text) is parsed at once")
        }
        // Nesting: the parser's limit, exactly.
        let deepest =
            String(repeating: "[", count: JSON.maximumDepth) + String(repeating: "]", count: JSON.maximumDepth)
        #expect(JSONScan.certainlyParses(deepest))
        #expect(!JSONScan.certainlyParses("[" + deepest + "]"))
        #expect(StoredJSON(checking: "[" + deepest + "]") == nil)
        // A member nested to the limit inside the map is one level too deep for the document.
        if case .found = JSONScan.member("a", in: #"{"a":"# + deepest + "}") {
            Issue.record("a member of a document nested deeper than the parser allows was found")
        }
        // What does not parse is refused.
        for text in ["", "{", #"{"a":}"#, #"{"a":01}"#, "{\"a\":\"\u{1}\"}", #"{"a":1,}"#, "nul", #"{"a":"\x"}"#] {
            #expect(!JSONScan.certainlyParses(text), "\(text)")
            #expect(StoredJSON(checking: text) == nil, "\(text)")
        }
    }

    /// The check reads strings eight bytes at a time up to the first quote, backslash or control
    /// character: each such byte, and others beside them, at every offset of strings up to 24
    /// bytes, as a value and as a key, keeps the promises, and a string of plain bytes is still
    /// vouched for.
    @Test func everyByteOfAStringIsSeenWhereverItIs() {
        let inserts: [String] = [
            "\"", "\\", "\\\"", "\\\\", "\\n", "\\u0041", "\\x", "\u{0}", "\u{1}", "\u{1F}", "\n", "\t",
            "\u{7F}", "é", "€", "😀", " ", "!", "#", "[", "]", "\u{20}\"",
        ]
        var vouched = 0
        for length in 0...24 {
            let plain = String((0..<length).map { Character(UnicodeScalar(UInt8(ascii: "a") + UInt8($0 % 26))) })
            for text in [#"{"k":"\#(plain)"}"#, #"{"\#(plain)":1}"#, #"["\#(plain)","z"]"#] {
                #expect(JSONScan.certainlyParses(text), "\(text)")
                checkPromises(text)
            }
            for offset in 0...length {
                for insert in inserts {
                    var chars = Array(plain)
                    chars.insert(contentsOf: insert, at: offset)
                    let content = String(chars)
                    for text in [#"{"k":"\#(content)","m":2}"#, #"{"\#(content)":1}"#, #"["\#(content)"]"#] {
                        if JSONScan.certainlyParses(text) { vouched += 1 }
                        checkPromises(text)
                    }
                }
            }
        }
        #expect(vouched > 2000)
    }

    @Test func aMemberIsReadWithoutParsingTheDocument() throws {
        let stored = try #require(
            StoredJSON(checking: #"{"Name":"chevelle","_id":"car-1","n":[1,{"x":true}],"s":"a\"b"}"#))
        #expect(!stored.isParsed)
        #expect(stored.member("Name") == "chevelle")
        #expect(stored.member("n") == .array([1, .map(["x": true])]))
        #expect(stored.member("s") == "a\"b")
        #expect(stored.member("missing") == nil)
        #expect(!stored.isParsed)
        #expect(stored.value["_id"] == "car-1")
        #expect(stored.isParsed)
        #expect(stored.member("Name") == "chevelle")
    }

    @Test func aRepeatedKeyAnswersItsLastValueAndByteStringsAreLeftToTheParser() {
        #expect(member("a", in: #"{"a":1,"a":2}"#) == .int(2))
        #expect(member("a", in: #"{"a":{"$bytes":"AQI="}}"#) == .bytes([1, 2]))
        if case .unsure = JSONScan.member("$bytes", in: #"{"$bytes":"AQI="}"#) {
        } else {
            Issue.record("a lone $bytes key is a byte string, not a map member")
        }
        if case .unsure = JSONScan.member("a", in: #"{"\u0061":1}"#) {
        } else {
            Issue.record("a key with an escape is left to the parser")
        }
        if case .absent = JSONScan.member("b", in: #"{"a":1}"#) {} else { Issue.record("b is absent") }
        if case .unsure = JSONScan.member("a", in: "[1]") {} else { Issue.record("an array has no members") }
    }

    private func member(_ key: String, in text: String) -> Value? {
        if case .found(let value) = JSONScan.member(key, in: text) { return value }
        Issue.record("\(key) not found by scanning \(text)")
        return nil
    }
}
