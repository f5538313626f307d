import Testing
import TrellisCore

/// Compact names (docs/PROTOCOL.md §2 steps 1 and 4): between peers whose `hello` said `x: 1`,
/// subscriptions are numbered in `subs` and named by number in `batch`, `ack` and `suberr`, batch
/// entries leave out `c`, and a reconnecting node's `hello` leaves out the key the channel proved.
/// A peer that never said `x: 1` (an older build) sees none of it.
@Suite struct CompactNamesTests {
    static let keyA = ReplicatorTests.keyA
    static let keyB = ReplicatorTests.keyB
    static let epochB = ReplicatorTests.epochB
    let link = LinkID(1)
    let spec = SubscriptionSpec(collection: "cars")

    func replicator() -> Replicator { ReplicatorTests().replicator() }

    func hello(compact: Bool, key: [UInt8] = keyB, nonce: UInt64 = 7) -> WireMessage {
        .hello(
            Hello(
                version: WireMessage.protocolVersion, peerKey: key, site: 0x102, epoch: Self.epochB, nonce: nonce,
                earlySubscriptions: true, compactNames: compact))
    }

    /// A replicator subscribed to `cars`, with a session to B whose hello said `x` as given; and
    /// the subscriptions it sent B.
    func established(compact: Bool) throws -> (Replicator, [WireSubscription]) {
        var r = replicator()
        _ = try r.subscribe(spec, now: 0)
        _ = r.linkOpened(
            link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 0)
        let directives = r.received(hello(compact: compact), on: link, now: 0)
        let subs = ReplicatorTests.sent(directives).compactMap {
            if case .subscriptions(let s, _) = $0 { s } else { nil }
        }.first
        return (r, subs ?? [])
    }

