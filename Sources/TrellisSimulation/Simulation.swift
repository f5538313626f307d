public import Foundation
import Synchronization
public import TrellisCore
import TrellisNet
public import TrellisStore
import TrellisSync

/// How one link between two simulated nodes behaves. Durations in milliseconds.
///
/// Trellis runs over TCP, so by default a link is a reliable ordered stream: `latency`,
/// `jitter` and `bytesPerSecond` shape timing, and `reset` tears the connection down (as a lost
/// segment that is never retransmitted does). `loss`, `duplicate` and `reorder` go further and
/// break the stream itself (a message vanishes, arrives twice, or overtakes later ones): the
/// protocol must still never diverge, crash or stall for good.
public struct LinkProfile: Sendable, Equatable {
    /// One-way delay of every message.
    public var latency: Millis = 5
    /// Extra delay drawn uniformly from 0…jitter (messages keep their order on the link).
    public var jitter: Millis = 0
    /// Serialisation rate; `nil` for unlimited.
    public var bytesPerSecond: Int?
    /// Probability that a message silently vanishes.
    public var loss: Double = 0
    /// Probability that a message is delivered twice.
    public var duplicate: Double = 0
    /// Probability that a message is held back up to 10 × latency and overtaken by later ones.
    public var reorder: Double = 0
    /// Probability, per message, that the connection is reset.
    public var reset: Double = 0

    public init(
        latency: Millis = 5, jitter: Millis = 0, bytesPerSecond: Int? = nil, loss: Double = 0, duplicate: Double = 0,
        reorder: Double = 0, reset: Double = 0
    ) {
        self.latency = latency
        self.jitter = jitter
        self.bytesPerSecond = bytesPerSecond
        self.loss = loss
        self.duplicate = duplicate
        self.reorder = reorder
        self.reset = reset
    }
}

/// A deterministic simulated mesh of Trellis nodes in one process.
///
/// Each node is the production code — the real SQLite store, the real ``Replicator`` and
/// ``SyncHost``, live queries — connected by a simulated network (latency, bandwidth, loss,
/// duplication, reordering, resets, partitions, links going down) under a virtual clock (per-node
/// skew and jumps), with crashes and restarts that keep or wipe a node's store. One seed drives
/// every random choice, so a seed replays the same run, byte for byte: ``trace`` is the proof.
/// Time is virtual: a simulated minute takes milliseconds.
///
/// ```swift
/// let sim = try Simulation(seed: 42)
/// let (a, b, c) = (try sim.addNode(), try sim.addNode(), try sim.addNode())
/// sim.connectAll()
/// for node in sim.nodes { _ = try node.store.collection("items").findAll().subscribe() }
/// try a.store.collection("items").upsert(["_id": "d1", "v": 1])
/// sim.partition([[a], [b, c]])
/// try b.store.collection("items").upsert(["_id": "d1", "v": 2])
/// sim.heal()
/// try sim.runUntilQuiet()
/// try sim.check()          // every invariant, or a SimulationFailure naming what broke
/// ```
///
/// A simulation is not thread-safe: drive it from one thread (a test), between its `run` calls
/// use the nodes' stores as an app would.
public final class Simulation: @unchecked Sendable {
    // Invariant: every property is used only from the thread driving the simulation.
    /// The seed every random choice derives from.
    public let seed: UInt64
    /// Virtual time since the start, milliseconds.
    public private(set) var now: Millis = 0
    /// The wall-clock time (Unix milliseconds) at virtual time 0: 2026-01-01T00:00:00Z.
    public static let startWallClock: Millis = 1_767_225_600_000
    /// The nodes, in the order they were added.
    public private(set) var nodes: [SimulatedNode] = []
    /// Every event of the run, one line each (messages, faults, node logs).
    public private(set) var trace: [String] = []
    /// Whether to keep ``trace`` (a long sweep may turn it off to save memory).
    public var tracing = true
    /// The profile of links without one of their own.
    public var defaultProfile = LinkProfile()
    /// Changes every node's replicator configuration (timings, limits) before it starts.
    public var replicatorConfiguration: (inout ReplicatorConfiguration) -> Void = { _ in }
    /// Store options for nodes added after it is set (the clock is always the simulation's).
    public var storeOptions = StoreOptions()
    /// Whether nodes remember when each document first changed in their store (for propagation
    /// figures: ``arrivalTimes(of:in:)``).
    public var recordsArrivals = false
    /// Invariants checked by ``check()`` besides the built-in ones.
    public var invariants: [Invariant] = []

