import Foundation
import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// Deltas between real nodes (docs/DELTAS.md): a local write to a document both hold goes as the
/// fields it changed, is not echoed back, and a node that cannot apply one gets the whole state.
@Suite struct DeltaSimulationTests {
    static func car(_ i: Int) -> [String: Value] {
        var fields: [String: Value] = ["_id": .string("car\(i)"), "price": .int(1_000)]
        for f in 0..<19 { fields["field\(f)"] = .string("value number \(f) of car \(i)") }
        return fields
    }

    /// Two nodes, each subscribed to the whole collection, holding ten 20-field cars.
    static func mesh(seed: UInt64) throws -> (Simulation, SimulatedNode, SimulatedNode, [Subscription]) {
        let sim = try Simulation(seed: seed)
        let a = try sim.addNode()
        let b = try sim.addNode()
        sim.connectAll()
        var subs: [Subscription] = []
        for node in [a, b] { subs.append(try node.store.collection("cars").findAll().subscribe()) }
        for i in 0..<10 {
            try a.store.collection("cars").upsert(.map(UTF8Map(uniqueKeysWithValues: car(i).map { ($0, $1) })))
        }
        try sim.runUntilQuiet()
        return (sim, a, b, subs)
    }

    static func value(_ node: SimulatedNode, _ id: String) throws -> Value? {
        try node.store.collection("cars").findByID(.string(id)).exec()?.value
    }

    @Test func aOneFieldChangeTravelsAsADeltaAndIsNotEchoed() throws {
        let (sim, a, b, subs) = try Self.mesh(seed: 9101)
        defer { subs.forEach { $0.cancel() } }
        let (documents, deltas) = (sim.documentsSent, sim.deltasSent)
        for i in 0..<10 {
            try a.store.collection("cars").findByID(.string("car\(i)")).update { $0?["price"].set(.int(2_000)) }
        }
        try sim.runUntilQuiet()
        for i in 0..<10 { #expect(try Self.value(b, "car\(i)") == (try Self.value(a, "car\(i)"))) }
        #expect(try Self.value(b, "car3")?["price"] == .int(2_000))
        #expect(sim.deltasSent - deltas == 10, "\(sim.deltasSent - deltas) deltas")
        // Each went once, A to B: B's row is A's state, byte for byte, and is not sent back.
        #expect(sim.documentsSent - documents == 10, "\(sim.documentsSent - documents) documents")
        #expect(try a.documents.state(id: "car3", in: "cars") == (try b.documents.state(id: "car3", in: "cars")))
    }

    @Test func aNodeThatEvictedTheDocumentGetsTheWholeState() throws {
        let (sim, a, b, subs) = try Self.mesh(seed: 9102)
        defer { subs.forEach { $0.cancel() } }
        #expect(try b.store.collection("cars").findByID("car1").evict())
        try a.store.collection("cars").findByID("car1").update { $0?["price"].set(.int(3_000)) }
        try a.store.collection("cars").findByID("car2").update { $0?["price"].set(.int(3_000)) }
        try sim.runUntilQuiet()
        #expect(try Self.value(b, "car1") == (try Self.value(a, "car1")))
        #expect(try Self.value(b, "car2")?["price"] == .int(3_000))
    }

    @Test func aNodeThatMissedWritesWhileAwayCatchesUp() throws {
        let (sim, a, b, subs) = try Self.mesh(seed: 9103)
        defer { subs.forEach { $0.cancel() } }
        sim.partition([[a], [b]])
        for round in 0..<3 {
            for i in 0..<10 {
                try a.store.collection("cars").findByID(.string("car\(i)")).update {
                    $0?["field\(round)"].set(.string("changed \(round)"))
                }
            }
            try b.store.collection("cars").findByID("car5").update { $0?["price"].set(.int(Int64(round))) }
            sim.run(for: 1_000)
        }
        sim.heal()
        try sim.runUntilQuiet()
        for i in 0..<10 { #expect(try Self.value(b, "car\(i)") == (try Self.value(a, "car\(i)"))) }
        #expect(try Self.value(a, "car5")?["field2"] == .string("changed 2"))
        #expect(try Self.value(a, "car5")?["price"] == .int(2))
    }
}
