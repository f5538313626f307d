import Foundation
import Trellis
import TrellisCore
import TrellisSimulation

/// What the encrypted link adds to one message sent on its own: the message's 4-byte length, the
/// frame's 2-byte length and the 16-byte AEAD tag (docs/PROTOCOL.md). Messages queued together
/// share frames, so this is the most a message costs on top of its bytes.
let linkOverheadPerMessage = 22

/// The sync messages of the simulator's run since a point, without keepalives and presence.
private struct Exchange {
    var messages = 0
    var bytes = 0
    /// Per node: the send time (ms) of its first message, and of the last message other than an
    /// ack sent to it.
    var firstSent: [String: Int] = [:]
    var lastReceived: [String: Int] = [:]
    var lines: [String] = []

    /// Round trips, for the slower of the two nodes, from its first message to the arrival of the
    /// last message other than an ack sent to it (nobody waits for acks): when both know they are
    /// caught up. Each node counts from its own start (the accepting side learns of a connection
    /// after the dialer). Links have a fixed latency and no jitter here.
    func roundTrips(latency: Millis) -> Double {
        var worst = 0.0
        for (node, first) in firstSent {
            guard let last = lastReceived[node] else { continue }
            worst = max(worst, Double(last + Int(latency) - first) / Double(2 * latency))
        }
        return worst
    }
}

private func exchange(_ sim: Simulation, since traceIndex: Int, countsBefore: [String: Int], bytesBefore: [String: Int])
    -> Exchange
{
    var result = Exchange()
    for kind in sim.messageCounts.keys where !["ping", "pong", "presence"].contains(kind) {
        result.messages += sim.messageCounts[kind, default: 0] - countsBefore[kind, default: 0]
        result.bytes += sim.messageBytes[kind, default: 0] - bytesBefore[kind, default: 0]
    }
    for line in sim.trace[traceIndex...] where line.contains(" -> ") {
        let parts = line.split(separator: " ", maxSplits: 4)
        guard parts.count == 5, !["ping", "pong"].contains(parts[4]), !parts[4].hasPrefix("presence") else { continue }
        let time = Int((Double(parts[0]) ?? 0) * 1000 + 0.5)
        let (from, to) = (String(parts[1]), String(parts[3]))
        result.firstSent[from] = min(result.firstSent[from] ?? time, time)
        if !parts[4].hasPrefix("ack") { result.lastReceived[to] = max(result.lastReceived[to] ?? time, time) }
        result.lines.append(line)
    }
    return result
}