    var rng: SplitMix64
    private var events = EventQueue<Event>()
    private var connections: [Int: Connection] = [:]
    private var nextConnection = 0
    private var profiles: [Pair: LinkProfile] = [:]
    private var groups: [Int: Int]?
    private var downLinks: Set<Pair> = []
    private let directory: URL
    private let ownsDirectory: Bool
    /// Virtual time of the last message other than a keepalive.
    public private(set) var lastActivity: Millis = 0
    /// Messages sent, by type, over the whole run.
    public private(set) var messageCounts: [String: Int] = [:]
    /// Bytes of the messages sent, by the same kinds as ``messageCounts``: the serialized wire
    /// messages, before the encrypted link's framing.
    public private(set) var messageBytes: [String: Int] = [:]
    /// Documents sent in batches, over the whole run (a document sent twice counts twice).
    public private(set) var documentsSent = 0
    /// Of those, how many went as deltas (``StateDelta``).
    public private(set) var deltasSent = 0
    /// Dial attempts, by "dialer->target".
    public private(set) var dialCounts: [String: Int] = [:]
    /// How many times each distinct batch carrying documents was sent over each link (in one
    /// direction) since ``countRepeatedBatches()``, by sender, receiver and the digest of its
    /// documents.
    public private(set) var batchRepeats: [String: Int] = [:]
    private var countingBatches = false
    var history = History()

    enum Event {
        case tick
        case opened(connection: Int, side: Int)
        case deliver(connection: Int, side: Int, bytes: [UInt8], sequence: UInt64)
        case closed(connection: Int, side: Int, reason: String)
        case drained(connection: Int, side: Int)
        /// Bytes of a message still crossing a slow link reach `side` (``Replicator/linkActive(_:now:)``).
        case partial(connection: Int, side: Int)
        case dialFailed(node: Int, endpoint: String, reason: String)
    }

    struct Pair: Hashable {
        let a: Int
        let b: Int
        init(_ x: Int, _ y: Int) { (a, b) = x < y ? (x, y) : (y, x) }
    }

    final class Connection {
        let id: Int
        /// Node index and link ID of each end: 0 dialed, 1 accepted.
        var ends: [(node: Int, link: LinkID?)]
        var open = true
        /// Per direction (towards side i): when the last message arrives (FIFO), when the
        /// sender's serialisation is busy until, and messages held by a partition.
        var lastArrival: [Millis] = [0, 0]
        var busyUntil: [Millis] = [0, 0]
        var held: [[([UInt8], UInt64)]] = [[], []]
        var congested = [false, false]
        /// Per direction: the next message number sent and expected. Real links number their
        /// Noise frames (the nonce), so a lost, repeated or reordered frame fails to decrypt and
        /// closes the link; simulated links do the same with these.
        var sent: [UInt64] = [0, 0]
        var expected: [UInt64] = [0, 0]
        var knownClosed = [false, false]
        /// Whether a `closed` event is scheduled for each side.
        var closing = [false, false]

        init(id: Int, dialer: Int, listener: Int) {
            self.id = id
            ends = [(dialer, nil), (listener, nil)]
        }
    }

    /// - Parameters:
    ///   - seed: fixes the run.
    ///   - directory: where the nodes' SQLite files go; a new temporary directory (removed when
    ///     the simulation is released) by default.
    /// - Throws: when the directory cannot be created.
    public init(seed: UInt64, directory: URL? = nil) throws {
        self.seed = seed
        rng = SplitMix64(seed: seed)
        if let directory {
            self.directory = directory
            ownsDirectory = false
        } else {
            let base = FileManager.default.fileExists(atPath: "/dev/shm") ? "/dev/shm" : NSTemporaryDirectory()
            self.directory = URL(fileURLWithPath: base).appendingPathComponent("trellis-sim-\(UUID().uuidString)")
            ownsDirectory = true
        }
        try FileManager.default.createDirectory(at: self.directory, withIntermediateDirectories: true)
        events.schedule(.tick, at: Self.tickInterval)
    }

    deinit {
        for node in nodes { node.stop() }
        if ownsDirectory { try? FileManager.default.removeItem(at: directory) }
    }

    /// How often every node's replicator is ticked, virtual milliseconds.
    public static let tickInterval: Millis = 100

    func nextRandom() -> UInt64 { rng.next() }

    func configure(_ configuration: inout ReplicatorConfiguration) { replicatorConfiguration(&configuration) }

    /// A node's wall clock: the simulation's plus its offset.
    func wallClock(of index: Int) -> Millis { Self.startWallClock + now + nodes[index].clockOffset }

    /// Adds a line to the trace (an app's own events, to read a replay by).
    public func note(_ line: String) { record(line) }

    func record(_ line: @autoclosure () -> String) {
        guard tracing else { return }
        let ms = now % 1000
        trace.append("\(now / 1000).\(ms < 10 ? "00" : ms < 100 ? "0" : "")\(ms) \(line())")
    }

    // MARK: Nodes and topology

    /// Adds a running node named `name` (default `n0`, `n1`, …).
    ///
    /// - Throws: the store's errors opening its database.
    @discardableResult
    public func addNode(_ name: String? = nil) throws -> SimulatedNode {
        let index = nodes.count
        let name = name ?? "n\(index)"
        precondition(!nodes.contains { $0.name == name }, "a node named \(name) exists")
        var key = [UInt8](repeating: 0, count: 32)
        for i in stride(from: 0, to: 32, by: 8) {
            withUnsafeBytes(of: rng.next()) { key.replaceSubrange(i..<i + 8, with: $0) }
        }
        let node = SimulatedNode(
            simulation: self, name: name, index: index, peerKey: key,
            path: directory.appendingPathComponent("\(name).sqlite").path, options: storeOptions)
        nodes.append(node)
        try node.start()
        record("\(name) started")
        return node
    }

    /// The node with this name.
    public func node(_ name: String) -> SimulatedNode? { nodes.first { $0.name == name } }

    /// `a` keeps a connection to `b` (a static peer: dialed with backoff whenever down).
    public func connect(_ a: SimulatedNode, _ b: SimulatedNode) {
        guard !a.staticPeers.contains(b.name) else { return }
        a.staticPeers.append(b.name)
        a.host?.addPeer(b.name)
        afterEvent()
    }

    /// Every pair connected (the lower index dials).
    public func connectAll() {
        for (i, a) in nodes.enumerated() { for b in nodes[(i + 1)...] { connect(a, b) } }
    }

    /// A random connected mesh: a random spanning tree plus `extraLinks` more links, drawn from
    /// the seed, then, while two nodes are further apart than subscriptions travel (a node's own
    /// subscription and ``ReplicatorConfiguration/maxHops`` forwardings: 5 links by default), a
    /// link between the first such pair in node order. Data crosses at most that many links
    /// (docs/MESH.md, "Relay"), so a mesh drawn wider would check what Trellis does not promise.
    /// The added links draw nothing from the seed: a mesh within reach is drawn as before.
    public func connectRandomly(extraLinks: Int) {
        guard nodes.count > 1 else { return }
        var order = Array(nodes.indices)
        order.shuffle(using: &rng)
        for i in 1..<order.count {
            let parent = order[Int.random(in: 0..<i, using: &rng)]
            connect(nodes[order[i]], nodes[parent])
        }
        for _ in 0..<extraLinks {
            let a = Int.random(in: 0..<nodes.count, using: &rng)
            let b = Int.random(in: 0..<nodes.count, using: &rng)
            if a != b, !nodes[b].staticPeers.contains(nodes[a].name) { connect(nodes[a], nodes[b]) }
        }
        var configuration = ReplicatorConfiguration(peerKey: [])
        configure(&configuration)
        let reach = configuration.maxHops + 1
        while let (a, b) = firstPair(fartherApartThan: reach) { connect(nodes[a], nodes[b]) }
    }

    /// The first pair of nodes (by index) more than `links` links apart on the static links, if any.
    private func firstPair(fartherApartThan links: Int) -> (Int, Int)? {
        let byName = Dictionary(uniqueKeysWithValues: nodes.enumerated().map { ($1.name, $0) })
        var neighbours = Array(repeating: [Int](), count: nodes.count)
        for (i, node) in nodes.enumerated() {
            for peer in node.staticPeers {
                guard let j = byName[peer] else { continue }
                neighbours[i].append(j)
                neighbours[j].append(i)
            }
        }
        for a in nodes.indices {
            var distance = Array(repeating: Int.max, count: nodes.count)
            distance[a] = 0
            var queue = [a]
            var next = 0
            while next < queue.count {
                let i = queue[next]
                next += 1
                for j in neighbours[i] where distance[j] == .max {
                    distance[j] = distance[i] + 1
                    queue.append(j)
                }
            }
            if let b = distance.indices.first(where: { $0 > a && distance[$0] > links }) { return (a, b) }
        }
        return nil
    }

    /// Sets the profile of the link between `a` and `b` (both directions).
    public func setProfile(_ profile: LinkProfile, between a: SimulatedNode, and b: SimulatedNode) {
        profiles[Pair(a.index, b.index)] = profile
        record("link \(a.name)-\(b.name) profile \(profile)")
    }

    func profile(_ a: Int, _ b: Int) -> LinkProfile { profiles[Pair(a, b)] ?? defaultProfile }

    /// When the document with this `_id` first changed on each node (with ``recordsArrivals``),
    /// virtual milliseconds, by node name.
    public func arrivalTimes(of id: Value, in collection: String) -> [String: Millis] {
        let key = History.id(collection, JSON.string(id))
        var out: [String: Millis] = [:]
        for node in nodes { if let time = node.arrivals[key] { out[node.name] = time } }
        return out
    }

    /// The number of distinct node pairs with a static-peer link.
    public var linkCount: Int {
        var pairs: Set<Pair> = []
        for node in nodes {
            for name in node.staticPeers {
                if let peer = self.node(name) { pairs.insert(Pair(node.index, peer.index)) }
            }
        }
        return pairs.count
    }

    /// Gives every link the default profile again.
    public func resetProfiles() {
        profiles.removeAll()
        record("every link back to the default profile")
    }

