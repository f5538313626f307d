import Foundation
import TrellisCore
import TrellisSimulation

/// Evicted documents asked for again (F10, docs/MESH.md "Eviction"), against a first sync of the
/// same documents, on the simulator: two nodes in this thread over a 5 ms link, B subscribed to
/// the whole collection, evicting all of it once it has arrived. Wall time per document of each
/// (both nodes' work: the sender's reads, the receiver's merges), and the bytes of the `subs` and
/// `ack` messages the refetch sent, per document.
func refetchFigures(documents: [Value]) throws -> [Figure] {
    let sim = try Simulation(seed: 1)
    sim.tracing = false
    sim.defaultProfile = LinkProfile(latency: 5)
    let a = try sim.addNode()
    let b = try sim.addNode()
    sim.connect(a, b)
    try a.store.collection("cars").upsert(documents)
    let subscription = try b.store.collection("cars").findAll().subscribe()
    defer { subscription.cancel() }
    let sync = try seconds { try sim.runUntilQuiet(quietFor: 10_000) }
    let evicted = try b.store.collection("cars").findAll().evict()
    let bytesBefore = sim.messageBytes
    let refetch = try seconds { try sim.runUntilQuiet(quietFor: 10_000) }
    let held = try b.store.collection("cars").findAll().count()
    precondition(held == documents.count, "the refetch brought back \(held) of \(evicted.count) documents")
    let count = Double(documents.count)
    func bytesPerDocument(_ kind: String) -> Double {
        Double(sim.messageBytes[kind, default: 0] - bytesBefore[kind, default: 0]) / count
    }
    return [
        Figure(name: "sim_first_sync_docs_per_s", value: count / sync, unit: "docs/s"),
        Figure(
            name: "sim_refetch_docs_per_s", value: count / refetch, unit: "docs/s", baseline: count / sync,
            baselineName: "sim_first_sync_docs_per_s"),
        Figure(name: "sim_refetch_subs_bytes_per_doc", value: bytesPerDocument("subs"), unit: "B"),
        Figure(name: "sim_refetch_ack_bytes_per_doc", value: bytesPerDocument("ack"), unit: "B"),
        Figure(name: "sim_refetch_batch_bytes_per_doc", value: bytesPerDocument("batch"), unit: "B"),
    ]
}
