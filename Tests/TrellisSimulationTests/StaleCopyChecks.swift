import Testing
import TrellisCore
import TrellisSimulation

/// What the reaped-tombstone break suites check on every node (`EpochReapBreakTests`,
/// `HDecisionBreakTests`): the documents each shows, and that a removed one shows nowhere, with
/// the trace printed when it still does.
protocol StaleCopyChecks {}

extension StaleCopyChecks {
    /// The `_id`s `node` shows in `items`, as JSON text, sorted.
    static func ids(_ node: SimulatedNode) throws -> [String] {
        try node.store.collection("items").findAll().exec().map { JSON.string($0.id) }.sorted()
    }

    /// Expects `gone` on no running node of `nodes`; prints the trace (without keepalives and
    /// presence) when some node still shows it.
    static func expectGone(
        _ sim: Simulation, _ nodes: [SimulatedNode], _ label: String, gone: [String] = ["\"d1\""]
    ) throws {
        var bad = false
        for node in nodes where node.isUp {
            let shown = try ids(node)
            let stale = shown.filter { gone.contains($0) }
            if !stale.isEmpty { bad = true }
            #expect(stale.isEmpty, "\(label): \(node.name) shows \(shown)")
        }
        if bad { dump(sim, label) }
    }

    /// Prints the last `last` lines of the trace, without keepalives and presence.
    static func dump(_ sim: Simulation, _ label: String, last: Int = 160) {
        let lines = sim.trace.filter {
            !$0.contains(" ping") && !$0.contains(" pong") && !$0.contains("presence")
        }
        print("==== \(label): trace, last \(min(last, lines.count)) of \(lines.count) lines ====")
        for line in lines.suffix(last) { print(line) }
        print("==== end \(label) ====")
    }
}
