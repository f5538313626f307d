import Testing
import TrellisCore

/// Caught-up batches (docs/PROTOCOL.md §2, step 5): between peers whose `hello`s both say `f`
/// bit 0, the end-of-log batch that would carry nothing and an `upTo` equal to the
/// subscription's `since` goes as a `batch` without `docs`, `upTo` and `left`, which the
/// subscriber never acknowledges and the sender counts in no flow control. A peer that did not
/// say so (an older build) gets, and must send, exactly the batches and acks of before.
@Suite struct CaughtUpBatchTests {
    static let keyA = ReplicatorTests.keyA
    static let keyB = ReplicatorTests.keyB
    static let epochA: [UInt8] = Array(repeating: 0xA, count: 16)
    static let epochB = ReplicatorTests.epochB
    let link = LinkID(1)
    let spec = SubscriptionSpec(collection: "cars")

    /// Node A (epoch `epochA`, site 0x101, log up to `seq` 100), as ``ReplicatorTests`` makes it.
    func replicator() -> Replicator { ReplicatorTests().replicator() }

    /// B's hello: `caughtUp` says `f: 1`; `compact` says `x: 1`.
    static func hello(caughtUp: Bool, compact: Bool = true, nonce: UInt64 = 7) -> WireMessage {
        .hello(
            Hello(
                version: WireMessage.protocolVersion, peerKey: keyB, site: 0x102, epoch: epochB, nonce: nonce,
                earlySubscriptions: true, compactNames: compact, caughtUpBatches: caughtUp))
    }

    static let ackTimeout = ReplicatorConfiguration(peerKey: keyA).ackTimeout

    /// A tick at `now` on a link that heard from its peer just before (a keepalive), so that only
    /// the ack timeout, not the liveness timeout, can act. Returns the scans it starts.
    static func tick(_ r: inout Replicator, on link: LinkID, at now: Millis) -> [ScanRequest] {
        _ = r.received(.ping(1), on: link, now: now - 1)
        let directives = r.tick(now: now)
        #expect(!directives.contains { if case .close = $0 { true } else { false } }, "\(directives)")
        return ReplicatorTests.scans(directives)
    }

    /// A replicator subscribed to `cars` with an established session to B, whose hello said `f`
    /// as given.
    func established(caughtUp: Bool, compact: Bool = true) throws -> Replicator {
        var r = replicator()
        _ = try r.subscribe(spec, now: 0)
        _ = r.linkOpened(
            link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 0)
        _ = r.received(Self.hello(caughtUp: caughtUp, compact: compact), on: link, now: 0)
        return r
    }

    /// B asks for `cars` from `since`; this node's log holds nothing after it. The messages sent
    /// for it, and the replicator.
    func servedWithNothingNew(caughtUp: Bool, since: Int64 = 40, number: UInt32? = 0) throws
        -> (Replicator, [WireMessage])
    {
        var r = try established(caughtUp: caughtUp)
        let asked = r.received(
            .subscriptions([WireSubscription(spec: spec, since: since, hops: 0, number: number)], version: 1),
            on: link, now: 1)
        let scan = try #require(ReplicatorTests.scans(asked).first)
        #expect(scan.after == since)
        let sent = ReplicatorTests.sent(
            r.scanned(link, scan, page: ScanPage(records: [], upTo: since, exhausted: true), now: 2))
        return (r, sent)
    }

    @Test func thisNodeSaysItSendsAndReadsCaughtUpBatches() throws {
        var r = replicator()
        let opened = ReplicatorTests.sent(
            r.linkOpened(
                link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 0))
        guard case .hello(let mine)? = opened.first else { return #expect(Bool(false), "no hello: \(opened)") }
        #expect(mine.caughtUpBatches && mine.earlySubscriptions && mine.compactNames)
    }

    @Test func nothingAfterTheSinceGoesAsACaughtUpBatchThatIsNeverInFlight() throws {
        var (r, sent) = try servedWithNothingNew(caughtUp: true)
        #expect(sent == [.caughtUp(subscription: .number(0), generation: 0)])
        // Not in flight: no ack ever comes, and none is waited for (no resend after the timeout).
        #expect(Self.tick(&r, on: link, at: 2 + Self.ackTimeout + 1).isEmpty)
        // What comes next flows as before, in ordinary batches that are acknowledged.
        let t = 2 + Self.ackTimeout + 2
        let next = try #require(ReplicatorTests.scans(r.committed(collections: ["cars"], lastSeq: 101, now: t)).first)
        #expect(next.after == 40)
        let record = LogRecord(
            seq: 101, key: JSON.string(.string("c1")),
            document: WireDocument(collection: "cars", id: .string("c1"), state: [1]))
        let batch = ReplicatorTests.sent(
            r.scanned(link, next, page: ScanPage(records: [record], upTo: 101, exhausted: true), now: t))
        #expect(
            batch == [
                .batch(
                    subscription: .number(0), documents: [WireDocument(collection: "", id: .string("c1"), state: [1])],
                    upTo: 101, generation: 0, left: 0)
            ])
        // This one is in flight: unacknowledged, it is sent again after the timeout.
        #expect(Self.tick(&r, on: link, at: t + Self.ackTimeout).first?.after == 40)
    }

