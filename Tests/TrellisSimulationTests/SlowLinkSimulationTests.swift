import Testing
import Trellis
import TrellisSimulation

/// A link so slow that one batch takes longer than the liveness timeout (15 s) to cross it: the
/// keepalive pings wait behind the batch, so no whole message arrives for longer than the
/// timeout. The receiver closed the session, the next session sent the same batch again, and the
/// first sync never completed (with real processes: 4 KB documents at 2 Mbit/s, 1 KB ones at
/// 512 kbit/s). Bytes of a message still arriving now count as the peer being alive.
@Suite struct SlowLinkSimulationTests {
    @Test func aFirstSyncOverALinkSlowerThanABatchPerTimeoutCompletes() throws {
        let sim = try Simulation(seed: 9301)
        let p = try sim.addNode("p")
        let n = try sim.addNode("n")
        let pSub = try p.store.collection("items").findAll().subscribe()
        let pad = String(repeating: "x", count: 200)
        for chunk in stride(from: 0, to: 3_000, by: 500) {
            try p.store.collection("items").upsert(
                (chunk..<(chunk + 500)).map { ["_id": .string("d\($0)"), "pad": .string(pad)] })
        }
        // About 270 KB per batch at 12 KB/s: 22 s each, 67 s in all.
        sim.setProfile(LinkProfile(latency: 5, bytesPerSecond: 12_000), between: n, and: p)
        let whole = try n.store.collection("items").findAll().subscribe()
        sim.connect(n, p)
        try sim.runUntilQuiet()
        #expect(try n.store.collection("items").findAll().count() == 3_000)
        #expect(!sim.trace.contains { $0.contains("no message from the peer") })
        try sim.check()
        whole.cancel()
        pSub.cancel()
    }
}
