import Dispatch
import Foundation
public import TrellisCore
public import TrellisNet
public import TrellisStore

/// What this node knows about one connected peer.
public struct PeerInfo: Sendable, CustomStringConvertible {
    public var peerKey: [UInt8]
    public var address: String
    public var isInitiator: Bool
    public var siteID: SiteID?
    /// The peer's subscriptions this node serves.
    public var servedSubscriptions: [SubscriptionSpec]

    public var keyHex: String { peerKey.map { String(format: "%02x", $0) }.joined() }

    public var description: String {
        "\(keyHex.prefix(16)) \(address) \(isInitiator ? "outbound" : "inbound"), serving \(servedSubscriptions.count) subscription(s)"
    }
}

/// The sync engine shell: owns one ``SyncSession`` per connected peer and carries out its
/// directives against the ``DocumentStore`` and the ``MessageLink``.
///
/// All mutable state lives on one serial queue. Store I/O for sync runs on that queue too, so
/// merges are applied in the order batches arrive.
public final class SyncEngine: @unchecked Sendable {
    // Invariant: every `var` below is read and written only on `queue`.
    private let queue = DispatchQueue(label: "trellis.sync")
    public let store: DocumentStore
    public let peerKey: [UInt8]
    /// Subscriptions forwarded to other peers travel at most this many hops.
    public let maxHops: Int
    private let log: @Sendable (String) -> Void

    private final class Entry {
        let link: any MessageLink
        var session: SyncSession
        var remoteSubscriptions: [WireSubscription] = []
        var lastSent: [WireSubscription]?
        init(link: any MessageLink, session: SyncSession) {
            self.link = link
            self.session = session
        }
    }

    private var entries: [ObjectIdentifier: Entry] = [:]
    /// Subscriptions by key; keys compare byte-wise, like every name from users.
    private var local: [UTF8Key: SubscriptionSpec] = [:]
    /// How many `subscribe` calls hold each local subscription (two apps may subscribe alike).
    private var localCounts: [UTF8Key: Int] = [:]
    private var queries: [UTF8Key: Query?] = [:]
    private var observerToken: UInt64 = 0
    private var closing = false

    /// - Parameters:
    ///   - store: the local store.
    ///   - peerKey: this node's static public key.
    ///   - maxHops: hop limit for forwarded subscriptions.
    ///   - log: where session events go.
    public init(
        store: DocumentStore, peerKey: [UInt8], maxHops: Int = 4,
        log: @escaping @Sendable (String) -> Void = { _ in }
    ) {
        self.store = store
        self.peerKey = peerKey
        self.maxHops = maxHops
        self.log = log
        let token = store.addObserver { [weak self] event in
            guard let self else { return }
            self.queue.async {
                if event.evicted {
                    // Ask again from the (forgotten) checkpoints: peers send back what still matches.
                    for entry in self.entries.values where entry.session.isEstablished { entry.lastSent = nil }
                    self.updateSubscriptions()
                }
                self.localChanged()
            }
        }
        queue.sync { observerToken = token }
    }

    deinit { store.removeObserver(observerToken) }

    // MARK: Subscriptions

    /// Asks peers for the documents matching `spec` (replicated to this store while connected).
    ///
    /// - Throws: ``QueryParseError`` when the query does not parse.
    public func subscribe(_ spec: SubscriptionSpec) throws {
        _ = try Query(spec.query).bind(args: spec.args)
        let key = UTF8Key(spec.key)
        queue.sync {
            localCounts[key, default: 0] += 1
            guard local[key] == nil else { return }
            local[key] = spec
            updateSubscriptions()
        }
    }

    /// Releases one ``subscribe(_:)`` of `spec`; peers stop being asked for it when none is left.
    public func unsubscribe(_ spec: SubscriptionSpec) {
        let key = UTF8Key(spec.key)
        queue.sync {
            guard let count = localCounts[key] else { return }
            if count > 1 {
                localCounts[key] = count - 1
                return
            }
            localCounts.removeValue(forKey: key)
            local.removeValue(forKey: key)
            updateSubscriptions()
        }
    }

    /// This node's own subscriptions.
    public var subscriptions: [SubscriptionSpec] {
        queue.sync { local.sorted { $0.key < $1.key }.map(\.value) }
    }

    /// The peers with an established session.
    public var peers: [PeerInfo] {
        queue.sync {
            entries.values.compactMap { entry in
                guard let hello = entry.session.remote else { return nil }
                return PeerInfo(
                    peerKey: hello.peerKey, address: entry.link.remoteAddress, isInitiator: entry.link.isInitiator,
                    siteID: hello.site, servedSubscriptions: entry.session.servedSubscriptions)
            }
        }
    }

