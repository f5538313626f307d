import Testing

@testable import TrellisCore

/// `trellis simulate --replay 4100041 --nodes 3-6 --steps 120 --ttl 120000`, reduced: a field's
/// remove context at time zero (it covers a site's default data, and is never reaped) was absorbed
/// by a later context entry of the same site (contexts join per site by maximum), and reaping that
/// entry dropped the cover of the default with it. So reaping did not commute with the join: a
/// replica that merged and then reaped held no context, one that merged an already reaped state
/// kept `{X: 0}`, and the two never agreed (docs/DATA-MODEL.md, "Why states agree").
///
/// Fixed by protocol 5: the cover of a site's default is kept apart (`FieldNode.removedDefaults`,
/// joined by union, never reaped), and an entry above zero covers no default.
@Suite struct TimeZeroContextReapTests {
    let x: SiteID = 0xA  // the site that wrote default data
    let b: SiteID = 0xB
    let c: SiteID = 0xC

    func at(_ millis: UInt64, _ site: SiteID) -> Stamp {
        Stamp(time: HLCTimestamp(millis: millis, logical: 0), site: site)
    }

    @Test func reapingALaterContextEntryKeepsTheCoverOfTheSitesDefault() throws {
        // X writes default data v = 0 at (0, X); B overwrites it at 10 (context {X: 0}).
        let defaults = DocumentState(fields: ["v": 0], stamp: Stamp(time: .zero, site: x))
        var overB = defaults
        try overB.set(.key("v"), to: 1, stamp: at(10, b))
        #expect(overB.root.entries["v"]?.removed == [x: .zero])
        // X writes v = 2 at 20, having seen that: the field's context still names X at zero.
        var overX = overB
        try overX.set(.key("v"), to: 2, stamp: at(20, x))
        #expect(overX.root.entries["v"]?.removed[x] == .zero)
        // C overwrites X's write at 30: its context names X at 20, and keeps the cover of X's
        // default apart.
        var overC = overX
        try overC.set(.key("v"), to: 3, stamp: at(30, c))
        #expect(overC.root.entries["v"]?.removed[x] == HLCTimestamp(millis: 20, logical: 0))
        #expect(overC.root.entries["v"]?.removedDefaults == [x])
        #expect(try DocumentState(bytes: overC.cbor()) == overC, "the cover apart travels as the field's `z`")

        let horizon = HLCTimestamp(millis: 25, logical: 0)
        func reaped(_ state: DocumentState) -> DocumentState {
            var out = state
            out.reapRemovedFields(before: horizon)
            return out
        }
        // n3 of the seed: holds C's state, merges X's, reaps (a store reaps whatever it writes).
        var mergedThenReaped = overC
        mergedThenReaped.merge(overX)
        mergedThenReaped.reapRemovedFields(before: horizon)
        // n2 of the seed: holds X's state (reaped: the time-zero entry stays), merges a reaped copy.
        var reapedThenMerged = reaped(overX)
        reapedThenMerged.merge(reaped(overC))

        #expect(mergedThenReaped.value(at: .key("v")) == 3)
        #expect(reapedThenMerged.value(at: .key("v")) == 3)
        // Failed before protocol 5: [:] against [X: 0], the cover of X's default went with the
        // reaped entry {X: 20}. Now both keep it apart: [X: 20] reaped to [X: 0].
        #expect(mergedThenReaped.root.entries["v"]?.removed == reapedThenMerged.root.entries["v"]?.removed)
        #expect(mergedThenReaped == reapedThenMerged)
        // And what it is for: a stale state that still holds X's default brought it back into one
        // replica's state and not into the other's.
        var staleIntoFirst = mergedThenReaped
        staleIntoFirst.merge(defaults)
        var staleIntoSecond = reapedThenMerged
        staleIntoSecond.merge(defaults)
        #expect(staleIntoFirst == staleIntoSecond)
        // What a user saw: D, on the replica without the cover, overwrites v at 50 and unsets it
        // at 60; its contexts are reaped. The replica that took the stale default back then showed
        // the removed default again, the other nothing.
        var d = mergedThenReaped
        let dx: SiteID = 0xD
        try d.set(.key("v"), to: 4, stamp: at(50, dx))
        _ = try d.unset(.key("v"), stamp: at(60, dx))
        d.reapRemovedFields(before: HLCTimestamp(millis: 65, logical: 0))
        var first = staleIntoFirst
        first.merge(d)
        var second = staleIntoSecond
        second.merge(d)
        #expect(second.value(at: .key("v")) == nil)
        #expect(first.value(at: .key("v")) == second.value(at: .key("v")))  // failed: 0 against nil
    }

    /// Observed-remove for default data: a remove covers the defaults it held, not a default its
    /// site wrote concurrently. X wrote `m.z` at 10; B, holding that, unsets `m`; X, not having
    /// seen the unset, writes default data at `m.x`. Before protocol 5, B's context `{X: 10}` at
    /// `m` also covered X's default; now X's default survives the unset, as a concurrent write
    /// would.
    @Test func aRemoveCoversOnlyTheDefaultsItHeld() throws {
        var xState = DocumentState(fields: ["m": ["z": 1]], stamp: at(10, x))
        var bState = xState
        _ = try bState.unset(.key("m"), stamp: at(20, b))
        #expect(bState.root.entries["m"]?.removed == [x: HLCTimestamp(millis: 10, logical: 0)])
        let path = FieldPath(components: [.key("m"), .key("x")])
        #expect(xState.admitsDefaultData(at: path, site: x))
        try xState.set(path, to: 0, stamp: Stamp(time: .zero, site: x))
        for (first, second) in [(xState, bState), (bState, xState)] {
            var merged = first
            merged.merge(second)
            #expect(merged.value(at: .key("m")) == ["x": 0])
            merged.reapRemovedFields(before: HLCTimestamp(millis: 30, logical: 0))
            #expect(merged.value(at: .key("m")) == ["x": 0])
        }
    }

    /// A write that replaces a map covers each default it held in the default's own field, and
    /// those covers outlive the TTL: a stale copy of the defaults does not bring them back, merged
    /// before or after the contexts above zero were reaped.
    @Test func aReplacedMapCoversEveryDefaultItHeldWhereItIs() throws {
        let defaults = DocumentState(fields: ["m": ["x": 1, "y": 2]], stamp: Stamp(time: .zero, site: x))
        var state = defaults
        try state.set(.key("m"), to: 5, stamp: at(10, b))
        let m = try #require(state.root.entries["m"])
        #expect(m.removed == [x: .zero])
        #expect(m.map.entries["x"]?.removed == [x: .zero])
        #expect(m.map.entries["y"]?.removed == [x: .zero])
        _ = try state.unset(.key("m"), stamp: at(20, b))
        let horizon = HLCTimestamp(millis: 30, logical: 0)
        var reapedFirst = state
        reapedFirst.reapRemovedFields(before: horizon)
        reapedFirst.merge(defaults)
        reapedFirst.reapRemovedFields(before: horizon)
        var mergedFirst = state
        mergedFirst.merge(defaults)
        mergedFirst.reapRemovedFields(before: horizon)
        #expect(reapedFirst == mergedFirst)
        #expect(reapedFirst.value(at: .key("m")) == nil)
        #expect(reapedFirst.root.entries["m"]?.removed == [x: .zero])
        // The covers travel: encoded and decoded, the state is the same.
        #expect(try DocumentState(bytes: reapedFirst.cbor()) == reapedFirst)
    }
}