    @Test func aPeerThatReadsCompactNamesGetsNumberedSubscriptionsAndNumberedAcks() throws {
        var (r, subs) = try established(compact: true)
        #expect(subs.map(\.number) == [0])
        // B names its batch by that number and leaves out `c`: the entry is of `cars`.
        let document = WireDocument(collection: "", id: .string("c1"), state: [1, 2, 3])
        let directives = r.received(
            .batch(subscription: .number(0), documents: [document], upTo: 9, generation: 0), on: link, now: 1)
        let apply = try #require(ReplicatorTests.applies(directives).first)
        #expect(apply.subscription == spec.key && apply.documents.map(\.collection) == ["cars"])
        let ack = ReplicatorTests.sent(
            r.applied(link, subscription: spec.key, upTo: 9, checkpointStored: true, deferred: 0, now: 2))
        #expect(ack == [.ack(subscription: .number(0), upTo: 9)])
        // A number this node never gave names nothing: nothing is applied, nothing answered.
        #expect(
            r.received(
                .batch(subscription: .number(7), documents: [document], upTo: 10, generation: 0), on: link, now: 3
            )
            .isEmpty)
        #expect(
            r.received(.subscriptionError(subscription: .number(7), code: "query", message: "x"), on: link, now: 3)
                .isEmpty)
    }

    @Test func anOlderPeerSeesKeysOnly() throws {
        var (r, subs) = try established(compact: false)
        #expect(subs.map(\.number) == [nil])
        _ = r.received(.batch(subscription: .key(spec.key), documents: [], upTo: 9, generation: 0), on: link, now: 1)
        let ack = ReplicatorTests.sent(
            r.applied(link, subscription: spec.key, upTo: 9, checkpointStored: true, deferred: 0, now: 2))
        #expect(ack == [.ack(subscription: .key(spec.key), upTo: 9)])
        // It serves B's subscriptions, which B did not number, by key, entries with `c`.
        let served = r.received(.subscriptions([WireSubscription(spec: spec, since: 0, hops: 0)]), on: link, now: 3)
        let scan = try #require(served.compactMap { if case .scan(_, let s) = $0 { s } else { nil } }.first)
        let page = ScanPage(
            records: [
                LogRecord(
                    seq: 5, key: JSON.string(.string("c1")),
                    document: WireDocument(collection: "cars", id: .string("c1"), state: [1]))
            ], upTo: 5, exhausted: true)
        #expect(
            ReplicatorTests.sent(r.scanned(link, scan, page: page, now: 4)) == [
                .batch(
                    subscription: .key(spec.key),
                    documents: [WireDocument(collection: "cars", id: .string("c1"), state: [1])], upTo: 5,
                    generation: 0, left: 0)
            ])
    }

    @Test func numberedSubscriptionsAreServedByNumber() throws {
        var (r, _) = try established(compact: true)
        let served = r.received(
            .subscriptions([WireSubscription(spec: spec, since: 0, hops: 0, number: 3)], version: 1), on: link, now: 1)
        let scan = try #require(served.compactMap { if case .scan(_, let s) = $0 { s } else { nil } }.first)
        let page = ScanPage(
            records: [
                LogRecord(
                    seq: 5, key: JSON.string(.string("c1")),
                    document: WireDocument(collection: "cars", id: .string("c1"), state: [1]),
                    holdsUnacknowledgedWrite: true)
            ], upTo: 5, exhausted: true)
        let batch = ReplicatorTests.sent(r.scanned(link, scan, page: page, now: 2))
        #expect(
            batch == [
                .batch(
                    subscription: .number(3), documents: [WireDocument(collection: "", id: .string("c1"), state: [1])],
                    upTo: 5, generation: 0, left: 0)
            ])
        // Its ack by number acknowledges the write; one by another number does nothing.
        #expect(r.received(.ack(subscription: .number(4), upTo: 5), on: link, now: 3).isEmpty)
        let acked = r.received(.ack(subscription: .number(3), upTo: 5), on: link, now: 3)
        #expect(
            acked.contains {
                if case .acknowledged(let e) = $0 { e.map(\.key) == [JSON.string(.string("c1"))] } else { false }
            })
        // A query it cannot serve is named by number too.
        let bad = SubscriptionSpec(collection: "cars", query: "((")
        let refused = ReplicatorTests.sent(
            r.received(
                .subscriptions(
                    [
                        WireSubscription(spec: spec, since: 5, hops: 0, number: 3),
                        WireSubscription(spec: bad, since: 0, hops: 0, number: 4),
                    ],
                    version: 2), on: link, now: 4))
        #expect(refused.contains { if case .subscriptionError(.number(4), "query", _) = $0 { true } else { false } })
    }

    @Test func aReconnectingNodeLeavesItsKeyOutForAPeerThatReadsCompactNames() throws {
        var r = replicator()
        func open(_ link: LinkID) -> Hello? {
            let opened = r.linkOpened(
                link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 0)
            return ReplicatorTests.sent(opened).compactMap { if case .hello(let h) = $0 { h } else { nil } }.first
        }
        let first = try #require(open(LinkID(1)))
        #expect(first.peerKey == Self.keyA && first.compactNames)
        // B's hello without its key is B's: the channel authenticated it.
        let keyless = Hello(
            version: WireMessage.protocolVersion, peerKey: [], site: 0x102, epoch: Self.epochB, nonce: 7,
            earlySubscriptions: true, compactNames: true)
        let established = r.received(.hello(keyless), on: LinkID(1), now: 0)
        #expect(r.status.peers.map(\.peerKey) == [Self.keyB], "\(established)")
        // The same hello again (a duplicating transport) is no protocol error.
        #expect(r.received(.hello(keyless), on: LinkID(1), now: 0).isEmpty)
        _ = r.linkClosed(LinkID(1), reason: "gone", now: 1)
        let second = try #require(open(LinkID(2)))
        #expect(second.peerKey.isEmpty)
        // B came back as an older build (no `x`): the next hello carries the key again.
        _ = r.received(hello(compact: false, nonce: 8), on: LinkID(2), now: 2)
        _ = r.linkClosed(LinkID(2), reason: "gone", now: 3)
        #expect(try #require(open(LinkID(3))).peerKey == Self.keyA)
    }

    @Test func compactNamesTravel() throws {
        for message: WireMessage in [
            .hello(
                Hello(
                    version: 4, peerKey: [], site: 5, epoch: Self.epochB, nonce: 1, earlySubscriptions: true,
                    compactNames: true)),
            .subscriptions([WireSubscription(spec: spec, since: 9, hops: 1, number: 12)], version: 3),
            // A numbered whole-collection entry at 0 hops leaves `q` and `hops` out.
            .subscriptions([WireSubscription(spec: spec, since: 9, hops: 0, number: 0)], version: 1),
            .subscriptions(
                [
                    WireSubscription(
                        spec: SubscriptionSpec(collection: "cars", query: "a == $args.x", args: ["x": 1]), since: 0,
                        hops: 2, generation: 3, number: 1)
                ], version: 2),
            .batch(
                subscription: .number(12), documents: [WireDocument(collection: "", id: .string("a"), state: [1])],
                upTo: 4, generation: 0),
            .ack(subscription: .number(12), upTo: 4, deferred: true),
            .subscriptionError(subscription: .number(12), code: "query", message: "no"),
        ] {
            #expect(try WireMessage(serialized: message.serialized()) == message)
            #expect(try WireMessage(CBOR.decode(message.serialized())) == message)
        }
        // A number outside 0…2³²−1, or a key of another length than 32 bytes, does not decode.
        #expect(throws: WireError.self) {
            try WireMessage(["t": "ack", "i": .int(-1), "upTo": 1])
        }
        #expect(throws: WireError.self) {
            try WireMessage(["t": "ack", "i": .int(1 << 32), "upTo": 1])
        }
        #expect(throws: WireError.self) {
            try WireMessage(
                ["t": "hello", "v": 5, "key": .bytes([1]), "site": 1, "epoch": .bytes(Self.epochB), "n": 1])
        }
    }
}

