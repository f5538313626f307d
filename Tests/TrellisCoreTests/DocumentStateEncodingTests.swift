import Foundation
import Testing
import TrellisTestKit

@testable import TrellisCore

/// The state encoding (docs/PROTOCOL.md §3): the worked example, what decoding refuses, and
/// reading version 1.
@Suite struct DocumentStateEncodingTests {
    let siteA: SiteID = 1
    let siteB: SiteID = 2

    func at(_ millis: UInt64, _ site: SiteID) -> Stamp {
        Stamp(time: HLCTimestamp(millis: millis, logical: 0), site: site)
    }

    func hex(_ bytes: [UInt8]) -> String {
        bytes.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined()
    }

    /// The example of docs/PROTOCOL.md §3, byte for byte.
    @Test func theWorkedExampleOfTheProtocolDocument() throws {
        var a = DocumentState(fields: ["m": ["k": true], "v": "x"], stamp: at(1000, siteA))
        var b = a
        try b.increment(.key("n"), by: 2, stamp: at(1001, siteB))
        a.merge(b)
        _ = try a.unset(.key("v"), stamp: at(1002, siteA))
        let expected =
            "a561618282001a03e8000082011a03e90000616da3616da2616da1616ba161658183001a03e80000f561708182001a"
            + "03e80000616ea161748183011a03e90000026176a161788182001a03e80000617382010261760261778282001a03ea000082011a03e90000"
        let bytes = a.cbor()
        print("worked example: \(hex(bytes))")
        #expect(hex(bytes) == expected)
        // docs/PROTOCOL.md shows the same bytes: the first code block after "### Worked example".
        let doc = try String(
            contentsOf: URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent(
                "../../docs/PROTOCOL.md"), encoding: .utf8)
        let section = try #require(doc.range(of: "### Worked example")).upperBound
        let block = doc[section...].components(separatedBy: "```")[1]
        #expect(block.filter { !$0.isWhitespace } == expected)
        #expect(a.materialize(id: "d1") == ["_id": "d1", "m": ["k": true], "n": 2])
        #expect(try DocumentState(encoded: CBOR.decode(bytes)) == a)
        #expect(try CBOR.decode(bytes, options: .init(requireDeterministic: true)) == a.referenceEncoding)
    }

    /// A state naming more sites than the encoder keeps in a short list (40, written in an order
    /// that is not theirs), with keys of several lengths in and below the root, nested maps, a
    /// counter and removed fields: the direct encoding is the reference encoding, and decodes back.
    @Test func manySitesAndKeysOfEveryLengthEncodeAsTheReference() throws {
        var state = DocumentState(fields: ["zz": 1, "a": ["bbb": 1, "c": 2, "aa": 3], "é": "x"], stamp: at(1000, 7))
        for n in 0..<40 {
            let site = SiteID(1_000_003 &* UInt64(40 - n) % 65_537)
            var other = DocumentState(
                fields: [String(repeating: "k", count: 1 + n % 5) + "\(n)": .int(Int64(n)), "a": ["n\(n)": true]],
                stamp: at(2000 + UInt64(n), site))
            if n % 3 == 0 { try other.increment(.key("count"), by: 1, stamp: at(3000 + UInt64(n), site)) }
            state.merge(other)
            if n % 4 == 0 { _ = try state.unset(.key("zz"), stamp: at(4000 + UInt64(n), site)) }
        }
        let bytes = state.cbor()
        #expect(bytes == CBOR.encode(state.referenceEncoding))
        #expect(try DocumentState(encoded: CBOR.decode(bytes, options: .init(requireDeterministic: true))) == state)
        guard case .map(let top) = state.referenceEncoding, case .array(let table)? = top["s"] else {
            Issue.record("no site table")
            return
        }
        #expect(table.count == 41)
    }

