import Testing
import Trellis
import TrellisCore
import TrellisStore

@testable import TrellisSimulation

/// A reviewer's scenarios for 9df96ad: a relay served a request with `h` (from 0 or from a
/// checkpoint) asks its own requests in the collection without `h` again with it and marks its
/// `notAsked` checkpoints on the other peers `wanted` (docs/DATA-MODEL.md, "A relay counts a
/// collection as held"); and a checkpoint stored `notAsked` after a local creation is stored
/// `wanted`. Loops and cost in rings and meshes, relay chains with restarts and dropped links,
/// a cancelled asker, other collections, and the classic stale copy through relays.
@Suite struct RelayReapedKeysBreakTests: StaleCopyChecks {
    static let ttl: Millis = 120_000

    /// Requests with `h` (not refetches) in the trace after `after`, by directed link ("a->b").
    static func hRequests(_ sim: Simulation, after: Int = 0) -> [String: Int] {
        var out: [String: Int] = [:]
        for line in sim.trace[after...] {
            guard let subs = line.range(of: " subs v"), let open = line.firstIndex(of: "["),
                let arrow = line.range(of: " -> ")
            else { continue }
            let entries = line[line.index(after: open)...].dropLast().components(separatedBy: "; ")
            guard entries.contains(where: { $0.hasSuffix(" h") && !$0.contains("trellisEvicted") }) else { continue }
            let from = line[..<arrow.lowerBound].split(separator: " ").last.map(String.init) ?? "?"
            let to = line[arrow.upperBound..<subs.lowerBound].trimmingCharacters(in: .whitespaces)
            out["\(from)->\(to)", default: 0] += 1
        }
        return out
    }

    /// Batches naming `id` in the trace after `after`.
    static func batches(_ sim: Simulation, naming id: String = "\"d1\"", after: Int = 0) -> Int {
        sim.trace[after...].filter { $0.contains(" batch ") && $0.contains(id) }.count
    }

    /// Whether `node`'s d1 holds `remover`'s remove.
    static func hasRemove(_ node: SimulatedNode, of remover: SimulatedNode) throws -> Bool {
        guard let state = try node.documents.state(id: "d1", in: "items") else { return false }
        return state.removed[remover.documents.siteID] != nil
    }

