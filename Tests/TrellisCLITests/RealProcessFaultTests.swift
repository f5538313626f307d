import Foundation
import Testing
import TrellisCore
import TrellisTestKit

/// Faults of real `trellis` processes on loopback: SIGKILL during a pull and during an import
/// (F05), a sender restarted mid-transfer (F15 b), a peer frozen with SIGSTOP (issue 8 item 14),
/// a restarted peer with mutual `--peer` (item 15). See docs/TESTING.md, "Real-process tests".
@Suite(.serialized) struct RealProcessFaultTests {
    let dir = TemporaryDirectory("trellis-faults")

    /// F05: B pulls 5,000 documents from A and is killed with SIGKILL at 50 random points of the
    /// pull, restarted each time. After every kill B's store passes `integrity_check`, holds only
    /// A's documents with A's values, has applied nothing twice (a row committed before a kill
    /// keeps its `seq`: merging it again would have logged it again), and its checkpoint on A's
    /// log only advances and never covers a document B lacks. At the end B holds exactly A's
    /// 5,000 documents.
    @Test func killingAPullingNodeFiftyTimesLosesNothingAndAppliesNothingTwice() async throws {
        var rng = seededRandom("F05 pull")
        let started = Date()
        let key = try makeMeshKey(in: dir)
        let a = dir.path("A")
        let workload = Workload(count: 5_000, using: &rng)
        try importWorkload(workload, round: 0, into: a, file: dir.path("docs.jsonl"))
        let source = try StoreSnapshot(a)
        #expect(source.rows.count == 5_000)
        let nodeA = try TrellisProcess(["node", "--data", a, "--listen", "127.0.0.1:0", "--mesh-key", key])
        let port = try #require(nodeA.listeningPort(), "A did not start: \(nodeA.stderr)")
        let peerA = try #require(nodeA.peerKey())
        let arguments = { (data: String) in
            ["node", "--data", data, "--peer", "127.0.0.1:\(port)", "--mesh-key", key, "--subscribe", "items"]
        }

        // Each kill waits a random time. Either after the session is up, for up to the time the
        // remaining documents, shared among the remaining kills, take to arrive; or
        // before it (store open, WAL recovery, dial, handshake), more often once fewer batches
        // remain than kills (the last batch commits quickly), so that the pull outlasts the kills.
        var receiver = 0
        var b = dir.path("B0")
        var earlier = StoreSnapshot.empty
        var kills = 0
        var rate = 1.0  // documents per ms of session, measured as the pull goes
        var startup = 100.0  // ms from launch to the session, measured likewise
        var (sessionMillis, received) = (0.0, 0)
        var (early, progressing) = (0, 0)
        while kills < 50 {
            let remaining = 5_000 - earlier.rows.count
            let batchesLeft = Double((remaining + 255) / 256)
            let earlyOdds = max(0.15, 1 - batchesLeft / Double(50 - kills + 1))
            let killEarly = Double.random(in: 0..<1, using: &rng) < earlyOdds
            let earlyDelay = Double.random(in: 0..<0.9, using: &rng) * startup / 1000
            let window = min(2_000, max(5, Double(remaining) / Double(50 - kills + 1) / rate))
            let sessionDelay = Double.random(in: 0..<window, using: &rng) / 1000
            let launched = Date()
            let node = try TrellisProcess(arguments(b))
            // Timed and killed on a thread of its own: a task of the shared pool may wake up late.
            // The result: nil when no session came; otherwise how long the session lasted (nil
            // for a kill before it) and how long the node had run.
            let timing = await offPool { () -> (session: Double?, run: Double, startup: Double)? in
                defer { node.kill() }
                if killEarly {
                    usleep(UInt32(earlyDelay * 1_000_000))
                    return (nil, Date().timeIntervalSince(launched) * 1000, 0)
                }
                guard eventually(timeout: 20, { node.stderr.contains("session established") }) else { return nil }
                let established = Date()
                usleep(UInt32(sessionDelay * 1_000_000))
                return (
                    Date().timeIntervalSince(established) * 1000, Date().timeIntervalSince(launched) * 1000,
                    established.timeIntervalSince(launched) * 1000
                )
            }
            guard let timing else {
                Issue.record("B never established a session: \(node.stderr)")
                return
            }
            if FileManager.default.fileExists(atPath: b + "/store.sqlite") {  // not when killed before it was made
                #expect(try SQLiteFile.integrityCheck(b + "/store.sqlite") == "ok", "kill \(kills + 1)")
            }
            let now = try StoreSnapshot(b, peer: peerA)
            let faults = Consistency.faults(now, source: source, earlier: earlier)
            #expect(faults.isEmpty, "after kill \(kills + 1) of receiver \(receiver): \(faults)")
            #expect(now.deferred.isEmpty)
            if !faults.isEmpty { return }
            if let session = timing.session {
                startup = 0.8 * startup + 0.2 * timing.startup
                sessionMillis += session
                received += now.rows.count - earlier.rows.count
                if sessionMillis > 0, received > 0 { rate = Double(received) / sessionMillis }
            }
            if now.rows.count == 5_000 {
                // This receiver finished before the kill: the kill is not counted, and a new
                // receiver pulls all 5,000 again.
                receiver += 1
                b = dir.path("B\(receiver)")
                earlier = .empty
                continue
            }
            kills += 1
            if timing.session == nil || timing.run < 20 { early += 1 }
            if now.rows.count > earlier.rows.count { progressing += 1 }
            earlier = now
        }
        let last = try TrellisProcess(arguments(b))
        #expect(await waitUntil(timeout: 120) { StoreSnapshot.count(b) == 5_000 }, "B: \(last.stderr)")
        #expect(last.terminate() == 0)
        #expect(try SQLiteFile.integrityCheck(b + "/store.sqlite") == "ok")
        let final = try StoreSnapshot(b, peer: peerA)
        #expect(Consistency.faults(final, source: source, earlier: earlier).isEmpty)
        #expect(final.rows.count == 5_000 && final.rows.keys.sorted() == source.rows.keys.sorted())
        #expect(final.checkpoint?.epoch == source.epoch)
        #expect(nodeA.terminate() == 0)
        print(
            "F05 pull: \(kills) kills of \(receiver + 1) receiver(s) during the pull (\(early) before the session, "
                + "\(progressing) after a batch committed since the kill before); \(millis(since: started)) ms")
    }

