import Foundation
import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// What a mesh where every node has a session with every other (a LAN found by discovery) costs
/// in presence records (docs/MESH.md, "Presence"). Found by the resource-growth probe run with
/// discovery on: 40 shells on one host and a node holding 100,000 documents formed a full mesh,
/// and 39 of the 40 shells received none of their 200 documents in 30 s. Every session that came
/// up sent the node's record to every other peer at once, and every peer forwarded every record
/// to all of its peers, each of which already had it from its node: presence grew with the fourth
/// power of the mesh's size (1,216,800 messages, 1.18 GB, for 40 nodes on the simulator), and
/// each record that changed a neighbour's list worked out again what every peer is asked for.
@Suite struct MeshControlTrafficTests {
    /// A full mesh: `a` holds 1,000 documents and subscribes to all of them; the others
    /// subscribe to the 20 with `n < 20`.
    static func fullMesh(_ size: Int, seed: UInt64) throws -> (Simulation, [SimulatedNode], [Subscription]) {
        let sim = try Simulation(seed: seed)
        sim.tracing = false
        let a = try sim.addNode("a")
        let others = try (1..<size).map { try sim.addNode("o\($0)") }
        try a.store.collection("items").upsert((0..<1_000).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] })
        let subscriptions =
            [try a.store.collection("items").findAll().subscribe()]
            + (try others.map { try $0.store.collection("items").find("n < 20").subscribe() })
        sim.connectAll()
        return (sim, [a] + others, subscriptions)
    }

    /// 24 nodes, every one with a session with every other: each of the 23 holds its 20
    /// documents, every node sees all 24 in its presence graph, and presence costs at most 4
    /// messages per ordered pair of nodes (about 2.4 for 10, 20 or 40 nodes; before, 45 per pair
    /// for 10 nodes, 190 for 20 and 780 for 40).
    @Test func aFullMeshFormsWithPresenceTrafficQuadraticInItsSize() throws {
        let size = 24
        let (sim, nodes, subscriptions) = try Self.fullMesh(size, seed: 9200)
        defer { subscriptions.forEach { $0.cancel() } }
        try sim.runUntilQuiet()
        for node in nodes.dropFirst() {
            let held = try node.store.collection("items").findAll().count()
            #expect(held == 20, "\(node.name) holds \(held)")
        }
        for node in nodes {
            #expect(
                node.presence?.remotePeers.count == size - 1,
                "\(node.name) sees \(node.presence?.remotePeers.count ?? 0)")
        }
        let presence = sim.messageCounts["presence", default: 0]
        let pairs = size * (size - 1)
        #expect(presence <= 4 * pairs, "\(presence) presence messages for \(pairs) ordered pairs")
    }

    /// Once formed, the mesh stays quiet, and when one node leaves, each other node learns it
    /// from that node's neighbours' new records: every graph drops it, and presence costs a few
    /// messages per remaining pair, not one per record per path.
    @Test func aNodeLeavingAFullMeshIsSeenGoneAtBoundedCost() throws {
        let size = 16
        let (sim, nodes, subscriptions) = try Self.fullMesh(size, seed: 9201)
        defer { subscriptions.forEach { $0.cancel() } }
        try sim.runUntilQuiet()
        let before = sim.messageCounts["presence", default: 0]
        sim.crash(nodes[5])
        try sim.runUntilQuiet()
        for node in nodes where node !== nodes[5] {
            #expect(
                node.presence?.remotePeers.count == size - 2,
                "\(node.name) sees \(node.presence?.remotePeers.count ?? 0)")
        }
        let presence = sim.messageCounts["presence", default: 0] - before
        let pairs = (size - 1) * (size - 2)
        #expect(presence <= 2 * pairs, "\(presence) presence messages for \(pairs) ordered pairs")
        // What a remaining node writes still reaches every other's query.
        try nodes[3].store.collection("items").upsert(["_id": "late", "n": 7])
        try sim.runUntilQuiet()
        for node in nodes where node !== nodes[5] {
            #expect(try node.store.collection("items").findByID("late").exec() != nil, "\(node.name) lacks it")
        }
    }
}