    /// W, with a keeper that acknowledges its remove and then is gone, removes d1 and reaps it
    /// alone; d2 stays (with `keepD2`; otherwise W removes and reaps it too, and nothing live is
    /// left to bring `h` around a ring before a creation).
    static func reaper(seed: UInt64, keepD2: Bool = true) throws -> (Simulation, SimulatedNode, Subscription) {
        let sim = try Simulation(seed: seed)
        sim.storeOptions.tombstoneTTL = UInt64(ttl)
        let w = try sim.addNode("w")
        let (k, kept) = try sim.addKeeper(beside: w)
        try w.store.collection("items").upsert([["_id": "d1", "v": 1, "m": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        try w.store.collection("items").findByID("d1").remove()
        if !keepD2 { try w.store.collection("items").findByID("d2").remove() }
        try sim.runUntilQuiet()
        sim.run(for: ttl + 2 * 60_000)
        #expect(try w.documents.state(id: "d1", in: "items") == nil, "W reaped d1's tombstone")
        sim.crash(k)
        return (sim, w, kept)
    }

    // MARK: 1. Rings: does h go around forever?

    /// A triangle A — B — C — A of relays, B also linked to W (which removed and reaped d1).
    /// A subscribes to the whole collection, B and C to a query matching nothing. A creates d1:
    /// the mesh goes quiet, A's d1 holds W's remove, and `h` goes over each link a bounded
    /// number of times.
    @Test func aTriangleOfRelaysGoesQuiet() throws {
        let (sim, w, kept) = try Self.reaper(seed: 9_700_101, keepD2: false)
        let a = try sim.addNode("a")
        let b = try sim.addNode("b")
        let c = try sim.addNode("c")
        sim.connect(b, w)
        sim.connect(a, b)
        sim.connect(b, c)
        sim.connect(c, a)
        let subs = [
            try a.store.collection("items").findAll().subscribe(),
            try b.store.collection("items").find("v >= 5").subscribe(),
            try c.store.collection("items").find("v >= 5").subscribe(),
        ]
        try sim.runUntilQuiet()
        #expect(try Self.ids(a) == [])
        let before = sim.trace.count
        try a.store.collection("items").upsert(["_id": "d1", "s": "x"])
        try sim.runUntilQuiet()
        let h = Self.hRequests(sim, after: before)
        let sent = Self.batches(sim, after: before)
        print("triangle: h requests by link \(h.sorted { $0.key < $1.key }), batches naming d1 \(sent)")
        #expect(h.values.allSatisfy { $0 <= 2 }, "\(h)")
        #expect(try Self.hasRemove(a, of: w), "A's d1 holds W's remove")
        // Quiet for good: another long stretch sends no request with h.
        let later = sim.trace.count
        sim.run(for: 10 * 60_000)
        #expect(Self.hRequests(sim, after: later).isEmpty)
        try sim.check()
        _ = (subs, kept)
    }

    /// A ring of four whole-collection subscribers A — B — C — D — A, B linked to W; A and C each
    /// create d1 (an `_id` of their own), at once.
    @Test func aRingOfFourWithTwoCreatorsGoesQuiet() throws {
        let (sim, w, kept) = try Self.reaper(seed: 9_700_102, keepD2: false)
        let nodes = try ["a", "b", "c", "d"].map { try sim.addNode($0) }
        sim.connect(nodes[1], w)
        for i in 0..<4 { sim.connect(nodes[i], nodes[(i + 1) % 4]) }
        let subs = try nodes.map { try $0.store.collection("items").findAll().subscribe() }
        try sim.runUntilQuiet()
        let before = sim.trace.count
        try nodes[0].store.collection("items").upsert(["_id": "d1", "s": "a"])
        try nodes[2].store.collection("items").upsert(["_id": "d1", "s": "c"])
        try sim.runUntilQuiet()
        let h = Self.hRequests(sim, after: before)
        print("ring of four: h requests by link \(h.sorted { $0.key < $1.key }), total \(h.values.reduce(0, +))")
        #expect(h.values.allSatisfy { $0 <= 2 }, "\(h)")
        for node in nodes { #expect(try Self.hasRemove(node, of: w), "\(node.name)'s d1 holds W's remove") }
        try sim.check()
        _ = (subs, kept)
    }

    // MARK: 2. Cost

    /// Five nodes besides W, all linked to one another, one (n5) to W, all whole-collection
    /// subscribers; only n1 creates d1. Requests with `h` stay within once per link (twice at most), and
    /// d1's remove reaches everyone.
    @Test func aFullMeshWithOneCreatorIsBounded() throws {
        let (sim, w, kept) = try Self.reaper(seed: 9_700_103, keepD2: false)
        let nodes = try (1...5).map { try sim.addNode("n\($0)") }
        sim.connect(nodes[4], w)
        for (i, x) in nodes.enumerated() {
            for y in nodes[(i + 1)...] { sim.connect(x, y) }
        }
        let subs = try nodes.map { try $0.store.collection("items").findAll().subscribe() }
        try sim.runUntilQuiet()
        let before = sim.trace.count
        print("full mesh: h requests before the creation \(Self.hRequests(sim).values.reduce(0, +))")
        try nodes[0].store.collection("items").upsert(["_id": "d1", "s": "x"])
        try sim.runUntilQuiet()
        let h = Self.hRequests(sim, after: before)
        let total = h.values.reduce(0, +)
        print(
            "full mesh of 6: h requests \(total) over \(h.count) directed links \(h.sorted { $0.key < $1.key }); "
                + "batches naming d1 \(Self.batches(sim, after: before))")
        #expect(h.values.allSatisfy { $0 <= 2 }, "\(h)")
        for node in nodes { #expect(try Self.hasRemove(node, of: w), "\(node.name)'s d1 holds W's remove") }
        try sim.check()
        _ = (subs, kept)
    }

    /// Five new nodes holding nothing, linked to one another and each to W, which removed and
    /// reaped d1 and d2 and holds no live document; all subscribe to the whole collection. No
    /// node holds or creates anything, so none needs W's reaped keys. The reviewer found that
    /// W relays their requests to one another with `h` (it holds rows of the collection), each
    /// node serving such a request asks all its other peers with `h` (``Replicator`` `serve`,
    /// `askedWithH`, 9df96ad), and every node ends up asking every peer with `h` once, W too,
    /// from its checkpoint: W's reaped keys go to each of them once. Kept as the cost of the
    /// relay rule (docs/DATA-MODEL.md, "A relay counts a collection as held"): narrowed to
    /// requests from a checkpoint, it would leave a relay whose own request of the same key
    /// resumes a `notAsked` checkpoint without the remover's tombstones. Checked: it is once,
    /// and the mesh goes quiet.
    @Test func anEmptyMeshFetchesReapedKeysOncePerNode() throws {
        let (sim, w, kept) = try Self.reaper(seed: 9_700_109, keepD2: false)
        let nodes = try (1...5).map { try sim.addNode("n\($0)") }
        for (i, x) in nodes.enumerated() {
            sim.connect(x, w)
            for y in nodes[(i + 1)...] { sim.connect(x, y) }
        }
        let subs = try nodes.map { try $0.store.collection("items").findAll().subscribe() }
        try sim.runUntilQuiet()
        let h = Self.hRequests(sim)
        let reapedSent = sim.trace.filter { $0.contains(" w -> n") && $0.contains(" batch ") && $0.contains("\"d1\"") }
        print(
            "empty mesh: h requests \(h.values.reduce(0, +)) over \(h.count) links; "
                + "W sent d1's reaped key \(reapedSent.count) times")
        for node in nodes {
            let reaped = try node.documents.checkpoints(peer: w.peerKey).values.map(\.reapedKeys)
            #expect(reaped == [.received], "\(node.name)'s checkpoint on W: \(reaped)")
        }
        #expect(reapedSent.count <= nodes.count, "W's reaped keys once per node at most: \(reapedSent.count)")
        let quiet = sim.trace.count
        sim.run(for: 10 * 60_000)
        #expect(Self.hRequests(sim, after: quiet).isEmpty, "no request with h once quiet")
        try sim.check()
        _ = (subs, kept)
    }

    /// S's requests to W whose entry for `spec` (its trace form, "items: v >= 5") says `h`,
    /// after `after`.
    static func sAsksWithH(_ sim: Simulation, _ spec: String, after: Int) -> Int {
        sim.trace[after...].filter { line in
            guard line.contains(" s -> w subs "), let open = line.firstIndex(of: "[") else { return false }
            return line[line.index(after: open)...].dropLast().components(separatedBy: "; ").contains {
                $0.hasPrefix(spec + " since") && $0.hasSuffix(" h")
            }
        }.count
    }

    /// W — S — N, N holding d2 through S. N creates d1 and keeps changing its subscription set
    /// (a query added, then cancelled, ten times while its request says `h`, five more after):
    /// S's own requests to W (its query, and N's whole collection relayed) are asked again with
    /// `h` once, however often N's set with `h` comes. Each new query of N's goes from 0 with `h`
    /// (N holds rows) and is relayed with it (``Replicator`` `heldByAskers`, from before 9df96ad):
    /// one request, and one batch of W's reaped keys, per query.
    @Test func aChurningAskerDoesNotMakeTheRelayAskAgainAndAgain() throws {
        let (m, kept) = try CreatedReapedBreakTests.newRelay(seed: 9_700_104)
        let (sim, w, n) = (m.sim, m.w, m.n)
        let before = sim.trace.count
        try n.store.collection("items").upsert(["_id": "d1", "s": "x"])
        for i in 0..<10 {
            let q = try n.store.collection("items").find("v >= \(10 + i)").subscribe()
            sim.run(for: 40)
            q.cancel()
            sim.run(for: 40)
        }
        try sim.runUntilQuiet()
        for i in 0..<5 {
            let q = try n.store.collection("items").find("v >= \(100 + i)").subscribe()
            try sim.runUntilQuiet()
            q.cancel()
            try sim.runUntilQuiet()
        }
        let own = Self.sAsksWithH(sim, "items: v >= 5", after: before)
        let relayed = Self.sAsksWithH(sim, "items: true", after: before)
        let all = Self.hRequests(sim, after: before)
        print("churn: S's query with h \(own), N's whole collection relayed with h \(relayed), all \(all)")
        #expect(own == 1)
        #expect(relayed == 1)
        #expect(try Self.hasRemove(n, of: w))
        try sim.check()
        _ = (m.subs, kept)
    }

    // MARK: 3. Relay chains

    enum Fault: CaseIterable, Sendable {
        case none
        /// S1 crashes right after S2's `h` request reached it, and restarts.
        case firstRelayRestarts
        /// The link S1 — W drops right after N asks, and comes back after two minutes.
        case linkDrops
        /// S2 crashes right after N's request reached it, and restarts.
        case secondRelayRestarts
    }

    /// W — S1 — S2 — N, S1 and S2 new and holding nothing, each subscribed to a query matching
    /// nothing; N holds d2 through both. N creates d1: its d1 ends up holding W's remove.
    @Test(arguments: Fault.allCases) func aChainOfTwoNewRelays(_ fault: Fault) throws {
        let (sim, w, kept) = try Self.reaper(seed: 9_700_105)
        let s1 = try sim.addNode("s1")
        let s2 = try sim.addNode("s2")
        let n = try sim.addNode("n")
        sim.connect(s1, w)
        sim.connect(s2, s1)
        sim.connect(n, s2)
        let subs = [
            try s1.store.collection("items").find("v >= 5").subscribe(),
            try s2.store.collection("items").find("v >= 6").subscribe(),
            try n.store.collection("items").findAll().subscribe(),
        ]
        try sim.runUntilQuiet()
        #expect(try Self.ids(n) == ["\"d2\""])
        let before = sim.trace.count
        try n.store.collection("items").upsert(["_id": "d1", "s": "x"])
        switch fault {
        case .none: break
        case .firstRelayRestarts:
            var steps = 0
            while Self.hRequests(sim, after: before)["s2->s1"] == nil, steps < 2_000 {
                sim.run(for: 1)
                steps += 1
            }
            sim.run(for: 6)
            sim.crash(s1)
            try sim.restart(s1)
        case .linkDrops:
            sim.run(for: 3)
            sim.setLink(s1, w, up: false)
            sim.run(for: 120_000)
            sim.setLink(s1, w, up: true)
        case .secondRelayRestarts:
            var steps = 0
            while Self.hRequests(sim, after: before)["n->s2"] == nil, steps < 2_000 {
                sim.run(for: 1)
                steps += 1
            }
            sim.run(for: 6)
            sim.crash(s2)
            try sim.restart(s2)
        }
        try sim.runUntilQuiet()
        let h = Self.hRequests(sim, after: before)
        let ok = try Self.hasRemove(n, of: w)
        #expect(ok, "\(fault): N's d1 holds W's remove (h requests \(h))")
        if !ok { Self.dump(sim, "chain \(fault)", last: 60) }
        try sim.check()
        _ = (subs, kept)
    }

    // MARK: 4. The asker leaves; other collections

    /// As ``CreatedReapedBreakTests/aNewRelayThatHoldsNothingPassesTheAskOn()``, but N cancels its
    /// subscription right after asking S with `h`: the mesh goes quiet; subscribed again, N's d1
    /// gets W's remove.
    @Test func theAskerCancelsRightAfterAsking() throws {
        let (m, kept) = try CreatedReapedBreakTests.newRelay(seed: 9_700_106)
        var subs = m.subs
        let (sim, w, n) = (m.sim, m.w, m.n)
        let before = sim.trace.count
        try n.store.collection("items").upsert(["_id": "d1", "s": "x"])
        var steps = 0
        while Self.hRequests(sim, after: before)["n->s"] == nil, steps < 2_000 {
            sim.run(for: 1)
            steps += 1
        }
        sim.run(for: 5)
        subs[1].cancel()
        try sim.runUntilQuiet()
        let h = Self.hRequests(sim, after: before)
        subs[1] = try n.store.collection("items").findAll().subscribe()
        try sim.runUntilQuiet()
        let ok = try Self.hasRemove(n, of: w)
        #expect(ok, "N's d1 holds W's remove once subscribed again (h requests before \(h))")
        if !ok { Self.dump(sim, "cancelled asker", last: 60) }
        try sim.check()
        _ = (subs, kept)
    }

    /// S asks W in two collections, `items` and `other`, from 0 without `h` (it holds nothing).
    /// N asks S with `h` in `items` only: S's checkpoints in `other` stay `notAsked`, and S asks
    /// W nothing with `h` in `other`.
    @Test func anAskInOneCollectionLeavesAnotherAlone() throws {
        let (m, kept) = try CreatedReapedBreakTests.newRelay(seed: 9_700_107)
        let (sim, w, s, n) = (m.sim, m.w, m.s, m.n)
        try w.store.collection("other").upsert([["_id": "o1", "v": 7]])
        let sOther = try s.store.collection("other").findAll().subscribe()
        try sim.runUntilQuiet()
        func otherCheckpoints() throws -> [ReapedKeys] {
            try s.documents.checkpoints(peer: w.peerKey).filter {
                SubscriptionSpec.collection(ofKey: $0.key.string) == "other"
            }.map(\.value.reapedKeys)
        }
        #expect(try otherCheckpoints() == [.notAsked])
        let before = sim.trace.count
        try n.store.collection("items").upsert(["_id": "d1", "s": "x"])
        try sim.runUntilQuiet()
        #expect(try Self.hasRemove(n, of: w))
        #expect(try otherCheckpoints() == [.notAsked], "S's checkpoint in other is left alone")
        let otherWithH = sim.trace[before...].filter {
            $0.contains(" s -> w subs ")
                && $0.components(separatedBy: "; ").contains { $0.contains("other") && $0.hasSuffix(" h") }
        }
        #expect(otherWithH.isEmpty, "\(otherWithH)")
        sim.crash(s)
        try sim.restart(s)
        try sim.runUntilQuiet()
        #expect(try otherCheckpoints() == [.notAsked], "and across a restart")
        try sim.check()
        _ = (m.subs, sOther, kept)
    }

    // MARK: 5. The classic stale copy, through relays

    enum Return: CaseIterable, Sendable {
        /// X comes back to the relay it left.
        case sameRelay
        /// X comes back through a new relay that holds nothing.
        case newRelay
        /// X comes back, and creates d3 (an `_id` of its own) at once.
        case createsOnReturn
    }

    /// W — S1 — S2 — X, all subscribed to the whole collection but S1 (a query). X holds d1,
    /// is cut off longer than the TTL while W removes d1 and every node reaps it, then comes
    /// back: no node shows d1.
    @Test(arguments: Return.allCases) func aStaleCopyThroughRelays(_ back: Return) throws {
        let sim = try Simulation(seed: 9_700_108)
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let w = try sim.addNode("w")
        let s1 = try sim.addNode("s1")
        let s2 = try sim.addNode("s2")
        let x = try sim.addNode("x")
        sim.connect(s1, w)
        sim.connect(s2, s1)
        sim.connect(x, s2)
        var subs = [
            try s1.store.collection("items").find("v >= 5").subscribe(),
            try s2.store.collection("items").findAll().subscribe(),
            try x.store.collection("items").findAll().subscribe(),
        ]
        try w.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try Self.ids(x) == ["\"d1\"", "\"d2\""])
        sim.setLink(x, s2, up: false)
        sim.run(for: 10_000)
        try w.store.collection("items").findByID("d1").remove()
        try sim.runUntilQuiet()
        sim.run(for: Self.ttl + 3 * 60_000)
        for node in [w, s1, s2] {
            #expect(try node.documents.state(id: "d1", in: "items") == nil, "\(node.name) reaped d1")
        }
        var nodes = [w, s1, s2, x]
        switch back {
        case .sameRelay, .createsOnReturn:
            sim.setLink(x, s2, up: true)
            if back == .createsOnReturn { try x.store.collection("items").upsert(["_id": "d3", "v": 3]) }
        case .newRelay:
            let s3 = try sim.addNode("s3")
            subs.append(try s3.store.collection("items").find("v >= 7").subscribe())
            sim.connect(s3, s2)
            sim.connect(x, s3)
            nodes.append(s3)
        }
        try sim.runUntilQuiet()
        try Self.expectGone(sim, nodes, "\(back)")
        try sim.check()
        _ = subs
    }
}