    // MARK: Faults

    /// Splits the mesh: nodes in different groups cannot reach each other (messages wait, as TCP
    /// retransmits, until ``heal()`` or until a side gives the link up). Nodes in no group form
    /// one more group.
    public func partition(_ parts: [[SimulatedNode]]) {
        var map: [Int: Int] = [:]
        for (g, part) in parts.enumerated() { for node in part { map[node.index] = g } }
        for node in nodes where map[node.index] == nil { map[node.index] = parts.count }
        groups = map
        record("partition \(parts.map { $0.map(\.name).joined(separator: ",") }.joined(separator: " | "))")
    }

    /// Ends every partition and brings every link up; held messages flow again.
    public func heal() {
        groups = nil
        downLinks.removeAll()
        record("heal")
        releaseHeld()
    }

    /// Takes the link between two nodes down (as a partition of that pair) or up again.
    public func setLink(_ a: SimulatedNode, _ b: SimulatedNode, up: Bool) {
        if up { downLinks.remove(Pair(a.index, b.index)) } else { downLinks.insert(Pair(a.index, b.index)) }
        record("link \(a.name)-\(b.name) \(up ? "up" : "down")")
        if up { releaseHeld() }
    }

    /// Whether a partition (``partition(_:)``) or a link taken down (``setLink(_:_:up:)``) keeps
    /// some nodes apart now; ``heal()`` ends both. Crashed nodes are not counted here.
    public var isSplit: Bool { groups != nil || !downLinks.isEmpty }

    /// Whether a message can travel between two nodes now (both up, no partition between them).
    func reachable(_ a: Int, _ b: Int) -> Bool {
        pathOpen(a, b) && nodes[a].isUp && nodes[b].isUp
    }

    /// Whether the network between two nodes is open (whether or not they run).
    func pathOpen(_ a: Int, _ b: Int) -> Bool {
        if downLinks.contains(Pair(a, b)) { return false }
        if let groups, groups[a] != groups[b] { return false }
        return true
    }

    /// Kills a node as SIGKILL would: its sessions vanish (peers see resets where they can reach
    /// it), its store keeps what it committed.
    public func crash(_ node: SimulatedNode) {
        guard let documents = node.storeIfUp?.documents else { return }
        node.flushCommits()
        // The process dies without closing its store: its files keep every commit, the `open`
        // marker and the clock's saved ceiling, and nothing that a clean close writes.
        let image = Self.storeFiles(node.path)
        node.stop()
        documents.close()
        do { try Self.putStoreFiles(image, at: node.path) } catch {
            record("\(node.name) could not get its store files back after the crash: \(error)")
        }
        record("\(node.name) crashed")
        // In id order: the resets are scheduled in this order, and a seed must fix the run.
        for connection in connections.values.sorted(by: { $0.id < $1.id }) where connection.open {
            guard let side = connection.ends.firstIndex(where: { $0.node == node.index }) else { continue }
            connection.open = false
            connection.knownClosed[side] = true
            let other = 1 - side
            if pathOpen(node.index, connection.ends[other].node), !connection.closing[other] {
                connection.closing[other] = true
                schedule(
                    .closed(connection: connection.id, side: other, reason: "connection reset by peer"),
                    after: profile(node.index, connection.ends[other].node).latency)
            }
        }
    }

    /// The store's database and WAL files as they are now (what a process that dies leaves).
    static func storeFiles(_ path: String) -> [String: Data] {
        var files: [String: Data] = [:]
        for suffix in ["", "-wal"] {
            if let data = FileManager.default.contents(atPath: path + suffix) { files[suffix] = data }
        }
        return files
    }

    /// Puts store files taken by ``storeFiles(_:)`` in place of the store's (the shared-memory
    /// index is rebuilt from the WAL when the store opens).
    ///
    /// - Throws: `CocoaError(.fileWriteUnknown)` when a file cannot be written.
    static func putStoreFiles(_ files: [String: Data], at path: String) throws {
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
        for (suffix, data) in files {
            guard FileManager.default.createFile(atPath: path + suffix, contents: data) else {
                throw CocoaError(.fileWriteUnknown)
            }
        }
    }

