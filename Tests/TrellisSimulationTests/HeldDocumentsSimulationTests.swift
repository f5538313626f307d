import Testing
import Trellis
import TrellisSimulation

/// What a query subscriber holds outside its query stays up to date (docs/MESH.md, "Leaving a
/// subscription's scope"; PROTOCOL.md §2 step 5): documents it wrote before it subscribed, through
/// relays, and across subscription changes, its own and its relays'. Written by a reviewer trying
/// to break the first version (which only noted a sender served nothing at all, and asked it
/// again from the start each time): the relay scenarios and the per-cycle costs failed then.
@Suite struct HeldDocumentsSimulationTests {
    static func get(_ node: SimulatedNode, _ id: String, in collection: String = "items") throws -> Document? {
        try node.store.collection(collection).findByID(.string(id)).exec()
    }

    static func set(_ node: SimulatedNode, _ id: String, _ v: Int64) throws {
        _ = try node.store.collection("items").findByID(.string(id)).update { $0?["v"].set(.int(v)) }
    }

    static func subscribe(_ node: SimulatedNode, _ query: String = "true") throws -> Subscription {
        try node.store.collection("items").find(query).subscribe()
    }

    /// `node` writes d9 {v: 2}, and the mesh goes quiet.
    static func writeD9(_ sim: Simulation, on node: SimulatedNode) throws {
        try node.store.collection("items").upsert(["_id": "d9", "v": 2])
        try sim.runUntilQuiet()
    }

    /// `source` sets d9's `v`; once the mesh is quiet, `holder` must hold that value.
    static func expectChange(
        _ sim: Simulation, at source: SimulatedNode, reaches holder: SimulatedNode, v: Int64,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        try set(source, "d9", v)
        try sim.runUntilQuiet()
        #expect(try get(holder, "d9")?["v"] == .int(v), sourceLocation: sourceLocation)
    }

    /// Control: N — R — P, R a pure relay (no subscription), P a whole subscriber. N writes d9
    /// {v: 2} before it subscribes; it reaches P through R. N subscribes to `v >= 5`; P changes
    /// d9. N holds d9 (it wrote it), so it must get v: 3.
    @Test func aDocumentWrittenBehindAPureRelayComesBackChanged() throws {
        let sim = try Simulation(seed: 9001)
        let p = try sim.addNode("p")
        let r = try sim.addNode("r")
        let n = try sim.addNode("n")
        var subs: [Subscription] = []
        subs.append(try Self.subscribe(p))
        sim.connect(n, r)
        sim.connect(r, p)
        try Self.writeD9(sim, on: n)
        #expect(try Self.get(p, "d9")?["v"] == 2)
        subs.append(try Self.subscribe(n, "v >= 5"))
        try sim.runUntilQuiet()
        try Self.expectChange(sim, at: p, reaches: n, v: 3)
        try sim.check()
        _ = subs
    }

    /// N — P, M — N. M subscribes to `v < 0` (N relays it to P). N writes d9 {v: 2} before it
    /// subscribes; P (whole subscriber) merges it while it serves N M's relayed `v < 0`, so P
    /// records d9 under `v < 0` and notes nothing. N subscribes to `v >= 5`. M then leaves (its
    /// subscription is no longer relayed). P changes d9: N, which wrote d9 before it subscribed,
    /// must get the change.
    @Test func aRelayedSubscriptionThatEndsHandsItsRecordsOn() throws {
        let sim = try Simulation(seed: 9002)
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        let m = try sim.addNode("m")
        var subs: [Subscription] = []
        subs.append(try Self.subscribe(p))
        let mSub = try Self.subscribe(m, "v < 0")
        sim.connect(n, p)
        sim.connect(m, n)
        try sim.runUntilQuiet()
        try Self.writeD9(sim, on: n)
        #expect(try Self.get(p, "d9")?["v"] == 2)
        subs.append(try Self.subscribe(n, "v >= 5"))
        try sim.runUntilQuiet()
        mSub.cancel()
        try sim.runUntilQuiet()
        try Self.expectChange(sim, at: p, reaches: n, v: 3)
        try sim.check()
        _ = subs
    }

