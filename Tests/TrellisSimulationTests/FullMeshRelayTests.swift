import Testing
import Trellis
import TrellisSimulation
import TrellisStore

/// Relays where neighbours also have sessions with each other (docs/MESH.md, "Relay"): a node
/// does not relay a neighbour's subscriptions to a peer that neighbour says it has a session
/// with. Found by the resource-growth probe run with discovery on: 50 shells and a node holding
/// 100,000 documents, all found by discovery on one host, formed a full mesh; each shell relayed
/// the node's whole-collection subscription to every other, so each fetched the whole collection
/// for it, and in two minutes none received the 200-document slice it subscribed to.
@Suite struct FullMeshRelayTests {
    typealias Held = HeldDocumentsSimulationTests

    static func write(_ node: SimulatedNode, _ count: Int, prefix: String = "d") throws {
        try node.store.collection("items").upsert(
            (0..<count).map { ["_id": .string("\(prefix)\($0)"), "n": .int(Int64($0))] })
    }

    static func count(_ node: SimulatedNode) throws -> Int { try node.store.collection("items").findAll().count() }

    /// A holds 2,000 documents and subscribes to the whole collection; five others subscribe to
    /// the 20 with `n < 20`; every node has a session with every other. Each of the five holds its
    /// 20 documents and nothing more: before, each relayed A's subscription to the others, asked
    /// A for the whole collection on their behalf, and held all 2,000.
    @Test func aWholeCollectionSubscriptionIsNotRelayedAroundAFullMesh() throws {
        let sim = try Simulation(seed: 9101)
        let a = try sim.addNode("a")
        let others = try (0..<5).map { try sim.addNode("o\($0)") }
        try Self.write(a, 2_000)
        let subA = try Held.subscribe(a)
        let subs = try others.map { try Held.subscribe($0, "n < 20") }
        sim.connectAll()
        try sim.runUntilQuiet()
        for node in others {
            let held = try Self.count(node)
            #expect(held == 20, "\(node.name) holds \(held)")
        }
        // What the five write still reaches A, directly.
        try others[2].store.collection("items").upsert(["_id": "from-o2", "n": 5])
        try sim.runUntilQuiet()
        #expect(try Held.get(a, "from-o2") != nil)
        #expect(try others.filter { $0 !== others[2] }.allSatisfy { try Held.get($0, "from-o2") != nil })
        subA.cancel()
        subs.forEach { $0.cancel() }
    }

    /// A, B and R have sessions with one another; A subscribes to everything. R relays nothing
    /// while A and B meet directly. Then the A–B link goes down: A's next presence record no
    /// longer names B, R relays A's subscription to B, and what B writes next reaches A through R.
    @Test func aRelayResumesWhenTheDirectLinkGoesDown() throws {
        let sim = try Simulation(seed: 9102)
        let a = try sim.addNode("a")
        let b = try sim.addNode("b")
        let r = try sim.addNode("r")
        let subA = try Held.subscribe(a)
        sim.connectAll()
        try Self.write(b, 10, prefix: "b")
        try sim.runUntilQuiet()
        #expect(try Self.count(a) == 10)
        #expect(try Self.count(r) == 0, "r relayed while a and b met directly")
        sim.setLink(a, b, up: false)
        try sim.runUntilQuiet()
        try b.store.collection("items").upsert(["_id": "late", "n": 99])
        try sim.runUntilQuiet()
        #expect(try Held.get(a, "late") != nil)
        #expect(try Held.get(r, "late") != nil, "the write came through r")
        // The link back: A and B meet again, and R stops relaying.
        sim.setLink(a, b, up: true)
        try sim.runUntilQuiet()
        let relayed = r.replicator?.status.peers.first { $0.peerKey == b.peerKey }?.asked.map(\.spec) ?? []
        #expect(relayed.isEmpty, "r still asks b for \(relayed)")
        subA.cancel()
    }

    /// A line A – R – B (A and B never meet): R relays A's subscription to B as before.
    @Test func aLineStillRelays() throws {
        let sim = try Simulation(seed: 9103)
        let a = try sim.addNode("a")
        let r = try sim.addNode("r")
        let b = try sim.addNode("b")
        let subA = try Held.subscribe(a)
        sim.connect(a, r)
        sim.connect(r, b)
        try Self.write(b, 10, prefix: "b")
        try sim.runUntilQuiet()
        #expect(try Self.count(a) == 10)
        #expect(try Self.count(r) == 10)
        subA.cancel()
    }
}
