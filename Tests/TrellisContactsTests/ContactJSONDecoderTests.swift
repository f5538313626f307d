import ContactProvider
import Foundation
import Testing
import TrellisContacts
import TrellisCore
import TrellisStore
import TrellisTestKit

/// `ContactDocument.contact(fromJSON:)`, which reads a contact straight from its stored JSON text
/// (``ContactJSONDecoder``) and parses only what that one pass declines, answers exactly what
/// parsing the text and reading the `Value` (`contact(from:)`) answers, for every text.
@Suite struct ContactJSONDecoderTests {
    /// What the enumerator answered before: parse, then read the tree; `nil` when not JSON.
    static func reference(_ text: String) -> CNMutableContact? {
        (try? JSON.parse(text)).map(ContactDocument.contact(from:))
    }

    /// Every property of a contact, by name, as the comparison sees it.
    static let properties: [(String, @Sendable (CNContact) -> AnyHashable)] = [
        ("namePrefix", { $0.namePrefix }), ("givenName", { $0.givenName }), ("middleName", { $0.middleName }),
        ("familyName", { $0.familyName }), ("nameSuffix", { $0.nameSuffix }), ("nickname", { $0.nickname }),
        ("organizationName", { $0.organizationName }), ("departmentName", { $0.departmentName }),
        ("jobTitle", { $0.jobTitle }), ("phoneNumbers", { $0.phoneNumbers }),
        ("emailAddresses", { $0.emailAddresses }), ("postalAddresses", { $0.postalAddresses }),
        ("urlAddresses", { $0.urlAddresses }), ("birthday", { $0.birthday }), ("note", { $0.note }),
        ("imageData", { $0.imageData }), ("vCardProperties", { $0.vCardProperties }),
    ]

    /// The properties in which `contact(fromJSON:)` differs from the reference for `text`, with
    /// both values (`"not JSON"` when only one of them is `nil`); empty when they agree.
    /// The contact read when first asked for (`contact(deferringJSON:)`, what the enumerator
    /// delivers) is checked the same way.
    static func differences(_ text: String) -> [String] {
        let reference = reference(text)
        return differences(ContactDocument.contact(fromJSON: text), reference)
            + deferredDifferences(Array(text.utf8), reference)
    }

    /// The properties in which the contact `contact(deferringJSON:)` gives for `bytes` differs
    /// from `reference`: one property read first (which one follows the text's length, so the
    /// run reads each first many times), then the whole contact compared.
    static func deferredDifferences(_ bytes: [UInt8], _ reference: CNMutableContact?) -> [String] {
        let deferred = bytes.withUnsafeBufferPointer { ContactDocument.contact(deferringJSON: $0) }
        let (name, read) = properties[bytes.count % properties.count]
        if let deferred, let reference, read(deferred) != read(reference) {
            return ["read deferred, \(name) first: \(read(deferred)) instead of \(read(reference))"]
        }
        return differences(deferred, reference).map { "read deferred: " + $0 }
    }

    /// The same for a text given as bytes, possibly ill-formed UTF-8: the reference reads them
    /// as the store's `entries` does, with each ill-formed sequence as U+FFFD.
    static func differences(bytes: [UInt8]) -> [String] {
        let fast = bytes.withUnsafeBufferPointer { ContactDocument.contact(fromJSON: $0) }
        let reference = reference(String(decoding: bytes, as: UTF8.self))
        return differences(fast, reference) + deferredDifferences(bytes, reference)
    }

    static func differences(_ fast: CNMutableContact?, _ slow: CNMutableContact?) -> [String] {
        guard let fast, let slow else {
            return (fast == nil) == (slow == nil)
                ? [] : ["not JSON: decoder \(fast == nil), parser \(slow == nil)"]
        }
        var found = properties.compactMap { name, read in
            read(fast) == read(slow) ? nil : "\(name): \(read(fast)) instead of \(read(slow))"
        }
        if found.isEmpty && fast != slow { found.append("the contacts differ in a property not listed") }
        return found
    }

    /// Whether the one-pass decoder read `text` itself (rather than declining it to the parser).
    static func decodedInOnePass(_ text: String) -> Bool { ContactJSONDecoder.fields(text) != nil }

    /// Checks `text`; `onePass` says whether the one-pass decoder must take it (`nil`: either).
    static func check(
        _ text: String, onePass: Bool? = nil, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let differences = differences(text)
        #expect(differences.isEmpty, "\(text): \(differences)", sourceLocation: sourceLocation)
        if let onePass {
            #expect(decodedInOnePass(text) == onePass, "one pass for \(text)", sourceLocation: sourceLocation)
        }
    }

    // MARK: Property test

    /// Random contact documents (each field well typed or any value, keys repeated, unknown keys)
    /// and random values of any shape, each spelled in random ways (escapes, `\u` and surrogate
    /// pairs, whitespace, numbers as `3`, `3.0`, `3e0`, keys in any order), then mutated a byte at
    /// a time into near-misses, and given stray bytes that make them ill-formed UTF-8: the decoder
    /// agrees with the parser on every one, field by field.
    ///
    /// Runs `TRELLIS_PROPERTY_CASES` cases (6,000 by default, about ten seconds); prints its seed, and
    /// `TRELLIS_SEED=<seed>` replays a run.
    @Test func theDecoderAgreesWithTheParserOnRandomDocuments() {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        let cases = ProcessInfo.processInfo.environment["TRELLIS_PROPERTY_CASES"].flatMap { Int($0) } ?? 6_000
        print("ContactJSONDecoderTests seed=\(seed) cases=\(cases) (replay: TRELLIS_SEED=\(seed))")
        var rng = seeded
        var checked = 0
        var onePass = 0
        var notJSON = 0
        // Contacts as the store writes them (compact, texts without rare control characters).
        var stored = 0
        var storedOnePass = 0
        var storedDeferred = 0
        var spelledOnePass = 0
        var illFormed = 0
        var illFormedOnePass = 0
        var failures: [String] = []
        for round in 0..<cases {
            let document: Value
            switch round % 4 {
            case 0: document = randomContactDocument(clean: true, using: &rng)
            case 1: document = randomContactDocument(clean: false, using: &rng)
            case 2: document = randomValue(depth: 3, using: &rng)
            default:
                // A map of random keys, some of them a contact's.
                var map = UTF8Map<Value>()
                for _ in 0..<Int.random(in: 0...5, using: &rng) {
                    let key =
                        Bool.random(using: &rng)
                        ? Self.fieldNames.randomElement(using: &rng)! : randomString(using: &rng)
                    map[key] = randomValue(depth: 3, using: &rng)
                }
                document = .map(map)
            }
            var texts = [JSON.string(document), Spelling.text(of: document, using: &rng, repeatingKeys: true)]
            texts += mutatedJSONTexts(of: texts[Int.random(in: 0...1, using: &rng)], count: 2, using: &rng)
            for (k, text) in texts.enumerated() {
                checked += 1
                let one = Self.decodedInOnePass(text)
                if one { onePass += 1 }
                if one && k == 1 { spelledOnePass += 1 }
                if round % 4 == 0 && k == 0 {
                    stored += 1
                    if one { storedOnePass += 1 }
                    let deferred = text.utf8.withContiguousStorageIfAvailable {
                        ContactDocument.contact(deferringJSON: $0)
                    }
                    if deferred??.isDeferred == true { storedDeferred += 1 }
                }
                if Self.reference(text) == nil { notJSON += 1 }
                let found = Self.differences(text)
                if !found.isEmpty && failures.count < 5 { failures.append("round \(round), \(text): \(found)") }
            }
            // The stored text with ill-formed UTF-8: stray bytes from 0x80 up put in or over it.
            var bytes = Array(texts[0].utf8)
            for _ in 0..<Int.random(in: 1...3, using: &rng) where !bytes.isEmpty {
                let at = Int.random(in: 0..<bytes.count, using: &rng)
                let stray = UInt8.random(in: 0x80...0xFF, using: &rng)
                if Bool.random(using: &rng) { bytes.insert(stray, at: at) } else { bytes[at] = stray }
            }
            illFormed += 1
            if bytes.withUnsafeBufferPointer({ ContactJSONDecoder.fields($0) }) != nil { illFormedOnePass += 1 }
            let found = Self.differences(bytes: bytes)
            if !found.isEmpty && failures.count < 5 { failures.append("round \(round), bytes \(bytes): \(found)") }
        }
        print(
            "ContactJSONDecoderTests: \(checked) texts, \(onePass) read in one pass (stored contacts: "
                + "\(storedOnePass) of \(stored); spelled otherwise: \(spelledOnePass); ill-formed UTF-8: \(illFormedOnePass) "
                + "of \(illFormed)), \(notJSON) not JSON")
        #expect(failures.isEmpty, "seed \(seed): \(failures.joined(separator: "\n"))")
        // The checks are not vacuous: stored contacts take the one pass, others and damaged
        // text the parser.
        #expect(storedOnePass == stored && spelledOnePass > cases / 10, "one pass: \(onePass) of \(checked)")
        // Stored contacts are delivered unread (their text is what the store writes).
        #expect(storedDeferred == stored, "\(storedDeferred) of \(stored) stored contacts deferred")
        #expect(notJSON > checked / 20 && checked - onePass - notJSON > checked / 20)
        #expect(illFormedOnePass > illFormed / 10, "\(illFormedOnePass) of \(illFormed) ill-formed texts")
    }

    static let fieldNames = [
        "namePrefix", "givenName", "middleName", "familyName", "nameSuffix", "nickname", "organizationName",
        "departmentName", "jobTitle", "note", "phoneNumbers", "emailAddresses", "urlAddresses",
        "postalAddresses", "birthday", "imageData", "vCardProperties",
    ]

    /// A contact-shaped document: most fields of the right type, some of another, sometimes
    /// unknown keys and a `$bytes` member. A `clean` one has what the store writes for contacts:
    /// texts without control characters other than line breaks and tabs, and other values
    /// without exponents (written `\u00XX` and `1e+300`, which the one pass leaves to the parser
    /// in members it steps over).
    func randomContactDocument(clean: Bool, using rng: inout SeededRandom) -> Value {
        func anyValue() -> Value {
            guard clean else { return randomValue(depth: 2, using: &rng) }
            let simple: [Value] = [
                .int(randomInt64(using: &rng)), .bool(true), .null, .double(-1.5), .string("x"),
                .array([.int(1), .string("two"), .array([.int(3)])]), .map(["a": .map(["b": .null])]),
                .bytes([1, 2, 3]), .array([]), .map([:]),
            ]
            return simple.randomElement(using: &rng)!
        }
        func sometimesWrong(_ value: @autoclosure () -> Value) -> Value {
            Int.random(in: 0..<6, using: &rng) == 0 ? anyValue() : value()
        }
        func text() -> Value {
            if clean {
                let pieces = ["a", "Z", " ", "\n", "\t", "\"", "\\", "/", "é", "e\u{301}", "名", "😀", "+47 22"]
                return .string(
                    (0..<Int.random(in: 0...8, using: &rng)).map { _ in pieces.randomElement(using: &rng)! }.joined())
            }
            return .string(
                Bool.random(using: &rng) ? "plain \(Int.random(in: 0...999, using: &rng))" : randomString(using: &rng))
        }
        func integer() -> Value {
            switch Int.random(in: 0..<4, using: &rng) {
            case 0: .int(randomInt64(using: &rng))
            case 1: .double(Double(Int.random(in: 1...31, using: &rng)))
            default: .int(Int64.random(in: 1...31, using: &rng))
            }
        }
        func labelled(_ keys: [String]) -> Value {
            .array(
                (0..<Int.random(in: 0...3, using: &rng)).map { _ in
                    var item = UTF8Map<Value>()
                    for key in keys + ["label"] where Int.random(in: 0..<4, using: &rng) > 0 {
                        item[key] = sometimesWrong(text())
                    }
                    if Int.random(in: 0..<8, using: &rng) == 0 { item["extra"] = anyValue() }
                    return sometimesWrong(.map(item))
                })
        }
        var map = UTF8Map<Value>()
        map["_id"] = sometimesWrong(text())
        for name in Self.fieldNames where Bool.random(using: &rng) {
            switch name {
            case "phoneNumbers", "emailAddresses", "urlAddresses": map[name] = sometimesWrong(labelled(["value"]))
            case "postalAddresses":
                map[name] = sometimesWrong(
                    labelled(["street", "city", "state", "postalCode", "country", "isoCountryCode"]))
            case "birthday":
                var parts = UTF8Map<Value>()
                for part in ["year", "month", "day"] where Int.random(in: 0..<5, using: &rng) > 0 {
                    parts[part] = sometimesWrong(integer())
                }
                map[name] = sometimesWrong(.map(parts))
            case "imageData":
                let bytes = Data(randomBytes(using: &rng)).base64EncodedString()
                map[name] = sometimesWrong(Bool.random(using: &rng) ? .string(bytes) : text())
            case "vCardProperties":
                map[name] = sometimesWrong(
                    .array((0..<Int.random(in: 0...3, using: &rng)).map { _ in sometimesWrong(text()) }))
            default: map[name] = sometimesWrong(text())
            }
        }
        if Int.random(in: 0..<4, using: &rng) == 0 { map["x-\(Int.random(in: 0...9, using: &rng))"] = anyValue() }
        if Int.random(in: 0..<16, using: &rng) == 0 { map["$bytes"] = .string("AAAA") }
        return .map(map)
    }

    // MARK: Odd cases, one by one

    @Test func unknownFieldsAreIgnored() {
        Self.check(
            #"{"_id":"a","a":{"givenName":"no","phoneNumbers":[{"value":"1"}]},"givenName":"Ada","zz":[1,{"b":null},[]]}"#,
            onePass: true)
        Self.check(
            #"{"GivenName":"no","givenNam":"no","givenNamee":"no","nameSuffiX":"no","note":"yes"}"#, onePass: true)
        Self.check(#"{"phoneNumbers":[{"value":"1","x":{"value":"2"},"kind":[true,false,null]}]}"#, onePass: true)
        let contact = ContactDocument.contact(fromJSON: #"{"_id":"a","x":{"givenName":"no"},"givenName":"Ada"}"#)
        #expect(contact?.givenName == "Ada")
    }

    @Test func fieldsOfTheWrongTypeAreLeftEmpty() {
        let text = #"""
            {"birthday":[1,2],"emailAddresses":[{"value":1},"x",{"label":2,"value":"e"},null],"familyName":null,\#
            "givenName":1,"imageData":7,"note":false,"phoneNumbers":{"value":"x"},\#
            "postalAddresses":[1,{"street":2,"city":"Oslo","label":[]},"x"],"urlAddresses":"u","vCardProperties":["A:1",2,"B:2"]}
            """#
        Self.check(text, onePass: true)
        let contact = ContactDocument.contact(fromJSON: text)
        #expect(contact?.givenName == "" && contact?.phoneNumbers == [] && contact?.birthday == nil)
        #expect(contact?.emailAddresses == [CNLabeledValue(label: nil, value: "e" as NSString)])
        #expect(contact?.postalAddresses.count == 3 && contact?.postalAddresses[1].value.city == "Oslo")
        #expect(contact?.vCardProperties == ["A:1", "B:2"])
        Self.check(#"{"imageData":"not base64!"}"#, onePass: true)
        Self.check(#"{"birthday":{"$bytes":"AAAA"}}"#)
        Self.check(#"{"$bytes":"AAAA"}"#)
        Self.check(#"{"phoneNumbers":[{"$bytes":"AAAA"}],"postalAddresses":[{"$bytes":"AAAA"}]}"#)
    }

    @Test func nestedValuesOfAnyShapeAreSteppedOver() {
        let deep = String(repeating: "[", count: 100) + String(repeating: "]", count: 100)
        Self.check(#"{"a":\#(deep),"givenName":"Ada","b":{"c":{"d":[{"e":[]}]}}}"#, onePass: true)
        Self.check(#"{"phoneNumbers":[\#(deep),{"value":\#(deep)},{"value":"1","label":\#(deep)}]}"#, onePass: true)
        // Nesting up to the parser's limit, and one level beyond it (not JSON).
        for depth in [JSON.maximumDepth - 1, JSON.maximumDepth, JSON.maximumDepth + 1] {
            let nested = String(repeating: "[", count: depth - 1) + String(repeating: "]", count: depth - 1)
            Self.check(#"{"x":\#(nested),"givenName":"Ada"}"#)
            Self.check(#"{"phoneNumbers":[{"x":\#(String(nested.dropFirst(2).dropLast(2)))}]}"#)
        }
        Self.check("[]")
        Self.check(#""givenName""#)
        Self.check("null")
        Self.check("{}", onePass: true)
    }

    @Test func escapesAndSurrogatePairsReadAsTheParserReadsThem() {
        Self.check(#"{"givenName":"\u00e9\uD83D\uDE00\u0041\/\b\f\n\r\t\"\\x"}"#, onePass: true)
        #expect(ContactDocument.contact(fromJSON: #"{"givenName":"\u00e9\ud83d\ude00"}"#)?.givenName == "é😀")
        Self.check(#"{"givenName":"\u0000 NUL","note":"a\u001fb"}"#, onePass: true)
        // Lone and reversed surrogates, short and bad escapes: not JSON.
        for bad in [
            #"\ud83d"#, #"\ude00"#, #"\ude00\ud83d"#, #"\ud83dx"#, #"\ud83d\u0041"#, #"\u12"#, #"\x"#, #"\u12g4"#,
        ] {
            Self.check(#"{"givenName":"\#(bad)"}"#, onePass: false)
            Self.check(#"{"zz":"\#(bad)","givenName":"a"}"#, onePass: false)
        }
        // Escapes in keys and in members stepped over: the parser reads those.
        Self.check(#"{"given\u004eame":"Ada","family\u004Eame":"L"}"#, onePass: false)
        Self.check(#"{"x":"\u00e9","givenName":"Ada"}"#, onePass: false)
        Self.check(#"{"givenName":"raw control \#u{01}"}"#, onePass: false)
        Self.check(#"{"givenName":"naïve 名前 😀"}"#, onePass: true)
    }

    @Test func birthdayNumbersCountOnlyAsIntegerLiterals() {
        for number in [
            "3", "0", "-0", "-3", "3.0", "3.5", "3e0", "3E+0", "30e-1", "9223372036854775807", "9223372036854775808",
            "-9223372036854775808", "-9223372036854775809", "12345678901234567890", "03", "-", "1.", ".5", "+3",
            "1e400", String(repeating: "9", count: 400), "true", "\"3\"", "null", "[3]", "{\"day\":3}",
        ] {
            Self.check(#"{"birthday":{"month":\#(number),"day":1}}"#)
            Self.check(#"{"birthday":{"year":\#(number),"month":12,"day":24}}"#)
            Self.check(#"{"birthday":{"day":\#(number),"month":2}}"#)
        }
        Self.check(#"{"birthday":{"year":1815,"month":12,"day":10}}"#, onePass: true)
        let b = ContactDocument.contact(fromJSON: #"{"birthday":{"month":12,"day":10}}"#)?.birthday
        #expect(b?.year == nil && b?.month == 12 && b?.day == 10)
        #expect(ContactDocument.contact(fromJSON: #"{"birthday":{"month":3.0,"day":10}}"#)?.birthday == nil)
        #expect(ContactDocument.contact(fromJSON: #"{"birthday":{"month":-0,"day":10}}"#)?.birthday?.month == 0)
    }

    @Test func aRepeatedKeyCountsWithItsLastValue() {
        Self.check(#"{"givenName":"A","givenName":"B"}"#, onePass: true)
        #expect(ContactDocument.contact(fromJSON: #"{"givenName":"A","givenName":"B"}"#)?.givenName == "B")
        Self.check(#"{"givenName":"A","givenName":1}"#, onePass: true)
        Self.check(#"{"phoneNumbers":[{"value":"1"}],"phoneNumbers":5}"#, onePass: true)
        Self.check(#"{"phoneNumbers":[{"value":"1","value":"2","label":"a","label":3}]}"#, onePass: true)
        Self.check(#"{"birthday":{"month":1,"day":2,"month":"x"}}"#, onePass: true)
        Self.check(#"{"birthday":{"month":1,"day":2},"birthday":{"month":3,"day":4}}"#, onePass: true)
        Self.check(#"{"imageData":"AAAA","imageData":null}"#, onePass: true)
        Self.check(#"{"postalAddresses":[{"city":"A","city":"B","street":"s","street":false}]}"#, onePass: true)
        Self.check(#"{"vCardProperties":["A:1"],"vCardProperties":["B:2"]}"#, onePass: true)
    }

    @Test func damagedTextIsNotJSONAndSpacedTextIsParsed() {
        let good = #"{"_id":"a","givenName":"Ada","phoneNumbers":[{"label":"home","value":"1"}]}"#
        for cut in 1..<good.utf8.count {
            Self.check(String(decoding: Array(good.utf8.prefix(cut)), as: UTF8.self))
        }
        for bad in [
            good + "x", good + ",", #"{"givenName":"Ada",}"#, #"{"givenName" "Ada"}"#, #"{givenName:"Ada"}"#,
            #"{"givenName":'Ada'}"#, #"{"phoneNumbers":[{"value":"1"},]}"#, #"{"a":tru}"#, #"{"a":01}"#, "",
        ] {
            #expect(ContactDocument.contact(fromJSON: bad) == nil, "\(bad)")
            Self.check(bad, onePass: false)
        }
        for spaced in [
            " " + good, good + "\n", #"{ "givenName": "Ada" }"#, "\u{FEFF}" + good,
            #"{"givenName":"Ada","x":[1, 2]}"#, #"{"x":1e3,"givenName":"Ada"}"#,
        ] {
            Self.check(spaced, onePass: false)
            #expect(ContactDocument.contact(fromJSON: spaced) != nil, "\(spaced)")
        }
    }

    /// Bytes that are not UTF-8 read as the store's readers read them: each ill-formed sequence
    /// inside a string as U+FFFD (also beside escapes and quotes), outside strings as not JSON.
    @Test func illFormedUTF8ReadsAsReplacementCharacters() {
        func u(_ text: String) -> [UInt8] { Array(text.utf8) }
        let texts: [[UInt8]] = [
            u(#"{"givenName":"a"#) + [0xFF] + u(#"b"}"#),
            u(#"{"givenName":""#) + [0xE2, 0x82] + u(#"","note":"x"#) + [0xC3] + u(#""}"#),
            u(#"{"givenName":"\u00e9"#) + [0xA9] + u(#"","note":""#) + [0xE2, 0x82] + u(#"\u00AC"}"#),
            u(#"{"phoneNumbers":[{"value":""#) + [0xF0, 0x9F, 0x98] + u(#"","label":"\n"#) + [0x80] + u(#""}]}"#),
            u(#"{"given"#) + [0xFF] + u(#"Name":"a","x"#) + [0xC0, 0xAF] + u(#"":"b","familyName":"c"}"#),
            u(#"{"vCardProperties":[""#) + [0xED, 0xA0, 0x80] + u(#""],"x":[""#) + [0xF5] + u(#""]}"#),
            u(#"{"givenName":"a",""#) + [0xFF],
            u(#"{"givenName":"a","#) + [0xFF] + u(#""note":"b"}"#),
            [0xFF] + u(#"{"givenName":"a"}"#),
        ]
        for text in texts {
            let found = Self.differences(bytes: text)
            #expect(found.isEmpty, "\(text): \(found)")
        }
        let first = texts[0].withUnsafeBufferPointer { ContactDocument.contact(fromJSON: $0) }
        #expect(first?.givenName == "a\u{FFFD}b")
        #expect(texts[3].withUnsafeBufferPointer { ContactJSONDecoder.fields($0) } != nil)
        #expect(texts[7].withUnsafeBufferPointer { ContactDocument.contact(fromJSON: $0) } == nil)
    }

    /// Rows changed behind the store's back: random bytes (ill-formed UTF-8, quotes, backslashes,
    /// NUL and other control characters, braces) put in or over each contact's stored JSON,
    /// written into SQLite directly. The enumerator lists the rows that parse, each as the parser
    /// reads it, and names the others as damaged, as the store's parsing `entries` does.
    @Test func theEnumeratorReadsRandomlyDamagedRowsAsTheParserDoes() async throws {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: 0x5EED_DA3A)
        print("ContactJSONDecoderTests damaged rows seed=\(seed) (replay: TRELLIS_SEED=\(seed))")
        var rng = seeded
        let fixture = try ContactsFixture()
        let store = fixture.store
        let ids = (0..<40).map { "r\($0)" }
        let documents = ids.map { id -> Value in
            guard case .map(var map) = randomContactDocument(clean: true, using: &rng) else {
                return ["_id": .string(id)]
            }
            map["_id"] = .string(id)
            map["$bytes"] = nil  // a reserved field name: the store refuses it
            return .map(map)
        }
        try store.upsert(documents, in: fixture.collection)
        let strays: [UInt8] = [
            0x22, 0x5C, 0x00, 0x01, 0x1F, 0x7F, 0x7B, 0x7D, 0x80, 0xBF, 0xC0, 0xC3, 0xE2, 0xED, 0xF0, 0xFF,
        ]
        var cases: [String] = []
        var notJSON: [String] = []
        var onePass = 0
        for (id, document) in zip(ids, documents) {
            var bytes = Array(JSON.string(document).utf8)
            for _ in 0..<Int.random(in: 0...2, using: &rng) {
                let at = Int.random(in: 0..<bytes.count, using: &rng)
                let stray =
                    Int.random(in: 0..<4, using: &rng) == 0
                    ? strays.randomElement(using: &rng)! : UInt8.random(in: 0x80...0xFF, using: &rng)
                if Bool.random(using: &rng) { bytes.insert(stray, at: at) } else { bytes[at] = stray }
            }
            if (try? JSON.parse(String(decoding: bytes, as: UTF8.self))) == nil { notJSON.append("\"\(id)\"") }
            if bytes.withUnsafeBufferPointer({ ContactJSONDecoder.fields($0) }) != nil { onePass += 1 }
            let hex = bytes.map {
                String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16)
            }
            cases.append("WHEN '\"\(id)\"' THEN CAST(X'\(hex.joined())' AS TEXT)")
        }
        _ = try SQLiteFile.query(
            fixture.dir.path("a.sqlite"), "UPDATE documents SET value = CASE id \(cases.joined(separator: " ")) END")

        let items = try await enumerateContent(fixture.enumerator, pageSize: 7).items
        let expected = try store.entries(in: fixture.collection, after: 0, limit: 100, includeDeleted: false)
            .compactMap { e in e.value.map { ContactDocument.item(id: e.id, value: $0) } }
        #expect(items == expected, "seed \(seed)")
        #expect(items.count == ids.count - notJSON.count && !notJSON.isEmpty && onePass > ids.count / 4)
        #expect(Set(store.damagedDocuments().map(\.key)) == Set(notJSON), "seed \(seed)")
    }

    /// The store hands the decoder the row's text as SQLite holds it, invalid UTF-8 replaced by
    /// U+FFFD (as the parser saw it before); a row that is not JSON is skipped and named.
    @Test func theEnumeratorReadsRowsAsBefore() async throws {
        let fixture = try ContactsFixture()
        let store = fixture.store
        try store.upsert(
            [
                ["_id": "a", "givenName": "Ada", "familyName": "Lovelace", "birthday": ["month": 12, "day": 10]],
                ["_id": "b", "givenName": .int(3), "phoneNumbers": [["value": "1", "label": "home"], "x"]],
                ["_id": "c", "note": "line\nbreak \u{1}", "postalAddresses": [["city": "Oslo"], 7]],
                ["_id": "d", "givenName": "to be damaged"], ["_id": "e", "givenName": "to be spaced"],
                ["_id": "f", "givenName": "to be made invalid UTF-8"],
            ], in: fixture.collection)
        let path = fixture.dir.path("a.sqlite")
        func set(_ id: String, _ sql: String) throws {
            _ = try SQLiteFile.query(path, "UPDATE documents SET value = \(sql) WHERE id = ?", ["\"\(id)\""])
        }
        try set("d", #"'{"_id":"d","givenName":"cut'"#)
        try set("e", #"'{ "_id": "e", "givenName": "spaced" }'"#)
        // "f\xFF\xC3(" : a stray byte and a cut sequence, each read as U+FFFD.
        try set("f", "CAST(X'7B225F6964223A2266222C22676976656E4E616D65223A2266FFC328227D' AS TEXT)")

        let items = try await enumerateContent(fixture.enumerator, pageSize: 2).items
        // The change enumeration from the start of the log lists the same.
        let changes = RecordingChangeObserver(batchSize: 100)
        let start = GenerationMarker(epoch: store.epoch, snapshot: 0, collection: fixture.collection)
        await fixture.enumerator.enumerateChanges(
            startingAt: ContactItemSyncAnchor(generationMarker: start.data, offset: 0), for: changes)
        let expected = try store.entries(in: fixture.collection, after: 0, limit: 100, includeDeleted: false)
            .compactMap { e in e.value.map { ContactDocument.item(id: e.id, value: $0) } }
        #expect(items.map(\.identifier.value) == ["a", "b", "c", "e", "f"])
        #expect(items == expected)
        #expect(changes.updates == expected && changes.deletes.isEmpty)
        #expect(store.damagedDocuments().map(\.key) == ["\"d\""])
        if case .contact(let f, _)? = items.last { #expect(f.givenName == "f\u{FFFD}\u{FFFD}(") }
        if case .contact(let e, _)? = items.dropLast().last { #expect(e.givenName == "spaced") }
    }
}

/// JSON texts of a value spelled in the many ways the parser reads the same (or a near) value.
enum Spelling {
    /// `value` as JSON text with random escapes in strings (`\uXXXX` in either case, surrogate
    /// pairs, `\/`), integers sometimes as `N.0` or `Ne0` (which parse as doubles), map keys in
    /// a random order; in one text of five also whitespace, in another one of five escapes in
    /// keys; with `repeatingKeys`, some keys written twice (the first with another value).
    static func text(of value: Value, using rng: inout SeededRandom, repeatingKeys: Bool = false) -> String {
        var spelling = Spelling.Options(
            spaced: Int.random(in: 0..<5, using: &rng) == 0, escapedKeys: Int.random(in: 0..<5, using: &rng) == 0,
            repeatingKeys: repeatingKeys)
        var out = ""
        write(value, to: &out, &spelling, using: &rng)
        return out
    }

    struct Options {
        var spaced: Bool
        var escapedKeys: Bool
        var repeatingKeys: Bool
    }

    private static func space(_ out: inout String, _ options: Options, using rng: inout SeededRandom) {
        if options.spaced { out += [" ", "\n", "\t", "\r\n", ""].randomElement(using: &rng)! }
    }

    private static func write(
        _ value: Value, to out: inout String, _ options: inout Options, using rng: inout SeededRandom
    ) {
        space(&out, options, using: &rng)
        switch value {
        case .string(let s): string(s, to: &out, using: &rng)
        case .int(let i):
            switch Int.random(in: 0..<8, using: &rng) {
            case 0: out += "\(i).0"
            case 1: out += "\(i)e0"
            default: out += "\(i)"
            }
        case .array(let items):
            out += "["
            for (k, item) in items.enumerated() {
                if k > 0 { out += "," }
                write(item, to: &out, &options, using: &rng)
            }
            space(&out, options, using: &rng)
            out += "]"
        case .map(let map):
            out += "{"
            var members = map.map { ($0.key, $0.value) }
            members.shuffle(using: &rng)
            if options.repeatingKeys, !members.isEmpty {
                for _ in 0..<Int.random(in: 1...2, using: &rng) {
                    let k = Int.random(in: 0..<members.count, using: &rng)
                    let other: [Value] = [.null, .int(7), .string("dup"), members.randomElement(using: &rng)!.1]
                    members.insert((members[k].0, other.randomElement(using: &rng)!), at: k)
                }
            }
            for (k, (key, member)) in members.enumerated() {
                if k > 0 { out += "," }
                space(&out, options, using: &rng)
                if options.escapedKeys {
                    string(key, to: &out, using: &rng)
                } else {
                    out += JSON.string(.string(key))
                }
                space(&out, options, using: &rng)
                out += ":"
                write(member, to: &out, &options, using: &rng)
            }
            space(&out, options, using: &rng)
            out += "}"
        default: out += JSON.string(value)
        }
        space(&out, options, using: &rng)
    }

    private static func string(_ s: String, to out: inout String, using rng: inout SeededRandom) {
        // Most strings as the writer spells them; some with every scalar spelled at random.
        guard Int.random(in: 0..<3, using: &rng) == 0 else {
            out += JSON.string(.string(s))
            return
        }
        out += "\""
        for scalar in s.unicodeScalars {
            let v = scalar.value
            let escape = Int.random(in: 0..<3, using: &rng) == 0
            if v == 0x22 || v == 0x5C {
                out += v == 0x22 ? #"\""# : #"\\"#
            } else if v < 0x20 || escape {
                if v == 0x2F && Bool.random(using: &rng) {
                    out += #"\/"#
                } else if v < 0x10000 {
                    out += hex(v, using: &rng)
                } else {
                    let u = v - 0x10000
                    out += hex(0xD800 + (u >> 10), using: &rng) + hex(0xDC00 + (u & 0x3FF), using: &rng)
                }
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }

    private static func hex(_ unit: UInt32, using rng: inout SeededRandom) -> String {
        let digits = String(unit, radix: 16, uppercase: Bool.random(using: &rng))
        return #"\u"# + String(repeating: "0", count: 4 - digits.count) + digits
    }
}
