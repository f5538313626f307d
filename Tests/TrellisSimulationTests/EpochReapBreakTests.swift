import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// A reviewer's attempts to break d783210 (a subscriber whose checkpoint on a peer counts in the
/// peer's earlier epoch is served that peer's reaped tombstones), kept as a regression suite.
/// Base scenario as in `WipedPeerReapedKeysTests`: R writes d1 and d2, W relays them to S; S goes
/// away; W's store is replaced (wiped, restored, ...), W gets the documents again from R, d1 is
/// removed and reaped at W and R; S comes back. Promised (docs/MESH.md "Tombstones"): d1 shows
/// nowhere once quiet.
///
/// Two of them failed on d783210, with or without a wipe (`aSubscriptionReplacedWhileAway…`):
/// S replaced its subscription while away, and the `notAsked` checkpoint its old subscription
/// left on W kept `h` off the new one, asked from 0; nothing brought the tombstones W reaped
/// after that checkpoint, and S kept d1. A `notAsked` checkpoint now keeps `h` off only while its
/// own subscription is asked of the peer too (docs/DATA-MODEL.md "A subscriber from 0 that holds
/// rows").
@Suite struct EpochReapBreakTests: StaleCopyChecks {
    static let ttl: Millis = 120_000

    enum Dialer: String, CaseIterable, Sendable {
        /// S dials (early subscriptions with `e`).
        case stale
        /// W dials.
        case wiped
    }

    static func link(_ sim: Simulation, _ s: SimulatedNode, _ w: SimulatedNode, _ dialer: Dialer) {
        if dialer == .stale { sim.connect(s, w) } else { sim.connect(w, s) }
    }

    // MARK: 1. Restored from an older backup

