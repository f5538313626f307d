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

    /// The last word of the text: a quote, backslash or control character at every offset of
    /// the final eight bytes, after a run of plain bytes up to 1 MiB long, where the text ends (a
    /// string cut short, a backslash as the last byte, an escaped quote that closes nothing).
    @Test func theLastBytesOfTheTextAreSeen() {
        let tails: [(tail: String, closes: Bool)] = [
            ("\"", true), ("\\\"", false), ("\\\\\"", true), ("\\", false), ("\\\\", false), ("\u{1}\"", false),
            ("\u{1F}", false), ("\\n\"", true), ("\\u0041\"", false), ("\u{7F}\"", true), ("é\"", true),
            ("\"\"", false), ("\\\"\"", true),
        ]
        for length in Array(0...17) + [1 << 20, (1 << 20) + 1, (1 << 20) + 7] {
            let plain = String(repeating: "a", count: length)
            for (tail, closes) in tails {
                let text = "\"" + plain + tail
                #expect(JSONScan.certainlyParses(text) == closes, "\(length) bytes, then \(tail.debugDescription)")
                checkPromises(text)
                if length < 64 || tail == "\\" {
                    checkPromises(#"{"k":""# + plain + tail)
                    checkPromises(#"{"k":""# + plain + tail + "}")
                }
            }
        }
    }

    /// Numbers about the check's 300-digit bound (integers beyond 308 digits are out of range),
    /// and the spellings the parser refuses or the check leaves to it.
    @Test func numbersAtTheDigitBoundAndMalformedOnes() {
        func digits(_ count: Int) -> String { "9" + String(repeating: "8", count: count - 1) }
        for count in [299, 300, 301, 302, 308, 309, 310] {
            for number in [
                digits(count), "-" + digits(count), "0." + digits(count - 1), digits(count - 2) + ".5",
                "-0." + digits(count - 1),
            ] {
                checkPromises(number)
                checkPromises(#"{"a":\#(number),"b":[\#(number)]}"#)
            }
        }
        // At most 301 characters of number (a fraction's included); an integer only within Int64.
        #expect(JSONScan.certainlyParses(digits(299) + ".5") && !JSONScan.certainlyParses(digits(300) + ".5"))
        #expect(JSONScan.certainlyParses("-" + digits(299) + ".5") && (try? JSON.parse(digits(310))) == nil)
        #expect(!JSONScan.certainlyParses(digits(20)) && (try? JSON.parse(digits(20))) == nil)
        #expect(JSONScan.certainlyParses("9223372036854775807") && JSONScan.certainlyParses("-9223372036854775808"))
        #expect(!JSONScan.certainlyParses("9223372036854775808") && !JSONScan.certainlyParses("-9223372036854775809"))
        for number in [
            "-0", "-", "01", "-01", "1.", ".5", "1e5", "1E+5", "-0.0", "0.", "-.5", "1.5e", "00", "+1", "0x1",
            "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
        ] {
            for text in [number, "[\(number)]", #"{"a":\#(number)}"#, #"{"a":\#(number),"b":1}"#] {
                checkPromises(text)
            }
        }
    }

    /// Malformed and near-miss documents, nesting at the limit of maps, arrays and both as a
    /// member's value, and the documents `member` must not call maps without the key.
    @Test func nearMissesAndMixedNestingKeepThePromises() {
        for text in [
            "", "{", "}", "{}", "{}x", "{}}", "{}{}", #"{"a":1}}"#, #"{"a":1}x"#, #"{"a":1,}"#, #"{"a"}"#, "tru", "nul",
            "fals", "truee", #"{"a":tru}"#, #"{"a":nul}"#, #"{"a":1,"a":2}"#, #"{"a":1,"b":2,"a":[3]}"#,
            #"{"$bytes":"AQI="}"#, #"{"$bytes":"AQI=","a":1}"#, #"{"a":1,"$bytes":"AQI="}"#, #"{"$bytes":"!"}"#,
            #"{"a":{"$bytes":"AQI="}}"#, #"{"":1}"#, #"{"\"":1}"#, #"["a"]"#, #""a""#, "[1]]", "{\"a\":1}\u{0}",
        ] {
            checkPromises(text)
        }
        if case .absent = JSONScan.member("a", in: "{}}") { Issue.record("{}} is not a map") }
        if case .absent = JSONScan.member("a", in: "{}x") { Issue.record("{}x is not a map") }
        for depth in [JSON.maximumDepth - 2, JSON.maximumDepth - 1, JSON.maximumDepth, JSON.maximumDepth + 1] {
            // Nested `depth` deep inside the document's map: arrays, maps, and the two in turn.
            var open = ""
            var close = ""
            for level in 0..<depth {
                let map = level % 3 == 1
                open += map ? #"{"k":"# : "["
                close = (map ? "}" : "]") + close
            }
            for inner in ["1", "[]", "{}", #""s""#] {
                let nested = open + inner + close
                checkPromises(#"{"a":\#(nested)}"#)
                checkPromises(#"{"b":1,"a":\#(nested),"c":2}"#)
                checkPromises(nested)
                let maps = String(repeating: #"{"k":"#, count: depth) + inner + String(repeating: "}", count: depth)
                checkPromises(#"{"a":\#(maps)}"#)
                checkPromises(maps)
            }
        }
    }

    /// A query hands the check SQLite's bytes, which a damaged row may fill with ill-formed UTF-8:
    /// what it keeps (refusal, text, value, members) is what the check of the same bytes decoded
    /// as a Swift string (bad sequences repaired to U+FFFD) keeps.
    @Test func bytesAreCheckedAsTheirRepairedTextIs() {
        var (rng, seed) = SeededRandom.fromEnvironment(default: 0x5EED_0016)
        print("StoredJSONTests seed \(seed) (replay with \(SeededRandom.environmentVariable)=\(seed))")
        let sequences: [[UInt8]] = [
            [0x80], [0xBF], [0xC0, 0xAF], [0xC3], [0xE2, 0x82], [0xED, 0xA0, 0x80], [0xF4, 0x90, 0x80, 0x80],
            [0xF5], [0xFF], [0xC3, 0xA9], [0xE2, 0x82, 0xAC], [0xF0, 0x9F, 0x98, 0x80],
        ]
        for _ in 0..<3000 {
            var fields = UTF8Map<Value>()
            for _ in 0..<Int.random(in: 0...5, using: &rng) {
                fields[randomString(using: &rng)] = randomValue(depth: 2, using: &rng)
            }
            var bytes = Array(JSON.string(.map(fields)).utf8)
            for _ in 0..<Int.random(in: 0...3, using: &rng) {
                bytes.insert(
                    contentsOf: sequences.randomElement(using: &rng)!, at: Int.random(in: 0...bytes.count, using: &rng))
            }
            let repaired = String(decoding: bytes, as: UTF8.self)
            let fromBytes = bytes.withUnsafeBufferPointer { StoredJSON(checking: $0) }
            let fromText = StoredJSON(checking: repaired)
            #expect((fromBytes == nil) == (fromText == nil), "\(bytes)")
            guard let fromBytes, let fromText else { continue }
            #expect(fromBytes.text == repaired)
            #expect(fromBytes == fromText)
            for key in Array(fields.keys) + ["\u{FFFD}", "missing"] {
                #expect(fromBytes.member(key) == fromText.member(key), "\(repaired): member \(key)")
            }
            #expect(fromBytes.value == fromText.value)
        }
    }

    /// ``UTF8Check/firstInvalid(_:)`` tells well-formed UTF-8 as the standard library does, and
    /// finds the first bad sequence at every offset of texts around its eight-byte steps.
    @Test func theFirstIllFormedSequenceIsFoundWhereverItIs() {
        var (rng, seed) = SeededRandom.fromEnvironment(default: 0x5EED_0017)
        print("StoredJSONTests seed \(seed) (replay with \(SeededRandom.environmentVariable)=\(seed))")
        let pieces: [[UInt8]] = [[0x61], [0x7F], [0xC3, 0xA9], [0xE2, 0x82, 0xAC], [0xF0, 0x9F, 0x98, 0x80]]
        let bad: [[UInt8]] = [[0x80], [0xC0, 0x80], [0xE0, 0x80, 0x80], [0xED, 0xB0, 0x80], [0xF8], [0xE2, 0x82]]
        for _ in 0..<4000 {
            var bytes: [UInt8] = []
            for _ in 0..<Int.random(in: 0...12, using: &rng) { bytes += pieces.randomElement(using: &rng)! }
            var expected: Int?
            if Bool.random(using: &rng) {
                // Cut at a sequence boundary, so that the first bad byte is where the bad one goes.
                var boundaries = [0]
                var i = 0
                while i < bytes.count {
                    i += bytes[i] < 0x80 ? 1 : bytes[i] < 0xE0 ? 2 : bytes[i] < 0xF0 ? 3 : 4
                    boundaries.append(i)
                }
                let at = boundaries.randomElement(using: &rng)!
                bytes.insert(contentsOf: bad.randomElement(using: &rng)!, at: at)
                expected = at
            }
            let found = bytes.withUnsafeBytes { UTF8Check.firstInvalid($0) }
            #expect(found == expected, "\(bytes)")
            #expect((found == nil) == (String(validating: bytes, as: UTF8.self) != nil), "\(bytes)")
        }
    }

    /// Copies share one text and one parse; threads reading the values of many stored texts at
    /// once (their locks are shared by address) each read the parsed text.
    @Test func copiesShareOneParseAndThreadsReadTheSameValue() async throws {
        let texts = (0..<200).map { #"{"_id":"car-\#($0)","n":\#($0),"s":["a",{"b":null}]}"# }
        let stored = try texts.map { try #require(StoredJSON(checking: $0)) }
        let copy = stored[7]
        #expect(!stored[7].isParsed)
        #expect(copy.value["n"] == 7)
        #expect(stored[7].isParsed)
        let values = await withTaskGroup(of: [Value].self) { group in
            for _ in 0..<8 { group.addTask { stored.map(\.value) } }
            return await group.reduce(into: []) { $0.append($1) }
        }
        let parsed = try texts.map { try JSON.parse($0) }
        #expect(values.count == 8)
        for read in values { #expect(read == parsed) }
    }

    /// The one-pass check of SQLite's bytes tells well-formed UTF-8 wherever a sequence sits in
    /// a string: before, inside and after its eight-byte steps, in keys and in values, alone or
    /// with a good sequence before it; and a byte from 0x80 up outside a string is declined.
    @Test func theOnePassCheckTellsWellFormedUTF8AtEveryOffset() {
        let good: [[UInt8]] = [[0xC3, 0xA9], [0xE2, 0x82, 0xAC], [0xF0, 0x9F, 0x98, 0x80], [0x7F]]
        let bad: [[UInt8]] = [[0x80], [0xC0, 0xAF], [0xC3], [0xE2, 0x82], [0xED, 0xA0, 0x80], [0xF5], [0xFF]]
        func vouched(_ bytes: [UInt8]) -> Bool {
            bytes.withUnsafeBufferPointer { JSONScan.certainlyParsesAsWellFormedUTF8($0) }
        }
        for length in 0...20 {
            for offset in 0...length {
                for (sequences, wellFormed) in [(good, true), (bad, false)] {
                    for sequence in sequences {
                        var content = Array(repeating: UInt8(ascii: "x"), count: length)
                        content.insert(contentsOf: sequence, at: offset)
                        let prefix = Array(#"{"k":1,"#.utf8)
                        let asValue = prefix + Array(#""a":""#.utf8) + content + Array(#"","b":[1]}"#.utf8)
                        let asKey = prefix + [UInt8(ascii: "\"")] + content + Array(#"":"v"}"#.utf8)
                        let afterGood = Array(#"["é","#.utf8) + [UInt8(ascii: "\"")] + content + Array(#""]"#.utf8)
                        for text in [asValue, asKey, afterGood] {
                            #expect(vouched(text) == wellFormed, "\(text)")
                            let stored = text.withUnsafeBufferPointer { StoredJSON(checking: $0) }
                            #expect(stored?.text == String(decoding: text, as: UTF8.self), "\(text)")
                        }
                    }
                }
            }
        }
        #expect(vouched(Array(#"{"a":"plain ascii text, longer than eight bytes"}"#.utf8)))
        #expect(!vouched(Array(#"{"a":1}"#.utf8) + [0xC3, 0xA9]))
        #expect(!vouched([0xC3, 0xA9]))
        #expect(!vouched([]))
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
