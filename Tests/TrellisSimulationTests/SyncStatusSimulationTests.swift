import Foundation
import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// Sync status on the receiving side (``SyncProgress``): a first large sync over a slow link
/// reports growing progress and a shrinking count of what is left, then completes.
@Suite struct SyncStatusSimulationTests {
    func progress(_ node: SimulatedNode) -> SyncProgress? {
        node.replicator?.status.peers.first { $0.phase == "established" }?.asked.first?.progress
    }

    @Test func aFirstLargeSyncReportsProgressThenCompletes() throws {
        let sim = try Simulation(seed: 7)
        let a = try sim.addNode()
        let b = try sim.addNode()
        for start in stride(from: 0, to: 3_000, by: 500) {
            try a.store.collection("items").upsert(
                (start..<start + 500).map {
                    ["_id": .string("d\($0)"), "text": .string(String(repeating: "x", count: 200))]
                })
        }
        let subscription = try b.store.collection("items").findAll().subscribe()
        defer { subscription.cancel() }
        var slow = LinkProfile()
        slow.bytesPerSecond = 100_000  // about 3 s of virtual time for 3,000 documents of ~250 bytes
        sim.connect(a, b)
        sim.setProfile(slow, between: a, and: b)
        var samples: [SyncProgress] = []
        for _ in 0..<200 {
            sim.run(for: 100)
            if let p = progress(b) { samples.append(p) }
            if samples.last?.initialSyncComplete == true { break }
        }
        let final = try #require(samples.last)
        #expect(final.initialSyncComplete)
        #expect(final.documents == 3_000)
        #expect(final.fraction == 1)
        let during = samples.filter { !$0.initialSyncComplete && $0.batches > 0 }
        #expect(during.count >= 3, "too few samples during the sync: \(samples.count)")
        // What is left only shrinks, and progress only grows, while the sync runs.
        for (earlier, later) in zip(during, during.dropFirst()) {
            #expect((later.left ?? 0) <= (earlier.left ?? 0))
            #expect((later.fraction ?? 0) >= (earlier.fraction ?? 0))
        }
        #expect(during.contains { ($0.fraction ?? 0) > 0 && ($0.fraction ?? 1) < 1 })
        // And a's sent count matches: every document once.
        #expect(try b.store.collection("items").findAll().exec().count == 3_000)
    }

    /// Under churn: a crashed peer leaves the status (its session ends); once it restarts, the
    /// new session completes its initial sync again, including what was written meanwhile.
    @Test func statusFollowsAPeerThatCrashesAndReturns() throws {
        let sim = try Simulation(seed: 9)
        let a = try sim.addNode()
        let b = try sim.addNode()
        try a.store.collection("items").upsert((0..<50).map { ["_id": .string("d\($0)")] })
        let subscription = try b.store.collection("items").findAll().subscribe()
        defer { subscription.cancel() }
        sim.connect(a, b)
        try sim.runUntilQuiet()
        #expect(progress(b)?.initialSyncComplete == true)
        #expect(progress(b)?.documents == 50)
        sim.crash(a)
        try sim.runUntilQuiet()
        #expect(progress(b) == nil)
        #expect(b.replicator?.status.peers.isEmpty == true)
        try sim.restart(a)
        try a.store.collection("items").upsert(["_id": "late"])
        try sim.runUntilQuiet()
        let after = try #require(progress(b))
        #expect(after.initialSyncComplete)
        #expect(after.documents == 1, "only what b did not hold yet: \(after)")
        #expect(try b.store.collection("items").findAll().exec().count == 51)
    }

    /// A subscription with nothing to send completes at once: the peer says `left: 0`.
    @Test func anEmptySubscriptionCompletesAtOnce() throws {
        let sim = try Simulation(seed: 8)
        let a = try sim.addNode()
        let b = try sim.addNode()
        let subscription = try b.store.collection("nothing-here").findAll().subscribe()
        defer { subscription.cancel() }
        sim.connect(a, b)
        try sim.runUntilQuiet()
        let p = try #require(progress(b))
        #expect(p.initialSyncComplete)
        #expect(p.documents == 0)
        #expect(p.fraction == 1)
    }
}
