/// One node's presence record: who it is and which peers it has a session with. Records are
/// flooded through the mesh (link-state gossip), so every node can draw the whole graph, including
/// peers several hops away. docs/PROTOCOL.md §2 (`presence`).
public struct PresenceRecord: Sendable, Equatable, Hashable {
    /// The node's peer key (32 bytes).
    public var peerKey: [UInt8]
    /// The protocol version it speaks.
    public var version: Int
    /// Grows with every change of the node's neighbours: a record replaces a held one only when
    /// its `seq` is higher.
    public var seq: UInt64
    /// Peer keys of the nodes it has an established session with, sorted.
    public var neighbors: [[UInt8]]

    public init(peerKey: [UInt8], version: Int, seq: UInt64, neighbors: [[UInt8]]) {
        self.peerKey = peerKey
        self.version = version
        self.seq = seq
        self.neighbors = neighbors
    }

    /// Whether `peerKey` is among ``neighbors``, by binary search: a record whose neighbours are
    /// not sorted (only a hostile peer sends one) may answer `false` for one it lists, and is
    /// then only forwarded where it need not be.
    ///
    /// - Complexity: O(log(neighbours)).
    public func lists(_ peerKey: [UInt8]) -> Bool { Self.sorted(neighbors, contains: peerKey) }

    /// Whether `key` is in `keys`, sorted by `lexicographicallyPrecedes`, by binary search
    /// (a few comparisons of 32 bytes, where a `Set` hashes every byte of the key).
    ///
    /// - Complexity: O(log(keys)).
    static func sorted(_ keys: [[UInt8]], contains key: [UInt8]) -> Bool {
        key.withUnsafeBufferPointer { wanted in
            var low = 0
            var high = keys.count
            while low < high {
                let middle = (low + high) / 2
                let order = keys[middle].withUnsafeBufferPointer { Self.order($0, wanted) }
                if order == 0 { return true }
                if order < 0 { low = middle + 1 } else { high = middle }
            }
            return false
        }
    }

    /// The byte-wise order of two keys (as `lexicographicallyPrecedes`): negative when `a` comes
    /// first, 0 when they are equal, positive when `b` comes first.
    private static func order(_ a: UnsafeBufferPointer<UInt8>, _ b: UnsafeBufferPointer<UInt8>) -> Int {
        for i in 0..<min(a.count, b.count) where a[i] != b[i] { return a[i] < b[i] ? -1 : 1 }
        return a.count - b.count
    }

    /// Most records in one `presence` message; a larger table goes in several messages.
    public static let maxPerMessage = 64
    /// Most neighbours one record may list.
    public static let maxNeighbors = 256
    /// Most records a node keeps: a larger mesh is drawn in part.
    public static let maxRecords = 1024
}

/// A peer that spoke another protocol version (a `hello` this node refused): shown as
/// incompatible rather than missing.
public struct IncompatiblePeer: Sendable, Equatable {
    public var peerKey: [UInt8]
    public var version: Int
    public var address: String
    /// When it was last seen, on the replicator's clock.
    public var lastSeen: Millis
}

/// The replicator's presence state (``Replicator/presence``).
struct PresenceState: Sendable {
    /// Records of other nodes, by peer key.
    var records: [[UInt8]: PresenceRecord] = [:]
    /// This node's record's `seq` (starts from a value the shell chooses, raised above any record
    /// about this node seen in the mesh, so a restarted node's records win over its old ones).
    var ownSeq: UInt64 = 0
    /// The neighbours ``ownSeq`` describes.
    var announced: [[UInt8]]?
    var nextAnnouncement: Millis = 0
    /// Records to pass on, the newest of each node, with the link each came from (it is not sent
    /// back there): sent at once when none went for ``Replicator/presenceInterval`` ms, else at
    /// the tick after it, so a burst of changes crosses each link in one message.
    var forwarding: [[UInt8]: (record: PresenceRecord, from: LinkID)] = [:]
    var nextForward: Millis = 0
    var incompatible: [[UInt8]: IncompatiblePeer] = [:]
    /// Records held but not reachable from this node, and since when.
    var unreachableSince: [[UInt8]: Millis] = [:]
    /// When unreachable records are looked for next (every ``Replicator/presencePruneInterval``).
    var nextPrune: Millis = 0
}

