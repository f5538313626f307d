import Trellis
public import TrellisCore
import TrellisStore

/// A fault a ``RandomWorkload`` may inject.
public enum SimulatedFault: String, CaseIterable, Sendable, Comparable {
    /// Split the mesh in two, heal later.
    case partition
    /// Take single links down and up.
    case links
    /// Kill nodes (store kept) and restart them.
    case crash
    /// Restart crashed nodes with a wiped store.
    case wipe
    /// Skew nodes' clocks by up to ±20 s.
    case clock
    /// Latency and jitter up to 200 ms, and bandwidth limits.
    case latency
    /// Connections reset now and then.
    case reset
    /// Messages vanish, arrive twice, or overtake each other on a link.
    case unreliable
    /// Apps evict documents.
    case evict

    public static func < (lhs: SimulatedFault, rhs: SimulatedFault) -> Bool { lhs.rawValue < rhs.rawValue }

    /// Parses a comma-separated list (`partition,crash`), `all` or `none`.
    ///
    /// - Throws: ``WorkloadError`` naming an unknown fault.
    public static func parse(_ text: String) throws(WorkloadError) -> Set<SimulatedFault> {
        if text == "all" { return Set(allCases) }
        if text == "none" || text.isEmpty { return [] }
        var out: Set<SimulatedFault> = []
        for name in text.split(separator: ",") {
            guard let fault = SimulatedFault(rawValue: String(name)) else {
                throw WorkloadError(
                    "unknown fault '\(name)'; known: \(allCases.map(\.rawValue).joined(separator: ", ")), all, none")
            }
            out.insert(fault)
        }
        return out
    }
}

/// A bad workload option.
public struct WorkloadError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Random apps and faults on a random mesh, then heal and check every invariant: one seed, one
/// run. `trellis simulate` and the test suite's sweep run many seeds.
public struct RandomWorkload: Sendable {
    /// How many nodes (drawn from the seed within this range).
    public var nodes: ClosedRange<Int> = 3...8
    /// Random steps (an app operation or a fault each) before the final heal.
    public var steps = 60
    /// Faults to inject.
    public var faults: Set<SimulatedFault> = Set(SimulatedFault.allCases)
    /// Distinct `_id`s written to (fewer means more conflicts).
    public var documents = 12
    /// The app operations drawn (``WorkloadOperations``).
    public var operations = WorkloadOperations.wide
    /// Nodes (the last ones of each mesh, at most all but one) that hold only the documents of a
    /// query of their own (drawn from ``queries``), cancel it and make it again at random; each
    /// other node then replicates the whole collection or, as often, only relays, so nodes relay
    /// query subscriptions that come and go (docs/MESH.md, "Leaving a subscription's scope").
    /// At least one replicates the whole collection (the first, when none was drawn): the
    /// invariants compare each query subscriber with such a replica.
    /// 0 (the default) draws the single optional query node of earlier seeds, which replay as
    /// they did.
    public var queryNodes = 0
    /// Whether the ``queryNodes`` also subscribe to the whole collection now and then, and cancel
    /// it again: they then hold documents outside their query from a whole-collection service,
    /// their neighbours relay whole-collection subscriptions that end, and each is a query
    /// subscriber again at the final check (docs/MESH.md, "Leaving a subscription's scope").
    /// Off by default, so that recorded seeds replay as they did.
    public var widening = false
    /// Whether each of the ``queryNodes`` also subscribes to a second query of its own (another
    /// of ``queries``), which it cancels and makes again at random like the first: a node that
    /// sends a peer an older copy of a document then has two query subscriptions served there,
    /// one of which may have passed the document's row without sending it while the other is
    /// cancelled (docs/MESH.md, "A peer that sends an older copy"). Off by default, so that
    /// recorded seeds replay as they did.
    public var secondQueries = false
    /// With a value: tombstone expiry mode. The stores keep tombstones this long
    /// (`StoreOptions.tombstoneTTL`, milliseconds) instead of seven days, and while a partition,
    /// a link down or a crashed node keeps nodes apart the workload now and then lets more than
    /// the TTL pass (the TTL and two reaper ticks), so nodes away longer than it come back to
    /// peers that reaped (docs/DATA-MODEL.md, "Tombstones and reaping"; docs/MESH.md,
    /// "Tombstones"); it also moves single nodes' clocks ahead as time that passed for them
    /// (``Simulation/passTime(_:by:)``, to at most 35 s ahead, within the clocks' allowed drift),
    /// so they reap a little before their peers. A run otherwise lasts minutes and never reaps.
    /// `nil` (the default) draws nothing more, so that recorded seeds replay as they did.
    public var tombstoneTTL: Millis?
    /// The queries ``queryNodes`` draw from.
    public static let queries = ["v >= 5", "v < 3", "s == 'a'", "v >= 2 && v <= 6"]

