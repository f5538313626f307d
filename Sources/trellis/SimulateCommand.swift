import Foundation
import TrellisSimulation

enum SimulateCommand {
    static let help = """
        trellis simulate — run Trellis on simulated meshes and check every invariant

        Each seed builds a random mesh of real nodes (SQLite stores, the real sync engine, live
        queries) in this process, runs random app operations and faults under a virtual clock,
        heals everything, waits until the mesh is quiet and checks the invariants
        (docs/SIMULATION.md). A seed always replays the same run.

        Usage:
          trellis simulate [--seeds N] [--from SEED] [--nodes M|MIN-MAX] [--steps K] [--faults LIST]
                           [--operations basic|wide] [--queries Q [--widen] [--two-queries]] [--ttl MS]
          trellis simulate --replay SEED [--nodes …] [--steps …] [--faults …] [--operations …] [--queries …]
                           [--widen] [--two-queries] [--ttl …]

        Flags:
          --seeds N       how many seeds to run (default 100), from --from (default 1)
          --nodes M       nodes per mesh, or a range MIN-MAX drawn per seed (default 3-8)
          --steps K       random operations and faults per run before the final heal (default 60)
          --faults LIST   comma-separated: partition, links, crash, wipe, clock, latency, reset,
                          unreliable, evict; or all (default), none
          --operations O  the app operations: wide (default: values of every type and edge,
                          remove, evict and update by query, nested fields) or basic (small
                          ints and four strings, as seeds recorded before wide replay)
          --queries Q     the last Q nodes of each mesh hold only their own query's documents
                          and cancel and renew it at random; the others replicate the whole
                          collection or only relay, at least one the whole collection (default
                          0: at most one query node)
          --widen         with --queries: the query nodes also subscribe to the whole
                          collection now and then and cancel it again, so they hold documents
                          outside their query and their neighbours relay subscriptions that end
          --two-queries   with --queries: each query node also holds a second query of its
                          own, cancelled and renewed at random like the first
          --ttl MS        tombstone expiry: the stores keep tombstones MS milliseconds (not 7
                          days), and while a partition, a link down or a crashed node keeps nodes
                          apart, more than MS now and then passes (MS + 2 minutes: the reaper
                          runs every minute), so nodes come back to peers that reaped; single
                          nodes' clocks also move ahead a little, so they reap first. 120000 is
                          a good value. Off by default (seeds replay as recorded without it)
          --replay SEED   run one seed and print its trace, then the verdict

        Prints each failing seed with what broke and the command that replays it; a progress line
        on a terminal. Exits 1 when a seed fails.
        """