    /// Starts a crashed node again, with its store as it was, or wiped (a new store: new site ID
    /// and epoch, nothing of its old data).
    ///
    /// - Throws: the store's errors reopening the database.
    public func restart(_ node: SimulatedNode, wipe: Bool = false) throws {
        if node.isUp { crash(node) }
        if wipe {
            for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: node.path + suffix) }
            history.lost(node.index, from: 0, to: now)
        }
        try node.start()
        record("\(node.name) restarted\(wipe ? " with a wiped store" : "")")
        afterEvent()
    }

    /// A copy of a node's store files, as a backup would take them (``restore(_:from:)``).
    public struct StoreSnapshot: Sendable {
        let files: [String: Data]
        /// Virtual time when it was taken.
        public let time: Millis
    }

    /// Takes a backup of a running node's store (its committed state).
    ///
    /// - Throws: the store's or file system's errors.
    public func snapshot(_ node: SimulatedNode) throws -> StoreSnapshot {
        try node.documents.checkpointWAL()
        let files = Self.storeFiles(node.path)
        record("\(node.name) backed up")
        return StoreSnapshot(files: files, time: now)
    }

    /// Crashes a node, puts an older backup of its store in place, and starts it again: its log
    /// goes back in time, as after restoring a backup.
    ///
    /// - Throws: the store's or file system's errors.
    public func restore(_ node: SimulatedNode, from snapshot: StoreSnapshot) throws {
        crash(node)
        try Self.putStoreFiles(snapshot.files, at: node.path)
        history.lost(node.index, from: snapshot.time, to: now)
        try node.start()
        record("\(node.name) restored from the backup of \(snapshot.time) ms")
        afterEvent()
    }

    /// Sets a node's clock offset from the simulation's wall clock (skew), milliseconds.
    public func setClockOffset(_ node: SimulatedNode, _ offset: Millis) {
        history.noteClock(wallClock(of: node.index))
        node.clockOffset = offset
        record("\(node.name) clock offset \(offset) ms")
    }

    /// Moves a node's wall clock forward by `duration` milliseconds as time that passed, not as a
    /// clock error: its store's elapsed time (`StoreOptions.elapsed`, which bounds the reaper)
    /// moves as much. For tests that need days to pass (a tombstone TTL) without running them.
    public func passTime(_ node: SimulatedNode, by duration: Millis) {
        history.noteClock(wallClock(of: node.index))
        node.clockOffset += duration
        node.elapsedOffset += duration
        record("\(node.name) \(duration) ms pass")
    }

    // MARK: Running

    /// Runs every event due within the next `duration` milliseconds of virtual time.
    public func run(for duration: Millis) {
        runUntil(now + duration)
    }

    /// Runs events until virtual time `deadline`.
    public func runUntil(_ deadline: Millis) {
        afterEvent()
        while let next = events.nextTime, next <= deadline {
            step()
        }
        now = max(now, deadline)
    }

    /// Runs until no message other than keepalives has been sent for `quietFor` milliseconds.
    ///
    /// - Throws: ``SimulationFailure`` when the mesh is still busy after `timeout` (a sync loop).
    public func runUntilQuiet(quietFor: Millis = 30_000, timeout: Millis = 30 * 60_000) throws {
        let limit = now + timeout
        afterEvent()
        lastActivity = max(lastActivity, now)
        while now - lastActivity < quietFor || hasPendingWork || !isFullyConnected {
            guard now < limit else {
                var reasons: [String] = []
                if now - lastActivity < quietFor {
                    reasons.append("still sending after \(timeout / 1000) s of virtual time: a sync loop?")
                }
                if hasPendingWork { reasons.append("work still pending after \(timeout / 1000) s") }
                reasons += disconnectedPairs.map {
                    "\($0) dials \($1) but has no session with it after \(timeout / 1000) s"
                }
                throw SimulationFailure(seed: seed, violations: reasons, trace: trace)
            }
            guard let next = events.nextTime else { break }
            if next > lastActivity + quietFor, !hasPendingWork, isFullyConnected {
                now = lastActivity + quietFor
                break
            }
            step()
        }
    }

    var hasPendingWork: Bool {
        nodes.contains { $0.host?.hasPendingScans == true || !$0.commits.withLock(\.isEmpty) }
    }

    /// Whether every static peer link between two running nodes that can reach each other has
    /// an established session (so quiet means synced, not waiting for a redial).
    public var isFullyConnected: Bool { disconnectedPairs.isEmpty }

    var disconnectedPairs: [(String, String)] {
        var out: [(String, String)] = []
        for node in nodes where node.isUp {
            guard let status = node.replicator?.status else { continue }
            let established = Set(status.peers.filter { $0.phase == "established" }.map(\.peerKey))
            for name in node.staticPeers {
                guard let peer = self.node(name), peer.isUp, reachable(node.index, peer.index) else { continue }
                if !established.contains(peer.peerKey) { out.append((node.name, name)) }
            }
        }
        return out
    }

    private func step() {
        guard let (time, event) = events.pop() else { return }
        now = max(now, time)
        switch event {
        case .tick:
            for node in nodes where node.isUp { node.host?.tick() }
            events.schedule(.tick, at: now + Self.tickInterval)
        case .opened(let id, let side):
            opened(id, side)
        case .deliver(let id, let side, let bytes, let sequence):
            deliver(id, side, bytes, sequence)
        case .closed(let id, let side, let reason):
            guard let connection = connections[id] else { break }
            let end = connection.ends[side]
            connection.knownClosed[side] = true
            if let link = end.link, nodes[end.node].isUp, nodes[end.node].links.removeValue(forKey: link) != nil {
                nodes[end.node].host?.linkClosed(link, reason: reason)
            }
            if connection.knownClosed == [true, true] { connections.removeValue(forKey: id) }
        case .drained(let id, let side):
            guard let connection = connections[id], connection.open, connection.congested[side] else { break }
            connection.congested[side] = false
            let end = connection.ends[side]
            if let link = end.link { nodes[end.node].host?.linkDrained(link) }
        case .dialFailed(let node, let endpoint, let reason):
            if nodes[node].isUp { nodes[node].host?.dialFailed(endpoint, reason: reason) }
        case .partial(let id, let side):
            guard let connection = connections[id], connection.open else { break }
            let end = connection.ends[side]
            guard let link = end.link, nodes[end.node].isUp, reachable(connection.ends[1 - side].node, end.node)
            else { break }
            nodes[end.node].host?.linkActive(link)
        }
        afterEvent()
    }

    /// Hands every node's commits to its replicator and runs queued scans, until nothing is left.
    private func afterEvent() {
        var rounds = 0
        repeat {
            rounds += 1
            for node in nodes where node.isUp {
                node.flushCommits()
                node.host?.runScans()
            }
        } while hasPendingWork && rounds < 1000
    }

    private func schedule(_ event: Event, after delay: Millis) {
        events.schedule(event, at: now + max(0, delay))
    }

    // MARK: Network

    func dial(from node: SimulatedNode, to endpoint: String) {
        guard let target = self.node(endpoint) else {
            schedule(.dialFailed(node: node.index, endpoint: endpoint, reason: "no node named \(endpoint)"), after: 1)
            return
        }
        let latency = profile(node.index, target.index).latency
        guard target.isUp else {
            schedule(
                .dialFailed(node: node.index, endpoint: endpoint, reason: "connection refused"), after: 2 * latency)
            return
        }
        guard reachable(node.index, target.index) else {
            dialCounts["\(node.name)->\(target.name)", default: 0] += 1
            schedule(.dialFailed(node: node.index, endpoint: endpoint, reason: "timed out"), after: 3_000)
            return
        }
        dialCounts["\(node.name)->\(target.name)", default: 0] += 1
        nextConnection += 1
        let connection = Connection(id: nextConnection, dialer: node.index, listener: target.index)
        connections[connection.id] = connection
        record("\(node.name) dials \(target.name) (connection \(connection.id))")
        // Noise XX: the initiator is done after message 2 (one round trip), the responder after
        // message 3 (one and a half).
        schedule(.opened(connection: connection.id, side: 1), after: 3 * latency / 2)
        schedule(.opened(connection: connection.id, side: 0), after: latency)
    }

    private func opened(_ id: Int, _ side: Int) {
        guard let connection = connections[id] else { return }
        let index = connection.ends[side].node
        let node = nodes[index]
        guard node.isUp, let host = node.host else { return }
        guard connection.open else {
            // Torn down before the handshake finished: the dialer sees a failed dial.
            if side == 0 {
                host.dialFailed(nodes[connection.ends[1].node].name, reason: "connection reset during the handshake")
            }
            return
        }
        node.nextLink += 1
        let link = LinkID(node.nextLink)
        connection.ends[side].link = link
        node.links[link] = id
        let other = nodes[connection.ends[1 - side].node]
        // Both ends hold the same number, as a secure channel's handshake hash; drawn from the
        // seed and the connection alone, so that no other random choice of a run moves.
        var channel = SplitMix64(seed: seed ^ (UInt64(id) &* 0x9E37_79B9_7F4A_7C15))
        host.linkOpened(
            link, peerKey: other.peerKey, initiator: side == 0, address: other.name,
            endpoint: side == 0 ? other.name : nil, channelNonce: channel.next())
    }

    /// Queues a message; returns whether the sender's side is now above its high-water mark.
    func transmit(_ bytes: [UInt8], from node: SimulatedNode, on link: LinkID) -> Bool {
        guard let id = node.links[link], let connection = connections[id], connection.open else { return false }
        let side = connection.ends[0].node == node.index && connection.ends[0].link == link ? 1 : 0
        let sender = connection.ends[1 - side].node
        let receiver = connection.ends[side].node
        let kind = Self.describe(bytes)
        messageCounts[kind.type, default: 0] += 1
        messageBytes[kind.type, default: 0] += bytes.count
        documentsSent += kind.documents.count
        deltasSent += kind.documents.count { StateDelta.isEncoded($0.state) }
        if countingBatches, !kind.documents.isEmpty {
            let digest = StateDigest(kind.documents.flatMap { $0.state })
            batchRepeats["\(nodes[sender].name)->\(nodes[receiver].name) \(digest.high)", default: 0] += 1
        }
        if kind.type != "ping" && kind.type != "pong" { lastActivity = now }
        record("\(nodes[sender].name) -> \(nodes[receiver].name) \(kind.summary)")
        let p = profile(sender, receiver)
        var congested = false
        var ready = now
        var transferStart = now
        if let rate = p.bytesPerSecond, rate > 0 {
            let start = max(now, connection.busyUntil[side])
            transferStart = start
            connection.busyUntil[side] = start + Millis(bytes.count) * 1000 / Millis(rate)
            ready = connection.busyUntil[side]
            let queued = Int((connection.busyUntil[side] - now) * Millis(rate) / 1000)
            if queued > LinkLimits.highWater, !connection.congested[1 - side] {
                connection.congested[1 - side] = true
                congested = true
                let drainAt = connection.busyUntil[side] - Millis(LinkLimits.lowWater) * 1000 / Millis(rate)
                events.schedule(.drained(connection: id, side: 1 - side), at: max(now, drainAt))
            }
        }
        let sequence = connection.sent[side]
        connection.sent[side] += 1
        guard reachable(sender, receiver) else {
            connection.held[side].append((bytes, sequence))
            return congested
        }
        enqueue(bytes, sequence, on: connection, towards: side, ready: ready, profile: p)
        // A message that takes seconds to cross: its first bytes reach the receiver each second
        // before it is whole, as a secure link's frames do.
        for time in stride(from: transferStart + p.latency + 1_000, to: ready + p.latency, by: 1_000) {
            events.schedule(.partial(connection: id, side: side), at: time)
        }
        return congested
    }

    private func enqueue(
        _ bytes: [UInt8], _ sequence: UInt64, on connection: Connection, towards side: Int, ready: Millis,
        profile p: LinkProfile
    ) {
        if p.reset > 0, Double.random(in: 0..<1, using: &rng) < p.reset {
            record("connection \(connection.id) reset")
            reset(connection, reason: "connection reset (simulated)")
            return
        }
        if p.loss > 0, Double.random(in: 0..<1, using: &rng) < p.loss {
            record("connection \(connection.id) lost a message")
            return
        }
        let jitter = p.jitter > 0 ? Millis.random(in: 0...p.jitter, using: &rng) : 0
        var arrival = max(ready + p.latency + jitter, connection.lastArrival[side])
        if p.reorder > 0, Double.random(in: 0..<1, using: &rng) < p.reorder {
            arrival = ready + p.latency + Millis.random(in: 1...max(1, 10 * p.latency), using: &rng)
            record("connection \(connection.id) delays a message")
        } else {
            connection.lastArrival[side] = arrival
        }
        events.schedule(.deliver(connection: connection.id, side: side, bytes: bytes, sequence: sequence), at: arrival)
        if p.duplicate > 0, Double.random(in: 0..<1, using: &rng) < p.duplicate {
            record("connection \(connection.id) duplicates a message")
            events.schedule(
                .deliver(connection: connection.id, side: side, bytes: bytes, sequence: sequence), at: arrival + 1)
        }
    }

    private func deliver(_ id: Int, _ side: Int, _ bytes: [UInt8], _ sequence: UInt64) {
        guard let connection = connections[id], connection.open else { return }
        let end = connection.ends[side]
        guard let link = end.link, nodes[end.node].isUp, let host = nodes[end.node].host else { return }
        guard reachable(connection.ends[1 - side].node, end.node) else {
            connection.held[side].append((bytes, sequence))  // in flight when the partition began
            return
        }
        guard sequence == connection.expected[side] else {
            // What the secure channel does with a missing, repeated or reordered frame.
            record(
                "\(nodes[end.node].name) connection \(id): frame \(sequence) where \(connection.expected[side]) was due"
            )
            closeConnection(
                from: nodes[end.node], link: link, reason: "decryption failed: a frame was lost, repeated or reordered")
            return
        }
        connection.expected[side] += 1
        host.received(bytes, on: link)
    }

    private func releaseHeld() {
        for id in connections.keys.sorted() {
            guard let connection = connections[id], connection.open else { continue }
            for side in 0..<2 where !connection.held[side].isEmpty {
                let sender = connection.ends[1 - side].node
                let receiver = connection.ends[side].node
                guard reachable(sender, receiver) else { continue }
                let held = connection.held[side]
                connection.held[side] = []
                for (bytes, sequence) in held {
                    enqueue(
                        bytes, sequence, on: connection, towards: side, ready: now, profile: profile(sender, receiver))
                }
            }
        }
    }

    func closeConnection(from node: SimulatedNode, link: LinkID, reason: String) {
        guard let id = node.links[link], let connection = connections[id],
            let side = connection.ends.firstIndex(where: { $0.node == node.index && $0.link == link })
        else { return }
        // The closing side learns at once (even if the other side closed first).
        if !connection.closing[side] {
            connection.closing[side] = true
            schedule(.closed(connection: id, side: side, reason: reason), after: 0)
        }
        guard connection.open else { return }
        connection.open = false
        record("\(node.name) closes connection \(id): \(reason)")
        let other = connection.ends[1 - side].node
        if reachable(node.index, other), !connection.closing[1 - side] {
            connection.closing[1 - side] = true
            schedule(
                .closed(connection: id, side: 1 - side, reason: "peer closed the connection"),
                after: profile(node.index, other).latency)
        }
    }

    /// Resets every open connection between two nodes, as a lost TCP connection would: both see
    /// it close after one latency, and the dialing side dials again after its backoff.
    public func resetConnections(between a: SimulatedNode, and b: SimulatedNode) {
        for connection in connections.values.sorted(by: { $0.id < $1.id }) where connection.open {
            let ends = Set(connection.ends.map(\.node))
            guard ends == [a.index, b.index] else { continue }
            record("connection \(connection.id) reset")
            reset(connection, reason: "connection reset (simulated)")
        }
    }

    private func reset(_ connection: Connection, reason: String) {
        connection.open = false
        for side in 0..<2 where !connection.closing[side] {
            connection.closing[side] = true
            schedule(
                .closed(connection: connection.id, side: side, reason: reason),
                after: profile(connection.ends[0].node, connection.ends[1].node).latency)
        }
    }

    /// Starts counting repeated batches (``batchRepeats``), e.g. after a heal, to find sync loops.
    public func countRepeatedBatches() {
        countingBatches = true
        batchRepeats.removeAll()
    }

    /// A short description of a message for the trace, and the documents of a batch (decoded once
    /// for the counters and the trace).
    static func describe(_ bytes: [UInt8]) -> (type: String, summary: String, documents: [WireDocument]) {
        guard let message = try? WireMessage(serialized: bytes) else {
            return ("?", "undecodable \(bytes.count) bytes", [])
        }
        let (type, summary) = summarise(message, bytes.count)
        var documents: [WireDocument] = []
        if case .batch(_, let docs, _, _, _) = message { documents = docs }
        return (type, summary, documents)
    }

    /// A subscription as the trace names it: a key by its collection; a number (a peer that reads
    /// compact names) by itself.
    private static func traceName(_ sub: SubscriptionName) -> String {
        switch sub {
        case .key(let key): SubscriptionSpec.collection(ofKey: key)
        case .number: sub.description
        }
    }

    private static func summarise(_ message: WireMessage, _ size: Int) -> (type: String, summary: String) {
        switch message {
        case .hello(let h): return ("hello", "hello v\(h.version)")
        case .subscriptions(let subs, let version):
            // `h` shows as a trailing " h" (docs/PROTOCOL.md §2 step 5).
            let list = subs.map { "\($0.spec) since \($0.since) hops \($0.hops)\($0.holds ? " h" : "")" }
            return ("subs", "subs v\(version) [\(list.joined(separator: "; "))]")
        case .batch(let sub, let docs, let upTo, let generation, let left):
            let name = traceName(sub)
            let ids = docs.prefix(8).map { $0.id.description }.joined(separator: ",")
            return (
                "batch",
                "batch \(name) \(docs.count) docs [\(ids)\(docs.count > 8 ? ",…" : "")] upTo \(upTo) gen \(generation)\(left.map { " left \($0)" } ?? "") \(size) B"
            )
        case .subscriptionsDigest(_, let version): return ("subs", "subs v\(version) by digest")
        case .subscriptionsRequest(let version): return ("subsreq", "subsreq v\(version)")
        case .resume: return ("r", "resume (hello and subs v1 by digest)")
        case .helloRequest: return ("helloreq", "helloreq")
        case .caughtUp(let sub, let generation):
            return ("batch", "batch \(traceName(sub)) caught up gen \(generation) \(size) B")
        case .ack(_, let upTo, let deferred): return ("ack", "ack upTo \(upTo)\(deferred ? " deferred" : "")")
        case .subscriptionError(_, let code, let text): return ("suberr", "suberr \(code): \(text)")
        case .ping: return ("ping", "ping")
        case .pong: return ("pong", "pong")
        case .error(let code, let text): return ("error", "error \(code): \(text)")
        case .presence(let records):
            let nodes = records.map { r in
                "\(r.peerKey.prefix(4).map { String(format: "%02x", $0) }.joined()) seq \(r.seq) peers \(r.neighbors.count)"
            }
            return ("presence", "presence [\(nodes.joined(separator: "; "))]")
        }
    }
}

/// A run that broke an invariant (or never went quiet): the seed replays it.
public struct SimulationFailure: Error, CustomStringConvertible, Sendable {
    public var seed: UInt64
    public var violations: [String]
    /// The run's trace up to the failure (empty when tracing was off).
    public var trace: [String] = []

    public init(seed: UInt64, violations: [String], trace: [String] = []) {
        self.seed = seed
        self.violations = violations
        self.trace = trace
    }

    public var description: String {
        "simulation seed \(seed) failed:\n" + violations.map { "  - \($0)" }.joined(separator: "\n")
    }
}
