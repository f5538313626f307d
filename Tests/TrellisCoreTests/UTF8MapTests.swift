import Testing
import TrellisTestKit

@testable import TrellisCore

/// Precomposed "é" (U+00E9, UTF-8 c3 a9) and decomposed "e" + U+0301 (65 cc 81): canonically
/// equivalent text, different bytes. Swift's `String ==` calls them equal.
private let nfc = "\u{E9}"
private let nfd = "e\u{301}"

@Suite struct UTF8KeyTests {
    @Test func comparesBytesNotCanonicalEquivalence() {
        #expect(nfc == nfd)  // what `String` does, and why the wrapper exists
        #expect(UTF8Key(nfc) != UTF8Key(nfd))
        #expect(!UTF8Key.equal(nfc, nfd))
        #expect(UTF8Key.equal(nfc, "\u{E9}"))
        #expect(Set([UTF8Key(nfc), UTF8Key(nfd), UTF8Key(nfc)]).count == 2)
        var byKey: [UTF8Key: Int] = [:]
        byKey[UTF8Key(nfc)] = 1
        byKey[UTF8Key(nfd)] = 2
        #expect(byKey.count == 2 && byKey[UTF8Key(nfc)] == 1 && byKey[UTF8Key(nfd)] == 2)
    }

    @Test func ordersByteWise() {
        // 65 cc 81 < 66 < c3 a9; a prefix sorts first.
        #expect(UTF8Key(nfd) < UTF8Key("f") && UTF8Key("f") < UTF8Key(nfc))
        #expect(UTF8Key("ab") < UTF8Key("abc") && UTF8Key("") < UTF8Key("\u{0}"))
        #expect(UTF8Key.compare("B", "a") < 0)  // bytes, not case-folded
        #expect(UTF8Key.compare(nfc, nfc) == 0)
        // A scalar above U+FFFF (f0 9f 98 80) sorts after U+FFFD (ef bf bd), as UTF-8 bytes do.
        #expect(UTF8Key("\u{FFFD}") < UTF8Key("\u{1F600}"))
    }

    @Test func bridgedAndNativeStringsAgree() {
        // A string assembled from scalars and one from a literal hash and compare alike.
        var built = String.UnicodeScalarView()
        built.append("e")
        built.append(Unicode.Scalar(0x301)!)
        let key = UTF8Key(String(built))
        #expect(key == UTF8Key(nfd) && key.hashValue == UTF8Key(nfd).hashValue)
        #expect(UTF8Key.compare(String(Substring(nfd)), nfd) == 0)
    }
}

@Suite struct UTF8MapTests {
    @Test func twoSpellingsAreTwoKeys() {
        var map = UTF8Map<Int>()
        map[nfc] = 1
        map[nfd] = 2
        #expect(map.count == 2)
        #expect(map[nfc] == 1 && map[nfd] == 2)
        #expect(map.keys.contains(nfc) && map.keys.contains(nfd) && !map.keys.contains("e"))
        // `Sequence.contains` on the keys goes through the byte-wise search too.
        #expect(map.keys.contains(where: { $0 == nfc }))  // String ==: either spelling matches
        #expect([nfc].contains(nfd))  // what an array of keys would answer
        #expect(map.removeValue(forKey: nfd) == 2)
        #expect(map.count == 1 && map[nfc] == 1 && map[nfd] == nil)
    }

    @Test func keepsKeysInByteOrder() {
        let map: UTF8Map<Int> = ["b": 1, nfc: 2, "a": 3, nfd: 4, "": 5, "ab": 6]
        #expect(Array(map.keys) == ["", "a", "ab", "b", nfd, nfc])
        #expect(map.map(\.key).map { Array($0.utf8) } == map.keys.map { Array($0.utf8) })
        #expect(map.values == [5, 3, 6, 1, 4, 2])
        #expect(map.description == #"["": 5, "a": 3, "ab": 6, "b": 1, "e\#u{301}": 4, "\#u{E9}": 2]"#)
        #expect(UTF8Map<Int>().description == "[:]")
    }

