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
    return figures + (try fullMeshFigures(sizes: [10, 40]))
}

/// A mesh where every node has a session with every other (a LAN found by discovery): one node
/// holds 1,000 documents and subscribes to all of them, every other subscribes to 20. For each
/// size: the wall time for the mesh to form, deliver and go quiet on the simulator (the sync
/// engines' own work: no sockets, no cipher), and the presence messages per ordered pair of
/// nodes, whose ratio against the smallest mesh's stays near 1 when presence grows with the
/// square of the size (docs/MESH.md, "Presence"), as it must for a mesh of this shape.
private func fullMeshFigures(sizes: [Int]) throws -> [Figure] {
    var figures: [Figure] = []
    var smallest: (size: Int, perPair: Double)?
    for size in sizes {
        let started = Date()
        let sim = try Simulation(seed: 9200)
        sim.tracing = false
        let holder = try sim.addNode()
        let others = try (1..<size).map { _ in try sim.addNode() }
        try holder.store.collection("items").upsert(
            (0..<1_000).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] })
        var subscriptions: [Any] = [try holder.store.collection("items").findAll().subscribe()]
        for node in others { subscriptions.append(try node.store.collection("items").find("n < 20").subscribe()) }
        sim.connectAll()
        try sim.runUntilQuiet()
        let wall = Date().timeIntervalSince(started)
        for node in others {
            let held = try node.store.collection("items").findAll().count()
            precondition(held == 20, "a node of the full mesh of \(size) holds \(held) documents, not 20")
        }
        _ = subscriptions
        let pairs = Double(size * (size - 1))
        let perPair = Double(sim.messageCounts["presence", default: 0]) / pairs
        figures.append(Figure(name: "full_mesh_\(size)_seconds_to_quiet", value: wall, unit: "s"))
        figures.append(
            Figure(
                name: "full_mesh_\(size)_presence_bytes_per_node",
                value: Double(sim.messageBytes["presence", default: 0]) / Double(size), unit: "bytes"))
        if let smallest {
            figures.append(
                Figure(
                    name: "full_mesh_\(size)_presence_messages_per_pair", value: perPair, unit: "messages",
                    baseline: smallest.perPair, baselineName: "full_mesh_\(smallest.size)_presence_messages_per_pair"))
        } else {
            smallest = (size, perPair)
            figures.append(
                Figure(name: "full_mesh_\(size)_presence_messages_per_pair", value: perPair, unit: "messages"))
        }
    }
    return figures
}

func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    return sorted.isEmpty ? 0 : sorted[sorted.count / 2]
}
