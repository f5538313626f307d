import Foundation
import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// A reviewer's attempts to break field-level deltas (docs/DELTAS.md).
@Suite struct DeltaBreakTests {
    static func wide(_ id: String, _ tag: String = "x") -> Value {
        var m: [String: Value] = ["_id": .string(id)]
        for f in 0..<12 { m["f\(f)"] = .string("value \(f) of \(id) \(tag) padding padding padding") }
        m["n"] = .map(["a": .int(1), "b": .map(["c": .string("deep")])])
        return .map(UTF8Map(uniqueKeysWithValues: m.map { ($0, $1) }))
    }

    static func get(_ node: SimulatedNode, _ id: String) throws -> Value? {
        try node.store.collection("items").findByID(.string(id)).exec()?.value
    }

    static func update(_ node: SimulatedNode, _ id: String, _ body: (MutableDocument) -> Void) throws {
        _ = try node.store.collection("items").findByID(.string(id)).update { if let d = $0 { body(d) } }
    }

    static func subscribeAll(_ nodes: [SimulatedNode]) throws -> [Subscription] {
        try nodes.map { try $0.store.collection("items").findAll().subscribe() }
    }

    /// Two connected nodes, each subscribed to the whole of `items`.
    static func pair(seed: UInt64) throws -> (Simulation, SimulatedNode, SimulatedNode, [Subscription]) {
        let sim = try Simulation(seed: seed)
        let a = try sim.addNode()
        let b = try sim.addNode()
        sim.connectAll()
        return (sim, a, b, try subscribeAll([a, b]))
    }

    /// A line A–B–C (C reaches A only through B); every node writes fields of the same documents
    /// in rounds, with the line cut now and then.
    @Test(arguments: [200_001, 200_002, 200_003, 200_004] as [UInt64])
    func relayLineThreeWriters(seed: UInt64) throws {
        let sim = try Simulation(seed: seed)
        let a = try sim.addNode()
        let b = try sim.addNode()
        let c = try sim.addNode()
        sim.connect(a, b)
        sim.connect(b, c)
        let subs = try Self.subscribeAll([a, b, c])
        defer { subs.forEach { $0.cancel() } }
        for i in 0..<4 { _ = try a.store.collection("items").upsert(Self.wide("d\(i)")) }
        try sim.runUntilQuiet()
        // Make the rows non-compact everywhere.
        for i in 0..<4 { try Self.update(c, "d\(i)") { $0["f0"].set("c0") } }
        try sim.runUntilQuiet()
        var random = SplitMix64(seed: seed)
        let nodes = [a, b, c]
        for round in 0..<40 {
            let node = nodes[Int(random.next() % 3)]
            let doc = "d\(random.next() % 4)"
            let field = "f\(random.next() % 12)"
            switch random.next() % 6 {
            case 0: try Self.update(node, doc) { $0["n"]["a"].increment(by: .int(1)) }
            case 1: try Self.update(node, doc) { $0["n"]["b"]["c"].set(.string("r\(round)")) }
            case 2: try Self.update(node, doc) { $0[field].remove() }
            default: try Self.update(node, doc) { $0[field].set(.string("\(node.name) r\(round)")) }
            }
            if random.next() % 7 == 0 { sim.setLink(a, b, up: random.next() % 2 == 0) }
            if random.next() % 7 == 0 { sim.setLink(b, c, up: random.next() % 2 == 0) }
            sim.run(for: Millis(random.next() % 400))
        }
        sim.heal()
        sim.setLink(a, b, up: true)
        sim.setLink(b, c, up: true)
        try sim.runUntilQuiet()
        sim.note("deltas sent: \(sim.deltasSent) of \(sim.documentsSent)")
        #expect(sim.deltasSent > 0)
        try sim.check()
    }

    /// Three writers on one document, full mesh, partial propagation between writes.
    @Test(arguments: [200_011, 200_012, 200_013, 200_014, 200_015, 200_016] as [UInt64])
    func threeWritersOneDocument(seed: UInt64) throws {
        let sim = try Simulation(seed: seed)
        let nodes = try (0..<3).map { _ in try sim.addNode() }
        sim.connectAll()
        let subs = try Self.subscribeAll(nodes)
        defer { subs.forEach { $0.cancel() } }
        _ = try nodes[0].store.collection("items").upsert(Self.wide("d"))
        try sim.runUntilQuiet()
        try Self.update(nodes[1], "d") { $0["f1"].set("b") }
        try sim.runUntilQuiet()
        var random = SplitMix64(seed: seed)
        for round in 0..<60 {
            let node = nodes[Int(random.next() % 3)]
            let field = "f\(random.next() % 4)"
            switch random.next() % 8 {
            case 0: try Self.update(node, "d") { $0["n"]["a"].increment(by: .int(1)) }
            case 1: try Self.update(node, "d") { $0[field].remove() }
            case 2: try Self.update(node, "d") { $0["n"].remove() }
            case 3: try Self.update(node, "d") { $0["n"]["z\(round % 3)"].set(.int(Int64(round))) }
            default: try Self.update(node, "d") { $0[field].set(.string("\(node.name) r\(round)")) }
            }
            if random.next() % 5 == 0 {
                let x = nodes[Int(random.next() % 3)]
                let y = nodes[Int(random.next() % 3)]
                if x !== y { sim.setLink(x, y, up: random.next() % 3 != 0) }
            }
            sim.run(for: Millis(random.next() % 60))
        }
        for x in nodes { for y in nodes where x !== y { sim.setLink(x, y, up: true) } }
        try sim.runUntilQuiet()
        sim.note("deltas sent: \(sim.deltasSent) of \(sim.documentsSent)")
        #expect(sim.deltasSent > 0)
        try sim.check()
        let states = try nodes.map { try $0.documents.state(id: "d", in: "items") }
        #expect(states[0] == states[1] && states[1] == states[2])
    }

    /// A's clock is three minutes ahead: B cannot apply its delta now (too far ahead), asks
    /// again without deltas, keeps the whole state deferred, and applies it later. The re-ask
    /// must not loop.
    @Test func aDeltaTooFarAheadIsAskedWholeOnce() throws {
        let (sim, a, b, subs) = try Self.pair(seed: 200_021)
        defer { subs.forEach { $0.cancel() } }
        for i in 0..<3 { _ = try a.store.collection("items").upsert(Self.wide("d\(i)")) }
        try sim.runUntilQuiet()
        for i in 0..<3 { try Self.update(a, "d\(i)") { $0["f0"].set("one") } }
        try sim.runUntilQuiet()
        let subsBefore = sim.messageCounts["subs"] ?? 0
        let deltasBefore = sim.deltasSent
        sim.setClockOffset(a, 180_000)
        for i in 0..<3 { try Self.update(a, "d\(i)") { $0["f1"].set("two") } }
        try sim.runUntilQuiet()
        let subsAfter = sim.messageCounts["subs"] ?? 0
        sim.note("subs sent: \(subsAfter - subsBefore), deltas \(sim.deltasSent - deltasBefore)")
        #expect(subsAfter - subsBefore <= 4, "\(subsAfter - subsBefore) subs messages")
        sim.run(for: 300_000)
        try sim.runUntilQuiet()
        for i in 0..<3 { #expect(try Self.get(b, "d\(i)")?["f1"] == "two") }
        try sim.check()
    }

    /// B crashes right after receiving a delta (before or after its commit and ack).
    @Test(arguments: [1, 3, 5, 6, 8, 11, 15, 20] as [Millis])
    func receiverCrashesAroundADelta(delay: Millis) throws {
        let (sim, a, b, subs) = try Self.pair(seed: 200_031)
        defer { subs.forEach { $0.cancel() } }
        for i in 0..<5 { _ = try a.store.collection("items").upsert(Self.wide("d\(i)")) }
        try sim.runUntilQuiet()
        for i in 0..<5 { try Self.update(a, "d\(i)") { $0["f0"].set("one") } }
        try sim.runUntilQuiet()
        for i in 0..<5 { try Self.update(a, "d\(i)") { $0["f1"].set("two") } }
        sim.run(for: delay)
        sim.crash(b)
        for i in 0..<5 { try Self.update(a, "d\(i)") { $0["f2"].set("three") } }
        sim.run(for: 1_000)
        try sim.restart(b)
        try sim.runUntilQuiet()
        for i in 0..<5 { #expect(try Self.get(b, "d\(i)")?["f2"] == "three") }
        try sim.check()
    }

    /// A's store is restored from a backup taken before some of its writes reached B; A then
    /// writes again (deltas based on its restored state).
    @Test(arguments: [200_041, 200_042, 200_043] as [UInt64])
    func senderRestoredFromABackup(seed: UInt64) throws {
        let (sim, a, b, subs) = try Self.pair(seed: seed)
        defer { subs.forEach { $0.cancel() } }
        for i in 0..<3 { _ = try a.store.collection("items").upsert(Self.wide("d\(i)")) }
        try sim.runUntilQuiet()
        for i in 0..<3 { try Self.update(a, "d\(i)") { $0["f0"].set("one") } }
        try sim.runUntilQuiet()
        for i in 0..<3 { try Self.update(a, "d\(i)") { $0["f1"].set("before backup") } }
        let backup = try sim.snapshot(a)
        for i in 0..<3 { try Self.update(a, "d\(i)") { $0["f2"].set("after backup") } }
        for i in 0..<3 { try Self.update(b, "d\(i)") { $0["f3"].set("b wrote") } }
        try sim.runUntilQuiet()
        try sim.restore(a, from: backup)
        for i in 0..<3 { try Self.update(a, "d\(i)") { $0["f4"].set("after restore") } }
        for i in 0..<3 { try Self.update(a, "d\(i)") { $0["f1"].set("after restore") } }
        try sim.runUntilQuiet()
        for i in 0..<3 {
            #expect(try Self.get(b, "d\(i)")?["f4"] == "after restore")
            #expect(try Self.get(a, "d\(i)")?["f3"] == "b wrote")
        }
        try sim.check()
    }

    /// B holds a query subscription and a whole-collection subscription on the same collection.
    @Test func queryAndWholeSubscriptionsOfOnePeer() throws {
        let (sim, a, b, pairSubs) = try Self.pair(seed: 200_051)
        var subs = pairSubs
        subs.append(try b.store.collection("items").find("f0 == 'q'").subscribe())
        defer { subs.forEach { $0.cancel() } }
        for i in 0..<4 { _ = try a.store.collection("items").upsert(Self.wide("d\(i)")) }
        try sim.runUntilQuiet()
        for round in 0..<6 {
            for i in 0..<4 {
                try Self.update(a, "d\(i)") { $0["f0"].set(.string(round % 2 == 0 ? "q" : "p")) }
                try Self.update(b, "d\(i)") { $0["f\(1 + round)"].set(.string("b \(round)")) }
            }
            sim.run(for: 50)
        }
        try sim.runUntilQuiet()
        try sim.check()
    }

    /// Remove then re-create, with deltas around it.
    @Test func removeThenRecreate() throws {
        let (sim, a, b, subs) = try Self.pair(seed: 200_061)
        defer { subs.forEach { $0.cancel() } }
        _ = try a.store.collection("items").upsert(Self.wide("d"))
        try sim.runUntilQuiet()
        try Self.update(a, "d") { $0["f0"].set("one") }
        try sim.runUntilQuiet()
        try Self.update(a, "d") { $0["f1"].set("two") }
        sim.run(for: 3)
        #expect(try b.store.collection("items").findByID("d").remove())
        _ = try b.store.collection("items").upsert(Self.wide("d", "recreated"))
        try Self.update(b, "d") { $0["f2"].set("b") }
        try Self.update(a, "d") { $0["f3"].set("a") }
        try sim.runUntilQuiet()
        try Self.update(a, "d") { $0["f4"].set("a again") }
        try Self.update(b, "d") { $0["f5"].set("b again") }
        try sim.runUntilQuiet()
        try sim.check()
    }

    /// B evicts documents A keeps changing.
    @Test(arguments: [200_071, 200_072] as [UInt64])
    func receiverEvicts(seed: UInt64) throws {
        let sim = try Simulation(seed: seed)
        let a = try sim.addNode()
        let b = try sim.addNode()
        let c = try sim.addNode()
        sim.connectAll()
        let subs = try Self.subscribeAll([a, b, c])
        defer { subs.forEach { $0.cancel() } }
        for i in 0..<4 { _ = try a.store.collection("items").upsert(Self.wide("d\(i)")) }
        try sim.runUntilQuiet()
        var random = SplitMix64(seed: seed)
        let nodes = [a, b, c]
        for round in 0..<40 {
            let node = nodes[Int(random.next() % 3)]
            let doc = "d\(random.next() % 4)"
            if random.next() % 5 == 0 {
                _ = try node.store.collection("items").findByID(.string(doc)).evict()
            } else {
                try Self.update(node, doc) { $0["f\(random.next() % 12)"].set(.string("\(node.name) \(round)")) }
            }
            sim.run(for: Millis(random.next() % 100))
        }
        try sim.runUntilQuiet()
        try sim.check()
    }

    /// Everything at once on few, wide documents: four nodes (one may hold a query subscription),
    /// writes of fields, nested fields and counters, removes and re-creates, evictions, crashes,
    /// wipes, clock offsets beyond the drift allowance, cut links.
    @Test(arguments: Array(200_101...200_140) as [UInt64])
    func mixedChaos(seed: UInt64) throws {
        let sim = try Simulation(seed: seed)
        var random = SplitMix64(seed: seed)
        let nodes = try (0..<4).map { _ in try sim.addNode() }
        sim.connect(nodes[0], nodes[1])
        sim.connect(nodes[1], nodes[2])
        sim.connect(nodes[2], nodes[3])
        if random.next() % 2 == 0 { sim.connect(nodes[0], nodes[3]) }
        var subs = try Self.subscribeAll(Array(nodes.prefix(3)))
        if random.next() % 2 == 0 {
            subs.append(try nodes[3].store.collection("items").find("f0 >= 'm'").subscribe())
        } else {
            subs.append(try nodes[3].store.collection("items").findAll().subscribe())
        }
        defer { subs.forEach { $0.cancel() } }
        for i in 0..<3 { _ = try nodes[0].store.collection("items").upsert(Self.wide("d\(i)")) }
        try sim.runUntilQuiet()
        for round in 0..<80 {
            let up = nodes.filter(\.isUp)
            guard let node = up.randomElement(using: &random) else { continue }
            let doc = "d\(random.next() % 3)"
            let field = "f\(random.next() % 6)"
            let items = node.store.collection("items")
            do {
                switch random.next() % 20 {
                case 0: _ = try items.findByID(.string(doc)).remove()
                case 1: _ = try items.upsert(Self.wide(doc, "r\(round)"))
                case 2: _ = try items.findByID(.string(doc)).evict()
                case 3: try Self.update(node, doc) { $0["n"]["a"].increment(by: .int(1)) }
                case 4: try Self.update(node, doc) { $0[field].remove() }
                case 5: try Self.update(node, doc) { $0["n"]["b"]["c"].set(.string("r\(round)")) }
                case 6:
                    let victim = nodes[Int(random.next() % 4)]
                    if victim.isUp, up.count > 1 { sim.crash(victim) } else if !victim.isUp { try sim.restart(victim) }
                case 7:
                    sim.setClockOffset(nodes[Int(random.next() % 4)], Millis(random.next() % 200_000) - 50_000)
                case 8:
                    let x = nodes[Int(random.next() % 4)]
                    let y = nodes[Int(random.next() % 4)]
                    if x !== y { sim.setLink(x, y, up: random.next() % 2 == 0) }
                default:
                    try Self.update(node, doc) {
                        $0[field].set(.string(String(repeating: "\(node.name)\(round)", count: 3)))
                    }
                }
            } catch let error as StoreError where error.refusesOneDocument {
                sim.note("refused: \(error)")
            }
            sim.run(for: Millis(random.next() % 300))
        }
        sim.heal()
        for x in nodes { for y in nodes where x !== y { sim.setLink(x, y, up: true) } }
        for node in nodes { sim.setClockOffset(node, 0) }
        for node in nodes where !node.isUp { try sim.restart(node) }
        try sim.runUntilQuiet()
        sim.run(for: 400_000)
        try sim.runUntilQuiet()
        sim.note(
            "seed \(seed) deltas sent: \(sim.deltasSent) of \(sim.documentsSent), subs \(sim.messageCounts["subs"] ?? 0)"
        )
        try sim.check()
    }
}
