import Foundation
import Synchronization
public import Trellis
public import TrellisCore
import TrellisStore

/// A property every quiet, healed simulation must have. ``Simulation/check()`` runs the
/// built-in ones and those in ``Simulation/invariants``.
public struct Invariant: Sendable {
    /// A short name, printed with each violation.
    public var name: String
    /// Returns one line per violation (empty when it holds).
    public var check: @Sendable (Simulation) throws -> [String]

    public init(_ name: String, check: @escaping @Sendable (Simulation) throws -> [String]) {
        self.name = name
        self.check = check
    }
}

/// What the simulation remembers between checks: local writes, wipes, removals seen
/// everywhere, clocks and checkpoints.
struct History {
    struct Write {
        var node: Int
        var collection: String
        var key: String
        var site: SiteID
        var stamp: HLCTimestamp
        var time: Millis
    }

    var writes: [Write] = []
    var lastWrite: [UTF8Key: Millis] = [:]
    /// Per node, spans of virtual time whose local writes may be lost by design (a wiped store,
    /// a restored backup) if they had not travelled yet.
    var lossWindows: [Int: [ClosedRange<Millis>]] = [:]
    var evictions: [Int: [UTF8Key: Millis]] = [:]
    /// Per document, each eviction of it: which node, when.
    var evictedDocuments: [UTF8Key: [(node: Int, time: Millis)]] = [:]
    /// Documents removed on every node at a check, and when.
    var removedEverywhere: [UTF8Key: Millis] = [:]
    var clocks: [Int: HLCTimestamp] = [:]
    /// By node, the checkpoints it held at the last check, by peer name and subscription key
    /// (byte-wise, as the store keeps them).
    var checkpoints: [Int: [UTF8Key: Checkpoint]] = [:]
    var lastCheck: Millis = -1
    /// The latest wall-clock time a node's clock showed before its offset last changed (a clock
    /// set back, ``Simulation/setClockOffset(_:_:)``, does not undo what was reaped by it).
    var latestClock: Millis = 0

    mutating func noteClock(_ wall: Millis) { latestClock = max(latestClock, wall) }

    static func id(_ collection: String, _ key: String) -> UTF8Key { UTF8Key(collection + "\u{0}" + key) }

    /// Whether a write may be lost by design: its node lost its store (a wipe, a restored backup)
    /// after making it, or every node that held it dropped it (``droppedEverywhere(_:)``). Its
    /// value may then be gone, and a withheld entry of it shows nothing (docs/DATA-MODEL.md rule
    /// 8: a node that evicts counts on the writer, or a peer, to hold it).
    func mayBeLost(_ write: Write) -> Bool {
        lossWindows[write.node]?.contains(where: { $0.contains(write.time) }) == true || droppedEverywhere(write)
    }

    /// Whether a write may be lost by design because every node that held it dropped it: its
    /// own node evicted the document after it (an eviction drops the values of writes a peer
    /// acknowledged; docs/DATA-MODEL.md rule 8), and another node evicted the document too, or
    /// lost its store (a wipe or a restored backup), after the write. The simulation does not
    /// know which peer acknowledged it, so any other node's loss counts.
    func droppedEverywhere(_ write: Write) -> Bool {
        let evictions = evictedDocuments[Self.id(write.collection, write.key)] ?? []
        guard evictions.contains(where: { $0.node == write.node && $0.time >= write.time }) else { return false }
        return evictions.contains { $0.node != write.node && $0.time >= write.time }
            || lossWindows.contains { node, windows in
                node != write.node && windows.contains { $0.upperBound >= write.time }
            }
    }

    /// The node's store lost what it wrote between `from` and `to` (a wipe: from 0; a restored
    /// backup: from the backup's time).
    mutating func lost(_ node: Int, from: Millis, to: Millis) {
        lossWindows[node, default: []].append(from...max(from, to))
        clocks.removeValue(forKey: node)
        checkpoints.removeValue(forKey: node)
    }
}

