import Testing
import TrellisCore

@Suite struct SyncSessionTests {
    let keyA: [UInt8] = Array(repeating: 1, count: 32)
    let keyB: [UInt8] = Array(repeating: 2, count: 32)

    func hello(_ key: [UInt8], version: Int = WireMessage.protocolVersion) -> Hello {
        Hello(version: version, peerKey: key, site: 7, epoch: Array(repeating: 9, count: 16))
    }

    func session(maxInFlight: Int = 2) -> SyncSession {
        var config = SyncSession.Configuration(hello: hello(keyA), remotePeerKey: keyB)
        config.maxInFlight = maxInFlight
        config.batchSize = 10
        return SyncSession(configuration: config)
    }

    @Test func helloThenSubscriptionsThenScan() {
        var s = session()
        #expect(s.start() == [.send(.hello(hello(keyA)))])
        #expect(s.receive(.hello(hello(keyB))) == [.established(hello(keyB))])
        let spec = SubscriptionSpec(collection: "cars", query: "Origin == 'Japan'")
        let sub = WireSubscription(spec: spec, since: 5, hops: 0)
        let directives = s.receive(.subscriptions([sub]))
        #expect(
            directives == [
                .remoteSubscriptionsChanged([sub]), .scan(subscription: spec.key, spec: spec, after: 5, limit: 10),
            ])
    }

    @Test func anUnknownVersionGetsAnExplicitErrorAndClose() {
        var s = session()
        _ = s.start()
        let directives = s.receive(.hello(hello(keyB, version: 99)))
        guard case .send(.error(let code, let message)) = directives.first else {
            Issue.record("expected an error message, got \(directives)")
            return
        }
        #expect(code == "version")
        #expect(message.contains("99"))
        #expect(directives.last.map { if case .close = $0 { true } else { false } } == true)
        #expect(s.receive(.hello(hello(keyB))).isEmpty)  // closed: nothing more
    }

    @Test func aHelloWithAnotherPeerKeyIsRefused() {
        var s = session()
        _ = s.start()
        let directives = s.receive(.hello(hello(Array(repeating: 3, count: 32))))
        #expect(
            directives.contains(
                .close(reason: "identity: hello names a peer key other than the one the channel authenticated")))
    }

    @Test func messagesBeforeHelloAreAProtocolError() {
        var s = session()
        let directives = s.receive(.ack(subscription: "x", upTo: 1))
        #expect(directives.first == .send(.error(code: "protocol", message: "expected hello first")))
    }

    @Test func tooManySubscriptionsAreAProtocolError() {
        var s = session()
        _ = s.receive(.hello(hello(keyB)))
        let subs = (0...1024).map {
            WireSubscription(spec: SubscriptionSpec(collection: "c", query: "n == \($0)"), since: 0, hops: 0)
        }
        let directives = s.receive(.subscriptions(subs))
        guard case .send(.error(let code, _))? = directives.first else {
            Issue.record("expected an error, got \(directives.count) directives")
            return
        }
        #expect(code == "limit")
        #expect(!s.isEstablished)
    }

    @Test func batchesForSubscriptionsNotSentAreDropped() {
        var s = session()
        _ = s.receive(.hello(hello(keyB)))
        #expect(s.receive(.batch(subscription: "nope", documents: [], upTo: 3)).isEmpty)
        let spec = SubscriptionSpec(collection: "cars")
        _ = s.subscribe([WireSubscription(spec: spec, since: 0, hops: 0)])
        #expect(
            s.receive(.batch(subscription: spec.key, documents: [], upTo: 3))
                == [.apply(subscription: spec.key, documents: [], upTo: 3)])
        #expect(s.applied(subscription: spec.key, upTo: 3) == [.send(.ack(subscription: spec.key, upTo: 3))])
    }

    @Test func flowControlBoundsUnacknowledgedBatches() {
        var s = session(maxInFlight: 2)
        _ = s.receive(.hello(hello(keyB)))
        let spec = SubscriptionSpec(collection: "cars")
        _ = s.receive(.subscriptions([WireSubscription(spec: spec, since: 0, hops: 0)]))
        let doc = WireDocument(collection: "cars", id: "x", state: [0xA0])
        // Full scans: more is waiting, so the session scans again until two batches are in flight.
        var d = s.scanned(subscription: spec.key, documents: [doc], upTo: 10, exhausted: false)
        #expect(d.count == 2)
        #expect(d.last == .scan(subscription: spec.key, spec: spec, after: 10, limit: 10))
        d = s.scanned(subscription: spec.key, documents: [doc], upTo: 20, exhausted: false)
        #expect(d == [.send(.batch(subscription: spec.key, documents: [doc], upTo: 20))])  // window full
        d = s.receive(.ack(subscription: spec.key, upTo: 10))
        #expect(d == [.scan(subscription: spec.key, spec: spec, after: 20, limit: 10)])
        // Exhausted with nothing matching: one empty batch advances the receiver's checkpoint.
        d = s.scanned(subscription: spec.key, documents: [], upTo: 25, exhausted: true)
        #expect(d == [.send(.batch(subscription: spec.key, documents: [], upTo: 25))])
        // A local commit while idle scans again from the cursor.
        _ = s.receive(.ack(subscription: spec.key, upTo: 20))
        _ = s.receive(.ack(subscription: spec.key, upTo: 25))
        #expect(s.localChanged() == [.scan(subscription: spec.key, spec: spec, after: 25, limit: 10)])
    }

    @Test func wireMessagesRoundTripAndMalformedOnesAreErrors() throws {
        let spec = SubscriptionSpec(collection: "cars", query: "a == $args.x", args: ["x": 1.5])
        let messages: [WireMessage] = [
            .hello(hello(keyA)),
            .subscriptions([WireSubscription(spec: spec, since: 42, hops: 2)]),
            .batch(
                subscription: spec.key, documents: [WireDocument(collection: "c", id: ["k": 1], state: [1, 2])], upTo: 9
            ),
            .ack(subscription: "k", upTo: 9),
            .error(code: "version", message: "no"),
        ]
        for message in messages {
            #expect(try WireMessage(serialized: message.serialized()) == message)
        }
        #expect(throws: WireError.self) { try WireMessage(serialized: [0xFF]) }
        #expect(throws: WireError.self) { try WireMessage(["t": "batch", "sub": "x"]) }
        #expect(throws: WireError.self) { try WireMessage(["t": "warp"]) }
        #expect(throws: WireError.self) { try WireMessage(["t": "ack", "sub": 3, "upTo": 1]) }
        #expect(throws: WireError.self) {
            try WireMessage(["t": "hello", "v": 1, "key": .bytes(keyA), "site": 1, "epoch": .bytes([])])
        }
        #expect(throws: WireError.self) {
            try WireMessage(["t": "subs", "subs": [["c": "", "q": "true", "a": [:], "since": 0, "hops": 0]]])
        }
    }
}