    public init() {}

    /// Runs one seed.
    ///
    /// - Returns: the finished simulation (its ``Simulation/trace`` tells what happened).
    /// - Throws: ``SimulationFailure`` when an invariant breaks or the mesh never goes quiet;
    ///   the store's errors if a node cannot open its database.
    @discardableResult
    public func run(seed: UInt64, tracing: Bool = true) throws -> Simulation {
        let sim = try Simulation(seed: seed)
        sim.tracing = tracing
        if let tombstoneTTL { sim.storeOptions.tombstoneTTL = UInt64(max(0, tombstoneTTL)) }
        var random = SplitMix64(seed: seed ^ 0x5EED_5EED_5EED_5EED)
        let count = Int.random(in: nodes, using: &random)
        for _ in 0..<count { try sim.addNode() }
        sim.connectRandomly(extraLinks: Int.random(in: 0...count, using: &random))
        // Most nodes replicate the whole collection; one may hold only a query's documents, and
        // may subscribe only later, after writing documents its query does not match.
        var subscriptions: [Any] = []
        var lateQuery: (node: SimulatedNode, step: Int)?
        // The query node's own subscription, which it may cancel and make again (the records of
        // what it holds pass from one to the next: docs/MESH.md).
        var query: (node: SimulatedNode, subscription: Subscription?)?
        func subscribeToQuery(_ node: SimulatedNode, _ text: String = "v >= 5") throws -> Subscription {
            try node.store.collection("items").find(text).subscribe()
        }
        // With ``queryNodes``: the last nodes' own queries, and whether each is asked now.
        var queryNodeSubscriptions: [(node: SimulatedNode, query: String, subscription: Subscription?)] = []
        let queryNodes = min(self.queryNodes, count - 1)
        for (i, node) in sim.nodes.enumerated() {
            if queryNodes > 0 {
                if i >= count - queryNodes {
                    let text = Self.queries.randomElement(using: &random)!
                    queryNodeSubscriptions.append((node, text, try subscribeToQuery(node, text)))
                    try node.watch("items", query: text)
                } else if Bool.random(using: &random) {
                    subscriptions.append(try node.store.collection("items").findAll().subscribe())
                    try node.watch("items")
                }
            } else if i == count - 1, count > 3, Bool.random(using: &random) {
                if Bool.random(using: &random) {
                    lateQuery = (node, Int.random(in: 0..<steps, using: &random))
                } else {
                    query = (node, try subscribeToQuery(node))
                    try node.watch("items", query: "v >= 5")
                }
            } else {
                subscriptions.append(try node.store.collection("items").findAll().subscribe())
                try node.watch("items")
            }
            node.mirrorContacts("items")
            if operations == .wide { try WideOperations.watch(node) }
        }
        // The query nodes, each once (the first entries), for ``widening``.
        let widenable = queryNodeSubscriptions.count
        if secondQueries {
            for (node, first, _) in queryNodeSubscriptions {
                let text = Self.queries.filter { $0 != first }.randomElement(using: &random)!
                queryNodeSubscriptions.append((node, text, try subscribeToQuery(node, text)))
                try node.watch("items", query: text)
            }
        }
        if queryNodes > 0, subscriptions.isEmpty {
            // The invariants compare each query subscriber with a whole-collection replica: with
            // none drawn, the first node is one, so that no mesh goes unchecked.
            subscriptions.append(try sim.nodes[0].store.collection("items").findAll().subscribe())
            try sim.nodes[0].watch("items")
            sim.note("\(sim.nodes[0].name) app: subscribe to items (a whole-collection replica for the invariants)")
        }
        if operations == .wide { sim.invariants.append(WideOperations.queriesAgree) }
        var partitioned = false
        // With ``widening``: each query node's whole-collection subscription, while it has one.
        var widened: [Int: Subscription] = [:]
        for step in 0..<steps {
            sim.run(for: Millis.random(in: 0...1_500, using: &random))
            if let (node, from) = lateQuery, step >= from, node.isUp {
                query = (node, try subscribeToQuery(node))
                try node.watch("items", query: "v >= 5")
                sim.note("\(node.name) app: subscribe to items where v >= 5")
                lateQuery = nil
            } else if let (node, subscription) = query, node.isUp, Int.random(in: 0..<20, using: &random) == 0 {
                if let subscription {
                    subscription.cancel()
                    query = (node, nil)
                    sim.note("\(node.name) app: cancel its subscription to items where v >= 5")
                } else {
                    query = (node, try subscribeToQuery(node))
                    sim.note("\(node.name) app: subscribe to items where v >= 5 again")
                }
            }
            if !queryNodeSubscriptions.isEmpty, Int.random(in: 0..<8, using: &random) == 0 {
                let index = Int.random(in: 0..<queryNodeSubscriptions.count, using: &random)
                let (node, text, subscription) = queryNodeSubscriptions[index]
                if node.isUp {
                    if let subscription {
                        subscription.cancel()
                        queryNodeSubscriptions[index].subscription = nil
                        sim.note("\(node.name) app: cancel its subscription to items where \(text)")
                    } else {
                        queryNodeSubscriptions[index].subscription = try subscribeToQuery(node, text)
                        sim.note("\(node.name) app: subscribe to items where \(text) again")
                    }
                }
            }
            if widening, !queryNodeSubscriptions.isEmpty, Int.random(in: 0..<8, using: &random) == 0 {
                let index = Int.random(in: 0..<widenable, using: &random)
                let node = queryNodeSubscriptions[index].node
                if node.isUp {
                    if let whole = widened[index] {
                        whole.cancel()
                        widened[index] = nil
                        sim.note("\(node.name) app: cancel its subscription to the whole of items")
                    } else {
                        widened[index] = try node.store.collection("items").findAll().subscribe()
                        sim.note("\(node.name) app: subscribe to the whole of items")
                    }
                }
            }
            if Int.random(in: 0..<5, using: &random) == 0, let node = sim.nodes.randomElement(using: &random) {
                try node.syncContactMirrors()  // a contacts host catching up, anchors kept across faults
            }
            if faults.isEmpty || Int.random(in: 0..<10, using: &random) < 6 {
                try appOperation(sim, &random)
            } else {
                try fault(sim, &random, partitioned: &partitioned)
            }
            if let tombstoneTTL { expire(sim, ttl: tombstoneTTL, &random) }
        }
        // Heal everything, restart what is down, let it settle, check.
        sim.heal()
        sim.defaultProfile = LinkProfile()
        sim.resetProfiles()
        for node in sim.nodes where !node.isUp { try sim.restart(node) }
        if let (node, _) = lateQuery {
            query = (node, try subscribeToQuery(node))
            try node.watch("items", query: "v >= 5")
        }
        if let (node, subscription) = query, subscription == nil {
            query = (node, try subscribeToQuery(node))
        }
        for (index, whole) in widened.sorted(by: { $0.key < $1.key }) {
            whole.cancel()
            sim.note("\(queryNodeSubscriptions[index].node.name) app: cancel its subscription to the whole of items")
        }
        for index in queryNodeSubscriptions.indices where queryNodeSubscriptions[index].subscription == nil {
            let (node, text, _) = queryNodeSubscriptions[index]
            queryNodeSubscriptions[index].subscription = try subscribeToQuery(node, text)
        }
        try sim.runUntilQuiet()
        try sim.check()
        _ = (subscriptions, query, queryNodeSubscriptions)
        return sim
    }

