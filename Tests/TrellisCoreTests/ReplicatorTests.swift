import Testing
import TrellisCore

/// The sync policy, driven directly: each test feeds events to a ``Replicator`` and checks the
/// directives it returns. No store, no sockets, no clock.
@Suite struct ReplicatorTests {
    static let keyA: [UInt8] = Array(repeating: 1, count: 32)
    static let keyB: [UInt8] = Array(repeating: 2, count: 32)
    static let keyC: [UInt8] = Array(repeating: 3, count: 32)
    static let epochB: [UInt8] = Array(repeating: 0xB, count: 16)
    let link = LinkID(1)

    func replicator(
        _ key: [UInt8] = keyA, lastSeq: Int64 = 100, configure: (inout ReplicatorConfiguration) -> Void = { _ in }
    )
        -> Replicator
    {
        var config = ReplicatorConfiguration(peerKey: key)
        configure(&config)
        return Replicator(
            configuration: config,
            local: LocalLog(epoch: Array(repeating: 0xA, count: 16), site: 0x100 + SiteID(key[0]), lastSeq: lastSeq),
            seed: 42)
    }

    /// - Parameters:
    ///   - early: the hello says `es: 1` (its sender honours subscription epochs).
    ///   - compactNames: the hello says `x: 1` (its sender reads compact names and deltas).
    func hello(
        _ key: [UInt8] = keyB, version: Int = WireMessage.protocolVersion, nonce: UInt64 = 7, early: Bool = false,
        compactNames: Bool = false
    ) -> WireMessage {
        // Each key its own site ID: two keys presenting one site are refused (site pins).
        .hello(
            Hello(
                version: version, peerKey: key, site: 0x100 + SiteID(key[0]), epoch: Self.epochB, nonce: nonce,
                earlySubscriptions: early, compactNames: compactNames))
    }

    /// A replicator with one established session to B on `link`.
    func established(
        _ key: [UInt8] = keyA, lastSeq: Int64 = 100, checkpoints: [UTF8Key: Checkpoint] = [:],
        compactNames: Bool = false, configure: (inout ReplicatorConfiguration) -> Void = { _ in }
    ) -> Replicator {
        var r = replicator(key, lastSeq: lastSeq, configure: configure)
        _ = r.linkOpened(
            link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: checkpoints, now: 0)
        _ = r.received(hello(compactNames: compactNames), on: link, now: 0)
        return r
    }

    static func sent(_ directives: [ReplicatorDirective]) -> [WireMessage] {
        directives.compactMap { if case .send(_, let m) = $0 { m } else { nil } }
    }

    static func scans(_ directives: [ReplicatorDirective]) -> [ScanRequest] {
        directives.compactMap { if case .scan(_, let r) = $0 { r } else { nil } }
    }

    static func applies(_ directives: [ReplicatorDirective]) -> [ApplyRequest] {
        directives.compactMap { if case .apply(_, let r) = $0 { r } else { nil } }
    }

    static func closes(_ directives: [ReplicatorDirective]) -> [LinkID] {
        directives.compactMap { if case .close(let l, _) = $0 { l } else { nil } }
    }

    /// A change-log record; `unacknowledged`: it holds a write of this node no peer acknowledged.
    static func record(
        _ seq: Int64, _ id: String, state: [UInt8] = [1, 2, 3], collection: String = "cars",
        unacknowledged: Bool = false
    ) -> LogRecord {
        var record = LogRecord(
            seq: seq, key: JSON.string(.string(id)),
            document: WireDocument(collection: collection, id: .string(id), state: state))
        record.holdsUnacknowledgedWrite = unacknowledged
        return record
    }

    /// The entries of the `.acknowledged` directives.
    static func acknowledged(_ directives: [ReplicatorDirective]) -> [AcknowledgedEntry] {
        directives.flatMap { directive -> [AcknowledgedEntry] in
            if case .acknowledged(let entries) = directive { return entries }
            return []
        }
    }

    // MARK: Session

    @Test func helloThenSubscriptionsThenOneScanPerSubscription() throws {
        var r = replicator()
        let opened = r.linkOpened(
            link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 0)
        guard case .hello(let mine)? = Self.sent(opened).first else {
            Issue.record("no hello: \(opened)")
            return
        }
        #expect(mine.peerKey == Self.keyA && mine.version == WireMessage.protocolVersion)
        let spec = SubscriptionSpec(collection: "cars", query: "Origin == 'Japan'")
        _ = try r.subscribe(spec, now: 0)
        let established = r.received(hello(), on: link, now: 0)
        // The subscriptions, then this node's presence record (it now has one neighbour: B).
        #expect(
            Self.sent(established) == [
                .subscriptions([WireSubscription(spec: spec, since: 0, hops: 0)], version: 1),
                .presence([
                    PresenceRecord(
                        peerKey: Self.keyA, version: WireMessage.protocolVersion, seq: 1, neighbors: [Self.keyB])
                ]),
            ])
        let served = SubscriptionSpec(collection: "cars")
        let directives = r.received(
            .subscriptions([WireSubscription(spec: served, since: 5, hops: 0)]), on: link, now: 1)
        let scans = Self.scans(directives)
        #expect(scans.count == 1)
        #expect(scans.first?.after == 5 && scans.first?.spec == served)
    }

    /// The one-round-trip reconnect (docs/PROTOCOL.md §2, step 3): to a peer whose hello said it
    /// honours subscription epochs, the subscriptions go right after this node's hello, each
    /// `since` with the epoch its checkpoint was stored in; to any other peer, after its hello.
    @Test func aPeerThatHonoursEpochsGetsTheSubscriptionsWithTheHello() throws {
        var r = replicator()
        let spec = SubscriptionSpec(collection: "cars")
        _ = try r.subscribe(spec, now: 0)
        let checkpoints = [UTF8Key(spec.key): Checkpoint(epoch: Self.epochB, seq: 40)]
        func open(_ link: LinkID) -> [WireMessage] {
            Self.sent(
                r.linkOpened(
                    link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: checkpoints,
                    now: 0))
        }
        // First contact: B is unknown, so the subscriptions wait for its hello.
        let first = open(LinkID(1))
        guard case .hello(let mine)? = first.first else { return #expect(Bool(false), "no hello: \(first)") }
        #expect(mine.earlySubscriptions && first.count == 1)
        let established = Self.sent(r.received(hello(early: true), on: LinkID(1), now: 0))
        #expect(
            established.first
                == .subscriptions([WireSubscription(spec: spec, since: 40, hops: 0, deltas: true)], version: 1))
        _ = r.linkClosed(LinkID(1), reason: "test", now: 1)
        // B said it honours epochs: on the next connection the subscriptions follow the hello.
        let second = open(LinkID(2))
        #expect(second.count == 2)
        #expect(
            second.last
                == .subscriptions(
                    [WireSubscription(spec: spec, since: 40, hops: 0, epoch: Self.epochB, deltas: true)], version: 1))
        // B's hello then changes nothing: the set was sent.
        let after = Self.sent(r.received(hello(), on: LinkID(2), now: 2))
        #expect(!after.contains { if case .subscriptions = $0 { true } else { false } })
        _ = r.linkClosed(LinkID(2), reason: "test", now: 3)
        // This time B did not say so (an older node): back to waiting for its hello.
        #expect(open(LinkID(3)).count == 1)
    }

    /// A restarted peer's new connection: this node sends its subscriptions with its hello, then
    /// holds the link in standby while it probes the old one, and drops the batches the peer sent
    /// for them. When the new link is chosen, it asks again with a new generation, so the peer
    /// scans again from `since` (simulation seed 49139186207 lost a write this way).
    @Test func batchesDroppedInStandbyAreAskedForAgainWhenTheLinkIsChosen() throws {
        var r = replicator()
        let spec = SubscriptionSpec(collection: "cars")
        _ = try r.subscribe(spec, now: 0)
        _ = r.linkOpened(
            link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 0)
        _ = r.received(hello(nonce: 7, early: true), on: link, now: 0)
        let fresh = LinkID(2)
        let opened = Self.sent(
            r.linkOpened(
                fresh, peerKey: Self.keyB, initiator: false, address: "b2", endpoint: nil, checkpoints: [:], now: 10))
        guard case .subscriptions(let asked, _)? = opened.last, let first = asked.first else {
            Issue.record("no early subscriptions: \(opened)")
            return
        }
        _ = r.received(hello(nonce: 99, early: true), on: fresh, now: 10)
        #expect(r.status.peers.map(\.phase) == ["established", "standby (duplicate)"])
        let answer = WireMessage.batch(
            subscription: .key(spec.key), documents: [Self.record(60, "c1").document], upTo: 60,
            generation: first.generation)
        #expect(r.received(answer, on: fresh, now: 11).isEmpty)  // dropped in standby
        var chosen = r.tick(now: 3_010)
        chosen += r.linkClosed(link, reason: "closed", now: 3_011)
        #expect(r.status.peers.map(\.phase) == ["established"])
        let again = Self.sent(chosen).compactMap { if case .subscriptions(let subs, _) = $0 { subs } else { nil } }
        #expect(again.last?.first?.generation == first.generation &+ 1, "\(chosen)")
    }

    /// Review: a peer that said `es: 1` once and then comes back as a node that does not (an
    /// older Trellis after a rollback) with another epoch (its store replaced or wiped). The early
    /// `subs` it got carried `since: 40` of the old epoch with `e`, which it does not read: it
    /// serves from 40 in its new log. Its hello shows both facts; unless this node asks again
    /// from 0 with a new generation (an unchanged generation never moves a cursor back), the
    /// peer's documents at 1…40 of its new log never arrive.
    @Test func anEarlySinceIgnoredByAPeerThatNoLongerHonoursEpochsIsAskedAgainFromZero() throws {
        var r = replicator()
        let spec = SubscriptionSpec(collection: "cars")
        _ = try r.subscribe(spec, now: 0)
        let oldEpoch = Self.epochB
        let newEpoch: [UInt8] = Array(repeating: 0xE, count: 16)
        let checkpoints = [UTF8Key(spec.key): Checkpoint(epoch: oldEpoch, seq: 40)]
        _ = r.linkOpened(
            LinkID(1), peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: checkpoints,
            now: 0)
        _ = r.received(
            .hello(
                Hello(version: 5, peerKey: Self.keyB, site: 0x102, epoch: oldEpoch, nonce: 7, earlySubscriptions: true)),
            on: LinkID(1), now: 0)
        _ = r.linkClosed(LinkID(1), reason: "peer restarted", now: 1)
        let opened = Self.sent(
            r.linkOpened(
                LinkID(2), peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: checkpoints,
                now: 2))
        guard case .subscriptions(let early, _)? = opened.last, let first = early.first else {
            return #expect(Bool(false), "no early subscriptions: \(opened)")
        }
        #expect(first.since == 40 && first.epoch == oldEpoch)
        // The peer's hello: no `es`, a new epoch. It served `since: 40` in its new log.
        let after = Self.sent(
            r.received(
                .hello(Hello(version: 5, peerKey: Self.keyB, site: 0x103, epoch: newEpoch, nonce: 8)), on: LinkID(2),
                now: 3))
        let again = after.compactMap { if case .subscriptions(let subs, _) = $0 { subs } else { nil } }
        #expect(again.last?.first?.since == 0, "asked again from 0: \(after)")
        #expect(again.last?.first.map { $0.generation != first.generation } == true, "with a new generation")
    }

    /// Review: a second link to B opens while the first is alive (a redial, or B's own dial):
    /// its early `subs` carry `since: 70`. While it waits in standby, B's checkpoint on the first
    /// link turns out to be below this node's floor, so this node asks B again from 0 for the
    /// collection (the stale copies B still holds must meet the reaped keys here). The first
    /// link then goes and the second is chosen: B serves the early `since: 70` there, and an
    /// unchanged generation never moves that cursor back, so the request from 0 is lost (without
    /// the early `subs`, the second link's first `subs` would have read the reset checkpoint).
    @Test func aCheckpointResetWhileTheEarlyLinkWaitsIsAskedOnItWhenChosen() throws {
        var r = replicator()
        let spec = SubscriptionSpec.all("cars")
        _ = try r.subscribe(spec, now: 0)
        let checkpoints = [UTF8Key(spec.key): Checkpoint(epoch: Self.epochB, seq: 70)]
        _ = r.linkOpened(
            link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: checkpoints, now: 0)
        _ = r.received(hello(nonce: 7, early: true), on: link, now: 0)
        let serve = r.received(
            .subscriptions([WireSubscription(spec: spec, since: 40, hops: 0)], version: 1), on: link, now: 1)
        let request = try #require(Self.scans(serve).first)
        // The second link: early subs from the stored checkpoint.
        let fresh = LinkID(2)
        let opened = Self.sent(
            r.linkOpened(
                fresh, peerKey: Self.keyB, initiator: false, address: "b2", endpoint: nil, checkpoints: checkpoints,
                now: 2))
        guard case .subscriptions(let early, _)? = opened.last, let first = early.first else {
            return #expect(Bool(false), "no early subscriptions: \(opened)")
        }
        #expect(first.since == 70)
        // B's checkpoint on the first link is below the floor: B is asked again from 0 there.
        let reset = r.scanned(
            link, request, page: ScanPage(records: [], upTo: 100, exhausted: true, belowFloor: true), now: 3)
        let onFirst = Self.sent(reset).compactMap { if case .subscriptions(let subs, _) = $0 { subs } else { nil } }
        #expect(onFirst.last?.first?.since == 0)
        // B's hello on the second link: standby; then the first link goes and the second is chosen.
        _ = r.received(hello(nonce: 99, early: true), on: fresh, now: 4)
        #expect(r.status.peers.map(\.phase) == ["established", "standby (duplicate)"])
        let chosen = r.linkClosed(link, reason: "closed", now: 5)
        #expect(r.status.peers.map(\.phase) == ["established"])
        let again = chosen.compactMap { d -> [WireSubscription]? in
            if case .send(fresh, .subscriptions(let subs, _)) = d { subs } else { nil }
        }
        #expect(again.last?.first?.since == 0, "asked again from 0 on the chosen link: \(chosen)")
        #expect(again.last?.first.map { $0.generation != first.generation } == true, "with a new generation")
    }

    /// A `since` sent before the subscriber read this node's hello counts in the epoch it names:
    /// this node serves it from there only in that epoch, and from 0 in any other.
    @Test func anEarlySubscriptionOfAnotherEpochIsServedFromZero() throws {
        let spec = SubscriptionSpec(collection: "cars")
        let ownEpoch: [UInt8] = Array(repeating: 0xA, count: 16)
        for (epoch, expected) in [(ownEpoch, Int64(60)), (Array(repeating: 0xE, count: 16), 0)] {
            var r = established()
            let directives = r.received(
                .subscriptions([WireSubscription(spec: spec, since: 60, hops: 0, epoch: epoch)], version: 1), on: link,
                now: 1)
            #expect(Self.scans(directives).map(\.after) == [expected])
            #expect(!directives.contains { if case .log(let line) = $0 { line.contains("regress") } else { false } })
        }
    }

    @Test func subscriptionEpochsAndTheHelloFlagTravel() throws {
        let spec = SubscriptionSpec(collection: "cars")
        for message: WireMessage in [
            .subscriptions([WireSubscription(spec: spec, since: 9, hops: 1, epoch: Self.epochB)], version: 3),
            .subscriptions([WireSubscription(spec: spec, since: 9, hops: 1)], version: 3),
            .hello(
                Hello(version: 5, peerKey: Self.keyB, site: 5, epoch: Self.epochB, nonce: 1, earlySubscriptions: true)),
            .hello(Hello(version: 5, peerKey: Self.keyB, site: 5, epoch: Self.epochB, nonce: 1)),
        ] {
            #expect(try WireMessage(serialized: message.serialized()) == message)
        }
        var bad = WireMessage.subscriptions([WireSubscription(spec: spec, since: 9, hops: 1)]).encoded
        if case .map(var m) = bad, case .array(var subs)? = m["subs"], case .map(var entry) = subs[0] {
            entry["e"] = .bytes([1, 2, 3])
            subs[0] = .map(entry)
            m["subs"] = .array(subs)
            bad = .map(m)
        }
        #expect(throws: WireError.self) { try WireMessage(bad) }
    }

    @Test func anUnknownVersionGetsAnExplicitErrorAndClose() {
        var r = replicator()
        _ = r.linkOpened(
            link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 0)
        let directives = r.received(hello(version: 99), on: link, now: 0)
        guard case .error(let code, let message)? = Self.sent(directives).first else {
            Issue.record("expected an error message, got \(directives)")
            return
        }
        #expect(code == "version" && message.contains("99"))
        #expect(Self.closes(directives) == [link])
        #expect(r.received(hello(), on: link, now: 0).isEmpty)  // closed: nothing more
    }

    @Test func aHelloWithAnotherPeerKeyIsRefused() {
        var r = replicator()
        _ = r.linkOpened(
            link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 0)
        let directives = r.received(hello(Self.keyC), on: link, now: 0)
        #expect(
            Self.sent(directives).first
                == .error(
                    code: "identity", message: "hello names a peer key other than the one the channel authenticated"))
        #expect(Self.closes(directives) == [link])
    }

    @Test func messagesBeforeHelloAreAProtocolError() {
        var r = replicator()
        _ = r.linkOpened(
            link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 0)
        let directives = r.received(.ack(subscription: "x", upTo: 1), on: link, now: 0)
        #expect(Self.sent(directives).first == .error(code: "protocol", message: "expected hello first"))
    }

    // MARK: Item 13: integers from the wire

    @Test func outOfRangeIntegersAreRefusedAtDecode() {
        func subs(hops: Int64 = 0, since: Int64 = 0, gen: Int64 = 0) -> Value {
            [
                "t": "subs",
                "subs": [
                    ["c": "cars", "q": "true", "a": [:], "since": .int(since), "hops": .int(hops), "gen": .int(gen)]
                ],
            ]
        }
        #expect(throws: WireError.self) { try WireMessage(subs(hops: Int64.max)) }
        #expect(throws: WireError.self) { try WireMessage(subs(hops: Int64(WireMessage.maxHops) + 1)) }
        #expect(throws: WireError.self) { try WireMessage(subs(hops: -1)) }
        #expect(throws: WireError.self) { try WireMessage(subs(since: -5)) }
        #expect(throws: WireError.self) { try WireMessage(subs(gen: Int64(UInt32.max) + 1)) }
        #expect(throws: WireError.self) {
            try WireMessage(["t": "batch", "sub": "s", "docs": [], "upTo": -1])
        }
        #expect(throws: WireError.self) {
            try WireMessage([
                "t": "hello", "v": .int(1 << 40), "key": .bytes(Self.keyB), "site": 1, "epoch": .bytes(Self.epochB),
            ])
        }
        #expect(throws: WireError.self) {
            try WireMessage(["t": "subs", "subs": [["c": "a\u{1F}b", "q": "true", "since": 0, "hops": 0]]])
        }
        #expect((try? WireMessage(subs(hops: Int64(WireMessage.maxHops)))) != nil)
    }

    /// A peer that forwards subscriptions at the largest hop count the wire allows cannot make
    /// this node overflow anything, and they are not forwarded further than the hop limit.
    @Test func hostileButWellFormedSubscriptionsAreServedOrRefusedNeverTrap() throws {
        var r = established()
        let c = LinkID(2)
        _ = r.linkOpened(c, peerKey: Self.keyC, initiator: false, address: "c", endpoint: nil, checkpoints: [:], now: 0)
        _ = r.received(hello(Self.keyC), on: c, now: 0)
        let far = WireSubscription(
            spec: SubscriptionSpec(collection: "cars", query: "x == 1"), since: Int64.max, hops: WireMessage.maxHops)
        let directives = r.received(.subscriptions([far]), on: link, now: 0)
        // Not forwarded to C (beyond the hop limit) ...
        #expect(!directives.contains { if case .send(c, .subscriptions) = $0 { true } else { false } })
        // ... and `since` beyond this log means the log regressed: rotate, never trap.
        #expect(directives.contains { if case .rotateLog = $0 { true } else { false } })
    }

    // MARK: Item 5: one bad subscription

    @Test func aSubscriptionThatCannotRunGetsItsOwnErrorAndTheOthersAreServed() {
        var r = established()
        let bad = SubscriptionSpec(collection: "cars", query: "Cylinders == $args.x")
        let good = SubscriptionSpec(collection: "cars", query: "Origin == 'Japan'")
        let directives = r.received(
            .subscriptions([
                WireSubscription(spec: bad, since: 0, hops: 0), WireSubscription(spec: good, since: 0, hops: 0),
            ]),
            on: link, now: 0)
        #expect(
            Self.sent(directives).contains {
                if case .subscriptionError(bad.key, "query", _) = $0 { true } else { false }
            })
        #expect(Self.scans(directives).map(\.spec) == [good])
        #expect(Self.closes(directives).isEmpty)
    }

    /// A scan that fails (SQLite refusing a query) leaves the cursor alone, tells the peer, and is
    /// retried with backoff; the session goes on.
    @Test func aFailedScanIsRetriedFromTheSameCursor() throws {
        var r = established()
        let spec = SubscriptionSpec(collection: "cars", query: "Origin == 'Japan'")
        let request = try #require(
            Self.scans(r.received(.subscriptions([WireSubscription(spec: spec, since: 7, hops: 0)]), on: link, now: 0))
                .first)
        let failed = r.scanFailed(link, request, error: "SQLite error 1 (Expression tree is too large)", now: 10)
        #expect(
            Self.sent(failed).contains {
                if case .subscriptionError(spec.key, "unavailable", _) = $0 { true } else { false }
            })
        #expect(Self.closes(failed).isEmpty)
        #expect(Self.scans(r.tick(now: 1_000)).isEmpty)  // not yet
        let retry = Self.scans(r.tick(now: 10 + 5_000))
        #expect(retry.map(\.after) == [7])
    }

    @Test func moreSubscriptionsThanTheLimitAreRefusedOneByOneNotTheSession() {
        var r = established { $0.maxServedSubscriptions = 3 }
        let subs = (0..<5).map { WireSubscription(spec: SubscriptionSpec(collection: "c\($0)"), since: 0, hops: 0) }
        let directives = r.received(.subscriptions(subs), on: link, now: 0)
        let limited = Self.sent(directives).filter {
            if case .subscriptionError(_, "limit", _) = $0 { true } else { false }
        }
        #expect(limited.count == 2)
        #expect(Self.scans(directives).count == 3)
        #expect(Self.closes(directives).isEmpty)
    }

    /// Subscriptions forwarded from many peers above the cap collapse into whole collections
    /// instead of making the receiver refuse them.
    @Test func forwardedSubscriptionsAboveTheCapCollapseIntoWholeCollections() throws {
        var r = established { $0.maxAskedSubscriptions = 10 }
        let c = LinkID(2)
        _ = r.linkOpened(c, peerKey: Self.keyC, initiator: false, address: "c", endpoint: nil, checkpoints: [:], now: 0)
        _ = r.received(hello(Self.keyC), on: c, now: 0)
        // C's own presence record: it has no other session (its subscriptions are relayed).
        _ = r.received(
            .presence([PresenceRecord(peerKey: Self.keyC, version: 5, seq: 1, neighbors: [])]), on: c, now: 0)
        let many = (0..<40).map {
            WireSubscription(spec: SubscriptionSpec(collection: "items", query: "_id == 'd\($0)'"), since: 0, hops: 0)
        }
        let directives = r.received(
            .subscriptions(many + [WireSubscription(spec: .all("other"), since: 0, hops: 1)]), on: c, now: 0)
        let toB = Self.sent(directives).compactMap { if case .subscriptions(let s, _) = $0 { s } else { nil } }.last
        let asked = try #require(toB)
        #expect(asked.count == 2)
        #expect(Set(asked.map(\.spec)) == [.all("items"), .all("other")])
        #expect(asked.first { $0.spec == .all("items") }?.hops == 1)
    }

    // MARK: Item 3: echo suppression lives in the session

    @Test func aStateIsNotSentBackToThePeerThatSentItInThisSessionOnly() throws {
        var r = established()
        let spec = SubscriptionSpec(collection: "cars")
        _ = try r.subscribe(spec, now: 0)
        // B sends p1; this node asked for cars.
        _ = r.received(
            .batch(
                subscription: .key(spec.key), documents: [Self.record(1, "p1", state: [9, 9]).document], upTo: 1,
                generation: 0), on: link, now: 0)
        let request = try #require(
            Self.scans(r.received(.subscriptions([WireSubscription(spec: spec, since: 0, hops: 0)]), on: link, now: 0))
                .first)
        // The merged row is exactly what B sent: skipped. Another document goes.
        let page = ScanPage(
            records: [Self.record(101, "p1", state: [9, 9]), Self.record(102, "p2")], upTo: 102, exhausted: true)
        let batch = Self.sent(r.scanned(link, request, page: page, now: 0))
        #expect(batch.count == 1)
        guard case .batch(_, let docs, 102, _, _)? = batch.first else {
            Issue.record("no batch: \(batch)")
            return
        }
        #expect(docs.map(\.id) == ["p2"])
        // A new session (B evicted p1, wiped its store, restored a backup...) gets p1 again.
        _ = r.linkClosed(link, reason: "gone", now: 1)
        let again = LinkID(9)
        _ = r.linkOpened(
            again, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 2)
        _ = r.received(hello(), on: again, now: 2)
        let second = try #require(
            Self.scans(r.received(.subscriptions([WireSubscription(spec: spec, since: 0, hops: 0)]), on: again, now: 2))
                .first)
        let resent = Self.sent(r.scanned(again, second, page: page, now: 2))
        guard case .batch(_, let docs2, _, _, _)? = resent.first else {
            Issue.record("no batch: \(resent)")
            return
        }
        #expect(docs2.map(\.id) == ["p1", "p2"])
    }

    // MARK: Item 4: byte budget

    @Test func aStateTooLargeForOneMessageIsReportedAndSkippedNotLooped() throws {
        var r = established { $0.maxStateBytes = 10 }
        let spec = SubscriptionSpec(collection: "cars")
        let request = try #require(
            Self.scans(r.received(.subscriptions([WireSubscription(spec: spec, since: 0, hops: 0)]), on: link, now: 0))
                .first)
        #expect(request.maxBytes == ReplicatorConfiguration(peerKey: Self.keyA).batchBytes)
        let page = ScanPage(
            records: [Self.record(1, "big", state: Array(repeating: 1, count: 11)), Self.record(2, "small")], upTo: 2,
            exhausted: true)
        let directives = r.scanned(link, request, page: page, now: 0)
        #expect(directives.contains { if case .log(let text) = $0 { text.contains("big") } else { false } })
        guard case .batch(_, let docs, 2, _, _)? = Self.sent(directives).first else {
            Issue.record("no batch")
            return
        }
        #expect(docs.map(\.id) == ["small"])
    }

    /// An ack tells the store which of this node's unacknowledged writes the peer now holds:
    /// those of the batch with exactly the acknowledged `upTo` (a batch before it may have been
    /// postponed there), and nothing for a batch that carried none.
    @Test func anAckNamesTheUnacknowledgedWritesOfItsBatchOnly() throws {
        var r = established()
        let spec = SubscriptionSpec(collection: "cars")
        let first = try #require(
            Self.scans(r.received(.subscriptions([WireSubscription(spec: spec, since: 0, hops: 0)]), on: link, now: 0))
                .first)
        let more = r.scanned(
            link, first,
            page: ScanPage(
                records: [Self.record(1, "a", unacknowledged: true), Self.record(2, "b")], upTo: 2, exhausted: false),
            now: 0)
        let second = try #require(Self.scans(more).first)
        let last = r.scanned(
            link, second,
            page: ScanPage(records: [Self.record(3, "c", unacknowledged: true)], upTo: 3, exhausted: true),
            now: 0)
        #expect(Self.sent(more + last).count == 2)
        let key = { (id: String) in JSON.string(.string(id)) }
        #expect(
            Self.acknowledged(r.received(.ack(subscription: .key(first.subscription), upTo: 3), on: link, now: 0)) == [
                AcknowledgedEntry(collection: "cars", key: key("c"), seq: 3)
            ])
        #expect(
            Self.acknowledged(r.received(.ack(subscription: .key(first.subscription), upTo: 2), on: link, now: 0)) == [
                AcknowledgedEntry(collection: "cars", key: key("a"), seq: 1)
            ])
        #expect(
            Self.acknowledged(r.received(.ack(subscription: .key(first.subscription), upTo: 2), on: link, now: 0))
                .isEmpty)
    }

    /// A page cut at `batchEntries` is followed, when nothing more is in the log, by the empty
    /// end-of-log batch (`left: 0`) with the same `upTo`. Acks name only `upTo`, so the ack of
    /// the empty batch (the peer may have postponed the first one, which it does not
    /// acknowledge) acknowledges no write. An ack that says documents were deferred does not
    /// either.
    @Test func theAckOfTheEmptyEndBatchIsNotTheAckOfThePageBeforeIt() throws {
        var r = established()
        let spec = SubscriptionSpec(collection: "cars")
        let first = try #require(
            Self.scans(r.received(.subscriptions([WireSubscription(spec: spec, since: 0, hops: 0)]), on: link, now: 0))
                .first)
        let more = r.scanned(
            link, first,
            page: ScanPage(
                records: [Self.record(1, "a", unacknowledged: true), Self.record(2, "b")], upTo: 2, exhausted: false),
            now: 0)
        let second = try #require(Self.scans(more).first)
        let last = r.scanned(link, second, page: ScanPage(records: [], upTo: 2, exhausted: true), now: 0)
        let batches = Self.sent(more + last).compactMap { message -> Int64? in
            if case .batch(_, _, let upTo, _, _) = message { return upTo }
            return nil
        }
        #expect(batches == [2, 2], "two batches in flight with the same upTo")
        // The peer postponed the first batch (no ack) and applied the empty one.
        let acknowledged = Self.acknowledged(
            r.received(.ack(subscription: .key(first.subscription), upTo: 2), on: link, now: 0))
        #expect(acknowledged.isEmpty, "one ack of upTo 2 cannot tell which batch was applied: \(acknowledged)")
        // A later batch whose ack says the peer deferred some of its documents.
        let third = try #require(Self.scans(r.committed(collections: ["cars"], lastSeq: 3, now: 1)).first)
        _ = r.scanned(
            link, third, page: ScanPage(records: [Self.record(3, "c", unacknowledged: true)], upTo: 3, exhausted: true),
            now: 1)
        let deferred = r.received(
            .ack(subscription: .key(first.subscription), upTo: 3, deferred: true), on: link, now: 1)
        #expect(!deferred.contains { if case .acknowledged = $0 { true } else { false } })
    }

    // MARK: Perf P1, P2

    @Test func aCommitScansOnlyTheSubscriptionsOfItsCollections() throws {
        var r = established()
        let cars = SubscriptionSpec(collection: "cars")
        let trucks = SubscriptionSpec(collection: "trucks")
        let first = r.received(
            .subscriptions([
                WireSubscription(spec: cars, since: 0, hops: 0), WireSubscription(spec: trucks, since: 0, hops: 0),
            ]),
            on: link, now: 0)
        for request in Self.scans(first) {
            _ = r.scanned(link, request, page: ScanPage(records: [], upTo: 100, exhausted: true), now: 0)
            _ = r.received(.ack(subscription: .key(request.subscription), upTo: 100), on: link, now: 0)
        }
        let directives = r.committed(collections: ["trucks"], lastSeq: 101, now: 1)
        #expect(Self.scans(directives).map(\.spec) == [trucks])
    }

    /// Query subscriptions the store checked a commit against and found unconcerned do not scan
    /// for it; whole-collection subscriptions and unchecked ones do.
    @Test func aCommitSkipsTheQuerySubscriptionsItDoesNotConcern() throws {
        var r = established()
        let red = SubscriptionSpec(collection: "cars", query: "color == 'red'")
        let blue = SubscriptionSpec(collection: "cars", query: "color == 'blue'")
        let green = SubscriptionSpec(collection: "cars", query: "color == 'green'")
        let all = SubscriptionSpec(collection: "cars")
        let first = r.received(
            .subscriptions([red, blue, green, all].map { WireSubscription(spec: $0, since: 0, hops: 0) }), on: link,
            now: 0)
        for request in Self.scans(first) {
            _ = r.scanned(link, request, page: ScanPage(records: [], upTo: 100, exhausted: true), now: 0)
            _ = r.received(.ack(subscription: .key(request.subscription), upTo: 100), on: link, now: 0)
        }
        // Checked: red and blue, blue unconcerned; green was not checked (the store does not serve
        // it yet, say), and the whole collection needs no check.
        let directives = r.committed(
            collections: ["cars"], lastSeq: 101, unconcerned: ["cars": [blue.scopeHash, all.scopeHash]], now: 1)
        #expect(Set(Self.scans(directives).map(\.spec.query)) == ["color == 'red'", "color == 'green'", "true"])
    }

    @Test func resentSubscriptionsDoNotRewindCursorsUnlessTheGenerationChanged() throws {
        var r = established()
        let cars = SubscriptionSpec(collection: "cars")
        let request = try #require(
            Self.scans(r.received(.subscriptions([WireSubscription(spec: cars, since: 0, hops: 0)]), on: link, now: 0))
                .first)
        _ = r.scanned(link, request, page: ScanPage(records: [Self.record(50, "x")], upTo: 90, exhausted: true), now: 0)
        // The peer re-sends its set (another subscription came) with its durable checkpoint 0.
        let trucks = SubscriptionSpec(collection: "trucks")
        let resent = r.received(
            .subscriptions([
                WireSubscription(spec: cars, since: 0, hops: 0), WireSubscription(spec: trucks, since: 0, hops: 0),
            ]),
            on: link, now: 1)
        #expect(Self.scans(resent).map(\.spec) == [trucks])
        #expect(r.status.peers.first?.served.first { $0.spec == cars }?.cursor == 90)
        // After an eviction the peer raises the generation: rescan from its `since`.
        let rescan = r.received(
            .subscriptions([WireSubscription(spec: cars, since: 0, hops: 0, generation: 1)]), on: link, now: 2)
        _ = rescan
        #expect(r.status.peers.first?.served.first { $0.spec == cars }?.cursor == 0)
    }

    /// Evicted documents are asked for again by `_id` under each subscription of their
    /// collection, with no checkpoint; the refetch ends once all of them arrived and were applied.
    @Test func evictedDocumentsAreAskedForAgainByIDUntilTheyArrive() throws {
        var r = established()
        let spec = SubscriptionSpec(collection: "cars", query: "n > $args.min", args: ["min": 1])
        _ = try r.subscribe(spec, now: 0)
        let asked = r.refetch("cars", ids: ["c1", "c2"], now: 1)
        let refetch = try #require(Refetch.specs(for: spec, ids: ["c1", "c2"]).first)
        #expect(refetch.query == "(n > $args.min) && _id IN $args.trellisEvicted")
        #expect(Refetch.ids(of: refetch) == ["c1", "c2"] && Refetch.ids(of: spec) == nil)
        // The subscription it came from, whose scope records the tombstones it brings.
        #expect(Refetch.base(of: refetch) == spec && Refetch.base(of: spec) == nil)
        let bare = SubscriptionSpec(collection: "cars", query: ") && _id IN $args.trellisEvicted", args: refetch.args)
        #expect(Refetch.base(of: bare) == nil)
        guard case .subscriptions(let subs, _)? = Self.sent(asked).first else {
            Issue.record("no subscriptions sent")
            return
        }
        #expect(Set(subs.map(\.spec)) == [spec, refetch])
        #expect(subs.first { $0.spec == refetch }?.since == 0)
        func apply(_ d: [ReplicatorDirective]) -> ApplyRequest? {
            d.compactMap { if case .apply(_, let a) = $0 { a } else { nil } }.first
        }
        let first = r.received(
            .batch(
                subscription: .key(refetch.key), documents: [Self.record(5, "c1").document], upTo: 50, generation: 0),
            on: link, now: 2)
        #expect(apply(first)?.storeCheckpoint == false)
        #expect(Self.sent(first).isEmpty)  // c2 is still missing: the refetch stays
        _ = r.applied(link, subscription: refetch.key, upTo: 50, checkpointStored: false, deferred: 0, now: 2)
        let second = r.received(
            .batch(
                subscription: .key(refetch.key), documents: [Self.record(6, "c2").document], upTo: 60, generation: 0),
            on: link, now: 3)
        // It ends once the batch that brought the last one is applied (not still withholding a value).
        #expect(!Self.sent(second).contains { if case .subscriptions = $0 { true } else { false } })
        let applied = r.applied(link, subscription: refetch.key, upTo: 60, checkpointStored: false, deferred: 0, now: 3)
        guard
            case .subscriptions(let after, _)? = Self.sent(applied).first(where: {
                if case .subscriptions = $0 { true } else { false }
            })
        else {
            Issue.record("the refetch was not dropped")
            return
        }
        #expect(after.map(\.spec) == [spec])
        // Nothing is asked again for a collection without a subscription.
        #expect(r.refetch("other", ids: ["x"], now: 4).isEmpty)
    }

    /// A peer whose checkpoint is below the retained floor gets the subscription again from 0,
    /// and is asked again from 0 for this node's subscriptions in that collection, once per
    /// session; the pages that follow (below the floor too) are served on, not restarted again.
    @Test func aCheckpointBelowTheFloorRestartsFromZeroAndAsksThePeerAgain() throws {
        var r = established(
            lastSeq: 100,
            checkpoints: [UTF8Key(SubscriptionSpec.all("cars").key): Checkpoint(epoch: Self.epochB, seq: 70)])
        _ = try r.subscribe(.all("cars"), now: 0)
        let serve = r.received(
            .subscriptions([WireSubscription(spec: .all("cars"), since: 40, hops: 0, generation: 0)]), on: link, now: 1)
        let request = try #require(Self.scans(serve).first)
        #expect(request.after == 40)
        let result = r.scanned(
            link, request, page: ScanPage(records: [], upTo: 100, exhausted: true, belowFloor: true), now: 2)
        let again = Self.sent(result).compactMap { if case .subscriptions(let subs, _) = $0 { subs } else { nil } }
        #expect(again.first?.first?.since == 0)
        #expect(again.first?.first?.generation == 1)
        let fromZero = try #require(Self.scans(result).first)
        #expect(fromZero.after == 0)
        // The next page starts below the floor too (the floor lies above the first documents):
        // it is served, not restarted.
        let first = r.scanned(
            link, fromZero,
            page: ScanPage(records: [Self.record(3, "c1")], upTo: 3, exhausted: false, belowFloor: false), now: 3)
        let next = try #require(Self.scans(first).first)
        #expect(next.after == 3)
        let second = r.scanned(
            link, next, page: ScanPage(records: [Self.record(90, "c2")], upTo: 100, exhausted: true, belowFloor: true),
            now: 4)
        #expect(
            Self.sent(second).contains {
                if case .batch(_, let docs, 100, _, _) = $0 { docs.count == 1 } else { false }
            })
        #expect(!Self.sent(second).contains { if case .subscriptions = $0 { true } else { false } })
        #expect(Self.scans(second).allSatisfy { $0.after != 0 })
    }

    /// A batch of an older rescan generation merges but does not overwrite the checkpoint an
    /// eviction reset (else the evicted documents would never come back).
    @Test func aBatchOfAnOlderGenerationDoesNotStoreItsCheckpoint() throws {
        var r = established()
        let spec = SubscriptionSpec(collection: "cars")
        _ = try r.subscribe(spec, now: 0)
        let evicted = r.evicted("cars", generation: 3, now: 1)
        #expect(
            Self.sent(evicted) == [
                .subscriptions(
                    [WireSubscription(spec: spec, since: 0, hops: 0, generation: 3, deltas: true)], version: 3)
            ])
        let old = r.received(
            .batch(subscription: .key(spec.key), documents: [], upTo: 80, generation: 0), on: link, now: 2)
        let new = r.received(
            .batch(subscription: .key(spec.key), documents: [], upTo: 10, generation: 3), on: link, now: 3)
        func stores(_ d: [ReplicatorDirective]) -> Bool? {
            d.compactMap { if case .apply(_, let a) = $0 { a.storeCheckpoint } else { nil } }.first
        }
        #expect(stores(old) == false)
        #expect(stores(new) == true)
    }

    /// A batch the store postpones (too many of the peer's documents wait to be retried) is not
    /// acknowledged; the batches already in flight behind it must not move the checkpoint past
    /// it: the subscription is asked again from the last stored checkpoint under a new
    /// generation, and only batches of that generation store their checkpoint.
    @Test func batchesBehindAPostponedOneDoNotSkipIt() throws {
        var r = established(checkpoints: ["cars\u{1F}true\u{1F}{}": Checkpoint(epoch: Self.epochB, seq: 20)])
        let spec = SubscriptionSpec(collection: "cars")
        _ = try r.subscribe(spec, now: 0)
        func stores(_ d: [ReplicatorDirective]) -> Bool? {
            d.compactMap { if case .apply(_, let a) = $0 { a.storeCheckpoint } else { nil } }.first
        }
        func asked(_ d: [ReplicatorDirective]) -> [WireSubscription]? {
            Self.sent(d).compactMap { m -> [WireSubscription]? in
                if case .subscriptions(let subs, _) = m { subs } else { nil }
            }.first
        }
        let first = r.received(
            .batch(subscription: .key(spec.key), documents: [], upTo: 30, generation: 0), on: link, now: 1)
        #expect(stores(first) == true)
        _ = r.applied(link, subscription: spec.key, upTo: 30, checkpointStored: true, deferred: 0, now: 1)
        let postponed = r.received(
            .batch(subscription: .key(spec.key), documents: [], upTo: 40, generation: 0), on: link, now: 2)
        #expect(stores(postponed) == true)
        #expect(asked(r.applyPostponed(link, subscription: spec.key, reason: "limit", now: 2)) == nil)
        // A batch behind the postponed one: merged, its checkpoint not stored.
        let behind = r.received(
            .batch(subscription: .key(spec.key), documents: [], upTo: 50, generation: 0), on: link, now: 3)
        #expect(stores(behind) == false)
        #expect(r.applyPostponed(link, subscription: spec.key, reason: "limit", now: 3).isEmpty)  // once per round
        // After the retry interval the subscription is asked again from the stored checkpoint.
        #expect(asked(r.tick(now: 1_000)) == nil)
        let again = try #require(
            asked(r.tick(now: 2 + ReplicatorConfiguration(peerKey: Self.keyA).deferredRetryInterval)))
        #expect(again.first?.since == 30)
        let generation = try #require(again.first?.generation)
        #expect(generation != 0)
        let old = r.received(
            .batch(subscription: .key(spec.key), documents: [], upTo: 60, generation: 0), on: link, now: 6_000)
        #expect(stores(old) == false)
        let resent = r.received(
            .batch(subscription: .key(spec.key), documents: [], upTo: 40, generation: generation), on: link, now: 6_001)
        #expect(stores(resent) == true)
    }

    /// Documents deferred in an earlier run are retried soon after start, not only once this run
    /// defers another one.
    @Test func documentsDeferredBeforeARestartAreRetried() {
        var r = replicator()
        let directives = r.tick(now: 10_000)
        #expect(directives.contains { if case .retryDeferred = $0 { true } else { false } })
    }

    /// A merge that fails part-way (disk full in a later piece) may have kept documents of its
    /// earlier pieces aside: a retry is scheduled even if the peer never sends the batch again.
    @Test func documentsDeferredByAMergeThatFailedLaterAreRetried() throws {
        var r = established()
        r.deferredRetried(remaining: 0, now: 0)  // nothing deferred so far
        let spec = SubscriptionSpec(collection: "cars")
        _ = try r.subscribe(spec, now: 0)
        _ = r.received(.batch(subscription: .key(spec.key), documents: [], upTo: 30, generation: 0), on: link, now: 1)
        _ = r.applyFailed(link, subscription: spec.key, error: "disk full", now: 1)
        let interval = ReplicatorConfiguration(peerKey: Self.keyA).deferredRetryInterval
        let directives = r.tick(now: 1 + interval)
        #expect(directives.contains { if case .retryDeferred = $0 { true } else { false } })
    }

    // MARK: Item 6: regressed log

    @Test func aPeerHoldingACheckpointBeyondThisLogRotatesIt() {
        var r = established(lastSeq: 40)
        let directives = r.received(
            .subscriptions([WireSubscription(spec: .all("cars"), since: 41, hops: 0)]), on: link, now: 0)
        #expect(directives.contains { if case .rotateLog = $0 { true } else { false } })
        let rotated = r.logRotated(LocalLog(epoch: Array(repeating: 0xE, count: 16), site: 99, lastSeq: 40), now: 1)
        #expect(Self.closes(rotated) == [link])  // peers reconnect and see the new epoch
    }

    // MARK: Item 15: liveness, duplicates, dialing

    @Test func anIdleLinkSendsKeepalivesAndASilentOneIsClosed() {
        var r = established()
        let pings = Self.sent(r.tick(now: 5_000))
        #expect(pings.count == 1 && pings.allSatisfy { if case .ping = $0 { true } else { false } })
        #expect(Self.sent(r.received(.ping(5), on: link, now: 6_000)) == [.pong(5)])
        #expect(Self.closes(r.tick(now: 20_999)).isEmpty)
        #expect(Self.closes(r.tick(now: 21_000)) == [link])
    }

    /// A restarted peer dials again while this node still holds the old (dead) link: the old link
    /// is probed, does not answer, and the new one takes over within the probe timeout.
    @Test func aNewLinkReplacesAnOldOneThatNoLongerAnswers() {
        var r = established()
        let fresh = LinkID(2)
        _ = r.linkOpened(
            fresh, peerKey: Self.keyB, initiator: false, address: "b2", endpoint: nil, checkpoints: [:], now: 10)
        let probe = r.received(hello(nonce: 99), on: fresh, now: 10)
        #expect(probe.contains { if case .send(self.link, .ping) = $0 { true } else { false } })
        #expect(Self.closes(r.tick(now: 3_000)).isEmpty)
        #expect(Self.closes(r.tick(now: 3_010)) == [link])
        _ = r.linkClosed(link, reason: "closed", now: 3_011)
        #expect(r.status.peers.map(\.phase) == ["established"])
        #expect(r.status.peers.map(\.link) == [fresh])
    }

    /// Two live links between the same pair: both ends keep the same one (dialer key, then the
    /// dialer's nonce), whichever arrived first.
    @Test func bothEndsKeepTheSameOfTwoLiveLinks() throws {
        for order in [false, true] {
            var a = replicator(Self.keyA)
            var b = replicator(Self.keyB)
            let ab = LinkID(1)  // dialed by A
            let ba = LinkID(2)  // dialed by B
            func hellos(_ d: [ReplicatorDirective]) -> Hello? {
                d.compactMap { if case .send(_, .hello(let h)) = $0 { h } else { nil } }.first
            }
            let aHelloOnAB = try #require(
                hellos(
                    a.linkOpened(
                        ab, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 0))
            )
            let bHelloOnAB = try #require(
                hellos(
                    b.linkOpened(
                        ab, peerKey: Self.keyA, initiator: false, address: "a", endpoint: nil, checkpoints: [:], now: 0)
                ))
            let bHelloOnBA = try #require(
                hellos(
                    b.linkOpened(
                        ba, peerKey: Self.keyA, initiator: true, address: "a", endpoint: nil, checkpoints: [:], now: 0))
            )
            let aHelloOnBA = try #require(
                hellos(
                    a.linkOpened(
                        ba, peerKey: Self.keyB, initiator: false, address: "b", endpoint: nil, checkpoints: [:], now: 0)
                ))
            // A sees AB first, B sees BA first (or the other way round).
            let aFirst: [(LinkID, Hello)] =
                order ? [(ab, bHelloOnAB), (ba, bHelloOnBA)] : [(ba, bHelloOnBA), (ab, bHelloOnAB)]
            let bFirst: [(LinkID, Hello)] =
                order ? [(ba, aHelloOnBA), (ab, aHelloOnAB)] : [(ab, aHelloOnAB), (ba, aHelloOnBA)]
            var aClosed: [LinkID] = []
            var bClosed: [LinkID] = []
            var aProbe: [ReplicatorDirective] = []
            var bProbe: [ReplicatorDirective] = []
            for (l, h) in aFirst { aProbe += a.received(.hello(h), on: l, now: 1) }
            for (l, h) in bFirst { bProbe += b.received(.hello(h), on: l, now: 1) }
            // Answer each side's probe ping with a pong on the same link.
            for case .send(let l, .ping(let n)) in aProbe {
                aClosed += Self.closes(a.received(.pong(n), on: l, now: 2))
            }
            for case .send(let l, .ping(let n)) in bProbe {
                bClosed += Self.closes(b.received(.pong(n), on: l, now: 2))
            }
            #expect(
                aClosed.count == 1 && aClosed == bClosed, "order \(order): A closed \(aClosed), B closed \(bClosed)")
        }
    }

    @Test func aStaticPeerIsDialedWithBackoffAndNotWhileASessionExists() throws {
        var r = replicator()
        r.deferredRetried(remaining: 0, now: 0)  // nothing deferred from an earlier run
        #expect(r.addPeer("b:4040", now: 0) == [.dial("b:4040")])
        #expect(r.tick(now: 100).isEmpty)  // already dialing
        _ = r.dialFailed("b:4040", reason: "refused", now: 100)
        var attempts: [Millis] = []
        var now: Millis = 100
        while attempts.count < 8 {
            now += 50
            for case .dial(let e) in r.tick(now: now) {
                #expect(e == "b:4040")
                attempts.append(now)
                _ = r.dialFailed(e, reason: "refused", now: now)
            }
        }
        let gaps = zip(attempts.dropFirst(), attempts).map { $0 - $1 }
        #expect(gaps.last! > gaps.first!)  // backing off
        #expect(gaps.allSatisfy { $0 <= 45_000 })  // capped (30 s × 1.5 jitter)
        // Connected: no dial while the session lasts, even if another link is the one kept.
        _ = r.linkOpened(
            link, peerKey: Self.keyB, initiator: true, address: "b:4040", endpoint: "b:4040", checkpoints: [:], now: now
        )
        _ = r.received(hello(), on: link, now: now)
        let inbound = LinkID(2)
        _ = r.linkOpened(
            inbound, peerKey: Self.keyB, initiator: false, address: "b", endpoint: nil, checkpoints: [:], now: now)
        _ = r.received(hello(nonce: 0), on: inbound, now: now)
        _ = r.linkClosed(link, reason: "duplicate", now: now + 1)
        var dialsWhileConnected = 0
        for t in stride(from: now + 2, to: now + 120_000, by: 1_000) {
            _ = r.received(.ping(1), on: inbound, now: t)
            dialsWhileConnected += r.tick(now: t).filter { if case .dial = $0 { true } else { false } }.count
        }
        #expect(dialsWhileConnected == 0)
    }

    @Test func aNodeThatDialsItselfStopsDialingThatAddress() {
        var r = replicator()
        _ = r.addPeer("self:1", now: 0)
        _ = r.linkOpened(
            link, peerKey: Self.keyA, initiator: true, address: "self:1", endpoint: "self:1", checkpoints: [:], now: 0)
        let directives = r.received(hello(Self.keyA), on: link, now: 0)
        #expect(Self.closes(directives) == [link])
        _ = r.linkClosed(link, reason: "closed", now: 1)
        let dials = (1...100).flatMap { r.tick(now: Millis($0) * 1_000) }.filter {
            if case .dial = $0 { true } else { false }
        }
        #expect(dials.isEmpty)
    }
}