/// Review of the compact names (7fa480b): cases found failing, and cases that held.
@Suite struct CompactNamesReviewTests {
    typealias T = CompactNamesTests
    let spec = SubscriptionSpec(collection: "cars")

    /// The numbers named in the `subs` a replicator sent on `link`.
    static func numbersSent(_ directives: [ReplicatorDirective], on link: LinkID) -> Set<UInt32> {
        var numbers: Set<UInt32> = []
        for case .send(let l, .subscriptions(let subs, _)) in directives where l == link {
            numbers.formUnion(subs.compactMap(\.number))
        }
        return numbers
    }

    /// A peer met before as a build that honours early subscriptions but not compact names
    /// (`es: 1`, no `x`) comes back upgraded (`x: 1`) while this node runs. This node's early
    /// `subs` went unnumbered (it did not know); once the hello says `x: 1`, numbers are given,
    /// but the set's shape (which leaves numbers out) is unchanged, so they are never sent. The
    /// ack then names a number the peer never received: the peer ignores it, its batch stays in
    /// flight, and it resends from the last acknowledged point after every ack timeout.
    @Test func anAckNamesOnlyANumberThePeerWasGiven() throws {
        var r = CompactNamesTests().replicator()
        var log: [ReplicatorDirective] = []
        _ = try r.subscribe(spec, now: 0)
        _ = r.linkOpened(
            LinkID(1), peerKey: T.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 0)
        _ = r.received(CompactNamesTests().hello(compact: false), on: LinkID(1), now: 0)
        _ = r.linkClosed(LinkID(1), reason: "B upgrades", now: 1)
        let link = LinkID(2)
        log += r.linkOpened(
            link, peerKey: T.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 2)
        log += r.received(CompactNamesTests().hello(compact: true, nonce: 8), on: link, now: 2)
        let given = Self.numbersSent(log, on: link)
        // B serves the subscriptions as it received them (by key, entries with `c`).
        let document = WireDocument(collection: "cars", id: .string("c1"), state: [1, 2, 3])
        log += r.received(
            .batch(subscription: .key(spec.key), documents: [document], upTo: 9, generation: 0), on: link, now: 3)
        let acks = ReplicatorTests.sent(
            r.applied(link, subscription: spec.key, upTo: 9, checkpointStored: true, deferred: 0, now: 4))
        let ack = try #require(acks.first)
        switch ack {
        case .ack(.number(let n), _, _):
            #expect(given.contains(n), "ack names #\(n); B was given \(given.sorted()): B ignores it")
        case .ack(.key(let key), _, _):
            #expect(key == spec.key)
        default:
            Issue.record("not an ack: \(ack)")
        }
    }

