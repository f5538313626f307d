import Foundation
import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// Presence on the simulator: every node draws the whole mesh from gossiped presence records,
/// with hop counts; a node that leaves disappears and comes back when it returns.
@Suite struct PresenceSimulationTests {
    func hops(_ graph: PresenceGraph?) -> [String: Int] {
        var out: [String: Int] = [:]
        for peer in graph?.remotePeers ?? [] { out[peer.peerKeyString] = peer.hops }
        return out
    }

    func key(_ node: SimulatedNode) -> String { node.peerKey.map { String(format: "%02x", $0) }.joined() }

    @Test func aChainOfFiveIsSeenWholeFromEitherEndAndHeals() throws {
        let sim = try Simulation(seed: 21)
        let nodes = try (0..<5).map { _ in try sim.addNode() }
        for (a, b) in zip(nodes, nodes.dropFirst()) { sim.connect(a, b) }
        try sim.runUntilQuiet()
        let first = nodes[0].presence
        #expect(hops(first) == Dictionary(uniqueKeysWithValues: (1..<5).map { (key(nodes[$0]), $0) }))
        #expect(first?.connections.count == 4)
        #expect(first?.remotePeers.first?.isConnectedToLocalPeer == true)
        #expect(first?.remotePeers.allSatisfy(\.isCompatible) == true)
        #expect(hops(nodes[4].presence)[key(nodes[0])] == 4)
        #expect(hops(nodes[2].presence).values.sorted() == [1, 1, 2, 2])

        // The far end crashes: once its neighbour's session times out, it leaves every graph.
        sim.crash(nodes[4])
        try sim.runUntilQuiet()
        for node in nodes.prefix(4) {
            #expect(hops(node.presence)[key(nodes[4])] == nil, "\(node.name) still sees the crashed node")
            #expect(node.presence?.remotePeers.count == 3)
        }
        // It comes back (restarted: its presence `seq` starts over) and is seen again.
        try sim.restart(nodes[4])
        try sim.runUntilQuiet()
        #expect(hops(nodes[0].presence)[key(nodes[4])] == 4)
        #expect(hops(nodes[4].presence)[key(nodes[0])] == 4)

        // A partition splits the chain in two: each side sees only itself, then all heal.
        sim.partition([Array(nodes.prefix(2)), Array(nodes.dropFirst(2))])
        try sim.runUntilQuiet()
        #expect(Set(hops(nodes[0].presence).keys) == [key(nodes[1])])
        #expect(Set(hops(nodes[4].presence).keys) == Set([2, 3].map { key(nodes[$0]) }))
        sim.heal()
        try sim.runUntilQuiet()
        #expect(hops(nodes[0].presence).count == 4)
        try sim.check()
    }

    /// Presence records are sent when neighbours change, never while the mesh is quiet: a
    /// random mesh of 12 goes quiet (the simulator's quiet check counts every message but
    /// keepalives) and every node sees all 12.
    @Test func aRandomMeshOfTwelveConvergesAndGoesQuiet() throws {
        let sim = try Simulation(seed: 22)
        for _ in 0..<12 { try sim.addNode() }
        sim.connectRandomly(extraLinks: 6)
        try sim.runUntilQuiet()
        for node in sim.nodes {
            #expect(node.presence?.remotePeers.count == 11, "\(node.name)")
            #expect(node.presence?.connections.count == sim.linkCount, "\(node.name)")
        }
    }
}
