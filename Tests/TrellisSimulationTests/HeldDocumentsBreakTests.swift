import Testing
import Trellis
import TrellisSimulation

/// Ways a query subscriber comes to hold a document state its peers do not keep up to date,
/// found by a reviewer after the refetch-tombstone fix (db7e59b). Each test fails on that commit,
/// except those marked "Control", scenarios that held up. The last two (a collapse, a relayed
/// whole-collection subscription that ended) failed until the store kept what a peer holds from
/// a whole-collection service (`whole_held`, DocumentStore+Scope.swift).
@Suite struct HeldDocumentsBreakTests {
    typealias Held = HeldDocumentsSimulationTests

    /// P (no subscription of its own) writes d9 {v: 6} while alone and evicts it at once: the
    /// write has reached no peer, so the stub keeps the whole state and is still offered to peers.
    /// N then subscribes to `v >= 5` at P: P's first page of that subscription (tracked as served
    /// only now, after the eviction) sends the stub's state, which matches; N holds d9 {v: 6} and
    /// acknowledges it (P's stub drops its values). P's app writes d9 {v: 3}, starting from the
    /// stub. N must get it: the change takes d9 out of its query. Observed: a write over a stub
    /// records nothing (the stub's old value is unknown), and the eviction recorded d9 under no
    /// subscription (none was served yet), so P never sends d9 to N, which keeps v: 6. W, a whole
    /// subscriber, joins at the end so the invariants have a reference.
    @Test func aWriteOverAStubSentUnderAQueryServedAfterTheEvictionReachesTheSubscriber() throws {
        let sim = try Simulation(seed: 9101)
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        let w = try sim.addNode("w")
        try p.store.collection("items").upsert(["_id": "d9", "v": 6])
        #expect(try p.store.collection("items").findByID("d9").evict())
        let high = try Held.subscribe(n, "v >= 5")
        sim.connect(n, p)
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d9")?["v"] == 6)
        try p.store.collection("items").upsert(["_id": "d9", "v": 3])
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d9")?["v"] == 3)
        let wSub = try Held.subscribe(w)
        sim.connect(w, p)
        try sim.runUntilQuiet()
        try sim.check()
        high.cancel()
        wSub.cancel()
    }

