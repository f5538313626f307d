import Testing
import TrellisCore
import TrellisTestKit

/// Review of the one-pass UTF-8 check of SQLite's bytes (``StoredJSON/init(checking:)-(UnsafeBufferPointer<UInt8>)``
/// through `JSONScan.certainlyParsesAsWellFormedUTF8`): for any bytes, the byte path answers what the string
/// path answers for `String(decoding: bytes, as: UTF8.self)`, and what it keeps unparsed is well-formed
/// UTF-8 that parses.
@Suite struct ReviewThirtyFourUTF8Tests {
    /// Ill-formed sequences: stray continuations, overlong forms, surrogates, beyond U+10FFFF, bytes
    /// that never occur, truncated sequences and a lead byte followed by a non-continuation.
    static let illFormed: [[UInt8]] = [
        [0x80], [0xBF], [0xC0, 0xAF], [0xC1, 0xBF], [0xE0, 0x80, 0xAF], [0xE0, 0x9F, 0xBF],
        [0xF0, 0x80, 0x80, 0xAF], [0xF0, 0x8F, 0xBF, 0xBF], [0xED, 0xA0, 0x80], [0xED, 0xBF, 0xBF],
        [0xED, 0xA0, 0xBD, 0xED, 0xB8, 0x80], [0xF4, 0x90, 0x80, 0x80], [0xF5, 0x80, 0x80, 0x80],
        [0xF8, 0x88, 0x80, 0x80, 0x80], [0xFE], [0xFF], [0xC3], [0xE2, 0x82], [0xF0, 0x9F, 0x98],
        [0xC3, 0xC3], [0xE2, 0x28, 0xA1], [0xF0, 0x9F, 0x41], [0xC2, 0xC0],
    ]

    /// Well-formed sequences at the edges of each length, U+FFFD itself and DEL.
    static let wellFormed: [[UInt8]] = [
        [0xC2, 0x80], [0xC3, 0xA9], [0xDF, 0xBF], [0xE0, 0xA0, 0x80], [0xED, 0x9F, 0xBF], [0xEE, 0x80, 0x80],
        [0xEF, 0xBF, 0xBD], [0xEF, 0xBF, 0xBF], [0xF0, 0x90, 0x80, 0x80], [0xF0, 0x9F, 0x98, 0x80],
        [0xF4, 0x8F, 0xBF, 0xBF], [0x7F],
    ]

    static func hex(_ bytes: [UInt8]) -> String {
        bytes.map { ($0 < 0x10 ? "0" : "") + String($0, radix: 16) }.joined(separator: " ")
    }

    static func stored(_ bytes: [UInt8]) -> StoredJSON? {
        bytes.withUnsafeBufferPointer { StoredJSON(checking: $0) }
    }

    static func isWellFormed(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { UTF8Check.firstInvalid($0) } == nil
    }

    /// What the checks found over a run, so a test can tell its inputs reached each path.
    struct Tally {
        var inputs = 0
        var vouched = 0
        var vouchedNonASCII = 0
        var scannedButIllFormed = 0
        var acceptedAfterRepair = 0
        var rejected = 0
    }

