import Foundation
import Testing
import TrellisCore
import TrellisTestKit

/// Real processes on wrong clocks (libfaketime; see ``FakeClock``): issue 8 items 1 and 2, and
/// F21 (a node whose own clock is behind). Each process's wall clock is set from its own
/// timestamp file and changed while it runs.
@Suite(
    .serialized,
    .enabled(
        if: FakeClock.isAvailable, "libfaketime or a C compiler is missing; scripts/setup.sh installs faketime"))
struct ClockTests {
    let dir = TemporaryDirectory("trellis-clocks")
    static let day = 86_400

    /// A shell on `clock`, listening on a free port when `listen`, dialing `peers`.
    func shell(_ name: String, _ clock: FakeClock, key: String, listen: Bool = true, peers: [UInt16] = []) throws
        -> TrellisProcess
    {
        var arguments = ["shell", "--data", dir.path(name), "--mesh-key", key]
        if listen { arguments += ["--listen", "127.0.0.1:0"] }
        for port in peers { arguments += ["--peer", "127.0.0.1:\(port)"] }
        let process = try TrellisProcess(arguments, environment: clock.environment)
        process.send("subscribe items")
        return process
    }

    /// The documents of `items` in `name`'s store as `trellis find` prints them.
    func find(_ name: String) -> String {
        (try? TrellisProcess.run(["find", "--data", dir.path(name), "items"]).stdout) ?? ""
    }

    /// The deferred lines of a shell's `status`.
    static func deferred(_ shell: TrellisProcess) -> [String] {
        let status = shell.ask("status") ?? ""
        return status.split(separator: "\n").map(String.init).filter { $0.hasPrefix("  items ") }
    }

    static let clockReason = "ahead of this node's clock"