    /// Runs `body` on the engine queue after everything queued before it (for tests and tools).
    public func sync<R: Sendable>(_ body: @Sendable () -> R) -> R { queue.sync(execute: body) }

    // MARK: Links

    /// Starts a session over a new link.
    public func attach(_ link: any MessageLink) {
        let hello = Hello(
            version: WireMessage.protocolVersion, peerKey: peerKey, site: store.siteID, epoch: store.epoch)
        let id = ObjectIdentifier(link)
        queue.async { [self] in
            guard !closing else {
                link.start(onMessage: { _ in }, onClose: { _ in })
                link.close()
                return
            }
            let entry = Entry(
                link: link, session: SyncSession(configuration: .init(hello: hello, remotePeerKey: link.remotePeerKey)))
            entries[id] = entry
            link.start(
                onMessage: { [weak self] bytes in
                    guard let self else { return }
                    let message: WireMessage
                    do {
                        message = try WireMessage(serialized: bytes)
                    } catch {
                        self.queue.async { self.fail(id, "\(error)") }
                        return
                    }
                    self.queue.async { self.receive(message, on: id) }
                },
                onClose: { [weak self] reason in
                    guard let self else { return }
                    self.queue.async { self.detach(id, reason: reason) }
                })
            perform(entry.session.start(), on: id)
        }
    }

    /// Closes every link and stops accepting new ones.
    public func close() {
        let links = queue.sync { () -> [any MessageLink] in
            closing = true
            return entries.values.map(\.link)
        }
        for link in links { link.close() }
    }

    private func fail(_ id: ObjectIdentifier, _ reason: String) {
        guard let entry = entries[id] else { return }
        log("closing session with \(entry.link.remoteAddress): \(reason)")
        try? entry.link.send(WireMessage.error(code: "protocol", message: reason).serialized())
        entry.link.close()
    }

    private func detach(_ id: ObjectIdentifier, reason: String) {
        guard let entry = entries.removeValue(forKey: id) else { return }
        let hint =
            entry.session.remote == nil && entry.link.isInitiator
            ? " (closed before any hello: check that both nodes use the same mesh key)" : ""
        entry.session.closed()
        log("session with \(entry.link.remoteAddress) ended: \(reason)\(hint)")
        if !entry.remoteSubscriptions.isEmpty { updateSubscriptions() }
    }

    private func receive(_ message: WireMessage, on id: ObjectIdentifier) {
        guard let entry = entries[id] else { return }
        perform(entry.session.receive(message), on: id)
    }

    private func localChanged() {
        for (id, entry) in entries where entry.session.isEstablished {
            perform(entry.session.localChanged(), on: id)
        }
    }

    // MARK: Directives

    private func perform(_ directives: [SyncSession.Directive], on id: ObjectIdentifier) {
        for directive in directives {
            guard let entry = entries[id] else { return }
            switch directive {
            case .send(let message):
                do {
                    try entry.link.send(message.serialized())
                } catch {
                    log("send to \(entry.link.remoteAddress) failed: \(error)")
                    entry.link.close()
                    return
                }
            case .established(let hello):
                if !admit(hello, id: id) { return }
                log("session established with \(entry.link.remoteAddress) (peer \(hex(hello.peerKey).prefix(16)))")
                sendSubscriptions(to: entry)
            case .scan(let key, let spec, let after, let limit):
                scan(entry, key: key, spec: spec, after: after, limit: limit, id: id)
            case .apply(let key, let documents, let upTo):
                apply(entry, key: key, documents: documents, upTo: upTo, id: id)
            case .remoteSubscriptionsChanged(let subs):
                entry.remoteSubscriptions = subs
                updateSubscriptions(except: id)
            case .close(let reason):
                log("closing session with \(entry.link.remoteAddress): \(reason)")
                entry.link.close()
            }
        }
    }

    /// One session per peer pair: of two links to the same peer keep the one dialed by the node
    /// with the smaller peer key (both sides decide the same); a link to ourselves is refused.
    private func admit(_ hello: Hello, id: ObjectIdentifier) -> Bool {
        guard let entry = entries[id] else { return false }
        if hello.peerKey == peerKey {
            perform([.close(reason: "connected to itself")], on: id)
            return false
        }
        func dialer(_ e: Entry) -> [UInt8] { e.link.isInitiator ? peerKey : e.link.remotePeerKey }
        for (otherID, other) in entries where otherID != id && other.session.remote?.peerKey == hello.peerKey {
            let keepNew =
                dialer(entry).lexicographicallyPrecedes(dialer(other))
                || (dialer(entry) == dialer(other))
            if keepNew {
                other.link.close()
            } else {
                entry.link.close()
                return false
            }
        }
        return true
    }