    /// Checks every promise on `bytes` and counts which path they took.
    static func check(_ bytes: [UInt8], _ context: String, _ tally: inout Tally) {
        tally.inputs += 1
        let label = "\(context): \(hex(bytes))"
        let repaired = String(decoding: bytes, as: UTF8.self)
        let parsed = try? JSON.parse(repaired)
        let fromBytes = stored(bytes)
        let fromString = StoredJSON(checking: repaired)
        #expect((fromBytes == nil) == (fromString == nil), "nil differs \(label)")
        #expect((fromBytes == nil) == (parsed == nil), "nil differs from the parser \(label)")

        let vouched = bytes.withUnsafeBufferPointer { JSONScan.certainlyParsesAsWellFormedUTF8($0) }
        let wellFormed = isWellFormed(bytes)
        let scans = bytes.withUnsafeBufferPointer { JSONScan.certainlyParses($0) }
        // The documented contract: the scan's answer and no ill-formed sequence.
        #expect(
            vouched == (scans && wellFormed), "vouched \(vouched) scans \(scans) well formed \(wellFormed) \(label)")
        // certainlyParses on bytes is the string check of the repaired text (repair never eats ASCII).
        #expect(scans == JSONScan.certainlyParses(repaired), "certainlyParses differs \(label)")
        if scans { #expect(parsed != nil, "certainlyParses vouched for text that does not parse \(label)") }
        var position = 0
        let skipped = bytes.withUnsafeBufferPointer { JSONScan.skipValue(in: $0, at: &position, depth: 0) }
        #expect((skipped && position == bytes.count) == scans, "skipValue differs \(label)")
        if vouched {
            #expect((try? JSON.parse(bytes)) != nil, "vouched bytes do not parse \(label)")
            #expect(fromBytes?.withUTF8 { Array($0) } == bytes, "vouched bytes not stored as they came \(label)")
            #expect(fromBytes?.isParsed == false, "vouched bytes parsed \(label)")
            tally.vouched += 1
            if bytes.contains(where: { $0 >= 0x80 }) { tally.vouchedNonASCII += 1 }
        } else if scans {
            tally.scannedButIllFormed += 1
        }
        guard let fromBytes, let fromString, let parsed else {
            tally.rejected += 1
            return
        }
        if !wellFormed { tally.acceptedAfterRepair += 1 }
        let kept = fromBytes.withUTF8 { Array($0) }
        #expect(isWellFormed(kept), "stored bytes ill-formed \(label)")
        #expect(Array(String(decoding: kept, as: UTF8.self).utf8) == kept, "stored bytes not Swift's UTF-8 \(label)")
        #expect((try? JSON.parse(kept)) == parsed, "stored bytes parse differently \(label)")
        #expect(fromBytes.text == fromString.text, "text differs \(label)")
        #expect(fromBytes == fromString, "bytes differ \(label)")
        #expect(fromBytes.isParsed == fromString.isParsed, "laziness differs \(label)")

        var keys = ["missing", "", "\u{FFFD}", "k", "a", "$bytes"]
        if case .map(let fields) = parsed { keys += Array(fields.keys) }
        for key in keys {
            // Fresh copies, so the member is scanned, not looked up in a parsed value.
            let byBytes = stored(bytes)?.member(key)
            let byString = StoredJSON(checking: repaired)?.member(key)
            #expect(byBytes == byString, "member \(key.debugDescription) differs \(label)")
            #expect(byBytes == parsed[key], "member \(key.debugDescription) differs from the parser \(label)")
            if wellFormed {
                switch bytes.withUnsafeBufferPointer({ JSONScan.member(key, in: $0) }) {
                case .found(let value): #expect(value == parsed[key], "scanned member \(key.debugDescription) \(label)")
                case .absent: #expect(parsed[key] == nil, "scanned absent \(key.debugDescription) \(label)")
                case .unsure: break
                }
            }
        }
        #expect(fromBytes.value == parsed, "value differs \(label)")
        #expect(fromString.value == parsed, "string path value differs \(label)")
        #expect(fromBytes.member("missing") == fromString.member("missing"))
    }

