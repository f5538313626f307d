import Foundation
import Testing
import TrellisTestKit

@testable import TrellisCore

/// Deltas of local writes (`StateDelta`, docs/DELTAS.md): a receiver whose state covers a delta's
/// base joins it to exactly the state the sender's whole state gives; a receiver that does not
/// cover it can tell; a peer's bytes that are not a delta are refused with an error.
@Suite struct StateDeltaTests {
    let id: Value = "d1"

    func delta(_ old: DocumentState, _ new: DocumentState, previous: StateDelta? = nil) -> StateDelta? {
        StateDelta.make(from: old, to: new, previous: previous, digest: StateDigest(new.cbor()))
    }

    func joined(_ state: DocumentState, _ delta: StateDelta) -> DocumentState {
        var out = state
        out.merge(delta)
        return out
    }

    func joined(_ state: DocumentState, _ other: DocumentState) -> DocumentState {
        var out = state
        out.merge(other)
        return out
    }

    /// Checks the claim for `receiver`: it covers the base, and the delta joins like `new`.
    func expectJoinsLikeTheWholeState(
        _ receiver: DocumentState, _ delta: StateDelta, _ new: DocumentState,
        sourceLocation: SourceLocation = #_sourceLocation
    ) {
        #expect(receiver.covers(base: delta.base), sourceLocation: sourceLocation)
        #expect(joined(receiver, delta) == joined(receiver, new), sourceLocation: sourceLocation)
    }

    // MARK: The hazards of docs/DELTAS.md

    /// Site 1 writes x, then y; the delta of the y write leaves x out, and a receiver holding x
    /// keeps it (the delta vouches only for the stamps above its base).
    @Test func aReceiverKeepsAnOlderFieldTheDeltaLeavesOut() throws {
        var old = DocumentState()
        try old.set(.key("x"), to: 1, stamp: stamp(10, 1))
        let receiver = old
        var new = old
        try new.set(.key("y"), to: 2, stamp: stamp(11, 1))
        let d = try #require(delta(old, new))
        #expect(d.base == [1: HLCTimestamp(millis: 10, logical: 0)])
        #expect(Array(d.state.root.entries.keys) == ["y"])
        expectJoinsLikeTheWholeState(receiver, d, new)
        #expect(joined(receiver, d).materialize(id: id) == ["_id": "d1", "x": 1, "y": 2])
        // The hazard itself: the delta's fields joined as a whole state vouch for the x they lack.
        #expect(joined(receiver, d.state).value(at: .key("x")) == nil)
    }

    /// A receiver holding a concurrent entry of a third site in the field the delta changes keeps
    /// it: the write's own remove context does not cover it.
    @Test func aReceiverKeepsAConcurrentEntryOfAThirdSiteInTheChangedField() throws {
        var old = DocumentState()
        try old.set(.key("x"), to: 1, stamp: stamp(10, 1))
        var third = old
        try third.set(.key("x"), to: 3, stamp: stamp(12, 3))
        let receiver = joined(old, third)
        for time: UInt64 in [11, 13] {  // the sender's write before, then after, the third site's
            var new = old
            try new.set(.key("x"), to: 2, stamp: stamp(time, 1))
            let d = try #require(delta(old, new))
            expectJoinsLikeTheWholeState(receiver, d, new)
            let after = joined(receiver, d)
            #expect(after.value(at: .key("x")) == (time == 11 ? 3 : 2))
            // Site 3's entry stays either way: an unset of x by site 1 would not remove it.
            var unset = after
            _ = try unset.unset(.key("x"), stamp: stamp(14, 1))
            #expect(joined(unset, third).value(at: .key("x")) == nil)  // site 1 had seen it
            var late = new
            _ = try late.unset(.key("x"), stamp: stamp(14, 1))
            #expect(joined(late, after).value(at: .key("x")) == 3)  // site 1 had not
        }
    }

    /// An unset, an increment and a counter restart carried by a delta give what the whole state
    /// gives, one delta per write and one delta for all three, also to a receiver holding a
    /// concurrent increment and a concurrent write.
    @Test func anUnsetAnIncrementAndARestartJoinLikeTheWholeState() throws {
        var s0 = DocumentState()
        s0.merge(fields: ["a": "keep?", "b": true, "m": ["x": 1, "y": 2]], stamp: stamp(10, 1))
        try s0.increment(.key("n"), by: 5, stamp: stamp(11, 1))
        var other = s0
        try other.increment(.key("n"), by: 7, stamp: stamp(12, 2))
        try other.set(path("m.z"), to: "z", stamp: stamp(13, 2))
        let receivers = [s0, joined(s0, other)]

        var s1 = s0
        _ = try s1.unset(.key("a"), stamp: stamp(14, 1))
        var s2 = s1
        try s2.increment(.key("n"), by: 3, stamp: stamp(15, 1))
        var s3 = s2
        try s3.set(.key("n"), to: 100, stamp: stamp(16, 1))  // a counter restart
        var s4 = s3
        _ = try s4.unset(path("m.x"), stamp: stamp(17, 1))
        let states = [s0, s1, s2, s3, s4]

        var pending: StateDelta? = nil
        for i in 1..<states.count {
            let single = try #require(delta(states[i - 1], states[i]))
            let composed = try #require(delta(states[i - 1], states[i], previous: pending))
            pending = composed
            #expect(composed.base == s0.writes)
            for receiver in receivers {
                expectJoinsLikeTheWholeState(joined(receiver, states[i - 1]), single, states[i])
                expectJoinsLikeTheWholeState(receiver, composed, states[i])
            }
        }
        let final = joined(receivers[1], try #require(pending))
        #expect(final == joined(receivers[1], s4))
        #expect(final.materialize(id: id) == ["_id": "d1", "b": true, "m": ["y": 2, "z": "z"], "n": 107])
    }

    /// A receiver that missed an intermediate write does not cover the base of the next one's
    /// delta; the delta of both writes since what it holds it does cover.
    @Test func aReceiverThatMissedAWriteDoesNotCoverTheBase() throws {
        var s0 = DocumentState()
        try s0.set(.key("x"), to: 1, stamp: stamp(10, 1))
        var s1 = s0
        try s1.set(.key("y"), to: 2, stamp: stamp(11, 1))
        var s2 = s1
        try s2.set(.key("z"), to: 3, stamp: stamp(12, 1))
        let first = try #require(delta(s0, s1))
        let second = try #require(delta(s1, s2))
        #expect(!s0.covers(base: second.base))  // it misses y
        #expect(s1.covers(base: second.base))
        let both = try #require(delta(s1, s2, previous: first))
        #expect(both.base == first.base)
        expectJoinsLikeTheWholeState(s0, both, s2)
        #expect(joined(s0, both).materialize(id: id) == ["_id": "d1", "x": 1, "y": 2, "z": 3])
    }

    /// A write of another site stamped below what the receiver holds reaches the sender late, and
    /// the sender writes after merging it: the base names that site above what the receiver holds.
    @Test func aLateWriteOfAThirdSiteIsInTheBase() throws {
        var s0 = DocumentState()
        try s0.set(.key("x"), to: 1, stamp: stamp(20, 1))
        var third = DocumentState()
        try third.set(.key("t"), to: "late", stamp: stamp(15, 3))
        let receiver = s0  // holds site 1's write at 20, not site 3's at 15
        let old = joined(s0, third)
        var new = old
        try new.set(.key("y"), to: 2, stamp: stamp(21, 1))
        let d = try #require(delta(old, new))
        #expect(!receiver.covers(base: d.base))
        #expect(joined(receiver, third).covers(base: d.base))
        expectJoinsLikeTheWholeState(joined(receiver, third), d, new)
    }

    /// Default data is stamped at time zero, which a context does not vouch for: no delta has a
    /// base naming it, and no state covers such a base.
    @Test func aBaseWithTimeZeroIsNeitherMadeNorCovered() throws {
        var defaults = DocumentState()
        #expect(defaults.admitsDefaultData(at: .key("x"), site: 1))
        try defaults.set(.key("x"), to: 0, stamp: Stamp(time: .zero, site: 1))
        #expect(defaults.writes == [1: .zero])
        var new = defaults
        try new.set(.key("y"), to: 1, stamp: stamp(10, 1))
        #expect(delta(defaults, new) == nil)
        #expect(delta(DocumentState(), new) == nil)  // nothing before: the whole state is the delta
        var removed = new
        removed.remove(stamp: stamp(11, 1))
        #expect(delta(new, removed) == nil)

        let full = joined(new, defaults)
        #expect(!full.covers(base: [1: .zero]))
        #expect(!full.covers(base: [1: HLCTimestamp(millis: 10, logical: 0), 2: .zero]))
        #expect(!full.covers(base: [:]))
        #expect(full.covers(base: [1: HLCTimestamp(millis: 10, logical: 0)]))
        #expect(!full.covers(base: [1: HLCTimestamp(millis: 10, logical: 1)]))
    }

    // MARK: Counterexamples found by the property test (StateDeltaPropertyTests), each failing
    // before its fix

    /// Default data written after the base does not move any context: a receiver that covers the
    /// base need not hold it, and a delta that left its field out would never bring it. Site 1
    /// writes a, then default data b (its write vector stays at a's stamp); site 2 merges that and
    /// writes c; a receiver holding site 1's state before b covers the base. So no delta is made
    /// from or to a state holding anything at time zero: the whole state goes.
    @Test func noDeltaIsMadeAroundDefaultData() throws {
        var s0 = DocumentState()
        try s0.set(.key("a"), to: 1, stamp: stamp(10, 1))
        var s1 = s0
        #expect(s1.admitsDefaultData(at: .key("b"), site: 1))
        try s1.set(.key("b"), to: "default", stamp: Stamp(time: .zero, site: 1))
        #expect(s1.writes == s0.writes)
        var new = s1  // site 2's state: site 1's merged
        try new.set(.key("c"), to: 2, stamp: stamp(20, 2))
        #expect(s0.covers(base: s1.writes.merging(s1.removed) { max($0, $1) }))
        #expect(delta(s1, new) == nil)
        #expect(delta(s0, s1) == nil)
    }

    /// An eviction stub covers the base of a delta of its document in its contexts, but the
    /// delta's join would leave the stub's other fields withheld, where the whole state restores
    /// them (rule 8). A state that withholds values does not take deltas.
    @Test func aStubTakesNoDelta() throws {
        var old = DocumentState()
        try old.set(.key("a"), to: 1, stamp: stamp(10, 1))
        let stub = old.evictionStub()
        var new = old
        try new.set(.key("b"), to: 2, stamp: stamp(11, 1))
        let d = try #require(delta(old, new))
        #expect(stub.withheldEntryCount == 1)
        #expect(!stub.covers(base: d.base))
        #expect(old.covers(base: d.base))
    }

    /// A field gone from the new state (its remove context reaped after an unset), or gone since
    /// the previous delta's base, went by a context no delta of the other fields carries: none is
    /// made. Nor is one made from or to a state that withholds a value, wherever it sits.
    @Test func noDeltaIsMadeWhenAFieldIsGoneOrAValueWithheld() throws {
        var old = DocumentState()
        try old.set(.key("a"), to: 1, stamp: stamp(10, 1))
        try old.set(.key("x"), to: 2, stamp: stamp(10, 1))
        try old.set(.key("z"), to: 3, stamp: stamp(10, 1))
        var new = old
        _ = try new.unset(.key("x"), stamp: stamp(11, 1))
        try new.set(.key("a"), to: 4, stamp: stamp(12, 1))
        #expect(delta(old, new) != nil)
        var reaped = new
        reaped.reapRemovedFields(before: HLCTimestamp(millis: 100, logical: 0))
        #expect(reaped.root["x"] == nil)
        #expect(delta(old, reaped) == nil)
        // Gone since the previous delta's base: the previous delta carried "x".
        let previous = try #require(delta(old, new))
        var later = reaped
        try later.set(.key("z"), to: 5, stamp: stamp(13, 1))
        #expect(delta(reaped, later) != nil)
        #expect(delta(reaped, later, previous: previous) == nil)
        // A withheld value, in the old state or the new one, at the root or below it.
        var nested = old
        try nested.set(FieldPath(components: [.key("m"), .key("k")]), to: 1, stamp: stamp(14, 1))
        var stub = nested.evictionStub()
        #expect(stub.withheldEntryCount > 0)
        var written = stub
        try written.set(.key("a"), to: 6, stamp: stamp(15, 1))
        #expect(delta(stub, written) == nil)
        stub = nested
        try stub.set(.key("b"), to: 7, stamp: stamp(16, 1))
        #expect(delta(nested, stub) != nil)
    }

    /// Two writes with one stamp (a restored backup or a cloned data directory; DATA-MODEL.md
    /// rule 3): a receiver holding the other write's value covers the base of the sender's next
    /// delta, which leaves the field out, so the delta does not decide between the two; the
    /// receiver keeps its value until a whole state of that field meets it. Deltas, like the
    /// dot-store rule, assume a site never issues one stamp twice (DELTAS.md, "What a delta
    /// assumes"). This test pins that behaviour down.
    @Test func equalStampsInAFieldTheDeltaLeavesOutAreNotDecidedByIt() throws {
        var s0 = DocumentState()
        try s0.set(.key("b"), to: 1, stamp: stamp(5, 2))
        var original = s0
        var clone = s0
        try original.set(.key("a"), to: "original", stamp: stamp(10, 1))
        try clone.set(.key("a"), to: "clone", stamp: stamp(10, 1))
        let both = joined(original, clone)
        // The sender is the one whose value the join keeps.
        let (sender, receiver) = both == joined(original, original) ? (original, clone) : (clone, original)
        var new = sender
        try new.set(.key("c"), to: 3, stamp: stamp(11, 1))
        let d = try #require(delta(sender, new))
        #expect(receiver.covers(base: d.base))
        #expect(joined(receiver, d).value(at: .key("a")) == receiver.value(at: .key("a")))
        #expect(joined(receiver, new).value(at: .key("a")) == sender.value(at: .key("a")))
    }

    // MARK: Encoding

    func sample() throws -> (delta: StateDelta, new: DocumentState) {
        var old = DocumentState()
        old.merge(fields: ["a": 1, "m": ["x": "y"]], stamp: stamp(10, 1))
        try old.set(.key("b"), to: 2, stamp: stamp(11, 2))
        var new = old
        try new.increment(.key("n"), by: 3, stamp: stamp(12, 1))
        return (try #require(delta(old, new)), new)
    }

    @Test func aDeltaReadsBackFromItsBytes() throws {
        let (d, new) = try sample()
        let bytes = d.encoded()
        #expect(bytes.first == 0x84)  // the compact form
        #expect(StateDelta.isEncoded(bytes))
        #expect(try StateDelta(bytes: bytes) == d)
        #expect(StateDelta.digest(in: bytes) == StateDigest(new.cbor()))
        #expect(d.digest.bytes.count == 16)
        #expect(StateDigest(bytes: d.digest.bytes[...]) == d.digest)
        // The old form, as builds before the compact form stored and sent it, still reads.
        let old = d.encodedInOldForm()
        #expect(old.starts(with: [0xA3, 0x61, 0x62]))
        #expect(StateDelta.isEncoded(old))
        #expect(try StateDelta(bytes: old) == d)
        #expect(StateDelta.digest(in: old) == d.digest)
        #expect(bytes.count < old.count - 40, "\(bytes.count) against \(old.count)")
    }

    /// The compact form writes the sample's times as differences below its reference, 12 ms:
    /// the base's 10 and 11 ms as 2 and 1 ms below it, and leaves out `a` (equal to `w`).
    @Test func theCompactFormWritesTimesBelowItsReference() throws {
        let (d, _) = try sample()
        let reference = HLCTimestamp(millis: 12, logical: 0)
        let value = try CBOR.decode(d.encoded())
        guard case .array(let parts) = value, parts.count == 4, case .map(let state) = parts[2] else {
            Issue.record("not [R, base, state, h]: \(value)")
            return
        }
        #expect(parts[0] == .int(Int64(reference.rawValue)))
        #expect(parts[1] == [[0, 4], [1, 2]])  // 2 · whole milliseconds below R
        #expect(state["v"] == nil && state["a"] == nil)
        #expect(state["w"] == [[0, 0], [1, 2]])
        #expect(state["s"] == [1, 2])
        #expect(parts[3] == .bytes(d.digest.bytes))
    }

    /// The `-compact` seeds of the fuzz corpus were written from PROTOCOL.md by an independent
    /// encoder (scripts/compact_delta.py) from their old-form neighbours: Trellis writes exactly
    /// those bytes for the same deltas, and reads them to the same deltas.
    @Test func theCompactFormIsWhatAnIndependentEncoderWrites() throws {
        let corpus = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("Fuzz/FuzzDocumentState/Corpus")
        for name in ["delta-one-field", "delta-two-sites-counter-map"] {
            let old = try #require(FileManager.default.contents(atPath: corpus.appendingPathComponent(name).path))
            let compact = try #require(
                FileManager.default.contents(atPath: corpus.appendingPathComponent(name + "-compact").path))
            let delta = try StateDelta(bytes: Array(old))
            #expect(delta.encoded() == Array(compact), "\(name)")
            #expect(try StateDelta(bytes: Array(compact)) == delta, "\(name)")
        }
    }

    /// A state whose `a` differs from its `w` writes it, empty or not.
    @Test func theCompactFormWritesAddsThatDifferFromTheWriteVector() throws {
        var old = DocumentState()
        old.merge(fields: ["a": 1, "b": 2], stamp: stamp(10, 1))
        var new = old
        try new.unset(.key("b"), stamp: stamp(11, 1))
        let d = try #require(delta(old, new))
        #expect(d.state.adds != d.state.writes)
        guard case .array(let parts) = try CBOR.decode(d.encoded()), case .map(let state) = parts[2] else {
            Issue.record("not [R, base, state, h]")
            return
        }
        #expect(state["a"] == [[0, 2]])
        #expect(try StateDelta(bytes: d.encoded()) == d)
        var empty = d
        empty.state.adds = [:]
        guard case .array(let emptyParts) = try CBOR.decode(empty.encoded()), case .map(let emptyState) = emptyParts[2]
        else {
            Issue.record("not [R, base, state, h]")
            return
        }
        #expect(emptyState["a"] == [])
        #expect(try StateDelta(bytes: empty.encoded()) == empty)
    }

    /// A delta the compact form cannot hold (an empty base, time 0 in it, a base above the
    /// state's context) is written in the old form, and reads back as it did.
    @Test func deltasTheCompactFormCannotHoldAreWrittenInTheOldForm() throws {
        let (d, _) = try sample()
        var unusual: [StateDelta] = []
        for base: VersionVector in [[:], [1: .zero], [1: HLCTimestamp(millis: 10, logical: 0), 2: .zero]] {
            var other = d
            other.base = base
            unusual.append(other)
        }
        for delta in unusual {
            let bytes = delta.encoded()
            #expect(bytes == delta.encodedInOldForm())
            #expect(try StateDelta(bytes: bytes) == delta)
        }
        var above = d
        above.base = [1: HLCTimestamp(millis: 13, logical: 0)]
        #expect(above.encoded() == above.encodedInOldForm())
        // A time at or above 2⁶² (the year 4200).
        var far = DocumentState()
        far.merge(fields: ["a": 1], stamp: Stamp(time: HLCTimestamp(rawValue: 1 << 62), site: 1))
        var farther = far
        farther.merge(fields: ["a": 2], stamp: Stamp(time: HLCTimestamp(rawValue: (1 << 62) + 1), site: 1))
        let farDelta = try #require(delta(far, farther))
        #expect(farDelta.encoded() == farDelta.encodedInOldForm())
        #expect(try StateDelta(bytes: farDelta.encoded()) == farDelta)
    }

    /// ``CompactTime`` reads back what it writes, in its shortest writing, and nothing else.
    @Test func compactTimesReadBackAndRefuseTheRest() {
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        print("StateDeltaTests.compactTimesReadBackAndRefuseTheRest seed=\(seed) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        let r = HLCTimestamp(millis: 1_800_000_000_000, logical: 3)
        #expect(CompactTime.written(r, below: r) == 0)
        #expect(CompactTime.written(HLCTimestamp(millis: 1_799_999_990_000, logical: 3), below: r) == 20_000)
        #expect(CompactTime.written(HLCTimestamp(millis: 1_800_000_000_000, logical: 1), below: r) == 5)
        #expect(CompactTime.written(HLCTimestamp(rawValue: r.rawValue + 1), below: r) == -1)
        for _ in 0..<10_000 {
            let reference = HLCTimestamp(rawValue: UInt64.random(in: 1..<(1 << 62), using: &random))
            let t: HLCTimestamp
            switch Int.random(in: 0..<4, using: &random) {
            case 0: t = HLCTimestamp(rawValue: UInt64.random(in: 0...reference.rawValue, using: &random))
            case 1:
                t = HLCTimestamp(rawValue: reference.rawValue - min(reference.rawValue, reference.rawValue & 0xFFFF))
            case 2:
                let millis = UInt64.random(in: 0...(reference.rawValue >> 16), using: &random)
                t = HLCTimestamp(rawValue: reference.rawValue - (millis << 16))
            default: t = HLCTimestamp(rawValue: UInt64.random(in: 0...min(reference.rawValue, 1 << 20), using: &random))
            }
            let n = CompactTime.written(t, below: reference)
            #expect(n >= 0)
            #expect(CompactTime.read(n, below: reference) == t, "\(t) below \(reference) written \(n)")
            let junk = Int64(bitPattern: random.next() >> UInt64.random(in: 0...63, using: &random))
            if let read = CompactTime.read(junk, below: reference) {
                #expect(CompactTime.written(read, below: reference) == junk)
            }
        }
        // Not the shortest writing (odd, whole milliseconds), below 0, and too many milliseconds.
        #expect(CompactTime.read(2 << 16 | 1, below: r) == nil)
        #expect(CompactTime.read(Int64(r.rawValue >> 16) * 2 + 2, below: r) == nil)
        #expect(CompactTime.read(-1, below: r) == nil)
        #expect(CompactTime.read(-2, below: r) == nil)
        #expect(CompactTime.read(1 << 49, below: HLCTimestamp(rawValue: .max)) == nil)
        #expect(
            CompactTime.read(.max, below: HLCTimestamp(rawValue: .max))
                == HLCTimestamp(rawValue: .max - ((1 << 62) - 1)))
        #expect(!CompactTime.canWrite(below: HLCTimestamp(rawValue: 1 << 62)))
        #expect(CompactTime.read(0, below: .zero) == .zero)
    }

    /// `digest(in:)` reads only the delta form.
    @Test func theDigestIsReadOnlyFromADelta() throws {
        let (d, new) = try sample()
        #expect(StateDelta.digest(in: d.encoded()) == d.digest)
        #expect(StateDelta.digest(in: new.cbor()) == nil)
        #expect(StateDelta.digest(in: SingleWriteState(stamp: stamp(10, 1), json: "{\"a\":1}").encoded()) == nil)
        #expect(StateDelta.digest(in: []) == nil)
        #expect(StateDelta.digest(in: [0xA3, 0x61, 0x62]) == nil)
        #expect(StateDelta.digest(in: [0x84]) == nil)
        #expect(StateDelta.digest(in: Array(d.encoded().dropLast())) == nil)
        #expect(StateDelta.digest(in: d.encodedInOldForm()) == d.digest)
        #expect(StateDelta.digest(in: Array(d.encodedInOldForm().dropLast())) == nil)
        #expect(!StateDelta.isEncoded(new.cbor()))
    }

    /// The bytes of a delta with the parts given as values (`d` the state's own value by default).
    func bytes(b: Value, d: Value? = nil, h: Value = .bytes(Array(repeating: 7, count: 16))) throws -> [UInt8] {
        let (sample, _) = try sample()
        return CBOR.encode(["b": b, "d": try d ?? CBOR.decode(sample.state.cbor()), "h": h])
    }

    func row(_ site: Int64, _ millis: UInt64) -> Value {
        [.int(site), .int(Int64(HLCTimestamp(millis: millis, logical: 0).rawValue))]
    }

    @Test func refusedDeltasThrowAnError() throws {
        let (d, _) = try sample()
        // Built from the same parts, the bytes are the delta's own (in the old form).
        #expect(try bytes(b: [row(1, 10), row(2, 11)], h: .bytes(d.digest.bytes)) == d.encodedInOldForm())
        #expect(throws: Never.self) { try StateDelta(bytes: self.bytes(b: [row(1, 10), row(2, 11)])) }
        let refused: [(bytes: [UInt8], reason: String)] = [
            (try bytes(b: [row(1, 13)]), "above the delta's own context"),
            (try bytes(b: [row(1, 10), row(3, 1)]), "above the delta's own context"),
            (try bytes(b: [row(1, 10), row(1, 10)]), "twice"),
            (try bytes(b: [row(1, 10)], h: .bytes(Array(repeating: 7, count: 15))), "16-byte digest"),
            (try bytes(b: [row(1, 10)], h: .bytes(Array(repeating: 7, count: 17))), "16-byte digest"),
            (try bytes(b: [row(1, 10)], h: "digest"), "16-byte digest"),
            (try bytes(b: [[.int(1)]]), "[site, time]"),
            (try bytes(b: [["x", 10]]), "[site, time]"),
            (try bytes(b: [row(1, 10)], d: ["v": 2]), "no site table"),
            (try bytes(b: [row(1, 10)], d: 5), "not a map"),
            (try bytes(b: .int(1)), "is not {b: base"),
            (CBOR.encode(["b": [], "d": try CBOR.decode(d.state.cbor())]), "is not {b: base"),
            (CBOR.encode([.array([]), 1, 2]), "is not [reference"),  // an array: the compact form
            (d.state.cbor(), "is not {b: base"),
            ([0xA3, 0x61, 0x62], "does not decode"),
            ([], "does not decode"),
        ]
        for (bytes, reason) in refused {
            do {
                let decoded = try StateDelta(bytes: bytes)
                Issue.record("decoded \(decoded) from \(bytes); expected: \(reason)")
            } catch {
                #expect(error.message.contains(reason), "\(error)")
            }
        }
    }

    /// The four parts of the sample's compact bytes, as values.
    func compactParts() throws -> [Value] {
        let (d, _) = try sample()
        guard case .array(let parts) = try CBOR.decode(d.encoded()) else {
            throw DocumentStateError(message: "not an array")
        }
        return parts
    }

    /// The compact bytes with part `i` replaced, or with `state` changed.
    func compact(_ i: Int? = nil, _ part: Value = .null, state change: ((inout UTF8Map<Value>) -> Void)? = nil) throws
        -> [UInt8]
    {
        var parts = try compactParts()
        if let i { parts[i] = part }
        if let change, case .map(var m) = parts[2] {
            change(&m)
            parts[2] = .map(m)
        }
        return CBOR.encode(.array(parts))
    }

    @Test func refusedCompactDeltasThrowAnError() throws {
        let (d, _) = try sample()
        #expect(try compact() == d.encoded())
        // The state written against a reference 1 ms later, with that reference: no time is at it.
        var later = CBORWriter()
        d.state.write(into: &later, d.state.layout(reference: HLCTimestamp(millis: 13, logical: 0)))
        let laterState = try CBOR.decode(later.bytes)
        var laterParts = try compactParts()
        laterParts[0] = .int(Int64(HLCTimestamp(millis: 13, logical: 0).rawValue))
        laterParts[2] = laterState
        laterParts[1] = [[0, 6], [1, 4]]
        let refused: [(bytes: [UInt8], reason: String)] = [
            (CBOR.encode(.array(laterParts)), "not the highest time"),
            (try compact(1, [[1, 0]]), "above the delta's own context"),  // site 2 at 12 ms, w 11 ms
            (try compact(1, [[0, 4], [0, 4]]), "twice"),
            (try compact(1, [[0, 24]]), "no time above 0"),  // 12 ms below R: time 0
            (try compact(1, [[0, 26]]), "no time above 0"),  // below 0
            (try compact(1, [[0, .int(2 << 16 | 1)]]), "no time above 0"),  // not the shortest writing
            (try compact(1, [[0, -1]]), "no time above 0"),
            (try compact(1, [[2, 4]]), "[site index, time difference]"),
            (try compact(1, [[-1, 4]]), "[site index, time difference]"),
            (try compact(1, [[0, 4, 0]]), "[site index, time difference]"),
            (try compact(1, [["x", 4]]), "[site index, time difference]"),
            (try compact(1, []), "base is empty"),
            (try compact(1, .int(1)), "is not [reference > 0"),
            (try compact(0, 0), "is not [reference > 0"),
            (try compact(0, -5), "is not [reference > 0"),
            (try compact(0, "x"), "is not [reference > 0"),
            (try compact(0, .int(Int64(HLCTimestamp(millis: 1, logical: 0).rawValue))), "no time above 0"),
            (try compact(3, .bytes(Array(repeating: 7, count: 15))), "16-byte digest"),
            (try compact(2, .int(5)), "not a map"),
            (try compact(2, ["v": 2]), "no site table"),
            (try compact(state: { $0["v"] = 2 }), "unknown part 'v'"),
            (try compact(state: { $0["w"] = [[0, 26]] }), "time difference below"),
            (try compact(state: { $0["w"] = [[0, 0], [1, 2], [2, 0]] }), "bad site index"),
            (CBOR.encode(.array(Array(try compactParts().prefix(3)))), "is not [reference > 0"),
            (CBOR.encode(.array(try compactParts() + [0])), "is not [reference > 0"),
            ([0x84], "does not decode"),
        ]
        for (bytes, reason) in refused {
            do {
                let decoded = try StateDelta(bytes: bytes)
                Issue.record("decoded \(decoded) from \(bytes); expected: \(reason)")
            } catch {
                #expect(error.message.contains(reason), "\(error)")
            }
        }
    }

    /// Every cut and every one-byte change of a delta's bytes, in either form, decodes or
    /// throws: never a trap; what decodes reads back from its own bytes.
    @Test(arguments: [false, true]) func mangledBytesNeverTrap(oldForm: Bool) throws {
        let (d, _) = try sample()
        let bytes = oldForm ? d.encodedInOldForm() : d.encoded()
        for n in 0..<bytes.count {
            #expect(throws: DocumentStateError.self) { try StateDelta(bytes: Array(bytes[..<n])) }
            _ = StateDelta.digest(in: Array(bytes[..<n]))
        }
        for i in bytes.indices {
            for flip: UInt8 in [0x01, 0x20, 0x80, 0xFF] {
                var mangled = bytes
                mangled[i] ^= flip
                if let decoded = try? StateDelta(bytes: mangled) {
                    #expect(try StateDelta(bytes: decoded.encoded()) == decoded)
                }
                _ = StateDelta.digest(in: mangled)
            }
        }
    }
}