    @Test func dictionaryLikeSurface() {
        var map: UTF8Map<Int> = [:]
        #expect(map.isEmpty && map.index(forKey: "x") == nil)
        #expect(map.updateValue(1, forKey: "x") == nil)
        #expect(map.updateValue(2, forKey: "x") == 1)
        map["y", default: 10] += 1
        map["x", default: 10] += 1
        #expect(map == ["x": 3, "y": 11])
        map["x"] = nil
        map["absent"] = nil
        #expect(map == ["y": 11])
        #expect(map.mapValues { "\($0)" } == ["y": "11"])
        let numbers: UTF8Map<Int> = ["a": 1, "b": 2, "c": 3]
        #expect(numbers.filter { $0.value != 2 } == ["a": 1, "c": 3])
        #expect(numbers.compactMapValues { $0 == 2 ? nil : $0 * 10 } == ["a": 10, "c": 30])
        let sums = numbers.merging(["b": 20, "d": 4, nfc: 5], uniquingKeysWith: +)
        #expect(sums == ["a": 1, "b": 22, "c": 3, "d": 4, nfc: 5])
        var merged = numbers
        merged.merge(["a": 100], uniquingKeysWith: { old, _ in old })
        #expect(merged == numbers)
        merged.removeAll()
        #expect(merged.isEmpty)
        #expect(numbers.first?.key == "a" && numbers.last?.value == 3)
        for (key, value) in numbers { #expect(numbers[key] == value) }
    }

    @Test func bulkInitSortsOnceAndSaysWhatHappensToRepeats() throws {
        let pairs = [("c", 1), (nfc, 2), ("a", 3), (nfd, 4), ("c", 5), ("a", 6)]
        // Combine sees the members in input order.
        let combined = UTF8Map(pairs, uniquingKeysWith: { first, second in first * 10 + second })
        #expect(combined == ["a": 36, "c": 15, nfc: 2, nfd: 4])
        let last = UTF8Map(pairs, uniquingKeysWith: { _, second in second })
        #expect(last == ["a": 6, "c": 5, nfc: 2, nfd: 4])
        let error = #expect(throws: DuplicateKeyError.self) {
            try UTF8Map(checkingUniqueKeysWithValues: pairs)
        }
        #expect(error?.key == "a")
        let unique = try UTF8Map(checkingUniqueKeysWithValues: [(nfc, 1), (nfd, 2), ("z", 3)])
        #expect(unique.count == 3 && Array(unique.keys) == [nfd, "z", nfc])
        #expect(UTF8Map(uniqueKeysWithValues: [("b", 1), ("a", 2)]) == ["a": 2, "b": 1])
    }

    @Test func equalityAndHashingAreByteWise() {
        let a: UTF8Map<Int> = [nfc: 1]
        let b: UTF8Map<Int> = [nfd: 1]
        #expect(a != b)
        #expect(Set([a, b, a]).count == 2)
        #expect(a.hashValue == UTF8Map<Int>(uniqueKeysWithValues: [("\u{E9}", 1)]).hashValue)
        let va: Value = [nfc: 1]
        let vb: Value = [nfd: 1]
        #expect(va != vb && Set([va, vb]).count == 2)
        #expect(Value.string(nfc) != Value.string(nfd))
        #expect(Set([Value.string(nfc), Value.string(nfd)]).count == 2)
    }