extension Replicator {
    /// How long an incompatible peer stays listed after it was last seen, in milliseconds.
    public static let incompatiblePeerLifetime: Millis = 60_000
    /// The shortest time between two announcements of this node's neighbours, in milliseconds.
    public static let presenceInterval: Millis = 500
    /// How often records are checked for reachability, in milliseconds (the check walks every
    /// record, so not on every tick).
    public static let presencePruneInterval: Millis = 5_000

    /// This node's own record now.
    public var ownPresence: PresenceRecord {
        PresenceRecord(
            peerKey: configuration.peerKey, version: WireMessage.protocolVersion, seq: presenceState.ownSeq,
            neighbors: establishedNeighbors)
    }

    /// The records of every node reachable from this one through the records held (this node's
    /// own first, then by peer key): the mesh as this node knows it.
    ///
    /// - Complexity: O(records + neighbours listed).
    public var presence: [PresenceRecord] {
        let own = ownPresence
        var seen: Set<[UInt8]> = [own.peerKey]
        var queue = own.neighbors
        var out: [PresenceRecord] = []
        while let key = queue.popLast() {
            guard seen.insert(key).inserted else { continue }
            guard let record = presenceState.records[key] else { continue }
            out.append(record)
            queue += record.neighbors
        }
        return [own] + out.sorted { $0.peerKey.lexicographicallyPrecedes($1.peerKey) }
    }

    /// Peers that spoke another protocol version in the last ``incompatiblePeerLifetime`` ms.
    public var incompatiblePeers: [IncompatiblePeer] {
        presenceState.incompatible.values.sorted { $0.peerKey.lexicographicallyPrecedes($1.peerKey) }
    }

    /// Sets the first `seq` of this node's record (the shell passes wall-clock milliseconds, so a
    /// restarted node usually starts above its old records; the mesh corrects it when not).
    public mutating func setPresenceSeq(_ seq: UInt64) {
        presenceState.ownSeq = seq
    }

    var establishedNeighbors: [[UInt8]] {
        Array(Set(sessions.values.filter { $0.phase == .established }.map(\.peerKey))).sorted {
            $0.lexicographicallyPrecedes($1)
        }
    }

    /// How long a record may stay unreachable before it is dropped, in milliseconds.
    public static let unreachableRecordLifetime: Millis = 30_000

    /// A session was established: it gets this node's own record and every record it holds
    /// (also records no longer reachable, so a restarted peer learns the `seq` its old record
    /// had), except those of nodes that list the new peer as a neighbour: those nodes tell it
    /// themselves. The other peers get this node's record with the new neighbour at its next
    /// announcement (``presenceTick(now:)``, at most every ``presenceInterval`` ms), so a mesh
    /// forming, where sessions come up by the dozen, costs each node a few records per peer and
    /// not one per session.
    ///
    /// - Complexity: O(records × log(neighbours listed)).
    mutating func presenceEstablished(_ link: LinkID, now: Millis) -> [ReplicatorDirective] {
        guard let peer = sessions[link]?.peerKey else { return [] }
        let held = presenceState.records.values.filter { !$0.lists(peer) }
            .sorted { $0.peerKey.lexicographicallyPrecedes($1.peerKey) }
        let own = ownPresenceAnnounced(establishedNeighbors)
        sessions[link]!.presenceSeqSent = own.seq
        return presenceMessages([own] + held, to: link, now: now)
    }