    /// F05: `trellis import` of 5,000 documents killed with SIGKILL at 50 random points, each
    /// import writing a new `round`. The import is one transaction: after every kill the store
    /// passes `integrity_check` and holds either no documents or all 5,000 of one round (never a
    /// mix), the round of the last import that reported success or a later one; each commit logs
    /// each document once (one new `seq` each, above every earlier one). At the end a last
    /// import leaves exactly the 5,000 documents of its round.
    @Test func killingAnImportFiftyTimesLeavesAllOrNothingAndLosesNothingAcknowledged() async throws {
        var rng = seededRandom("F05 import")
        let started = Date()
        let workload = Workload(count: 5_000, sizes: .small, using: &rng)
        let file = dir.path("round.jsonl")

        // How long one import over the same documents takes here (in a scratch store), to spread
        // the kills over it; the estimate follows the machine's load as the kills go (an import
        // that reported success by a kill took at most that long, one that did not, at least).
        try workload.write(round: 0, to: file)
        var full = 0.0
        for _ in 0..<2 {
            let timing = Date()
            let calibration = try TrellisProcess.run(
                ["import", "--data", dir.path("scratch"), "items", file], timeout: 120)
            #expect(calibration.status == 0, "\(calibration.stderr)")
            full = Double(millis(since: timing))
        }

        let data = dir.path("D")
        var acknowledged = -1  // the last round whose import reported success
        var committed: Int?  // the round the store holds
        var earlier = StoreSnapshot.empty
        var (kills, interrupted) = (0, 0)
        for round in 1...50 {
            try workload.write(round: round, to: file)
            let importing = try TrellisProcess(["import", "--data", data, "items", file])
            // Timed and killed on a thread of its own: a task of the shared pool may wake up late.
            // Half of the kills anywhere in the run, half in its last part (the transaction, the
            // commit, the report).
            let fraction =
                rng.next() % 2 == 0
                ? Double.random(in: 0..<1.3, using: &rng) : Double.random(in: 0.75..<1.25, using: &rng)
            let delay = fraction * full
            let offset = await offPool {
                let launched = Date()
                usleep(UInt32(delay * 1000))
                importing.kill()
                return Double(millis(since: launched))
            }
            kills += 1
            if importing.stdout.contains("imported 5000 documents into items") {
                acknowledged = round
                full = 0.7 * full + 0.3 * 0.9 * offset
            } else if offset > full {
                full = 0.7 * full + 0.3 * offset * 1.1
            }

            guard FileManager.default.fileExists(atPath: data + "/store.sqlite") else {
                // Killed before the first import opened the store.
                #expect(committed == nil && acknowledged < 0, "kill \(round): the store is gone")
                continue
            }
            #expect(try SQLiteFile.integrityCheck(data + "/store.sqlite") == "ok", "kill \(round)")
            let now = try StoreSnapshot(data)
            let rounds = Set(now.rows.values.map { Workload.round(of: $0.value) })
            #expect(now.rows.isEmpty || (now.rows.count == 5_000 && rounds.count == 1), "kill \(round): \(rounds)")
            let held = rounds.first.flatMap { $0 }
            if held != committed, let held {
                #expect(held == round, "kill \(round): the store holds round \(held)")
                #expect(now.rows.values.allSatisfy { $0.seq > earlier.lastSeq }, "a row kept an old seq")
            } else {
                interrupted += 1
                #expect(now.rows.mapValues(\.seq) == earlier.rows.mapValues(\.seq), "kill \(round) changed rows")
            }
            committed = held
            if acknowledged >= 0 {
                #expect(held ?? -1 >= acknowledged, "round \(acknowledged) was reported but is lost")
            }
            #expect(Set(now.rows.values.map(\.seq)).count == now.rows.count)
            #expect(now.lastSeq >= earlier.lastSeq)
            earlier = now
        }
        try workload.write(round: 51, to: file)
        let last = try TrellisProcess.run(["import", "--data", data, "items", file], timeout: 120)
        #expect(last.status == 0 && last.stdout.contains("imported 5000 documents"), "\(last.stderr)")
        #expect(try SQLiteFile.integrityCheck(data + "/store.sqlite") == "ok")
        let final = try StoreSnapshot(data)
        #expect(final.rows.count == 5_000)
        #expect(final.rows.values.allSatisfy { Workload.round(of: $0.value) == 51 })
        print(
            "F05 import: \(kills) kills over imports of about \(Int(full)) ms; \(interrupted) interrupted one, "
                + "\(kills - interrupted) came after its commit; \(millis(since: started)) ms")
    }