/// Deltas on the wire (docs/DELTAS.md): who gets them, and what a receiver that cannot apply one
/// asks for.
@Suite struct ReplicatorDeltaTests {
    let link = LinkID(1)
    let t = ReplicatorTests()

    /// A record whose row keeps a delta based on `baseSeq`.
    static func record(_ seq: Int64, _ id: String, baseSeq: Int64, delta: [UInt8] = [0xA3, 0x61, 0x62, 1]) -> LogRecord
    {
        var record = ReplicatorTests.record(seq, id, state: Array(repeating: 7, count: 100))
        record.delta = LogDelta(bytes: delta, baseSeq: baseSeq)
        return record
    }

    /// A sender's state after one field of a two-field document changed (site 9, 10 ms then
    /// 11 ms), as whole-state bytes, and the delta of that change.
    static func oneFieldChange() throws -> (whole: [UInt8], delta: StateDelta) {
        var sender = DocumentState()
        sender.merge(fields: ["a": 1, "b": 2], stamp: Stamp(time: HLCTimestamp(millis: 10, logical: 0), site: 9))
        let old = sender
        sender.merge(fields: ["a": 3], stamp: Stamp(time: HLCTimestamp(millis: 11, logical: 0), site: 9))
        let whole = sender.cbor()
        return (whole, try #require(StateDelta.make(from: old, to: sender, previous: nil, digest: StateDigest(whole))))
    }

    /// The states of the documents of the batches in `directives`.
    static func states(_ directives: [ReplicatorDirective]) -> [[UInt8]] {
        ReplicatorTests.sent(directives).flatMap { message -> [[UInt8]] in
            if case .batch(_, let docs, _, _, _) = message { return docs.map(\.state) }
            return []
        }
    }

    @Test func aDeltaGoesOnlyToAPeerThatAskedForItAndAcknowledgedItsBase() throws {
        for (spec, deltas, since, expectDelta) in [
            (SubscriptionSpec(collection: "cars"), true, 50, true),
            (SubscriptionSpec(collection: "cars"), true, 40, false),  // the base at 45 is not acknowledged
            (SubscriptionSpec(collection: "cars"), false, 50, false),  // not asked for
            (SubscriptionSpec(collection: "cars", query: "price > 1"), true, 50, false),  // a query: may lack it
        ] {
            var r = t.established(compactNames: true)
            let asked = ReplicatorTests.scans(
                r.received(
                    .subscriptions([WireSubscription(spec: spec, since: Int64(since), hops: 0, deltas: deltas)]),
                    on: link, now: 0))
            let request = try #require(asked.first)
            let page = ScanPage(records: [Self.record(60, "x", baseSeq: 45)], upTo: 60, exhausted: true)
            let states = Self.states(r.scanned(link, request, page: page, now: 0))
            #expect(states.count == 1)
            #expect((states.first?.count == 4) == expectDelta, "\(spec) deltas \(deltas) since \(since)")
        }
    }

    @Test func aReceivedDeltaIsRememberedByTheDigestOfTheSendersWholeState() throws {
        var r = t.established()
        let spec = SubscriptionSpec(collection: "cars")
        _ = try r.subscribe(spec, now: 0)
        let (whole, delta) = try Self.oneFieldChange()
        _ = r.received(
            .batch(
                subscription: .key(spec.key),
                documents: [WireDocument(collection: "cars", id: "x", state: delta.encoded())], upTo: 5,
                generation: 0), on: link, now: 0)
        // This node's row then holds the sender's whole state: not sent back.
        let request = try #require(
            ReplicatorTests.scans(
                r.received(.subscriptions([WireSubscription(spec: spec, since: 0, hops: 0)]), on: link, now: 0)
            ).first)
        let page = ScanPage(records: [ReplicatorTests.record(101, "x", state: whole)], upTo: 101, exhausted: true)
        #expect(Self.states(r.scanned(link, request, page: page, now: 0)).isEmpty)
    }

    @Test func aDeltaTheStoreCannotApplyAsksAgainWithoutDeltasUnderANewGeneration() throws {
        var r = t.established(checkpoints: [
            "cars\u{1F}true\u{1F}{}": Checkpoint(epoch: ReplicatorTests.epochB, seq: 30)
        ])
        let spec = SubscriptionSpec(collection: "cars")
        let first = ReplicatorTests.sent(try r.subscribe(spec, now: 0))
        #expect(first == [.subscriptions([WireSubscription(spec: spec, since: 30, hops: 0, deltas: true)], version: 2)])
        // The batch stores its checkpoint when applied; the store refuses it for its delta.
        let batch = r.received(
            .batch(subscription: .key(spec.key), documents: [], upTo: 60, generation: 0), on: link, now: 1)
        #expect(batch.contains { if case .apply(_, let a) = $0 { a.storeCheckpoint } else { false } })
        let again = ReplicatorTests.sent(
            r.applyNeedsWholeStates(link, subscription: spec.key, reason: "no base", now: 2))
        #expect(
            again == [
                .subscriptions(
                    [WireSubscription(spec: spec, since: 30, hops: 0, generation: 1, deltas: false)], version: 3)
            ])
        // A batch of the old generation in flight stores no checkpoint; a second refusal asks nothing.
        let late = r.received(
            .batch(subscription: .key(spec.key), documents: [], upTo: 70, generation: 0), on: link, now: 3)
        #expect(!late.contains { if case .apply(_, let a) = $0 { a.storeCheckpoint } else { false } })
        #expect(r.applyNeedsWholeStates(link, subscription: spec.key, reason: "again", now: 4).isEmpty)
    }

    @Test func aSubscriptionSaysWhetherItTakesDeltas() throws {
        let subs = WireMessage.subscriptions([
            WireSubscription(spec: SubscriptionSpec(collection: "cars"), since: 1, hops: 0, deltas: true),
            WireSubscription(spec: SubscriptionSpec(collection: "cars", query: "a > 1"), since: 1, hops: 0),
        ])
        #expect(try WireMessage(serialized: subs.serialized()) == subs)
        // `d: 1`: deltas. An older peer's entry has no `d`: no deltas. `d` outside 0…1 is refused.
        #expect(try Self.withD(of: subs, .int(1)) == subs.serialized())
        for (d, deltas) in [(Value.int(1), true), (.int(0), false), (.null, false)] {
            guard case .subscriptions(let list, _) = try WireMessage(serialized: Self.withD(of: subs, d)) else {
                Issue.record("not subs")
                continue
            }
            #expect(list[0].deltas == deltas, "d: \(d)")
        }
        for d: Value in [2, -1, "1"] {
            #expect(throws: (any Error).self) { try WireMessage(serialized: Self.withD(of: subs, d)) }
        }
    }

    /// `subs` serialized with its first entry's `d` set to `d` (`.null`: left out).
    static func withD(of subs: WireMessage, _ d: Value) throws -> [UInt8] {
        guard case .map(var m) = try CBOR.decode(subs.serialized()), case .array(var list)? = m["subs"],
            case .map(var entry) = list[0]
        else { throw WireError("not a subs map") }
        if case .null = d { _ = entry.removeValue(forKey: "d") } else { entry["d"] = d }
        list[0] = .map(entry)
        m["subs"] = .array(list)
        return CBOR.encode(.map(m))
    }

    /// A subscriber that says `d: 1` without `x: 1` in its hello (a build from before the compact
    /// form, which reads only old-form deltas) gets whole states; one whose hello said `x: 1`
    /// gets the row's delta, compact as stored.
    @Test func onlyASubscriberThatReadsCompactNamesGetsCompactDeltas() throws {
        let (whole, delta) = try Self.oneFieldChange()
        let compact = delta.encoded()
        #expect(compact.first == 0x84 && compact.count < whole.count)
        let spec = SubscriptionSpec(collection: "cars")
        for (compactNames, expected) in [(false, whole), (true, compact)] {
            var r = t.replicator()
            _ = r.linkOpened(
                link, peerKey: ReplicatorTests.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:],
                now: 0)
            _ = r.received(
                .hello(
                    Hello(
                        version: WireMessage.protocolVersion, peerKey: ReplicatorTests.keyB, site: 0x102,
                        epoch: ReplicatorTests.epochB, nonce: 7, compactNames: compactNames)), on: link, now: 0)
            let subs = WireMessage.subscriptions([WireSubscription(spec: spec, since: 50, hops: 0, deltas: true)])
            let asked = ReplicatorTests.scans(r.received(subs, on: link, now: 0))
            let request = try #require(asked.first)
            var record = ReplicatorTests.record(60, "x", state: whole)
            record.delta = LogDelta(bytes: compact, baseSeq: 45)
            let page = ScanPage(records: [record], upTo: 60, exhausted: true)
            #expect(Self.states(r.scanned(link, request, page: page, now: 0)) == [expected], "x: \(compactNames)")
        }
    }
}
