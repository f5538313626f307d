import Testing

@testable import TrellisSimulation

/// The meshes the simulator draws stay within the reach of subscriptions (a node's own and 4
/// forwardings: docs/MESH.md, "Relay"). Two seeds of `--nodes 5-8 --steps 120 --queries 3` drew a
/// chain of seven nodes whose ends were six links apart, and reported as lost the writes that
/// Trellis does not carry that far.
@Suite struct SimulationMeshTests {
    /// The largest number of links between two nodes of the mesh.
    static func diameter(_ sim: Simulation) -> Int {
        let index = Dictionary(uniqueKeysWithValues: sim.nodes.enumerated().map { ($1.name, $0) })
        var neighbours = Array(repeating: Set<Int>(), count: sim.nodes.count)
        for (i, node) in sim.nodes.enumerated() {
            for peer in node.staticPeers {
                neighbours[i].insert(index[peer]!)
                neighbours[index[peer]!].insert(i)
            }
        }
        var widest = 0
        for start in sim.nodes.indices {
            var distance = [start: 0]
            var frontier = [start]
            while let i = frontier.first {
                frontier.removeFirst()
                for j in neighbours[i] where distance[j] == nil {
                    distance[j] = distance[i]! + 1
                    frontier.append(j)
                }
            }
            #expect(distance.count == sim.nodes.count, "the mesh is connected")
            widest = max(widest, distance.values.max() ?? 0)
        }
        return widest
    }

    @Test func randomMeshesAreNoWiderThanSubscriptionsReach() throws {
        var widest = 0
        for seed in UInt64(1)...200 {
            let sim = try Simulation(seed: seed)
            for _ in 0..<9 { try sim.addNode() }
            sim.connectRandomly(extraLinks: 0)
            let diameter = Self.diameter(sim)
            #expect(diameter <= 5, "seed \(seed): two nodes \(diameter) links apart")
            widest = max(widest, diameter)
        }
        #expect(widest == 5, "some trees are as wide as subscriptions reach")
    }

    @Test(arguments: [33914 as UInt64, 34437])
    func seedsThatDrewAChainTooLongRunWithinReach(_ seed: UInt64) throws {
        var workload = RandomWorkload()
        workload.nodes = 5...8
        workload.steps = 120
        workload.queryNodes = 3
        let sim = try workload.run(seed: seed, tracing: false)  // throws when an invariant breaks
        #expect(Self.diameter(sim) <= 5)
    }
}