    static func run(_ args: [String]) throws {
        let parsed = try Arguments(
            args, valueFlags: ["seeds", "from", "nodes", "steps", "faults", "operations", "queries", "ttl", "replay"],
            switchFlags: ["widen", "two-queries"])
        if parsed.switches.contains("help") {
            print(help)
            return
        }
        guard parsed.positional.isEmpty else {
            throw UsageError("unexpected argument '\(parsed.positional[0])'; see `trellis simulate --help`")
        }
        var workload = RandomWorkload()
        if let nodes = parsed.value("nodes") { workload.nodes = try parseRange(nodes) }
        if let steps = parsed.value("steps") { workload.steps = try number("steps", steps, at: 0...1_000_000) }
        if let queries = parsed.value("queries") { workload.queryNodes = try number("queries", queries, at: 0...64) }
        if let ttl = parsed.value("ttl") { workload.tombstoneTTL = Int64(try number("ttl", ttl, at: 1...Int.max)) }
        if parsed.switches.contains("widen") {
            guard workload.queryNodes > 0 else { throw UsageError("--widen needs --queries Q with Q above 0") }
            workload.widening = true
        }
        if parsed.switches.contains("two-queries") {
            guard workload.queryNodes > 0 else { throw UsageError("--two-queries needs --queries Q with Q above 0") }
            workload.secondQueries = true
        }
        if let operations = parsed.value("operations") {
            guard let chosen = WorkloadOperations(rawValue: operations) else {
                throw UsageError("--operations takes basic or wide, not '\(operations)'")
            }
            workload.operations = chosen
        }
        do {
            workload.faults = try SimulatedFault.parse(parsed.value("faults") ?? "all")
        } catch {
            throw UsageError("--faults: \(error)")
        }
        let options = describe(parsed)
        if let replay = parsed.value("replay") {
            guard let seed = UInt64(replay) else { throw UsageError("--replay needs a seed (a whole number)") }
            do {
                let sim = try workload.run(seed: seed)
                for line in sim.trace { print(line) }
                print("seed \(seed): every invariant holds")
            } catch let failure as SimulationFailure {
                for line in failure.trace { print(line) }
                print(failure)
                exit(1)
            }
            return
        }
        let count = try number("seeds", parsed.value("seeds") ?? "100", at: 1...Int.max)
        let first = UInt64(try number("from", parsed.value("from") ?? "1", at: 0...Int.max))
        let terminal = isatty(2) != 0
        let started = Date()
        var failed: [UInt64] = []
        var (documents, deltas) = (0, 0)
        for i in 0..<count {
            let seed = first + UInt64(i)
            do {
                let sim = try workload.run(seed: seed, tracing: false)
                documents += sim.documentsSent
                deltas += sim.deltasSent
            } catch {
                // A run that stopped on an error (the store could not be opened or read) is a
                // failed seed too: the sweep goes on and reports it.
                failed.append(seed)
                if terminal { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
                if let failure = error as? SimulationFailure {
                    print(failure)
                } else {
                    print("simulation seed \(seed) stopped: \(error)")
                }
                print("  replay: trellis simulate --replay \(seed)\(options)")
            }
            if terminal {
                let elapsed = Date().timeIntervalSince(started)
                let line = String(
                    format: "\r%d/%d seeds, %d failed, %.0f seeds/min", i + 1, count, failed.count,
                    Double(i + 1) / max(elapsed, 0.001) * 60)
                FileHandle.standardError.write(Data(line.utf8))
            }
        }
        if terminal { FileHandle.standardError.write(Data("\n".utf8)) }
        let elapsed = Date().timeIntervalSince(started)
        print(
            String(
                format: "%d seeds (%llu…%llu), %d failed, %.1f s, %.0f seeds/min; %d documents sent, %d as deltas",
                count, first, first + UInt64(count) - 1, failed.count, elapsed,
                Double(count) / max(elapsed, 0.001) * 60, documents, deltas))
        if !failed.isEmpty { exit(1) }
    }

    /// The flags that shape a run, to repeat in a replay command.
    static func describe(_ parsed: Arguments) -> String {
        ["nodes", "steps", "faults", "operations", "queries", "ttl"].compactMap { name in
            parsed.value(name).map { " --\(name) \($0)" }
        }
        .joined() + (parsed.switches.contains("widen") ? " --widen" : "")
            + (parsed.switches.contains("two-queries") ? " --two-queries" : "")
    }

    static func parseRange(_ text: String) throws -> ClosedRange<Int> {
        let parts = text.split(separator: "-", omittingEmptySubsequences: false)
        switch parts.count {
        case 1:
            let n = try number("nodes", text, at: 1...4096)
            return n...n
        case 2:
            let low = try number("nodes", String(parts[0]), at: 1...4096)
            let high = try number("nodes", String(parts[1]), at: low...4096)
            return low...high
        default:
            throw UsageError("--nodes takes a number or MIN-MAX, not '\(text)'")
        }
    }

    static func number(_ flag: String, _ text: String, at range: ClosedRange<Int>) throws -> Int {
        guard let n = Int(text), range.contains(n) else {
            throw UsageError(
                "--\(flag) takes a whole number from \(range.lowerBound) to \(range.upperBound), not '\(text)'")
        }
        return n
    }
}