    /// Texts with `sequence` in a string at every offset, after four paddings: in keys and values, nested
    /// (arrays in maps in arrays), after `\"` and `\\`, near the end of the input and after a good
    /// non-ASCII sequence.
    static func placements(of sequence: [UInt8]) -> [([UInt8], String)] {
        var texts: [([UInt8], String)] = []
        let q = [UInt8(ascii: "\"")]
        for pad in [0, 1, 4, 7] {
            let padding = Array(repeating: UInt8(ascii: "p"), count: pad)
            for length in 0...10 {
                for offset in 0...length {
                    var content = Array(repeating: UInt8(ascii: "x"), count: length)
                    content.insert(contentsOf: sequence, at: offset)
                    let s = q + content + q
                    let at = "pad \(pad) length \(length) offset \(offset)"
                    texts.append((Array("{\"".utf8) + padding + Array("\":".utf8) + s + Array("}".utf8), "value " + at))
                    texts.append(
                        (Array("{\"".utf8) + padding + Array("\":1,".utf8) + s + Array(":2}".utf8), "key " + at))
                    texts.append(
                        (Array("[{\"".utf8) + padding + Array("\":[1,".utf8) + s + Array("]}]".utf8), "nested " + at))
                    texts.append(
                        (
                            Array("[{\"".utf8) + padding + Array("\":[{".utf8) + s + Array(":0}]}]".utf8),
                            "nested key " + at
                        ))
                    texts.append(
                        (
                            padding.isEmpty
                                ? s : Array("[\"".utf8) + padding + q + [UInt8(ascii: ",")] + s + Array("]".utf8),
                            "last " + at
                        ))
                    if offset == 0 {
                        texts.append(
                            (
                                Array("[\"".utf8) + padding + Array(#"\""#.utf8) + content + Array("\"]".utf8),
                                "after \\\" " + at
                            ))
                        texts.append(
                            (
                                Array("[\"".utf8) + padding + Array(#"\\"#.utf8) + content + Array("\"]".utf8),
                                "after \\\\ " + at
                            ))
                        texts.append(
                            (Array("[\"é".utf8) + padding + content + Array("\"]".utf8), "after é " + at))
                    }
                }
            }
        }
        return texts
    }

    @Test func illFormedSequencesAtEveryOffsetAreRepairedAsTheStringPathRepairsThem() {
        var tally = Tally()
        for sequence in Self.illFormed {
            for (text, context) in Self.placements(of: sequence) {
                #expect(!text.withUnsafeBufferPointer { JSONScan.certainlyParsesAsWellFormedUTF8($0) }, "\(context)")
                #expect(text.withUnsafeBufferPointer { JSONScan.certainlyParses($0) }, "\(context)")
                Self.check(text, context, &tally)
            }
        }
        #expect(tally.vouched == 0)
        #expect(tally.acceptedAfterRepair == tally.inputs)
    }

    @Test func wellFormedSequencesAtEveryOffsetAreVouchedAndKeptAsTheyCame() {
        var tally = Tally()
        for sequence in Self.wellFormed {
            for (text, context) in Self.placements(of: sequence) {
                #expect(text.withUnsafeBufferPointer { JSONScan.certainlyParsesAsWellFormedUTF8($0) }, "\(context)")
                Self.check(text, context, &tally)
            }
        }
        #expect(tally.vouched == tally.inputs)
    }

    @Test func bytesFromHexEightyOutsideStringsAndTruncatedEndsAreRefusedAlike() {
        var tally = Tally()
        let documents = [#"{"a":"bcdefghijk","l":[1,"m"]}"#, #"["abcdefgh"]"#, #""abcdefghijklmnop""#, "12", "[]"]
        for document in documents {
            let text = Array(document.utf8)
            for at in 0...text.count {
                for sequence in Self.illFormed + Self.wellFormed + [[0xEF, 0xBB, 0xBF]] {
                    var changed = text
                    changed.insert(contentsOf: sequence, at: at)
                    Self.check(changed, "inserted at \(at)", &tally)
                }
            }
            // Truncated just before the closing quote and at the very end, with no closing quote.
            for sequence in [[0xC3], [0xE2, 0x82], [0xF0, 0x9F, 0x98], [0xED, 0xA0]] as [[UInt8]] {
                Self.check(Array(#"{"a":"bcdefgh"#.utf8) + sequence, "unclosed", &tally)
                Self.check(Array(#"["bcdefghijklmnopq"#.utf8) + sequence, "unclosed", &tally)
                Self.check(Array(#"""#.utf8) + sequence, "unclosed", &tally)
                Self.check(Array(#"{"a":"bcdefgh"#.utf8) + sequence + Array(#""}"#.utf8), "last bytes", &tally)
                Self.check(Array(#"["#.utf8) + sequence, "after bracket", &tally)
                Self.check(sequence, "alone", &tally)
            }
        }
        #expect(tally.rejected > 0)
        #expect(tally.vouchedNonASCII > 0)
    }

    @Test func emptyInputIsRefused() {
        var tally = Tally()
        Self.check([], "empty", &tally)
        #expect(StoredJSON(checking: UnsafeBufferPointer<UInt8>(start: nil, count: 0)) == nil)
        #expect(!JSONScan.certainlyParsesAsWellFormedUTF8(UnsafeBufferPointer<UInt8>(start: nil, count: 0)))
        let some: [UInt8] = Array(#"{"a":1}"#.utf8)
        some.withUnsafeBufferPointer { buffer in
            let empty = UnsafeBufferPointer(rebasing: buffer[3..<3])
            #expect(StoredJSON(checking: empty) == nil)
            #expect(!JSONScan.certainlyParsesAsWellFormedUTF8(empty))
        }
        #expect(StoredJSON(checking: "") == nil)
    }

    /// The scan reads eight bytes at a time only within the buffer: ill-formed bytes right after it, in the
    /// same allocation, change nothing.
    @Test func bytesPastTheBufferAreNotRead() {
        for document in [#"{"a":"bcdefghijklmnop"}"#, #""abcdefghijklmnop""#, #"["a","bcdefgh"]"#] {
            let text = Array(document.utf8)
            let larger = text + Array(repeating: 0xFF, count: 16)
            larger.withUnsafeBufferPointer { buffer in
                let prefix = UnsafeBufferPointer(rebasing: buffer[0..<text.count])
                #expect(JSONScan.certainlyParsesAsWellFormedUTF8(prefix), "\(document)")
                #expect(StoredJSON(checking: prefix)?.withUTF8 { Array($0) } == text, "\(document)")
            }
        }
    }

    /// Nesting at the parser's limit and one past it, with a string holding a good or bad sequence in the
    /// innermost value or key.
    @Test func deepNestingCarriesTheHighBitsOut() {
        var tally = Tally()
        for depth in [JSON.maximumDepth - 1, JSON.maximumDepth, JSON.maximumDepth + 1] {
            for sequence in Self.illFormed.prefix(12) + Self.wellFormed.prefix(4) {
                let inner = [UInt8(ascii: "\"")] + sequence + [UInt8(ascii: "\"")]
                // Arrays only.
                let arrays =
                    Array(repeating: UInt8(ascii: "["), count: depth) + inner
                    + Array(repeating: UInt8(ascii: "]"), count: depth)
                Self.check(arrays, "arrays \(depth)", &tally)
                // Arrays in maps in arrays, the innermost sequence in a key.
                var open: [UInt8] = []
                var close: [UInt8] = []
                for level in 0..<depth {
                    if level % 2 == 0 {
                        open += Array("[1,".utf8)
                        close = Array("]".utf8) + close
                    } else {
                        open += Array(#"{"k":1,"z":"#.utf8)
                        close = Array("}".utf8) + close
                    }
                }
                let keyed = open + Array("{".utf8) + inner + Array(":0}".utf8) + close
                Self.check(keyed, "mixed \(depth)", &tally)
                Self.check(open + inner + close, "mixed value \(depth)", &tally)
            }
        }
        #expect(tally.vouched > 0)
        #expect(tally.acceptedAfterRepair > 0)
        #expect(tally.rejected > 0)
    }

    // MARK: Differential random test

    static func randomPiece(using rng: inout SeededRandom) -> [UInt8] {
        switch Int.random(in: 0..<10, using: &rng) {
        case 0...3:
            return Array(
                repeating: UInt8.random(in: 0x61...0x7A, using: &rng), count: Int.random(in: 1...9, using: &rng))
        case 4: return illFormed.randomElement(using: &rng)!
        case 5: return wellFormed.randomElement(using: &rng)!
        case 6: return [[0x5C, 0x22], [0x5C, 0x5C], [0x5C, 0x6E], [0x5C, 0x2F]].randomElement(using: &rng)!
        case 7: return [UInt8.random(in: 0x80...0xFF, using: &rng)]
        case 8: return Array(randomString(using: &rng).utf8).filter { $0 >= 0x20 && $0 != 0x22 && $0 != 0x5C }
        default: return [UInt8.random(in: 0x20...0x7E, using: &rng)].filter { $0 != 0x22 && $0 != 0x5C }
        }
    }

    static func randomStringLiteral(using rng: inout SeededRandom) -> [UInt8] {
        var bytes: [UInt8] = [0x22]
        for _ in 0..<Int.random(in: 0...5, using: &rng) { bytes += randomPiece(using: &rng) }
        return bytes + [0x22]
    }

    /// Compact JSON the scan mostly accepts, with every kind of sequence in its strings.
    static func randomDocument(depth: Int, using rng: inout SeededRandom) -> [UInt8] {
        let kind = depth == 0 ? Int.random(in: 0...2, using: &rng) : Int.random(in: 0...5, using: &rng)
        switch kind {
        case 0: return randomStringLiteral(using: &rng)
        case 1: return Array(String(Int.random(in: -999...999, using: &rng)).utf8)
        case 2: return Array(["true", "false", "null", "1.5"].randomElement(using: &rng)!.utf8)
        case 3, 4:
            let members = (0..<Int.random(in: 0...4, using: &rng)).map { _ in
                randomStringLiteral(using: &rng) + [UInt8(ascii: ":")] + randomDocument(depth: depth - 1, using: &rng)
            }
            return [UInt8(ascii: "{")] + Array(members.joined(separator: [UInt8(ascii: ",")])) + [UInt8(ascii: "}")]
        default:
            let members = (0..<Int.random(in: 0...4, using: &rng)).map { _ in
                randomDocument(depth: depth - 1, using: &rng)
            }
            return [UInt8(ascii: "[")] + Array(members.joined(separator: [UInt8(ascii: ",")])) + [UInt8(ascii: "]")]
        }
    }

    static func mutated(_ bytes: [UInt8], using rng: inout SeededRandom) -> [UInt8] {
        var bytes = bytes
        for _ in 0..<Int.random(in: 1...3, using: &rng) {
            let at = Int.random(in: 0...bytes.count, using: &rng)
            switch Int.random(in: 0..<6, using: &rng) {
            case 0: bytes.insert(contentsOf: illFormed.randomElement(using: &rng)!, at: at)
            case 1: bytes.insert(UInt8.random(in: 0x80...0xFF, using: &rng), at: at)
            case 2 where at < bytes.count: bytes[at] = UInt8.random(in: 0x80...0xFF, using: &rng)
            case 3 where at < bytes.count: bytes.remove(at: at)
            case 4: bytes = Array(bytes.prefix(at))
            default: bytes.insert(Array(#"{}[]":,\0-e"#.utf8).randomElement(using: &rng)!, at: at)
            }
        }
        return bytes
    }

    @Test func randomBytesAnswerAsTheirRepairedString() {
        var (rng, seed) = SeededRandom.fromEnvironment(default: 0x5EED_0034)
        print("ReviewThirtyFourUTF8Tests seed \(seed) (replay with \(SeededRandom.environmentVariable)=\(seed))")
        var tally = Tally()
        for round in 0..<2000 {
            let document = Self.randomDocument(depth: 4, using: &rng)
            Self.check(document, "seed \(seed) round \(round) document", &tally)
            Self.check(Self.mutated(document, using: &rng), "seed \(seed) round \(round) mutated", &tally)
            var written = UTF8Map<Value>()
            written[randomString(using: &rng)] = randomValue(depth: 3, using: &rng)
            Self.check(
                Self.mutated(JSON.bytes(.map(written)), using: &rng), "seed \(seed) round \(round) written", &tally)
            let alphabet = Array(#"{}[]":,\a0"#.utf8) + [0x80, 0xBF, 0xC3, 0xA9, 0xE2, 0xED, 0xA0, 0xF4, 0x90, 0xFF]
            let noise = (0..<Int.random(in: 0...24, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! }
            Self.check(noise, "seed \(seed) round \(round) noise", &tally)
        }
        print("ReviewThirtyFourUTF8Tests tally \(tally)")
        #expect(tally.vouched > 500)
        #expect(tally.vouchedNonASCII > 75)
        #expect(tally.scannedButIllFormed > 150)
        #expect(tally.acceptedAfterRepair > 150)
        #expect(tally.rejected > 500)
    }
}
