import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// A reviewer's scenarios against 98f5be8, which kept a row's `seq` when one of the sender's
/// query subscriptions carried it (its scan had yet to read the row, or sent it in this session):
/// the sender cancelled that one, and another, whose scan had passed the row without sending it,
/// never read it again. Three of the four failed there; the row now keeps its `seq` only when
/// every one of them carries it (docs/MESH.md, "A peer that sends an older copy"). Each scenario
/// ends with a check that the stale peer `p` holds the serving node's state of every document it
/// holds, as the convergence invariant requires of query subscribers.
@Suite struct RelogReviewTests {
    /// `a` writes x {status: open}; `p` copies it from `a` alone (its `status == 'open'`
    /// subscription) and is cut off from `a`. `n` (a whole subscriber) writes 300 documents that
    /// only p's second query `n >= 0` matches, then closes x. `p` subscribes to `n >= 0` and
    /// connects to `n`: `n`'s whole subscription brings p's older x, while the scan of
    /// `n >= 0` (small pages, one batch in flight) is still far below x's row, and the scan of
    /// `status == 'open'` has already passed it (x, closed, does not match it). Returned with
    /// the sweep setup so that each test decides what p does next.
    static func setUp(seed: UInt64) throws -> (
        Simulation, n: SimulatedNode, p: SimulatedNode, subscriptions: [Subscription]
    ) {
        let (sim, n, p, subscriptions) = try apart(seed: seed) {
            $0.batchEntries = 8
            $0.maxInFlight = 1
            $0.maxHops = 0
        }
        try sim.runUntilQuiet()
        try n.store.collection("items").upsert(
            (0..<300).map { ["_id": .string("d\($0)"), "n": .int(Int64($0)), "status": "bulk"] })
        _ = try n.store.collection("items").findByID("x").update { $0?["status"].set("closed") }
        try sim.runUntilQuiet()
        #expect(try status(p) == "open")
        #expect(try status(n) == "closed")
        return (sim, n, p, subscriptions)
    }

    /// `a` writes x {status: open}; `n` subscribes to the whole collection and `p` to
    /// `status == 'open'`, both connected to `a`; once p holds x, its link to `a` goes down.
    static func apart(seed: UInt64, _ configuration: @escaping (inout ReplicatorConfiguration) -> Void) throws -> (
        Simulation, n: SimulatedNode, p: SimulatedNode, subscriptions: [Subscription]
    ) {
        let sim = try Simulation(seed: seed)
        sim.tracing = false
        sim.replicatorConfiguration = configuration
        let a = try sim.addNode("a")
        let n = try sim.addNode("n")
        let p = try sim.addNode("p")
        let subscriptions = [
            try n.store.collection("items").findAll().subscribe(),
            try p.store.collection("items").find("status == 'open'").subscribe(),
        ]
        try a.store.collection("items").upsert(["_id": "x", "status": "open"])
        sim.connect(a, n)
        sim.connect(a, p)
        try sim.runUntilQuiet()
        sim.setLink(a, p, up: false)
        return (sim, n, p, subscriptions)
    }

    static func status(_ node: SimulatedNode, _ id: String = "x") throws -> Value? {
        try node.store.collection("items").findByID(.string(id)).exec()?["status"]
    }

    /// P cancels `n >= 0` (the holder whose scan had yet to reach x's row, counted on to send
    /// x) before that scan gets there; `status == 'open'` had passed the row. Before 98f5be8 the
    /// row was logged again and `status == 'open'`, which holds x in its scope, sent it.
    @Test(arguments: [40, 80, 120, 160, 200] as [Millis])
    func aHolderCancelledBeforeItsScanReachesTheRowLeavesNoStaleCopy(after delay: Millis) throws {
        let (sim, n, p, subscriptions) = try Self.setUp(seed: 7_000_101)
        let all = try p.store.collection("items").find("n >= 0").subscribe()
        sim.connect(n, p)
        sim.run(for: delay)
        all.cancel()
        try sim.runUntilQuiet()
        #expect(try Self.status(n) == "closed")
        let held = try Self.status(p)
        #expect(held == "closed", "p holds x as \(String(describing: held)) after cancelling n >= 0 at \(delay) ms")
        try sim.check()
        subscriptions.forEach { $0.cancel() }
    }

    /// Control: the same, P keeps `n >= 0`: its scan reaches x's row and sends it.
    @Test func aHolderKeptSendsTheNewerState() throws {
        let (sim, n, p, subscriptions) = try Self.setUp(seed: 7_000_102)
        let all = try p.store.collection("items").find("n >= 0").subscribe()
        sim.connect(n, p)
        try sim.runUntilQuiet()
        #expect(try Self.status(p) == "closed")
        try sim.check()
        subscriptions.forEach { $0.cancel() }
        all.cancel()
    }

    /// P's link to N drops before the scan of `n >= 0` reaches x's row; P cancels that
    /// subscription while away and reconnects with `status == 'open'` only, whose checkpoint
    /// at N is past x's row (a document written after x matches it).
    @Test func aSessionThatDropsBeforeTheUnreadHolderReachesTheRowLeavesNoStaleCopy() throws {
        let (sim, n, p, subscriptions) = try Self.setUp(seed: 7_000_103)
        try n.store.collection("items").upsert(["_id": "y", "status": "open"])
        try sim.runUntilQuiet()
        let all = try p.store.collection("items").find("n >= 0").subscribe()
        sim.connect(n, p)
        sim.run(for: 100)
        sim.setLink(n, p, up: false)
        all.cancel()
        try sim.runUntilQuiet()
        #expect(try Self.status(p, "y") == "open")
        sim.setLink(n, p, up: true)
        try sim.runUntilQuiet()
        let held = try Self.status(p)
        #expect(held == "closed", "p holds x as \(String(describing: held)) after reconnecting without n >= 0")
        try sim.check()
        subscriptions.forEach { $0.cancel() }
    }

    /// The "read in this session" branch: `n`'s scan of p's `status == 'closed'` reads x's row
    /// at once and the batch carrying x (closed) is on its way (100 ms links) when p's older x
    /// arrives, so the row keeps its `seq`. p cancels `status == 'closed'` before that batch
    /// arrives: p drops it ("a batch for a subscription this side no longer asks for"), and
    /// `status == 'open'`, whose scan passed x's row before p's copy was recorded in its scope,
    /// never sends x. Swept over when p cancels.
    @Test(arguments: [150, 200, 250, 300, 350, 400, 450, 500] as [Millis])
    func aBatchInFlightDroppedByACancelLeavesNoStaleCopy(after delay: Millis) throws {
        let (sim, n, p, subscriptions) = try Self.apart(seed: 7_000_104) { $0.maxHops = 0 }
        _ = try n.store.collection("items").findByID("x").update { $0?["status"].set("closed") }
        try sim.runUntilQuiet()
        let closed = try p.store.collection("items").find("status == 'closed'").subscribe()
        sim.setProfile(LinkProfile(latency: 100), between: n, and: p)
        sim.connect(n, p)
        sim.run(for: delay)
        closed.cancel()
        try sim.runUntilQuiet()
        let held = try Self.status(p)
        #expect(held == "closed", "p holds x as \(String(describing: held)) after cancelling at \(delay) ms")
        try sim.check()
        subscriptions.forEach { $0.cancel() }
    }
}