    private func query(for spec: SubscriptionSpec) -> Query? {
        let key = UTF8Key(spec.key)
        if let cached = queries[key] { return cached }
        if queries.count >= 4096 { queries.removeAll(keepingCapacity: true) }  // bounded, whatever peers send
        let parsed: Query?
        do {
            parsed = try Query(spec.query).bind(args: spec.args)
        } catch {
            log("a peer's subscription '\(spec)' cannot run (\(error)); it matches nothing")
            parsed = nil
        }
        queries[key] = parsed
        return parsed
    }

    private func scan(
        _ entry: Entry, key: String, spec: SubscriptionSpec, after: Int64, limit: Int, id: ObjectIdentifier
    ) {
        guard let query = query(for: spec) else {
            // A subscription that does not parse matches nothing; move its cursor to the end.
            perform(
                entry.session.scanned(subscription: key, documents: [], upTo: store.lastSeq, exhausted: true), on: id)
            return
        }
        let page: ChangePage
        do {
            page = try store.changes(
                in: spec.collection, after: after, limit: limit, maxBytes: .max, matching: query, args: spec.args)
        } catch {
            perform([.close(reason: "reading the change log failed: \(error)")], on: id)
            return
        }
        let documents = page.records.map {
            WireDocument(collection: $0.collection, id: $0.id, state: $0.state)
        }
        perform(
            entry.session.scanned(
                subscription: key, documents: documents, upTo: page.scannedUpTo, exhausted: page.exhausted),
            on: id)
    }

    private func apply(_ entry: Entry, key: String, documents: [WireDocument], upTo: Int64, id: ObjectIdentifier) {
        guard let remote = entry.session.remote else { return }
        // A batch answers one subscription, so every document must be of its collection: a peer
        // cannot write into collections nobody asked it for.
        let collection = SubscriptionSpec.collection(ofKey: key)
        var accepted: [RemoteDocument] = []
        for document in documents {
            if UTF8Key.equal(document.collection, collection) {
                accepted.append(document)
            } else {
                log(
                    "refused document \(document.id) of collection '\(document.collection)' from "
                        + "\(entry.link.remoteAddress): the batch is for a subscription to '\(collection)'")
            }
        }
        do {
            let outcome = try store.merge(
                accepted, from: remote.peerKey, checkpoint: (key, Checkpoint(epoch: remote.epoch, seq: upTo)))
            for (doc, reason) in outcome.rejected {
                log("refused document \(doc) from \(entry.link.remoteAddress): \(reason)")
            }
        } catch {
            perform([.close(reason: "merging a batch failed: \(error)")], on: id)
            return
        }
        perform(entry.session.applied(subscription: key, upTo: upTo), on: id)
    }

    /// Recomputes what each peer is asked for: this node's subscriptions plus those of its other
    /// peers (forwarded, one hop more, up to ``maxHops``), each with the checkpoint held for that peer.
    private func updateSubscriptions(except skip: ObjectIdentifier? = nil) {
        for (id, entry) in entries where id != skip && entry.session.isEstablished {
            sendSubscriptions(to: entry)
        }
    }

    private func sendSubscriptions(to entry: Entry) {
        guard let remote = entry.session.remote else { return }
        var wanted: [UTF8Key: (SubscriptionSpec, Int)] = [:]
        for (key, spec) in local { wanted[key] = (spec, 0) }
        for other in entries.values where other !== entry {
            for sub in other.remoteSubscriptions where sub.hops + 1 <= maxHops {
                let key = UTF8Key(sub.spec.key)
                if let existing = wanted[key], existing.1 <= sub.hops + 1 { continue }
                wanted[key] = (sub.spec, sub.hops + 1)
            }
        }
        var list: [WireSubscription] = []
        for (key, (spec, hops)) in wanted.sorted(by: { $0.key < $1.key }) {
            var since: Int64 = 0
            if let cp = try? store.checkpoint(peer: remote.peerKey, subscription: key.string), cp.epoch == remote.epoch
            {
                since = cp.seq
            }
            list.append(WireSubscription(spec: spec, since: since, hops: hops))
        }
        // Resend only when the set (ignoring checkpoints, which the peer tracks itself) changed.
        let shape = list.map { WireSubscription(spec: $0.spec, since: 0, hops: $0.hops) }
        if let last = entry.lastSent, last == shape { return }
        entry.lastSent = shape
        guard let id = entries.first(where: { $0.value === entry })?.key else { return }
        perform(entry.session.subscribe(list), on: id)
    }
}

func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }
