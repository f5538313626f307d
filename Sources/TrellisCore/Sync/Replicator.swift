/// The sync policy of one node, as a pure state machine (docs/PROTOCOL.md).
///
/// It reads no socket, store or clock and draws randomness only from the seed it was given: the
/// shell (``SyncHost`` over real sockets, or the simulator) feeds it events — links opening and
/// closing, messages, commits, scan and merge results, clock ticks — and carries out the
/// ``ReplicatorDirective``s it returns, in order. Every decision lives here: sessions and their
/// hello, duplicate links, keepalive and liveness, which subscriptions to ask each peer for
/// (forwarding, hop limit, caps), what to serve and from where, batch budgets, echo suppression,
/// per-subscription errors, rescans after eviction, regressed-log detection, dial backoff.
public struct Replicator: Sendable {
    public let configuration: ReplicatorConfiguration
    /// This node's log as last reported by the shell.
    public private(set) var local: LocalLog
    private var rng: SplitMix64
    private var own: [UTF8Key: (spec: SubscriptionSpec, count: Int)] = [:]
    private var generations: [UTF8Key: UInt32]
    /// The collections the local store holds rows of (documents, tombstones, eviction stubs): a
    /// subscription from 0 in one of them says so (``WireSubscription/holds``). Those of the
    /// store when the engine starts, and each collection a merge brings live documents of
    /// (``wantReapedKeys(in:besides:now:)``). Never shrinks (a collection emptied stays here,
    /// which only costs reaped tombstones).
    private var heldCollections: Set<UTF8Key>
    /// Collections committed to since the engine started (local writes, any merge): held as
    /// well for a request made from now on, but a request already made without `h` keeps it
    /// (``sendAsked(_:now:early:digest:sources:)``): a row written since was seen by no peer
    /// before it asked, so none of its reaped tombstones can remove it.
    private var committedCollections: Set<UTF8Key> = []
    /// Collections a peer asked this node for from 0 with `h` (it holds rows of them): what this
    /// node relays for it says `h` too, whatever this node holds.
    private var heldByAskers: Set<UTF8Key> = []
    var sessions: [LinkID: Session] = [:]
    var presenceState = PresenceState()
    private var checkpointCache: [[UInt8]: [UTF8Key: Checkpoint]] = [:]
    /// Peers to keep connected: static ones and discovered ones (Replicator+Discovery.swift).
    var endpoints: [String: Endpoint] = [:]
    private var queries: [UTF8Key: QueryResult] = [:]
    private var lastRotation: Millis?
    /// Whether deferred documents may wait in the store. `true` at start: documents deferred in
    /// an earlier run are retried on the first tick (the retry reports how many remain).
    private var deferredPending = true
    /// Evicted documents asked for again, by collection (Refetch.swift).
    private var refetching: [UTF8Key: RefetchList] = [:]
    private var nextDeferredRetry: Millis = 0
    var stopped = false
    /// Who may read and write which collection (``setAuthorization(_:now:)``).
    public private(set) var authorization: Authorization
    /// Site IDs by the peer key they are pinned to, and the pinned sites from least to most
    /// recently seen.
    private var siteOwners: [SiteID: [UInt8]] = [:]
    private var siteOrder: [SiteID] = []
    /// Each peer's last `hello`, by peer key, kept while the node runs. On a new connection to a
    /// peer whose last `hello` said it honours a subscription's epoch (`es`), this node sends its
    /// `subs` right after its own `hello` (the one-round-trip reconnect, docs/PROTOCOL.md §2,
    /// step 3); to one that said it reads compact names (`x: 1`), its `hello` leaves out its key
    /// (the channel authenticated it) and its `subs` go numbered (step 4).
    private var lastHellos: [[UInt8]: Hello] = [:]
    /// Each peer's last subscription set, as that peer would send it early on its next connection
    /// if nothing changed: every `since` advanced to the `upTo` it acknowledged here, numbered in
    /// key order. Taken when a `subs` digest from the peer matches it (docs/PROTOCOL.md §2,
    /// step 3). At most ``ReplicatorConfiguration/maxRememberedSubscriptionSets`` peers, least
    /// recently remembered first in `rememberedOrder`.
    private var rememberedSets: [[UInt8]: [WireSubscription]] = [:]
    private var rememberedOrder: [[UInt8]] = []
    /// What the rules and pins refused, and the rate limit of their log lines.
    public private(set) var refusals = AuthorizationRefusals()
    private var lastRefusalLog: Millis?
    private var unloggedRefusals = 0

    enum QueryResult: Sendable {
        case ready(Query)
        case failed(String)
    }

    /// - Parameters:
    ///   - configuration: limits and timings.
    ///   - local: this node's log.
    ///   - generations: the rescan generation of each collection (see ``evicted(_:generation:now:)``).
    ///   - heldCollections: the collections the local store holds rows of
    ///     (``WireSubscription/holds``); later merges of live documents add theirs. An array, not a `Set<String>`:
    ///     Swift compares strings by canonical equivalence, and two collections named alike in
    ///     another Unicode form are two collections.
    ///   - seed: fixes every random choice (nonces, jitter).
    public init(
        configuration: ReplicatorConfiguration, local: LocalLog, generations: [UTF8Key: UInt32] = [:],
        heldCollections: [String] = [], seed: UInt64
    ) {
        self.configuration = configuration
        self.local = local
        self.generations = generations
        self.heldCollections = Set(heldCollections.map { UTF8Key($0) })
        self.rng = SplitMix64(seed: seed)
        self.authorization = configuration.authorization
        for pin in configuration.sitePins where siteOwners[pin.site] == nil {
            siteOwners[pin.site] = pin.peerKey
            siteOrder.append(pin.site)
        }
        if siteOwners[local.site] == nil {
            siteOwners[local.site] = configuration.peerKey
            siteOrder.append(local.site)
        }
    }

    // MARK: Authorization

    /// The site pins, least recently seen first (what ``ReplicatorDirective/saveSitePins(_:)`` saves).
    public var sitePins: [SitePin] { siteOrder.map { SitePin(site: $0, peerKey: siteOwners[$0]!) } }

    /// Replaces the authorization rules. Sessions stay open: every peer's subscriptions are
    /// checked again at once (a revoked read is answered `suberr forbidden` and no longer
    /// scanned: no batch of it follows, though batches already sent may still arrive; a granted
    /// one is served from the peer's checkpoint), and what this node asks each peer for is
    /// recomputed (a collection the peer may no longer write is no longer asked for, and its
    /// batches still in flight are refused; one it may write again is asked for from the stored
    /// checkpoint).
    ///
    /// - Complexity: O(sessions × their subscriptions).
    public mutating func setAuthorization(_ rules: Authorization, now: Millis) -> [ReplicatorDirective] {
        authorization = rules
        var directives: [ReplicatorDirective] = []
        for link in sessions.keys.sorted() where sessions[link]?.phase == .established {
            directives += serve(sessions[link]!.remoteSubscriptions, on: link, now: now)
        }
        return directives + updateAsked(now: now)
    }

    /// A refusal's log line, at most one a second (with the count of those left out), so a peer
    /// repeating what it may not do cannot fill the log.
    private mutating func logRefusal(_ message: String, now: Millis) -> [ReplicatorDirective] {
        if let last = lastRefusalLog, now - last < 1_000 {
            unloggedRefusals += 1
            return []
        }
        lastRefusalLog = now
        let skipped = unloggedRefusals
        unloggedRefusals = 0
        return [.log(skipped > 0 ? "\(message) (and \(skipped) refusal(s) not logged before it)" : message)]
    }

    /// Checks a hello's site ID against the pins: a site pinned to another key is refused; an
    /// unknown one is pinned to the peer's key. Returns the directives, or `nil` when the site is
    /// fine and nothing is to be saved.
    private mutating func checkSite(_ hello: Hello, on link: LinkID, now: Millis) -> [ReplicatorDirective]? {
        if let owner = siteOwners[hello.site] {
            guard owner == hello.peerKey else {
                refusals.sites += 1
                let mine = owner == configuration.peerKey
                let message =
                    "site ID \(hello.site) is bound to "
                    + (mine ? "this node" : "peer key \(Authorization.hex(owner).prefix(16))…")
                    + ", not to this peer's key \(Authorization.hex(hello.peerKey).prefix(16))…: two keys may never "
                    + "share a site ID (a copied data directory, or a member posing as another site)"
                return logRefusal("refused \(sessions[link]!.address): \(message)", now: now)
                    + fail(link, "site", message, now)
            }
            if let index = siteOrder.lastIndex(of: hello.site), index != siteOrder.count - 1 {
                siteOrder.remove(at: index)
                siteOrder.append(hello.site)
            }
            return nil
        }
        siteOwners[hello.site] = hello.peerKey
        siteOrder.append(hello.site)
        let own = siteOrder.filter { siteOwners[$0] == hello.peerKey }
        if own.count > configuration.maxSitesPerPeer, let oldest = own.first {
            siteOwners.removeValue(forKey: oldest)
            siteOrder.removeAll { $0 == oldest }
        }
        while siteOrder.count > max(1, configuration.maxSitePins) {
            let oldest = siteOrder.removeFirst()
            if oldest == local.site {
                siteOrder.append(oldest)  // this node's own site is never dropped
                continue
            }
            siteOwners.removeValue(forKey: oldest)
        }
        return [.saveSitePins(sitePins)]
    }

    // MARK: Local subscriptions

    /// This node's own subscriptions.
    public var subscriptions: [SubscriptionSpec] { own.keys.sorted().map { own[$0]!.spec } }

    /// Asks peers for the documents matching `spec` while it is held. Two holders of one spec
    /// share it; ``unsubscribe(_:now:)`` releases one.
    ///
    /// - Throws: ``QueryParseError`` or ``QueryEvaluationError`` when the query does not parse or
    ///   bind, ``WireError`` for a bad collection name, ``ReservedArgumentError`` for an argument
    ///   named `trellisEvicted` (``Refetch/argument``); nothing changes then.
    public mutating func subscribe(_ spec: SubscriptionSpec, now: Millis) throws -> [ReplicatorDirective] {
        try SubscriptionSpec.validateCollectionName(spec.collection)
        guard spec.args[Refetch.argument] == nil else { throw ReservedArgumentError() }
        _ = try Query(spec.query).bind(args: spec.args)
        let key = UTF8Key(spec.key)
        if let held = own[key] {
            own[key] = (held.spec, held.count + 1)
            return []
        }
        own[key] = (spec, 1)
        return updateAsked(now: now)
    }

    /// Releases one ``subscribe(_:now:)`` of `spec`; peers stop being asked once none is left.
    public mutating func unsubscribe(_ spec: SubscriptionSpec, now: Millis) -> [ReplicatorDirective] {
        let key = UTF8Key(spec.key)
        guard let held = own[key] else { return [] }
        if held.count > 1 {
            own[key] = (held.spec, held.count - 1)
            return []
        }
        own.removeValue(forKey: key)
        return updateAsked(now: now)
    }

    // MARK: Static peers

    /// Keeps a connection to a static peer address, dialing it with jittered exponential backoff
    /// whenever no session with the peer behind it exists.
    /// Added while stopped, the peer is kept and first dialed by ``start(now:)``.
    public mutating func addPeer(_ endpoint: String, now: Millis) -> [ReplicatorDirective] {
        if endpoints[endpoint] != nil {
            endpoints[endpoint]?.isStatic = true  // already known by discovery
            return []
        }
        endpoints[endpoint] = Endpoint(next: now, backoff: configuration.dialBackoffInitial)
        return stopped ? [] : tick(now: now)
    }

    /// Stops dialing a static peer (an open link to it stays).
    public mutating func removePeer(_ endpoint: String) {
        endpoints.removeValue(forKey: endpoint)
    }

    /// A dial failed before a link opened (refused, unreachable, handshake failed).
    public mutating func dialFailed(_ endpoint: String, reason: String, now: Millis) -> [ReplicatorDirective] {
        guard var e = endpoints[endpoint] else { return [] }
        let first = e.lastError != reason
        e.lastError = reason
        scheduleRedial(&e, now: now)
        endpoints[endpoint] = e
        return first ? [.log("cannot connect to \(endpoint): \(reason)")] : []
    }

    private mutating func scheduleRedial(_ e: inout Endpoint, now: Millis) {
        let jitter = Double.random(in: 0.5...1.5, using: &rng)
        e.state = .idle
        e.next = now + Millis(Double(e.backoff) * jitter)
        e.backoff = min(configuration.dialBackoffMax, e.backoff * 2)
    }

    // MARK: Links

    /// A link to a peer opened: its secure channel authenticated `peerKey`.
    ///
    /// - Parameters:
    ///   - endpoint: the static peer address this link was dialed for (`nil` for inbound links).
    ///   - checkpoints: the checkpoints stored for this peer, by subscription key.
    ///   - channelNonce: a number both ends of this connection hold and no other connection
    ///     has (taken from the secure channel's handshake hash), or `nil` when the transport has
    ///     none. With one, a session with a peer met before may open resumed: one ``WireMessage/resume(_:)``
    ///     in place of the `hello` and the early `subs` (docs/PROTOCOL.md §2, step 1).
    public mutating func linkOpened(
        _ link: LinkID, peerKey: [UInt8], initiator: Bool, address: String, endpoint: String?,
        checkpoints: [UTF8Key: Checkpoint], channelNonce: UInt64? = nil, now: Millis
    ) -> [ReplicatorDirective] {
        if stopped { return [.close(link, reason: "node is stopping")] }
        // A peer that remembers this node's last hello and subscription set (its last hello said
        // so) is sent their digest alone; the connection's nonce is then the channel's, which
        // both ends hold.
        let last = lastHellos[peerKey]
        let resuming =
            channelNonce != nil && last?.resumesSessions == true && last?.resumesSubscriptions == true
            && last?.earlySubscriptions == true
        let drawn = rng.next()
        let nonce = resuming ? channelNonce! : drawn
        var session = Session(
            link: link, peerKey: peerKey, initiator: initiator, address: address, endpoint: endpoint, opened: now,
            nonce: nonce)
        session.lastSent = now
        session.localEpoch = local.epoch
        session.channelNonce = channelNonce
        sessions[link] = session
        if let endpoint, var e = endpoints[endpoint] {
            e.state = .connected(link)
            e.knownKey = peerKey
            endpoints[endpoint] = e
        }
        // No slot for a new peer: refused before any hello, so the other side never sees a session.
        if let busy = busyReason(peerKey: peerKey, endpoint: endpoint, link: link) {
            return fail(link, "busy", busy, now)
        }
        if checkpointCache[peerKey] == nil || !hasSession(with: peerKey, except: link) {
            checkpointCache[peerKey] = checkpoints
        }
        // A peer that read compact names before gets a hello without the key the channel already
        // proved; a peer of an older build would refuse it once, and its hello (sent at once,
        // without `x`) makes the next connection carry the key again.
        let hello = Hello(
            version: WireMessage.protocolVersion,
            peerKey: lastHellos[peerKey]?.compactNames == true ? [] : configuration.peerKey, site: local.site,
            epoch: local.epoch, nonce: nonce, earlySubscriptions: true, compactNames: true, caughtUpBatches: true,
            resumesSubscriptions: true, resumesSessions: true)
        if resuming {
            let asked = sendAsked(link, now: now, early: true, digest: true)
            sessions[link]?.askedEarly = true
            if let resumed = sessions[link]?.resumed {
                let digest = Self.resumeDigest(
                    hello.resumeBytes(key: configuration.peerKey), resumed.list, version: resumed.version)
                sessions[link]!.resumedHello = hello
                return [send(link, .resume(digest), now)]
            }
            return [.send(link, .hello(hello))] + asked
        }
        var directives: [ReplicatorDirective] = [.send(link, .hello(hello))]
        // A peer met before that honours subscription epochs gets the subscriptions at once,
        // each `since` with the epoch it was stored in: its batches (or "nothing new") come back
        // one round trip after the connection opens, instead of after its hello and ours crossed.
        // One that remembers subscription sets gets only the digest of that set.
        if lastHellos[peerKey]?.earlySubscriptions == true {
            directives += sendAsked(
                link, now: now, early: true, digest: lastHellos[peerKey]?.resumesSubscriptions == true)
            sessions[link]?.askedEarly = true
        }
        return directives
    }

    /// A message arrived on a link.
    public mutating func received(_ message: WireMessage, on link: LinkID, now: Millis) -> [ReplicatorDirective] {
        // No copy of the session is kept across the messages' handling: a live copy would make
        // every change to the session (the echo memory of a batch) copy it whole.
        guard let phase = sessions[link]?.phase, phase != .closed else { return [] }
        sessions[link]!.lastReceived = now
        // A keyless hello gets the channel's key, and subscriptions named by number become their
        // keys, here (compact names, docs/PROTOCOL.md §2); a number this side never gave
        // (or, for an ack, never received) names nothing: the message was in flight while the
        // set changed, or the peer is broken, and is ignored as an unknown key would be.
        guard let message = resolvingNames(message, on: link) else { return [] }
        // Messages that arrive while the ones kept before the asked hello are being taken go
        // after them.
        if sessions[link]!.takingHeld { return keepBeforeHello(message, on: link, now: now) }
        // What the peer sent before the hello this node asked for is taken, in order, once the
        // set that the peer sends right after that hello is here: its batches then merge knowing
        // which of the peer's query subscriptions hold their documents (step 5). One at a time
        // (``ReplicatorDirective/takeHeld(_:)``), each after the directives of the one before were
        // carried out, as if it had just arrived: taken in one step, a batch was judged before the
        // set's directives ran (an "ask again" that moves checkpoints back) and stored its
        // checkpoint over theirs (simulator seed 254148303046).
        if phase != .awaitingHello, !sessions[link]!.beforeHello.isEmpty, case .subscriptions = message {
            sessions[link]!.takingHeld = true
            return handle(message, phase: phase, on: link, now: now) + [.takeHeld(link)]
        }
        return handle(message, phase: phase, on: link, now: now)
    }

    /// Takes the next message the peer on `link` sent before the hello this node asked for, as
    /// if it had arrived now (``ReplicatorDirective/takeHeld(_:)``).
    ///
    /// - Returns: its directives, then another ``ReplicatorDirective/takeHeld(_:)`` while more are
    ///   kept; nothing when none are.
    public mutating func takeHeld(_ link: LinkID, now: Millis) -> [ReplicatorDirective] {
        guard let phase = sessions[link]?.phase, phase != .closed, sessions[link]!.takingHeld else { return [] }
        guard !sessions[link]!.beforeHello.isEmpty else {
            sessions[link]!.takingHeld = false
            return []
        }
        let message = sessions[link]!.beforeHello.removeFirst()
        sessions[link]!.beforeHelloBytes -= Self.documentBytes(message)
        if sessions[link]!.beforeHello.isEmpty {
            sessions[link]!.takingHeld = false
            sessions[link]!.beforeHelloBytes = 0
        }
        let directives = handle(message, phase: phase, on: link, now: now)
        return sessions[link]?.takingHeld == true ? directives + [.takeHeld(link)] : directives
    }

    /// Keeps a message the peer sent before the hello this node asked for (or while those are
    /// being taken), within ``maxMessagesBeforeHello`` messages and ``maxBytesBeforeHello`` bytes
    /// of document states; beyond, the session fails.
    private mutating func keepBeforeHello(_ message: WireMessage, on link: LinkID, now: Millis)
        -> [ReplicatorDirective]
    {
        let bytes = Self.documentBytes(message)
        guard sessions[link]!.beforeHello.count < Self.maxMessagesBeforeHello,
            sessions[link]!.beforeHelloBytes + bytes <= Self.maxBytesBeforeHello
        else {
            return fail(
                link, "protocol",
                "more than \(Self.maxMessagesBeforeHello) messages or \(Self.maxBytesBeforeHello) bytes of "
                    + "documents before the hello this node asked for", now)
        }
        sessions[link]!.beforeHello.append(message)
        sessions[link]!.beforeHelloBytes += bytes
        return []
    }

    /// Handles a message whose names are resolved, in the session's phase.
    private mutating func handle(_ message: WireMessage, phase: Phase, on link: LinkID, now: Millis)
        -> [ReplicatorDirective]
    {
        switch (phase, message) {
        case (_, .error(let code, let text)):
            return close(link, "peer closed the session: \(code): \(text)")
        case (_, .ping(let n)):
            return [send(link, .pong(n), now)]
        case (_, .pong(let n)):
            return pong(n, on: link, now: now)
        case (.awaitingHello, .hello(let hello)):
            return helloReceived(hello, on: link, now: now)
        case (.awaitingHello, .resume(let digest)):
            return resumeReceived(digest, on: link, now: now)
        case (_, .resume(let digest)) where digest == sessions[link]!.resumeTaken:
            return []  // the same resume again (a duplicating transport)
        case (_, .resume):
            return fail(link, "protocol", "hello sent twice", now)
        case (_, .helloRequest):
            return helloRequested(on: link, now: now)
        case (.awaitingHello, _) where sessions[link]!.helloAsked:
            // Sent before the hello this node asked for (answers to its early subscriptions,
            // refusals, presence): kept until that hello, within bounds.
            return keepBeforeHello(message, on: link, now: now)
        case (.awaitingHello, _):
            return fail(link, "protocol", "expected hello first", now)
        case (_, .hello(let hello)):
            if hello == sessions[link]!.remote { return [] }  // the same hello again (a duplicating transport)
            return fail(link, "protocol", "hello sent twice", now)
        case (_, .subscriptionsDigest) where sessions[link]!.remote?.resumesSubscriptions != true:
            // Only a peer that said it reads them sends one (an older build could not decode it).
            return fail(link, "protocol", "subs: missing 'subs' array", now)
        case (_, .subscriptionsRequest) where sessions[link]!.remote?.resumesSubscriptions != true:
            return fail(link, "protocol", "unknown message type 'subsreq'", now)
        case (_, .subscriptions(_, let version))
        where version != 0 && version <= sessions[link]!.remoteSubscriptionsVersion,
            (_, .subscriptionsDigest(_, let version))
        where version != 0 && version <= sessions[link]!.remoteSubscriptionsVersion:
            return []  // an older set than one already received (a reordering transport)
        case (_, .subscriptionsDigest(let digest, let version)):
            // The set the peer stands for, rebuilt from memory: taken exactly as if its `subs`
            // had come when the digests match; asked for in full otherwise.
            if let set = rememberedSets[sessions[link]!.peerKey], Self.digest(set, version: version) == digest {
                // Taken among the messages kept before the asked hello, it is handled now, not
                // queued behind the rest of them.
                let message = WireMessage.subscriptions(set, version: version)
                return sessions[link]!.takingHeld
                    ? handle(message, phase: phase, on: link, now: now) : received(message, on: link, now: now)
            }
            // Until the set comes, the peer's batches (answers to this node's own subscriptions,
            // which it may have sent early) would merge without knowing which of its query
            // subscriptions hold their documents (step 5): they are dropped, and this node's
            // subscriptions asked again once the set is here.
            sessions[link]!.awaitingSet = true
            return [send(link, .subscriptionsRequest(version: version), now)]
        case (_, .subscriptionsRequest(let version)):
            // Only the set the digest stood for, and only while no later set replaced it.
            guard let resumed = sessions[link]!.resumed, resumed.version == version,
                sessions[link]!.askedVersion == version
            else { return [] }
            sessions[link]!.resumed = nil
            return [send(link, .subscriptions(resumed.list, version: version), now)]
        case (.standby, .subscriptions(let subs, let version)):
            sessions[link]?.remoteSubscriptions = subs  // served once this link is chosen
            sessions[link]?.remoteSubscriptionsVersion = version
            return []
        case (_, .caughtUp) where sessions[link]!.remote?.caughtUpBatches != true:
            // Only a peer that said it sends them may (an older build could not decode one).
            return fail(link, "protocol", "batch: missing 'docs' array", now)
        case (.standby, .batch), (.standby, .caughtUp):
            // Answers to subscriptions sent early: asked for again if this link is chosen.
            sessions[link]?.droppedInStandby = true
            return []
        case (.established, .subscriptions(let subs, let version)):
            sessions[link]?.remoteSubscriptionsVersion = version
            guard sessions[link]!.awaitingSet else { return serve(subs, on: link, now: now) }
            // The set asked for after a digest that did not match: batches dropped meanwhile are
            // asked for again under a new generation, from the checkpoints they did not move.
            sessions[link]!.awaitingSet = false
            let dropped = sessions[link]!.droppedAwaitingSet
            sessions[link]!.droppedAwaitingSet = false
            if dropped { for key in sessions[link]!.asked.keys { sessions[link]!.resyncs[key, default: 0] &+= 1 } }
            return serve(subs, on: link, now: now) + (dropped ? sendAsked(link, now: now) : [])
        case (.established, .batch) where sessions[link]!.awaitingSet:
            sessions[link]!.droppedAwaitingSet = true
            return []
        case (.established, .batch(.key(let key), let documents, let upTo, let generation, let left)):
            noteProgress(key, documents: documents.count, left: left, on: link, now: now)
            let directives = batch(key, documents, upTo, generation, left: left, on: link, now: now)
            return directives + refetchAnswered(key, generation: generation, left: left, on: link, now: now)
        case (.established, .caughtUp(.key(let key), let generation)):
            // Nothing after the `since` this node sent: initial sync complete, nothing to merge or
            // store, and no `ack` (the peer does not count it in flight).
            if sessions[link]!.asked[UTF8Key(key)]?.generation == generation {
                sessions[link]!.endedAsked.insert(UTF8Key(key))
            }
            noteProgress(key, documents: 0, left: 0, on: link, now: now)
            if let refused = refusedWrite(key, documents: 0, on: link, now: now) { return refused }
            return refetchAnswered(key, generation: generation, left: 0, on: link, now: now)
        case (.established, .ack(.key(let subscription), let upTo, let deferred)):
            let key = UTF8Key(subscription)
            guard var served = sessions[link]?.served[key] else { return [] }
            served.inFlight = max(0, served.inFlight - 1)
            served.ackedUpTo = max(served.ackedUpTo, min(upTo, served.lastSentUpTo))
            served.lastProgress = now
            // Only the batch with exactly this `upTo` was applied (a batch before it may have been
            // postponed there), and only when the peer kept none of it aside: a deferred document
            // is not held there yet.
            var acknowledged: [ReplicatorDirective] = []
            if let index = served.unacknowledged.firstIndex(where: { $0.upTo == upTo }) {
                let entries = served.unacknowledged.remove(at: index).entries
                if !deferred { acknowledged = [.acknowledged(entries)] }
            }
            // Where what the peer holds from a whole-collection service here stands: its
            // whole-collection subscription's position, or a query subscription's that carried the
            // changes to those documents in every batch since `carriedFrom` (batches sent before a
            // rewind are acknowledged first, on an ordered link, and count for nothing).
            if served.staleBatches > 0 {
                served.staleBatches -= 1
            } else if !deferred, served.spec.isWholeCollection || (served.carriesHeld && served.carriedFrom != nil) {
                acknowledged.append(
                    .heldAcknowledged(
                        peer: sessions[link]!.peerKey, collection: served.spec.collection,
                        upTo: min(upTo, served.lastSentUpTo),
                        carriedFrom: served.spec.isWholeCollection ? nil : served.carriedFrom))
            }
            sessions[link]?.served[key] = served
            return acknowledged + scanIfReady(link, key, now: now)
        case (.established, .presence(let records)):
            return presenceReceived(records, on: link, now: now)
        case (.established, .subscriptionError(.key(let subscription), let code, let text)),
            (.standby, .subscriptionError(.key(let subscription), let code, let text)):
            // Also in standby: the answer to subscriptions sent early, which a new generation
            // would not bring again.
            let key = UTF8Key(subscription)
            guard sessions[link]?.asked[key] != nil else { return [] }
            let previous = sessions[link]?.remoteErrors[key]
            sessions[link]?.remoteErrors[key] = "\(code): \(text)"
            guard previous != "\(code): \(text)" else { return [] }
            let name = sessions[link]?.asked[key]?.spec.description ?? subscription
            let logged: [ReplicatorDirective] = [
                .log("\(sessions[link]!.address) cannot serve subscription '\(name)': \(code): \(text)")
            ]
            // The last refetch subscription the set waited for, refused: the answered ones go now.
            guard phase == .established, let spec = sessions[link]?.asked[key]?.spec, Refetch.ids(of: spec) != nil,
                !awaitsRefetchAnswers(on: link)
            else { return logged }
            return logged + sendAsked(link, now: now)
        case (.standby, .presence(let records)):
            // Taken on a link held in standby too: the peer may hold this link for the
            // established one, and sends its own record only once per `seq` (other nodes do not
            // pass on a record to the peers it lists).
            return presenceReceived(records, on: link, now: now)
        case (.standby, _):
            return []
        case (.closed, _):
            return []
        case (.established, .batch(.number, _, _, _, _)), (.established, .ack(.number, _, _)),
            (.established, .subscriptionError(.number, _, _)), (.established, .caughtUp(.number, _)):
            return []  // resolved above
        }
    }

    /// `message` with what compact names left out filled in: a `hello` without `key` carries the
    /// key the channel authenticated, and a subscription named by number
    /// (``SubscriptionName/number(_:)``) is named by its key: for a `batch` or `suberr`, a number
    /// this node gave one of its asked subscriptions; for an `ack`, one the peer gave a
    /// subscription this node serves. `nil` when the number names none.
    private func resolvingNames(_ message: WireMessage, on link: LinkID) -> WireMessage? {
        switch message {
        case .hello(var hello) where hello.peerKey.isEmpty:
            hello.peerKey = sessions[link]!.peerKey
            return .hello(hello)
        case .batch(.number(let n), let documents, let upTo, let generation, let left):
            guard let key = sessions[link]?.askedByNumber[n] else { return nil }
            return .batch(
                subscription: .key(key.string), documents: documents, upTo: upTo, generation: generation, left: left)
        case .caughtUp(.number(let n), let generation):
            guard let key = sessions[link]?.askedByNumber[n] else { return nil }
            return .caughtUp(subscription: .key(key.string), generation: generation)
        case .subscriptionError(.number(let n), let code, let text):
            guard let key = sessions[link]?.askedByNumber[n] else { return nil }
            return .subscriptionError(subscription: .key(key.string), code: code, message: text)
        case .ack(.number(let n), let upTo, let deferred):
            guard let key = sessions[link]?.servedByNumber[n] else { return nil }
            return .ack(subscription: .key(key.string), upTo: upTo, deferred: deferred)
        default:
            return message
        }
    }

    /// A message on the link did not decode: the peer is broken or hostile; close with an error.
    public mutating func receiveFailed(on link: LinkID, error: String, now: Millis) -> [ReplicatorDirective] {
        fail(link, "protocol", error, now)
    }

    /// The link closed (either side, or the transport failed).
    public mutating func linkClosed(_ link: LinkID, reason: String, now: Millis) -> [ReplicatorDirective] {
        guard let s = sessions.removeValue(forKey: link) else { return [] }
        // Only a set the peer sent (a session that ended before any leaves the memory alone), and
        // not across a new epoch (its positions count in the old log).
        if s.wasEstablished, s.remoteSubscriptionsVersion > 0, s.remote?.resumesSubscriptions == true,
            s.localEpoch == local.epoch
        {
            remember(s)
        }
        var directives: [ReplicatorDirective] = []
        if s.closeReason == nil {  // closed by this side: already logged
            let hint =
                s.remote == nil && s.initiator
                ? " (closed before any hello: check that both nodes use the same mesh key)" : ""
            directives.append(.log("session with \(s.address) ended: \(reason)\(hint)"))
        }
        if let endpoint = s.endpoint, var e = endpoints[endpoint], case .connected(link) = e.state {
            if s.remote != nil, now - s.opened >= configuration.stableSession {
                e.backoff = configuration.dialBackoffInitial
            }
            scheduleRedial(&e, now: now)
            endpoints[endpoint] = e
        }
        // A newer link waiting for this one to prove alive takes over.
        for (other, waiting) in sessions where waiting.phase == .standby && waiting.rival == link {
            directives += establish(other, now: now)
        }
        // Its subscriptions are no longer relayed, also when this node closed it (the session
        // is closed already then).
        if s.phase == .established || s.wasEstablished, !s.remoteSubscriptions.isEmpty {
            directives += updateAsked(now: now)
        }
        return directives
    }

    /// Remembers the subscription set of the peer of a session that ends, as the peer would send it
    /// early next time if nothing changed on its side: each `since` the `upTo` it acknowledged
    /// here (its checkpoint, if it stored one with each ack), with this session's epoch, numbered
    /// from 0 in key order. Only a set whose `subs` encodes to at most
    /// ``ReplicatorConfiguration/maxRememberedSubscriptionBytes`` is kept; the least recently
    /// remembered peer is forgotten beyond ``ReplicatorConfiguration/maxRememberedSubscriptionSets``.
    /// A wrong guess costs one round trip (the digest does not match), never a wrong set.
    ///
    /// - Complexity: O(the set's size + remembered peers).
    private mutating func remember(_ s: Session) {
        let peer = s.peerKey
        var set: [WireSubscription] = []
        let subs = s.remoteSubscriptions.sorted { UTF8Key($0.spec.key) < UTF8Key($1.spec.key) }
        for (n, sub) in subs.enumerated() {
            var since = sub.since
            if let served = s.served[UTF8Key(sub.spec.key)], !served.forbidden { since = served.ackedUpTo }
            set.append(
                WireSubscription(
                    spec: sub.spec, since: since, hops: sub.hops, generation: sub.generation,
                    epoch: since > 0 ? s.localEpoch : nil, deltas: sub.deltas, number: UInt32(n),
                    // From a checkpoint, `h` asks for reaped tombstones once: guessed not asked again.
                    holds: sub.holds && since == 0))
        }
        rememberedOrder.removeAll { $0 == peer }
        rememberedSets[peer] = nil
        guard subs.count <= configuration.maxServedSubscriptions,
            WireMessage.subscriptions(set, version: 1).serialized().count
                <= configuration.maxRememberedSubscriptionBytes
        else { return }
        rememberedSets[peer] = set
        rememberedOrder.append(peer)
        while rememberedOrder.count > max(0, configuration.maxRememberedSubscriptionSets) {
            rememberedSets[rememberedOrder.removeFirst()] = nil
        }
    }

    /// The digest that stands for the `subs` of `version` with `list`: the ``StateDigest`` of its
    /// serialized bytes (docs/PROTOCOL.md §2, step 3).
    static func digest(_ list: [WireSubscription], version: UInt64) -> StateDigest {
        StateDigest(WireMessage.subscriptions(list, version: version).serialized())
    }

    /// Bytes of a message are arriving on `link` (a large message on a slow link, before it is
    /// whole): the peer is alive. Without this, a batch that takes longer than
    /// ``ReplicatorConfiguration/livenessTimeout`` to cross the link (4 MiB at 2 Mbit/s) closed
    /// the session before it arrived, and the next session sent it again, for good.
    ///
    /// - Complexity: O(1).
    public mutating func linkActive(_ link: LinkID, now: Millis) {
        guard sessions[link] != nil else { return }
        sessions[link]!.lastReceived = max(sessions[link]!.lastReceived, now)
    }

    /// The link's outbound queue went above its high-water mark: stop producing bulk data for it.
    public mutating func linkCongested(_ link: LinkID) {
        sessions[link]?.congested = true
    }

    /// The link's outbound queue drained: resume.
    public mutating func linkDrained(_ link: LinkID, now: Millis) -> [ReplicatorDirective] {
        guard sessions[link]?.congested == true else { return [] }
        sessions[link]?.congested = false
        return scanAll(link, now: now)
    }

    // MARK: Local log

    /// The local store committed changes (local writes or merges from any peer) in `collections`.
    /// Only the served subscriptions on those collections scan again, and of those not the query
    /// subscriptions the store checked every changed document against and found unconcerned.
    ///
    /// - Parameters:
    ///   - unconcerned: per collection, the ``SubscriptionSpec/scopeHash`` of query
    ///     subscriptions no changed document concerns: it does not match the query, did not match
    ///     it before the commit, and is not recorded in its scope (`StoreEvent.scopeChecks`). A
    ///     collection absent, or a subscription not listed, scans as before.
    ///   - created: collections in which a local write created a document (no row, nor a reaped
    ///     tombstone kept with its state, was there): a peer may have removed and reaped a document
    ///     with its `_id`, so every peer asked in the collection without `h` is asked again with it
    ///     (``wantReapedKeys(in:besides:now:)``; the store marked their checkpoints).
    /// - Complexity: O(served subscriptions of the collections), plus, for each collection
    ///   `created`, O(checkpoints cached + subscriptions asked).
    public mutating func committed(
        collections: Set<UTF8Key>, lastSeq: Int64, unconcerned: [UTF8Key: Set<Int64>] = [:],
        created: Set<UTF8Key> = [], now: Millis
    ) -> [ReplicatorDirective] {
        local.lastSeq = max(local.lastSeq, lastSeq)
        committedCollections.formUnion(collections)
        var directives: [ReplicatorDirective] = []
        for collection in created.sorted() {
            directives += wantReapedKeys(in: collection.string, besides: nil, now: now)
        }
        for link in sessions.keys.sorted() where sessions[link]?.phase == .established {
            for key in sessions[link]!.served.keys.sorted() {
                let spec = sessions[link]!.served[key]!.spec
                let collection = UTF8Key(spec.collection)
                guard collections.contains(collection) else { continue }
                // Checked against every changed document and concerned by none: nothing of this
                // commit is for it (its next scan passes over these entries).
                if !spec.isWholeCollection, let skip = unconcerned[collection], skip.contains(spec.scopeHash) {
                    continue
                }
                sessions[link]!.served[key]!.pending = true
                directives += scanIfReady(link, key, now: now)
            }
        }
        return directives
    }

    /// The collection's rescan generation was raised (and its checkpoints reset): ask every peer
    /// again from the start for its subscriptions, a full rescan. Evictions no longer need this
    /// (``refetch(_:ids:now:)`` asks for the evicted documents only); a generation persisted by an
    /// earlier version is still sent.
    public mutating func evicted(_ collection: String, generation: UInt32, now: Millis) -> [ReplicatorDirective] {
        let name = UTF8Key(collection)
        generations[name] = generation
        for (peer, checkpoints) in checkpointCache {
            for (key, checkpoint) in checkpoints where askedCollection(key.string) == name {
                checkpointCache[peer]?[key] = Checkpoint(epoch: checkpoint.epoch, seq: 0)
            }
        }
        return updateAsked(now: now)
    }

    /// Documents of `collection` were evicted here: while a subscription in the collection (this
    /// node's own, or one it relays) is active, now or later, peers are asked for exactly these
    /// `_id`s again, through refetch subscriptions derived from each (``Refetch``), each peer
    /// until it has answered (``refetchAnswered(_:generation:left:on:now:)``), and the list is
    /// kept until all have arrived. Nothing else is asked for again. The list is kept also while
    /// no subscription is active: a node that evicted while it relayed nothing must ask for them
    /// again when it relays a subscription later, for its checkpoints on its peers' logs are past
    /// them.
    ///
    /// - Parameter ids: the evicted `_id`s; at most ``Refetch/maxPerCollection`` are kept per
    ///   collection (the newest).
    public mutating func refetch(_ collection: String, ids: [Value], now: Millis) -> [ReplicatorDirective] {
        let name = UTF8Key(collection)
        guard !ids.isEmpty else { return [] }
        var list = refetching[name] ?? RefetchList(ids: [], missing: [])
        var evicted: Set<UTF8Key> = []
        for id in ids {
            let key = UTF8Key(JSON.string(id))
            evicted.insert(key)
            // One that had arrived is listed again, even if the list still names it: the refetch
            // subscriptions then change, and a peer that served them to the end serves them anew.
            if list.missing.insert(key).inserted { list.ids.append(id) }
        }
        // Evicted (again): asked again of every peer, whatever it answered before and whatever
        // copy it was found to hold, even for a document still listed (one brought back still
        // withholding a value and evicted anew): this node holds only a stub of it now.
        for link in sessions.keys {
            for (key, answered) in sessions[link]!.refetchesAnswered where askedCollection(key.string) == name {
                sessions[link]!.refetchesAnswered[key] = answered.subtracting(evicted)
            }
            sessions[link]!.withholdingCopies[name]?.subtract(evicted)
        }
        list.keepNewest(Refetch.maxPerCollection)
        refetching[name] = list
        return updateAsked(now: now)
    }

    /// The shell started a new epoch and site ID (``ReplicatorDirective/rotateLog(reason:)``):
    /// every session restarts so peers see the new epoch.
    public mutating func logRotated(_ log: LocalLog, now: Millis) -> [ReplicatorDirective] {
        local = log
        checkpointCache.removeAll()
        rememberedSets.removeAll()
        rememberedOrder.removeAll()
        var directives: [ReplicatorDirective] = []
        if siteOwners[log.site] == nil {
            siteOwners[log.site] = configuration.peerKey
            siteOrder.append(log.site)
            directives.append(.saveSitePins(sitePins))
        }
        return directives + sessions.keys.sorted().flatMap { close($0, "this node's log was rotated (new epoch)") }
    }

    /// The store reported how many deferred documents remain after a retry (or after a merge).
    public mutating func deferredRetried(remaining: Int, now: Millis) {
        deferredPending = remaining > 0
        nextDeferredRetry = now + configuration.deferredRetryInterval
    }

    // MARK: Time

    /// Advances time: keepalives, dead links, duplicate-link probes, retries, dials.
    public mutating func tick(now: Millis) -> [ReplicatorDirective] {
        var directives: [ReplicatorDirective] = []
        for link in sessions.keys.sorted() {
            guard let s = sessions[link], s.phase != .closed else { continue }
            if now - s.lastReceived >= configuration.livenessTimeout {
                directives += close(link, "no message from the peer for \(configuration.livenessTimeout / 1000) s")
                continue
            }
            if case .standby = s.phase, now >= s.probeDeadline, let rival = s.rival {
                directives += close(rival, "replaced by a newer connection from the same peer (no answer to a probe)")
                continue
            }
            if now - s.lastSent >= configuration.keepaliveInterval {
                directives.append(send(link, .ping(rng.next()), now))
            }
            directives += askAgainAfterPostponed(link, now: now)
            if let due = s.refetchSetDue, now >= due, s.phase == .established {
                sessions[link]!.refetchSetDue = nil
                directives += sendAsked(link, now: now)
            }
            if s.reportedNeighbors == nil, !s.relayedWithoutRecord, s.phase == .established,
                now - s.opened >= Self.relayGrace
            {
                // No presence record within the grace: its subscriptions are relayed from now on.
                sessions[link]!.relayedWithoutRecord = true
                directives += updateAsked(except: link, now: now)
            }
            for key in s.served.keys.sorted() {
                guard var served = s.served[key] else { continue }
                if served.inFlight > 0, !s.congested, now - served.lastProgress >= configuration.ackTimeout {
                    // Batches sent and never acknowledged: send again from the last acknowledged point.
                    served.unacknowledgedFloor = max(served.unacknowledgedFloor, served.lastSentUpTo)
                    served.cursor = served.ackedUpTo
                    served.lastSentUpTo = served.ackedUpTo
                    served.staleBatches += served.inFlight
                    served.carriedFrom = nil
                    served.inFlight = 0
                    served.unacknowledged = []
                    served.pending = true
                    served.lastProgress = now
                } else if served.failure != nil, served.retryAt <= now, served.retryable {
                    served.failure = nil
                    served.pending = true
                } else {
                    continue
                }
                sessions[link]?.served[key] = served
                directives += scanIfReady(link, key, now: now)
            }
        }
        directives += presenceTick(now: now)
        if deferredPending, now >= nextDeferredRetry {
            nextDeferredRetry = now + configuration.deferredRetryInterval
            directives.append(.retryDeferred)
        }
        guard !stopped else { return directives }
        // Static peers are always dialed; discovered ones while session slots are free, those
        // that subscribe to the same collections as this node first.
        var free = configuration.maxSessions - sessionsInUse
        let order = endpoints.keys.sorted { a, b in
            let (pa, pb) = (endpoints[a]!.preferred, endpoints[b]!.preferred)
            return pa != pb ? pa : a < b
        }
        for name in order {
            guard let e = endpoints[name], e.state == .idle, !e.isSelf, now >= e.next else { continue }
            if let key = e.knownKey, hasSession(with: key, except: nil) { continue }
            if !e.isStatic {
                guard free > 0 else { continue }
                free -= 1
            }
            endpoints[name]?.state = .dialing
            directives.append(.dial(name))
        }
        return directives
    }

    /// Why a new session with `peerKey` cannot be taken (all ``ReplicatorConfiguration/maxSessions``
    /// slots are established sessions with other peers, and the link was not dialed to a static
    /// peer), or `nil`.
    func busyReason(peerKey: [UInt8], endpoint: String?, link: LinkID) -> String? {
        let established = sessions.values.filter { $0.phase == .established && $0.link != link }
        guard established.count >= configuration.maxSessions else { return nil }
        if let endpoint, endpoints[endpoint]?.isStatic == true { return nil }
        if established.contains(where: { $0.peerKey == peerKey }) { return nil }  // a duplicate: no new slot
        return "this node is at its limit of \(configuration.maxSessions) session(s)"
    }

    /// Established sessions plus dials of discovered peers in progress: the slots
    /// ``ReplicatorConfiguration/maxSessions`` counts.
    var sessionsInUse: Int {
        sessions.values.filter { $0.phase == .established }.count
            + endpoints.values.filter { !$0.isStatic && $0.state == .dialing }.count
    }

    /// Whether the replicator is stopped (``stop()``): no dials, and new links are closed.
    public var isStopped: Bool { stopped }

    /// Closes every link and stops dialing. Static peers and subscriptions are kept for
    /// ``start(now:)``.
    public mutating func stop() -> [ReplicatorDirective] {
        stopped = true
        for name in endpoints.keys { endpoints[name]!.state = .idle }
        return sessions.keys.sorted().flatMap { close($0, "node is stopping") }
    }

    /// Resumes after ``stop()``: static peers are dialed again at once, with their backoff reset.
    /// Does nothing when running.
    public mutating func start(now: Millis) -> [ReplicatorDirective] {
        guard stopped else { return [] }
        stopped = false
        for name in endpoints.keys {
            endpoints[name]!.state = .idle
            endpoints[name]!.next = now
            endpoints[name]!.backoff = configuration.dialBackoffInitial
            endpoints[name]!.lastError = nil
        }
        return tick(now: now)
    }

    // MARK: Scans and merges

    /// The result of a ``ReplicatorDirective/scan(_:_:)``.
    public mutating func scanned(_ link: LinkID, _ request: ScanRequest, page: ScanPage, now: Millis)
        -> [ReplicatorDirective]
    {
        let key = UTF8Key(request.subscription)
        // A subscription revoked while its scan ran sends nothing of it.
        guard sessions[link]?.phase == .established, var served = sessions[link]?.served[key], !served.forbidden
        else { return [] }
        served.scanning = false
        guard request.after == served.cursor, request.reapedBacklog == served.nextReapedBacklog else {
            // The peer rewound this subscription while the scan ran: scan again from the new cursor.
            served.pending = true
            sessions[link]!.served[key] = served
            return scanIfReady(link, key, now: now)
        }
        served.retryDelay = configuration.scanRetryInitial
        if let backlog = request.reapedBacklog {
            return reapedBacklogScanned(link, key, served, backlog, page, now: now)
        }
        var documents: [WireDocument] = []
        var directives: [ReplicatorDirective] = []
        if page.belowFloor, !served.floorChecked {
            // The peer's checkpoint is older than tombstones reaped here: start over from 0, with
            // the tombstones reaped after its checkpoint among the pages (ScanRequest.reapedAfter):
            // the peer may hold any of those documents, and nothing else would remove them there.
            served.floorChecked = true
            served.reapedAfter = min(served.reapedAfter ?? .max, request.after)
            Self.rewind(&served, to: 0)
            sessions[link]!.served[key] = served
            return restartedBelowFloor(link, served.spec, now: now) + scanIfReady(link, key, now: now)
        }
        // Later pages follow cursors this node produced in this session. They carry the
        // tombstones reaped after the peer's checkpoint (it may hold those documents), or, served
        // from 0, those reaped from now on: a tombstone can be reaped before the scan reaches it
        // (all of them, from the start, for a peer that said it holds rows: set on receipt).
        served.floorChecked = true
        if served.reapedAfter == nil { served.reapedAfter = served.since > 0 ? served.since : page.floor }
        served.carriesHeld = page.heldFrom != nil
        if let from = page.heldFrom, let carried = served.carriedFrom, from < carried {
            // The peer holds documents from a whole-collection service whose changes after `from`
            // no page of this subscription carried before `carried` (it began carrying them only
            // now, its cursor past them): read again from `from`, carrying them from there.
            Self.rewind(&served, to: from)
            served.carriedFrom = from
            served.floorChecked = from == 0
            sessions[link]!.served[key] = served
            return scanIfReady(link, key, now: now)
        }
        var bytes = 0
        var unacknowledged: [AcknowledgedEntry] = []
        var sent: [String] = []
        // A refetch asks for documents the peer evicted, including those it once sent here.
        let refetch = Refetch.ids(of: served.spec) != nil
        // Looked at once per page: the page only takes entries out of the memory.
        let mayBeEcho = !refetch && !sessions[link]!.echo.isEmpty
        for record in page.records where record.seq > served.cursor {
            if mayBeEcho, let digest = sessions[link]!.echo.digest(of: record.key, in: record.document.collection) {
                if digest == StateDigest(record.document.state) { continue }  // exactly what this peer sent us
                sessions[link]!.echo.forget(record.key, in: record.document.collection)
            }
            // A delta goes to a peer that asked for deltas on a whole-collection subscription (it
            // holds every document of it) and has acknowledged the entry's base here; it checks that
            // it holds the base, and asks for the whole state otherwise.
            var document = record.document
            // Only a peer that said `x: 1` reads the compact delta form (docs/PROTOCOL.md §3); an
            // earlier build with deltas gets whole states.
            if served.deltas, sessions[link]!.remote?.compactNames == true, !refetch, served.spec.isWholeCollection,
                let delta = record.delta,
                delta.baseSeq <= served.ackedUpTo, delta.bytes.count < document.state.count
            {
                document.state = delta.bytes
            }
            guard document.state.count <= configuration.maxStateBytes else {
                directives.append(
                    .log(
                        "document \(record.key) in \(record.document.collection) is not sent to \(sessions[link]!.address): "
                            + "its state is \(document.state.count) bytes, above the "
                            + "\(configuration.maxStateBytes)-byte limit of one message"))
                continue
            }
            documents.append(document)
            bytes += document.state.count
            sent.append(record.key)
            if record.holdsUnacknowledgedWrite {
                unacknowledged.append(
                    AcknowledgedEntry(
                        collection: record.document.collection, key: record.key, seq: record.seq,
                        isEvictionStub: record.isEvictionStub, isTombstone: record.isTombstone))
            }
        }
        served.cursor = max(served.cursor, page.upTo)
        if !page.exhausted { served.pending = true }
        // What is left: counted now and then, estimated in between (each page examined at most
        // `limit` entries), never below 1 before the end.
        if page.exhausted {
            served.remainingEstimate = 0
            served.pagesSinceCount = 0
        } else if let counted = page.remaining {
            served.remainingEstimate = counted
            served.pagesSinceCount = 1
        } else if let estimate = served.remainingEstimate {
            served.remainingEstimate = max(1, estimate - Int64(request.limit))
        }
        // The first time the end of the log is reached, a batch goes even when it carries nothing:
        // its `left: 0` tells the peer its initial sync of this subscription is complete.
        if documents.isEmpty, page.exhausted, !served.reachedEnd, served.cursor == served.since,
            sessions[link]!.remote?.caughtUpBatches == true, !served.sentReapedBacklog
        {
            // Nothing after the peer's `since` (this generation's): a caught-up batch, which moves
            // nothing there, is never acknowledged and so counts in no flow control (in flight,
            // unacknowledged writes, ack timeout, progress). docs/PROTOCOL.md §2, step 5.
            served.reachedEnd = true
            directives.append(
                send(link, .caughtUp(subscription: .key(request.subscription), generation: served.generation), now))
        } else if !documents.isEmpty
            || (page.exhausted && (served.cursor > served.lastSentUpTo || !served.reachedEnd))
        {
            if page.exhausted { served.reachedEnd = true }
            directives.append(
                send(
                    link,
                    .batch(
                        subscription: .key(request.subscription), documents: documents, upTo: served.cursor,
                        generation: served.generation, left: served.remainingEstimate),
                    now))
            if served.inFlight == 0 { served.lastProgress = now }
            served.inFlight += 1
            served.lastSentUpTo = served.cursor
            // An ack names only `upTo`: a second batch with the same `upTo` (the empty end-of-log
            // batch after a cut page, or a batch resent after a reset while the old one may still
            // be acknowledged) makes it ambiguous, so neither batch acknowledges writes.
            let ambiguous =
                served.cursor <= served.unacknowledgedFloor
                || served.unacknowledged.contains { $0.upTo == served.cursor }
            served.unacknowledged.removeAll { $0.upTo == served.cursor }
            if !unacknowledged.isEmpty, !ambiguous {
                served.unacknowledged.append((served.cursor, unacknowledged))
                // Batches whose acks never came (postponed there) are forgotten: their writes
                // stay unacknowledged in the store, which only keeps more on an eviction.
                if served.unacknowledged.count > 2 * configuration.maxInFlight {
                    served.unacknowledged.removeFirst()
                }
            }
        }
        sessions[link]!.served[key] = served
        return directives + statesSent(sent, in: request.spec.collection, on: link, now: now)
            + scanIfReady(link, key, now: now)
    }

    /// A page of the tombstones reaped at or below the `since` of a peer that asked with `h`
    /// from a checkpoint (``Served/reapedBacklog``): sent as a batch whose `upTo` is the cursor,
    /// which does not move, with `left` above 0 (more follows: the rest of the backlog, then the
    /// scan from the cursor). The peer merges them as any tombstone; its checkpoint says it
    /// still wants them until a batch moves past the cursor or ends (`left: 0`).
    private mutating func reapedBacklogScanned(
        _ link: LinkID, _ key: UTF8Key, _ served: Served, _ backlog: ReapedBacklog, _ page: ScanPage, now: Millis
    ) -> [ReplicatorDirective] {
        var served = served
        served.reapedBacklogAfter = max(served.reapedBacklogAfter, page.upTo)
        if page.exhausted || served.reapedBacklogAfter >= backlog.through { served.reapedBacklog = nil }
        served.pending = true
        let documents = page.records.map(\.document).filter { $0.state.count <= configuration.maxStateBytes }
        var directives: [ReplicatorDirective] = []
        // The end is told by a batch the peer stores, also when no tombstone was reaped here.
        served.sentReapedBacklog = true
        if !documents.isEmpty {
            directives.append(
                send(
                    link,
                    .batch(
                        subscription: .key(key.string), documents: documents, upTo: served.cursor,
                        generation: served.generation, left: max(1, served.remainingEstimate ?? 1)),
                    now))
            if served.inFlight == 0 { served.lastProgress = now }
            served.inFlight += 1
            served.lastSentUpTo = max(served.lastSentUpTo, served.cursor)
        }
        sessions[link]!.served[key] = served
        return directives + scanIfReady(link, key, now: now)
    }

    /// States of these documents went to the peer: it may hold them as this node sent them, and
    /// would not send those states back (its echo memory, which lasts the connection), so an
    /// answer to a refetch of them says nothing of what may reach it later (a third node sending
    /// it that state again after it evicted its own copy). They are asked of it again, and a
    /// later answer does not count for them on this connection
    /// (``refetchAnswered(_:generation:left:on:now:)``). Past ``ReplicatorConfiguration/echoMemory``
    /// documents sent, no answer counts on the connection any more.
    private mutating func statesSent(_ keys: [String], in collection: String, on link: LinkID, now: Millis)
        -> [ReplicatorDirective]
    {
        guard !keys.isEmpty, sessions[link] != nil, !sessions[link]!.answersUntrusted else { return [] }
        let name = UTF8Key(collection)
        if sessions[link]!.sentKeys.count + keys.count > configuration.echoMemory {
            sessions[link]!.answersUntrusted = true
            sessions[link]!.sentKeys = []
            let had = !sessions[link]!.refetchesAnswered.isEmpty
            sessions[link]!.refetchesAnswered = [:]
            return had ? sendAsked(link, now: now) : []
        }
        sessions[link]!.sentKeys.formUnion(keys.lazy.map { EchoMemory.hash(collection: collection, key: $0) })
        // Most pages find no refetch answered: the keys are not hashed again for nothing.
        guard !sessions[link]!.refetchesAnswered.isEmpty else { return [] }
        let sent = Set(keys.lazy.map { UTF8Key($0) })
        var changed = false
        for (base, answered) in sessions[link]!.refetchesAnswered
        where askedCollection(base.string) == name && !answered.isDisjoint(with: sent) {
            sessions[link]!.refetchesAnswered[base] = answered.subtracting(sent)
            changed = true
        }
        return changed ? sendAsked(link, now: now) : []
    }

    /// A scan failed (SQLite refused the query, an I/O error): this subscription alone stops, its
    /// cursor stays, the peer is told, and the scan is retried with backoff.
    public mutating func scanFailed(_ link: LinkID, _ request: ScanRequest, error: String, now: Millis)
        -> [ReplicatorDirective]
    {
        let key = UTF8Key(request.subscription)
        guard sessions[link]?.phase == .established, var served = sessions[link]?.served[key], !served.forbidden
        else { return [] }
        served.scanning = false
        let changed = served.failure != error
        served.failure = error
        served.retryable = true
        served.retryAt = now + served.retryDelay
        served.retryDelay = min(configuration.scanRetryMax, served.retryDelay * 2)
        sessions[link]!.served[key] = served
        guard changed else { return [] }
        return [
            send(
                link, .subscriptionError(subscription: .key(request.subscription), code: "unavailable", message: error),
                now),
            .log("cannot serve '\(served.spec)' to \(sessions[link]!.address): \(error)"),
        ]
    }

    /// The keys of the query subscriptions in `collection` among those served to a peer
    /// (`served`), in key order, except those it may not read: the subscriptions that record
    /// what the peer sends there as held by it.
    static func queryHolders(_ served: [UTF8Key: Served], in collection: String) -> [UTF8Key] {
        served.keys.sorted().filter { key in
            let holder = served[key]!
            return !holder.forbidden && !holder.spec.isWholeCollection
                && UTF8Key.equal(holder.spec.collection, collection)
        }
    }

    /// Where the scans of `holders` (the query subscriptions served to a batch's sender in its
    /// collection) stand (``ApplyRequest/heldScans``), for those counted on to send the
    /// documents the sender holds: a subscription of a query, not a refetch (whose pages read
    /// only its `_id`s), whose scans have not failed (a failed one may never scan again).
    ///
    /// The host runs a merge and scans one at a time (``ReplicatorDirective``), so a scan asked
    /// for before the merge and not yet run reads the rows as the merge leaves them.
    static func heldScans(_ holders: [Served]) -> [String: HeldScan] {
        var scans: [String: HeldScan] = [:]
        for holder in holders where Refetch.ids(of: holder.spec) == nil && holder.failure == nil && holder.query != nil
        {
            scans[holder.spec.key] = HeldScan(since: holder.since, cursor: holder.cursor)
        }
        return scans
    }

    /// A ``ReplicatorDirective/apply(_:_:)`` committed.
    ///
    /// - Parameters:
    ///   - checkpointStored: whether the checkpoint was written with it.
    ///   - deferred: how many documents the store kept aside to retry (clock, size, invalid,
    ///     decoding). A batch the store refused whole for the per-peer bound on deferred documents
    ///     is reported to ``applyPostponed(_:subscription:reason:now:)`` instead.
    ///   - withholding: the `_id`s of documents the batch brought that still withhold a value
    ///     (an evicted document's stub brought back by an older copy than the one evicted):
    ///     asked again of the other peers (``askElsewhere(_:in:answeredBy:now:)``).
    ///   - heldBehind: the peer sent older states than this node's of documents whose rows its
    ///     query subscriptions' scans have not read yet (``ApplyRequest/heldScans``):
    ///     those scans are made to run, whatever the commits since their last one concerned.
    ///   - reapedKeys: what the stored checkpoint says of the peer's reaped tombstones
    ///     (``ApplyRequest/reapedKeys``).
    ///   - broughtLive: the batch brought documents that may be live, applied or kept aside
    ///     (``MergeOutcome/live``):
    ///     every other peer this node asked from 0 without `h` in the collection is asked again
    ///     for its reaped tombstones (``wantReapedKeys(in:besides:now:)``).
    public mutating func applied(
        _ link: LinkID, subscription key: String, upTo: Int64, checkpointStored: Bool,
        reapedKeys: ReapedKeys = .received, endsScan: Bool = false, deferred: Int, withholding: [Value] = [],
        heldBehind: Bool = false, broughtLive: Bool = false, now: Millis
    ) -> [ReplicatorDirective] {
        let collection = SubscriptionSpec.collection(ofKey: key)
        // Whatever became of the session: the store marked the other peers' checkpoints.
        let wanted = broughtLive ? wantReapedKeys(in: collection, besides: link, now: now) : []
        guard let s = sessions[link], s.phase == .established, let remote = s.remote else {
            return wanted + endRefetchIfAllArrived(collection, now: now)
        }
        if endsScan, checkpointStored, s.asked[UTF8Key(key)] != nil {
            sessions[link]!.endedAsked.insert(UTF8Key(key))
        }
        var scans: [ReplicatorDirective] = wanted
        if heldBehind {
            for served in Self.queryHolders(s.served, in: collection) {
                sessions[link]!.served[served]!.pending = true
                scans += scanIfReady(link, served, now: now)
            }
        }
        if checkpointStored {
            checkpointCache[s.peerKey, default: [:]][UTF8Key(key)] = Checkpoint(
                epoch: remote.epoch, seq: upTo, reapedKeys: reapedKeys)
        }
        if deferred > 0, !deferredPending {
            deferredPending = true
            nextDeferredRetry = now + configuration.deferredRetryInterval
        }
        // A subscription no longer asked (a refetch answered to the end, one cancelled) gets no
        // `ack`: the peer took the set without it first (one connection delivers in order) and
        // ignores it, and named by key a refetch's would carry its 256 `_id`s.
        let ack =
            s.asked[UTF8Key(key)] == nil
            ? [] : [send(link, .ack(subscription: .key(key), upTo: upTo, deferred: deferred > 0), now)]
        guard !withholding.isEmpty else { return ack + scans + endRefetchIfAllArrived(collection, now: now) }
        return ack + scans + askElsewhere(withholding, in: collection, answeredBy: link, now: now)
    }

    /// Live documents of `collection` arrived from the peer on `link`, or (`link` `nil`) a local
    /// write created one: they may be copies of documents another peer removed and reaped, or new
    /// documents with their `_id`s, and those reaped tombstones reach this node only when it asks
    /// with `h` (docs/PROTOCOL.md §2 step 5). Every other peer whose checkpoint in the collection
    /// is ``ReapedKeys/notAsked`` now wants them (the store marked its rows in the same
    /// transaction); and every other connected peer this node asked in the collection from 0
    /// without `h`, or whose checkpoint now wants them, is asked again under a new generation,
    /// from its checkpoint, with `h`.
    ///
    /// - Complexity: O(checkpoints cached + subscriptions asked of the other peers).
    private mutating func wantReapedKeys(in collection: String, besides link: LinkID?, now: Millis)
        -> [ReplicatorDirective]
    {
        let name = UTF8Key(collection)
        // The collection is held from now on: a subscription asked from 0 says `h`.
        heldCollections.insert(name)
        // A session gone meanwhile names no sender: the store marked the checkpoints, which the
        // next session with each peer reads.
        var sender: [UInt8]?
        if let link {
            guard let key = sessions[link]?.peerKey else { return [] }
            sender = key
        }
        for peer in checkpointCache.keys where peer != sender {
            for (key, checkpoint) in checkpointCache[peer]!
            where checkpoint.reapedKeys == .notAsked && askedCollection(key.string) == name {
                checkpointCache[peer]![key]!.reapedKeys = .wanted
            }
        }
        // Each other established session asking the collection without `h` asks again: those
        // requests now say `h` (a new generation each, ``sendAsked(_:now:early:digest:sources:)``).
        var directives: [ReplicatorDirective] = []
        for other in sessions.keys.sorted() where other != link {
            guard let session = sessions[other], session.phase == .established, session.peerKey != sender,
                session.remote != nil,
                session.asked.contains(where: { key, asked in
                    !asked.holds && askedCollection(key.string) == name && Refetch.ids(of: asked.spec) == nil
                })
            else { continue }
            directives += sendAsked(other, now: now)
        }
        return directives
    }

    /// Documents of `collection` that the peer on `link` sent, and that still withhold a value
    /// after the merge: a stub brought back by a copy older than the one evicted here, whose
    /// newest value another peer may hold (docs/MESH.md, "Eviction"). They go on the refetch
    /// list as if evicted, counted as answered by that peer on this connection, so the other
    /// peers are asked for them once each (per connection), and a whole copy ends it.
    ///
    /// Nothing loops: a peer whose copy still withholds the value is not asked for it again on
    /// this connection, whatever this node sends it (``Session/withholdingCopies``); a document
    /// no peer holds whole stays listed like an evicted one no peer has (asked once per peer and
    /// connection); and refetch subscriptions are relayed one hop only (``wanted(for:now:sources:)``).
    private mutating func askElsewhere(_ ids: [Value], in collection: String, answeredBy link: LinkID?, now: Millis)
        -> [ReplicatorDirective]
    {
        let name = UTF8Key(collection)
        var list = refetching[name] ?? RefetchList(ids: [], missing: [])
        let keys = ids.map { UTF8Key(JSON.string($0)) }
        for (id, key) in zip(ids, keys) where list.missing.insert(key).inserted {
            if !list.ids.contains(id) { list.ids.append(id) }
        }
        list.keepNewest(Refetch.maxPerCollection)
        refetching[name] = list
        if let link, sessions[link] != nil { sessions[link]!.withholdingCopies[name, default: []].formUnion(keys) }
        return updateAsked(now: now)
    }

    /// Documents of `collection` that a retry of deferred documents applied and that still
    /// withhold a value (a stub brought back by an older copy held back for the clock): asked
    /// again of every peer, as ``applied(_:subscription:upTo:checkpointStored:deferred:withholding:now:)``
    /// does for a batch's.
    public mutating func stillWithholding(_ ids: [Value], in collection: String, now: Millis)
        -> [ReplicatorDirective]
    {
        guard !ids.isEmpty else { return [] }
        return askElsewhere(ids, in: collection, answeredBy: nil, now: now)
    }

    /// The store could not take a batch now because too many of this peer's documents already
    /// wait to be retried. The batch is not acknowledged; until the subscription is asked again,
    /// batches behind it are merged without storing their checkpoint, so the checkpoint never
    /// passes the postponed documents. After ``ReplicatorConfiguration/deferredRetryInterval``
    /// (a deferred retry has run meanwhile) the subscription is asked again from its last stored
    /// checkpoint under a new generation, and the peer sends the postponed documents again. So
    /// a peer whose documents keep being postponed costs at most one round of batches per
    /// interval, never a loop.
    public mutating func applyPostponed(_ link: LinkID, subscription key: String, reason: String, now: Millis)
        -> [ReplicatorDirective]
    {
        if !deferredPending {
            deferredPending = true
            nextDeferredRetry = now
        }
        let name = UTF8Key(key)
        guard sessions[link]?.phase == .established, sessions[link]?.asked[name] != nil,
            sessions[link]?.postponed[name] == nil
        else { return [] }
        sessions[link]!.postponed[name] = now + configuration.deferredRetryInterval
        return [.log("postponed a batch from \(sessions[link]!.address): \(reason)")]
    }

    /// The store could not apply a delta of a batch (it does not hold the state the delta is based
    /// on: evicted, damaged, or never received; or it would not apply the state now): nothing of
    /// the batch from there was applied, no checkpoint was stored and no `ack` goes. The
    /// subscription is asked for again at once from its stored checkpoint under a new generation,
    /// without deltas for the rest of the session, so the peer sends whole states, which take the
    /// usual way (deferred, if they must be). Batches of the old generation still in flight store
    /// no checkpoint. A second refusal for the same subscription (a batch in flight, or a peer
    /// sending deltas unasked) asks nothing more.
    public mutating func applyNeedsWholeStates(
        _ link: LinkID, subscription key: String, reason: String, now: Millis
    ) -> [ReplicatorDirective] {
        let name = UTF8Key(key)
        guard sessions[link]?.phase == .established, sessions[link]?.asked[name] != nil,
            !sessions[link]!.noDeltas.contains(name)
        else { return [] }
        sessions[link]!.noDeltas.insert(name)
        sessions[link]!.resyncs[name, default: 0] &+= 1
        return [.log("asked \(sessions[link]!.address) again for whole states: \(reason)")] + sendAsked(link, now: now)
    }

    /// Asks again for the subscriptions whose batches were postponed, once their delay is over.
    private mutating func askAgainAfterPostponed(_ link: LinkID, now: Millis) -> [ReplicatorDirective] {
        guard let s = sessions[link], s.phase == .established, !s.postponed.isEmpty else { return [] }
        let due = s.postponed.filter { $0.value <= now }.keys
        guard !due.isEmpty else { return [] }
        for name in due {
            sessions[link]!.postponed[name] = nil
            sessions[link]!.resyncs[name, default: 0] &+= 1
        }
        return sendAsked(link, now: now)
    }

    /// A merge failed (disk full, I/O error): nothing was acknowledged and the checkpoint did
    /// not move (pieces of the batch committed before the failure stay: merging them again
    /// changes nothing); the session restarts from the stored checkpoint. Those pieces may have
    /// kept documents aside, so a deferred retry is scheduled, as when a batch defers documents:
    /// they are retried even if the peer never sends the batch again.
    public mutating func applyFailed(_ link: LinkID, subscription key: String, error: String, now: Millis)
        -> [ReplicatorDirective]
    {
        if !deferredPending {
            deferredPending = true
            nextDeferredRetry = now + configuration.deferredRetryInterval
        }
        return close(link, "merging a batch failed: \(error)")
    }

    // MARK: Status

    /// A snapshot of every session and static peer, for `peers` and `status`.
    public var status: ReplicatorStatus {
        ReplicatorStatus(
            peers: sessions.values.sorted { $0.link < $1.link }.map { s in
                ReplicatorStatus.Peer(
                    link: s.link, peerKey: s.peerKey, address: s.address, initiator: s.initiator,
                    phase: "\(s.phase)", siteID: s.remote?.site,
                    served: s.served.keys.sorted().map { key in
                        let v = s.served[key]!
                        return .init(spec: v.spec, hops: v.hops, cursor: v.cursor, error: v.failure)
                    },
                    asked: s.asked.keys.sorted().map { key in
                        let v = s.asked[key]!
                        return .init(
                            spec: v.spec, hops: v.hops, cursor: v.since, error: s.remoteErrors[key],
                            progress: s.progress[key] ?? SyncProgress())
                    })
            },
            endpoints: endpoints.keys.sorted().map { name in
                let e = endpoints[name]!
                return .init(address: name, state: "\(e.state)", lastError: e.lastError)
            },
            presence: presence, incompatible: incompatiblePeers)
    }

    // MARK: - Internals

    func hasSession(with peerKey: [UInt8], except link: LinkID?) -> Bool {
        sessions.contains { $0.key != link && $0.value.peerKey == peerKey && $0.value.phase == .established }
    }

    mutating func send(_ link: LinkID, _ message: WireMessage, _ now: Millis) -> ReplicatorDirective {
        sessions[link]?.lastSent = now
        return .send(link, compactingNames(message, on: link))
    }

    /// `message` with its subscription named by number where the other side reads that (its
    /// `hello` said `x: 1`): a `batch` or `suberr` for a subscription the peer numbered (its
    /// entries then without `c`, which is the subscription's), an `ack` for one this node
    /// numbered (docs/PROTOCOL.md §2 step 4).
    private func compactingNames(_ message: WireMessage, on link: LinkID) -> WireMessage {
        // A peer that never said `x: 1` is answered by key, even where its `subs` numbered
        // (docs/PROTOCOL.md §2 step 4).
        guard let s = sessions[link], s.remote?.compactNames == true else { return message }
        switch message {
        case .batch(.key(let key), var documents, let upTo, let generation, let left):
            guard let number = s.servedNumbers[UTF8Key(key)] else { return message }
            let collection = SubscriptionSpec.collection(ofKey: key)
            for k in documents.indices where UTF8Key.equal(documents[k].collection, collection) {
                documents[k].collection = ""
            }
            return .batch(
                subscription: .number(number), documents: documents, upTo: upTo, generation: generation, left: left)
        case .caughtUp(.key(let key), let generation):
            guard let number = s.servedNumbers[UTF8Key(key)] else { return message }
            return .caughtUp(subscription: .number(number), generation: generation)
        case .subscriptionError(.key(let key), let code, let text):
            guard let number = s.servedNumbers[UTF8Key(key)] else { return message }
            return .subscriptionError(subscription: .number(number), code: code, message: text)
        case .ack(.key(let key), let upTo, let deferred):
            guard let number = s.askedNumbers[UTF8Key(key)] else { return message }
            return .ack(subscription: .number(number), upTo: upTo, deferred: deferred)
        default:
            return message
        }
    }

    private mutating func close(_ link: LinkID, _ reason: String) -> [ReplicatorDirective] {
        guard var s = sessions[link], s.phase != .closed else { return [] }
        s.phase = .closed
        s.closeReason = reason
        sessions[link] = s
        return [.log("closing session with \(s.address): \(reason)"), .close(link, reason: reason)]
    }

    private mutating func fail(_ link: LinkID, _ code: String, _ message: String, _ now: Millis)
        -> [ReplicatorDirective]
    {
        guard sessions[link]?.phase != .closed else { return [] }
        return [send(link, .error(code: code, message: message), now)] + close(link, "\(code): \(message)")
    }

    private mutating func helloReceived(_ hello: Hello, on link: LinkID, now: Millis) -> [ReplicatorDirective] {
        let s = sessions[link]!
        guard hello.version == WireMessage.protocolVersion else {
            noteIncompatible(hello, address: s.address, now: now)
            if let endpoint = s.endpoint {
                endpoints[endpoint]?.lastError = "incompatible: protocol version \(hello.version)"
            }
            return fail(
                link, "version",
                "protocol version \(hello.version) is not supported; this node speaks \(WireMessage.protocolVersion)",
                now)
        }
        guard hello.peerKey == s.peerKey else {
            return fail(link, "identity", "hello names a peer key other than the one the channel authenticated", now)
        }
        sessions[link]!.remote = hello
        lastHellos[hello.peerKey] = hello
        if hello.peerKey == configuration.peerKey {
            if let endpoint = s.endpoint { endpoints[endpoint]?.isSelf = true }
            return close(link, "connected to itself")
        }
        var pinned: [ReplicatorDirective] = []
        if let checked = checkSite(hello, on: link, now: now) {
            guard sessions[link]?.phase != .closed else { return checked }
            pinned = checked
        }
        // One session per pair: an established link to the same peer must prove alive first.
        if let rival = sessions.values.first(where: {
            $0.link != link && $0.peerKey == hello.peerKey && $0.phase == .established
        }) {
            let probe = rng.next()
            sessions[link]!.phase = .standby
            sessions[link]!.rival = rival.link
            sessions[link]!.probe = probe
            sessions[link]!.probeDeadline = now + configuration.duplicateProbeTimeout
            return pinned + [send(rival.link, .ping(probe), now)]
        }
        if let busy = busyReason(peerKey: hello.peerKey, endpoint: s.endpoint, link: link) {
            return pinned + fail(link, "busy", busy, now)
        }
        return pinned + establish(link, now: now)
    }

    /// At most this many messages, with at most this many bytes of document states, are kept from
    /// a peer between this node's ``WireMessage/helloRequest`` and the peer's `hello`: one round
    /// trip of what it sends, bounded by its flow control; a peer that sends more is closed.
    static let maxMessagesBeforeHello = 4096
    static let maxBytesBeforeHello = 256 << 20

    /// The bytes of document states a message carries (0 for all but batches).
    static func documentBytes(_ message: WireMessage) -> Int {
        guard case .batch(_, let documents, _, _, _) = message else { return 0 }
        return documents.reduce(0) { $0 + $1.state.count }
    }

    /// The digest a ``WireMessage/resume(_:)`` carries: of the `hello` as
    /// ``Hello/resumeBytes(key:)`` encodes it, then of the `subs` of `version` with `list`.
    static func resumeDigest(_ hello: [UInt8], _ list: [WireSubscription], version: UInt64) -> StateDigest {
        StateDigest(hello + WireMessage.subscriptions(list, version: version).serialized())
    }

    /// A peer opened the connection with a ``WireMessage/resume(_:)``: taken as its last `hello`
    /// (with the channel's nonce) and its last subscription set as version 1, when this node
    /// remembers both and they have the digest; otherwise the peer is asked for its `hello`
    /// (``WireMessage/helloRequest``), and what it sends before that is kept and taken after it.
    private mutating func resumeReceived(_ digest: StateDigest, on link: LinkID, now: Millis) -> [ReplicatorDirective] {
        let s = sessions[link]!
        if !s.helloAsked, let nonce = s.channelNonce, var hello = lastHellos[s.peerKey],
            let set = rememberedSets[s.peerKey],
            Self.resumeDigest(hello.resumeBytes(key: s.peerKey), set, version: 1) == digest
        {
            hello.peerKey = s.peerKey
            hello.nonce = nonce
            sessions[link]!.resumeTaken = digest
            let opened = helloReceived(hello, on: link, now: now)
            return opened + received(.subscriptions(set, version: 1), on: link, now: now)
        }
        if s.helloAsked { return [] }
        sessions[link]!.helloAsked = true
        return [send(link, .helloRequest, now)]
    }

    /// The peer could not take this node's ``WireMessage/resume(_:)``: its `hello` and its
    /// subscription set go in full, once per connection. What this node sent before (on a session
    /// already established here: answers to the peer's set, presence) the peer takes after the
    /// `hello`.
    private mutating func helloRequested(on link: LinkID, now: Millis) -> [ReplicatorDirective] {
        guard let hello = sessions[link]!.resumedHello else { return [] }
        sessions[link]!.resumedHello = nil
        sessions[link]!.resumed = nil
        let s = sessions[link]!
        let list = s.asked.values.sorted { UTF8Key($0.spec.key) < UTF8Key($1.spec.key) }
        return [send(link, .hello(hello), now), send(link, .subscriptions(list, version: s.askedVersion), now)]
    }

    private mutating func pong(_ n: UInt64, on link: LinkID, now: Millis) -> [ReplicatorDirective] {
        // A pong on an established link may answer a duplicate probe: the older link is alive.
        guard
            let (waiting, _) = sessions.first(where: {
                $0.value.phase == .standby && $0.value.rival == link && $0.value.probe == n
            })
        else { return [] }
        let keepNew = Self.tieBreakKey(sessions[waiting]!, ours: configuration.peerKey)
            .lexicographicallyPrecedes(Self.tieBreakKey(sessions[link]!, ours: configuration.peerKey))
        if keepNew {
            return close(link, "duplicate connection to the same peer (the other one is kept)")
        }
        return close(waiting, "duplicate connection to the same peer (the other one is kept)")
    }

    /// Both ends of two links between the same pair compute the same key for each link: the
    /// dialer's peer key, then the dialer's hello nonce. The link with the smaller key is kept.
    static func tieBreakKey(_ s: Session, ours: [UInt8]) -> [UInt8] {
        let dialerKey = s.initiator ? ours : s.peerKey
        let dialerNonce = s.initiator ? s.nonce : (s.remote?.nonce ?? 0)
        return dialerKey + withUnsafeBytes(of: dialerNonce.bigEndian) { Array($0) }
    }

    private mutating func establish(_ link: LinkID, now: Millis) -> [ReplicatorDirective] {
        guard var s = sessions[link] else { return [] }
        s.phase = .established
        s.wasEstablished = true
        s.rival = nil
        // The set asked for after a digest came while the link waited (batches then were dropped
        // as in standby, below).
        if s.remoteSubscriptionsVersion > 0 { s.awaitingSet = false }
        let pendingSubs = s.remoteSubscriptions
        s.remoteSubscriptions = []
        if s.askedEarly, let remote = s.remote {
            // The subscriptions went before the peer's hello; now that it is read, ask again
            // with a new generation (the peer then scans again from the `since` sent with it)
            // wherever the early ones were wrong:
            // - the peer served them while this side held the link in standby, dropping the
            //   batches;
            // - the peer serves from further than it should: it no longer honours `e` (an
            //   older Trellis after a rollback) and its epoch changed, or this side's
            //   checkpoint went back meanwhile (below the peer's floor, on another link).
            let checkpoints = checkpointCache[s.peerKey] ?? [:]
            for (key, sent) in s.asked {
                let serving =
                    remote.earlySubscriptions && sent.epoch.map { $0 != remote.epoch } == true ? 0 : sent.since
                let stored = checkpoints[key].flatMap { $0.epoch == remote.epoch ? $0.seq : nil } ?? 0
                if s.droppedInStandby || serving > stored { s.resyncs[key, default: 0] &+= 1 }
            }
            s.askedEarly = false
            s.droppedInStandby = false
        }
        sessions[link] = s
        var directives: [ReplicatorDirective] = [
            .log(
                "session established with \(s.address) (peer \(s.peerKey.prefix(8).map { Self.hex($0) }.joined()))")
        ]
        directives += sendAsked(link, now: now)
        if !pendingSubs.isEmpty { directives += serve(pendingSubs, on: link, now: now) }
        directives += presenceEstablished(link, now: now)
        return directives
    }

    static func hex(_ byte: UInt8) -> String {
        let digits = Array("0123456789abcdef")
        return String([digits[Int(byte >> 4)], digits[Int(byte & 15)]])
    }

    /// The peer's complete subscription set arrived: serve it.
    private mutating func serve(_ subs: [WireSubscription], on link: LinkID, now: Millis) -> [ReplicatorDirective] {
        var directives: [ReplicatorDirective] = []
        // The numbers the peer gave its subscriptions name them in what goes back (a number
        // given twice names the last of them: only a broken peer does that).
        var numbers: [UTF8Key: UInt32] = [:]
        var byNumber: [UInt32: UTF8Key] = [:]
        for sub in subs {
            guard let number = sub.number else { continue }
            numbers[UTF8Key(sub.spec.key)] = number
            byNumber[number] = UTF8Key(sub.spec.key)
        }
        sessions[link]!.servedNumbers = numbers
        sessions[link]!.servedByNumber = byNumber
        // A subscription sent before the peer read our hello names the epoch its `since` counts
        // in: another epoch's position means nothing in this log, so it is served from 0. The
        // peer got documents of the collection from the earlier log, some of which this log may
        // have removed and reaped: it is served as one that holds rows (`h`), so its pages carry
        // the reaped tombstones (docs/PROTOCOL.md §2 step 5).
        let subs = subs.map { sub -> WireSubscription in
            guard let epoch = sub.epoch else { return sub }
            var sub = sub
            if epoch != local.epoch {
                if sub.since > 0 { sub.holds = true }
                sub.since = 0
            }
            sub.epoch = nil
            return sub
        }
        // A peer that asks from 0 holding rows of a collection may hold copies of documents
        // that a peer this node relays its subscription to removed and reaped: relayed, the
        // subscription says `h` as well (``heldByAskers``), so those
        // tombstones come here and, as tombstone rows, go on to the peer. Without it a stale node
        // that met a remover only through a new relay holding nothing kept its copy.
        // And asked with `h` at all (from 0, or from a checkpoint after live documents came from
        // another peer or a local write created one): this node's own requests in the collection
        // that go without it, from 0 or from a `notAsked` checkpoint, ask again with it, so the
        // tombstones the other peers reaped come here and, as tombstone rows, go on to the peer
        // (``wantReapedKeys(in:besides:now:)``, once the set is served). Without it a relay that
        // held nothing passed a request from a checkpoint with `h` on without it, and the peer
        // that re-created an `_id` removed and reaped beyond the relay never got the remove.
        var askedWithH: Set<UTF8Key> = []
        for sub in subs where sub.holds && Refetch.ids(of: sub.spec) == nil {
            askedWithH.insert(UTF8Key(sub.spec.collection))
            if sub.since == 0 { heldByAskers.insert(UTF8Key(sub.spec.collection)) }
        }
        var accepted = subs
        if subs.count > configuration.maxServedSubscriptions {
            accepted = subs.sorted { ($0.hops, UTF8Key($0.spec.key)) < ($1.hops, UTF8Key($1.spec.key)) }
            let refused = accepted[configuration.maxServedSubscriptions...]
            accepted = Array(accepted[..<configuration.maxServedSubscriptions])
            for sub in refused {
                directives.append(
                    send(
                        link,
                        .subscriptionError(
                            subscription: .key(sub.spec.key), code: "limit",
                            message:
                                "this node serves at most \(configuration.maxServedSubscriptions) subscriptions per peer"
                        ),
                        now))
            }
        }
        var next: [UTF8Key: Served] = [:]
        var regressed: Int64?
        let peerKey = sessions[link]!.peerKey
        for sub in accepted {
            let key = UTF8Key(sub.spec.key)
            guard authorization.mayRead(peerKey, sub.spec.collection) else {
                // Never scanned: no query, a failure that is not retried.
                var forbidden = Served(
                    spec: sub.spec, hops: sub.hops, generation: sub.generation, cursor: sub.since,
                    retryDelay: configuration.scanRetryInitial)
                forbidden.forbidden = true
                forbidden.failure = "forbidden: this peer may not read '\(sub.spec.collection)' here"
                forbidden.retryable = false
                if sessions[link]!.served[key]?.forbidden != true {
                    refusals.subscriptions += 1
                    directives.append(
                        send(
                            link,
                            .subscriptionError(
                                subscription: .key(key.string), code: "forbidden",
                                message: "this node's rules do not let your key read '\(sub.spec.collection)'"),
                            now))
                    directives += logRefusal(
                        "refused subscription '\(sub.spec)' of \(sessions[link]!.address) (peer "
                            + "\(Authorization.hex(peerKey).prefix(16))…): it may not read '\(sub.spec.collection)' here",
                        now: now)
                }
                next[key] = forbidden
                continue
            }
            if var existing = sessions[link]!.served[key], !existing.forbidden {
                existing.hops = sub.hops
                existing.deltas = sub.deltas
                if existing.generation != sub.generation {
                    // The peer evicted documents and wants matching ones again from `since`,
                    // including those it once sent here itself.
                    let collection = sub.spec.collection
                    sessions[link]!.echo.forget(collection: collection)
                    existing.generation = sub.generation
                    existing.unacknowledgedFloor = max(existing.unacknowledgedFloor, existing.lastSentUpTo)
                    existing.cursor = sub.since
                    existing.since = sub.since
                    existing.lastSentUpTo = sub.since
                    existing.ackedUpTo = sub.since
                    existing.floorChecked = sub.since == 0
                    // The peer still holds what it held: reaped tombstones keep coming from the
                    // lower of the two positions (from the start, asked from 0 by a peer that
                    // holds rows of the collection).
                    if sub.holds, sub.since == 0 {
                        existing.reapedAfter = 0
                    } else if let reaped = existing.reapedAfter, sub.since > 0 {
                        existing.reapedAfter = min(reaped, sub.since)
                    }
                    // Asked with `h` from its checkpoint: the tombstones reaped at or below it
                    // go first (the peer got documents from elsewhere since it asked from 0).
                    existing.reapedBacklog = sub.holds && sub.since > 0 ? sub.since : nil
                    existing.reapedBacklogAfter = 0
                    existing.sentReapedBacklog = false
                    // The new request's end of the log is told again (a caught-up or empty batch),
                    // as for a new subscription: without it, a refetch whose `_id`s this node holds
                    // no row of was never answered in its new generation.
                    existing.reachedEnd = false
                    existing.staleBatches += existing.inFlight
                    existing.carriedFrom = nil
                    // Batches in flight belong to the old request: their acks may still come
                    // (and are bounded by `lastSentUpTo`), but they hold no slot of the new one.
                    existing.inFlight = 0
                    existing.unacknowledged = []
                    existing.pending = true
                }
                next[key] = existing
                continue
            }
            if sub.since > local.lastSeq { regressed = max(regressed ?? 0, sub.since) }
            if sub.spec.isWholeCollection, sub.since > 0, sub.since <= local.lastSeq {
                directives.append(.peerHolds(collection: sub.spec.collection, through: sub.since))
            }
            var served = Served(
                spec: sub.spec, hops: sub.hops, generation: sub.generation, cursor: sub.since,
                retryDelay: configuration.scanRetryInitial)
            served.deltas = sub.deltas
            // Asked from 0 by a peer that holds rows of the collection: it may hold documents
            // from other peers that were removed here and reaped, which no tombstone row carries.
            if sub.holds, sub.since == 0 { served.reapedAfter = 0 }
            // Asked with `h` from a checkpoint: it has documents from other peers since it asked
            // from 0 without `h`; the tombstones reaped at or below its `since` go first.
            if sub.holds, sub.since > 0 { served.reapedBacklog = sub.since }
            switch query(for: sub.spec) {
            case .ready(let q):
                served.query = q
            case .failed(let reason):
                served.failure = reason
                served.retryable = false
                directives.append(
                    send(link, .subscriptionError(subscription: .key(key.string), code: "query", message: reason), now))
            }
            next[key] = served
        }
        directives += heldAfterServing(link, next: next)
        // Where the peer's whole-collection subscription went, its query subscriptions now carry
        // what it holds from it: each reads a page at once, which finds where that stands.
        let uncovered = Self.wholeCollections(sessions[link]!.served).subtracting(Self.wholeCollections(next))
        if !uncovered.isEmpty {
            for (key, served) in next where uncovered.contains(UTF8Key(served.spec.collection)) {
                next[key]!.pending = true
            }
        }
        sessions[link]!.served = next
        // What other peers are asked on this peer's behalf depends only on each subscription's
        // key and hops: a set that changed only its checkpoints or generations changes nothing
        // there, and is not worked out again for every other peer.
        let relayed = Self.relayShape(sessions[link]!.remoteSubscriptions)
        sessions[link]!.remoteSubscriptions = subs
        if let since = regressed { directives += logRegressed(since, peer: sessions[link]!.address, now: now) }
        if Self.relayShape(subs) != relayed, let s = sessions[link] {
            // Relayed only to the peers it does not say it has a session with, and to none
            // before its first presence record, within the grace (``wanted(for:now:sources:)``).
            if let neighbors = s.reportedNeighbors?.keys {
                directives += updateAsked(except: link, skipping: Set(neighbors), now: now)
            } else if now - s.opened >= Self.relayGrace {
                directives += updateAsked(except: link, now: now)
            }
        }
        if !askedWithH.isEmpty {
            let peer = sessions[link]!.peerKey
            for collection in askedWithH.sorted() {
                directives.append(.wantReapedKeys(collection: collection.string, besides: peer))
                directives += wantReapedKeys(in: collection.string, besides: link, now: now)
            }
        }
        directives += scanAll(link, now: now)
        return directives
    }

    /// A scan for a peer started over because the peer's checkpoint was below the lowest `seq`
    /// this log still answers for (tombstones after it were reaped): the peer may have missed
    /// removes, and may still hold documents removed here. It gets the subscription from the start,
    /// and, once per session and collection, this node asks it again from the start for that
    /// collection, so the stale copies it sends meet the reaped keys here and are removed again
    /// (docs/DATA-MODEL.md, "Tombstones and reaping").
    private mutating func restartedBelowFloor(_ link: LinkID, _ spec: SubscriptionSpec, now: Millis)
        -> [ReplicatorDirective]
    {
        guard let s = sessions[link] else { return [] }
        let collection = UTF8Key(spec.collection)
        let directives: [ReplicatorDirective] = [
            .log(
                "\(s.address) holds a checkpoint on '\(spec)' from before tombstones this node has reaped: it gets "
                    + "the subscription again from the start")
        ]
        guard !s.floorResynced.contains(collection) else { return directives }
        sessions[link]!.floorResynced.insert(collection)
        return directives + askAgain(link, collection: collection.string, from: 0, now: now)
    }

    /// What this node knows the peer on `link` holds, kept as its served set changes from the
    /// current one to `next` (DocumentStore+Scope.swift): in each collection where the peer's
    /// query subscriptions are new on the connection or changed, the store keeps what it holds
    /// recorded in their scopes (``ReplicatorDirective/servedQueries(_:peer:subscriptions:askAgain:)``),
    /// and asks it again for what it sent while no query subscription recorded it, where no
    /// whole-collection subscription of its is served (newly so, or that one just went) and this
    /// node asks it for something there.
    private func heldAfterServing(_ link: LinkID, next: [UTF8Key: Served]) -> [ReplicatorDirective] {
        guard let s = sessions[link] else { return [] }
        let (before, after) = (Self.queries(s.served), Self.queries(next))
        let (wholeBefore, wholeAfter) = (Self.wholeCollections(s.served), Self.wholeCollections(next))
        var directives: [ReplicatorDirective] = []
        for (collection, specs) in after.sorted(by: { $0.key < $1.key }) {
            // A subscription newly served on the connection is not in `before` either.
            let changed = Set(before[collection] ?? []) != Set(specs)
            let uncovered = !wholeAfter.contains(collection)
            guard changed || (wholeBefore.contains(collection) && uncovered) else { continue }
            let asksHere = s.asked.keys.contains { askedCollection($0.string) == collection }
            directives.append(
                .servedQueries(link, peer: s.peerKey, subscriptions: specs, askAgain: uncovered && asksHere))
        }
        return directives
    }

    /// The query subscriptions of a served set that record what the peer holds, by collection.
    private static func queries(_ set: [UTF8Key: Served]) -> [UTF8Key: [SubscriptionSpec]] {
        var out: [UTF8Key: [SubscriptionSpec]] = [:]
        for key in set.keys.sorted() {
            let served = set[key]!
            guard !served.forbidden, served.query != nil, !served.spec.isWholeCollection,
                Refetch.ids(of: served.spec) == nil
            else { continue }
            out[UTF8Key(served.spec.collection), default: []].append(served.spec)
        }
        return out
    }

    /// The collections a served set holds a whole-collection subscription to.
    private static func wholeCollections(_ set: [UTF8Key: Served]) -> Set<UTF8Key> {
        Set(set.values.filter { !$0.forbidden && $0.spec.isWholeCollection }.map { UTF8Key($0.spec.collection) })
    }

    /// Asks the peer on `link` again, from `since` (or its checkpoint, if lower) and each with a
    /// new `gen` as after a postponed batch, for this node's subscriptions to `collection`: the
    /// peer sends again what it holds of the collection after that point, which merges here like
    /// any batch (mostly without effect). For ``ReplicatorDirective/servedQueries(_:peer:subscriptions:askAgain:)``
    /// (the store has moved the checkpoints back already), and from 0 for a peer whose checkpoint
    /// was below this log's retained floor.
    public mutating func askAgain(_ link: LinkID, collection: String, from since: Int64, now: Millis)
        -> [ReplicatorDirective]
    {
        guard let s = sessions[link], s.phase == .established else { return [] }
        let name = UTF8Key(collection)
        for key in (checkpointCache[s.peerKey] ?? [:]).keys where askedCollection(key.string) == name {
            checkpointCache[s.peerKey]![key]!.seq = min(checkpointCache[s.peerKey]![key]!.seq, max(0, since))
        }
        for key in s.asked.keys where askedCollection(key.string) == name {
            sessions[link]!.resyncs[key, default: 0] &+= 1
        }
        return sendAsked(link, now: now)
    }

    private mutating func logRegressed(_ since: Int64, peer: String, now: Millis) -> [ReplicatorDirective] {
        if let last = lastRotation, now - last < configuration.minLogRotationInterval { return [] }
        lastRotation = now
        return [
            .rotateLog(
                reason:
                    "\(peer) holds a checkpoint at seq \(since) of this node's log, which ends at \(local.lastSeq): the log "
                    + "went back in time (a restored backup or a lost commit)")
        ]
    }

    private mutating func query(for spec: SubscriptionSpec) -> QueryResult {
        let key = UTF8Key(spec.key)
        if let cached = queries[key] { return cached }
        if queries.count >= 4096 { queries.removeAll(keepingCapacity: true) }  // bounded, whatever peers send
        let result: QueryResult
        do {
            result = .ready(try Query(spec.query).bind(args: spec.args))
        } catch {
            result = .failed("\(error)")
        }
        queries[key] = result
        return result
    }

    /// Moves a served subscription's cursor back to `cursor`: what came after it is read and sent
    /// again, and the acknowledgements of the batches already sent count for nothing beyond it.
    static func rewind(_ served: inout Served, to cursor: Int64) {
        served.unacknowledgedFloor = max(served.unacknowledgedFloor, served.lastSentUpTo)
        served.staleBatches += served.inFlight
        served.cursor = cursor
        served.lastSentUpTo = min(served.lastSentUpTo, cursor)
        served.ackedUpTo = min(served.ackedUpTo, cursor)
        served.carriedFrom = nil
        served.pending = true
    }

    private mutating func scanAll(_ link: LinkID, now: Millis) -> [ReplicatorDirective] {
        guard let keys = sessions[link]?.served.keys.sorted() else { return [] }
        return keys.flatMap { scanIfReady(link, $0, now: now) }
    }

    private mutating func scanIfReady(_ link: LinkID, _ key: UTF8Key, now: Millis) -> [ReplicatorDirective] {
        guard let s = sessions[link], s.phase == .established, !s.congested, var served = s.served[key],
            served.pending, !served.scanning, served.failure == nil, let query = served.query,
            served.inFlight < configuration.maxInFlight
        else { return [] }
        served.scanning = true
        served.pending = false
        // A refetch holds no slot in what the peer holds; every other query subscription of the
        // peer's carries what it holds from a whole-collection service, while none is served.
        let refetch = Refetch.ids(of: served.spec) != nil
        let sendsHeld =
            !served.spec.isWholeCollection && !refetch
            && !Self.wholeCollections(s.served).contains(UTF8Key(served.spec.collection))
        if sendsHeld {
            if served.carriedFrom == nil { served.carriedFrom = served.cursor }
        } else {
            served.carriedFrom = nil
            served.carriesHeld = false
        }
        sessions[link]!.served[key] = served
        var request = ScanRequest(
            subscription: key.string, spec: served.spec, query: query, after: served.cursor,
            limit: configuration.batchEntries, maxBytes: configuration.batchBytes)
        request.countRemaining = served.pagesSinceCount % 16 == 0
        request.reapedAfter = refetch ? nil : served.reapedAfter
        if !refetch {
            request.reapedBacklog = served.nextReapedBacklog
            request.reader = PageReader(peer: s.peerKey, acknowledgedUpTo: served.ackedUpTo, sendsHeld: sendsHeld)
        }
        sessions[link]!.served[key]!.pagesSinceCount += 1
        return [.scan(link, request)]
    }

    /// Records a batch's arrival for sync status (before the batch is checked or applied).
    private mutating func noteProgress(
        _ subscription: String, documents: Int, left: Int64?, on link: LinkID, now: Millis
    ) {
        let key = UTF8Key(subscription)
        guard sessions[link]?.asked[key] != nil else { return }
        var progress = sessions[link]!.progress[key] ?? SyncProgress()
        progress.documents += documents
        progress.batches += 1
        progress.lastReceived = now
        if let left {
            progress.left = left
            if left == 0 { progress.initialSyncComplete = true }
        }
        sessions[link]!.progress[key] = progress
    }

    private mutating func batch(
        _ subscription: String, _ documents: [WireDocument], _ upTo: Int64, _ generation: UInt32, left: Int64?,
        on link: LinkID, now: Millis
    ) -> [ReplicatorDirective] {
        // No copy of the session may live while its echo memory changes below: the copy would make
        // every batch copy the whole memory.
        if let refused = refusedWrite(subscription, documents: documents.count, on: link, now: now) { return refused }
        guard let remote = sessions[link]?.remote, let asked = sessions[link]?.asked[UTF8Key(subscription)],
            let address = sessions[link]?.address
        else {
            return []  // a batch for a subscription this side no longer asks for: in flight before the change
        }
        let collection = asked.spec.collection
        var accepted: [WireDocument] = []
        accepted.reserveCapacity(documents.count)
        var directives: [ReplicatorDirective] = []
        if sessions[link]!.echo.count + documents.count > configuration.echoMemory { sessions[link]!.echo.removeAll() }
        for var document in documents {
            // An entry without `c` is of the subscription's collection (docs/PROTOCOL.md §2).
            if document.collection.isEmpty { document.collection = collection }
            guard UTF8Key.equal(document.collection, collection) else {
                // A batch answers one subscription: a peer cannot write into collections nobody asked it for.
                directives.append(
                    .log(
                        "refused document \(document.id) of collection '\(document.collection)' from \(address): "
                            + "the batch is for a subscription to '\(collection)'"))
                continue
            }
            accepted.append(document)
            refetching[UTF8Key(collection)]?.missing.remove(UTF8Key(JSON.string(document.id)))
        }
        // Decoded on the link's reader thread in a running node (``WireMessage/decodingStates()``).
        sessions[link]!.echo.remember(
            accepted.lazy.map { document in
                (
                    key: document.decoded?.key ?? JSON.string(document.id),
                    digest: document.decoded?.echoDigest ?? DecodedState.echoDigest(of: document.state)
                )
            }, in: collection)
        // Only a batch of the generation asked for stores its checkpoint: one sent before an
        // eviction or a postponed batch made this node ask again from an earlier point would
        // otherwise move the checkpoint past documents not applied.
        let current = asked.generation
        let postponed = sessions[link]!.postponed[UTF8Key(subscription)] != nil
        let served = sessions[link]!.served
        let holding = Self.queryHolders(served, in: collection).map { served[$0]! }
        let holders = holding.map(\.spec)
        // No query subscription of the peer's served in the collection records what it sends: the
        // store notes that it sent documents there, to ask for them again once one is served and
        // no whole-collection subscription brings it every change (DocumentStore+Scope.swift).
        let unserved = holders.isEmpty
        var request = ApplyRequest(
            subscription: subscription, collection: collection, peerKey: sessions[link]!.peerKey,
            peerEpoch: remote.epoch,
            documents: accepted, upTo: upTo,
            storeCheckpoint: generation == current && !postponed && Refetch.ids(of: asked.spec) == nil,
            heldBy: holders, unserved: unserved)
        request.heldScans = Self.heldScans(holding)
        request.endsScan = left == 0 && request.storeCheckpoint
        request.reapedKeys = Self.reapedKeys(
            asked: asked, upTo: upTo, left: left,
            stored: checkpointCache[sessions[link]!.peerKey]?[UTF8Key(subscription)])
        directives.append(.apply(link, request))
        // Whether the refetch ends is decided once the batch is applied: a document that arrives
        // still withholding a value stays listed (``applied(_:subscription:upTo:checkpointStored:deferred:withholding:now:)``).
        return directives
    }

    /// Whether a subscription from 0 in `collection` to a peer with these `checkpoints` says `h`
    /// (``WireSubscription/holds``): this node holds rows of the collection that may have come
    /// from other peers, or a peer asked it from 0 with `h` there. A checkpoint on the peer in
    /// the collection that is ``ReapedKeys/notAsked`` says the rows came from that peer (and
    /// local writes to its documents) alone: the node held nothing when that chain began, and no
    /// other peer has brought a live document since, nor a local write created one, so the peer's
    /// reaped tombstones up to that checkpoint would remove nothing here. It says so only when
    /// - it is in the peer's current `epoch`: rows from an earlier epoch of its log (its store was
    ///   wiped or its log rotated since) may be documents its new log removed and reaped;
    /// - its subscription is among those `asked` of the peer now: resumed from the checkpoint, it
    ///   brings the tombstones the peer reaped after it, whatever its query. A checkpoint of a
    ///   subscription no longer asked (replaced while away) brings none, and the rows it left
    ///   here may be documents the peer removed and reaped since. The caller counts as asked,
    ///   for a subscription, those that left while it was asked after reaching the end of the
    ///   peer's log (``Session/coveredBy``): they brought everything up to the time it was asked.
    ///
    /// - Parameter committed: whether collections committed to since the engine started count
    ///   (``committedCollections``).
    /// - Complexity: O(checkpoints on the peer).
    private func holdsRows(
        _ collection: UTF8Key, besides checkpoints: [UTF8Key: Checkpoint], asked: Set<UTF8Key>, epoch: [UInt8]?,
        committed: Bool = true
    ) -> Bool {
        if heldByAskers.contains(collection) { return true }
        guard heldCollections.contains(collection) || (committed && committedCollections.contains(collection))
        else { return false }
        return !checkpoints.contains {
            $0.value.reapedKeys == .notAsked && $0.value.epoch == epoch && asked.contains($0.key)
                && askedCollection($0.key.string) == collection
        }
    }

    /// What the checkpoint a batch of the request `asked` stores says of the peer's reaped
    /// tombstones (``ReapedKeys``): asked from 0 without `h`, none came (and none are needed
    /// while every live document of the collection here came from this peer); asked with `h`,
    /// they came from 0, or, asked from a `since` above 0, they come before anything after that
    /// `since`, so a batch past it, or the last one (`left: 0`), ends them; otherwise the chain
    /// goes on as stored.
    static func reapedKeys(asked: WireSubscription, upTo: Int64, left: Int64?, stored: Checkpoint?) -> ReapedKeys {
        if asked.holds {
            return asked.since == 0 || upTo > asked.since || left == 0 ? .received : .wanted
        }
        return asked.since == 0 ? .notAsked : stored?.reapedKeys ?? .received
    }

    /// Drops the refetch list of `collection` once every listed document has arrived and none
    /// still withholds a value (after the batch that brought the last one was applied), and
    /// forgets the peers' answers about it.
    private mutating func endRefetchIfAllArrived(_ collection: String, now: Millis) -> [ReplicatorDirective] {
        let name = UTF8Key(collection)
        guard let list = refetching[name], list.missing.isEmpty else { return [] }
        refetching[name] = nil  // every listed evicted document is back
        for other in sessions.keys where !sessions[other]!.refetchesAnswered.isEmpty {
            sessions[other]!.refetchesAnswered = sessions[other]!.refetchesAnswered.filter {
                askedCollection($0.key.string) != name
            }
        }
        // More were evicted than the list held: the rest are still stubs in the store. Each round
        // asks for documents none of the rounds before brought back, and the next comes only
        // once all of this one's have arrived, so this never repeats without progress.
        return updateAsked(now: now) + (list.truncated ? [.refetchEvicted(collection)] : [])
    }

    /// A batch (or caught-up batch) for a collection the peer may not write here: counted and
    /// logged (rate-limited); `nil` when the peer may write it.
    private mutating func refusedWrite(_ subscription: String, documents: Int, on link: LinkID, now: Millis)
        -> [ReplicatorDirective]?
    {
        guard let peerKey = sessions[link]?.peerKey else { return nil }
        let collection = SubscriptionSpec.collection(ofKey: subscription)
        guard !authorization.mayWrite(peerKey, collection) else { return nil }
        // Nothing merged, no checkpoint, no ack: the collection is not asked of this peer (it
        // was, or the peer sends unasked), and once it may write again it is asked from the
        // checkpoint stored before, so nothing permitted is lost.
        refusals.batches += 1
        refusals.documents += documents
        return logRefusal(
            "refused a batch of \(documents) document(s) of '\(collection)' from "
                + "\(sessions[link]!.address) (peer \(Authorization.hex(peerKey).prefix(16))…): it may not write "
                + "'\(collection)' here", now: now)
    }

    // MARK: What to ask each peer for

    /// The collection of a subscription key: collection names hold no control characters, so
    /// the first U+001F ends it.
    private func askedCollection(_ key: String) -> UTF8Key {
        UTF8Key(SubscriptionSpec.collection(ofKey: key))
    }

    /// Recomputes what each established peer (each of those with a key in `only`, when given;
    /// none with a key in `skipping`) is asked for, and re-sends where it changed.
    ///
    /// - Complexity: O(peers recomputed × the subscriptions of every peer) (``wanted(for:now:sources:)``).
    mutating func updateAsked(
        except skip: LinkID? = nil, only peers: Set<[UInt8]>? = nil, skipping: Set<[UInt8]> = [], now: Millis
    ) -> [ReplicatorDirective] {
        var directives: [ReplicatorDirective] = []
        var sources: [RelaySource]?
        for link in sessions.keys.sorted() where link != skip && sessions[link]?.phase == .established {
            if let key = sessions[link]?.peerKey, peers.map({ !$0.contains(key) }) ?? false || skipping.contains(key) {
                continue
            }
            if sources == nil { sources = relaySources() }
            directives += sendAsked(link, now: now, sources: sources)
        }
        return directives
    }

    /// A peer whose subscriptions this node may relay to its other peers: what
    /// ``wanted(for:now:sources:)`` reads of its session, taken once for every peer it is worked
    /// out for (a session is a large value; copied for each pair of peers, it cost more than the
    /// rest of the work in a mesh of 40).
    struct RelaySource {
        let link: LinkID
        let peerKey: [UInt8]
        /// The peer's neighbours, sorted (``PresenceRecord/sorted(_:contains:)``).
        let neighbors: [[UInt8]]?
        let opened: Millis
        let subscriptions: [WireSubscription]
    }

    /// Every established session that asks this node for something.
    ///
    /// - Complexity: O(sessions).
    private func relaySources() -> [RelaySource] {
        sessions.compactMap { link, s in
            s.phase == .established && !s.remoteSubscriptions.isEmpty
                ? RelaySource(
                    link: link, peerKey: s.peerKey, neighbors: s.reportedNeighbors?.keys, opened: s.opened,
                    subscriptions: s.remoteSubscriptions) : nil
        }
    }

    /// This node's own subscriptions plus those of its other peers (one hop more, up to
    /// ``ReplicatorConfiguration/maxHops``), deduplicated by key at the fewest hops, collapsed
    /// into whole collections above ``ReplicatorConfiguration/maxAskedSubscriptions``. A peer's
    /// subscriptions are not relayed to a peer it says (in its own presence record, on its own
    /// link) it has a session with: it asks that one itself (docs/MESH.md, "Relay").
    ///
    /// - Parameter sources: ``relaySources()``, when the caller has them.
    /// - Complexity: O(own subscriptions + the subscriptions of every source).
    private func wanted(for link: LinkID, now: Millis, sources: [RelaySource]? = nil)
        -> [UTF8Key: (spec: SubscriptionSpec, hops: Int)]
    {
        var wanted: [UTF8Key: (spec: SubscriptionSpec, hops: Int)] = [:]
        // Only what the peer may write is asked of it: what it sends of another collection
        // would be refused. With the default rules (every peer reads and writes everything) no
        // rule is looked up.
        guard let peer = sessions[link]?.peerKey else { return [:] }
        let open = authorization.isOpen
        for (key, held) in own where open || authorization.mayWrite(peer, held.spec.collection) {
            wanted[key] = (held.spec, 0)
        }
        for s in sources ?? relaySources() where s.link != link && s.peerKey != peer {
            // A neighbour that says it has a session with the peer asks the peer itself, for its
            // own subscriptions and for those it relays: relayed here too, the peer would serve
            // them twice, and this node would store what it relays. In a mesh where every node
            // has a session with every other (a LAN found by discovery), each would so relay a
            // whole-collection subscription of one node to all the others, and each would fetch
            // and hold the whole collection for it. Only the neighbour's own word on this link
            // counts: a record forwarded by another peer could be forged to cut a relay.
            if let neighbors = s.neighbors, PresenceRecord.sorted(neighbors, contains: peer) { continue }
            // Nor before the neighbour's first record (it follows its `hello` at once), for at
            // most ``relayGrace``: relayed and then taken back, each such subscription would cost
            // a batch from the peer that nobody wanted.
            if s.neighbors == nil, now - s.opened < Self.relayGrace { continue }
            // A peer's refetch subscriptions are relayed one hop only, its own (hops 0): relayed
            // further, one that lasts (documents no peer holds whole) could come back around a
            // ring of relays with ever more hops and never die out. A relay holds what passes, and
            // asks for what it evicted itself.
            for sub in s.subscriptions
            where sub.hops < configuration.maxHops
                && (open
                    || authorization.mayRead(s.peerKey, sub.spec.collection)
                        && authorization.mayWrite(peer, sub.spec.collection))
                && (sub.hops == 0 || Refetch.ids(of: sub.spec) == nil)
            {
                let key = UTF8Key(sub.spec.key)
                if let existing = wanted[key], existing.hops <= sub.hops + 1 { continue }
                wanted[key] = (sub.spec, sub.hops + 1)
            }
        }
        // Above the cap, collapse the collection with the most subscriptions into the whole
        // collection (a superset: relays store what passes), until it fits with the refetches
        // derived from what is left; when only whole collections are left, drop the farthest.
        var asked = withRefetches(wanted, for: link)
        while asked.count > configuration.maxAskedSubscriptions {
            var byCollection: [UTF8Key: [UTF8Key]] = [:]
            for (key, entry) in wanted where !entry.spec.isWholeCollection {
                byCollection[UTF8Key(entry.spec.collection), default: []].append(key)
            }
            let busiest = byCollection.max { ($0.value.count, $1.key) < ($1.value.count, $0.key) }
            guard let (collection, keys) = busiest, keys.count > 1 else {
                let farthest = asked.sorted { ($0.value.hops, $0.key) > ($1.value.hops, $1.key) }
                for (key, _) in farthest.prefix(asked.count - configuration.maxAskedSubscriptions) {
                    asked.removeValue(forKey: key)
                }
                break
            }
            let whole = SubscriptionSpec.all(collection.string)
            let hops = keys.map { wanted[$0]!.hops }.min()!
            for key in keys { wanted.removeValue(forKey: key) }
            let wholeKey = UTF8Key(whole.key)
            wanted[wholeKey] = (whole, min(hops, wanted[wholeKey]?.hops ?? hops))
            asked = withRefetches(wanted, for: link)
        }
        return asked
    }

    /// `wanted` plus the evicted documents asked for again: a refetch subscription per
    /// subscription of their collection (not of a refetch subscription relayed from a peer), for
    /// the `_id`s the peer on `link` has not answered a refetch of, derived from that
    /// subscription or from the whole collection, on this connection (``refetchAnswered(_:generation:left:on:now:)``).
    /// Derived after a collapse, a whole collection's refetch asks for the evicted documents by
    /// key, whatever the whole collection's checkpoint says.
    private func withRefetches(_ wanted: [UTF8Key: (spec: SubscriptionSpec, hops: Int)], for link: LinkID)
        -> [UTF8Key: (spec: SubscriptionSpec, hops: Int)]
    {
        var out = wanted
        let answered = sessions[link]?.refetchesAnswered ?? [:]
        let stale = sessions[link]?.withholdingCopies ?? [:]
        for (key, entry) in wanted where Refetch.ids(of: entry.spec) == nil {
            let collection = UTF8Key(entry.spec.collection)
            guard let list = refetching[collection] else { continue }
            let done = (answered[key] ?? []).union(answered[UTF8Key(SubscriptionSpec.all(collection.string).key)] ?? [])
                .union(stale[collection] ?? [])
            let ids = done.isEmpty ? list.ids : list.ids.filter { !done.contains(UTF8Key(JSON.string($0))) }
            for spec in Refetch.specs(for: entry.spec, ids: ids) {
                let key = UTF8Key(spec.key)
                if let existing = out[key], existing.hops <= entry.hops { continue }
                out[key] = (spec, entry.hops)
            }
        }
        return out
    }

    /// A refetch subscription the peer answered to the end (its last batch, `left` 0, or a
    /// caught-up batch, of the generation asked): the listed documents it did not send do not
    /// match its base subscription there, and any later version that does comes through that
    /// subscription. So they are no longer asked of this peer on this connection, and refetches of
    /// documents no peer holds matching (a narrower subscription after an eviction) do not stay
    /// asked, and counted toward ``ReplicatorConfiguration/maxAskedSubscriptions``, for as long as
    /// the node runs.
    private mutating func refetchAnswered(
        _ subscription: String, generation: UInt32, left: Int64?, on link: LinkID, now: Millis
    ) -> [ReplicatorDirective] {
        guard left == 0, let asked = sessions[link]?.asked[UTF8Key(subscription)], asked.generation == generation,
            let ids = Refetch.ids(of: asked.spec), let base = Refetch.base(of: asked.spec)
        else { return [] }
        sessions[link]!.refetchesDone[UTF8Key(subscription)] = generation
        // A document whose state this node sent the peer on this connection may be held there as
        // sent, and its echo memory would keep it from coming back: such documents stay asked.
        guard !sessions[link]!.answersUntrusted else { return [] }
        let sent = sessions[link]!.sentKeys
        sessions[link]!.refetchesAnswered[UTF8Key(base.key), default: []].formUnion(
            ids.lazy.map { JSON.string($0) }.filter {
                !sent.contains(EchoMemory.hash(collection: base.collection, key: $0))
            }.map { UTF8Key($0) })
        // The set goes again once no refetch subscription asked of this peer waits for its
        // answer (one it refused waits for nothing): sent after each answer, it would carry every
        // refetch subscription still asked, 256 `_id`s apiece, several times per list. Until
        // then the answered ones stay asked, at the cost of a change to one of their documents
        // coming twice.
        // A peer that never answers one (an older build, which does not answer a new generation
        // of a refetch it once answered caught up) holds the answered ones back for at most
        // ``refetchSetDelay``: the tick sends the set then.
        if awaitsRefetchAnswers(on: link) {
            if sessions[link]!.refetchSetDue == nil { sessions[link]!.refetchSetDue = now + Self.refetchSetDelay }
            return []
        }
        return sendAsked(link, now: now)
    }

    /// What ``wanted(for:now:sources:)`` reads of a peer's subscriptions: each key with its hops.
    private static func relayShape(_ subscriptions: [WireSubscription]) -> [String: Int] {
        Dictionary(subscriptions.map { ($0.spec.key, $0.hops) }, uniquingKeysWith: min)
    }

    /// How long a neighbour's subscriptions wait to be relayed for its first presence record, in
    /// milliseconds (``wanted(for:now:sources:)``): a peer that sends none (an older build) is relayed
    /// for after it.
    static let relayGrace: Millis = 2_000

    /// How long answered refetch subscriptions may stay asked while another one waits for its
    /// answer (``refetchAnswered(_:generation:left:on:now:)``), in milliseconds.
    static let refetchSetDelay: Millis = 1_000

    /// Whether a refetch subscription asked of the peer on `link` has neither been answered to
    /// the end in the generation asked (``refetchAnswered(_:generation:left:on:now:)``) nor
    /// refused (`suberr`). Answered, whatever its documents: one this node sent the peer on the
    /// connection is still wanted, and asked again in a refetch subscription of its own.
    ///
    /// - Complexity: O(subscriptions asked on the link).
    private func awaitsRefetchAnswers(on link: LinkID) -> Bool {
        guard let s = sessions[link] else { return false }
        return s.asked.contains { key, entry in
            s.remoteErrors[key] == nil && Refetch.ids(of: entry.spec) != nil && s.refetchesDone[key] != entry.generation
        }
    }

    /// Sends the subscriptions this node asks of the peer on `link` when they changed.
    ///
    /// - Parameter early: before the peer's hello (a peer that honours subscription epochs):
    ///   each `since` is the stored checkpoint with the epoch it was stored in, for the peer to
    ///   check; otherwise each `since` counts in the epoch the peer's hello named.
    /// - Parameter digest: send the digest of the set in place of the set (a peer that remembers
    ///   sets); the set goes in full if the peer asks for it.
    /// - Parameter sources: ``relaySources()``, when the caller has them.
    private mutating func sendAsked(
        _ link: LinkID, now: Millis, early: Bool = false, digest: Bool = false, sources: [RelaySource]? = nil
    ) -> [ReplicatorDirective] {
        guard let s = sessions[link], early || s.remote != nil else { return [] }
        let checkpoints = checkpointCache[s.peerKey] ?? [:]
        // A peer that reads compact names gets each subscription numbered: one number per key
        // while it is asked, never given to another key on the connection.
        let peerHello = early ? lastHellos[s.peerKey] : s.remote
        let numbered = peerHello?.compactNames == true
        var list: [WireSubscription] = []
        let wanted = wanted(for: link, now: now, sources: sources)
        let askedKeys = Set(wanted.keys)
        // Requests that reached the end of the peer's log and leave the set now cover those
        // asked beside them: what they brought up to now, the later ones' pages carry from their
        // first on (the tombstones reaped after it, whatever the query).
        let leaving = Set(s.asked.keys).subtracting(askedKeys).intersection(s.endedAsked)
        if !leaving.isEmpty {
            for key in askedKeys where s.asked[key] != nil {
                sessions[link]!.coveredBy[key, default: []].formUnion(leaving)
            }
            // Asked again later, a request starts over: it has not reached the end yet.
            sessions[link]!.endedAsked.subtract(leaving)
        }
        for (key, entry) in wanted.sorted(by: { $0.key < $1.key }) {
            // Asked again on this connection after it was dropped: a new generation, so a batch
            // of the old request still in flight stores no checkpoint (one before it may have
            // arrived while the subscription was not asked, and was dropped unapplied).
            if s.asked[key] == nil, s.askedBefore.contains(key) { sessions[link]!.resyncs[key, default: 0] &+= 1 }
            var number: UInt32?
            if numbered {
                if let given = sessions[link]!.askedNumbers[key] {
                    number = given
                } else {
                    number = sessions[link]!.nextAskedNumber
                    sessions[link]!.nextAskedNumber &+= 1
                    sessions[link]!.askedNumbers[key] = number
                    sessions[link]!.askedByNumber[number!] = key
                }
            }
            var since: Int64 = 0
            var epoch: [UInt8]?
            if let cp = checkpoints[key] {
                if early {
                    (since, epoch) = (cp.seq, cp.epoch)
                } else if cp.epoch == s.remote?.epoch {
                    since = cp.seq
                }
            }
            let collection = UTF8Key(entry.spec.collection)
            var generation = (generations[collection] ?? 0) &+ (sessions[link]!.resyncs[key] ?? 0)
            let suppressing = askedKeys.union(sessions[link]!.coveredBy[key] ?? [])
            var holds =
                since == 0
                ? holdsRows(collection, besides: checkpoints, asked: suppressing, epoch: peerHello?.epoch)
                : checkpoints[key]?.reapedKeys == .wanted
            // Asked without `h` on this connection, under the generation it would go with now, and
            // now with it: the peer reads `h` only with a new request. It gets a new generation,
            // so the peer serves it again with the reaped tombstones and a batch of the old
            // request stores no checkpoint saying they came, when live documents came from
            // another peer or a local write created one (``wantReapedKeys(in:besides:now:)``),
            // when the subscription whose `notAsked` checkpoint kept `h` off is no longer asked
            // (cancelled, or its relay source gone, before its pages brought them), or when a peer
            // asked this node with `h`. Other rows committed since (``committedCollections``)
            // leave the request as it was.
            if holds, let before = s.asked[key], !before.holds, Refetch.ids(of: entry.spec) == nil,
                before.generation == generation
            {
                if since > 0
                    || holdsRows(
                        collection, besides: checkpoints, asked: suppressing, epoch: peerHello?.epoch, committed: false)
                {
                    sessions[link]!.resyncs[key, default: 0] &+= 1
                    generation &+= 1
                } else {
                    holds = false
                }
            }
            list.append(
                WireSubscription(
                    spec: entry.spec, since: since, hops: entry.hops, generation: generation,
                    epoch: since > 0 ? epoch : nil,
                    deltas: configuration.deltas && entry.spec.isWholeCollection && !s.noDeltas.contains(key),
                    number: number,
                    holds: holds))
        }
        // Resend only when the set changed (the peer keeps its own cursors); a new rescan
        // generation is a change, and so are numbers given since: the early set went unnumbered
        // when this node did not know yet that the peer reads compact names, and an `ack` may
        // name a subscription by number only once the peer received that number.
        let shape = list.map {
            WireSubscription(
                spec: $0.spec, since: 0, hops: $0.hops, generation: $0.generation, deltas: $0.deltas, number: $0.number)
        }
        if s.askedShape == shape { return [] }
        sessions[link]!.askedShape = shape
        sessions[link]!.asked = Dictionary(list.map { (UTF8Key($0.spec.key), $0) }, uniquingKeysWith: { a, _ in a })
        // A subscription no longer asked loses its number (a batch for it still in flight then
        // names nothing and is ignored; asked again, it gets a new one), so the maps stay the
        // size of the asked set. Refetches store no checkpoint and their keys (up to 256 `_id`s
        // each) are many: only the others are remembered as asked before.
        sessions[link]!.askedNumbers = sessions[link]!.askedNumbers.filter { sessions[link]!.asked[$0.key] != nil }
        sessions[link]!.askedByNumber = sessions[link]!.askedByNumber.filter { sessions[link]!.asked[$0.value] != nil }
        sessions[link]!.askedBefore.formUnion(
            list.filter { Refetch.ids(of: $0.spec) == nil }.map { UTF8Key($0.spec.key) })
        sessions[link]!.remoteErrors = sessions[link]!.remoteErrors.filter { sessions[link]!.asked[$0.key] != nil }
        sessions[link]!.refetchesDone = sessions[link]!.refetchesDone.filter { sessions[link]!.asked[$0.key] != nil }
        sessions[link]!.refetchSetDue = nil
        sessions[link]!.askedVersion += 1
        let version = sessions[link]!.askedVersion
        if digest {
            sessions[link]!.resumed = (list, version)
            return [send(link, .subscriptionsDigest(Self.digest(list, version: version), version: version), now)]
        }
        sessions[link]!.resumed = nil
        // Asking the peer in a collection again, where it holds documents no scope of its query
        // subscriptions here records (noted while this node asked it nothing there): asked for
        // again after this set (``heldAfterServing(_:next:)``).
        var held: [ReplicatorDirective] = []
        if s.phase == .established {
            let before = Set(s.asked.keys.map { askedCollection($0.string) })
            let (queries, whole) = (Self.queries(s.served), Self.wholeCollections(s.served))
            for collection in Set(list.map { askedCollection($0.spec.key) }).subtracting(before).sorted()
            where !whole.contains(collection) {
                guard let specs = queries[collection] else { continue }
                held.append(.servedQueries(link, peer: s.peerKey, subscriptions: specs, askAgain: true))
            }
        }
        return [send(link, .subscriptions(list, version: version), now)] + held
    }
}

