import Testing
import Trellis
import TrellisSimulation

// The worked example of docs/SIMULATION.md, verbatim: an app tested on five simulated nodes
// through a partition and a crash.

/// The app under test: a chat room on a Trellis store.
struct ChatRoom {
    let store: Store

    func post(_ text: String, by author: String, at time: Int64) throws {
        try store.collection("messages").upsert(["author": .string(author), "text": .string(text), "time": .int(time)])
    }

    func transcript() throws -> [String] {
        try store.collection("messages").findAll().sort("time").exec().compactMap { $0["text"]?.stringValue }
    }
}

@Suite struct ChatRoomSimulationTests {
    @Test func everyoneSeesEveryMessageAfterAPartitionAndACrash() throws {
        let sim = try Simulation(seed: 2026)
        for _ in 0..<5 { try sim.addNode() }
        sim.connectAll()
        var subscriptions: [Subscription] = []
        for node in sim.nodes {
            subscriptions.append(try node.store.collection("messages").findAll().subscribe())
            try node.watch("messages")  // the invariants also check this live query
        }
        let (ann, bob, cat) = (sim.nodes[0], sim.nodes[1], sim.nodes[4])

        try ChatRoom(store: ann.store).post("hello", by: "ann", at: 1)
        try sim.runUntilQuiet()

        // Ann and Bob are cut off from the other three; both sides keep talking.
        sim.partition([[ann, bob], [sim.nodes[2], sim.nodes[3], cat]])
        try ChatRoom(store: bob.store).post("anyone there?", by: "bob", at: 2)
        try ChatRoom(store: cat.store).post("we lost them", by: "cat", at: 3)
        sim.run(for: 60_000)  // a simulated minute, in milliseconds of real time

        // Cat's device crashes and comes back with its store intact; then the network heals.
        sim.crash(cat)
        try sim.restart(cat)
        try ChatRoom(store: cat.store).post("back", by: "cat", at: 4)
        sim.heal()
        try sim.runUntilQuiet()

        try sim.check()  // converged replicas, no lost writes, live queries current, ...
        for node in sim.nodes {
            #expect(try ChatRoom(store: node.store).transcript() == ["hello", "anyone there?", "we lost them", "back"])
        }
        _ = subscriptions
    }
}
