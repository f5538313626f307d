import Testing
import Trellis
import TrellisCore
import TrellisStore

@testable import TrellisSimulation

/// A reviewer's scenarios for 05ec5da: a local write that creates a document with an `_id` the
/// caller gave marks the collection's `notAsked` checkpoints `wanted` and asks the peers asked
/// without `h` again with it (docs/DATA-MODEL.md, "A subscriber from 0 that holds rows").
///
/// The setup is ``WipedWriterReapedRemoveTests``'s (simulator seed 9100335): W — S — N, W removes
/// d1, every node reaps it, N comes back wiped. Each scenario checks that N's d1, re-created
/// there, ends up holding W's remove (its state's remove context names W), as S's reaped
/// tombstone of d1 would bring it.
@Suite struct CreatedReapedBreakTests: StaleCopyChecks {
    static let ttl: Millis = 120_000

    /// Whether N's d1 holds W's remove (N got d1's reaped tombstone).
    static func hasRemove(_ m: WipedWriterReapedRemoveTests.Mesh) throws -> Bool {
        guard let state = try m.n.documents.state(id: "d1", in: "items") else { return false }
        return state.removed[m.w.documents.siteID] != nil
    }

    static func asksWithH(_ sim: Simulation, after: Int, from: String = "n", to: String = "s") -> Int {
        sim.trace[after...].filter { line in
            guard line.contains(" \(from) -> \(to) subs "), let open = line.firstIndex(of: "[") else { return false }
            let entries = line[line.index(after: open)...].dropLast().components(separatedBy: "; ")
            return entries.contains { $0.hasSuffix(" h") && !$0.contains("trellisEvicted") }
        }.count
    }

    // MARK: 1. Other write paths

    enum Path: CaseIterable, Sendable {
        case insertIfAbsent, insertDefaultIfAbsent, updateDifferentValues, streamed, batchWithAnUpdate
        /// A plain upsert, S having rotated its log (N's checkpoint is in S's earlier epoch).
        case peerRotatedLog
    }

    /// N creates d1 through another write path than a plain upsert.
    @Test(arguments: Path.allCases) func otherWritePathsGetTheRemove(_ path: Path) throws {
        let m = try WipedWriterReapedRemoveTests.wipedN()
        let items = m.n.store.collection("items")
        if path == .peerRotatedLog {
            try m.s.documents.rotateLog(reason: "a reviewer's test")
            try m.sim.runUntilQuiet()
        }
        let before = m.sim.trace.count
        switch path {
        case .peerRotatedLog: try items.upsert(["_id": "d1", "s": "x"])
        case .insertIfAbsent: try items.upsert(["_id": "d1", "s": "x"], writeStrategy: .insertIfAbsent)
        case .insertDefaultIfAbsent: try items.upsert(["_id": "d1", "s": "x"], writeStrategy: .insertDefaultIfAbsent)
        case .updateDifferentValues: try items.upsert(["_id": "d1", "s": "x"], writeStrategy: .updateDifferentValues)
        case .streamed:
            var pending: [Value] = [["_id": "d1", "s": "x"]]
            _ = try m.n.documents.upsert(in: "items", streaming: { pending.popLast() })
        case .batchWithAnUpdate:
            _ = try m.n.documents.upsertReportingWrites(
                [["_id": "d2", "s": "y"], ["_id": "d1", "s": "x"]], in: "items", writeStrategy: .updateDifferentValues)
        }
        try m.sim.runUntilQuiet()
        #expect(Self.asksWithH(m.sim, after: before) > 0, "\(path): N asks S again with h")
        #expect(try Self.hasRemove(m), "\(path): N's d1 holds W's remove")
        try m.sim.check()
        _ = m.subs
    }

    // MARK: 2. The engine hears of the creation after the first batch stored its checkpoint