/// Wire figures (issue "Speed", item 5): the bytes and round trips of an idle reconnect, and the
/// wire bytes of a one-field change, measured on the simulator, which runs the production sync
/// core and counts every message it sends (the serialized wire message; the link's framing is
/// ``linkOverheadPerMessage`` more per message at most).
func wireFigures(verbose: Bool) throws -> [Figure] {
    var figures: [Figure] = []
    let latency: Millis = 5
    for origins in [1, 8] {
        let sim = try Simulation(seed: 7)
        sim.defaultProfile = LinkProfile(latency: latency)
        let a = try sim.addNode("a")
        let b = try sim.addNode("b")
        var writers: [SimulatedNode] = []
        for i in 1..<origins { writers.append(try sim.addNode("w\(i)")) }
        var subscriptions: [Any] = []
        for node in sim.nodes { subscriptions.append(try node.store.collection("items").findAll().subscribe()) }
        sim.connect(b, a)
        for w in writers { sim.connect(w, a) }
        for (n, node) in ([a] + writers).enumerated() {
            for i in 0..<100 {
                try node.store.collection("items").upsert(["_id": .string("d\(n)-\(i)"), "v": .int(Int64(i))])
            }
        }
        try sim.runUntilQuiet(quietFor: 10_000)
        for w in writers { sim.crash(w) }
        try sim.runUntilQuiet(quietFor: 10_000)
        let held = try b.store.collection("items").findAll().exec().count
        precondition(held == 100 * origins, "b holds \(held) of \(100 * origins) documents")
        let traceIndex = sim.trace.count
        let counts = sim.messageCounts
        let bytes = sim.messageBytes
        sim.resetConnections(between: a, and: b)
        try sim.runUntilQuiet(quietFor: 10_000)
        let e = exchange(sim, since: traceIndex, countsBefore: counts, bytesBefore: bytes)
        if verbose { for line in e.lines { print("  reconnect (\(origins) origins): \(line)") } }
        if verbose {
            for kind in sim.messageBytes.keys.sorted() {
                let n = sim.messageCounts[kind, default: 0] - counts[kind, default: 0]
                guard n > 0 else { continue }
                print(
                    "  reconnect (\(origins) origins): \(n) \(kind), \(sim.messageBytes[kind]! - bytes[kind, default: 0]) B"
                )
            }
        }
        figures.append(
            Figure(
                name: "idle_reconnect_\(origins)_origins_bytes", value: Double(e.bytes),
                unit: "B (both ways, messages)",
                baseline: Double(64 + 12 * origins), baselineName: "goal_64_plus_12_per_origin"))
        figures.append(
            Figure(
                name: "idle_reconnect_\(origins)_origins_messages", value: Double(e.messages),
                unit: "messages (+\(linkOverheadPerMessage) B each on the link at most)"))
        figures.append(
            Figure(
                name: "idle_reconnect_\(origins)_origins_round_trips", value: e.roundTrips(latency: latency),
                unit: "round trips (to caught up)", baseline: 1, baselineName: "goal"))
        _ = subscriptions
    }

    // One field of a 20-field document changes; the other side holds the rest. With deltas (the
    // default) and, as the baseline of the same run, with whole states.
    for documents in [1, 100] {
        var wholeStates = 0.0
        for deltas in [false, true] {
            let sim = try Simulation(seed: 8)
            sim.defaultProfile = LinkProfile(latency: latency)
            sim.replicatorConfiguration = { $0.deltas = deltas }
            let a = try sim.addNode("a")
            let b = try sim.addNode("b")
            let subscription = try b.store.collection("items").findAll().subscribe()
            sim.connect(b, a)
            for d in 0..<documents {
                var fields: [String: Value] = ["_id": .string("doc-\(d)")]
                for f in 0..<20 { fields["field\(f)"] = .string("value-\(d)-\(f)-abcdef") }
                try a.store.collection("items").upsert(
                    .map(UTF8Map(uniqueKeysWithValues: fields.map { ($0.key, $0.value) })))
            }
            try sim.runUntilQuiet(quietFor: 10_000)
            let traceIndex = sim.trace.count
            let counts = sim.messageCounts
            let bytes = sim.messageBytes
            let newValue = Value.string("changed-0123456789")
            for d in 0..<documents {
                try a.store.collection("items").upsert(["_id": .string("doc-\(d)"), "field7": newValue])
            }
            try sim.runUntilQuiet(quietFor: 10_000)
            let e = exchange(sim, since: traceIndex, countsBefore: counts, bytesBefore: bytes)
            if verbose { for line in e.lines.prefix(6) { print("  one field of \(documents) docs: \(line)") } }
            let batchBytes = sim.messageBytes["batch", default: 0] - bytes["batch", default: 0]
            let valueSize = CBOR.encode(newValue).count
            let perDocument = Double(batchBytes) / Double(documents)
            guard deltas else {
                wholeStates = perDocument
                _ = subscription
                continue
            }
            figures.append(
                Figure(
                    name: "wire_bytes_per_changed_field_\(documents)_docs", value: perDocument,
                    unit: "B (batch bytes / documents)", baseline: Double(valueSize + 40),
                    baselineName: "goal_value_\(valueSize)_B_plus_40"))
            figures.append(
                Figure(
                    name: "wire_bytes_per_changed_field_\(documents)_docs_vs_whole_states", value: perDocument,
                    unit: "B (batch bytes / documents)", baseline: wholeStates, baselineName: "whole_states_same_run"))
            figures.append(
                Figure(
                    name: "wire_bytes_with_acks_per_changed_field_\(documents)_docs",
                    value: Double(e.bytes) / Double(documents), unit: "B (batches and acks / documents)"))
            _ = subscription
        }
    }
    return figures
}