extension SimulatedNode {
    /// Mirrors `collection` as contacts (one vCard per document), through the real
    /// ``ContactsEnumerator`` driven as a contacts host drives it (content, then changes from
    /// its anchor; a full enumeration again when the anchor expires). ``Simulation/check()``
    /// brings every mirror up to date and checks that it equals its store; call
    /// ``syncContactMirrors()`` between steps to keep anchors across faults, as a host would.
    public func mirrorContacts(_ collection: String) {
        contactMirrors.append(SimulatedContactsMirror(collection: collection))
    }

    /// Brings this node's contacts mirrors up to date (nothing while the node is crashed).
    ///
    /// - Throws: an enumeration error other than an expired page or anchor.
    public func syncContactMirrors() throws {
        guard let documents = storeIfUp?.documents else { return }
        for mirror in contactMirrors { try mirror.sync(documents) }
    }

    /// Keeps the result of a live query on this node, for the "live queries equal fresh
    /// queries" invariant (and for apps' own checks via ``lastLiveResults``).
    ///
    /// - Throws: when the query does not parse.
    public func watch(_ collection: String, query: String = "true") throws {
        let box = LiveResults(collection: collection, query: query)
        box.liveQuery = try store.collection(collection).find(query).observeLocal { documents, _ in
            box.documents.withLock { $0 = documents }
        }
        watches.append(box)
        watchSpecs.append((collection, query))
    }

    /// The last results every ``watch(_:query:)`` delivered, by "collection: query".
    public var lastLiveResults: [String: [Document]] {
        Dictionary(
            watches.map { ("\($0.collection): \($0.query)", $0.documents.withLock { $0 }) },
            uniquingKeysWith: { a, _ in a })
    }
}

final class LiveResults: @unchecked Sendable {
    let collection: String
    let query: String
    let documents = Mutex<[Document]>([])
    var liveQuery: LiveQuery?

    init(collection: String, query: String) {
        self.collection = collection
        self.query = query
    }
}

extension Simulation {
    /// Checks every invariant; call it once the mesh is healed and quiet (``runUntilQuiet(quietFor:timeout:)``).
    ///
    /// Built in: replicas with overlapping subscriptions hold the same documents and tombstones (a
    /// query subscriber: what its query matches, and every document it holds, matching or not);
    /// every write acknowledged to an app is present on every replica of its collection (unless
    /// its node was wiped before it could travel, or every node holding it dropped it); no live
    /// document holds a withheld value (an evicted write no node holds the value of,
    /// docs/DATA-MODEL.md rule 8); nothing removed everywhere comes back without a new write;
    /// clocks and checkpoints never go backwards; every watched live query's last result equals
    /// a fresh query; every contacts mirror (``SimulatedNode/mirrorContacts(_:)``),
    /// brought up to date, holds exactly its store's live documents as vCards.
    ///
    /// - Throws: ``SimulationFailure`` listing every violation, with the seed.
    public func check() throws {
        for node in nodes where node.isUp { node.store.flushLiveQueries() }
        var violations: [String] = []
        violations += convergence()
        violations += writesPresent()
        violations += noResurrection()
        violations += valuesHeld()
        violations += monotonic()
        violations += liveQueries()
        violations += contactMirrors()
        for invariant in invariants {
            violations += try invariant.check(self).map { "\(invariant.name): \($0)" }
        }
        history.lastCheck = now
        guard violations.isEmpty else { throw SimulationFailure(seed: seed, violations: violations, trace: trace) }
    }

    /// Every document of a collection on a node, tombstones included: key → state bytes.
    public func log(of node: SimulatedNode, collection: String) throws -> [UTF8Key: [UInt8]] {
        var out: [UTF8Key: [UInt8]] = [:]
        var after: Int64 = 0
        while true {
            let page = try node.documents.changes(in: collection, after: after, limit: 10_000, maxBytes: .max)
            for record in page.records { out[UTF8Key(JSON.string(record.id))] = record.state }
            if page.exhausted { break }
            after = page.scannedUpTo
        }
        return out
    }