    /// `records` to `link`, in messages of at most ``PresenceRecord/maxPerMessage``.
    private mutating func presenceMessages(_ records: [PresenceRecord], to link: LinkID, now: Millis)
        -> [ReplicatorDirective]
    {
        stride(from: 0, to: records.count, by: PresenceRecord.maxPerMessage).map { start in
            send(link, .presence(Array(records[start..<min(records.count, start + PresenceRecord.maxPerMessage)])), now)
        }
    }

    /// This node's record, with a new `seq` when its neighbours (``establishedNeighbors``, which
    /// the caller has) changed since last announced.
    private mutating func ownPresenceAnnounced(_ neighbors: [[UInt8]]) -> PresenceRecord {
        if presenceState.announced != neighbors {
            presenceState.ownSeq &+= 1
            presenceState.announced = neighbors
        }
        return ownPresence
    }

    /// On each tick: announce this node's neighbours to every peer when they changed (at most
    /// every ``presenceInterval`` ms; not to a peer already sent that record, as a new session
    /// is), and forget incompatible peers not seen for a while.
    mutating func presenceTick(now: Millis) -> [ReplicatorDirective] {
        presenceState.incompatible = presenceState.incompatible.filter {
            now - $0.value.lastSeen < Self.incompatiblePeerLifetime
        }
        if now >= presenceState.nextPrune {
            presenceState.nextPrune = now + Self.presencePruneInterval
            pruneUnreachable(now: now)
        }
        let forwards = now >= presenceState.nextForward ? forwardPresence(now: now) : []
        // When the neighbours changed since the last record, and also when a peer has not had the
        // last record (a new session's peer alone was told it at once). The first includes a
        // change back, after a session that only its peer was told of closed before this tick:
        // that record must be overtaken, or it stands for good where it went, since no node
        // passes a record on to a peer it lists.
        let neighbors = establishedNeighbors
        guard now >= presenceState.nextAnnouncement,
            presenceState.announced != neighbors
                || sessions.values.contains(where: {
                    $0.phase == .established && $0.presenceSeqSent != presenceState.ownSeq
                })
        else { return forwards }
        presenceState.nextAnnouncement = now + Self.presenceInterval
        let own = ownPresenceAnnounced(neighbors)
        var directives: [ReplicatorDirective] = []
        for link in sessions.keys.sorted()
        where sessions[link]?.phase == .established && sessions[link]?.presenceSeqSent != own.seq {
            sessions[link]!.presenceSeqSent = own.seq
            directives.append(send(link, .presence([own]), now))
        }
        return forwards + directives
    }

    /// Passes on the records waiting in ``PresenceState/forwarding``: to each established peer,
    /// those that did not come from it and do not list it as a neighbour (that node tells it
    /// itself), in messages of at most ``PresenceRecord/maxPerMessage``. A record about the peer
    /// itself does go: a restarted peer learns from it the `seq` its old record had, and
    /// announces above it.
    ///
    /// - Complexity: O(sessions × records waiting × log(neighbours listed)).
    private mutating func forwardPresence(now: Millis) -> [ReplicatorDirective] {
        guard !presenceState.forwarding.isEmpty else { return [] }
        let waiting = presenceState.forwarding.values.sorted {
            $0.record.peerKey.lexicographicallyPrecedes($1.record.peerKey)
        }
        presenceState.forwarding = [:]
        presenceState.nextForward = now + Self.presenceInterval
        var directives: [ReplicatorDirective] = []
        for link in sessions.keys.sorted() where sessions[link]?.phase == .established {
            let peer = sessions[link]!.peerKey
            let due = waiting.filter { $0.from != link && !$0.record.lists(peer) }.map(\.record)
            directives += presenceMessages(due, to: link, now: now)
        }
        return directives
    }

