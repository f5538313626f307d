import Testing
import TrellisTestKit

@testable import TrellisCore

/// The scenarios of docs/DATA-MODEL.md and of the replication review (model/scen1.py–scen3.py),
/// each with the value the rules give.
@Suite struct DocumentStateScenarioTests {
    let id: Value = "d1"
    let siteA: SiteID = 0xA
    let siteB: SiteID = 0xB
    let siteC: SiteID = 0xC

    func at(_ millis: UInt64, _ site: SiteID) -> Stamp {
        Stamp(time: HLCTimestamp(millis: millis, logical: 0), site: site)
    }

    func joined(_ states: DocumentState...) -> DocumentState {
        var out = DocumentState()
        for s in states { out.merge(s) }
        return out
    }

    func contains(_ bytes: [UInt8], _ text: String) -> Bool {
        let needle = Array(text.utf8)
        guard bytes.count >= needle.count else { return false }
        return (0...(bytes.count - needle.count)).contains { bytes[$0..<($0 + needle.count)].elementsEqual(needle) }
    }

    // MARK: Removed fields and the causal context

    /// A field unset and its remove context reaped: a state that still holds the field's old
    /// entry does not bring it back (the unsetter's write vector shows it saw the entry), and a
    /// write that state made which the unsetter never saw survives.
    @Test func aReapedUnsetDoesNotComeBackFromAStaleState() throws {
        var a = DocumentState(fields: ["x": "old", "keep": 1], stamp: at(10, siteA))
        var stale = a
        try stale.set(.key("y"), to: "away", stamp: at(12, siteB))
        _ = try a.unset(.key("x"), stamp: at(20, siteA))
        #expect(a.root.entries["x"]?.removed == [siteA: HLCTimestamp(millis: 10, logical: 0)])
        let early = a.reapRemovedFields(before: HLCTimestamp(millis: 10, logical: 0))
        #expect(!early)  // not older yet
        let due = a.reapRemovedFields(before: HLCTimestamp(millis: 11, logical: 0))
        #expect(due)
        #expect(a.root.entries["x"] == nil)
        let expected: Value = ["_id": "d1", "keep": 1, "y": "away"]
        #expect(joined(a, stale).materialize(id: id) == expected)
        #expect(joined(stale, a).materialize(id: id) == expected)
        #expect(joined(a, stale) == joined(stale, a))
        // The reaped state absorbs the unreaped one it came from: after reaping again, no change.
        var again = a
        again.merge(
            try DocumentState(fields: ["x": "old", "keep": 1], stamp: at(10, siteA)).unsetting("x", at(20, siteA)))
        again.reapRemovedFields(before: HLCTimestamp(millis: 11, logical: 0))
        #expect(again == a)
    }

    /// Default data (time zero) is left alone by the causal context and kept apart from its site's
    /// later entry in the field, so it meets the same fate in every order of joins: a later entry
    /// of its site that a third state saw and dropped does not take the default with it (only a
    /// remove context covers a default); a site that overwrites its own default records that in
    /// the field's remove context at time zero.
    @Test func aDefaultMeetsTheSameRemoveInEveryOrderOfJoins() throws {
        let x = DocumentState(fields: ["f": 1], stamp: Stamp(time: .zero, site: siteA))
        let y = DocumentState(fields: ["f": 2], stamp: at(10, siteA))
        let z = DocumentState(fields: ["g": 3], stamp: at(12, siteA))
        #expect(joined(joined(x, y), z) == joined(x, joined(y, z)))
        #expect(joined(joined(x, y), z).cbor() == joined(x, joined(y, z)).cbor())
        #expect(joined(x, joined(y, z)).materialize(id: id) == ["_id": "d1", "f": 1, "g": 3])
        #expect(joined(joined(x, y), z).materialize(id: id) == ["_id": "d1", "f": 1, "g": 3])
        // The honest history: A overwrites its default at 10 (recording time zero), unsets the
        // field at 12 and reaps the context; joined with a state that saw the overwrite, the
        // default stays covered in every order.
        var own = x
        try own.set(.key("f"), to: 2, stamp: at(10, siteA))
        let overwritten = own
        _ = try own.unset(.key("f"), stamp: at(12, siteA))
        own.reapRemovedFields(before: HLCTimestamp(millis: 13, logical: 0))
        #expect(joined(joined(x, overwritten), own) == joined(x, joined(overwritten, own)))
        #expect(joined(joined(x, overwritten), own).value(at: .key("f")) == nil)
        // A default written after other writes of its site is not dropped by a state whose write
        // vector names that site (it has not seen the default).
        var b = DocumentState(fields: ["g": 1], stamp: at(10, siteB))
        let seen = b
        try b.set(.key("theme"), to: "light", stamp: Stamp(time: .zero, site: siteB))
        #expect(joined(seen, b).value(at: .key("theme")) == "light")
        #expect(joined(b, seen).value(at: .key("theme")) == "light")
    }

    /// Default data written below a map after an eviction records a valued "a map" at the map
    /// (rule 2), kept apart from its site's earlier, withheld "map" entry there ("What a state
    /// holds"): the map stays an (empty) map once the default shows nothing (rule 5), as after a
    /// write stamped by the clock, whether an unset or a later write this node holds no value for
    /// (a peer's stub, rule 8) hides the default.
    @Test func aDefaultWrittenBelowAnEvictedMapKeepsTheMapShowing() throws {
        let defaultStamp = Stamp(time: .zero, site: siteA)
        var a = DocumentState()
        try a.set(path("m.x"), to: true, stamp: at(10, siteA))
        var stub = a.evictionStub()
        #expect(stub.materialize(id: id) == ["_id": "d1"])
        #expect(stub.admitsDefaultData(at: path("m.y"), site: siteA))
        try stub.set(path("m.y"), to: .null, stamp: defaultStamp)
        #expect(stub.materialize(id: id) == ["_id": "d1", "m": ["y": .null]])
        // C wrote m.y later and evicted it: merged, m.y shows nothing and m shows {}.
        var c = DocumentState()
        try c.set(.key("m"), to: ["y": 1], stamp: at(12, siteC))
        let cStub = c.evictionStub()
        let expected: Value = ["_id": "d1", "m": [:]]
        #expect(joined(stub, cStub).materialize(id: id) == expected)
        #expect(joined(cStub, stub) == joined(stub, cStub))
        // A unsets m.y: the same.
        var unset = stub
        _ = try unset.unset(path("m.y"), stamp: at(13, siteA))
        #expect(unset.materialize(id: id) == expected)
        // With a clock stamp instead of the default: the same.
        var stamped = a.evictionStub()
        try stamped.set(path("m.y"), to: .null, stamp: at(11, siteA))
        #expect(joined(stamped, cStub).materialize(id: id) == expected)
        _ = try stamped.unset(path("m.y"), stamp: at(13, siteA))
        #expect(stamped.materialize(id: id) == expected)
    }

    // MARK: Registers

    /// Issue 8 item 11: A and B hold {v:1}; apart, B sets v=2, A sets v=3 and removes d1.
    @Test func anUnseenWriteSurvivesARemoveOfALaterWrite() throws {
        let base = DocumentState(fields: ["v": 1], stamp: at(10, siteA))
        var a = base
        var b = base
        try b.set(.key("v"), to: 2, stamp: at(11, siteB))
        try a.set(.key("v"), to: 3, stamp: at(12, siteA))
        a.remove(stamp: at(13, siteA))
        #expect(a.materialize(id: id) == nil)
        let healed = joined(a, b)
        #expect(healed == joined(b, a))
        #expect(healed.materialize(id: id) == ["_id": "d1", "v": 2])
        #expect(JSON.string(healed.materialize(id: id)!) == #"{"_id":"d1","v":2}"#)
    }