    /// Collections some up node subscribes to as a whole, with those nodes.
    private func wholeSubscribers() -> [String: [SimulatedNode]] {
        var out: [String: [SimulatedNode]] = [:]
        for node in nodes where node.isUp {
            for spec in node.replicator?.subscriptions ?? [] where spec.isWholeCollection {
                out[spec.collection, default: []].append(node)
            }
        }
        return out
    }

    private func convergence() -> [String] {
        var violations: [String] = []
        let whole = wholeSubscribers()
        for collection in whole.keys.sorted() {
            let holders = whole[collection]!
            guard let reference = holders.first, let expected = try? log(of: reference, collection: collection) else {
                continue
            }
            let shown = try? reference.documents.documents(in: collection).map { JSON.string($0) }
            for other in holders.dropFirst() {
                guard let actual = try? log(of: other, collection: collection) else {
                    violations.append("\(other.name): cannot read \(collection)")
                    continue
                }
                let found = differences(collection, reference, expected, other, actual)
                violations += found
                // Equal states must also show equal values, byte for byte.
                if found.isEmpty, let shown,
                    let otherShown = try? other.documents.documents(in: collection).map({ JSON.string($0) }),
                    shown != otherShown
                {
                    let first = zip(shown, otherShown).first { $0 != $1 }
                    violations.append(
                        "\(collection): \(reference.name) and \(other.name) hold equal states but show different values"
                            + (first.map { ": \($0.0) vs \($0.1)" } ?? ""))
                }
            }
            // Query subscribers hold what their query matches, as the whole-collection replicas do.
            for node in nodes where node.isUp {
                for spec in node.replicator?.subscriptions ?? []
                where spec.collection == collection && !spec.isWholeCollection {
                    guard let query = try? Query(spec.query).bind(args: spec.args),
                        let actual = try? log(of: node, collection: collection)
                    else { continue }
                    for (key, state) in expected.sorted(by: { $0.key < $1.key }) {
                        guard let decoded = try? DocumentState(bytes: state) else { continue }
                        let id = (try? JSON.parse(key.string)) ?? .null
                        let matches = decoded.materialize(id: id).map { (try? query.matches($0)) ?? false } ?? false
                        let holds = actual[key] != nil
                        // What it holds outside its query stays up to date too (docs/MESH.md).
                        guard matches || holds else { continue }
                        // Except a tombstone due for reaping there (a peer's reaped tombstone sent
                        // to a subscriber from 0 that holds rows): its reaper takes it at its next
                        // run, and a document outside the query shows nowhere on it either way.
                        if !matches, dueForReaping(actual[key]) { continue }
                        // Removed fields' contexts one of the two has reaped and the other not
                        // yet do not count, as between whole-collection replicas.
                        if !Self.sameState(actual[key], state), !(actual[key].map { reapedAlike($0, state) } ?? false) {
                            violations.append(
                                "\(node.name) (\(spec)) \(holds ? "holds another state of" : "lacks") \(collection)/\(key) that \(reference.name) has"
                                    + (matches ? "" : " (it holds it outside its query)"))
                        }
                    }
                }
            }
        }
        return violations
    }

