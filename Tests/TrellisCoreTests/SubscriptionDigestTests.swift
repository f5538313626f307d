import Testing
import TrellisCore

/// Subscriptions resumed by digest (docs/PROTOCOL.md §2, step 3): a node whose peer's last
/// `hello` said `f` bit 1 sends, in place of its early `subs`, `{t: "subs", v, h}` with the digest
/// of that `subs`; the peer rebuilds the set from what it remembers of the node's last one and
/// takes it when the digests match, or asks for the set in full (`subsreq`). A peer that did not
/// say so gets the `subs` as before.
@Suite struct SubscriptionDigestTests {
    static let keyA: [UInt8] = Array(repeating: 1, count: 32)
    static let keyB: [UInt8] = Array(repeating: 2, count: 32)
    static let epochA: [UInt8] = Array(repeating: 0xA, count: 16)
    static let epochB: [UInt8] = Array(repeating: 0xB, count: 16)
    static let spec = SubscriptionSpec(collection: "cars")
    static let link = LinkID(1)

    static func digest(_ list: [WireSubscription], version: UInt64 = 1) -> StateDigest {
        StateDigest(WireMessage.subscriptions(list, version: version).serialized())
    }

    /// Two replicators on one link, driven message by message: each scan answers "nothing after
    /// the cursor, the log ends at `lastSeq`", each apply commits with its checkpoint.
    struct Pair {
        var a: Replicator
        var b: Replicator
        var now: Millis = 0
        /// Every message sent, with its sender, and the scans each side started.
        var messages: [(from: String, message: WireMessage)] = []
        var scans: [(node: String, after: Int64)] = []
        /// The number both ends of the next connection hold (a secure channel's): `nil`, as
        /// here by default, opens no session resumed by digest (ResumedSessionTests).
        var channelNonce: UInt64?

        init(configure: (inout ReplicatorConfiguration) -> Void = { _ in }) throws {
            var configA = ReplicatorConfiguration(peerKey: keyA)
            var configB = ReplicatorConfiguration(peerKey: keyB)
            configure(&configA)
            configure(&configB)
            a = Replicator(configuration: configA, local: LocalLog(epoch: epochA, site: 0x101, lastSeq: 100), seed: 1)
            b = Replicator(configuration: configB, local: LocalLog(epoch: epochB, site: 0x102, lastSeq: 200), seed: 2)
            _ = try a.subscribe(spec, now: 0)
            _ = try b.subscribe(spec, now: 0)
        }

        mutating func run(_ first: [(String, ReplicatorDirective)]) {
            var queue = first
            while !queue.isEmpty {
                let (node, directive) = queue.removeFirst()
                now += 1
                let peer = node == "a" ? "b" : "a"
                switch directive {
                case .send(_, let message):
                    messages.append((node, message))
                    let decoded = try! WireMessage(serialized: message.serialized())
                    let next =
                        peer == "a"
                        ? a.received(decoded, on: link, now: now) : b.received(decoded, on: link, now: now)
                    queue += next.map { (peer, $0) }
                case .scan(_, let request):
                    scans.append((node, request.after))
                    let end: Int64 = node == "a" ? 100 : 200
                    let page = ScanPage(records: [], upTo: max(request.after, end), exhausted: true)
                    let next =
                        node == "a"
                        ? a.scanned(link, request, page: page, now: now)
                        : b.scanned(link, request, page: page, now: now)
                    queue += next.map { (node, $0) }
                case .apply(_, let request):
                    let next =
                        node == "a"
                        ? a.applied(
                            link, subscription: request.subscription, upTo: request.upTo,
                            checkpointStored: request.storeCheckpoint, deferred: 0, now: now)
                        : b.applied(
                            link, subscription: request.subscription, upTo: request.upTo,
                            checkpointStored: request.storeCheckpoint, deferred: 0, now: now)
                    queue += next.map { (node, $0) }
                case .takeHeld(_):
                    // After the directives before it, as a host does (they were queued first).
                    let next = node == "a" ? a.takeHeld(link, now: now) : b.takeHeld(link, now: now)
                    queue += next.map { (node, $0) }
                default:
                    continue
                }
            }
        }

