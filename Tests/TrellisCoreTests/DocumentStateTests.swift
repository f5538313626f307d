import Testing
import TrellisCore
import TrellisTestKit

func stamp(_ millis: UInt64, _ site: SiteID) -> Stamp {
    Stamp(time: HLCTimestamp(millis: millis, logical: 0), site: site)
}

func path(_ text: String) -> FieldPath {
    (try? FieldPath(parsing: text)) ?? .key(text)
}

@Suite struct DocumentStateTests {
    let id: Value = "d1"

    func merged(_ a: DocumentState, _ b: DocumentState) -> DocumentState {
        var out = a
        out.merge(b)
        return out
    }

    @Test func lastWriterWinsByStampThenSite() throws {
        var a = DocumentState()
        try a.set(.key("v"), to: "a", stamp: stamp(10, 1))
        var b = DocumentState()
        try b.set(.key("v"), to: "b", stamp: stamp(10, 2))
        #expect(merged(a, b) == merged(b, a))
        #expect(merged(a, b).materialize(id: id)?["v"] == "b")  // same time: the larger site ID wins
        var c = DocumentState()
        try c.set(.key("v"), to: "c", stamp: stamp(11, 1))
        #expect(merged(merged(a, b), c).materialize(id: id)?["v"] == "c")
    }

    @Test func nestedMapsMergePerKey() throws {
        var a = DocumentState()
        a.merge(fields: ["engine": ["hp": 130, "cyl": 8]], stamp: stamp(10, 1))
        var b = a
        try a.set(path("engine.hp"), to: 140, stamp: stamp(11, 1))
        try b.set(path("engine.fuel"), to: "diesel", stamp: stamp(12, 2))
        let m = merged(a, b)
        #expect(m == merged(b, a))
        #expect(m.materialize(id: id) == ["_id": "d1", "engine": ["hp": 140, "cyl": 8, "fuel": "diesel"]])
    }

    @Test func arraysAreRegisters() throws {
        var a = DocumentState()
        try a.set(.key("tags"), to: ["x", "y"], stamp: stamp(10, 1))
        var b = a
        try a.set(.key("tags"), to: ["x", "y", "a"], stamp: stamp(11, 1))
        try b.set(.key("tags"), to: ["b"], stamp: stamp(12, 2))
        #expect(merged(a, b).materialize(id: id)?["tags"] == ["b"])
        #expect(throws: DocumentStateError.self) { try a.set(path("tags[0]"), to: "z", stamp: stamp(13, 1)) }
    }

    @Test func setReplacesAMapButUpsertMergesIntoIt() throws {
        var a = DocumentState()
        a.merge(fields: ["m": ["x": 1, "y": 2]], stamp: stamp(10, 1))
        a.merge(fields: ["m": ["z": 3]], stamp: stamp(11, 1))
        #expect(a.value(at: .key("m")) == ["x": 1, "y": 2, "z": 3])
        try a.set(.key("m"), to: ["only": true], stamp: stamp(12, 1))
        #expect(a.value(at: .key("m")) == ["only": true])
        try a.set(.key("m"), to: 5, stamp: stamp(13, 1))
        #expect(a.value(at: .key("m")) == 5)
        a.merge(fields: ["m": ["back": 1]], stamp: stamp(14, 1))
        #expect(a.value(at: .key("m")) == ["back": 1])  // the old keys stay removed
    }

    @Test func unsetIsObservedRemove() throws {
        var base = DocumentState()
        base.merge(fields: ["a": 1, "m": ["x": 1]], stamp: stamp(10, 1))
        var a = base
        var b = base
        #expect(try a.unset(path("m.x"), stamp: stamp(11, 1)))
        #expect(try !a.unset(path("nothing.here"), stamp: stamp(12, 1)))
        #expect(a.materialize(id: id) == ["_id": "d1", "a": 1, "m": [:]])  // an emptied map stays a map
        try b.set(path("m.y"), to: 2, stamp: stamp(11, 2))  // concurrent, unseen by a
        #expect(merged(a, b).materialize(id: id) == ["_id": "d1", "a": 1, "m": ["y": 2]])
        // An unset concurrent with a later write to the same key loses to it (add-wins).
        var c = base
        _ = try c.unset(.key("a"), stamp: stamp(20, 1))
        var d = base
        try d.set(.key("a"), to: 9, stamp: stamp(15, 2))
        #expect(merged(c, d).value(at: .key("a")) == 9)
    }