    private func differences(
        _ collection: String, _ a: SimulatedNode, _ left: [UTF8Key: [UInt8]], _ b: SimulatedNode,
        _ right: [UTF8Key: [UInt8]]
    ) -> [String] {
        var out: [String] = []
        for key in Set(left.keys).union(right.keys).sorted() where !Self.sameState(left[key], right[key]) {
            if let l = left[key], let r = right[key], reapedAlike(l, r) { continue }
            // A node that reaped the document's tombstone has no row of it, but holds the state
            // its reaped key kept (``reapedState(of:_:_:)``): that state, not nothing, is what it
            // must agree on with a node that still holds the tombstone as a row.
            let leftReaped = left[key] == nil ? reapedState(of: a, collection, key) : nil
            let rightReaped = right[key] == nil ? reapedState(of: b, collection, key) : nil
            if leftReaped != nil || rightReaped != nil,
                let l = leftReaped ?? left[key].flatMap({ try? DocumentState(bytes: $0) }),
                let r = rightReaped ?? right[key].flatMap({ try? DocumentState(bytes: $0) }),
                l == r || reapedAlike(l, r)
            {
                continue
            }
            // A tombstone due for reaping of a document the other node never held (no row, no
            // reaped key): received already expired, a peer's reaped tombstone sent to a
            // subscriber from 0 that holds rows (docs/DATA-MODEL.md, "A subscriber from 0 that
            // holds rows"), it is taken by the node's reaper at its next run.
            if leftReaped == nil, rightReaped == nil, dueForReaping(left[key]) || dueForReaping(right[key]),
                left[key] == nil || right[key] == nil
            {
                continue
            }
            let describe: ([UInt8]?, DocumentState?) -> String = { bytes, reaped in
                if reaped != nil { return "only a reaped key (its kept tombstone differs)" }
                guard let bytes else { return "nothing" }
                guard let state = try? DocumentState(bytes: bytes) else { return "\(bytes.count) bytes" }
                return state.isDeleted ? "a tombstone" : (state.materialize(id: .null).map { "\($0)" } ?? "?")
            }
            out.append(
                "\(collection)/\(key): \(a.name) has \(describe(left[key], leftReaped)), \(b.name) has "
                    + describe(right[key], rightReaped))
            if out.count >= 10 {
                out.append("(more differences in \(collection) left out)")
                break
            }
        }
        return out
    }

    /// Whether two encoded states (or their absence) are the same state: equal bytes, or two
    /// encodings of one state (a row stored in the single-write form and an eviction stub that
    /// keeps the same write in the whole form, say).
    static func sameState(_ left: [UInt8]?, _ right: [UInt8]?) -> Bool {
        if left == right { return true }
        guard let left, let right, let l = try? DocumentState(bytes: left), let r = try? DocumentState(bytes: right)
        else { return false }
        return l == r
    }

    /// Whether two states differ only by removed fields' remove contexts that one node has reaped
    /// and the other, whose clock is behind, not yet: reaped at the latest horizon any node may
    /// have reaped them at (the latest time any node's clock has shown, now or before its offset
    /// last changed, minus the tombstone TTL) they are equal (docs/DATA-MODEL.md, "Tombstones and
    /// reaping"). Not only the two nodes' own clocks: a third node whose clock ran ahead reaps a
    /// context first and sends the state without it to a node that had not held it, while a node
    /// that held it keeps it until its own clock passes the horizon.
    private func reapedAlike(_ left: [UInt8], _ right: [UInt8]) -> Bool {
        guard let l = try? DocumentState(bytes: left), let r = try? DocumentState(bytes: right) else { return false }
        return reapedAlike(l, r)
    }

    /// The latest horizon any node may have reaped at: the latest time any node's clock has
    /// shown, now or before its offset last changed, minus the tombstone TTL.
    private func latestReapHorizon() -> HLCTimestamp? {
        let ttl = Millis(clamping: storeOptions.tombstoneTTL)
        let latest = nodes.indices.reduce(history.latestClock) { max($0, wallClock(of: $1)) }
        guard latest > ttl else { return nil }
        return HLCTimestamp(millis: UInt64(latest - ttl), logical: 0)
    }

    /// Whether `bytes` are a tombstone whose every stamp is before ``latestReapHorizon()``.
    private func dueForReaping(_ bytes: [UInt8]?) -> Bool {
        guard let bytes, let state = try? DocumentState(bytes: bytes), state.isDeleted,
            let horizon = latestReapHorizon()
        else { return false }
        return state.maxTime < horizon
    }

    private func reapedAlike(_ left: DocumentState, _ right: DocumentState) -> Bool {
        var (l, r) = (left, right)
        guard let horizon = latestReapHorizon() else { return false }
        l.reapRemovedFields(before: horizon)
        r.reapRemovedFields(before: horizon)
        return l == r
    }