    /// Same, but M keeps its subscription and simply goes away (crash, never back). What M's
    /// subscription recorded goes to N's own (docs/PROTOCOL.md §2 step 5).
    @Test func aRelayedSubscriberThatVanishesHandsItsRecordsOn() throws {
        let sim = try Simulation(seed: 9003)
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        let m = try sim.addNode("m")
        var subs: [Subscription] = []
        subs.append(try Self.subscribe(p))
        subs.append(try Self.subscribe(m, "v < 0"))
        sim.connect(n, p)
        sim.connect(m, n)
        try sim.runUntilQuiet()
        try Self.writeD9(sim, on: n)
        subs.append(try Self.subscribe(n, "v >= 5"))
        try sim.runUntilQuiet()
        sim.crash(m)
        try sim.runUntilQuiet()
        try Self.expectChange(sim, at: p, reaches: n, v: 3)
        try sim.check()
        _ = subs
    }

    /// N — R — P. R is a whole subscriber (so P serves R the whole collection when d9 passes
    /// through: nothing recorded at P, only a note). N subscribes to `v >= 5` (R relays it to
    /// P). R then cancels its own whole subscription (it stays a relay for N): P asks R again from
    /// the note. P changes d9: N gets it.
    @Test func aWholeRelayThatNarrowsKeepsTheWriterUpToDate() throws {
        let sim = try Simulation(seed: 9004)
        let p = try sim.addNode("p")
        let r = try sim.addNode("r")
        let n = try sim.addNode("n")
        var subs: [Subscription] = []
        subs.append(try Self.subscribe(p))
        let rSub = try Self.subscribe(r)
        sim.connect(n, r)
        sim.connect(r, p)
        try Self.writeD9(sim, on: n)
        #expect(try Self.get(p, "d9")?["v"] == 2)
        subs.append(try Self.subscribe(n, "v >= 5"))
        try sim.runUntilQuiet()
        rSub.cancel()
        try sim.runUntilQuiet()
        try Self.expectChange(sim, at: p, reaches: n, v: 3)
        try sim.check()
        _ = subs
    }

    /// N — R — P. R subscribes to `v < 0` (a query, so P records d9 under R's `v < 0` as it
    /// passes through R, and notes nothing). N subscribes to `v >= 5` later; R cancels `v < 0`:
    /// its records go to the relayed `v >= 5`.
    @Test func aQueryRelayThatCancelsKeepsTheWriterUpToDate() throws {
        let sim = try Simulation(seed: 9005)
        let p = try sim.addNode("p")
        let r = try sim.addNode("r")
        let n = try sim.addNode("n")
        var subs: [Subscription] = []
        subs.append(try Self.subscribe(p))
        let rSub = try Self.subscribe(r, "v < 0")
        sim.connect(n, r)
        sim.connect(r, p)
        try sim.runUntilQuiet()
        try Self.writeD9(sim, on: n)
        #expect(try Self.get(p, "d9")?["v"] == 2)
        subs.append(try Self.subscribe(n, "v >= 5"))
        try sim.runUntilQuiet()
        rSub.cancel()
        try sim.runUntilQuiet()
        try Self.expectChange(sim, at: p, reaches: n, v: 3)
        try sim.check()
        _ = subs
    }

    /// Direct, two nodes: P (whole) merges N's d9 (noted). P cancels its subscription before N
    /// subscribes, so P cannot ask N again: the note stays. P's app changes d9, and N does not
    /// hear of it (nothing told P since that N holds d9: docs/MESH.md). Once P subscribes again,
    /// it takes the note and asks N again, and P's next change reaches N.
    @Test func theNoteWaitsUntilTheNodeAsksAgain() throws {
        let sim = try Simulation(seed: 9006)
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        var subs: [Subscription] = []
        let pSub = try Self.subscribe(p)
        sim.connect(n, p)
        try Self.writeD9(sim, on: n)
        #expect(try Self.get(p, "d9")?["v"] == 2)
        pSub.cancel()
        try sim.runUntilQuiet()
        subs.append(try Self.subscribe(n, "v >= 5"))
        try sim.runUntilQuiet()
        try Self.set(p, "d9", 3)
        try sim.runUntilQuiet()
        // P asks N nothing in `items`: nothing tells P again that N holds d9 (docs/MESH.md), but
        // the note stays, untaken.
        #expect(try Self.get(n, "d9")?["v"] == 2)
        // P subscribes again (whole): the note is taken, d9 comes again, recorded.
        subs.append(try Self.subscribe(p))
        try sim.runUntilQuiet()
        try Self.expectChange(sim, at: p, reaches: n, v: 4)
        try sim.check()
        _ = subs
    }