    /// F15 b: the sending peer is restarted (SIGTERM, started again) part-way through a
    /// 30,000-document transfer (more than the 8 batches of 1,024 a sender keeps in flight, and the
    /// sender runs in slices until the receiver holds part of it, so the restart falls before the
    /// end however fast the transfer runs and however loaded the machine is). The receiver ends with every document once: nothing it held at
    /// the restart is applied again (same `seq`). The transfer resumes from the receiver's
    /// checkpoint, on the same epoch of the sender's log, so at most the documents after it are
    /// sent again (the count is printed; the CLI does not report what was re-sent).
    @Test func aSenderRestartedMidTransferResumesFromTheCheckpoint() async throws {
        var rng = seededRandom("F15 b")
        let key = try makeMeshKey(in: dir)
        let (a, b) = (dir.path("A"), dir.path("B"))
        let total = 30_000
        try importWorkload(
            Workload(count: total, sizes: .small, using: &rng), round: 0, into: a, file: dir.path("docs.jsonl"))
        let source = try StoreSnapshot(a)
        // B listens and subscribes; A dials B, so A's restart needs no fixed port.
        let nodeB = try TrellisProcess([
            "node", "--data", b, "--listen", "127.0.0.1:0", "--mesh-key", key, "--subscribe", "items",
        ])
        let port = try #require(nodeB.listeningPort())
        let senderArguments = [
            "node", "--data", a, "--listen", "127.0.0.1:0", "--peer", "127.0.0.1:\(port)", "--mesh-key", key,
        ]
        var nodeA = try TrellisProcess(senderArguments)
        let peerA = try #require(nodeA.peerKey())
        let half = 6_000 + Int(rng.next() % 10_000)
        // A runs in slices of 20 ms (SIGCONT, then SIGSTOP) until B holds `half`: however loaded the
        // machine, the transfer cannot end between two looks. Stopped, A has at most 8 batches of
        // 1,024 in flight, so B ends below `half` + 20 ms of sending + 8,192.
        var slices = 0
        while StoreSnapshot.count(b) < half && slices < 3_000 {
            nodeA.signal(SIGCONT)
            await pause(0.02)
            nodeA.signal(SIGSTOP)
            slices += 1
        }
        #expect(StoreSnapshot.count(b) >= half, "B: \(nodeB.stderr)")
        #expect(nodeA.terminate() == 0)
        let atRestart = try StoreSnapshot(b, peer: peerA)
        try #require(atRestart.rows.count < total, "the transfer ended before the restart; nothing to test")
        let checkpoint = try #require(atRestart.checkpoint, "B stored no checkpoint on A's log")
        nodeA = try TrellisProcess(senderArguments)
        #expect(await waitUntil(timeout: 120) { StoreSnapshot.count(b) == total }, "B: \(nodeB.stderr)")
        #expect(nodeB.terminate() == 0)
        #expect(nodeA.terminate() == 0)

        let final = try StoreSnapshot(b, peer: peerA)
        #expect(Consistency.faults(final, source: source, earlier: atRestart).isEmpty)
        #expect(final.rows.keys.sorted() == source.rows.keys.sorted())
        #expect(try SQLiteFile.integrityCheck(b + "/store.sqlite") == "ok")
        // The same epoch: A's log did not start over, and B asked for what follows its checkpoint.
        #expect(checkpoint.epoch == source.epoch && final.checkpoint?.epoch == source.epoch)
        let after = source.rows.values.filter { $0.seq > checkpoint.seq }.count
        #expect(checkpoint.seq > 0 && after < total)
        print(
            "F15 b: A restarted when B held \(atRestart.rows.count) of \(total) (checkpoint covers \(total - after)); "
                + "A then sent at most the \(after) documents after the checkpoint")
    }