    private func appOperation(_ sim: Simulation, _ random: inout SplitMix64) throws {
        let up = sim.nodes.filter(\.isUp)
        guard let node = up.randomElement(using: &random) else { return }
        let items = node.store.collection("items")
        let id = Value.string("d\(Int.random(in: 0..<documents, using: &random))")
        guard operations == .wide else { return try basicOperation(sim, node, items, id, &random) }
        if Int.random(in: 0..<2, using: &random) == 0 {
            try WideOperations(evicts: faults.contains(.evict)).run(sim, node, items, id, &random)
            return
        }
        do {
            try basicOperation(sim, node, items, id, &random)
        } catch let error as StoreError where error.refusesOneDocument {
            // The wide operations may have left a non-number where this increments.
            sim.note("\(node.name) app: refused: \(error)")
        }
    }

    private func basicOperation(
        _ sim: Simulation, _ node: SimulatedNode, _ items: TrellisCollection, _ id: Value,
        _ random: inout SplitMix64
    ) throws {
        switch Int.random(in: 0..<10, using: &random) {
        case 0...3:
            var fields: UTF8Map<Value> = ["_id": id, "v": .int(Int64.random(in: 0...9, using: &random))]
            if Bool.random(using: &random) {
                fields["s"] = .string(["a", "b", "é", "e\u{301}"].randomElement(using: &random)!)
            }
            if Bool.random(using: &random) { fields["m"] = ["x": .int(Int64.random(in: 0...3, using: &random))] }
            if Int.random(in: 0..<4, using: &random) == 0 {
                // Canonically equivalent but byte-different field names stay two fields.
                fields[["é", "e\u{301}"].randomElement(using: &random)!] = .int(Int64.random(in: 0...3, using: &random))
            }
            try items.upsert(.map(fields))
            sim.note("\(node.name) app: upsert \(Value.map(fields))")
        case 4:
            let amount = Int64.random(in: -2...5, using: &random)
            _ = try items.findByID(id).update { doc in doc?["n"].increment(by: .int(amount)) }
            sim.note("\(node.name) app: increment \(id).n by \(amount)")
        case 5:
            let amount = [0.1, 0.2, 0.3, -0.7].randomElement(using: &random)!
            _ = try items.findByID(id).update { doc in doc?["f"].increment(by: .double(amount)) }
            sim.note("\(node.name) app: increment \(id).f by \(amount)")
        case 6:
            _ = try items.findByID(id).update { doc in doc?["s"].remove() }
            sim.note("\(node.name) app: unset \(id).s")
        case 7:
            let v = Int64.random(in: 0...9, using: &random)
            _ = try items.findByID(id).update { doc in doc?["v"].set(.int(v)) }
            sim.note("\(node.name) app: set \(id).v = \(v)")
        case 8:
            try items.findByID(id).remove()
            sim.note("\(node.name) app: remove \(id)")
        default:
            if faults.contains(.evict) {
                try items.findByID(id).evict()
                sim.note("\(node.name) app: evict \(id)")
            }
        }
    }