    /// P asks N only for a query (`v >= 5` relayed... here P's own query `v >= 5` after its whole
    /// subscription): N's d9 {v: 2} came under P's whole subscription; when N subscribes, P
    /// asks again only for `v >= 5`, which does not return d9.
    @Test func aNodeThatNarrowsItsOwnSubscriptionStillHearsOfTheWriters() throws {
        let sim = try Simulation(seed: 9007)
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        let w = try sim.addNode("w")
        var subs: [Subscription] = []
        let pSub = try Self.subscribe(p)
        subs.append(try Self.subscribe(w))
        sim.connect(n, p)
        try Self.writeD9(sim, on: n)
        #expect(try Self.get(p, "d9")?["v"] == 2)
        subs.append(try Self.subscribe(p, "v >= 5"))
        pSub.cancel()
        try sim.runUntilQuiet()
        subs.append(try Self.subscribe(n, "v >= 5"))
        try sim.runUntilQuiet()
        // W (whole) joins P and changes d9.
        sim.connect(w, p)
        try sim.runUntilQuiet()
        try Self.expectChange(sim, at: p, reaches: n, v: 3)
        try sim.check()
        _ = subs
    }

    /// Cost: N writes only, and opens a `v >= 5` subscription for a while then cancels it, again
    /// and again, writing one document outside the query between. The first opening makes P ask
    /// N for what it sent (500 documents); each later one only for what came after the note's
    /// checkpoint (the first version asked for everything each time: 501, 502, 503…).
    @Test func aToggledSubscriptionResendsOnlyWhatWasWrittenBetween() throws {
        let sim = try Simulation(seed: 9008)
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        var subs: [Subscription] = []
        subs.append(try Self.subscribe(p))
        sim.connect(n, p)
        try n.store.collection("items").upsert((0..<500).map { ["_id": .string("d\($0)"), "v": .int(Int64($0 % 5))] })
        try sim.runUntilQuiet()
        var perCycle: [Int] = []
        for cycle in 0..<5 {
            let before = sim.documentsSent
            let sub = try Self.subscribe(n, "v >= 5")
            try sim.runUntilQuiet()
            sub.cancel()
            try sim.runUntilQuiet()
            try n.store.collection("items").upsert(["_id": .string("x\(cycle)"), "v": 1])
            try sim.runUntilQuiet()
            perCycle.append(sim.documentsSent - before)
        }
        #expect(perCycle.dropFirst().allSatisfy { $0 <= 5 }, "\(perCycle)")
        try sim.check()
        _ = subs
    }

    /// Cost: after subscribing, N reconnects many times; nothing is sent again.
    @Test func reconnectsCostNothing() throws {
        let sim = try Simulation(seed: 9009)
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        var subs: [Subscription] = []
        subs.append(try Self.subscribe(p))
        sim.connect(n, p)
        try n.store.collection("items").upsert((0..<500).map { ["_id": .string("d\($0)"), "v": .int(Int64($0 % 5))] })
        try sim.runUntilQuiet()
        subs.append(try Self.subscribe(n, "v >= 5"))
        try sim.runUntilQuiet()
        let before = sim.documentsSent
        for i in 0..<10 {
            sim.setLink(n, p, up: false)
            sim.run(for: 20_000)
            if i % 3 == 0 {
                sim.crash(p)
                try sim.restart(p)
            }
            if i % 3 == 1 {
                sim.crash(n)
                try sim.restart(n)
            }
            sim.setLink(n, p, up: true)
            try sim.runUntilQuiet()
        }
        #expect(sim.documentsSent - before == 0)
        try Self.set(p, "d1", 3)
        try sim.runUntilQuiet()
        #expect(try Self.get(n, "d1")?["v"] == 3)
        try sim.check()
        _ = subs
    }
}

extension HeldDocumentsSimulationTests {
    /// While M's relayed `v < 0` lasts, P's change reaches N through it (d9 is recorded under
    /// `v < 0`); after M cancels, through N's own subscription, which took the records over.
    @Test func aRelayedSubscriptionCarriesTheChangeWhileItLasts() throws {
        let sim = try Simulation(seed: 9010)
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        let m = try sim.addNode("m")
        var subs: [Subscription] = []
        subs.append(try Self.subscribe(p))
        let mSub = try Self.subscribe(m, "v < 0")
        sim.connect(n, p)
        sim.connect(m, n)
        try sim.runUntilQuiet()
        try Self.writeD9(sim, on: n)
        subs.append(try Self.subscribe(n, "v >= 5"))
        try sim.runUntilQuiet()
        try Self.expectChange(sim, at: p, reaches: n, v: 3)
        mSub.cancel()
        try sim.runUntilQuiet()
        try Self.expectChange(sim, at: p, reaches: n, v: 4)
        _ = subs
    }