        /// Opens the link on both sides with these stored checkpoints and runs until quiet.
        mutating func connect(checkpointsA: [UTF8Key: Checkpoint], checkpointsB: [UTF8Key: Checkpoint]) {
            messages = []
            scans = []
            let openA = a.linkOpened(
                link, peerKey: keyB, initiator: true, address: "b", endpoint: nil, checkpoints: checkpointsA,
                channelNonce: channelNonce, now: now)
            let openB = b.linkOpened(
                link, peerKey: keyA, initiator: false, address: "a", endpoint: nil, checkpoints: checkpointsB,
                channelNonce: channelNonce, now: now)
            run(openA.map { ("a", $0) } + openB.map { ("b", $0) })
        }

        mutating func close() {
            _ = a.linkClosed(link, reason: "reset", now: now)
            _ = b.linkClosed(link, reason: "reset", now: now)
        }

        /// The kinds of the messages sent, presence left out, in order.
        var kinds: [String] {
            messages.compactMap { entry -> String? in
                switch entry.message {
                case .hello: "hello"
                case .subscriptions: "subs"
                case .subscriptionsDigest: "digest"
                case .subscriptionsRequest: "subsreq"
                case .resume: "resume"
                case .helloRequest: "helloreq"
                case .caughtUp: "caughtUp"
                case .batch: "batch"
                case .ack: "ack"
                case .presence: nil
                default: "other"
                }
            }
        }

        /// The first contact: empty batches up to each log's end, acknowledged (checkpoints A 200,
        /// B 100), then the link closes.
        static func metBefore(
            channelNonce: UInt64? = nil, configure: (inout ReplicatorConfiguration) -> Void = { _ in }
        ) throws -> Pair {
            var pair = try Pair(configure: configure)
            pair.channelNonce = channelNonce
            pair.connect(checkpointsA: [:], checkpointsB: [:])
            #expect(pair.kinds.filter { $0 == "ack" }.count == 2, "\(pair.kinds)")
            pair.close()
            return pair
        }
    }

    static let stored = (
        a: [UTF8Key(spec.key): Checkpoint(epoch: epochB, seq: 200)],
        b: [UTF8Key(spec.key): Checkpoint(epoch: epochA, seq: 100)]
    )

    @Test func anIdleReconnectResumesBothSetsByDigest() throws {
        var pair = try Pair.metBefore()
        pair.connect(checkpointsA: Self.stored.a, checkpointsB: Self.stored.b)
        #expect(pair.kinds.sorted() == ["caughtUp", "caughtUp", "digest", "digest", "hello", "hello"], "\(pair.kinds)")
        // Each side serves the other from its checkpoint, as if the `subs` had come.
        #expect(pair.scans.map(\.after).sorted() == [100, 200])
        // The digest stands for exactly the early `subs` of before: numbered, with its epoch.
        let digests = pair.messages.compactMap {
            if case .subscriptionsDigest(let d, 1) = $0.message { d } else { nil }
        }
        let expected = Self.digest([
            WireSubscription(spec: Self.spec, since: 200, hops: 0, epoch: Self.epochB, deltas: true, number: 0)
        ])
        #expect(digests.contains(expected))
        // 30 bytes against the 66 of the `subs`.
        #expect(WireMessage.subscriptionsDigest(expected, version: 1).serialized().count == 30)
    }