    /// N, wiped, writes d1 before its first request to S is answered; the store event reaches the
    /// sync engine only after S's batch stored N's checkpoint on S (the request went without `h`,
    /// and no checkpoint was there for the write to mark: it was stored `notAsked` before the
    /// fix, and is stored `wanted` since, ``DocumentStore.checkpointReapedKeys``). `heard`: the engine
    /// then hears of it and asks again with `h`, and N crashes before S answers; otherwise N
    /// crashes before the engine hears of it. N restarts.
    @Test(arguments: [true, false]) func aCreationHeardOfAfterTheFirstBatchSurvivesARestart(heard: Bool) throws {
        let wiped = try WipedWriterReapedRemoveTests.wipedN(settled: false)
        let (sim, w, s, n) = (wiped.sim, wiped.w, wiped.s, wiped.n)
        // The write commits now; its event is held back from the engine (as the engine's queue
        // would, behind the batch) until S's batch has been applied.
        try n.store.collection("items").upsert(["_id": "d1", "s": "x"])
        n.documents.waitForObservers()
        let commits = n.commits.withLock { c in
            defer { c = [:] }
            return c
        }
        let created = n.created.withLock { c in
            defer { c = [] }
            return c
        }
        #expect(created == [UTF8Key("items")])
        var steps = 0
        while try n.documents.checkpoints(peer: s.peerKey).isEmpty, steps < 2_000 {
            sim.run(for: 1)
            steps += 1
        }
        // The batch of the request made before the write, without `h`, stores its checkpoint as
        // wanting the reaped tombstones: the store knows of the creation since it opened.
        let first = try n.documents.checkpoints(peer: s.peerKey)
        #expect(!first.isEmpty && first.values.allSatisfy { $0.reapedKeys == .wanted })
        if heard {
            // The engine hears of the write now, asks S again with `h`; N crashes before S answers.
            let before = sim.trace.count
            n.commits.withLock { $0.merge(commits) { a, _ in a } }
            n.created.withLock { $0.formUnion(created) }
            sim.run(for: 1)
            #expect(Self.asksWithH(sim, after: before) > 0, "N asks S again with h")
        }
        let stored = try n.documents.checkpoints(peer: s.peerKey)
        sim.crash(n)
        try sim.restart(n)
        try sim.runUntilQuiet()
        let ok = try Self.hasRemove(wiped)
        #expect(
            ok, "N's d1 holds W's remove (checkpoints stored before the crash: \(stored.values.map(\.reapedKeys)))")
        if !ok { Self.dump(sim, "heard after the first batch", last: 30) }
        try sim.check()
    }

    // MARK: 3. A relay that never held the reaped tombstone

    /// W removed and reaped d1 alone (a keeper beside it acknowledged the remove, then is gone
    /// for good); then S, new and holding nothing, joins as the relay between W and a new node N,
    /// which holds d2 from W through S. The keeper's subscription is returned to keep it alive.
    static func newRelay(seed: UInt64) throws -> (WipedWriterReapedRemoveTests.Mesh, Subscription) {
        let sim = try Simulation(seed: seed)
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let w = try sim.addNode("w")
        // A keeper beside W acknowledges the remove, so W reaps it; then it is gone for good.
        let (k, kept) = try sim.addKeeper(beside: w)
        try w.store.collection("items").upsert([["_id": "d1", "v": 1, "m": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        try w.store.collection("items").findByID("d1").remove()
        try sim.runUntilQuiet()
        sim.run(for: Self.ttl + 2 * 60_000)
        #expect(try w.documents.state(id: "d1", in: "items") == nil, "W reaped d1's tombstone")
        sim.crash(k)
        let s = try sim.addNode("s")
        let n = try sim.addNode("n")
        sim.connect(s, w)
        sim.connect(n, s)
        let sQuery = try s.store.collection("items").find("v >= 5").subscribe()
        let nWhole = try n.store.collection("items").findAll().subscribe()
        try sim.runUntilQuiet()
        #expect(try Self.ids(n) == ["\"d2\""])
        return (WipedWriterReapedRemoveTests.Mesh(sim: sim, w: w, s: s, n: n, subs: [sQuery, nWhole]), kept)
    }

    /// ``newRelay(seed:)``: both ask from 0 without `h`. N creates d1 and asks S again with `h`;
    /// S has no reaped tombstone of d1. Before the fix its relayed request to W stayed without
    /// `h`; now S asks W with it and passes d1's tombstone on.
    @Test func aNewRelayThatHoldsNothingPassesTheAskOn() throws {
        let (m, kept) = try Self.newRelay(seed: 9_100_336)
        let (sim, s, n) = (m.sim, m.s, m.n)
        let before = sim.trace.count
        try n.store.collection("items").upsert(["_id": "d1", "s": "x"])
        try sim.runUntilQuiet()
        #expect(Self.asksWithH(sim, after: before) > 0, "N asks S again with h")
        let relayed = Self.asksWithH(sim, after: before, from: "s", to: "w")
        let ok = try Self.hasRemove(m)
        #expect(ok, "N's d1 holds W's remove (S asked W with h \(relayed) times)")
        if !ok { Self.dump(sim, "new relay", last: 40) }
        try sim.check()
        _ = kept
    }

    /// As ``aNewRelayThatHoldsNothingPassesTheAskOn()``, but S cannot reach W when N asks it
    /// with `h`, and S restarts before it meets W again: its checkpoints on W keep wanting W's
    /// reaped tombstones in its store (``ReplicatorDirective/wantReapedKeys(collection:besides:)``).
    @Test func theRelaysAskSurvivesItsRestart() throws {
        let (m, kept) = try Self.newRelay(seed: 9_100_337)
        let (sim, w, s, n) = (m.sim, m.w, m.s, m.n)
        #expect(try s.documents.checkpoints(peer: w.peerKey).values.contains { $0.reapedKeys == .notAsked })
        sim.setLink(s, w, up: false)
        try sim.runUntilQuiet()
        let before = sim.trace.count
        try n.store.collection("items").upsert(["_id": "d1", "s": "x"])
        try sim.runUntilQuiet()
        #expect(Self.asksWithH(sim, after: before) > 0, "N asks S again with h")
        let stored = try s.documents.checkpoints(peer: w.peerKey)
        #expect(!stored.isEmpty && !stored.values.contains { $0.reapedKeys == .notAsked }, "\(stored)")
        sim.crash(s)
        try sim.restart(s)
        sim.setLink(s, w, up: true)
        try sim.runUntilQuiet()
        let ok = try Self.hasRemove(m)
        #expect(ok, "N's d1 holds W's remove")
        if !ok { Self.dump(sim, "relay restarted", last: 40) }
        try sim.check()
        _ = kept
    }

    // MARK: 4. Pages of the first request still arriving

    /// N, wiped, re-syncs many documents from S over a slow link and creates d1 while the pages
    /// of its first request (from 0, without `h`) still arrive.
    @Test func aCreationWhilePagesStillArrive() throws {
        let sim = try Simulation(seed: 9_100_337)
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        sim.replicatorConfiguration = { $0.batchEntries = 2 }
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        let n = try sim.addNode("n")
        sim.connect(s, w)
        sim.connect(n, s)
        let sQuery = try s.store.collection("items").find("v >= 5").subscribe()
        let nWhole = try n.store.collection("items").findAll().subscribe()
        try w.store.collection("items").upsert(
            [["_id": "d1", "v": 1, "m": 1]] + (2...30).map { ["_id": .string("d\($0)"), "v": .int(Int64($0))] })
        try sim.runUntilQuiet()
        try w.store.collection("items").findByID("d1").remove()
        try sim.runUntilQuiet()
        sim.run(for: Self.ttl + 2 * 60_000)
        sim.crash(n)
        try sim.restart(n, wipe: true)
        sim.setProfile(LinkProfile(bytesPerSecond: 400), between: n, and: s)
        var steps = 0
        while try Self.ids(n).count < 4, steps < 5_000 {
            sim.run(for: 5)
            steps += 1
        }
        #expect(try Self.ids(n).count < 29, "pages still arriving")
        try n.store.collection("items").upsert(["_id": "d1", "s": "x"])
        try sim.runUntilQuiet()
        sim.resetProfiles()
        try sim.runUntilQuiet()
        let m = WipedWriterReapedRemoveTests.Mesh(sim: sim, w: w, s: s, n: n, subs: [sQuery, nWhole])
        #expect(try Self.ids(n).count == 30)
        #expect(try Self.hasRemove(m), "N's d1 holds W's remove")
        try sim.check()
    }

    // MARK: 5. Cost: one peer, no creation with an `_id` of its own

    /// N has one peer, W, and holds d1, d2 from it. It updates them through every write path and
    /// creates documents without `_id` (plain, batched, streamed): nothing asks W with `h`, across
    /// a reconnection and a restart too.
    @Test func updatesAndGeneratedIDsNeverAskWithH() throws {
        let sim = try Simulation(seed: 9_100_338)
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let w = try sim.addNode("w")
        let n = try sim.addNode("n")
        sim.connect(n, w)
        let nWhole = try n.store.collection("items").findAll().subscribe()
        try w.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2], ["_id": "d3", "v": 3]])
        try w.store.collection("items").findByID("d3").remove()
        try sim.runUntilQuiet()
        let items = n.store.collection("items")
        try items.upsert(["_id": "d1", "a": 1])
        try items.upsert(["_id": "d1", "b": 1], writeStrategy: .insertIfAbsent)
        try items.upsert(["_id": "d2", "b": 1], writeStrategy: .insertDefaultIfAbsent)
        try items.upsert(["_id": "d2", "c": 1], writeStrategy: .updateDifferentValues)
        // Over a tombstone held here: N has the remove.
        try items.upsert(["_id": "d3", "c": 1], writeStrategy: .insertIfAbsent)
        _ = try items.findByID("d2").update { $0?["e"].set(1) }
        try items.upsert(["g": 1])
        try items.upsert([["g": 2], ["g": 3]], writeStrategy: .insertIfAbsent)
        var pending: [Value] = [["g": 4], ["_id": "d1", "g": 5]]
        _ = try n.documents.upsert(in: "items", streaming: { pending.popLast() })
        try sim.runUntilQuiet()
        sim.setLink(n, w, up: false)
        sim.run(for: 30_000)
        try items.upsert(["g": 6])
        sim.setLink(n, w, up: true)
        try sim.runUntilQuiet()
        sim.crash(n)
        try sim.restart(n)
        try n.store.collection("items").upsert(["_id": "d1", "h": 1], writeStrategy: .updateDifferentValues)
        try sim.runUntilQuiet()
        #expect(Self.asksWithH(sim, after: 0, from: "n", to: "w") == 0)
        try sim.check()
        _ = nWhole
    }
}
