import Foundation
public import TrellisCore
public import TrellisNet
public import TrellisStore
public import TrellisSync

/// What a node is doing and what it holds back, in one snapshot (``TrellisNode/status()``; the
/// shell's `status` command prints its ``description``).
///
/// Nothing a node refuses is silent: a remote document it cannot apply yet (a stamp too far
/// ahead, too large, undecodable, failing validation) is kept and listed in ``deferred`` with the
/// reason until a retry applies it; a damaged row is listed in ``damaged``; a subscription a peer
/// cannot serve is listed under that peer.
public struct NodeStatus: Sendable {
    /// This node's peer key (its static X25519 public key, 32 bytes).
    public var peerKey: [UInt8]
    /// The site ID stamping this node's writes, and the 16-byte epoch of its change log.
    public var site: SiteID
    public var epoch: [UInt8]
    /// The highest `seq` of the local change log.
    public var lastSeq: Int64
    /// This node's physical clock and the physical part of its HLC, milliseconds since the Unix
    /// epoch. The HLC runs ahead when a peer's clock is ahead of this one.
    public var physicalMillis: UInt64
    public var hlcMillis: UInt64
    /// The directly connected peers (with the subscriptions each cannot serve).
    public var peers: [PeerInfo]
    /// This node's own subscriptions.
    public var subscriptions: [SubscriptionSpec]
    /// Remote document states kept to retry (``DocumentStore/deferredDocuments()``).
    public var deferred: [DeferredDocument]
    /// Damaged rows met since the store opened, skipped until a peer sends a good state.
    public var damaged: [(collection: String, key: String, reason: String)]
    /// Per connected peer and subscription: what arrived, how far behind, initial sync complete.
    public var sync: SyncStatus
    /// TCP links closed since the node started, per reason: authenticated closes, connections
    /// that ended without one, and links closed for tampered, replayed, reordered, truncated or
    /// malformed traffic (docs/SECURITY.md, "Channel"). Reasons never seen are absent.
    public var linkCloses: [LinkCloseReason: Int] = [:]
    /// Inbound connections before authentication: accepted, cut, late, under another key.
    public var handshakes = PreAuthCounters()
    /// Whether a next mesh key is held (a changeover is under way).
    public var hasNextMeshKey = false
    /// What the authorization rules and site pins refused since the node started.
    public var authorization = AuthorizationRefusals()
    /// Inbound message bytes held now and at most since the node started, against the limit
    /// (``NodeOptions/inboundBufferBytes``); sessions closed at the limit count in ``linkCloses``
    /// as ``LinkCloseReason/overLimit``.
    public var inboundBuffer = InboundBufferStatus()

    /// Several lines: identity and log, clocks, peers, subscriptions, then every deferred and
    /// damaged document with its reason.
    public var description: String {
        var lines = [
            "node \(Self.hex(peerKey.prefix(8))) site \(String(format: "%016llx", site)) epoch \(Self.hex(epoch.prefix(8))) "
                + "seq \(lastSeq)"
        ]
        let lead = Int64(bitPattern: hlcMillis &- physicalMillis)
        var clock =
            "clock \(Self.time(physicalMillis)), HLC "
            + (hlcMillis == 0 ? "not started (nothing written or merged yet)" : Self.time(hlcMillis))
        if hlcMillis != 0, lead > 1_000 { clock += " (HLC \(lead) ms ahead: a peer's clock is ahead of this one)" }
        lines.append(clock)
        lines.append("mesh key: current" + (hasNextMeshKey ? " and next (changeover under way)" : " only"))
        lines.append(handshakes.description)
        lines.append(inboundBuffer.description)
        lines.append(
            "authorization refused: \(authorization.subscriptions) subscription(s), \(authorization.batches) batch(es) "
                + "(\(authorization.documents) document(s)), \(authorization.sites) session(s) presenting another key's "
                + "site ID")
        lines.append("peers: \(peers.count) connected")
        for peer in peers {
            for line in peer.description.split(separator: "\n") { lines.append("  " + line) }
        }
        lines.append("subscriptions: \(subscriptions.count)")
        for spec in subscriptions { lines.append("  \(spec)") }
        if !sync.peers.isEmpty {
            lines.append("sync:")
            for line in sync.description.split(separator: "\n") { lines.append("  " + line) }
        }
        let closes = LinkCloseReason.allCases.compactMap { reason in linkCloses[reason].map { "\(reason) \($0)" } }
        lines.append("links closed: " + (closes.isEmpty ? "none" : closes.joined(separator: ", ")))
        lines.append("deferred: \(deferred.count) document(s) kept to retry")
        for doc in deferred {
            lines.append(
                "  \(doc.collection) \(doc.key) from \(Self.hex(doc.peer.prefix(8))) since \(Self.time(doc.since)), "
                    + "\(doc.attempts) retries: \(doc.reason)")
        }
        lines.append("damaged: \(damaged.count) document(s)")
        for doc in damaged { lines.append("  \(doc.collection) \(doc.key): \(doc.reason)") }
        return lines.joined(separator: "\n")
    }

    static func hex<S: Sequence<UInt8>>(_ bytes: S) -> String {
        bytes.map { String(format: "%02x", $0) }.joined()
    }

    static func time(_ millis: UInt64) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.string(from: Date(timeIntervalSince1970: Double(millis) / 1000))
    }
}

extension TrellisNode {
    /// A snapshot of this node: identity, log, clocks, peers, subscriptions, and the documents it
    /// holds back (deferred, damaged) with the reasons.
    ///
    /// - Throws: ``StoreError`` when the store cannot be read (closed, SQLite error).
    /// - Complexity: O(peers + subscriptions + deferred + damaged documents).
    public func status() throws -> NodeStatus {
        let documents = store.documents
        return NodeStatus(
            peerKey: identity.publicKey, site: documents.siteID, epoch: documents.epoch, lastSeq: documents.lastSeq,
            physicalMillis: documents.options.now(), hlcMillis: documents.lastTimestamp.millis, peers: peers,
            subscriptions: subscriptions, deferred: try documents.deferredDocuments(),
            damaged: documents.damagedDocuments(), sync: sync.status, linkCloses: engine.linkCloses.snapshot,
            handshakes: network.preAuthCounters, hasNextMeshKey: network.hasNextMeshKey,
            authorization: engine.authorizationRefusals,
            inboundBuffer: InboundBufferStatus(
                held: network.inboundBudget.heldBytes, peak: network.inboundBudget.peakBytes,
                limit: network.inboundBudget.limit))
    }
}

/// A node's inbound message bytes (``NodeOptions/inboundBufferBytes``, docs/SECURITY.md, "Limits").
public struct InboundBufferStatus: Sendable, Equatable, CustomStringConvertible {
    /// Bytes of inbound messages held now: being received, or received and not yet merged.
    public var held = 0
    /// The most held at once since the node started, bytes.
    public var peak = 0
    /// The limit, bytes.
    public var limit = 0

    public init(held: Int = 0, peak: Int = 0, limit: Int = 0) {
        self.held = held
        self.peak = peak
        self.limit = limit
    }

    /// One line: `inbound messages: 0 of 256 MiB held (peak 12.5 MiB)`.
    public var description: String {
        "inbound messages: \(Self.mebibytes(held)) of \(Self.mebibytes(limit)) held (peak \(Self.mebibytes(peak)))"
    }

    static func mebibytes(_ bytes: Int) -> String {
        let value = Double(bytes) / 1_048_576
        return value == value.rounded() ? "\(Int(value)) MiB" : String(format: "%.1f MiB", value)
    }
}
