import Testing
import Trellis
import TrellisSimulation

/// A node that held a whole collection and now asks only queries there (its app narrowed, or it
/// relayed a whole-collection subscription that ended) is kept up to date on every document it
/// holds from that subscription, and is sent nothing born after it (docs/MESH.md, "Leaving a
/// subscription's scope"). Each test but the last fails without the store's `whole_held` record.
@Suite struct WholeHeldSimulationTests {
    typealias Held = HeldDocumentsSimulationTests

    /// P writes d1 {v: 2}, d2 {v: 3} and d3 {v: 6}; N subscribes to the whole collection.
    func wholeThenNarrowed(seed: UInt64) throws -> (Simulation, p: SimulatedNode, n: SimulatedNode, [Subscription]) {
        let sim = try Simulation(seed: seed)
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        let pSub = try Held.subscribe(p)
        let whole = try Held.subscribe(n)
        sim.connect(n, p)
        for (id, v) in [("d1", 2), ("d2", 3), ("d3", 6)] {
            try p.store.collection("items").upsert(["_id": .string(id), "v": .int(Int64(v))])
        }
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d1")?["v"] == 2)
        return (sim, p, n, [pSub, whole])
    }

    /// N narrows from the whole collection to `v >= 5`: P's change to d1 and removal of d2, both
    /// outside the query, reach N; d4, written after, does not.
    @Test func aNodeThatNarrowsFromTheWholeCollectionStaysUpToDate() throws {
        let (sim, p, n, subs) = try wholeThenNarrowed(seed: 9201)
        let high = try Held.subscribe(n, "v >= 5")
        subs[1].cancel()
        try sim.runUntilQuiet()
        try Held.set(p, "d1", 4)
        _ = try p.store.collection("items").findByID("d2").remove()
        try p.store.collection("items").upsert(["_id": "d4", "v": 1])
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d1")?["v"] == 4)
        #expect(try Held.get(n, "d2") == nil)
        #expect(try n.documents.changes(in: "items", after: 0, limit: 100, maxBytes: .max).records.count == 3)
        #expect(try Held.get(n, "d4") == nil)
        try sim.check()
        high.cancel()
        subs[0].cancel()
    }

    /// N narrows while apart from P, and P restarts before they meet again: the record of the
    /// whole-collection service is in P's store, and the change P made meanwhile reaches N.
    @Test func theRecordOutlivesARestartAndTheSession() throws {
        let (sim, p, n, subs) = try wholeThenNarrowed(seed: 9202)
        sim.partition([[p], [n]])
        let high = try Held.subscribe(n, "v >= 5")
        subs[1].cancel()
        try Held.set(p, "d1", 4)
        sim.crash(p)
        try sim.restart(p)
        try sim.runUntilQuiet()
        sim.heal()
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d1")?["v"] == 4)
        try Held.set(p, "d1", 5)
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d1")?["v"] == 5)
        try sim.check()
        high.cancel()
        subs[0].cancel()
    }

    /// N asks nothing at P for a while after its whole-collection subscription, then a query: the
    /// changes made in between to what it holds come with the query.
    @Test func aQueryMadeLaterBringsTheChangesMadeInBetween() throws {
        let (sim, p, n, subs) = try wholeThenNarrowed(seed: 9203)
        subs[1].cancel()
        try sim.runUntilQuiet()
        try Held.set(p, "d2", 1)
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d2")?["v"] == 3)  // asks nothing: not kept up to date
        let low = try Held.subscribe(n, "v < 0")
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d2")?["v"] == 1)
        try sim.check()
        low.cancel()
        subs[0].cancel()
    }

    /// N narrows before its whole-collection sync is over: its `v >= 5` subscription (matching
    /// nothing) had already read past P's change to d0, which N holds from the first pages, while
    /// the whole-collection subscription had not reached it. The query subscription must read
    /// again from where the whole-collection one stood, or N keeps d0's first state. (Fails with
    /// the record alone: the query subscription must also read a page as soon as the whole-collection
    /// one goes, and move its cursor back.)
    @Test func aNarrowingBeforeTheWholeSyncEndsLeavesNothingStale() throws {
        let sim = try Simulation(seed: 9205)
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        let pSub = try Held.subscribe(p)
        for chunk in stride(from: 0, to: 3_000, by: 500) {
            try p.store.collection("items").upsert(
                (chunk..<(chunk + 500)).map {
                    ["_id": .string("d\($0)"), "v": .int(1), "pad": .string(String(repeating: "x", count: 200))]
                })
        }
        // A slow link: the whole collection takes about eight seconds to arrive.
        sim.setProfile(LinkProfile(latency: 5, bytesPerSecond: 100_000), between: n, and: p)
        let high = try Held.subscribe(n, "v >= 5")
        let whole = try Held.subscribe(n)
        sim.connect(n, p)
        sim.run(for: 3_200)
        #expect(try Held.get(n, "d0")?["v"] == 1)
        #expect(try Held.get(n, "d2999") == nil)
        try Held.set(p, "d0", 2)
        sim.run(for: 300)
        whole.cancel()
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d0")?["v"] == 2)
        try sim.check()
        high.cancel()
        pSub.cancel()
    }

    /// Cost: once N acknowledged the changes to what it holds through its query subscription, a
    /// new query subscription of N's resends none of them (before its acknowledgements moved the
    /// record on, each new query subscription resent every held document changed since the
    /// narrowing: the whole collection, in time).
    @Test func aNewQueryAfterTheChangesArrivedResendsNothing() throws {
        let (sim, p, n, subs) = try wholeThenNarrowed(seed: 9206)
        let high = try Held.subscribe(n, "v >= 5")
        subs[1].cancel()
        try sim.runUntilQuiet()
        try Held.set(p, "d1", -1)
        try Held.set(p, "d2", -2)
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d2")?["v"] == -2)
        let before = sim.documentsSent
        let other = try Held.subscribe(n, "v == 71")
        try sim.runUntilQuiet()
        #expect(sim.documentsSent - before == 0)
        try Held.set(p, "d1", -3)
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d1")?["v"] == -3)
        try sim.check()
        other.cancel()
        high.cancel()
        subs[0].cancel()
    }

    /// Cost: N narrows, then P changes one held document at a time, twenty times: each change is
    /// sent once per query subscription of N's (here one), and nothing else goes.
    @Test func eachChangeToAHeldDocumentGoesOnce() throws {
        let (sim, p, n, subs) = try wholeThenNarrowed(seed: 9204)
        let high = try Held.subscribe(n, "v >= 5")
        subs[1].cancel()
        try sim.runUntilQuiet()
        let before = sim.documentsSent
        for v in 10..<30 {
            try Held.set(p, "d1", Int64(-v))
            try sim.runUntilQuiet()
        }
        #expect(sim.documentsSent - before == 20)
        #expect(try Held.get(n, "d1")?["v"] == -29)
        high.cancel()
        subs[0].cancel()
    }
}