    /// Cost: toggling without writing between costs nothing after the first opening (the records
    /// of the cancelled subscription go to the next one served).
    @Test func aToggledSubscriptionWithoutWritesCostsNothing() throws {
        let sim = try Simulation(seed: 9011)
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        var subs: [Subscription] = []
        subs.append(try Self.subscribe(p))
        sim.connect(n, p)
        try n.store.collection("items").upsert((0..<500).map { ["_id": .string("d\($0)"), "v": .int(Int64($0 % 5))] })
        try sim.runUntilQuiet()
        var perCycle: [Int] = []
        for _ in 0..<4 {
            let before = sim.documentsSent
            let sub = try Self.subscribe(n, "v >= 5")
            try sim.runUntilQuiet()
            sub.cancel()
            try sim.runUntilQuiet()
            perCycle.append(sim.documentsSent - before)
        }
        #expect(perCycle.dropFirst().allSatisfy { $0 == 0 }, "\(perCycle)")
        _ = subs
    }

    /// Faults at every point around the re-ask: N subscribes, `delay` ms later one fault, then
    /// heal; P changes d9; N must get it.
    @Test(arguments: 0..<4, [0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 30, 50])
    func aFaultAroundTheReask(fault: Int, delay: Int) throws {
        let sim = try Simulation(seed: 9100 + UInt64(fault * 100 + delay))
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        var subs: [Subscription] = []
        subs.append(try Self.subscribe(p))
        sim.connect(n, p)
        try n.store.collection("items").upsert((0..<20).map { ["_id": .string("d\($0)"), "v": 2] })
        try sim.runUntilQuiet()
        subs.append(try Self.subscribe(n, "v >= 5"))
        sim.run(for: Millis(delay))
        switch fault {
        case 0:
            sim.crash(p)
            try sim.restart(p)
        case 1:
            sim.crash(n)
            try sim.restart(n)
        case 2:
            sim.setLink(n, p, up: false)
            sim.run(for: 20_000)
            sim.setLink(n, p, up: true)
        default:
            sim.crash(p)
            try sim.restart(p, wipe: true)
            sim.run(for: 1)
        }
        try sim.runUntilQuiet()
        for i in 0..<20 { try Self.set(p, "d\(i)", 3) }
        try sim.runUntilQuiet()
        for i in 0..<20 { #expect(try Self.get(n, "d\(i)")?["v"] == 3, "fault \(fault) delay \(delay) d\(i)") }
        try sim.check()
        _ = subs
    }

    /// Two collections: N writes in both before subscribing, subscribes to a query in both.
    @Test func twoCollections() throws {
        let sim = try Simulation(seed: 9012)
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        var subs: [Subscription] = []
        subs.append(try Self.subscribe(p))
        subs.append(try p.store.collection("notes").findAll().subscribe())
        sim.connect(n, p)
        try n.store.collection("items").upsert(["_id": "d9", "v": 2])
        try n.store.collection("notes").upsert(["_id": "e9", "v": 2])
        try sim.runUntilQuiet()
        subs.append(try Self.subscribe(n, "v >= 5"))
        try sim.runUntilQuiet()
        subs.append(try n.store.collection("notes").find("v >= 5").subscribe())
        try sim.runUntilQuiet()
        try Self.set(p, "d9", 3)
        _ = try p.store.collection("notes").findByID("e9").update { $0?["v"].set(3) }
        try sim.runUntilQuiet()
        #expect(try Self.get(n, "d9")?["v"] == 3)
        #expect(try Self.get(n, "e9", in: "notes")?["v"] == 3)
        try sim.check()
        _ = subs
    }

    /// Longer relay chain: N — R1 — R2 — P, relays pure; P changes d9 after N subscribes; and a
    /// change made at a second whole subscriber Q hanging off R1.
    @Test func aChainOfPureRelays() throws {
        let sim = try Simulation(seed: 9013)
        let p = try sim.addNode("p")
        let r2 = try sim.addNode("r2")
        let r1 = try sim.addNode("r1")
        let n = try sim.addNode("n")
        let q = try sim.addNode("q")
        var subs: [Subscription] = []
        subs.append(try Self.subscribe(p))
        subs.append(try Self.subscribe(q))
        sim.connect(n, r1)
        sim.connect(r1, r2)
        sim.connect(r2, p)
        sim.connect(q, r1)
        try Self.writeD9(sim, on: n)
        subs.append(try Self.subscribe(n, "v >= 5"))
        try sim.runUntilQuiet()
        try Self.expectChange(sim, at: p, reaches: n, v: 3)
        try Self.expectChange(sim, at: q, reaches: n, v: 4)
        try sim.check()
        _ = subs
    }
}

extension HeldDocumentsSimulationTests {
    /// Cost through a relay: S (writes only) — R (pure relay) — P (whole subscriber); Q, a query
    /// subscriber, comes and goes on R. Each time Q is away R relays a new write of S to P while
    /// P serves R nothing; each time Q is back, R relays Q's query to P, and P asks R for the
    /// whole collection again.
    @Test func aQuerySubscriberThatComesAndGoesBehindARelayCostsLittle() throws {
        let sim = try Simulation(seed: 9014)
        let p = try sim.addNode("p")
        let r = try sim.addNode("r")
        let s = try sim.addNode("s")
        let q = try sim.addNode("q")
        var subs: [Subscription] = []
        subs.append(try Self.subscribe(p))
        subs.append(try Self.subscribe(q, "v >= 5"))
        sim.connect(s, r)
        sim.connect(r, p)
        sim.connect(q, r)
        try s.store.collection("items").upsert((0..<500).map { ["_id": .string("d\($0)"), "v": .int(Int64($0 % 5))] })
        try sim.runUntilQuiet()
        var perCycle: [Int] = []
        for cycle in 0..<5 {
            let before = sim.documentsSent
            sim.setLink(q, r, up: false)
            sim.run(for: 20_000)
            try s.store.collection("items").upsert(["_id": .string("x\(cycle)"), "v": 1])
            try sim.runUntilQuiet()
            sim.setLink(q, r, up: true)
            try sim.runUntilQuiet()
            perCycle.append(sim.documentsSent - before)
        }
        #expect(perCycle.allSatisfy { $0 <= 5 }, "\(perCycle)")
        try sim.check()
        _ = subs
    }

    /// N, subscribed to `v >= 5`, writes d9 {v: 2} (P records it under `v >= 5`). Apart from P,
    /// N cancels that subscription and subscribes to `v >= 7` instead; they meet again. P
    /// remembers which subscriptions of N's held its records, so the new one takes them over on
    /// the new connection, and P's change to d9 reaches N.
    @Test func aSubscriptionChangedWhileApartTakesTheRecordsOver() throws {
        let sim = try Simulation(seed: 9012)
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        let pSub = try Self.subscribe(p)
        var high = try Self.subscribe(n, "v >= 5")
        sim.connect(n, p)
        try sim.runUntilQuiet()
        try Self.writeD9(sim, on: n)
        #expect(try Self.get(p, "d9")?["v"] == 2)
        sim.setLink(n, p, up: false)
        high.cancel()
        high = try Self.subscribe(n, "v >= 7")
        try Self.set(p, "d9", 3)
        sim.setLink(n, p, up: true)
        try sim.runUntilQuiet()
        #expect(try Self.get(n, "d9")?["v"] == 3)
        try sim.check()
        high.cancel()
        pSub.cancel()
    }
    /// N held d9 through a whole-collection subscription, cancelled it and evicted d9; P removed
    /// d9. N subscribes to `v >= 5`: its refetch of the evicted documents brings d9's tombstone,
    /// which N then holds although d9 never matched `v >= 5` on P. P writes d9 again, as {v: 3}:
    /// N must get it. Before, a refetch recorded nothing, so P sent N nothing and N kept the
    /// tombstone while P held d9 (simulation seed 440019, `--nodes 2-6 --steps 100`).
    @Test func aTombstoneARefetchBroughtIsKeptUpToDate() throws {
        let sim = try Simulation(seed: 9013)
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        let pSub = try Self.subscribe(p)
        let whole = try Self.subscribe(n)
        sim.connect(n, p)
        try Self.writeD9(sim, on: p)
        #expect(try Self.get(n, "d9")?["v"] == 2)
        whole.cancel()
        try sim.runUntilQuiet()
        #expect(try n.store.collection("items").findByID("d9").evict())
        _ = try p.store.collection("items").findByID("d9").remove()
        try sim.runUntilQuiet()
        let high = try Self.subscribe(n, "v >= 5")
        try sim.runUntilQuiet()
        try p.store.collection("items").upsert(["_id": "d9", "v": 3])
        try sim.runUntilQuiet()
        #expect(try Self.get(n, "d9")?["v"] == 3)
        try sim.check()
        high.cancel()
        pSub.cancel()
    }
}
