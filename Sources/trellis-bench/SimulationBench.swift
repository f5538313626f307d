import Foundation
import TrellisCore
import TrellisSimulation

/// Figures of the simulator and of propagation through random meshes (docs/BENCHMARKS.md,
/// "Simulated meshes"): seeds per minute, hops and simulated time for one write to reach every
/// node against ⌈log₂ N⌉, and batches per update against the number of links.
func simulationFigures(meshSizes: [Int], seedsPerSize: Int) throws -> [Figure] {
    var figures: [Figure] = []
    // Seeds per minute: the test suite's workload on 8-node meshes.
    var workload = RandomWorkload()
    workload.nodes = 8...8
    let sweepSeeds = 20
    let sweep = try seconds { for seed in 1...UInt64(sweepSeeds) { try workload.run(seed: seed, tracing: false) } }
    figures.append(
        Figure(name: "simulated_seeds_per_min_8_nodes", value: Double(sweepSeeds) / sweep * 60, unit: "seeds/min"))

    for size in meshSizes {
        var hops: [Double] = []
        var times: [Double] = []
        var perLink: [Double] = []
        var worstDirection = 0
        var setup = 0.0
        for seed in 1...UInt64(seedsPerSize) {
            let started = Date()
            let sim = try Simulation(seed: seed)
            sim.tracing = false
            sim.defaultProfile = LinkProfile(latency: 5)
            sim.recordsArrivals = true
            for _ in 0..<size { try sim.addNode() }
            sim.connectRandomly(extraLinks: 2 * size)
            var subscriptions: [Any] = []
            for node in sim.nodes { subscriptions.append(try node.store.collection("items").findAll().subscribe()) }
            try sim.runUntilQuiet(quietFor: 10_000)
            setup += Date().timeIntervalSince(started)
            sim.countRepeatedBatches()
            let writer = sim.nodes[Int(seed) % size]
            let start = sim.now
            try writer.store.collection("items").upsert(["_id": "probe", "v": 1])
            try sim.runUntilQuiet(quietFor: 10_000)
            let arrivals = sim.arrivalTimes(of: "probe", in: "items")
            precondition(arrivals.count == size, "the write reached \(arrivals.count) of \(size) nodes")
            let last = Double(arrivals.values.max()! - start)
            times.append(last)
            hops.append(last / 5)
            perLink.append(Double(sim.batchRepeats.values.reduce(0, +)) / Double(sim.linkCount))
            var byDirection: [Substring: Int] = [:]
            for (key, count) in sim.batchRepeats { byDirection[key.split(separator: " ")[0], default: 0] += count }
            worstDirection = max(worstDirection, byDirection.values.max() ?? 0)
            _ = subscriptions
        }
        let log2 = ceil(Foundation.log2(Double(size)))
        figures.append(
            Figure(
                name: "mesh_\(size)_hops_to_all", value: median(hops), unit: "hops", baseline: log2,
                baselineName: "ceil_log2_\(size)"))
        figures.append(
            Figure(
                name: "mesh_\(size)_simulated_ms_to_every_node_median", value: median(times), unit: "ms (5 ms links)"))
        figures.append(
            Figure(
                name: "mesh_\(size)_batches_per_update_per_link_median", value: median(perLink), unit: "batches/link"))
        figures.append(
            Figure(
                name: "mesh_\(size)_max_batches_with_the_update_one_direction", value: Double(worstDirection),
                unit: "batches (goal: 1)"))
        figures.append(Figure(name: "mesh_\(size)_build_seconds", value: setup / Double(seedsPerSize), unit: "s"))
    }
    return figures
}

func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    return sorted.isEmpty ? 0 : sorted[sorted.count / 2]
}