    /// Issue 8 item 1: A's clock is a day ahead, B's a year behind, C's true; all subscribe
    /// `items`. A and B write `d1`, B edits it again, A writes `d2` later. While the clocks are
    /// wrong, C (and B) keep A's documents deferred with the clock as the reason, listed by
    /// `status`; nothing crashes. Once every clock is past A's stamps (a day passes: all at
    /// +1 day 2 min) the deferred documents are applied and the three nodes hold the same `d1`
    /// and `d2` (A's stamps are the latest, so A's `from` wins; B's `b` stays), with nothing
    /// deferred.
    @Test func skewedClocksDeferAndThenConverge() async throws {
        let key = try makeMeshKey(in: dir)
        let clocks = try [("A", Self.day), ("B", -365 * Self.day), ("C", 0)].map { name, offset in
            try FakeClock(in: dir, name: name, offset: offset)
        }
        let a = try shell("A", clocks[0], key: key)
        let portA = try #require(a.listeningPort(), "A: \(a.stderr)")
        let b = try shell("B", clocks[1], key: key, peers: [portA])
        let portB = try #require(b.listeningPort(), "B: \(b.stderr)")
        let c = try shell("C", clocks[2], key: key, listen: false, peers: [portA, portB])
        let nodes = [a, b, c]
        #expect(await waitUntil { nodes.allSatisfy { $0.stderrCount(of: "session established") >= 2 } })

        a.send(#"upsert items {"_id":"d1","from":"A","a":1}"#)
        b.send(#"upsert items {"_id":"d1","from":"B","b":1}"#)
        b.send(#"update items d1 set from "B2"; set b 2"#)
        #expect(await waitUntil { b.stdout.contains(" b = 2") }, "\(b.stdout) \(b.stderr)")
        a.send(#"upsert items {"_id":"d2","from":"A"}"#)

        for (name, node) in [("C", c), ("B", b)] {
            #expect(
                await waitUntil(timeout: 30) {
                    let lines = Self.deferred(node)
                    return ["\"d1\"", "\"d2\""].allSatisfy { id in
                        lines.contains { $0.hasPrefix("  items \(id) from ") && $0.contains(Self.clockReason) }
                    }
                }, "\(name) does not list A's documents as deferred: \(node.ask("status") ?? "no answer")")
        }
        #expect(find("C").contains(#"{"_id":"d1","b":2,"from":"B2"}"#))  // B's writes, a year old, are accepted
        #expect(!find("C").contains("d2"))
        #expect(nodes.allSatisfy { $0.isRunning })

        for clock in clocks { try clock.set(offset: Self.day + 120) }
        let expected = #"{"_id":"d1","a":1,"b":2,"from":"A"}"# + "\n" + #"{"_id":"d2","from":"A"}"# + "\n"
        #expect(
            await waitUntil(timeout: 60) { ["A", "B", "C"].allSatisfy { find($0) == expected } }, "\(find("C"))")
        for node in nodes { #expect(await waitUntil(timeout: 30) { Self.deferred(node).isEmpty }) }
        for node in nodes { node.closeInput() }
        #expect(nodes.allSatisfy { $0.wait() == 0 })
    }

    /// Issue 8 item 2: X's clock is a day ahead while it writes `early`; a true-clock peer Y
    /// defers it. X stops, its clock is fixed, it starts again: its store starts a new site ID
    /// at the true time (logged), so X's next write `late` is accepted by Y within seconds, not a
    /// day later. `early` keeps its day-ahead stamps and stays deferred on Y, listed by `status`,
    /// until Y's clock reaches them (docs/DATA-MODEL.md, "A clock that jumped forward").
    @Test func aClockThatWasADayAheadIsAcceptedAgainAfterARestart() async throws {
        let key = try makeMeshKey(in: dir)
        let clockX = try FakeClock(in: dir, name: "X", offset: Self.day)
        let clockY = try FakeClock(in: dir, name: "Y", offset: 0)
        let y = try shell("Y", clockY, key: key)
        let portY = try #require(y.listeningPort(), "Y: \(y.stderr)")
        var x = try shell("X", clockX, key: key, listen: false, peers: [portY])
        x.send(#"upsert items {"_id":"early","by":"X, a day ahead"}"#)
        #expect(
            await waitUntil(timeout: 30) {
                Self.deferred(y).contains {
                    $0.hasPrefix(#"  items "early" from "#) && $0.contains(Self.clockReason)
                }
            }, "\(y.ask("status") ?? "no answer")")

        x.closeInput()
        #expect(x.wait() == 0)
        try clockX.set(offset: 0)
        x = try shell("X", clockX, key: key, listen: false, peers: [portY])
        #expect(
            await waitUntil { x.stderr.contains("restarts at the system time with a new site ID") }, "\(x.stderr)")
        x.send(#"upsert items {"_id":"late","by":"X, clock fixed"}"#)
        let began = Date()
        #expect(await waitUntil(timeout: 30) { find("Y").contains(#""_id":"late""#) }, "\(y.stderr)")
        print("item 2: Y accepted X's write \(millis(since: began)) ms after X's restart")
        #expect(!find("Y").contains("early"))
        #expect(
            Self.deferred(y).contains { $0.hasPrefix(#"  items "early" from "#) && $0.contains(Self.clockReason) })
        #expect(find("X").contains("early") && find("X").contains("late"))
        for node in [x, y] { node.closeInput() }
        #expect(x.wait() == 0 && y.wait() == 0)
    }

    /// F21: N's clock is two hours behind its peer A. Pulling A's 1,000 documents, N defers every
    /// one (their stamps are two hours ahead of it) and drops none; once N's clock is right it
    /// applies them all, with A's values, while it runs or, with `restart`, after starting again
    /// on the right clock; and N's next write to one of them wins on A (N's clock moved past the
    /// stamps it read).
    @Test(arguments: [false, true])
    func aNodeWhoseClockIsBehindDefersAndAppliesOnceItIsRight(restart: Bool) async throws {
        var rng = seededRandom("F21 (restart: \(restart))")
        let key = try makeMeshKey(in: dir)
        let a = dir.path("A")
        try importWorkload(
            Workload(count: 1_000, sizes: .small, using: &rng), round: 0, into: a, file: dir.path("d.jsonl"))
        let source = try StoreSnapshot(a)
        let nodeA = try TrellisProcess([
            "node", "--data", a, "--listen", "127.0.0.1:0", "--mesh-key", key, "--subscribe", "items",
        ])
        let port = try #require(nodeA.listeningPort(), "A: \(nodeA.stderr)")
        let clock = try FakeClock(in: dir, name: "N", offset: -7_200)
        var n = try shell("N", clock, key: key, listen: false, peers: [port])
        #expect(
            await waitUntil(timeout: 60) {
                let lines = Self.deferred(n)
                return lines.count == 1_000 && lines.allSatisfy { $0.contains(Self.clockReason) }
            }, "\(n.ask("status")?.prefix(2_000) ?? "no answer")")
        #expect(StoreSnapshot.count(dir.path("N")) == 0)

        if restart {
            n.closeInput()
            #expect(n.wait() == 0)
            try clock.set(offset: 0)
            n = try shell("N", clock, key: key, listen: false, peers: [port])
        } else {
            try clock.set(offset: 0)
        }
        #expect(
            await waitUntil(timeout: 60) { StoreSnapshot.count(dir.path("N")) == 1_000 },
            "N holds \(StoreSnapshot.count(dir.path("N"))): \(n.stderr.suffix(2_000))")
        let held = try StoreSnapshot(dir.path("N"))
        let different = source.rows.keys.filter { held.rows[$0]?.value != source.rows[$0]?.value }.sorted()
        #expect(different.count == 0, "documents that differ from A's: \(different.prefix(3))")
        #expect(await waitUntil { Self.deferred(n).isEmpty })

        n.send("update items doc-0001 set round 99")
        #expect(
            await waitUntil(timeout: 30) {
                Workload.round(of: (try? StoreSnapshot(a))?.rows[#""doc-0001""#]?.value) == 99
            })
        n.closeInput()
        #expect(n.wait() == 0)
        #expect(nodeA.terminate() == 0)
    }
}