    /// A peer that did not say `f` (an older build, or one that turned it off) gets the empty
    /// batch with its `upTo` and `left: 0`, as before, counted in flight until its ack: never
    /// stuck, never resent once acknowledged.
    @Test func aPeerThatDidNotSaySoGetsTheEmptyBatchAndItsAckAsBefore() throws {
        var (r, sent) = try servedWithNothingNew(caughtUp: false)
        #expect(sent == [.batch(subscription: .number(0), documents: [], upTo: 40, generation: 0, left: 0)])
        // Without its ack, the batch is in flight: the timeout scans again from the last ack.
        var unacknowledged = r
        #expect(Self.tick(&unacknowledged, on: link, at: 2 + Self.ackTimeout).first?.after == 40)
        // Its ack takes it out of flight: nothing is resent.
        _ = r.received(.ack(subscription: .number(0), upTo: 40), on: link, now: 3)
        #expect(Self.tick(&r, on: link, at: 3 + Self.ackTimeout).isEmpty)
    }

    /// Only a batch whose `upTo` equals the `since` of the subscription's current generation is
    /// a caught-up batch: an empty end-of-log batch that moves the checkpoint (entries of the
    /// collection that the query or the echo memory left out) is an ordinary batch, acknowledged.
    @Test func anEmptyBatchThatMovesTheCheckpointIsAnOrdinaryBatch() throws {
        var r = try established(caughtUp: true)
        let asked = r.received(
            .subscriptions([WireSubscription(spec: spec, since: 40, hops: 0, number: 0)], version: 1), on: link,
            now: 1)
        let scan = try #require(ReplicatorTests.scans(asked).first)
        let sent = ReplicatorTests.sent(
            r.scanned(link, scan, page: ScanPage(records: [], upTo: 45, exhausted: true), now: 2))
        #expect(sent == [.batch(subscription: .number(0), documents: [], upTo: 45, generation: 0, left: 0)])
    }

