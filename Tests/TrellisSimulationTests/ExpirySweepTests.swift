import Foundation
import Testing
import Trellis
import TrellisCore
import TrellisSimulation
import TrellisTestKit

/// The random workload in tombstone expiry mode (`RandomWorkload.tombstoneTTL`,
/// `trellis simulate --ttl`), and the invariants around reaped documents: a document whose
/// tombstone was reaped is held as the state its reaped key kept (docs/DATA-MODEL.md,
/// "Tombstones and reaping"), not lost.
@Suite struct ExpirySweepTests {
    static let ttl: Millis = 120_000

    /// 20 seeds of random meshes (3–8 nodes, every fault) whose stores keep tombstones two
    /// minutes, while more than that passes now and then with nodes apart. The first seed is
    /// random each run (printed); replay the run with `TRELLIS_SEED=<first seed>`, or one failing
    /// seed with `trellis simulate --replay SEED --ttl 120000`. Every failing seed is printed;
    /// failures are a known issue for now (below), so the suite stays green while they are open.
    @Test func randomMeshesThatReapKeepEveryInvariant() async throws {
        let (_, first) = SeededRandom.fromEnvironment(default: UInt64.random(in: 0...(1 << 40)))
        print("ExpirySweepTests seeds \(first)…\(first + 19) with --ttl \(Self.ttl) (replay: TRELLIS_SEED=\(first))")
        let failures = try await onOwnThread { () throws -> [String] in
            var workload = RandomWorkload()
            workload.tombstoneTTL = Self.ttl
            var failures: [String] = []
            for seed in first..<(first + 20) {
                do {
                    try workload.run(seed: seed, tracing: false)
                } catch let failure as SimulationFailure {
                    failures.append("\(failure)\n  replay: trellis simulate --replay \(seed) --ttl \(Self.ttl)")
                }
            }
            return failures
        }
        for failure in failures { print(failure) }
        // The mode's first sweeps failed about one seed in three, nearly all from deltas that
        // lost the remove contexts their write reaped (fixed: `DeltaReapingTests`, and
        // `theSeedsThatFoundLostRemoveContextsPass` below); a stale node that asked a remover
        // from 0 (a first meeting) was sent none of the tombstones it reaped (fixed by the
        // subscription's `h`: `aWriterWithNoCheckpointOfTheRemover...` below); replicas held
        // different states of a document after reaping the context entry that covered a site's
        // default data (seed 4100041 with `--nodes 3-6 --steps 120`, fixed by protocol 5:
        // `TimeZeroContextReapTests`).
        #expect(
            failures.isEmpty, "\(failures.count) of 20 seeds failed:\n\(failures.prefix(5).joined(separator: "\n"))")
    }

    /// The mode with two query nodes that widen to the whole collection now and then
    /// (`--queries 2 --widen`).
    static func queryWorkload(nodes: ClosedRange<Int>, steps: Int) -> RandomWorkload {
        var workload = RandomWorkload()
        workload.tombstoneTTL = ttl
        workload.nodes = nodes
        workload.steps = steps
        workload.queryNodes = 2
        workload.widening = true
        return workload
    }

    /// Two seeds of a wider sweep (`trellis simulate --seeds 200 --from 4400001 --nodes 3-8
    /// --steps 100 --queries 2 --widen --ttl 120000`) where a query subscriber kept a stale state
    /// of a document outside its query. In 4400026 node n6 held `d10` through its
    /// whole-collection subscription and cancelled it; `d10` was then written again on the node
    /// serving n6 after its tombstone had been reaped there, as a new row born after what n6 had
    /// been served (`whole_held`), so n6's query subscription did not carry it. In 4400105 the
    /// row was born at the reaped tombstone's `seq`, which came after n2's whole-collection pages
    /// (n2 was apart when `d5` was removed), so n2 kept the tombstone while `d5` was written
    /// again. Fixed: the reaped key keeps the document's birth, and the row written again has it
    /// (`TombstoneReapingTests.aDocumentWrittenAgainAfterItsTombstoneWasReapedIsNotBornAnew`).
    /// 4600017 (`--seeds 200 --from 4600001 --nodes 3-8 --steps 120`) is the invariant's: n4 held,
    /// outside its query, a peer's reaped tombstone that it received as a subscriber from 0 that
    /// holds rows, due for reaping there, while the document was written again elsewhere; its
    /// reaper takes that tombstone at its next run (docs/SIMULATION.md).
    @Test func aQuerySubscriberKeepsNoStaleStateOfADocumentOutsideItsQuery() async throws {
        let failures = try await onOwnThread { () throws -> [UInt64: String] in
            var failures: [UInt64: String] = [:]
            for (seed, steps): (UInt64, Int) in [(4_400_026, 100), (4_400_105, 100), (4_600_017, 120)] {
                do {
                    try Self.queryWorkload(nodes: 3...8, steps: steps).run(seed: seed, tracing: false)
                } catch let failure as SimulationFailure {
                    failures[seed] = "\(failure)"
                }
            }
            return failures
        }
        #expect(failures[4_400_026] == nil, "\(failures[4_400_026] ?? "")")
        #expect(failures[4_400_105] == nil, "\(failures[4_400_105] ?? "")")
        #expect(failures[4_600_017] == nil, "\(failures[4_600_017] ?? "")")
    }

    /// A remove that reached no one before it was reaped (`trellis simulate --seeds 150 --from
    /// 4500001 --nodes 3-6 --steps 120 --queries 2 --widen --ttl 120000`, seed 4500046). n0, a node
    /// that asks nothing of its peers, upserted and then removed `d7` while its one link was down,
    /// was partitioned longer than the TTL, and reaped the tombstone of its own remove before any
    /// peer had it; n2, which held `d7` from before, never heard of the remove. Now the reaper
    /// keeps a tombstone holding a write of this node that no peer has acknowledged.
    @Test func aRemoveThatReachedNoOneBeforeItWasReapedIsNotLost() async throws {
        let failure = try await onOwnThread { () throws -> String? in
            let workload = Self.queryWorkload(nodes: 3...6, steps: 120)
            do {
                try workload.run(seed: 4_500_046, tracing: false)
                return nil
            } catch let failure as SimulationFailure {
                return "\(failure)"
            }
        }
        #expect(failure == nil, "\(failure ?? "")")
    }

    /// Ten recorded seeds of the mode, among them 4100008 and 4100010, which failed (replicas
    /// holding different states of a document) while a delta lost the remove contexts its write
    /// reaped: a receiver kept entries the sender had removed. They all pass.
    @Test func theSeedsThatFoundLostRemoveContextsPass() async throws {
        let failures = try await onOwnThread { () throws -> [String] in
            var workload = RandomWorkload()
            workload.tombstoneTTL = Self.ttl
            var failures: [String] = []
            for seed in UInt64(4_100_001)...4_100_010 {
                do {
                    try workload.run(seed: seed, tracing: false)
                } catch let failure as SimulationFailure {
                    failures.append("\(failure)")
                }
            }
            return failures
        }
        #expect(failures.isEmpty, "\(failures.joined(separator: "\n"))")
    }

    /// The mode lets the TTL pass with nodes apart, and moves single nodes' clocks ahead.
    @Test func expiryModeLetsTombstonesExpire() throws {
        var workload = RandomWorkload()
        workload.tombstoneTTL = Self.ttl
        let sim = try workload.run(seed: 4_100_003)
        #expect(sim.trace.contains { $0.hasSuffix("ms pass while nodes are apart: tombstones expire") })
        #expect(sim.trace.contains { $0.hasSuffix(" ms pass") })
    }

    /// Without the option the workload draws what it drew before: the same seed, the same trace
    /// whether `tombstoneTTL` is left alone or set back to `nil`, and no expiry in it.
    @Test func withoutTheOptionASeedReplaysAsBefore() throws {
        var off = RandomWorkload()
        off.tombstoneTTL = nil
        let first = try RandomWorkload().run(seed: 5).trace
        let second = try off.run(seed: 5).trace
        #expect(first == second)
        #expect(!first.contains { $0.contains("tombstones expire") || $0.contains(" ms pass") })
    }

    /// A and S subscribe to the whole collection. A writes d1 and d2, removes d1, and after the
    /// TTL both have reaped its tombstone: neither has a row of d1, only the reaped key. Every
    /// invariant holds: the kept state covers the writes to d1 (before, `writesPresent` reported
    /// them lost, and `ReapBreakTests` left those violations out by hand).
    @Test func aDocumentReapedEverywhereIsNotALostWrite() throws {
        let (sim, a, s, subs) = try Self.pair(seed: 9401)
        try a.store.collection("items").findByID("d1").remove()
        try sim.runUntilQuiet()
        sim.run(for: Self.ttl + 2 * 60_000)
        for node in [a, s] {
            #expect(try node.documents.state(id: "d1", in: "items") == nil, "\(node.name) reaped")
            #expect(try node.documents.reapedState(id: "d1", in: "items")?.isDeleted == true, "\(node.name)")
        }
        try sim.check()
        _ = subs
    }

    /// As above, but only A has reaped (early, by hand) while S still holds the tombstone as a
    /// row: the two agree, and every invariant holds.
    @Test func aTombstoneRowAndAReapedKeyWithTheSameStateAgree() throws {
        let (sim, a, s, subs) = try Self.pair(seed: 9402)
        try a.store.collection("items").findByID("d1").remove()
        try sim.runUntilQuiet()
        #expect(try a.documents.reapTombstones(in: "items", through: .max) == 1)
        #expect(try a.documents.state(id: "d1", in: "items") == nil)
        #expect(try s.documents.state(id: "d1", in: "items")?.isDeleted == true)
        try sim.check()
        _ = subs
    }

    /// A real loss is still caught. S, cut off, sets a field on d1; A, not having seen it,
    /// removes d1 and reaps the tombstone at once (by hand). S crashes for good before the heal:
    /// A's reaped key kept a state that does not hold S's write, and no up node has it.
    @Test func aWriteTheReapedTombstoneDoesNotHoldIsStillReportedLost() throws {
        let (sim, a, s, subs) = try Self.pair(seed: 9403)
        sim.partition([[a], [s]])
        _ = try s.store.collection("items").findByID("d1").update { $0?["x"].set(5) }
        try a.store.collection("items").findByID("d1").remove()
        #expect(try a.documents.reapTombstones(in: "items", through: .max) == 1)
        sim.crash(s)
        sim.heal()
        try sim.runUntilQuiet()
        do {
            try sim.check()
            Issue.record("S's write to d1 is held by no up node, and no violation says so")
        } catch let failure as SimulationFailure {
            #expect(failure.violations.contains { $0.contains("a lacks the write to items/\"d1\" made on s") })
        }
        _ = subs
    }

    /// Seed 315029662518 of the expiry sweep (`trellis simulate --replay 315029662518 --ttl
    /// 120000`), reduced. W writes d1 and subscribes to nothing yet; S subscribes to the whole
    /// collection and holds d1 (its checkpoint of W covers it). S is cut off, removes d1 and,
    /// after the TTL, reaps the tombstone. Then W subscribes to the whole collection (from 0: it
    /// has no checkpoint of S) and the partition heals.
    ///
    /// Promised (docs/MESH.md, "Tombstones"): a node away longer than the TTL "still shows the
    /// removed documents until it syncs. Then they disappear there too". In the seed, n0 (the
    /// writer, here W) asked n1 for its subscription `since 0` after the heal (its checkpoint of
    /// n1 was never stored: the link lost and reordered frames before the partition), n1 sent
    /// the live documents only, and n0 showed d11 for good while n1 and n2 held the reaped key.
    ///
    /// Failed before subscriptions said `h`: W showed d1 for good. W asks S from 0, as a new
    /// peer, so S sent its live documents and none of the tombstones it reaped (those went only to
    /// a peer found below the floor), and S's checkpoint of W covers d1, so W's stale copy never
    /// goes back to S to be removed again. Now W's subscription says it holds rows of the
    /// collection, and S's pages from 0 carry every tombstone S reaped.
    @Test func aWriterWithNoCheckpointOfTheRemoverStopsShowingADocumentRemovedAndReapedThere() throws {
        try Self.writerWithNoCheckpointOfTheRemover()
    }

    static func writerWithNoCheckpointOfTheRemover() throws {
        let sim = try Simulation(seed: 9404)
        sim.storeOptions.tombstoneTTL = UInt64(ttl)
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(s, w)
        // K, linked to S alone, takes S's remove, so S may reap it (the reaper keeps a remove no
        // peer has acknowledged: seed 4500046 above).
        let (k, kept) = try sim.addKeeper(beside: s)
        var subs = [try s.store.collection("items").findAll().subscribe(), kept]
        try w.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try s.store.collection("items").findByID("d1").exec() != nil)
        sim.partition([[w], [s, k]])
        try s.store.collection("items").findByID("d1").remove()
        sim.run(for: ttl + 2 * 60_000)
        #expect(try s.documents.state(id: "d1", in: "items") == nil, "S reaped d1's tombstone")
        subs.append(try w.store.collection("items").findAll().subscribe())
        sim.heal()
        try sim.runUntilQuiet()
        let shown = try w.store.collection("items").findAll().exec().map { JSON.string($0.id) }.sorted()
        #expect(shown == ["\"d2\""], "W still shows the document S removed and reaped")
        try sim.check()
        _ = subs
    }

    /// A and S, whole-collection subscribers, linked, holding d1 and d2 (written on A); their
    /// stores keep tombstones ``ttl``.
    static func pair(seed: UInt64) throws -> (Simulation, SimulatedNode, SimulatedNode, [Subscription]) {
        let sim = try Simulation(seed: seed)
        sim.storeOptions.tombstoneTTL = UInt64(ttl)
        let a = try sim.addNode("a")
        let s = try sim.addNode("s")
        sim.connect(s, a)
        let subs = try [a, s].map { (node: SimulatedNode) in try node.store.collection("items").findAll().subscribe() }
        try a.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        return (sim, a, s, subs)
    }
}
