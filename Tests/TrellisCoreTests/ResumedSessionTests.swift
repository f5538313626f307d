import Testing
import TrellisCore

/// Sessions resumed by digest (docs/PROTOCOL.md §2, step 1): a node whose peer's last `hello` said
/// `f` bit 2 opens a later connection with `{t: "r", h}` alone, `h` the digest of the `hello` it
/// would send (nonce 0, key present) and of its early `subs`; the peer takes the `hello` it
/// remembers, with the connection's nonce from the secure channel, and the set it remembers, when
/// the digest matches, and answers `helloreq` otherwise. Without a channel nonce, sessions open
/// with a `hello` as before (SubscriptionDigestTests).
@Suite struct ResumedSessionTests {
    typealias Pair = SubscriptionDigestTests.Pair
    static let spec = SubscriptionDigestTests.spec
    static let stored = SubscriptionDigestTests.stored

    /// An idle reconnect: one 24-byte `r` each way and one caught-up batch each way, 72 bytes in
    /// four messages (the speed issue's goal: at most 76 bytes for one origin, one round trip).
    @Test func anIdleReconnectIsOneResumeEachWay() throws {
        var pair = try Pair.metBefore(channelNonce: 1)
        // The first meeting opened with hellos: nothing was remembered yet.
        pair.channelNonce = 2
        pair.connect(checkpointsA: Self.stored.a, checkpointsB: Self.stored.b)
        #expect(pair.kinds.sorted() == ["caughtUp", "caughtUp", "resume", "resume"], "\(pair.kinds)")
        #expect(pair.scans.map(\.after).sorted() == [100, 200])
        let bytes = pair.messages.filter {
            if case .presence = $0.message { false } else { true }
        }.map { $0.message.serialized().count }
        #expect(bytes.reduce(0, +) == 72, "\(bytes)")
        // A third connection resumes again: what a resumed session served is remembered too.
        pair.close()
        pair.channelNonce = 3
        pair.connect(checkpointsA: Self.stored.a, checkpointsB: Self.stored.b)
        #expect(pair.kinds.sorted() == ["caughtUp", "caughtUp", "resume", "resume"], "\(pair.kinds)")
    }

    /// The digest is of the `hello` as `Hello.resumeBytes(key:)` encodes it, then of the `subs` of
    /// version 1, as PROTOCOL.md describes.
    @Test func theDigestIsTheOneTheProtocolDocumentDescribes() throws {
        var pair = try Pair.metBefore(channelNonce: 1)
        pair.channelNonce = 2
        pair.connect(checkpointsA: Self.stored.a, checkpointsB: Self.stored.b)
        let hello = Hello(
            version: WireMessage.protocolVersion, peerKey: SubscriptionDigestTests.keyA, site: 0x101,
            epoch: SubscriptionDigestTests.epochA, nonce: 0, earlySubscriptions: true, compactNames: true,
            caughtUpBatches: true, resumesSubscriptions: true, resumesSessions: true)
        let subs = WireMessage.subscriptions(
            [
                WireSubscription(
                    spec: Self.spec, since: 200, hops: 0, epoch: SubscriptionDigestTests.epochB, deltas: true,
                    number: 0)
            ], version: 1)
        let expected = StateDigest(WireMessage.hello(hello).serialized() + subs.serialized())
        #expect(pair.messages.contains { $0.from == "a" && $0.message == .resume(expected) })
        #expect(hello.resumeBytes(key: SubscriptionDigestTests.keyA) == WireMessage.hello(hello).serialized())
    }

    /// A resume that names another `hello` or set than the peer remembers (here the node's
    /// checkpoint went back) is answered by `helloreq`: the node's `hello` and `subs` then go in
    /// full, and the peer serves from the `since` they carry. The peer's own resume matched.
    @Test func aResumeThatDoesNotMatchIsAnsweredByAHelloRequest() throws {
        var pair = try Pair.metBefore(channelNonce: 1)
        pair.channelNonce = 2
        pair.connect(
            checkpointsA: [UTF8Key(Self.spec.key): Checkpoint(epoch: SubscriptionDigestTests.epochB, seq: 150)],
            checkpointsB: Self.stored.b)
        #expect(pair.messages.filter { $0.from == "b" }.map(\.message).contains(.helloRequest), "\(pair.kinds)")
        let fromA = pair.messages.filter { $0.from == "a" }.map(\.message)
        #expect(fromA.contains { if case .hello(let h) = $0 { h.nonce == 2 } else { false } }, "\(fromA)")
        #expect(
            fromA.contains(
                .subscriptions(
                    [
                        WireSubscription(
                            spec: Self.spec, since: 150, hops: 0, epoch: SubscriptionDigestTests.epochB, deltas: true,
                            number: 0)
                    ], version: 1)))
        #expect(pair.scans.contains { $0.node == "b" && $0.after == 150 })
        #expect(pair.scans.contains { $0.node == "a" && $0.after == 100 })
    }

    /// What the peer sent before the `hello` a node asked for (answers to the node's own early
    /// subscriptions, which the peer took from its resume) is kept, and taken once the peer's set,
    /// which follows that `hello`, is here: nothing is asked again, and the node hears that it is
    /// caught up. (B's resume reaches A, which serves it at once, before B's `helloreq`.)
    @Test func whatThePeerSentBeforeTheAskedHelloIsTakenAfterItsSet() throws {
        var pair = try Pair.metBefore(channelNonce: 1)
        let link = SubscriptionDigestTests.link
        let openA = pair.a.linkOpened(
            link, peerKey: SubscriptionDigestTests.keyB, initiator: true, address: "b", endpoint: nil,
            checkpoints: [UTF8Key(Self.spec.key): Checkpoint(epoch: SubscriptionDigestTests.epochB, seq: 150)],
            channelNonce: 2, now: pair.now)
        let openB = pair.b.linkOpened(
            link, peerKey: SubscriptionDigestTests.keyA, initiator: false, address: "a", endpoint: nil,
            checkpoints: Self.stored.b, channelNonce: 2, now: pair.now)
        pair.messages = []
        pair.scans = []
        pair.run(openB.map { ("b", $0) } + openA.map { ("a", $0) })
        let fromA = pair.messages.filter { $0.from == "a" }.map(\.message)
        let fromB = pair.messages.filter { $0.from == "b" }.map(\.message)
        #expect(fromB.contains(.helloRequest), "\(pair.kinds)")
        // A served B's resumed set at once; B kept that answer until A's set came, and took it.
        #expect(fromA.filter { if case .caughtUp = $0 { true } else { false } }.count == 1, "\(pair.kinds)")
        let kinds = pair.kinds
        #expect(kinds.firstIndex(of: "caughtUp")! < kinds.firstIndex(of: "hello")!, "\(kinds)")
        #expect(
            !fromB.contains {
                if case .subscriptions(let s, _) = $0 { s.contains { $0.generation != 0 } } else { false }
            }, "\(fromB)")
        #expect(pair.b.status.peers.first?.asked.first?.progress?.initialSyncComplete == true)
    }

    /// A peer that restarted remembers no `hello`: it asks for it, and the sync completes.
    @Test func aRestartedPeerAsksForTheHello() throws {
        var pair = try Pair.metBefore(channelNonce: 1)
        pair.b = Replicator(
            configuration: ReplicatorConfiguration(peerKey: SubscriptionDigestTests.keyB),
            local: LocalLog(epoch: SubscriptionDigestTests.epochB, site: 0x102, lastSeq: 200), seed: 3)
        _ = try pair.b.subscribe(Self.spec, now: pair.now)
        pair.channelNonce = 2
        pair.connect(checkpointsA: Self.stored.a, checkpointsB: Self.stored.b)
        let fromB = pair.messages.filter { $0.from == "b" }.map(\.message)
        #expect(fromB.contains(.helloRequest), "\(pair.kinds)")
        #expect(pair.kinds.filter { $0 == "hello" }.count == 2, "\(pair.kinds)")
        #expect(pair.scans.contains { $0.node == "b" && $0.after == 200 })
        #expect(pair.scans.contains { $0.node == "a" && $0.after == 100 })
        #expect(pair.kinds.filter { $0 == "caughtUp" }.count == 2, "\(pair.kinds)")
    }

    /// Without a number from the channel no session resumes: `hello` and the `subs` digest, as
    /// before.
    @Test func withoutAChannelNonceSessionsOpenWithAHello() throws {
        var pair = try Pair.metBefore()
        pair.connect(checkpointsA: Self.stored.a, checkpointsB: Self.stored.b)
        #expect(pair.kinds.sorted() == ["caughtUp", "caughtUp", "digest", "digest", "hello", "hello"], "\(pair.kinds)")
        // One side with a nonce and the other without: the resume is asked for in full, and the
        // sync completes.
        pair.close()
        pair.channelNonce = 4
        let openA = pair.a.linkOpened(
            SubscriptionDigestTests.link, peerKey: SubscriptionDigestTests.keyB, initiator: true, address: "b",
            endpoint: nil, checkpoints: Self.stored.a, channelNonce: 4, now: pair.now)
        let openB = pair.b.linkOpened(
            SubscriptionDigestTests.link, peerKey: SubscriptionDigestTests.keyA, initiator: false, address: "a",
            endpoint: nil, checkpoints: Self.stored.b, channelNonce: nil, now: pair.now)
        pair.messages = []
        pair.scans = []
        pair.run(openA.map { ("a", $0) } + openB.map { ("b", $0) })
        #expect(pair.kinds.contains("helloreq"), "\(pair.kinds)")
        #expect(pair.scans.map(\.after).sorted() == [100, 200])
    }

    /// A resume is a first message only: after a `hello` or a resume taken it is a protocol
    /// error, but the same resume again (a duplicating transport) is ignored; a `helloreq` is
    /// answered once; a batch before any `hello`, when none was asked for, is the protocol error
    /// it always was.
    @Test func aResumeIsAFirstMessageOnly() throws {
        var pair = try Pair.metBefore(channelNonce: 1)
        pair.channelNonce = 2
        pair.connect(checkpointsA: Self.stored.a, checkpointsB: Self.stored.b)
        let link = SubscriptionDigestTests.link
        guard case .resume(let taken) = pair.messages.first(where: { $0.from == "a" })?.message else {
            Issue.record("no resume from a: \(pair.kinds)")
            return
        }
        #expect(pair.b.received(.resume(taken), on: link, now: pair.now + 1).isEmpty)
        #expect(ReplicatorTests.sent(pair.b.received(.helloRequest, on: link, now: pair.now + 1)).count >= 2)
        #expect(pair.b.received(.helloRequest, on: link, now: pair.now + 1).isEmpty)
        let other = pair.b.received(
            .resume(StateDigest(bytes: [UInt8](repeating: 9, count: 16)[...])), on: link, now: 9)
        #expect(ReplicatorTests.sent(other).contains { if case .error("protocol", _) = $0 { true } else { false } })
        var fresh = Replicator(
            configuration: ReplicatorConfiguration(peerKey: SubscriptionDigestTests.keyB),
            local: LocalLog(epoch: SubscriptionDigestTests.epochB, site: 0x102, lastSeq: 200), seed: 3)
        _ = fresh.linkOpened(
            link, peerKey: SubscriptionDigestTests.keyA, initiator: false, address: "a", endpoint: nil,
            checkpoints: [:], channelNonce: 5, now: 0)
        let early = fresh.received(.caughtUp(subscription: .key(Self.spec.key), generation: 0), on: link, now: 1)
        #expect(ReplicatorTests.sent(early).contains { if case .error("protocol", _) = $0 { true } else { false } })
    }

    /// The messages travel: `r` with its 16-byte digest, `helloreq`, and `hello`'s `f` bit 2.
    @Test func resumesAndHelloRequestsTravel() throws {
        let digest = StateDigest(bytes: [UInt8](0..<16)[...])
        #expect(try WireMessage(serialized: WireMessage.resume(digest).serialized()) == .resume(digest))
        #expect(WireMessage.resume(digest).serialized().count == 24)
        #expect(try WireMessage(serialized: WireMessage.helloRequest.serialized()) == .helloRequest)
        #expect(throws: WireError.self) {
            try WireMessage(.map(["t": "r", "h": .bytes([1, 2, 3])]))
        }
        let hello = Hello(
            version: WireMessage.protocolVersion, peerKey: [], site: 1, epoch: [UInt8](repeating: 1, count: 16),
            nonce: 9, resumesSessions: true)
        guard case .hello(let decoded) = try WireMessage(serialized: WireMessage.hello(hello).serialized()) else {
            Issue.record("not a hello")
            return
        }
        #expect(decoded.resumesSessions && !decoded.resumesSubscriptions && !decoded.caughtUpBatches)
        // The digest covers no nonce and always the key.
        var other = hello
        other.nonce = 10
        #expect(
            other.resumeBytes(key: [UInt8](repeating: 7, count: 32))
                == hello.resumeBytes(key: [UInt8](repeating: 7, count: 32)))
        #expect(
            hello.resumeBytes(key: [UInt8](repeating: 7, count: 32))
                != hello.resumeBytes(key: [UInt8](repeating: 8, count: 32)))
    }
}