    /// W is restored from a backup taken before it held anything (its log goes back; its epoch
    /// only changes if a peer shows it a checkpoint beyond the end of its log).
    @Test(arguments: Dialer.allCases)
    func restoredFromAnOlderBackup(dialer: Dialer) throws {
        let sim = try Simulation(seed: 9801 + UInt64(Dialer.allCases.firstIndex(of: dialer)!))
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(w, r)
        Self.link(sim, s, w, dialer)
        let whole = try w.store.collection("items").findAll().subscribe()
        let sWhole = try s.store.collection("items").findAll().subscribe()
        try sim.runUntilQuiet()
        let backup = try sim.snapshot(w)
        try r.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"d1\"", "\"d2\""])

        sim.setLink(s, w, up: false)
        try sim.restore(w, from: backup)
        try sim.runUntilQuiet()
        #expect(try Self.ids(w) == ["\"d1\"", "\"d2\""])
        try r.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        whole.cancel()
        #expect(try w.documents.state(id: "d1", in: "items") == nil, "W reaped d1's tombstone")

        sim.setLink(s, w, up: true)
        try sim.runUntilQuiet()
        try Self.expectGone(sim, [r, w, s], "restore/\(dialer)")
        try sim.check()
        _ = sWhole
    }

    /// As above, but W's log as S knew it ran ahead (W had started with its clock 10 minutes
    /// ahead, so its seqs were high): the restored log ends below S's checkpoint, W notices the
    /// regression when S shows its checkpoint, and rotates to a new epoch.
    @Test(arguments: Dialer.allCases)
    func restoredBackupBelowTheSubscribersCheckpointRotates(dialer: Dialer) throws {
        let sim = try Simulation(seed: 9811 + UInt64(Dialer.allCases.firstIndex(of: dialer)!))
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(w, r)
        Self.link(sim, s, w, dialer)
        let whole = try w.store.collection("items").findAll().subscribe()
        let sWhole = try s.store.collection("items").findAll().subscribe()
        try sim.runUntilQuiet()
        let backup = try sim.snapshot(w)
        // W opens again with its clock ahead: its next seq is its clock's ms × 1024.
        sim.setClockOffset(w, 20 * 60_000)
        sim.crash(w)
        try sim.restart(w)
        try sim.runUntilQuiet()
        try r.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"d1\"", "\"d2\""])

        sim.setLink(s, w, up: false)
        sim.setClockOffset(w, 0)
        try sim.restore(w, from: backup)
        try sim.runUntilQuiet()
        #expect(try Self.ids(w) == ["\"d1\"", "\"d2\""])
        try r.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        whole.cancel()
        #expect(try w.documents.state(id: "d1", in: "items") == nil, "W reaped d1's tombstone")

        sim.setLink(s, w, up: true)
        try sim.runUntilQuiet()
        let rotated = sim.trace.contains { $0.contains("went back in time") || $0.contains("rotated") }
        #expect(rotated, "W started a new epoch when S showed it a checkpoint beyond its log")
        try Self.expectGone(sim, [r, w, s], "restoreRotates/\(dialer)")
        try sim.check()
        _ = sWhole
    }

    // MARK: 2. Query subscriptions, two subscriptions, a subscription replaced while away

    enum SubscriberShape: String, CaseIterable, Sendable {
        /// S holds d1 and d2 through `v >= 1` alone.
        case query
        /// S holds them through the whole collection and `v >= 1`.
        case wholeAndQuery
        /// S holds them through `v >= 1` and `v <= 2`.
        case twoQueries
        /// S holds them through `v >= 1`; while away it replaces it with `v >= 0`.
        case queryReplacedWhileAway
        /// S holds them through the whole collection; while away it replaces it with `v >= 1`.
        case wholeReplacedByQueryWhileAway
        /// S holds them through `v >= 1`; while away it replaces it with the whole collection.
        case queryReplacedByWholeWhileAway
    }

    struct ShapeCase: CustomTestStringConvertible, Sendable {
        let shape: SubscriberShape
        let dialer: Dialer
        var testDescription: String { "\(shape)/\(dialer)" }
    }

    static let shapeCases: [ShapeCase] = SubscriberShape.allCases.flatMap { shape in
        Dialer.allCases.map { ShapeCase(shape: shape, dialer: $0) }
    }

    @Test(arguments: shapeCases)
    func subscriberShapes(_ c: ShapeCase) throws {
        let seed =
            9821 + UInt64(SubscriberShape.allCases.firstIndex(of: c.shape)! * 2)
            + UInt64(Dialer.allCases.firstIndex(of: c.dialer)!)
        let sim = try Simulation(seed: seed)
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(w, r)
        Self.link(sim, s, w, c.dialer)
        let whole = try w.store.collection("items").findAll().subscribe()
        var subs: [Subscription] = []
        let items = s.store.collection("items")
        switch c.shape {
        case .query, .queryReplacedWhileAway, .queryReplacedByWholeWhileAway:
            subs.append(try items.find("v >= 1").subscribe())
        case .wholeAndQuery:
            subs.append(try items.findAll().subscribe())
            subs.append(try items.find("v >= 1").subscribe())
        case .twoQueries:
            subs.append(try items.find("v >= 1").subscribe())
            subs.append(try items.find("v <= 2").subscribe())
        case .wholeReplacedByQueryWhileAway:
            subs.append(try items.findAll().subscribe())
        }
        try r.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"d1\"", "\"d2\""])

        sim.setLink(s, w, up: false)
        switch c.shape {
        case .queryReplacedWhileAway:
            for sub in subs { sub.cancel() }
            subs = [try items.find("v >= 0").subscribe()]
        case .wholeReplacedByQueryWhileAway:
            for sub in subs { sub.cancel() }
            subs = [try items.find("v >= 1").subscribe()]
        case .queryReplacedByWholeWhileAway:
            for sub in subs { sub.cancel() }
            subs = [try items.findAll().subscribe()]
        default: break
        }
        sim.crash(w)
        try sim.restart(w, wipe: true)
        try sim.runUntilQuiet()
        #expect(try Self.ids(w) == ["\"d1\"", "\"d2\""])
        try r.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        whole.cancel()
        #expect(try w.documents.state(id: "d1", in: "items") == nil, "W reaped d1's tombstone")

        sim.setLink(s, w, up: true)
        try sim.runUntilQuiet()
        try Self.expectGone(sim, [r, w, s], "shape \(c.testDescription)")
        try sim.check()
        _ = subs
    }

    /// As `subscriberShapes` with a subscription replaced while away, but W first asks S from 0
    /// while W holds nothing (so S never counts the collection as held by an asker, which would
    /// make every subscription of S say `h`): S and W meet before R is connected.
    @Test(
        arguments: shapeCases.filter {
            [.queryReplacedWhileAway, .wholeReplacedByQueryWhileAway, .queryReplacedByWholeWhileAway].contains($0.shape)
        })
    func aSubscriptionReplacedWhileAwayWithoutAnAskerHolding(_ c: ShapeCase) throws {
        try Self.replacedWhileAway(c, wipe: true, restartS: false)
    }

    /// The same with W not wiped (W's log, same epoch, has the remove and reaps it): it failed
    /// the same way, so the fault was the `notAsked` rule's, not the epoch's.
    @Test(
        arguments: shapeCases.filter {
            [.queryReplacedWhileAway, .wholeReplacedByQueryWhileAway, .queryReplacedByWholeWhileAway].contains($0.shape)
        })
    func aSubscriptionReplacedWhileAwayInTheSameEpoch(_ c: ShapeCase) throws {
        try Self.replacedWhileAway(c, wipe: false, restartS: false)
    }

    /// The same as the failing case, with S restarted before it meets W again (it forgot W's
    /// last hello: it reads W's new hello before it asks).
    @Test(
        arguments: shapeCases.filter {
            [.queryReplacedWhileAway, .wholeReplacedByQueryWhileAway, .queryReplacedByWholeWhileAway].contains($0.shape)
        })
    func aSubscriptionReplacedWhileAwayThenSRestarts(_ c: ShapeCase) throws {
        try Self.replacedWhileAway(c, wipe: true, restartS: true)
    }

    static func replacedWhileAway(_ c: ShapeCase, wipe: Bool, restartS: Bool) throws {
        let seed =
            9861 + UInt64(SubscriberShape.allCases.firstIndex(of: c.shape)! * 2)
            + UInt64(Dialer.allCases.firstIndex(of: c.dialer)!)
        let sim = try Simulation(seed: seed)
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        Self.link(sim, s, w, c.dialer)
        // W subscribes to nothing yet: it relays S's subscription to R (and keeps what it
        // relays), and never asks S for anything, with `h` or without.
        let items = s.store.collection("items")
        var subs = [
            c.shape == .wholeReplacedByQueryWhileAway
                ? try items.findAll().subscribe() : try items.find("v >= 1").subscribe()
        ]
        sim.connect(w, r)
        try r.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"d1\"", "\"d2\""])

        sim.setLink(s, w, up: false)
        // Subscribed before the crash: W subscribes again when it restarts.
        let whole = try w.store.collection("items").findAll().subscribe()
        for sub in subs { sub.cancel() }
        switch c.shape {
        case .queryReplacedWhileAway: subs = [try items.find("v >= 0").subscribe()]
        case .wholeReplacedByQueryWhileAway: subs = [try items.find("v >= 1").subscribe()]
        default: subs = [try items.findAll().subscribe()]
        }
        if wipe {
            sim.crash(w)
            try sim.restart(w, wipe: true)
        }
        try sim.runUntilQuiet()
        #expect(try Self.ids(w) == ["\"d1\"", "\"d2\""])
        try r.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        whole.cancel()
        #expect(try w.documents.state(id: "d1", in: "items") == nil, "W reaped d1's tombstone")
        if restartS {
            sim.crash(s)
            try sim.restart(s)
        }

        sim.setLink(s, w, up: true)
        try sim.runUntilQuiet()
        try Self.expectGone(
            sim, [r, w, s], "replacedNoAsker \(c.testDescription) wipe=\(wipe) restartS=\(restartS)")
        try sim.check()
        _ = subs
    }

    // MARK: 3. Relays

    /// R — W — X — S: X subscribes to nothing and relays S's subscription. X's link to W is down
    /// while W is wiped, gets d1 again and reaps its remove.
    @Test func aRelayBetweenTheSubscriberAndTheWipedPeer() throws {
        let sim = try Simulation(seed: 9841)
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        let x = try sim.addNode("x")
        let s = try sim.addNode("s")
        sim.connect(w, r)
        sim.connect(x, w)
        sim.connect(s, x)
        let whole = try w.store.collection("items").findAll().subscribe()
        let sWhole = try s.store.collection("items").findAll().subscribe()
        try r.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"d1\"", "\"d2\""])

        sim.setLink(x, w, up: false)
        sim.crash(w)
        try sim.restart(w, wipe: true)
        try sim.runUntilQuiet()
        try r.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        whole.cancel()
        #expect(try w.documents.state(id: "d1", in: "items") == nil, "W reaped d1's tombstone")

        sim.setLink(x, w, up: true)
        try sim.runUntilQuiet()
        try Self.expectGone(sim, [r, w, x, s], "relayX")
        try sim.check()
        _ = sWhole
    }

    /// As above, but the relay X is the one that goes away with S (S — X down from W), and X
    /// restarts meanwhile (its memory of W's hello is gone).
    @Test func aRelayThatRestartedWhileTheWipedPeerWasAway() throws {
        let sim = try Simulation(seed: 9842)
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        let x = try sim.addNode("x")
        let s = try sim.addNode("s")
        sim.connect(w, r)
        sim.connect(x, w)
        sim.connect(s, x)
        let whole = try w.store.collection("items").findAll().subscribe()
        let sWhole = try s.store.collection("items").findAll().subscribe()
        try r.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        sim.setLink(x, w, up: false)
        sim.crash(w)
        try sim.restart(w, wipe: true)
        try sim.runUntilQuiet()
        try r.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        whole.cancel()
        sim.crash(x)
        try sim.restart(x)
        try sim.runUntilQuiet()
        sim.setLink(x, w, up: true)
        try sim.runUntilQuiet()
        try Self.expectGone(sim, [r, w, x, s], "relayXRestarted")
        try sim.check()
        _ = sWhole
    }

    /// S's link to the wiped W never comes back: S meets W only through a new relay N that holds
    /// nothing and subscribes to nothing.
    @Test func theWipedPeerMetThroughANewEmptyRelay() throws {
        let sim = try Simulation(seed: 9843)
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(w, r)
        sim.connect(s, w)
        let whole = try w.store.collection("items").findAll().subscribe()
        let sWhole = try s.store.collection("items").findAll().subscribe()
        try r.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        sim.setLink(s, w, up: false)
        sim.crash(w)
        try sim.restart(w, wipe: true)
        try sim.runUntilQuiet()
        try r.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        whole.cancel()
        let n = try sim.addNode("n")
        sim.connect(s, n)
        sim.connect(n, w)
        try sim.runUntilQuiet()
        try Self.expectGone(sim, [r, w, n, s], "newRelayN")
        try sim.check()
        _ = sWhole
    }

    // MARK: 4. S restarts while W is wiped

    @Test(arguments: Dialer.allCases)
    func theSubscriberRestartsWhileThePeerIsWiped(dialer: Dialer) throws {
        let sim = try Simulation(seed: 9851 + UInt64(Dialer.allCases.firstIndex(of: dialer)!))
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(w, r)
        Self.link(sim, s, w, dialer)
        let whole = try w.store.collection("items").findAll().subscribe()
        let sWhole = try s.store.collection("items").findAll().subscribe()
        try r.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        sim.setLink(s, w, up: false)
        sim.crash(w)
        try sim.restart(w, wipe: true)
        sim.crash(s)
        try sim.restart(s)
        try sim.runUntilQuiet()
        try r.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        whole.cancel()
        sim.setLink(s, w, up: true)
        try sim.runUntilQuiet()
        try Self.expectGone(sim, [r, w, s], "sRestarts/\(dialer)")
        try sim.check()
        _ = sWhole
    }

    // MARK: 5. The remover is W itself, after its wipe

    @Test(arguments: Dialer.allCases)
    func theWipedPeerRemovesTheDocumentItself(dialer: Dialer) throws {
        let sim = try Simulation(seed: 9861 + UInt64(Dialer.allCases.firstIndex(of: dialer)!))
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(w, r)
        Self.link(sim, s, w, dialer)
        let whole = try w.store.collection("items").findAll().subscribe()
        // R subscribes too, so W's remove reaches R and is acknowledged (W may then reap it).
        let rWhole = try r.store.collection("items").findAll().subscribe()
        let sWhole = try s.store.collection("items").findAll().subscribe()
        try r.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        sim.setLink(s, w, up: false)
        sim.crash(w)
        try sim.restart(w, wipe: true)
        try sim.runUntilQuiet()
        #expect(try Self.ids(w) == ["\"d1\"", "\"d2\""])
        try w.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        whole.cancel()
        #expect(try w.documents.state(id: "d1", in: "items") == nil, "W reaped d1's tombstone")
        #expect(try r.documents.state(id: "d1", in: "items") == nil, "R reaped d1's tombstone")
        sim.setLink(s, w, up: true)
        try sim.runUntilQuiet()
        try Self.expectGone(sim, [r, w, s], "wRemoves/\(dialer)")
        try sim.check()
        _ = (sWhole, rWhole)
    }

    // MARK: 6. Others

    /// W wiped twice in a row (a third epoch) before it gets the documents back.
    @Test(arguments: Dialer.allCases)
    func twoWipesInARow(dialer: Dialer) throws {
        let sim = try Simulation(seed: 9871 + UInt64(Dialer.allCases.firstIndex(of: dialer)!))
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(w, r)
        Self.link(sim, s, w, dialer)
        let whole = try w.store.collection("items").findAll().subscribe()
        let sWhole = try s.store.collection("items").findAll().subscribe()
        try r.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        sim.setLink(s, w, up: false)
        sim.crash(w)
        try sim.restart(w, wipe: true)
        try sim.runUntilQuiet()
        sim.crash(w)
        try sim.restart(w, wipe: true)
        try sim.runUntilQuiet()
        try r.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        whole.cancel()
        sim.setLink(s, w, up: true)
        try sim.runUntilQuiet()
        try Self.expectGone(sim, [r, w, s], "twoWipes/\(dialer)")
        try sim.check()
        _ = sWhole
    }

    /// S meets W between two wipes (W's second epoch, before the remove), then goes away; W is
    /// wiped again and the remove is reaped in its third epoch.
    @Test(arguments: Dialer.allCases)
    func theSubscriberMeetsTheSecondEpochThenTheThird(dialer: Dialer) throws {
        let sim = try Simulation(seed: 9881 + UInt64(Dialer.allCases.firstIndex(of: dialer)!))
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(w, r)
        Self.link(sim, s, w, dialer)
        let whole = try w.store.collection("items").findAll().subscribe()
        let sWhole = try s.store.collection("items").findAll().subscribe()
        try r.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        sim.setLink(s, w, up: false)
        sim.crash(w)
        try sim.restart(w, wipe: true)
        try sim.runUntilQuiet()
        sim.setLink(s, w, up: true)
        try sim.runUntilQuiet()
        sim.setLink(s, w, up: false)
        sim.crash(w)
        try sim.restart(w, wipe: true)
        try sim.runUntilQuiet()
        try r.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        whole.cancel()
        sim.setLink(s, w, up: true)
        try sim.runUntilQuiet()
        try Self.expectGone(sim, [r, w, s], "secondThenThird/\(dialer)")
        try sim.check()
        _ = sWhole
    }

    struct FlapCase: CustomTestStringConvertible, Sendable {
        /// The link goes down right after W sends its `cutAt`-th batch to S after the wipe (before
        /// it arrives), the first time; the second time after the next batch.
        let cutAt: Int
        let dialer: Dialer
        var testDescription: String { "batch\(cutAt)/\(dialer)" }
    }

    // W sends all 600 documents in its first batch (3.3 MB), so no cut falls between batches.
    static let flapCases: [FlapCase] = [1].flatMap { cut in
        Dialer.allCases.map { FlapCase(cutAt: cut, dialer: $0) }
    }

    /// Many large documents, half of them removed and reaped; S's link to W
    /// comes back and goes down again as W's batches to S are in flight, twice, then stays up.
    @Test(arguments: flapCases)
    func theLinkFlapsDuringTheFirstBatches(_ c: FlapCase) throws {
        let seed = 9901 + UInt64(c.cutAt) * 2 + UInt64(Dialer.allCases.firstIndex(of: c.dialer)!)
        let sim = try Simulation(seed: seed)
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(w, r)
        Self.link(sim, s, w, c.dialer)
        let whole = try w.store.collection("items").findAll().subscribe()
        let sWhole = try s.store.collection("items").findAll().subscribe()
        let count = 600
        try r.store.collection("items").upsert(
            (0..<count).map { i -> Value in
                ["_id": .string("d\(i)"), "v": .int(Int64(i)), "pad": .string(String(repeating: "x", count: 4000))]
            })
        try sim.runUntilQuiet()
        #expect(try Self.ids(s).count == count)
        sim.setLink(s, w, up: false)
        sim.crash(w)
        try sim.restart(w, wipe: true)
        try sim.runUntilQuiet()
        let removed = (0..<count).filter { $0 % 2 == 1 }.map { "d\($0)" }
        for id in removed { try r.store.collection("items").findByID(.string(id)).remove() }
        sim.run(for: Self.ttl + 2 * 60_000)
        whole.cancel()
        var cuts = 0
        for round in 0..<2 {
            let before = sim.trace.count
            sim.setLink(s, w, up: true)
            let target = c.cutAt + round
            var seen = 0
            var scanned = before
            for _ in 0..<120_000 {
                sim.run(for: 1)
                let trace = sim.trace
                while scanned < trace.count {
                    if trace[scanned].contains(" w -> s batch") { seen += 1 }
                    scanned += 1
                }
                if seen >= target { break }
            }
            if seen >= target { cuts += 1 }
            sim.setLink(s, w, up: false)
            sim.run(for: 20_000)
        }
        #expect(cuts > 0, "the link went down while W's batches to S were in flight")
        sim.setLink(s, w, up: true)
        try sim.runUntilQuiet()
        let shownAtS = try Self.ids(s)
        let staleAtS = removed.map { "\"\($0)\"" }.filter { shownAtS.contains($0) }
        #expect(
            staleAtS.isEmpty,
            "flap \(c.testDescription): S shows \(staleAtS.count) removed documents, e.g. \(staleAtS.prefix(3))")
        if !staleAtS.isEmpty {
            Self.dump(sim, "flap \(c.testDescription)", last: 120)
        }
        try sim.check()
        _ = sWhole
    }

    /// S's clock is 10 minutes behind when it comes back (what W sends is kept aside), then right.
    @Test(arguments: Dialer.allCases)
    func theSubscribersClockIsBehindWhenItComesBack(dialer: Dialer) throws {
        let sim = try Simulation(seed: 9931 + UInt64(Dialer.allCases.firstIndex(of: dialer)!))
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(w, r)
        Self.link(sim, s, w, dialer)
        let whole = try w.store.collection("items").findAll().subscribe()
        let sWhole = try s.store.collection("items").findAll().subscribe()
        try r.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        sim.setLink(s, w, up: false)
        sim.crash(w)
        try sim.restart(w, wipe: true)
        try sim.runUntilQuiet()
        try r.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        whole.cancel()
        sim.setClockOffset(s, -10 * 60_000)
        sim.setLink(s, w, up: true)
        try sim.runUntilQuiet()
        sim.setClockOffset(s, 0)
        sim.run(for: 2 * 60_000)
        try sim.runUntilQuiet()
        try Self.expectGone(sim, [r, w, s], "sClockBehind/\(dialer)")
        try sim.check()
        _ = sWhole
    }

    /// W's clock is 10 minutes ahead after its wipe (its new log's stamps are ahead of S).
    @Test(arguments: Dialer.allCases)
    func theWipedPeersClockIsAhead(dialer: Dialer) throws {
        let sim = try Simulation(seed: 9941 + UInt64(Dialer.allCases.firstIndex(of: dialer)!))
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(w, r)
        Self.link(sim, s, w, dialer)
        let whole = try w.store.collection("items").findAll().subscribe()
        let rWhole = try r.store.collection("items").findAll().subscribe()
        let sWhole = try s.store.collection("items").findAll().subscribe()
        try r.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        sim.setLink(s, w, up: false)
        sim.crash(w)
        sim.setClockOffset(w, 10 * 60_000)
        try sim.restart(w, wipe: true)
        try sim.runUntilQuiet()
        // W removes d1 with its clock ahead; R keeps it aside until its own clock catches up.
        try w.store.collection("items").findByID("d1").remove()
        sim.run(for: 12 * 60_000 + Self.ttl + 2 * 60_000)
        whole.cancel()
        sim.setLink(s, w, up: true)
        try sim.runUntilQuiet()
        sim.run(for: 2 * 60_000)
        try sim.runUntilQuiet()
        try Self.expectGone(sim, [r, w, s], "wClockAhead/\(dialer)")
        try sim.check()
        _ = (sWhole, rWhole)
    }

    // MARK: Cost

    /// A new node that holds nothing meets the wiped W: it is not sent W's reaped tombstones.
    @Test func aNewEmptyNodeMeetingAWipedPeerIsNotSentItsReapedKeys() throws {
        let sim = try Simulation(seed: 9951)
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        sim.connect(w, r)
        let whole = try w.store.collection("items").findAll().subscribe()
        try r.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        sim.crash(w)
        try sim.restart(w, wipe: true)
        try sim.runUntilQuiet()
        try r.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        whole.cancel()
        #expect(try w.documents.state(id: "d1", in: "items") == nil, "W reaped d1's tombstone")
        let n = try sim.addNode("n")
        let nWhole = try n.store.collection("items").findAll().subscribe()
        sim.connect(n, w)
        try sim.runUntilQuiet()
        #expect(try Self.ids(n) == ["\"d2\""])
        #expect(try n.documents.state(id: "d1", in: "items") == nil, "no tombstone of d1 reached N")
        // And again after a restart of N and of W (wiped again: a new epoch once more).
        sim.crash(n)
        try sim.restart(n)
        try sim.runUntilQuiet()
        #expect(try n.documents.state(id: "d1", in: "items") == nil, "no tombstone of d1 reached N after it restarted")
        try sim.check()
        _ = nWhole
    }

    /// A node S that subscribed to the collection while W held nothing of it (so S holds nothing,
    /// but has a checkpoint above 0 on W's old log, W's log having other collections' entries)
    /// meets W after W's wipe: does it get W's reaped keys, though it holds no row?
    @Test(arguments: Dialer.allCases)
    func anEmptySubscriberWithAnOldEpochCheckpointIsNotSentReapedKeys(dialer: Dialer) throws {
        let sim = try Simulation(seed: 9961 + UInt64(Dialer.allCases.firstIndex(of: dialer)!))
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(w, r)
        Self.link(sim, s, w, dialer)
        let whole = try w.store.collection("items").findAll().subscribe()
        let sWhole = try s.store.collection("items").findAll().subscribe()
        try w.store.collection("other").upsert([["_id": "o1", "v": 1]])
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == [])
        sim.setLink(s, w, up: false)
        sim.crash(w)
        try sim.restart(w, wipe: true)
        try r.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        try r.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        whole.cancel()
        sim.setLink(s, w, up: true)
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"d2\""])
        #expect(try s.documents.state(id: "d1", in: "items") == nil, "no tombstone of d1 reached S (\(dialer))")
        try sim.check()
        _ = sWhole
    }
}