// MARK: - Session state

/// A session's echo memory: per collection, the digest of the last state the peer sent of each
/// document (``DecodedState/echoDigest``), so that the state is not sent straight back.
///
/// Documents are kept by ``hash(collection:key:)``, not by their keys: a batch's worth of
/// entries costs a few machine words each, and growing the memory rehashes integers, not
/// strings. Two documents whose hashes collide share one entry, the later replacing the earlier:
/// the earlier one's state may then be sent back (the peer merges it as nothing new). A state is
/// held back only when its digest is also the one remembered (``StateDigest``).
struct EchoMemory: Sendable {
    private var collections: [UTF8Key: [Int: StateDigest]] = [:]
    /// Documents remembered, over every collection.
    private(set) var count = 0

    var isEmpty: Bool { count == 0 }

    /// A document's hash: both strings' bytes through one `Hasher` (this process's seed, so a
    /// peer cannot choose keys that collide). Also what a session's `sentKeys` keeps.
    static func hash(collection: String, key: String) -> Int {
        var hasher = Hasher()
        UTF8Key.hash(collection, into: &hasher)
        UTF8Key.hash(key, into: &hasher)
        return hasher.finalize()
    }

    /// Remembers the digests of states the peer sent of documents of `collection`.
    ///
    /// - Parameter entries: `(document key, digest)` pairs, in the order they came.
    mutating func remember(_ entries: some Sequence<(key: String, digest: StateDigest)>, in collection: String) {
        let name = UTF8Key(collection)
        var memory = collections.removeValue(forKey: name) ?? [:]  // changed in place, not copied
        count -= memory.count
        for (key, digest) in entries { memory[Self.hash(collection: collection, key: key)] = digest }
        count += memory.count
        collections[name] = memory
    }

    /// The digest remembered for a document, or `nil`.
    func digest(of key: String, in collection: String) -> StateDigest? {
        collections[UTF8Key(collection)]?[Self.hash(collection: collection, key: key)]
    }

    /// Forgets one document.
    mutating func forget(_ key: String, in collection: String) {
        let name = UTF8Key(collection)
        guard collections[name]?.removeValue(forKey: Self.hash(collection: collection, key: key)) != nil else { return }
        count -= 1
    }

    /// Forgets every document of a collection.
    mutating func forget(collection: String) {
        count -= collections.removeValue(forKey: UTF8Key(collection))?.count ?? 0
    }

    /// Forgets everything.
    mutating func removeAll() {
        collections = [:]
        count = 0
    }
}

extension Replicator {
    enum Phase: Sendable, Equatable, CustomStringConvertible {
        case awaitingHello, standby, established, closed

        var description: String {
            switch self {
            case .awaitingHello: return "awaiting hello"
            case .standby: return "standby (duplicate)"
            case .established: return "established"
            case .closed: return "closed"
            }
        }
    }

    struct Session: Sendable {
        let link: LinkID
        let peerKey: [UInt8]
        let initiator: Bool
        let address: String
        let endpoint: String?
        let opened: Millis
        /// Our hello's nonce on this link.
        let nonce: UInt64
        var phase = Phase.awaitingHello
        var remote: Hello?
        /// Whether this node sent its subscriptions before the peer's hello (the one-round-trip
        /// reconnect), and whether the link then waited in standby, where the batches the peer
        /// sent for them were dropped.
        var askedEarly = false
        var droppedInStandby = false
        /// This node's epoch when the link opened (a rotation closes every session), and whether
        /// the session was ever established (what it served is then remembered, ``remember(_:)``).
        var localEpoch: [UInt8] = []
        var wasEstablished = false
        /// The set whose digest went in place of the early `subs`, and its version, until the peer
        /// asks for it in full or a later set replaces it.
        var resumed: (list: [WireSubscription], version: UInt64)?
        /// The number both ends of the connection hold (``Replicator/linkOpened(_:peerKey:initiator:address:endpoint:checkpoints:channelNonce:now:)``).
        var channelNonce: UInt64?
        /// The `hello` this node's ``WireMessage/resume(_:)`` stood for, until the peer asks for it
        /// in full (``WireMessage/helloRequest``).
        var resumedHello: Hello?
        /// The peer's ``WireMessage/resume(_:)`` this node took, and whether it asked the peer for
        /// its `hello` instead; what came before that `hello`, and its documents' bytes, taken once
        /// it is here.
        var resumeTaken: StateDigest?
        var helloAsked = false
        var beforeHello: [WireMessage] = []
        var beforeHelloBytes = 0
        /// The messages kept before the asked hello are being taken, one per
        /// ``ReplicatorDirective/takeHeld(_:)``; messages arriving meanwhile queue behind them.
        var takingHeld = false
        /// Whether this node asked the peer for its set in full (its digest did not match), and
        /// whether batches of the peer were dropped while the set had not come.
        var awaitingSet = false
        var droppedAwaitingSet = false
        var closeReason: String?
        var lastReceived: Millis
        var lastSent: Millis
        var congested = false
        /// While in standby: the established link to the same peer being probed.
        var rival: LinkID?
        var probe: UInt64 = 0
        var probeDeadline: Millis = 0
        /// What the peer asks this node for, by key, and the set as the peer sent it (forwarded
        /// to other peers).
        var served: [UTF8Key: Served] = [:]
        var remoteSubscriptions: [WireSubscription] = []
        var remoteSubscriptionsVersion: UInt64 = 0
        /// The peer's own presence record as the peer sent it on this link (never one another
        /// node forwarded): its `seq` and the peers it says it has sessions with. Its
        /// subscriptions are not relayed to those (``wanted(for:now:sources:)``). The keys are
        /// sorted, without repeats (``PresenceRecord/sorted(_:contains:)``).
        var reportedNeighbors: (seq: UInt64, keys: [[UInt8]])?
        /// Whether the relay grace ran out before the peer's first presence record, and its
        /// subscriptions were relayed then (``Replicator/relayGrace``).
        var relayedWithoutRecord = false
        /// The `seq` of this node's own presence record last sent on this link: an announcement
        /// goes only where it is news (``Replicator/presenceTick(now:)``).
        var presenceSeqSent: UInt64?
        /// What this node asks the peer for, by key, and the shape last sent.
        var asked: [UTF8Key: WireSubscription] = [:]
        var askedShape: [WireSubscription]?
        var askedVersion: UInt64 = 0
        /// The numbers this node gave the subscriptions it asks now (a number is never given twice
        /// on a connection), and the peer's numbers for the subscriptions it asks of this node.
        var askedNumbers: [UTF8Key: UInt32] = [:]
        var askedByNumber: [UInt32: UTF8Key] = [:]
        var nextAskedNumber: UInt32 = 0
        /// Every subscription asked of the peer on this connection.
        var askedBefore: Set<UTF8Key> = []
        /// Subscriptions asked of the peer on this connection whose request reached the end of
        /// its log (a caught-up batch, or a last batch applied with its checkpoint).
        var endedAsked: Set<UTF8Key> = []
        /// For a subscription asked of the peer, the subscriptions that left the asked set while
        /// it was asked, after their requests had reached the end of the peer's log: their
        /// `notAsked` checkpoints keep `h` off it as if still asked (``holdsRows(_:besides:asked:epoch:committed:)``).
        var coveredBy: [UTF8Key: Set<UTF8Key>] = [:]
        var servedNumbers: [UTF8Key: UInt32] = [:]
        var servedByNumber: [UInt32: UTF8Key] = [:]
        /// Per asked subscription, how often it was asked again after a postponed batch: added to
        /// the collection's rescan generation in what is asked, so that batches sent before the
        /// peer saw the new request do not store their checkpoint.
        var resyncs: [UTF8Key: UInt32] = [:]
        /// Asked subscriptions with a postponed batch, and when to ask for them again.
        var postponed: [UTF8Key: Millis] = [:]
        /// Asked subscriptions a delta of which this node could not apply: asked again without
        /// deltas for the rest of the session.
        var noDeltas: Set<UTF8Key> = []
        var remoteErrors: [UTF8Key: String] = [:]
        /// The asked refetch subscriptions the peer answered to the end on this connection, with
        /// the generation answered (``awaitsRefetchAnswers(on:)``).
        var refetchesDone: [UTF8Key: UInt32] = [:]
        /// When the set goes although a refetch subscription still waits for its answer, once one
        /// was answered (``Replicator/refetchSetDelay``).
        var refetchSetDue: Millis?
        /// States received on this session, for echo suppression.
        var echo = EchoMemory()
        /// Per asked subscription, what arrived on this session (``SyncProgress``).
        var progress: [UTF8Key: SyncProgress] = [:]
        /// By the key of the subscription a refetch was derived from, the canonical `_id` keys of
        /// the evicted documents the peer answered a refetch of to the end on this connection
        /// (``Replicator/refetchAnswered(_:generation:left:on:now:)``).
        var refetchesAnswered: [UTF8Key: Set<UTF8Key>] = [:]
        /// By collection, the canonical `_id` keys of documents the peer sent on this connection
        /// that still withheld a value here after the merge (``Replicator/askElsewhere(_:in:answeredBy:now:)``):
        /// its copy lacks the value, so they are not asked of it again on this connection. Unlike
        /// ``refetchesAnswered``, sending the peer the document does not clear them: two peers
        /// that both withhold the value would otherwise answer each other's refetch for good.
        var withholdingCopies: [UTF8Key: Set<UTF8Key>] = [:]
        /// The documents whose states went to the peer on this connection
        /// (``Replicator/statesSent(_:in:on:now:)``), at most ``ReplicatorConfiguration/echoMemory``;
        /// past it, `answersUntrusted`: no refetch answer counts on this connection. Hashes (of
        /// ``EchoKey``) rather than the keys, to keep it small: two documents sharing one only
        /// keep an answer from counting.
        var sentKeys: Set<Int> = []
        var answersUntrusted = false
        /// Collections this node asked the peer for again from the start because the peer's
        /// checkpoint on this log was below its retained floor (once per session).
        var floorResynced: Set<UTF8Key> = []

        init(
            link: LinkID, peerKey: [UInt8], initiator: Bool, address: String, endpoint: String?, opened: Millis,
            nonce: UInt64
        ) {
            self.link = link
            self.peerKey = peerKey
            self.initiator = initiator
            self.address = address
            self.endpoint = endpoint
            self.opened = opened
            self.nonce = nonce
            self.lastReceived = opened
            self.lastSent = opened
        }
    }

    /// One subscription this node serves to a peer.
    struct Served: Sendable {
        var spec: SubscriptionSpec
        var hops: Int
        var generation: UInt32
        var query: Query?
        /// The last `seq` scanned.
        var cursor: Int64
        /// The `since` the peer's current generation of this subscription is served from: a batch
        /// that would carry nothing with this `upTo` goes as a caught-up batch to a peer that reads
        /// them.
        var since: Int64
        /// The last `upTo` sent (an empty batch that advances nothing is skipped).
        var lastSentUpTo: Int64
        /// The highest `upTo` the peer acknowledged.
        var ackedUpTo: Int64
        /// When the last acknowledgement came (or the first unacknowledged batch went).
        var lastProgress: Millis = 0
        var inFlight = 0
        /// The batches in flight that carry writes of this node no peer has acknowledged, by their
        /// `upTo`: their ack tells the store (``ReplicatorDirective/acknowledged(_:)``).
        var unacknowledged: [(upTo: Int64, entries: [AcknowledgedEntry])] = []
        /// Batches up to this `upTo` may share it with a batch sent before a reset: theirs are
        /// not recorded.
        var unacknowledgedFloor: Int64 = 0
        var scanning = false
        /// More entries may wait after `cursor` (a commit happened or the last scan was cut).
        var pending = true
        var failure: String?
        var retryable = true
        var retryAt: Millis = 0
        var retryDelay: Millis
        /// Whether a batch sent on this session reached the end of the log (told the peer `left: 0`).
        var reachedEnd = false
        /// Scans since the last one that counted the entries left, and that count less what was
        /// examined since (``ScanRequest/countRemaining``).
        var pagesSinceCount = 0
        var remainingEstimate: Int64?
        /// Whether the cursor is known not to be below the log's retained floor: it came from 0,
        /// or from a page this node scanned in this session (the peer's `since` is checked once).
        var floorChecked: Bool
        /// The pages carry the tombstones reaped after this (``ScanRequest/reapedAfter``): the
        /// peer's checkpoint, or, for a peer served from 0, the floor of its first page (set at
        /// the first page), or 0 for a peer that asked from 0 holding rows of the collection
        /// (``WireSubscription/holds``, set on receipt).
        var reapedAfter: Int64?
        /// The peer asked with `h` from a `since` above 0 (``WireSubscription/holds``): the
        /// tombstones reaped here at or below this `seq` go first, in pages of their own
        /// (``ScanRequest/reapedBacklog``), before the scan resumes from the cursor; `nil` once
        /// they went.
        var reapedBacklog: Int64?
        /// Where the pages of ``reapedBacklog`` stand: the `seq` of the last reaped key sent.
        var reapedBacklogAfter: Int64 = 0
        /// The page of ``reapedBacklog`` to read next, if any.
        var nextReapedBacklog: ReapedBacklog? {
            reapedBacklog.map { ReapedBacklog(after: reapedBacklogAfter, through: $0) }
        }
        /// ``reapedBacklog`` was read in this generation: the end of the scan is told by a batch
        /// the peer stores a checkpoint for (`left: 0`), not a caught-up batch, so the peer
        /// records that the reaped tombstones came (none, when nothing was reaped here).
        var sentReapedBacklog = false
        /// The peer may not read the collection (``Authorization``): answered `suberr forbidden`,
        /// never scanned.
        var forbidden = false
        /// The peer accepts deltas for this subscription (``WireSubscription/deltas``).
        var deltas = false
        /// While this query subscription carries the changes to what the peer holds from a
        /// whole-collection service here (no whole-collection one of the peer's is served in its
        /// collection, ``PageReader/sendsHeld``): the cursor from which every page read for it in
        /// this session did.
        var carriedFrom: Int64?
        /// The last page carried such changes (``ScanPage/heldFrom``): its acknowledgements tell
        /// the store where what the peer holds stands.
        var carriesHeld = false
        /// Batches sent before the cursor was last moved back whose acknowledgements are still to
        /// come (they come first, on an ordered link): they count for nothing in what the peer holds.
        var staleBatches = 0

        init(spec: SubscriptionSpec, hops: Int, generation: UInt32, cursor: Int64, retryDelay: Millis) {
            self.spec = spec
            self.hops = hops
            self.generation = generation
            self.cursor = cursor
            self.since = cursor
            self.floorChecked = cursor == 0
            self.lastSentUpTo = cursor
            self.ackedUpTo = cursor
            self.retryDelay = retryDelay
        }
    }

    struct Endpoint: Sendable {
        enum State: Sendable, Equatable, CustomStringConvertible {
            case idle, dialing
            case connected(LinkID)

            var description: String {
                switch self {
                case .idle: return "waiting to dial"
                case .dialing: return "dialing"
                case .connected(let link): return "connected (\(link))"
                }
            }
        }
        var state = State.idle
        var next: Millis
        var backoff: Millis
        var knownKey: [UInt8]?
        var isSelf = false
        var lastError: String?
        /// `false` for a peer known only from discovery: forgotten when its beacons stop.
        var isStatic = true
        /// A discovered peer that subscribes to the same collections as this node: dialed first
        /// when session slots are limited.
        var preferred = false
        /// The peer key of the discovered peer this address belongs to.
        var discoveredKey: [UInt8]?

        init(next: Millis, backoff: Millis) {
            self.next = next
            self.backoff = backoff
        }
    }
}

/// A snapshot of a node's sessions and static peers (``Replicator/status``).
public struct ReplicatorStatus: Sendable, Equatable {
    public struct Subscription: Sendable, Equatable {
        public var spec: SubscriptionSpec
        public var hops: Int
        /// For a served subscription, the last `seq` scanned; for an asked one, the `since` sent.
        public var cursor: Int64
        /// Why it is not being served, if it is not.
        public var error: String?
        /// For an asked subscription, what arrived from the peer in this session.
        public var progress: SyncProgress?
    }

    public struct Peer: Sendable, Equatable {
        public var link: LinkID
        public var peerKey: [UInt8]
        public var address: String
        public var initiator: Bool
        public var phase: String
        public var siteID: SiteID?
        /// The peer's subscriptions this node serves.
        public var served: [Subscription]
        /// What this node asks the peer for.
        public var asked: [Subscription]
    }

    public struct StaticPeer: Sendable, Equatable {
        public var address: String
        public var state: String
        public var lastError: String?
    }

    public var peers: [Peer]
    public var endpoints: [StaticPeer]
    /// Presence records of every node reachable from this one, its own first (``Replicator/presence``).
    public var presence: [PresenceRecord] = []
    /// Peers that spoke another protocol version lately.
    public var incompatible: [IncompatiblePeer] = []
    /// The LAN discovery cache, when the shell runs discovery (the replicator leaves it empty).
    public var discovered: [DiscoveredPeer] = []
}