    /// With ``tombstoneTTL``: now and then, more than the TTL passes while nodes are apart, or a
    /// single node's clock moves ahead as time that passed for it.
    private func expire(_ sim: Simulation, ttl: Millis, _ random: inout SplitMix64) {
        switch Int.random(in: 0..<10, using: &random) {
        case 0:
            // Only while something keeps nodes apart: those away come back, after the TTL and two
            // reaper ticks (the sync host reaps every minute), to peers that reaped.
            guard sim.isSplit || sim.nodes.contains(where: { !$0.isUp }) else { return }
            let duration = ttl + 2 * 60_000
            sim.note("\(duration) ms pass while nodes are apart: tombstones expire")
            sim.run(for: duration)
        case 1:
            // A node whose clock runs ahead reaps before its peers. At most 35 s ahead in all, so
            // that with a peer 20 s behind (the clock fault) it stays within the 60 s drift peers
            // accept stamps from: further, they would put off its writes until their clocks
            // caught up, which they never do in a run.
            guard let node = sim.nodes.filter(\.isUp).randomElement(using: &random) else { return }
            let duration = Millis.random(in: 5_000...30_000, using: &random)
            if node.clockOffset + duration <= 35_000 { sim.passTime(node, by: duration) }
        default:
            break
        }
    }

    private func fault(_ sim: Simulation, _ random: inout SplitMix64, partitioned: inout Bool) throws {
        let choices = faults.sorted()
        switch choices.randomElement(using: &random)! {
        case .partition:
            if partitioned {
                sim.heal()
            } else {
                var shuffled = sim.nodes
                shuffled.shuffle(using: &random)
                let cut = Int.random(in: 1..<shuffled.count, using: &random)
                sim.partition([Array(shuffled[..<cut]), Array(shuffled[cut...])])
            }
            partitioned.toggle()
        case .links:
            let a = sim.nodes.randomElement(using: &random)!
            let b = sim.nodes.randomElement(using: &random)!
            if a !== b { sim.setLink(a, b, up: Bool.random(using: &random)) }
        case .crash:
            let node = sim.nodes.randomElement(using: &random)!
            if node.isUp, sim.nodes.filter(\.isUp).count > 1 {
                sim.crash(node)
            } else if !node.isUp {
                try sim.restart(node)
            }
        case .wipe:
            if let node = sim.nodes.first(where: { !$0.isUp }) { try sim.restart(node, wipe: true) }
        case .clock:
            let node = sim.nodes.randomElement(using: &random)!
            sim.setClockOffset(node, Millis.random(in: -20_000...20_000, using: &random))
        case .latency:
            let a = sim.nodes.randomElement(using: &random)!
            let b = sim.nodes.randomElement(using: &random)!
            if a !== b {
                sim.setProfile(
                    LinkProfile(
                        latency: Millis.random(in: 1...200, using: &random),
                        jitter: Millis.random(in: 0...50, using: &random),
                        bytesPerSecond: Bool.random(using: &random) ? 50_000 : nil), between: a, and: b)
            }
        case .reset:
            let a = sim.nodes.randomElement(using: &random)!
            let b = sim.nodes.randomElement(using: &random)!
            if a !== b { sim.setProfile(LinkProfile(reset: 0.05), between: a, and: b) }
        case .unreliable:
            let a = sim.nodes.randomElement(using: &random)!
            let b = sim.nodes.randomElement(using: &random)!
            if a !== b { sim.setProfile(LinkProfile(loss: 0.05, duplicate: 0.05, reorder: 0.05), between: a, and: b) }
        case .evict:
            break  // an app operation (see appOperation)
        }
    }
}