    /// A subscription asked again under a new generation from a later `since` (a re-sent `subs`
    /// with the same generation moves nothing): the caught-up batch compares with the `since`
    /// of the generation being served.
    @Test func theSinceComparedIsThatOfTheCurrentGeneration() throws {
        var r = try established(caughtUp: true)
        func ask(since: Int64, generation: UInt32, version: UInt64) -> [ScanRequest] {
            ReplicatorTests.scans(
                r.received(
                    .subscriptions(
                        [WireSubscription(spec: spec, since: since, hops: 0, generation: generation, number: 0)],
                        version: version), on: link, now: 1))
        }
        let first = try #require(ask(since: 40, generation: 0, version: 1).first)
        // A second `subs` before the first scan returned, same generation, another `since`: the
        // cursor stays (no rescan), so the scan of 40 answers for it.
        #expect(ask(since: 50, generation: 0, version: 2).isEmpty)
        #expect(
            ReplicatorTests.sent(r.scanned(link, first, page: ScanPage(records: [], upTo: 40, exhausted: true), now: 2))
                == [
                    .caughtUp(subscription: .number(0), generation: 0)
                ])
        // A new generation from 60: nothing after it. Its end is told in its own generation, as
        // for a new subscription (a refetch asked again waits for that answer; before, the end
        // told in generation 0 stood for it, and such a refetch was never answered again).
        let second = try #require(ask(since: 60, generation: 1, version: 3).first)
        #expect(second.after == 60)
        #expect(
            ReplicatorTests.sent(
                r.scanned(link, second, page: ScanPage(records: [], upTo: 60, exhausted: true), now: 3))
                == [.caughtUp(subscription: .number(0), generation: 1)])
    }

    @Test func aSubscriberNeitherAppliesNorAcknowledgesACaughtUpBatch() throws {
        var r = try established(caughtUp: true)
        let directives = r.received(.caughtUp(subscription: .number(0), generation: 0), on: link, now: 1)
        #expect(directives.isEmpty, "\(directives)")
        let progress = try #require(r.status.peers.first?.asked.first?.progress)
        #expect(progress.initialSyncComplete && progress.left == 0 && progress.batches == 1)
        // A number this node never gave names nothing.
        #expect(r.received(.caughtUp(subscription: .number(9), generation: 0), on: link, now: 2).isEmpty)
    }

    /// A peer that did not say it sends caught-up batches may not: what an older build would
    /// have failed to decode closes the session as before.
    @Test func aCaughtUpBatchFromAPeerThatDidNotSaySoIsAProtocolError() throws {
        var r = try established(caughtUp: false)
        let directives = r.received(.caughtUp(subscription: .number(0), generation: 0), on: link, now: 1)
        #expect(
            ReplicatorTests.sent(directives).contains { if case .error("protocol", _) = $0 { true } else { false } })
        #expect(directives.contains { if case .close(self.link, _) = $0 { true } else { false } })
    }

    /// The idle reconnect between two nodes that both read caught-up batches, driven message by
    /// message: each side's early `subs`, then one caught-up batch each way, and no `ack`.
    @Test func anIdleReconnectBetweenTwoNewNodesExchangesNoAck() throws {
        // The first contact (empty batches up to each log's end, acknowledged), then the
        // reconnect, each holding its checkpoint at the other's last `seq`.
        var pair = try SubscriptionDigestTests.Pair.metBefore()
        pair.connect(checkpointsA: SubscriptionDigestTests.stored.a, checkpointsB: SubscriptionDigestTests.stored.b)
        let kinds = pair.kinds
        #expect(kinds.filter { ["caughtUp", "batch", "ack"].contains($0) } == ["caughtUp", "caughtUp"], "\(kinds)")
        for node in [pair.a, pair.b] {
            let progress = try #require(node.status.peers.first?.asked.first?.progress)
            #expect(progress.initialSyncComplete)
        }
        // Nothing waits for an ack: after the ack timeout no batch is sent again.
        let now = pair.now + Self.ackTimeout + 1
        #expect(Self.tick(&pair.a, on: link, at: now).isEmpty && Self.tick(&pair.b, on: link, at: now).isEmpty)
        let caughtUp = pair.messages.filter { if case .caughtUp = $0.message { true } else { false } }
        #expect(caughtUp.allSatisfy { $0.message.serialized().count == 12 }, "\(caughtUp)")
    }

    @Test func caughtUpBatchesAndTheHelloBitTravel() throws {
        for message: WireMessage in [
            .caughtUp(subscription: .number(3), generation: 0),
            .caughtUp(subscription: .number(3), generation: 7),
            .caughtUp(subscription: .key(spec.key), generation: 2),
            Self.hello(caughtUp: true),
            Self.hello(caughtUp: false),
        ] {
            #expect(try WireMessage(serialized: message.serialized()) == message)
        }
        // `{i: 3, t: "batch"}`: 12 bytes, against 38 for the empty batch it stands for.
        #expect(WireMessage.caughtUp(subscription: .number(3)).serialized().count == 12)
        #expect(
            WireMessage.caughtUp(subscription: .number(0)).encoded == .map(["t": "batch", "i": 0]))
        // Unknown feature bits are ignored; bit 0 alone is read; `f` is a non-negative integer.
        func hello(_ f: Value) -> Value {
            ["t": "hello", "v": 5, "site": 1, "epoch": .bytes(Self.epochB), "n": 1, "f": f]
        }
        guard case .hello(let h3) = try WireMessage(hello(6)) else { return #expect(Bool(false)) }
        #expect(!h3.caughtUpBatches)
        guard case .hello(let h7) = try WireMessage(hello(7)) else { return #expect(Bool(false)) }
        #expect(h7.caughtUpBatches)
        #expect(throws: WireError.self) { try WireMessage(hello(-1)) }
        #expect(throws: WireError.self) { try WireMessage(hello("1")) }
        // Without `upTo` a batch carries nothing: no `docs`, no `left`.
        #expect(throws: WireError.self) { try WireMessage(["t": "batch", "i": 0, "docs": []]) }
        #expect(throws: WireError.self) { try WireMessage(["t": "batch", "i": 0, "left": 0]) }
        #expect(throws: WireError.self) { try WireMessage(["t": "batch", "i": 0, "upTo": 4]) }
        #expect(throws: WireError.self) { try WireMessage(["t": "batch", "gen": 1]) }
        #expect(throws: WireError.self) { try WireMessage(["t": "batch", "i": 0, "gen": -1]) }
    }
}