    @Test func removeIsAddWinsAndRewritingRevives() throws {
        // F02's shape: A and B hold d1 {n:1}; A removes; concurrently B sets n=2.
        var base = DocumentState()
        base.merge(fields: ["n": 1, "old": true], stamp: stamp(10, 1))
        var a = base
        a.remove(stamp: stamp(11, 1))
        #expect(a.isDeleted && a.materialize(id: id) == nil)
        var b = base
        try b.set(.key("n"), to: 2, stamp: stamp(11, 2))
        #expect(merged(a, b) == merged(b, a))
        #expect(merged(a, b).materialize(id: id) == ["_id": "d1", "n": 2])
        // F01's shape: writing to a removed _id brings it back with only the new fields.
        a.merge(fields: ["v": "new"], stamp: stamp(12, 1))
        #expect(a.materialize(id: id) == ["_id": "d1", "v": "new"])
    }

    @Test func countersSumIncrementsAndRestartOnSet() throws {
        var base = DocumentState()
        try base.increment(.key("n"), by: 1, stamp: stamp(10, 1))
        var a = base
        var b = base
        try a.increment(.key("n"), by: 2, stamp: stamp(11, 1))
        try b.increment(.key("n"), by: 5, stamp: stamp(11, 2))
        try b.increment(.key("n"), by: -1, stamp: stamp(12, 2))
        #expect(merged(a, b).value(at: .key("n")) == 7)  // ints stay exact
        // A restart (a set) resets; an increment it had not seen still counts.
        var c = merged(a, b)
        try c.set(.key("n"), to: 100, stamp: stamp(13, 1))
        try c.increment(.key("n"), by: 1, stamp: stamp(14, 1))
        #expect(c.value(at: .key("n")) == 101)
        try b.increment(.key("n"), by: 10, stamp: stamp(13, 2))  // concurrent with the restart
        #expect(merged(c, b).value(at: .key("n")) == 111)
        // A number becomes a counter starting from it; other values cannot be incremented.
        var d = DocumentState()
        try d.set(.key("x"), to: 3, stamp: stamp(1, 1))
        try d.increment(.key("x"), by: 2, stamp: stamp(2, 1))
        #expect(d.value(at: .key("x")) == 5)
        try d.set(.key("s"), to: "text", stamp: stamp(3, 1))
        #expect(throws: DocumentStateError.self) { try d.increment(.key("s"), by: 1, stamp: stamp(4, 1)) }
        #expect(throws: DocumentStateError.self) {
            try d.increment(.key("x"), by: .double(.infinity), stamp: stamp(4, 1))
        }
        #expect(throws: DocumentStateError.self) { try d.increment(.key("x"), by: "1", stamp: stamp(4, 1)) }
    }

    /// DATA-MODEL.md rule 3's example, in both delivery orders and both clock orders: a set (restart)
    /// concurrent with an increment it had not seen keeps both.
    @Test func aRestartConcurrentWithAnIncrementKeepsBoth() throws {
        for (setTime, incrementTime) in [(13, 14), (14, 13)] as [(UInt64, UInt64)] {
            var base = DocumentState()
            try base.increment(.key("n"), by: 1, stamp: stamp(10, 1))
            var b = base
            try b.increment(.key("n"), by: 5, stamp: stamp(11, 2))
            var a = merged(base, b)  // A has seen 1 + 5
            try a.set(.key("n"), to: 100, stamp: stamp(setTime, 1))
            try b.increment(.key("n"), by: 10, stamp: stamp(incrementTime, 2))  // not seen by A's set
            #expect(merged(a, b).value(at: .key("n")) == 110, "set at \(setTime), increment at \(incrementTime)")
            #expect(merged(b, a) == merged(a, b))
            // The same through upsert's merge of a number into the counter field.
            var c = merged(base, b)
            c.merge(fields: ["n": 50], stamp: stamp(20, 3))
            #expect(c.value(at: .key("n")) == 50)
        }
    }

    @Test func writingBelowAScalarIsRefused() throws {
        var a = DocumentState()
        a.merge(fields: ["s": "text", "m": ["x": 1]], stamp: stamp(10, 1))
        #expect(throws: DocumentStateError.self) { try a.set(path("s.x"), to: 1, stamp: stamp(11, 1)) }
        #expect(throws: DocumentStateError.self) { try a.increment(path("s.x"), by: 1, stamp: stamp(11, 1)) }
        try a.set(path("m.y"), to: 2, stamp: stamp(12, 1))
        try a.set(path("new.deep"), to: 3, stamp: stamp(13, 1))
        #expect(a.materialize(id: id) == ["_id": "d1", "s": "text", "m": ["x": 1, "y": 2], "new": ["deep": 3]])
    }

    @Test func encodingRoundTripsAndRejectsMalformedStates() throws {
        var a = DocumentState()
        a.merge(fields: ["v": ["nested": [1, 2.5, "x"]], "w": -0.0], stamp: stamp(10, .max))
        try a.increment(.key("n"), by: 2, stamp: stamp(11, 3))
        _ = try a.unset(path("v.nested"), stamp: stamp(12, 3))
        a.remove(stamp: stamp(13, 7))
        try a.set(.key("w"), to: .bytes([1, 2]), stamp: stamp(14, 3))
        #expect(try DocumentState(encoded: a.referenceEncoding) == a)
        #expect(a.cbor() == CBOR.encode(a.referenceEncoding))
        #expect(try DocumentState(encoded: CBOR.decode(a.cbor())) == a)
        let bad: [Value] = [
            "nope", ["m": [:]], ["s": [1], "v": 3, "w": []], ["s": [1], "v": 2, "w": [], "q": 1],
            ["s": [1], "v": 2, "w": [[0, 5]], "m": ["k": ["e": [[0, 5]]]]],
            ["s": [1], "v": 2, "w": [[0, 5]], "m": ["k": ["e": [[1, 5, "x"]]]]],
            ["s": [1], "v": 2, "w": [[0, 5]], "m": ["k": ["e": [[0, 5, .double(.nan)]]]]],
            ["s": ["x"], "v": 2, "w": []], ["s": [1], "v": 2, "w": [[0, 5]], "m": ["k": ["t": [[0, 5, "x"]]]]],
            ["s": [1], "v": 2, "w": [[0, 5]], "m": ["k": ["h": [[0, 5, 7]]]]],
            ["s": [1], "v": 2, "w": [[0, 5]], "m": ["k": ["y": []]]],
            // A cover of a default apart from an entry above zero that is not there.
            ["s": [1], "v": 2, "w": [[0, 5]], "m": ["k": ["z": [0]]]],
            ["s": [1], "v": 2, "w": [[0, 5]], "m": ["k": ["x": [[0, 0]], "z": [0]]]],
            ["s": [1], "v": 2, "w": [[0, 5]], "m": ["k": ["x": [[0, 5]], "z": [1]]]],
            ["s": [1], "v": 2, "w": [[0, 5]], "m": ["k": ["x": [[0, 5]], "z": 0]]],
            ["s": [1], "v": 2, "w": [[0, 5]], "m": ["k": ["b": [[0, 5, "x", []]]]]],
            // Version 1 shapes.
            ["s": [1], "m": ["k": ["r": [1, 2]]]], ["s": [1], "m": ["k": ["r": [1, 2, 5]]]],
            ["s": [1], "m": ["k": ["c": ["t": [[0, "x", 1, 0]]]]]],
        ]
        for value in bad {
            #expect(throws: DocumentStateError.self, "\(value)") { try DocumentState(encoded: value) }
        }
    }
}