    /// The state `node` holds of a document it has no row of, when it reaped the document's
    /// tombstone: the state kept with the reaped key, which the store stands in for the missing
    /// row (docs/DATA-MODEL.md, "Tombstones and reaping"). `nil` when the key is not reaped there.
    func reapedState(of node: SimulatedNode, _ collection: String, _ key: UTF8Key) -> DocumentState? {
        guard let id = try? JSON.parse(key.string) else { return nil }
        return (try? node.documents.reapedState(id: id, in: collection)) ?? nil
    }

    /// Every write is held by every whole-collection subscriber: its node's stamp is within the
    /// subscriber's state of the document, the writes or the remove context.
    ///
    /// A subscriber that reaped the document's tombstone has no row of it; its state is the one
    /// its reaped key kept (``reapedState(of:_:_:)``). That kept state is the tombstone as it was
    /// reaped, whose remove context covers every write the remove saw, so a correctly reaped
    /// document holds its writes here and is not reported lost; a write the remove had not seen
    /// (or a key reaped with no state) is still reported. Before the invariant read the kept
    /// state, a document reaped on a subscriber counted as held by no state at all, and tests
    /// that let tombstones expire left those violations out by hand.
    private func writesPresent() -> [String] {
        var violations: [String] = []
        let whole = wholeSubscribers()
        var logs: [String: [Int: [UTF8Key: [UInt8]]]] = [:]
        for write in history.writes {
            if history.mayBeLost(write) { continue }
            guard let holders = whole[write.collection] else { continue }
            for holder in holders {
                if logs[write.collection]?[holder.index] == nil {
                    logs[write.collection, default: [:]][holder.index] =
                        (try? log(of: holder, collection: write.collection)) ?? [:]
                }
                let key = UTF8Key(write.key)
                let row = logs[write.collection]![holder.index]![key]
                let state =
                    row.flatMap { try? DocumentState(bytes: $0) }
                    ?? (row == nil ? reapedState(of: holder, write.collection, key) : nil)
                let seen = max(state?.writes[write.site] ?? .zero, state?.removed[write.site] ?? .zero)
                // A node with no state of the document at all (it never held it, or lost its
                // store) is not sent a tombstone reaped before it asked (a peer's first sync
                // follows the live documents: docs/DATA-MODEL.md): when another node (a
                // subscriber, or the writer, which may subscribe to a query or to nothing) reaped
                // a remove that covers the write, the write is where it belongs. A live copy
                // anywhere is the convergence check's to report.
                if seen < write.stamp, state == nil,
                    nodes.contains(where: { other in
                        guard other !== holder, other.isUp, let reaped = reapedState(of: other, write.collection, key)
                        else {
                            return false
                        }
                        let covered = max(reaped.writes[write.site] ?? .zero, reaped.removed[write.site] ?? .zero)
                        return reaped.isDeleted && covered >= write.stamp
                    })
                {
                    continue
                }
                if seen < write.stamp {
                    violations.append(
                        "\(holder.name) lacks the write to \(write.collection)/\(write.key) made on \(nodes[write.node].name) at \(write.time) ms"
                            + " (\(holding(holder, row: row, state: state)); \(whereHeld(write, key)))")
                }
            }
        }
        return Array(violations.prefix(20))
    }

    /// What `node` holds of a document, for a violation: "no row", "a live copy", "a tombstone",
    /// or "the reaped key" (a tombstone reaped there, its state kept).
    private func holding(_ node: SimulatedNode, row: [UInt8]?, state: DocumentState?) -> String {
        guard row != nil else { return state == nil ? "\(node.name) has no row" : "\(node.name) has the reaped key" }
        guard let state else { return "\(node.name)'s row does not decode" }
        return "\(node.name) has " + (state.isDeleted ? "a tombstone" : "a live copy")
    }

    /// The up nodes whose state of the document covers `write` (a row, or the state its reaped key
    /// kept), for a violation: which way the write would have had to travel.
    private func whereHeld(_ write: History.Write, _ key: UTF8Key) -> String {
        let holders = nodes.filter { node in
            guard node.isUp else { return false }
            let row = (try? log(of: node, collection: write.collection))?[key]
            guard
                let state = row.flatMap({ try? DocumentState(bytes: $0) })
                    ?? (row == nil ? reapedState(of: node, write.collection, key) : nil)
            else { return false }
            return max(state.writes[write.site] ?? .zero, state.removed[write.site] ?? .zero) >= write.stamp
        }
        return holders.isEmpty ? "no up node has it" : "held on " + holders.map(\.name).joined(separator: ", ")
    }