    /// Issue 8 item 9: a peer cannot pin a field with a stamp in the year 4200 hidden inside a state.
    @Test func aStateHidingAStampAboveItsVectorsIsRefused() throws {
        let now: UInt64 = 1_764_590_000_000
        let year4200: Int64 = Int64(bitPattern: HLCTimestamp(millis: 70_370_000_000_000, logical: 0).rawValue)
        var state = DocumentState(fields: ["owner": "me", "m": ["k": 1]], stamp: at(now, siteA))
        try state.increment(.key("n"), by: 1, stamp: at(now + 1, siteB))
        try state.set(.key("n"), to: 5, stamp: at(now + 2, siteA))
        let good = state.referenceEncoding
        #expect(try DocumentState(encoded: good) == state)
        // Each tampered copy moves one inner stamp or context entry to the year 4200.
        let tampered: [(String, Value)] = [
            ("owner", good.replacing(["m", "owner", "e", 0, 1], with: .int(year4200))),
            ("owner", good.replacing(["m", "owner", "x"], with: [[1, .int(year4200)]])),
            ("m.k", good.replacing(["m", "m", "m", "k", "e", 0, 1], with: .int(year4200))),
            ("m", good.replacing(["m", "m", "p", 0, 1], with: .int(year4200))),
            ("n", good.replacing(["m", "n", "t", 0, 1], with: .int(year4200))),
            ("n", good.replacing(["m", "n", "b", 0, 3, 0, 1], with: .int(year4200))),
            ("n", good.replacing(["m", "n", "b", 0, 1], with: .int(year4200))),
            ("the document", good.replacing(["a", 0, 1], with: .int(year4200))),
        ]
        for (field, value) in tampered {
            #expect(value != good)
            let error = #expect(throws: DocumentStateError.self) { try DocumentState(encoded: value) }
            #expect(error?.message.contains(field) == true, "\(String(describing: error))")
            #expect(error?.message.contains("above the state's write vector") == true)
        }
        // A state that puts the far stamp in its own vectors decodes, and `maxTime` shows it to
        // the store's drift guard.
        let open = good.replacing(["w", 0, 1], with: .int(year4200))
            .replacing(["m", "owner", "e", 0, 1], with: .int(year4200))
        let decoded = try DocumentState(encoded: open)
        #expect(decoded.maxTime.rawValue == UInt64(year4200))
    }

    /// Rows written by earlier Trellis versions (encoding version 1) still read, with the same values.
    @Test func versionOneStatesAreConverted() throws {
        func t(_ millis: UInt64) -> Value { .int(Int64(HLCTimestamp(millis: millis, logical: 0).rawValue)) }
        let v1: Value = [
            "s": [1, 2],
            "w": [[0, t(10)], [1, t(11)]],
            "m": [
                "a": ["r": ["x", t(10), 0]],
                "n": ["c": ["t": [[0, 3.0, t(10), 0]], "b": [100.0, t(11), 1], "o": [[0, 1.0, t(9), 0]]]],
                "g": ["r": ["gone", t(10), 0], "x": [[0, t(12)]]],  // unset at 12, not in w
                "m": ["ms": [t(10), 0], "m": ["k": ["r": [true, t(10), 0]]]],
                "s": ["r": ["text", t(11), 1], "c": ["t": [], "b": [0.0, t(11), 1]]],  // a set over a counter
            ],
        ]
        let state = try DocumentState(encoded: v1)
        #expect(state.materialize(id: "d") == ["_id": "d", "a": "x", "n": 102.0, "m": ["k": true], "s": "text"])
        #expect(state.writes[siteA] == HLCTimestamp(millis: 12, logical: 0))
        #expect(
            state.adds == [siteA: HLCTimestamp(millis: 10, logical: 0), siteB: HLCTimestamp(millis: 11, logical: 0)])
        #expect(!hex(state.cbor()).contains(hex(Array("gone".utf8))))
        #expect(try DocumentState(encoded: CBOR.decode(state.cbor())) == state)
        let error = #expect(throws: DocumentStateError.self) {
            try DocumentState(encoded: ["s": [1], "v": 9, "w": []])
        }
        #expect(error?.message.contains("version 9") == true)
    }
}

extension Value {
    /// This value with the part at `path` (map keys and array indexes) replaced.
    fileprivate func replacing(_ path: [Any], with new: Value) -> Value {
        guard let step = path.first else { return new }
        let rest = Array(path.dropFirst())
        switch (self, step) {
        case (.map(var m), let key as String):
            m[key] = (m[key] ?? .null).replacing(rest, with: new)
            return .map(m)
        case (.array(var a), let i as Int) where i < a.count:
            a[i] = a[i].replacing(rest, with: new)
            return .array(a)
        default:
            return self
        }
    }
}