    @Test func aLocalWriteCoversWhatItReplacesSoAFieldUsuallyHoldsOneEntry() throws {
        var a = DocumentState(fields: ["v": 1], stamp: at(10, siteA))
        var b = a
        try b.set(.key("v"), to: 2, stamp: at(11, siteB))
        try a.set(.key("v"), to: 3, stamp: at(11, siteA))
        var both = joined(a, b)
        #expect(both.root["v"]?.entries.count == 2)  // concurrent writes side by side
        #expect(both.value(at: .key("v")) == 2)  // B@11 > A@11
        try both.set(.key("v"), to: 4, stamp: at(12, siteA))
        #expect(both.root["v"]?.entries.count == 1)
        #expect(
            both.root["v"]?.removed == [
                siteA: HLCTimestamp(millis: 11, logical: 0), siteB: HLCTimestamp(millis: 11, logical: 0),
            ])
    }

    // MARK: Ties (item 8)

    @Test func equalStampsWithDifferentValuesConvergeOnTheGreaterEncoding() throws {
        let zero = Stamp(time: .zero, site: siteA)
        let light = DocumentState(fields: ["theme": "light"], stamp: zero)
        let dark = DocumentState(fields: ["theme": "dark"], stamp: zero)
        #expect(joined(light, dark) == joined(dark, light))
        #expect(joined(dark, light).value(at: .key("theme")) == "light")  // 0x65… > 0x64…
        // Longer text encodes with a greater head byte; a proper prefix sorts first.
        let a = DocumentState(fields: ["k": .bytes([1, 2])], stamp: zero)
        let b = DocumentState(fields: ["k": .bytes([1, 2, 0])], stamp: zero)
        #expect(joined(a, b).value(at: .key("k")) == .bytes([1, 2, 0]))
        #expect(joined(b, a) == joined(a, b))
        // Counter totals with one stamp: the greater encoding, on every node.
        var x = DocumentState()
        try x.increment(.key("n"), by: 1, stamp: at(5, siteB))
        var y = DocumentState()
        try y.increment(.key("n"), by: 2, stamp: at(5, siteB))
        #expect(joined(x, y) == joined(y, x))
        #expect(joined(x, y).value(at: .key("n")) == 2)
    }

    @Test func defaultDataIsWrittenOnlyWhereThisSiteNeverWroteOrSawARemove() throws {
        let zero = Stamp(time: .zero, site: siteA)
        var doc = DocumentState(fields: ["theme": "light"], stamp: zero)
        #expect(!doc.admitsDefaultData(at: nil, site: siteA))
        #expect(!doc.admitsDefaultData(at: .key("theme"), site: siteA))  // present
        #expect(doc.admitsDefaultData(at: .key("size"), site: siteA))
        #expect(DocumentState().admitsDefaultData(at: nil, site: siteA))
        // After an evict the stub still names A: writing the default again could give one stamp
        // two values, so it is refused.
        let stub = doc.evictionStub()
        #expect(stub.materialize(id: id) == ["_id": "d1"])
        #expect(!stub.admitsDefaultData(at: nil, site: siteA))
        #expect(!stub.admitsDefaultData(at: .key("theme"), site: siteA))
        // An unset that saw A's default covers A's time zero there.
        _ = try doc.unset(.key("theme"), stamp: at(20, siteB))
        #expect(doc.value(at: .key("theme")) == nil)
        #expect(!doc.admitsDefaultData(at: .key("theme"), site: siteA))
        #expect(doc.admitsDefaultData(at: .key("theme"), site: siteC))
        // A remove that saw A's writes covers A's time zero everywhere.
        var removed = DocumentState(fields: ["x": 1], stamp: at(10, siteA))
        removed.remove(stamp: at(11, siteB))
        #expect(!removed.admitsDefaultData(at: .key("y"), site: siteA))
    }

    // MARK: Counters (item 7)

    /// Item 7a (model/scen1.py): A increments n by 3 and unsets it at A@100; C, whose clock was at
    /// 10, receives it, sets n = 5 and increments by 1: 6 on C and after the merge, everywhere.
    @Test func anUnsetRecordsItsStampAndALaterSetAndIncrementSurvive() throws {
        var aClock = HybridLogicalClock()
        var a = DocumentState()
        try a.increment(.key("n"), by: 3, stamp: Stamp(time: aClock.now(physicalMillis: 10), site: siteA))
        _ = try a.unset(.key("n"), stamp: Stamp(time: aClock.now(physicalMillis: 100), site: siteA))
        #expect(a.writes[siteA] == aClock.last)
        #expect(a.maxTime == aClock.last)
        var cClock = HybridLogicalClock()
        _ = cClock.now(physicalMillis: 10)
        var c = a
        let adopted = cClock.receive(c.maxTime, physicalMillis: 95)
        #expect(adopted)
        try c.set(.key("n"), to: 5, stamp: Stamp(time: cClock.now(physicalMillis: 95), site: siteC))
        try c.increment(.key("n"), by: 1, stamp: Stamp(time: cClock.now(physicalMillis: 96), site: siteC))
        #expect(c.value(at: .key("n")) == 6)
        #expect(joined(a, c).value(at: .key("n")) == 6)
        #expect(joined(c, a).value(at: .key("n")) == 6)
        // A receiver whose clock did not move (stamps C@95, C@96, below the unset) keeps 6 too: the
        // unset wrote no restart that could win.
        var late = a
        try late.set(.key("n"), to: 5, stamp: at(95, siteC))
        try late.increment(.key("n"), by: 1, stamp: at(96, siteC))
        #expect(joined(a, late).value(at: .key("n")) == 6)
    }

    /// Item 7b (model/scen2.py): only the winning restart's seen totals apply: 110.
    @Test func onlyTheWinningRestartsSeenTotalsApply() throws {
        var base = DocumentState()
        try base.increment(.key("n"), by: 5, stamp: at(10, siteB))
        var a = base
        var b = base
        var c = base
        try b.increment(.key("n"), by: 10, stamp: at(13, siteB))  // B's total 15
        c.merge(b)
        try c.set(.key("n"), to: 50, stamp: at(19, siteC))  // seen B = 15
        try a.set(.key("n"), to: 100, stamp: at(20, siteA))  // seen B = 5, wins
        for merged in [joined(a, b, c), joined(c, b, a), joined(b, c, a)] {
            #expect(merged.value(at: .key("n")) == 110)
        }
    }

    /// Item 7c (model/scen3.py): 0.1 + 0.2 + 0.3 from three sites reads the same bits on every
    /// node, whatever order its dictionaries iterate in: ascending site order.
    @Test func counterSumsDoNotDependOnIterationOrder() throws {
        var parts: [DocumentState] = []
        for (site, amount) in [(siteA, 0.1), (siteB, 0.2), (siteC, 0.3)] {
            var s = DocumentState()
            try s.increment(.key("n"), by: .double(amount), stamp: at(10, site))
            parts.append(s)
        }
        let expected = ((0.0 + 0.1) + 0.2) + 0.3
        var outputs = Set<String>()
        for order in [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]] {
            var s = DocumentState()
            for i in order { s.merge(parts[i]) }
            #expect(s.value(at: .key("n")) == .double(expected))
            outputs.insert(JSON.string(s.materialize(id: id)!))
        }
        #expect(outputs == [#"{"_id":"d1","n":0.6000000000000001}"#])
        // The same totals in dictionaries built in different orders and sizes, so they iterate
        // differently: the value does not change.
        var orders = Set<[SiteID]>()
        var values = Set<Value>()
        let totals = [siteA: 0.1, siteB: 0.2, siteC: 0.3].map { ($0.key, $0.value) }
        for capacity in [0, 3, 17, 64] {
            for reversed in [false, true] {
                var node = FieldNode()
                node.totals.reserveCapacity(capacity)
                for (site, amount) in reversed ? totals.reversed() : totals {
                    node.totals[site] = CounterTotal(total: .double(amount), stamp: at(10, site))
                }
                orders.insert(Array(node.totals.keys))
                values.insert(node.part(ContextInForce(document: [:]))!.value!)
            }
        }
        #expect(values == [.double(expected)])
        print("counterSumsDoNotDependOnIterationOrder: \(orders.count) iteration orders, one value")
    }

    /// Item 7d: writing to a document evicted here continues this site's totals (9, not 4).
    @Test func writingToAnEvictionStubContinuesThisSitesTotals() throws {
        var a = DocumentState(fields: ["title": "photo"], stamp: at(1, siteA))
        for i in 0..<5 { try a.increment(.key("likes"), by: 1, stamp: at(2 + UInt64(i), siteA)) }
        var b = a
        try b.increment(.key("likes"), by: 3, stamp: at(10, siteB))
        a.merge(b)
        #expect(a.value(at: .key("likes")) == 8)
        var stub = a.evictionStub()
        #expect(stub.materialize(id: id) == ["_id": "d1", "likes": 8])  // no title: values are dropped
        #expect(!contains(stub.cbor(), "photo"))
        stub.merge(fields: ["title": "again"], stamp: at(20, siteA))
        try stub.increment(.key("likes"), by: 1, stamp: at(21, siteA))
        #expect(joined(stub, b).value(at: .key("likes")) == 9)
        #expect(joined(b, stub).value(at: .key("likes")) == 9)
        // Without the stub, A's total would restart at 1 and replace its 5 everywhere.
        var fresh = DocumentState(fields: ["title": "again"], stamp: at(20, siteA))
        try fresh.increment(.key("likes"), by: 1, stamp: at(21, siteA))
        #expect(joined(fresh, b).value(at: .key("likes")) == 4)
    }

    @Test func mergingTheFullStateIntoAStubRestoresItExactly() throws {
        var full = DocumentState(fields: ["a": "x", "m": ["k": [1, 2]], "e": [:]], stamp: at(10, siteA))
        try full.increment(.key("n"), by: 2, stamp: at(11, siteB))
        try full.set(.key("n"), to: 7, stamp: at(12, siteC))
        let stub = full.evictionStub()
        #expect(stub.materialize(id: id) == ["_id": "d1", "n": 7])
        #expect(joined(stub, full) == full)
        #expect(joined(full, stub) == full)
        #expect(try DocumentState(encoded: CBOR.decode(stub.cbor())) == stub)
        // A field whose winning entry is withheld cannot be incremented or written below.
        #expect(throws: DocumentStateError.self) {
            var s = stub
            try s.increment(.key("a"), by: 1, stamp: at(20, siteA))
        }
        #expect(throws: DocumentStateError.self) {
            var s = stub
            try s.set(path("a.b"), to: 1, stamp: at(20, siteA))
        }
        var s = stub
        try s.set(path("m.j"), to: 1, stamp: at(20, siteA))  // m is a (withheld) map
        #expect(s.materialize(id: id) == ["_id": "d1", "n": 7, "m": ["j": 1]])
    }

    /// Item 7e: a removed document re-created as {"_id":"d1","n":1} reads back an int.
    @Test func aRestartKeepsTheNumberWrittenExactly() throws {
        var a = DocumentState()
        try a.increment(.key("n"), by: 2, stamp: at(10, siteA))
        a.remove(stamp: at(11, siteA))
        a.merge(fields: ["n": 1], stamp: at(12, siteA))
        #expect(JSON.string(a.materialize(id: id)!) == #"{"_id":"d1","n":1}"#)
        var b = DocumentState()
        try b.increment(.key("n"), by: 2, stamp: at(10, siteA))
        try b.set(.key("n"), to: 1, stamp: at(11, siteA))  // a restart
        #expect(b.value(at: .key("n")) == .int(1))
        try b.set(.key("n"), to: 1.0, stamp: at(12, siteA))
        #expect(b.value(at: .key("n")) == .double(1))
        try b.increment(.key("n"), by: 1, stamp: at(13, siteA))
        #expect(b.value(at: .key("n")) == .double(2))
    }

    @Test func integerCountersStayExactUntilADoubleArrives() throws {
        var a = DocumentState(fields: ["n": 2], stamp: at(10, siteA))
        var b = a
        try a.increment(.key("n"), by: 1, stamp: at(11, siteA))
        try b.increment(.key("n"), by: 4, stamp: at(11, siteB))
        #expect(joined(a, b).value(at: .key("n")) == .int(7))
        try b.increment(.key("n"), by: 0.5, stamp: at(12, siteB))
        #expect(joined(a, b).value(at: .key("n")) == .double(7.5))
        // 2^53 + 1 is exact as an int, not as a double.
        var big = DocumentState()
        try big.increment(.key("n"), by: .int(1 << 53), stamp: at(1, siteA))
        try big.increment(.key("n"), by: 1, stamp: at(2, siteA))
        #expect(big.value(at: .key("n")) == .int((1 << 53) + 1))
    }

    @Test func overflowIsAnErrorLocallyAndADoubleSumWhenSitesAddUp() throws {
        var a = DocumentState()
        try a.increment(.key("n"), by: .int(.max), stamp: at(1, siteA))
        #expect(throws: DocumentStateError.self) { try a.increment(.key("n"), by: 1, stamp: at(2, siteA)) }
        #expect(throws: DocumentStateError.self) {
            var d = DocumentState()
            try d.increment(.key("n"), by: .double(.greatestFiniteMagnitude), stamp: at(1, siteA))
            try d.increment(.key("n"), by: .double(.greatestFiniteMagnitude), stamp: at(2, siteA))
        }
        var b = DocumentState()
        try b.increment(.key("n"), by: .int(.max), stamp: at(1, siteB))
        #expect(joined(a, b).value(at: .key("n")) == .double(Double(Int64.max) + Double(Int64.max)))
        try b.increment(.key("n"), by: .int(.min), stamp: at(3, siteB))  // back to -1
        #expect(joined(a, b).value(at: .key("n")) == .int(.max - 1))
    }

    /// docs/DATA-MODEL.md, "Normal form": removed totals subtract also while a restart wins.
    @Test func aRestartConcurrentWithAnUnsetDoesNotReviveWhatTheUnsetRemoved() throws {
        var base = DocumentState()
        try base.increment(.key("n"), by: 3, stamp: at(10, siteC))
        var b = base
        try b.set(.key("n"), to: 100, stamp: at(12, siteB))  // saw C = 3
        var c = base
        try c.increment(.key("n"), by: 2, stamp: at(11, siteC))  // C = 5
        var a = c
        _ = try a.unset(.key("n"), stamp: at(13, siteA))  // saw C = 5
        #expect(joined(a, b).value(at: .key("n")) == 100)
        try c.increment(.key("n"), by: 1, stamp: at(14, siteC))  // C = 6
        #expect(joined(a, b, c).value(at: .key("n")) == 101)
        #expect(joined(c, b, a).value(at: .key("n")) == 101)
    }

    @Test func anIncrementConcurrentWithAnUnsetCountsOnlyItself() throws {
        var base = DocumentState()
        try base.increment(.key("n"), by: 4, stamp: at(10, siteB))
        var a = base
        var b = base
        _ = try a.unset(.key("n"), stamp: at(11, siteA))
        try b.increment(.key("n"), by: 2, stamp: at(12, siteB))
        #expect(joined(a, b).value(at: .key("n")) == 2)
        // A string written over the counter replaces it the same way.
        var c = base
        try c.set(.key("n"), to: "text", stamp: at(11, siteA))
        #expect(joined(c, b).value(at: .key("n")) == 2)  // B@12 is later than the string
    }

    /// Review L3: whether a field shows a counter is decided under the context in force.
    @Test func aCounterCoveredByARemoveIsNoCounterAnyMore() throws {
        var a = DocumentState()
        try a.increment(.key("n"), by: 5, stamp: at(10, siteA))
        a.remove(stamp: at(11, siteA))
        a.merge(fields: ["x": 1], stamp: at(12, siteA))
        try a.increment(.key("n"), by: 1, stamp: at(13, siteA))
        #expect(a.value(at: .key("n")) == 1)
        // Under an unset parent map too.
        var m = DocumentState()
        try m.increment(path("m.n"), by: 5, stamp: at(10, siteA))
        _ = try m.unset(.key("m"), stamp: at(11, siteA))
        try m.set(path("m.n"), to: 3, stamp: at(12, siteA))  // a value, not a restart
        #expect(m.root["m"]?.map["n"]?.entries[siteA]?.content == .value(3))
        try m.increment(path("m.n"), by: 1, stamp: at(13, siteA))
        #expect(m.value(at: path("m.n")) == 4)
    }

    /// Review L4: `set("m", {"n": 100})` restarts a nested counter as `set("m.n", 100)` does.
    @Test func settingAMapRestartsTheCountersInIt() throws {
        var base = DocumentState()
        try base.increment(path("m.n"), by: 1, stamp: at(10, siteA))
        for write in [0, 1, 2] {
            var a = base
            switch write {
            case 0: try a.set(.key("m"), to: ["n": 100], stamp: at(20, siteA))
            case 1: try a.set(path("m.n"), to: 100, stamp: at(20, siteA))
            default: a.merge(fields: ["m": ["n": 100]], stamp: at(20, siteA))
            }
            var b = base
            try b.increment(path("m.n"), by: 1, stamp: at(21, siteB))  // concurrent, later
            #expect(joined(a, b).value(at: path("m.n")) == 101, "write \(write)")
        }
    }

    // MARK: Removed data (item 17)

    @Test func tombstonesAndUnsetFieldsKeepNoValues() throws {
        let secret = "hunter2-secret-password"
        let body = "the private body of a message to alice"
        var doc = DocumentState(
            fields: ["password": .string(secret), "body": .string(body), "to": "alice"], stamp: at(10, siteA))
        try doc.increment(.key("views"), by: 3, stamp: at(11, siteB))
        var unset = doc
        _ = try unset.unset(.key("password"), stamp: at(12, siteA))
        #expect(!contains(unset.cbor(), secret))
        #expect(contains(unset.cbor(), body))
        var tombstone = doc
        tombstone.remove(stamp: at(13, siteA))
        for bytes in [tombstone.cbor(), joined(tombstone, doc).cbor(), joined(doc, tombstone).cbor()] {
            #expect(!contains(bytes, secret) && !contains(bytes, body) && !contains(bytes, "alice"))
        }
        // What a tombstone keeps: the vectors and, for the counter, B's total as removed.
        #expect(tombstone.root.entries.keys.sorted() == ["views"])
        #expect(tombstone.root["views"]?.removedTotals[siteB]?.total == 3)
        #expect(tombstone.adds.isEmpty && tombstone.isDeleted)
        // A map whose keys are unset keeps no values either.
        var nested = DocumentState(fields: ["m": ["k": .string(secret)]], stamp: at(10, siteA))
        _ = try nested.unset(path("m.k"), stamp: at(11, siteA))
        #expect(!contains(nested.cbor(), secret))
        #expect(nested.materialize(id: id) == ["_id": "d1", "m": [:]])
    }

    // MARK: Keys are byte strings (item 10)

    /// "é" as U+00E9 and as "e" + U+0301: canonically equivalent, different bytes.
    static let nfc = "\u{E9}"
    static let nfd = "e\u{301}"

    /// Two replicas write the two spellings concurrently, at the top level and inside a map: every
    /// merge order gives the same state, the same CBOR bytes and the same JSON bytes, with two
    /// fields wherever both spellings were written.
    @Test func concurrentWritesToTheTwoSpellingsOfAKeyStayTwoFields() throws {
        let (nfc, nfd) = (Self.nfc, Self.nfd)
        let base = DocumentState(fields: ["m": [:]], stamp: at(10, siteA))
        var a = base
        var b = base
        try a.set(.key(nfc), to: 1, stamp: at(11, siteA))
        try b.set(.key(nfd), to: 2, stamp: at(11, siteB))
        a.merge(fields: ["m": [nfc: "a"]], stamp: at(12, siteA))
        b.merge(fields: ["m": [nfd: "b"]], stamp: at(12, siteB))
        let ab = joined(a, b)
        let ba = joined(b, a)
        #expect(ab == ba)
        #expect(ab.cbor() == ba.cbor())
        #expect(try DocumentState(encoded: CBOR.decode(ab.cbor())) == ab)
        #expect(ab.cbor() == CBOR.encode(ab.referenceEncoding))
        #expect(contains(ab.cbor(), nfc) && contains(ab.cbor(), nfd))

        let document = try #require(ab.materialize(id: id))
        #expect(document == ba.materialize(id: id))
        #expect(document.mapValue?.count == 4)  // _id, m and the two spellings
        #expect(document[nfc] == 1 && document[nfd] == 2)
        #expect(document["m"]?.mapValue?.count == 2)
        #expect(document["m"]?[nfc] == "a" && document["m"]?[nfd] == "b")
        #expect(ab.value(at: .key(nfc)) == 1 && ab.value(at: .key(nfd)) == 2)

        // JSON keys in byte order: "_id", "e" U+0301 (0x65…), "m", U+00E9 (0xC3…).
        let json = JSON.string(document)
        let expected = #"{"_id":"d1","\#(nfd)":2,"m":{"\#(nfd)":"b","\#(nfc)":"a"},"\#(nfc)":1}"#
        #expect(Array(json.utf8) == Array(expected.utf8))
        #expect(Array(JSON.string(try #require(ba.materialize(id: id))).utf8) == Array(expected.utf8))
        #expect(try JSON.parse(json) == document)
        #expect(try CBOR.decode(CBOR.encode(document)) == document)
    }

    /// One replica writes one spelling after the other: two fields; unsetting one leaves the other.
    @Test func writingOneSpellingLeavesTheOtherAlone() throws {
        let (nfc, nfd) = (Self.nfc, Self.nfd)
        var doc = DocumentState(fields: [nfc: 1], stamp: at(10, siteA))
        doc.merge(fields: [nfd: 2], stamp: at(11, siteA))
        try doc.increment(.key(nfd), by: 1, stamp: at(12, siteA))
        try doc.set(FieldPath(components: [.key("m"), .key(nfc)]), to: "x", stamp: at(13, siteA))
        #expect(doc.materialize(id: id) == ["_id": "d1", nfc: 1, nfd: 3, "m": [nfc: "x"]])
        #expect(try doc.unset(.key(nfc), stamp: at(14, siteA)))
        #expect(!(try doc.unset(FieldPath(components: [.key("m"), .key(nfd)]), stamp: at(15, siteA))))
        #expect(doc.materialize(id: id) == ["_id": "d1", nfd: 3, "m": [nfc: "x"]])
        #expect(try DocumentState(encoded: CBOR.decode(doc.cbor())) == doc)
    }
}

extension DocumentState {
    /// This state with the field `key` unset at `stamp`.
    fileprivate func unsetting(_ key: String, _ stamp: Stamp) throws -> DocumentState {
        var out = self
        _ = try out.unset(.key(key), stamp: stamp)
        return out
    }
}