    /// The same upgrade between two real replicators, every message through its bytes: B (just
    /// upgraded and restarted, `x: 1`) serves `cars` to A (running, met B before as `es: 1`
    /// without `x`). Each of A's acks must reach B's served subscription: B counts its writes as
    /// held by A (`.acknowledged`) and keeps sending.
    @Test func anUpgradedPeerGetsTheAcksOfWhatItServes() throws {
        var a = CompactNamesTests().replicator()
        var b = Replicator(
            configuration: ReplicatorConfiguration(peerKey: T.keyB),
            local: LocalLog(epoch: T.epochB, site: 0x102, lastSeq: 100), seed: 7)
        _ = try a.subscribe(spec, now: 0)
        // A met B before B's upgrade: `es: 1`, no `x`.
        _ = a.linkOpened(
            LinkID(1), peerKey: T.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 0)
        _ = a.received(CompactNamesTests().hello(compact: false), on: LinkID(1), now: 0)
        _ = a.linkClosed(LinkID(1), reason: "B upgrades", now: 1)
        let link = LinkID(2)
        var toB = a.linkOpened(
            link, peerKey: T.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 2)
        var toA = b.linkOpened(
            link, peerKey: T.keyA, initiator: false, address: "a", endpoint: nil, checkpoints: [:], now: 2)
        var acknowledged = 0
        var batches = 0
        var seq: Int64 = 0
        for _ in 0..<40 where !(toA.isEmpty && toB.isEmpty) {
            let (forB, forA) = (toB, toA)
            (toA, toB) = ([], [])
            for directive in forB {
                switch directive {
                case .send(_, let m): toA += b.received(try WireMessage(serialized: m.serialized()), on: link, now: 3)
                case .apply(_, let request):
                    toB += a.applied(
                        link, subscription: request.subscription, upTo: request.upTo,
                        checkpointStored: request.storeCheckpoint, deferred: 0, now: 3)
                default: break
                }
            }
            for directive in forA {
                switch directive {
                case .send(_, let m):
                    if case .batch = m { batches += 1 }
                    toB += a.received(try WireMessage(serialized: m.serialized()), on: link, now: 3)
                case .scan(_, let request) where seq < 3:
                    // Three pages of one own write each, then the end of the log.
                    seq += 1
                    let record = LogRecord(
                        seq: seq, key: JSON.string(.string("c\(seq)")),
                        document: WireDocument(collection: "cars", id: .string("c\(seq)"), state: [1]),
                        holdsUnacknowledgedWrite: true)
                    toA += b.scanned(
                        link, request, page: ScanPage(records: [record], upTo: seq, exhausted: seq == 3), now: 3)
                case .acknowledged: acknowledged += 1
                default: break
                }
            }
        }
        #expect(batches == 3)
        #expect(acknowledged == 3, "B saw \(acknowledged) of A's 3 acks")
    }

