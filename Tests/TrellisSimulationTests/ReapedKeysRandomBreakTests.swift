import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// A reviewer's random meshes around ReapedKeys (commit ac5ca93; each seed replays as the test's
/// argument): one remover W (subscribes to nothing, its keeper gone), a plain writer X, two stale
/// nodes S0, S1 that were away while W removed and reaped, and three new nodes N0…N2 (whole
/// collection or a query) that first meet W or X, then the stale nodes, over slow links with
/// small batches, link drops and crashes in between.
@Suite struct ReapedKeysRandomBreakTests {
    static let ttl: Millis = 120_000

    static func ids(_ node: SimulatedNode) throws -> [String] {
        try node.store.collection("items").findAll().exec().map { JSON.string($0.id) }.sorted()
    }

    /// `subs` lines from `from` to `to` whose own (hops 0, non-refetch) entry says `h` and is not
    /// the same entry as in the previous line of the session (a v1 line starts a session): the
    /// lines that ask anew, not those resent because a relayed entry changed.
    static func asksWithH(_ sim: Simulation, from: String, to: String) -> Int {
        var count = 0
        var previous: Set<String> = []
        for line in sim.trace where line.contains(" \(from) -> \(to) subs ") {
            guard let open = line.firstIndex(of: "[") else { continue }
            let entries = line[line.index(after: open)...].dropLast().components(separatedBy: "; ")
            let own = Set(entries.filter { $0.contains(" hops 0") && !$0.contains("trellisEvicted") })
            if line.contains(" subs v1 ") { previous = [] }
            if own.contains(where: { $0.hasSuffix(" h") && !previous.contains($0) }) { count += 1 }
            previous = own
        }
        return count
    }

    @Test(arguments: Array(9600..<9624) as [UInt64])
    func randomJoinersMeetStaleNodes(seed: UInt64) throws {
        var rng = BelowFloorRandom(seed: seed)
        let sim = try Simulation(seed: seed)
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        sim.replicatorConfiguration = { $0.batchEntries = 2 + Int(rng.next() % 3) }
        let w = try sim.addNode("w")
        let x = try sim.addNode("x")
        let stale = try (0..<2).map { try sim.addNode("s\($0)") }
        for s in stale { sim.connect(s, w) }
        sim.connect(stale[0], x)
        let (k, kept) = try sim.addKeeper(beside: w)
        var subs = [kept]
        for s in stale { subs.append(try s.store.collection("items").findAll().subscribe()) }
        try w.store.collection("items").upsert((0..<24).map { ["_id": .string("d\($0)"), "v": .int(Int64($0 % 4))] })
        try x.store.collection("items").upsert((0..<4).map { ["_id": .string("x\($0)"), "v": .int(Int64($0 % 4))] })
        try sim.runUntilQuiet()
        for s in stale { sim.setLink(s, w, up: false) }
        sim.setLink(stale[0], x, up: false)
        var removed: Set<String> = []
        for i in 0..<24 where rng.next() % 2 == 0 {
            try w.store.collection("items").findByID(.string("d\(i)")).remove()
            removed.insert("d\(i)")
        }
        sim.run(for: Self.ttl + 2 * 60_000)
        sim.crash(k)
        // X meets W again (W's writes reach X through S0 only before: X holds the old copies).
        let joiners = try (0..<3).map { try sim.addNode("n\($0)") }
        for (i, n) in joiners.enumerated() {
            subs.append(
                i == 2
                    ? try n.store.collection("items").find("v <= \(1 + rng.next() % 2)").subscribe()
                    : try n.store.collection("items").findAll().subscribe())
            sim.connect(n, w)
            if rng.next() % 2 == 0 { sim.setProfile(LinkProfile(bytesPerSecond: 300), between: n, and: w) }
        }
        sim.run(for: 1_000 + Millis(rng.next() % 5_000))
        // Joiners meet stale nodes (and each other) while their first syncs may still run.
        for (i, n) in joiners.enumerated() {
            let s = stale[i < 2 ? i : Int(rng.next() % 2)]
            sim.connect(n, s)
            if rng.next() % 3 == 0 { sim.connect(n, joiners[(i + 1 + Int(rng.next() % 2)) % 3]) }
            sim.run(for: Millis(rng.next() % 3_000))
        }
        for _ in 0..<4 {
            let n = joiners[Int(rng.next() % 3)]
            switch rng.next() % 3 {
            case 0:
                sim.setLink(n, w, up: false)
                sim.run(for: 2_000 + Millis(rng.next() % 5_000))
                sim.setLink(n, w, up: true)
            case 1:
                sim.crash(n)
                try sim.restart(n)
            default:
                try stale[Int(rng.next() % 2)].store.collection("items").upsert(
                    ["_id": .string("s\(rng.next() % 5)"), "v": .int(1)])
            }
            sim.run(for: Millis(rng.next() % 4_000))
        }
        sim.resetProfiles()
        try sim.runUntilQuiet(timeout: 60 * 60_000)
        for node in [w] + stale + joiners {
            let shown = Set(try Self.ids(node))
            let back = removed.filter { shown.contains("\"\($0)\"") }.sorted()
            #expect(back.isEmpty, "seed \(seed): \(node.name) shows removed and reaped \(back)")
        }
        #expect(try Self.ids(joiners[0]) == Self.ids(joiners[1]))
        for n in joiners {
            let asked = Self.asksWithH(sim, from: n.name, to: "w")
            sim.note("\(n.name) asked w with h \(asked) times")
            #expect(asked <= 6, "seed \(seed): \(n.name) asked W with h \(asked) times")
        }
        // Quiet means quiet: another minute brings no subs.
        let before = sim.trace.count
        sim.run(for: 60_000)
        let later = sim.trace[before...].filter { $0.contains(" subs ") }
        #expect(later.isEmpty, "seed \(seed): subs after quiet: \(later.prefix(3))")
        do {
            try sim.check()
        } catch {
            Issue.record("seed \(seed): \(String(describing: error).prefix(1500))")
        }
        _ = subs
    }
}
