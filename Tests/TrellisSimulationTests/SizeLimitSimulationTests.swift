import Testing
import Trellis
import TrellisSimulation

/// Writes made apart, each within the document size limit, that merge above it (found by a
/// reviewer with real processes: each node kept the other's state deferred for good).
@Suite struct SizeLimitSimulationTests {
    @Test func writesMadeApartThatMergeAboveTheLimitConverge() throws {
        let sim = try Simulation(seed: 9201)
        sim.storeOptions.maxDocumentBytes = 4_000
        sim.storeOptions.warnDocumentBytes = 1_000
        let a = try sim.addNode()
        let b = try sim.addNode()
        let c = try sim.addNode()
        var subs: [Subscription] = []
        for node in [a, b, c] { subs.append(try node.store.collection("items").findAll().subscribe()) }
        defer { subs.forEach { $0.cancel() } }
        sim.connect(a, b)
        sim.connect(b, c)
        try a.store.collection("items").upsert(["_id": "d", "s": .string(String(repeating: "s", count: 1_000))])
        try sim.runUntilQuiet()
        sim.partition([[a], [b, c]])
        _ = try a.store.collection("items").findByID("d").update {
            $0?["fa"].set(.string(String(repeating: "a", count: 700)))
        }
        _ = try b.store.collection("items").findByID("d").update {
            $0?["fb"].set(.string(String(repeating: "b", count: 700)))
        }
        sim.heal()
        try sim.runUntilQuiet()
        for node in [a, b, c] {
            let d = try node.store.collection("items").findByID("d").exec()
            #expect(d?["fa"] != nil && d?["fb"] != nil, "\(node.name) holds \(String(describing: d?.value))")
        }
        try sim.check()
    }
}