    /// No live document shows nothing for a write because no node holds its value: an eviction
    /// drops a write's values (rule 8) only once a peer acknowledged them, so a withheld entry
    /// that stays withheld when every up node's state of the document is joined means every node
    /// holding that value dropped it (documents with a write that may be lost by design are passed
    /// over). A node whose copy lags (it asks for nothing in the collection, say, so nothing fills
    /// in what it withholds) is not counted here: the value is still held elsewhere.
    private func valuesHeld() -> [String] {
        var violations: [String] = []
        // Documents with a write that may be lost by design (``History/mayBeLost(_:)``).
        var dropped: Set<UTF8Key> = []
        for write in history.writes where history.mayBeLost(write) {
            dropped.insert(History.id(write.collection, write.key))
        }
        let collections = Set(history.writes.map(\.collection))
        for collection in collections.sorted() {
            var states: [(node: SimulatedNode, key: UTF8Key, state: DocumentState)] = []
            var joined: [UTF8Key: DocumentState] = [:]
            for node in nodes where node.isUp {
                guard let log = try? log(of: node, collection: collection) else { continue }
                for key in log.keys.sorted() {
                    guard !dropped.contains(History.id(collection, key.string)),
                        let state = try? DocumentState(bytes: log[key]!)
                    else { continue }
                    _ = joined[key, default: DocumentState()].merge(state)
                    if !state.isDeleted, state.withheldEntryCount > 0 { states.append((node, key, state)) }
                }
            }
            let name: ((path: String, stamp: Stamp)) -> String = { "\($0.path) (\($0.stamp))" }
            for (node, key, state) in states {
                let lost = Set((joined[key]?.withheldEntries ?? []).map(name))
                let named = state.withheldEntries.map(name).filter(lost.contains).sorted()
                if !named.isEmpty {
                    violations.append(
                        "\(node.name) holds \(collection)/\(key) with withheld values no node holds: "
                            + named.joined(separator: ", "))
                } else if let joinedState = joined[key], subscribes(node, collection, to: joinedState, key) {
                    // A subscriber whose subscription matches the document gets the values other
                    // nodes hold (a node asking for nothing there may lag: docs/MESH.md).
                    let held = state.withheldEntries.map(name).filter { !lost.contains($0) }.sorted()
                    if !held.isEmpty {
                        violations.append(
                            "\(node.name) subscribes to \(collection)/\(key) and shows nothing for values other "
                                + "nodes hold: " + held.joined(separator: ", "))
                    }
                }
            }
        }
        return Array(violations.prefix(20))
    }

    /// Whether one of `node`'s subscriptions in `collection` matches the document whose joined
    /// state is `state`.
    private func subscribes(_ node: SimulatedNode, _ collection: String, to state: DocumentState, _ key: UTF8Key)
        -> Bool
    {
        let id = (try? JSON.parse(key.string)) ?? .null
        guard let value = state.materialize(id: id) else { return false }
        for spec in node.replicator?.subscriptions ?? [] where spec.collection == collection {
            if spec.isWholeCollection { return true }
            if let query = try? Query(spec.query).bind(args: spec.args), (try? query.matches(value)) == true {
                return true
            }
        }
        return false
    }