    /// An app subscription whose query happens to end like a refetch subscription's
    /// (`... && _id IN $args.trellisEvicted`, with that argument a list) was taken for one: the
    /// sender did not track it as served, so when d9 left it nothing was sent and N kept d9
    /// {v: 6}. The argument name is now reserved: such a subscription is refused with a clear
    /// error, and the same query under another argument name is kept up to date.
    @Test func anAppSubscriptionShapedLikeARefetchIsKeptUpToDate() throws {
        let sim = try Simulation(seed: 9103)
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        let pSub = try Held.subscribe(p)
        let items = n.store.collection("items")
        #expect(throws: ReservedArgumentError.self) {
            try items.find("v >= 5 && _id IN $args.trellisEvicted", args: ["trellisEvicted": ["d8", "d9"]])
                .subscribe()
        }
        let shaped = try items.find("v >= 5 && _id IN $args.wanted", args: ["wanted": ["d8", "d9"]]).subscribe()
        sim.connect(n, p)
        try p.store.collection("items").upsert(["_id": "d9", "v": 6])
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d9")?["v"] == 6)
        _ = try p.store.collection("items").findByID("d9").update { $0?["v"].set(.int(3)) }
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d9")?["v"] == 3)
        try sim.check()
        shaped.cancel()
        pSub.cancel()
    }

    /// Control (holds on db7e59b): the fixed scenario through a pure relay. N — R — P, P a whole
    /// subscriber. N held d9 through a whole subscription, cancelled it and evicted d9; P removes
    /// d9 (R, relaying nothing then, keeps d9 live). N subscribes to `v >= 5`: its refetch goes
    /// through R to P and brings the tombstone back; P writes d9 again as {v: 3}: N must get it.
    @Test func aTombstoneARefetchBroughtThroughARelayIsKeptUpToDate() throws {
        let sim = try Simulation(seed: 9104)
        let p = try sim.addNode("p")
        let r = try sim.addNode("r")
        let n = try sim.addNode("n")
        let pSub = try Held.subscribe(p)
        let whole = try Held.subscribe(n)
        sim.connect(n, r)
        sim.connect(r, p)
        try p.store.collection("items").upsert(["_id": "d9", "v": 2])
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d9")?["v"] == 2)
        whole.cancel()
        try sim.runUntilQuiet()
        #expect(try n.store.collection("items").findByID("d9").evict())
        _ = try p.store.collection("items").findByID("d9").remove()
        try sim.runUntilQuiet()
        let high = try Held.subscribe(n, "v >= 5")
        try sim.runUntilQuiet()
        try p.store.collection("items").upsert(["_id": "d9", "v": 3])
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d9")?["v"] == 3)
        try sim.check()
        high.cancel()
        pSub.cancel()
    }

    /// Refetch subscriptions count toward `maxAskedSubscriptions` (here 2, so the scenario stays
    /// small; by default 1,024): N held the whole collection, cancelled it, evicted d1 and d9 and
    /// subscribes to two queries, `v >= 5` and `v < 0`. With the refetches they do not fit, and
    /// the collection collapses into the whole one, whose refetch brings back both evicted
    /// documents, d1 {v: 2} too, which matches neither query; P answers, the refetch ends, and N
    /// asks its two queries again, holding d1. P sets d1's `v` to 3: N must get it (it holds d1),
    /// but P records nothing for what a whole-collection subscription (or a refetch) sends, and N
    /// keeps v: 2. (Before the refetch of an evicted document ended once a peer answered it, the
    /// collapse lasted as long as N ran, and brought every document.)
    @Test func aCollapseCausedByRefetchesLeavesNoDocumentStale() throws {
        let sim = try Simulation(seed: 9105)
        sim.replicatorConfiguration = { $0.maxAskedSubscriptions = 2 }
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        let pSub = try Held.subscribe(p)
        let whole = try Held.subscribe(n)
        sim.connect(n, p)
        try p.store.collection("items").upsert(["_id": "d1", "v": 2])
        try p.store.collection("items").upsert(["_id": "d9", "v": 6])
        try sim.runUntilQuiet()
        whole.cancel()
        try sim.runUntilQuiet()
        #expect(try n.store.collection("items").findByID("d1").evict())
        #expect(try n.store.collection("items").findByID("d9").evict())
        let high = try Held.subscribe(n, "v >= 5")
        let low = try Held.subscribe(n, "v < 0")
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d9")?["v"] == 6)
        _ = try p.store.collection("items").findByID("d1").update { $0?["v"].set(.int(3)) }
        try sim.runUntilQuiet()
        if try Held.get(n, "d1") != nil { #expect(try Held.get(n, "d1")?["v"] == 3) }
        try sim.check()
        high.cancel()
        low.cancel()
        pSub.cancel()
    }

    /// P — R — N. R subscribes to `v >= 5` and relays N's whole-collection subscription, so it
    /// stores every document that passes for N: d1 {v: 2}, outside its own query. N cancels its
    /// subscription (nothing is relayed through R any more); P sets d1's `v` to 3. R holds d1 and
    /// is a query subscriber: it must get the change, or not hold d1. Observed: P records d1
    /// under no subscription of R's (R relayed a whole-collection one), R keeps v: 2. (The docs
    /// exempt what a subscriber holds through a subscription it cancelled itself; they say nothing
    /// of one it relayed.)
    @Test func aQuerySubscriberThatRelayedAWholeSubscriptionIsKeptUpToDate() throws {
        let sim = try Simulation(seed: 9106)
        let p = try sim.addNode("p")
        let r = try sim.addNode("r")
        let n = try sim.addNode("n")
        let pSub = try Held.subscribe(p)
        let high = try Held.subscribe(r, "v >= 5")
        let whole = try Held.subscribe(n)
        sim.connect(p, r)
        sim.connect(r, n)
        try p.store.collection("items").upsert(["_id": "d1", "v": 2])
        try sim.runUntilQuiet()
        #expect(try Held.get(n, "d1")?["v"] == 2)
        #expect(try Held.get(r, "d1")?["v"] == 2)
        whole.cancel()
        try sim.runUntilQuiet()
        _ = try p.store.collection("items").findByID("d1").update { $0?["v"].set(.int(3)) }
        try sim.runUntilQuiet()
        #expect(try Held.get(r, "d1")?["v"] == 3)
        try sim.check()
        high.cancel()
        pSub.cancel()
    }

    /// Control (holds on db7e59b): P — R — M. R subscribes to `v >= 5`, gets d9 {v: 6} from P,
    /// cancels and evicts d9 (no subscription is active, so nothing is asked again). M then
    /// subscribes to `v >= 5` through R, which must not leave M without d9.
    @Test func aSubscriptionRelayedThroughANodeThatEvictedGetsTheDocument() throws {
        let sim = try Simulation(seed: 9107)
        let p = try sim.addNode("p")
        let r = try sim.addNode("r")
        let m = try sim.addNode("m")
        let pSub = try Held.subscribe(p)
        let rHigh = try Held.subscribe(r, "v >= 5")
        sim.connect(p, r)
        sim.connect(r, m)
        try p.store.collection("items").upsert(["_id": "d9", "v": 6])
        try sim.runUntilQuiet()
        #expect(try Held.get(r, "d9")?["v"] == 6)
        rHigh.cancel()
        try sim.runUntilQuiet()
        #expect(try r.store.collection("items").findByID("d9").evict())
        try sim.runUntilQuiet()
        let mHigh = try Held.subscribe(m, "v >= 5")
        try sim.runUntilQuiet()
        #expect(try Held.get(m, "d9")?["v"] == 6)
        try sim.check()
        mHigh.cancel()
        pSub.cancel()
    }
}
