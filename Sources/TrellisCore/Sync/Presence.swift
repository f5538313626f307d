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
    /// Neighbours as last announced.
    var announced: [[UInt8]]?
    var nextAnnouncement: Millis = 0
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

    /// A session was established: it gets every record this node holds, its own included (also
    /// records no longer reachable, so a restarted peer learns the `seq` its old record had).
    /// Its other peers get this node's record with the new neighbour at once.
    mutating func presenceEstablished(_ link: LinkID, now: Millis) -> [ReplicatorDirective] {
        let held = presenceState.records.values.sorted { $0.peerKey.lexicographicallyPrecedes($1.peerKey) }
        let changed = presenceState.announced != establishedNeighbors
        let own = ownPresenceAnnounced()
        let records = [own] + held
        var directives = stride(from: 0, to: records.count, by: PresenceRecord.maxPerMessage).map { start in
            send(link, .presence(Array(records[start..<min(records.count, start + PresenceRecord.maxPerMessage)])), now)
        }
        if changed {
            for other in sessions.keys.sorted() where other != link && sessions[other]?.phase == .established {
                directives.append(send(other, .presence([own]), now))
            }
        }
        return directives
    }

    /// This node's record, with a new `seq` when its neighbours changed since last announced.
    private mutating func ownPresenceAnnounced() -> PresenceRecord {
        let neighbors = establishedNeighbors
        if presenceState.announced != neighbors {
            presenceState.ownSeq &+= 1
            presenceState.announced = neighbors
        }
        return ownPresence
    }

    /// On each tick: announce this node's neighbours to every peer when they changed (at most
    /// every ``presenceInterval`` ms), and forget incompatible peers not seen for a while.
    mutating func presenceTick(now: Millis) -> [ReplicatorDirective] {
        presenceState.incompatible = presenceState.incompatible.filter {
            now - $0.value.lastSeen < Self.incompatiblePeerLifetime
        }
        if now >= presenceState.nextPrune {
            presenceState.nextPrune = now + Self.presencePruneInterval
            pruneUnreachable(now: now)
        }
        guard now >= presenceState.nextAnnouncement, presenceState.announced != establishedNeighbors else { return [] }
        presenceState.nextAnnouncement = now + Self.presenceInterval
        let own = ownPresenceAnnounced()
        return sessions.keys.sorted().compactMap { link in
            sessions[link]?.phase == .established ? send(link, .presence([own]), now) : nil
        }
    }

    /// Records from a peer: each newer than the one held replaces it and goes on to every other
    /// peer. A record about this node with a `seq` at or above its own makes it announce again
    /// above it. Records listing more than ``PresenceRecord/maxNeighbors`` neighbours were refused
    /// at decode; beyond ``PresenceRecord/maxRecords`` records, new nodes are not kept.
    mutating func presenceReceived(_ records: [PresenceRecord], on link: LinkID, now: Millis)
        -> [ReplicatorDirective]
    {
        var fresh: [PresenceRecord] = []
        var relaysChanged = false
        for record in records {
            if let sender = sessions[link], record.peerKey == sender.peerKey,
                sender.reportedNeighbors.map({ record.seq > $0.seq }) ?? true
            {
                // The peer's own word about its sessions: which of this node's relays it makes
                // redundant (``wanted(for:)``).
                let keys = Set(record.neighbors)
                relaysChanged = relaysChanged || sender.reportedNeighbors?.keys != keys
                sessions[link]!.reportedNeighbors = (record.seq, keys)
            }
            if record.peerKey == configuration.peerKey {
                // (A `seq` near the top of the range, which only a hostile peer sends, is ignored:
                // this node's next `seq` must still fit the wire's range.)
                if record.seq >= presenceState.ownSeq, record.seq < UInt64(Int64.max) - 1 {
                    presenceState.ownSeq = record.seq
                    presenceState.announced = nil  // announce again above it
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
        let relays = relaysChanged ? updateAsked(except: link, now: now) : []
        guard !fresh.isEmpty else { return relays }
        return sessions.keys.sorted().compactMap { other in
            other != link && sessions[other]?.phase == .established ? send(other, .presence(fresh), now) : nil
        } + relays
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