    private func noResurrection() -> [String] {
        var violations: [String] = []
        let whole = wholeSubscribers()
        var removedNow: [UTF8Key: Millis] = [:]
        for collection in whole.keys.sorted() {
            let holders = whole[collection]!
            let logs = holders.compactMap { try? log(of: $0, collection: collection) }
            guard logs.count == holders.count, let first = logs.first else { continue }
            // The keys the first holder has a row of, and those removed everywhere at the last
            // check, which may since have been reaped everywhere (no row left to list them).
            let prefix = collection + "\u{0}"
            var keys = Set(first.keys)
            for id in history.removedEverywhere.keys where id.string.hasPrefix(prefix) {
                keys.insert(UTF8Key(String(id.string.dropFirst(prefix.count))))
            }
            for key in keys.sorted() {
                let id = History.id(collection, key.string)
                // A holder that reaped the tombstone holds the state its reaped key kept.
                let states = zip(holders, logs).map { holder, log in
                    log[key].flatMap { try? DocumentState(bytes: $0) }
                        ?? (log[key] == nil ? reapedState(of: holder, collection, key) : nil)
                }
                let removed = states.allSatisfy { $0?.isDeleted ?? false }
                // A key no holder has a row of is back only where one shows it.
                let back = first[key] != nil || states.contains { $0?.isDeleted == false }
                if removed {
                    removedNow[id] = history.removedEverywhere[id] ?? now
                } else if back, let since = history.removedEverywhere[id], (history.lastWrite[id] ?? -1) <= since {
                    violations.append(
                        "\(collection)/\(key) was removed everywhere at \(since) ms and came back with no new write")
                }
            }
        }
        history.removedEverywhere = removedNow
        return violations
    }

    private func monotonic() -> [String] {
        var violations: [String] = []
        for node in nodes where node.isUp {
            let clock = node.documents.lastTimestamp
            if let previous = history.clocks[node.index], clock < previous {
                violations.append("\(node.name)'s clock went back from \(previous) to \(clock)")
            }
            history.clocks[node.index] = clock
            var now: [UTF8Key: Checkpoint] = [:]
            for peer in nodes where peer !== node {
                guard let checkpoints = try? node.documents.checkpoints(peer: peer.peerKey) else { continue }
                for (key, checkpoint) in checkpoints { now[UTF8Key(peer.name + "\u{0}" + key.string)] = checkpoint }
            }
            for (key, checkpoint) in now {
                guard let previous = history.checkpoints[node.index]?[key], previous.epoch == checkpoint.epoch,
                    checkpoint.seq < previous.seq
                else { continue }
                let collection = String(
                    key.string.split(separator: "\u{0}").last?.split(separator: "\u{1F}").first ?? "")
                if let evicted = history.evictions[node.index]?[UTF8Key(collection)], evicted > history.lastCheck {
                    continue
                }
                violations.append(
                    "\(node.name)'s checkpoint \(key.string.replacingOccurrences(of: "\u{0}", with: " ")) went back from \(previous.seq) to \(checkpoint.seq)"
                )
            }
            history.checkpoints[node.index] = now
        }
        return violations
    }

    private func contactMirrors() -> [String] {
        var violations: [String] = []
        for node in nodes where node.isUp {
            for mirror in node.contactMirrors {
                do {
                    try mirror.sync(node.documents)
                    let expected = try SimulatedContactsMirror.expected(node.documents, collection: mirror.collection)
                    let cards = mirror.cards
                    guard cards != expected else { continue }
                    let missing = expected.keys.filter { cards[$0] == nil }.sorted()
                    let extra = cards.keys.filter { expected[$0] == nil }.sorted()
                    let different = expected.keys.filter { cards[$0] != nil && cards[$0] != expected[$0] }.sorted()
                    violations.append(
                        "\(node.name)'s contacts mirror of '\(mirror.collection)' differs from its store: missing "
                            + "\(missing), extra \(extra), different \(different)")
                } catch {
                    violations.append("\(node.name)'s contacts mirror of '\(mirror.collection)' failed: \(error)")
                }
            }
        }
        return violations
    }

    private func liveQueries() -> [String] {
        var violations: [String] = []
        for node in nodes where node.isUp {
            for watch in node.watches {
                let fresh = (try? node.store.collection(watch.collection).find(watch.query).exec()) ?? []
                let last = watch.documents.withLock { $0 }
                if fresh != last {
                    violations.append(
                        "\(node.name)'s live query \(watch.collection): \(watch.query) last showed \(last.count) documents, a fresh query \(fresh.count)"
                    )
                }
            }
        }
        return violations
    }
}