    /// docs/PROTOCOL.md §2 step 4: "A `subs` entry without `i`, or a peer that never said
    /// `x: 1`, is answered by key, entries with `c`." A peer without `x` whose `subs` carry `i`
    /// (another implementation) gets key-named batches with `c`.
    @Test func aPeerThatNeverSaidXIsAnsweredByKeyEvenIfItNumbers() throws {
        var (r, _) = try CompactNamesTests().established(compact: false)
        let link = CompactNamesTests().link
        let served = r.received(
            .subscriptions([WireSubscription(spec: spec, since: 0, hops: 0, number: 3)], version: 1), on: link, now: 1)
        let scan = try #require(served.compactMap { if case .scan(_, let s) = $0 { s } else { nil } }.first)
        let document = WireDocument(collection: "cars", id: .string("c1"), state: [1])
        let page = ScanPage(
            records: [LogRecord(seq: 5, key: JSON.string(.string("c1")), document: document)], upTo: 5, exhausted: true)
        #expect(
            ReplicatorTests.sent(r.scanned(link, scan, page: page, now: 2)) == [
                .batch(subscription: .key(spec.key), documents: [document], upTo: 5, generation: 0, left: 0)
            ])
        let bad = SubscriptionSpec(collection: "cars", query: "((")
        let refused = ReplicatorTests.sent(
            r.received(
                .subscriptions([WireSubscription(spec: bad, since: 0, hops: 0, number: 4)], version: 2), on: link,
                now: 3))
        #expect(refused.contains { if case .subscriptionError(.key(bad.key), "query", _) = $0 { true } else { false } })
    }

    /// A subscription dropped and asked again on the same connection gets a new number (the old
    /// one then names nothing) and a new rescan generation (by key, a batch of the old request
    /// in flight is taken for the new one, but merges without its checkpoint). The batch before
    /// it (upTo 10) arrived while the subscription was not asked and was dropped: the later one
    /// (upTo 20) must not store a checkpoint past it, or a reconnect before the peer's rescan
    /// resumes after documents never applied.
    @Test(arguments: [true, false]) func aBatchOfADroppedRequestStoresNoCheckpoint(compact: Bool) throws {
        var (r, subs) = try CompactNamesTests().established(compact: compact)
        let link = CompactNamesTests().link
        let name: SubscriptionName = compact ? .number(try #require(subs.first?.number)) : .key(spec.key)
        let removed = ReplicatorTests.sent(r.unsubscribe(spec, now: 1))
        #expect(removed.contains { if case .subscriptions([], _) = $0 { true } else { false } })
        let document = WireDocument(collection: compact ? "" : "cars", id: .string("c1"), state: [1])
        #expect(
            ReplicatorTests.applies(
                r.received(.batch(subscription: name, documents: [document], upTo: 10, generation: 0), on: link, now: 2)
            ).isEmpty)
        let again = ReplicatorTests.sent(try r.subscribe(spec, now: 3))
        let numbers: [UInt32?] = again.flatMap { m -> [UInt32?] in
            if case .subscriptions(let s, _) = m { s.map(\.number) } else { [] }
        }
        #expect(numbers == [compact ? UInt32(1) : nil], "a key asked again gets a new number")
        let late = ReplicatorTests.applies(
            r.received(.batch(subscription: name, documents: [document], upTo: 20, generation: 0), on: link, now: 4))
        // By key the same: the re-asked subscription has a new rescan generation, so the old
        // request's batch merges without its checkpoint.
        #expect(late.allSatisfy { !$0.storeCheckpoint }, "checkpoint 20 stored; the batch up to 10 was dropped")
        let generations = again.flatMap { m -> [UInt32] in
            if case .subscriptions(let s, _) = m { s.map(\.generation) } else { [] }
        }
        #expect(generations == [1])
        let current = ReplicatorTests.applies(
            r.received(
                .batch(subscription: compact ? .number(1) : name, documents: [document], upTo: 5, generation: 1),
                on: link, now: 5))
        #expect(current.map(\.storeCheckpoint) == [true], "the new request's batches store their checkpoint")
    }
}