    /// Random operations agree with a reference: an unsorted list of pairs searched byte-wise.
    @Test func randomOperationsMatchAReferenceList() {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("UTF8Map reference seed: \(seed) (replay: TRELLIS_SEED=\(seed))")
        let alphabet = ["a", "b", "e", nfc, nfd, "\u{301}", "é", "\u{1F600}", "", "A", "\u{0}"]
        func randomKey() -> String {
            (0..<Int.random(in: 0...3, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! }.joined()
        }
        var map = UTF8Map<Int>()
        var reference: [(key: [UInt8], value: Int)] = []
        for step in 0..<4000 {
            let key = randomKey()
            let bytes = Array(key.utf8)
            let found = reference.firstIndex { $0.key == bytes }
            switch Int.random(in: 0..<4, using: &rng) {
            case 0, 1:
                map[key] = step
                if let found { reference[found].value = step } else { reference.append((bytes, step)) }
            case 2:
                let removed = map.removeValue(forKey: key)
                #expect(removed == found.map { reference[$0].value }, "seed \(seed)")
                if let found { reference.remove(at: found) }
            default:
                #expect(map[key] == found.map { reference[$0].value }, "seed \(seed)")
            }
        }
        let sorted = reference.sorted { $0.key.lexicographicallyPrecedes($1.key) }
        #expect(map.map { Array($0.key.utf8) } == sorted.map(\.key), "seed \(seed)")
        #expect(map.values == sorted.map(\.value), "seed \(seed)")
        let rebuilt = UTF8Map(uniqueKeysWithValues: map.reversed().map { ($0.key, $0.value) })
        #expect(rebuilt == map, "seed \(seed)")
    }

    /// The positional operations the CRDT's maps use (search from a position, insert many keys in
    /// one pass, drop members in place) agree with the keyed surface.
    @Test func positionalOperationsMatchTheKeyedSurface() {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("UTF8Map positional seed: \(seed) (replay: TRELLIS_SEED=\(seed))")
        let alphabet = ["a", "b", nfc, nfd, "\u{301}", "\u{1F600}", ""]
        func randomKeys(_ count: Int) -> [String] {
            (0..<count).map { _ in
                (0..<Int.random(in: 0...3, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! }.joined()
            }
        }
        for round in 0..<300 {
            var map = UTF8Map<Int>(randomKeys(Int.random(in: 0...12, using: &rng)).map { ($0, 0) }) { a, _ in a }
            let incoming = UTF8Map<Int>(randomKeys(Int.random(in: 0...12, using: &rng)).map { ($0, 1) }) { a, _ in a }
            // What `MapNode.join` does: walk `incoming` in order, bump shared keys, insert new ones.
            var expected = map
            for (key, _) in incoming { expected[key, default: 0] += 1 }
            var added: [(index: Int, key: String, member: Int)] = []
            var next = 0
            for (key, _) in incoming {
                let (found, index) = map.search(key, from: next)
                #expect(map.search(key) == (found, index), "seed \(seed)")
                if found {
                    map.modifyMember(at: index) { $0 += 1 }
                    next = index + 1
                } else {
                    added.append((index, key, 1))
                    next = index
                }
            }
            map.insert(sorted: added)
            #expect(map == expected, "round \(round), seed \(seed)")
            expected = expected.filter { $0.value != 1 }
            map.removeMembers { $0 == 1 }
            #expect(map == expected, "round \(round), seed \(seed)")
        }
    }
}

@Suite struct ByteKeyValueTests {
    /// Maps whose keys mix precomposed, decomposed and combining-mark-only spellings survive JSON
    /// and CBOR round trips with every key, and both encodings list keys in their own order.
    @Test func unicodeKeysRoundTripThroughJSONAndCBOR() throws {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("unicodeKeysRoundTripThroughJSONAndCBOR seed: \(seed) (replay: TRELLIS_SEED=\(seed))")
        let parts = ["e", "\u{301}", nfc, nfd, "\u{E9}\u{301}", "A\u{30A}", "\u{C5}", "\u{212B}", "x"]
        func randomMap(_ depth: Int) -> Value {
            var entries = UTF8Map<Value>()
            for _ in 0..<Int.random(in: 0...6, using: &rng) {
                let key = (0..<Int.random(in: 1...2, using: &rng)).map { _ in parts.randomElement(using: &rng)! }
                    .joined()
                entries[key] = depth > 0 && Bool.random(using: &rng) ? randomMap(depth - 1) : .int(Int64(entries.count))
            }
            return .map(entries)
        }
        for _ in 0..<300 {
            let value = randomMap(2)
            let json = JSON.string(value)
            #expect(try JSON.parse(json) == value, "seed \(seed): \(json)")
            #expect(
                try CBOR.decode(CBOR.encode(value), options: .init(requireDeterministic: true)) == value, "seed \(seed)"
            )
        }
    }

    @Test func fieldPathsReachOnlyTheirOwnSpelling() throws {
        let document: Value = ["_id": "d1", nfc: 1, nfd: 2, "m": [nfd: ["x": 3]]]
        #expect(document.value(at: .key(nfc)) == 1)
        #expect(document.value(at: .key(nfd)) == 2)
        #expect(document.value(at: FieldPath(components: [.key("m"), .key(nfd), .key("x")])) == 3)
        #expect(document.value(at: FieldPath(components: [.key("m"), .key(nfc), .key("x")])) == nil)
        #expect(FieldPath.key(nfc) != FieldPath.key(nfd))
        #expect(Set([FieldPath.key(nfc), FieldPath.key(nfd)]).count == 2)
    }

    @Test func queriesOnTheTwoSpellingsAreTwoQueries() throws {
        let precomposed = try Query("`\(nfc)` == 1")
        let decomposed = try Query("`\(nfd)` == 1")
        #expect(precomposed != decomposed)
        #expect(Set([precomposed, decomposed]).count == 2)
        #expect(try precomposed.matches([nfc: 1]) && !(try precomposed.matches([nfd: 1])))
        #expect(try decomposed.matches([nfd: 1]) && !(try decomposed.matches([nfc: 1])))
        // Arguments are looked up byte-wise too.
        let argument = try Query("a == $args.`\(nfc)`")
        #expect(try argument.matches(["a": 1], args: [nfc: 1]))
        #expect(throws: QueryEvaluationError.self) { try argument.matches(["a": 1], args: [nfd: 1]) }
        // A map literal holds both spellings.
        let literal = try Query("m == {'\(nfc)': 1, '\(nfd)': 2}")
        #expect(try literal.matches(["m": [nfd: 2, nfc: 1]]))
        #expect(!(try literal.matches(["m": [nfc: 1]])))
    }

    @Test func subscriptionsOnTheTwoSpellingsAreTwoSubscriptions() {
        let a = SubscriptionSpec(collection: nfc)
        let b = SubscriptionSpec(collection: nfd)
        #expect(a != b)
        #expect(!UTF8Key.equal(a.key, b.key))
        #expect(Set([a, b]).count == 2)
        let argsA = SubscriptionSpec(collection: "c", query: "x == $args.k", args: ["k": .string(nfc)])
        let argsB = SubscriptionSpec(collection: "c", query: "x == $args.k", args: ["k": .string(nfd)])
        #expect(argsA != argsB && Set([argsA, argsB]).count == 2)
    }
}