    /// Records from a peer: each newer than the one held replaces it and goes on to every other
    /// peer except one the record lists as a neighbour (its node tells that peer itself), at
    /// once when none went for ``presenceInterval`` ms, else with the others that came meanwhile
    /// (``forwardPresence(now:)``). A record about this node with a `seq` at or above its own
    /// makes it announce again above it. Records listing more than
    /// ``PresenceRecord/maxNeighbors`` neighbours were refused at decode; beyond
    /// ``PresenceRecord/maxRecords`` records, new nodes are not kept.
    ///
    /// The sender's own record, when its neighbours changed, changes what this node relays of
    /// the sender's subscriptions to the peers that joined or left those neighbours
    /// (``wanted(for:now:sources:)``); only what is asked of those peers is worked out again.
    ///
    /// - Complexity: O(records × sessions × log(neighbours listed)), plus working out what is
    ///   asked of each peer whose relays changed.
    mutating func presenceReceived(_ records: [PresenceRecord], on link: LinkID, now: Millis)
        -> [ReplicatorDirective]
    {
        var fresh: [PresenceRecord] = []
        // The peers whose relays of the sender's subscriptions changed; `nil`: every peer.
        var relaysChanged: Set<[UInt8]>? = []
        for record in records {
            if let sender = sessions[link], record.peerKey == sender.peerKey,
                sender.reportedNeighbors.map({ record.seq > $0.seq }) ?? true
            {
                // The peer's own word about its sessions: which of this node's relays it makes
                // redundant (``wanted(for:now:sources:)``).
                let keys = Set(record.neighbors)
                if !sender.remoteSubscriptions.isEmpty {
                    if let before = sender.reportedNeighbors?.keys {
                        relaysChanged?.formUnion(keys.symmetricDifference(before))
                    } else {
                        relaysChanged = nil
                    }
                }
                sessions[link]!.reportedNeighbors = (record.seq, keys.sorted { $0.lexicographicallyPrecedes($1) })
            }
            if record.peerKey == configuration.peerKey {
                // (A `seq` near the top of the range, which only a hostile peer sends, is ignored:
                // this node's next `seq` must still fit the wire's range.)
                if record.seq >= presenceState.ownSeq, record.seq < UInt64(Int64.max) - 1 {
                    presenceState.ownSeq = record.seq
                    presenceState.announced = nil  // announce again above it, to every peer
                }
                continue
            }
            if let held = presenceState.records[record.peerKey], held.seq >= record.seq { continue }
            if presenceState.records[record.peerKey] == nil, presenceState.records.count >= PresenceRecord.maxRecords {
                continue
            }
            presenceState.records[record.peerKey] = record
            fresh.append(record)
        }
        let relays: [ReplicatorDirective]
        if let peers = relaysChanged {
            relays = peers.isEmpty ? [] : updateAsked(except: link, only: peers, now: now)
        } else {
            relays = updateAsked(except: link, now: now)
        }
        guard !fresh.isEmpty else { return relays }
        for record in fresh { presenceState.forwarding[record.peerKey] = (record, link) }
        return (now >= presenceState.nextForward ? forwardPresence(now: now) : []) + relays
    }

    /// A peer's hello named another protocol version.
    mutating func noteIncompatible(_ hello: Hello, address: String, now: Millis) {
        presenceState.incompatible[hello.peerKey] = IncompatiblePeer(
            peerKey: hello.peerKey, version: hello.version, address: address, lastSeen: now)
    }

    /// Drops records of nodes unreachable from this one for ``unreachableRecordLifetime`` ms
    /// (they left, or their last link to the reachable part closed). Not at once: records of a
    /// large mesh arrive in several messages, in no particular order.
    private mutating func pruneUnreachable(now: Millis) {
        guard !presenceState.records.isEmpty else { return }
        let reachable = Set(presence.map(\.peerKey))
        for key in presenceState.records.keys {
            if reachable.contains(key) {
                presenceState.unreachableSince[key] = nil
            } else if let since = presenceState.unreachableSince[key] {
                if now - since >= Self.unreachableRecordLifetime {
                    presenceState.records[key] = nil
                    presenceState.unreachableSince[key] = nil
                }
            } else {
                presenceState.unreachableSince[key] = now
            }
        }
    }
}