    /// The peer's memory does not match what the node holds (here its checkpoint went back): the
    /// peer asks for the set, and serves from the `since` it then receives.
    @Test func aDigestThatDoesNotMatchIsAnsweredByARequestAndTheFullSet() throws {
        var pair = try Pair.metBefore()
        pair.connect(
            checkpointsA: [UTF8Key(Self.spec.key): Checkpoint(epoch: Self.epochB, seq: 150)],
            checkpointsB: Self.stored.b)
        #expect(pair.kinds.filter { $0 == "subsreq" }.count == 1, "\(pair.kinds)")
        #expect(
            pair.messages.contains {
                $0.from == "a"
                    && $0.message
                        == .subscriptions(
                            [
                                WireSubscription(
                                    spec: Self.spec, since: 150, hops: 0, epoch: Self.epochB, deltas: true, number: 0)
                            ], version: 1)
            })
        #expect(pair.scans.contains { $0.node == "b" && $0.after == 150 })
        // B's set matched on A's side.
        #expect(pair.scans.contains { $0.node == "a" && $0.after == 100 })
    }

    /// Between a `subsreq` and the set it brings, the peer's batches (answers to this node's own
    /// subscriptions, sent early) would merge without this node knowing which of the peer's query
    /// subscriptions hold their documents: they are dropped, unacknowledged, and this node's
    /// subscriptions are asked again under a new generation once the set has come (simulation
    /// seed 320004 lost a state this way before).
    @Test func batchesBeforeTheRequestedSetAreDroppedAndAskedForAgain() throws {
        var r = Replicator(
            configuration: ReplicatorConfiguration(peerKey: Self.keyA),
            local: LocalLog(epoch: Self.epochA, site: 0x101, lastSeq: 100), seed: 7)
        _ = try r.subscribe(Self.spec, now: 0)
        _ = r.linkOpened(
            Self.link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 0)
        let asked = ReplicatorTests.sent(
            r.received(Self.hello(Self.keyB, site: 0x102, resumes: true), on: Self.link, now: 0))
        #expect(asked.contains { if case .subscriptions(let s, 1) = $0 { s.map(\.generation) == [0] } else { false } })
        // B's digest names a set this node does not remember.
        let query = SubscriptionSpec(collection: "cars", query: "v >= 5")
        let set = [WireSubscription(spec: query, since: 0, hops: 0, number: 0)]
        #expect(
            ReplicatorTests.sent(r.received(.subscriptionsDigest(Self.digest(set), version: 1), on: Self.link, now: 1))
                == [
                    .subscriptionsRequest(version: 1)
                ])
        let document = WireDocument(collection: "", id: .string("c1"), state: [1])
        let early = r.received(
            .batch(subscription: .number(0), documents: [document], upTo: 7, generation: 0), on: Self.link, now: 2)
        #expect(early.isEmpty, "\(early)")
        let served = r.received(.subscriptions(set, version: 1), on: Self.link, now: 3)
        #expect(ReplicatorTests.scans(served).map(\.spec) == [query])
        #expect(
            ReplicatorTests.sent(served).contains {
                if case .subscriptions(let s, 2) = $0 {
                    s.map(\.generation) == [1] && s.map(\.since) == [0]
                } else {
                    false
                }
            }, "\(served)")
        // A batch of the old generation still in flight merges without its checkpoint; the new
        // generation's stores it.
        func stores(_ generation: UInt32) -> Bool? {
            r.received(
                .batch(subscription: .number(0), documents: [document], upTo: 7, generation: generation), on: Self.link,
                now: 4
            )
            .compactMap { if case .apply(_, let request) = $0 { request.storeCheckpoint } else { nil } }.first
        }
        #expect(stores(0) == false)
        #expect(stores(1) == true)
    }

    /// A peer that restarted remembers nothing: it asks for the set in full.
    @Test func aRestartedPeerAsksForTheFullSet() throws {
        var pair = try Pair.metBefore()
        let config = ReplicatorConfiguration(peerKey: Self.keyB)
        pair.b = Replicator(
            configuration: config, local: LocalLog(epoch: Self.epochB, site: 0x102, lastSeq: 200), seed: 3)
        _ = try pair.b.subscribe(Self.spec, now: pair.now)
        pair.connect(checkpointsA: Self.stored.a, checkpointsB: Self.stored.b)
        #expect(pair.messages.filter { $0.from == "b" }.contains { $0.message == .subscriptionsRequest(version: 1) })
        #expect(pair.scans.contains { $0.node == "b" && $0.after == 200 })
        #expect(!pair.kinds.contains("ack"))
    }

    /// Remembered sets are bounded: beyond the limit the least recently remembered peer is
    /// forgotten (its digest is then answered by a request), and a set above the byte bound is
    /// not remembered.
    @Test func theMemoryIsBounded() throws {
        var pair = try Pair.metBefore { $0.maxRememberedSubscriptionSets = 0 }
        pair.connect(checkpointsA: Self.stored.a, checkpointsB: Self.stored.b)
        #expect(pair.kinds.filter { $0 == "subsreq" }.count == 2, "\(pair.kinds)")
        #expect(pair.scans.map(\.after).sorted() == [100, 200])
        var small = try Pair.metBefore { $0.maxRememberedSubscriptionBytes = 10 }
        small.connect(checkpointsA: Self.stored.a, checkpointsB: Self.stored.b)
        #expect(small.kinds.filter { $0 == "subsreq" }.count == 2, "\(small.kinds)")
        // One peer remembered at most: B is forgotten once C's set is remembered.
        var r = Replicator(
            configuration: {
                var c = ReplicatorConfiguration(peerKey: Self.keyA)
                c.maxRememberedSubscriptionSets = 1
                return c
            }(), local: LocalLog(epoch: Self.epochA, site: 0x101, lastSeq: 100), seed: 4)
        let keyC: [UInt8] = Array(repeating: 3, count: 32)
        let set = [WireSubscription(spec: Self.spec, since: 0, hops: 0, deltas: true, number: 0)]
        for (n, key) in [Self.keyB, keyC].enumerated() {
            let link = LinkID(UInt64(n + 10))
            _ = r.linkOpened(
                link, peerKey: key, initiator: false, address: "p", endpoint: nil, checkpoints: [:], now: 0)
            _ = r.received(Self.hello(key, site: 0x200 + SiteID(n), resumes: true), on: link, now: 0)
            _ = r.received(.subscriptions(set, version: 1), on: link, now: 0)
            _ = r.linkClosed(link, reason: "gone", now: 1)
        }
        for (key, remembered) in [(Self.keyB, false), (keyC, true)] {
            let link = LinkID(20)
            _ = r.linkOpened(
                link, peerKey: key, initiator: false, address: "p", endpoint: nil, checkpoints: [:], now: 2)
            _ = r.received(Self.hello(key, site: key == keyC ? 0x201 : 0x200, resumes: true), on: link, now: 2)
            let answer = r.received(.subscriptionsDigest(Self.digest(set), version: 1), on: link, now: 3)
            #expect(ReplicatorTests.sent(answer).contains(.subscriptionsRequest(version: 1)) == !remembered)
            #expect(!ReplicatorTests.scans(answer).isEmpty == remembered)
            _ = r.linkClosed(link, reason: "gone", now: 4)
        }
    }

    static func hello(_ key: [UInt8], site: SiteID, resumes: Bool) -> WireMessage {
        .hello(
            Hello(
                version: WireMessage.protocolVersion, peerKey: key, site: site, epoch: epochB, nonce: 7,
                earlySubscriptions: true, compactNames: true, caughtUpBatches: true, resumesSubscriptions: resumes))
    }

    /// A peer whose last hello did not say `f` bit 1 gets the early `subs` in full, as before; one
    /// that did gets the digest, and the set in full when it asks for that version (not for an
    /// older one, nor once a later set replaced it).
    @Test func onlyAPeerThatRemembersSetsGetsADigest() throws {
        var r = Replicator(
            configuration: ReplicatorConfiguration(peerKey: Self.keyA),
            local: LocalLog(epoch: Self.epochA, site: 0x101, lastSeq: 100), seed: 5)
        _ = try r.subscribe(Self.spec, now: 0)
        func open(_ link: LinkID) -> [WireMessage] {
            ReplicatorTests.sent(
                r.linkOpened(
                    link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil,
                    checkpoints: [UTF8Key(Self.spec.key): Checkpoint(epoch: Self.epochB, seq: 40)], now: 0))
        }
        _ = open(LinkID(1))
        _ = r.received(Self.hello(Self.keyB, site: 0x102, resumes: false), on: LinkID(1), now: 0)
        _ = r.linkClosed(LinkID(1), reason: "gone", now: 1)
        let early = [WireSubscription(spec: Self.spec, since: 40, hops: 0, epoch: Self.epochB, deltas: true, number: 0)]
        #expect(open(LinkID(2)).last == .subscriptions(early, version: 1))
        _ = r.received(Self.hello(Self.keyB, site: 0x102, resumes: true), on: LinkID(2), now: 2)
        _ = r.linkClosed(LinkID(2), reason: "gone", now: 3)
        #expect(open(LinkID(3)).last == .subscriptionsDigest(Self.digest(early), version: 1))
        _ = r.received(Self.hello(Self.keyB, site: 0x102, resumes: true), on: LinkID(3), now: 4)
        #expect(ReplicatorTests.sent(r.received(.subscriptionsRequest(version: 7), on: LinkID(3), now: 5)).isEmpty)
        #expect(
            ReplicatorTests.sent(r.received(.subscriptionsRequest(version: 1), on: LinkID(3), now: 5)) == [
                .subscriptions(early, version: 1)
            ])
        // Answered once.
        #expect(ReplicatorTests.sent(r.received(.subscriptionsRequest(version: 1), on: LinkID(3), now: 6)).isEmpty)
    }

    /// A peer that did not say it resumes sets may send neither a digest nor a request.
    @Test func aDigestOrARequestFromAPeerThatDidNotSaySoIsAProtocolError() throws {
        for message: WireMessage in [
            .subscriptionsDigest(StateDigest(high: 1, low: 2), version: 1), .subscriptionsRequest(version: 1),
        ] {
            var r = Replicator(
                configuration: ReplicatorConfiguration(peerKey: Self.keyA),
                local: LocalLog(epoch: Self.epochA, site: 0x101, lastSeq: 100), seed: 6)
            _ = r.linkOpened(
                Self.link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 0)
            _ = r.received(Self.hello(Self.keyB, site: 0x102, resumes: false), on: Self.link, now: 0)
            let directives = r.received(message, on: Self.link, now: 1)
            #expect(
                ReplicatorTests.sent(directives).contains { if case .error("protocol", _) = $0 { true } else { false } }
            )
        }
    }

    /// The digest as PROTOCOL.md §2 step 3 writes it out, computed from that text alone (in
    /// Python) for three inputs: 21 bytes (two words and a tail), none, and exactly two words.
    @Test func theDigestIsTheOneTheProtocolDocumentDescribes() {
        #expect(StateDigest(Array(0..<21)) == StateDigest(high: 0x6d7a_2675_be5d_6c02, low: 0x326d_496d_ab30_8bc1))
        #expect(StateDigest([]) == StateDigest(high: 0x8cdc_fbfc_410b_b84e, low: 0x80e3_14c5_d4c0_4880))
        #expect(StateDigest(Array(0..<16)) == StateDigest(high: 0x0121_45dc_3838_cc71, low: 0x6174_77bc_11a7_36ab))
    }

    @Test func digestsAndRequestsTravel() throws {
        for message: WireMessage in [
            .subscriptionsDigest(StateDigest(high: 0x0102_0304_0506_0708, low: 9), version: 3),
            .subscriptionsRequest(version: 3),
            Self.hello(Self.keyB, site: 1, resumes: true),
        ] {
            #expect(try WireMessage(serialized: message.serialized()) == message)
        }
        #expect(
            WireMessage.subscriptionsDigest(StateDigest(high: 1, low: 2), version: 1).encoded
                == .map([
                    "t": "subs", "v": 1, "h": .bytes([0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]),
                ]))
        #expect(throws: WireError.self) { try WireMessage(["t": "subs", "v": 1, "h": .bytes([1, 2])]) }
        #expect(throws: WireError.self) { try WireMessage(["t": "subs", "v": 1]) }
        guard case .hello(let h) = try WireMessage(Self.hello(Self.keyB, site: 1, resumes: true).encoded) else {
            return #expect(Bool(false))
        }
        #expect(h.resumesSubscriptions && h.caughtUpBatches)
    }
}