    /// Issue 8 item 14: a peer frozen with SIGSTOP does not stall the others. A (a shell) serves
    /// B and X; X is stopped; A writes about 6 MB, which B receives in full while X's socket
    /// buffers are full, and A's shell keeps answering; after SIGCONT, X catches up.
    @Test func aStoppedPeerDoesNotStallTheOthersAndCatchesUpAfterward() async throws {
        let key = try makeMeshKey(in: dir)
        let (a, b, x) = (dir.path("A"), dir.path("B"), dir.path("X"))
        let shellA = try TrellisProcess(["shell", "--data", a, "--listen", "127.0.0.1:0", "--mesh-key", key])
        let port = try #require(shellA.listeningPort())
        let subscriber = { (data: String) in
            try TrellisProcess([
                "node", "--data", data, "--peer", "127.0.0.1:\(port)", "--mesh-key", key, "--subscribe", "items",
            ])
        }
        let nodeB = try subscriber(b)
        let nodeX = try subscriber(x)
        #expect(
            await waitUntil {
                nodeB.stderr.contains("session established") && nodeX.stderr.contains("session established")
            })
        nodeX.signal(SIGSTOP)
        let body = String(repeating: "0123456789abcdef", count: 2_500)  // 40 KB
        for i in 0..<150 { shellA.send(#"upsert items {"_id":"big-\#(i)","i":\#(i),"body":"\#(body)"}"#) }
        #expect(await waitUntil(timeout: 60) { StoreSnapshot.count(b) == 150 }, "B: \(nodeB.stderr)")
        shellA.send("peers")
        #expect(await waitUntil { shellA.stdout.contains("serving 1 subscription") }, "A's shell did not answer")
        #expect(StoreSnapshot.count(x) < 150)
        nodeX.signal(SIGCONT)
        #expect(await waitUntil(timeout: 60) { StoreSnapshot.count(x) == 150 }, "X: \(nodeX.stderr)")
        #expect(try StoreSnapshot(x).rows.mapValues(\.value) == StoreSnapshot(b).rows.mapValues(\.value))
        shellA.closeInput()
        #expect(shellA.wait() == 0)
        #expect(nodeB.terminate() == 0 && nodeX.terminate() == 0)
    }

    /// Issue 8 item 15: two nodes that list each other with `--peer`; each is restarted in turn
    /// (so both the winner and the loser of the duplicate-link tie-break are restarted; B quits
    /// cleanly, A is killed with SIGKILL). After each
    /// restart there is again one session between them, and a write on either side reaches the
    /// other (polled with a generous timeout; the time it took is printed, not asserted).
    @Test func aRestartedPeerIsBackWhoeverDials() async throws {
        let key = try makeMeshKey(in: dir)
        let (portA, portB) = (try TrellisProcess.freePort(), try TrellisProcess.freePort())
        let start = { (name: String, port: UInt16, peer: UInt16) in
            try TrellisProcess([
                "shell", "--data", dir.path(name), "--listen", "127.0.0.1:\(port)", "--peer", "127.0.0.1:\(peer)",
                "--mesh-key", key,
            ])
        }
        var nodes = [try start("A", portA, portB), try start("B", portB, portA)]
        for node in nodes { node.send("subscribe items") }
        func replicates(_ from: Int, _ to: Int, _ id: String) async -> Bool {
            nodes[from].send(#"upsert items {"_id":"\#(id)"}"#)
            return await waitUntil(timeout: 30) {
                (try? SQLiteFile.query(
                    dir.path(to == 0 ? "A" : "B") + "/store.sqlite",
                    "SELECT 1 FROM documents WHERE collection = 'items' AND id = ?", [JSON.string(.string(id))]))?
                    .isEmpty == false
            }
        }
        let before = (await replicates(0, 1, "before-a"), await replicates(1, 0, "before-b"))
        #expect(before.0 && before.1)
        for restarted in [1, 0] {
            let name = restarted == 0 ? "A" : "B"
            if restarted == 1 {
                nodes[1].closeInput()  // B quits cleanly
                #expect(nodes[1].wait() == 0)
            } else {
                nodes[0].kill()  // A dies
            }
            let began = Date()
            nodes[restarted] = try start(name, restarted == 0 ? portA : portB, restarted == 0 ? portB : portA)
            nodes[restarted].send("subscribe items")
            let there = await replicates(1 - restarted, restarted, "to-\(name)-after-restart")
            let back = await replicates(restarted, 1 - restarted, "from-\(name)-after-restart")
            #expect(there && back, "after restarting \(name): \(nodes[0].stderr)\n\(nodes[1].stderr)")
            print("item 15: after restarting \(name), writes crossed both ways within \(millis(since: began)) ms")
            // One established session on each side (no duplicate left in standby).
            for node in nodes {
                #expect(
                    await waitUntil(timeout: 30) {
                        let lines = node.ask("peers")?.split(separator: "\n") ?? []
                        return lines.count == 1 && lines[0].contains("bound, serving 1 subscription")
                            && !lines[0].contains("[")
                    }, "\(node.ask("peers") ?? "no answer")")
            }
        }
        for node in nodes { node.closeInput() }
        #expect(nodes.allSatisfy { $0.wait() == 0 })
    }
}
