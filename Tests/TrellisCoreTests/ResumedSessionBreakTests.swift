import Testing
import TrellisCore

/// Attempts to break sessions resumed by digest (docs/PROTOCOL.md §2, step 1).
@Suite struct ResumedSessionBreakTests {
    typealias Pair = SubscriptionDigestTests.Pair
    static let keyA = SubscriptionDigestTests.keyA
    static let keyB = SubscriptionDigestTests.keyB
    static let cars = SubscriptionDigestTests.spec
    static let dogs = SubscriptionSpec(collection: "dogs")
    static let birds = SubscriptionSpec(collection: "birds")

    /// A forbids B to read `dogs`. On a reconnect A takes B's `r` (B's set did not change) and
    /// serves it at once: its `suberr forbidden` for `dogs` goes before B's `helloreq` arrives
    /// (A's own set changed, so B cannot take A's `r`). B drops it (it waits for A's `hello`),
    /// asks its set again under a new generation, and A, which already refused the
    /// subscription on this connection, never sends the error again: B never learns that `dogs`
    /// is refused (its status shows no error, unlike after a plain `hello`).
    @Test func aRefusalSentBeforeTheAskedHelloIsNotLost() throws {
        let rules = Authorization(rules: [
            .anyPeer: .init(default: .readWrite),
            .peer(Self.keyB): .init(default: .readWrite, collections: [UTF8Key("dogs"): .write]),
        ])
        var pair = try Pair { $0.authorization = rules }
        _ = try pair.b.subscribe(Self.dogs, now: 0)
        pair.channelNonce = 1
        pair.connect(checkpointsA: [:], checkpointsB: [:])
        #expect(Self.errors(pair.b)[Self.dogs.key] != nil, "first meeting: \(pair.kinds)")
        pair.close()
        // A's own set changes meanwhile: B cannot take A's resume.
        _ = try pair.a.subscribe(Self.birds, now: pair.now)
        pair.channelNonce = 2
        pair.connect(
            checkpointsA: SubscriptionDigestTests.stored.a, checkpointsB: SubscriptionDigestTests.stored.b)
        #expect(pair.kinds.contains("helloreq"), "\(pair.kinds)")
        #expect(pair.a.status.peers.first?.phase == "established")
        #expect(pair.b.status.peers.first?.phase == "established")
        #expect(
            Self.errors(pair.b)[Self.dogs.key] != nil,
            "B's subscription to dogs shows no refusal: \(Self.errors(pair.b)) \(pair.kinds)")
    }

    /// A second connection opens while the first (resumed) one is established: whatever side
    /// dials it, whatever its channel number, and whichever side cannot take the other's `r`,
    /// both ends must end with the same single established link, and it must sync.
    @Test(arguments: ["a", "b"], [UInt64(1), UInt64.max - 1])
    func aDuplicateConnectionEndsWithOneLinkBothAgreeOn(dialer: String, nonce: UInt64) throws {
        for mismatch in ["none", "a", "b", "both"] {
            let pair = try Pair.metBefore(channelNonce: 1)
            var duo = Duo(pair: pair)
            let stored = SubscriptionDigestTests.stored
            duo.open(LinkID(1), dialer: "a", nonce: 2, checkpointsA: stored.a, checkpointsB: stored.b)
            duo.run()
            #expect(duo.phases(duo.a)[LinkID(1)] == "established")
            #expect(duo.phases(duo.b)[LinkID(1)] == "established")
            // The second connection: a side whose checkpoint moved sends an `r` the other cannot take.
            let (ca, cb) = Self.checkpoints(mismatch: mismatch)
            duo.log = []
            duo.open(LinkID(2), dialer: dialer, nonce: nonce, checkpointsA: ca, checkpointsB: cb)
            duo.run()
            duo.tick(times: 5, by: 1_000)
            Self.expectOneAgreedLinkServingCars(duo, mismatch: mismatch)
        }
    }

    /// Two connections open at once (each side dialed one), one with a channel number and one
    /// without, or both with; whichever side cannot take the other's `r`: both ends must keep
    /// the same single link.
    @Test(arguments: [UInt64?.none, UInt64(5)], [UInt64(1), UInt64.max - 1])
    func simultaneousConnectionsEndWithOneLinkBothAgreeOn(first: UInt64?, second: UInt64) throws {
        for mismatch in ["none", "a", "b", "both"] {
            let pair = try Pair.metBefore(channelNonce: 1)
            var duo = Duo(pair: pair)
            let (ca, cb) = Self.checkpoints(mismatch: mismatch)
            duo.open(LinkID(1), dialer: "a", nonce: first, checkpointsA: ca, checkpointsB: cb)
            duo.open(LinkID(2), dialer: "b", nonce: second, checkpointsA: ca, checkpointsB: cb)
            duo.run()
            duo.tick(times: 5, by: 1_000)
            Self.expectOneAgreedLinkServingCars(duo, mismatch: mismatch)
        }
    }

    /// Checkpoints that moved since the last session (A's on B's log back to 150, B's on A's to
    /// 50): a side holding them sends an `r` the other cannot take.
    static let movedA: [UTF8Key: Checkpoint] = [
        UTF8Key(cars.key): Checkpoint(epoch: SubscriptionDigestTests.epochB, seq: 150)
    ]
    static let movedB: [UTF8Key: Checkpoint] = [
        UTF8Key(cars.key): Checkpoint(epoch: SubscriptionDigestTests.epochA, seq: 50)
    ]

    /// The checkpoints A and B open with when `mismatch` ("none", "a", "b" or "both") names the
    /// sides whose `r` the other cannot take.
    static func checkpoints(mismatch: String) -> (a: [UTF8Key: Checkpoint], b: [UTF8Key: Checkpoint]) {
        let stored = SubscriptionDigestTests.stored
        return (
            mismatch == "a" || mismatch == "both" ? movedA : stored.a,
            mismatch == "b" || mismatch == "both" ? movedB : stored.b
        )
    }

    /// Both ends keep the same single established link, and each serves the other `cars` on it.
    static func expectOneAgreedLinkServingCars(
        _ duo: Duo, mismatch: String, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let pa = duo.phases(duo.a).filter { $0.value == "established" }.keys.sorted()
        let pb = duo.phases(duo.b).filter { $0.value == "established" }.keys.sorted()
        if let kept = pa.first {
            let servedA = duo.a.status.peers.first { $0.link == kept }?.served.map(\.spec) ?? []
            let servedB = duo.b.status.peers.first { $0.link == kept }?.served.map(\.spec) ?? []
            #expect(
                servedA == [Self.cars] && servedB == [Self.cars],
                "mismatch \(mismatch): kept \(kept) served A \(servedA) B \(servedB)", sourceLocation: sourceLocation)
        }
        #expect(
            pa.count == 1 && pa == pb,
            "mismatch \(mismatch): A \(duo.phases(duo.a)) B \(duo.phases(duo.b)) \(duo.log.map { "\($0.from)@\($0.link) \($0.message)" })",
            sourceLocation: sourceLocation)
    }

    /// After a reconnect where one side asks for the other's `hello`, each side holds the
    /// other's presence record naming it as a neighbour.
    @Test(arguments: ["a", "b", "both"])
    func presenceSurvivesAHelloRequest(mismatch: String) throws {
        let pair = try Pair.metBefore(channelNonce: 1)
        var duo = Duo(pair: pair)
        let (ca, cb) = Self.checkpoints(mismatch: mismatch)
        duo.open(LinkID(2), dialer: "a", nonce: 9, checkpointsA: ca, checkpointsB: cb)
        duo.run()
        duo.tick(times: 3, by: 1_000)
        let recordOfA = duo.b.status.presence.first { $0.peerKey == Self.keyA }
        let recordOfB = duo.a.status.presence.first { $0.peerKey == Self.keyB }
        #expect(recordOfA?.neighbors == [Self.keyB], "\(duo.b.status.presence)")
        #expect(recordOfB?.neighbors == [Self.keyA], "\(duo.a.status.presence)")
        #expect(duo.log.contains { if case .helloRequest = $0.message { true } else { false } })
    }

    /// B wrote a document (seq 201) since the last session. On the reconnect B takes A's `r`
    /// and serves it at once: the batch with 201 goes before A's `helloreq` (B's checkpoint on A
    /// moved, so A cannot take B's `r`). B must then record that A holds `cars` up to 201
    /// (`heldAcknowledged`), as it does when A took B's `r`. When A dropped that batch and asked
    /// again under a new generation, the dropped batch, counted in flight, became a "stale" batch
    /// whose acknowledgement was awaited first and never came, so the acknowledgement of the new
    /// generation's batch was taken for it and nothing was recorded. Now A keeps the batch until
    /// B's set (after its `hello`) is here, and acknowledges it then: sent once.
    @Test func aBatchDroppedBeforeTheAskedHelloDoesNotEatTheNextAcknowledgement() throws {
        let pair = try Pair.metBefore(channelNonce: 1)
        var duo = Duo(pair: pair)
        duo.extra["b"] = LogRecord(
            seq: 201, key: JSON.string(.string("c1")),
            document: WireDocument(collection: "cars", id: .string("c1"), state: [1]))
        let (ca, cb) = Self.checkpoints(mismatch: "b")
        duo.open(LinkID(2), dialer: "a", nonce: 9, checkpointsA: ca, checkpointsB: cb)
        duo.run()
        let trace = duo.log.map { "\($0.from) \($0.message)" }
        #expect(duo.log.contains { $0.from == "a" && $0.message == .helloRequest }, "\(trace)")
        let batches = duo.log.filter { if $0.from == "b", case .batch = $0.message { true } else { false } }
        #expect(batches.count == 1, "the batch is sent once: \(trace)")
        #expect(
            duo.log.contains { if $0.from == "a", case .ack(_, 201, _) = $0.message { true } else { false } },
            "\(trace)")
        #expect(
            duo.held.contains { $0.node == "b" && $0.upTo == 201 }, "B records nothing of A's ack: \(duo.held) \(trace)"
        )
    }

    /// The same reconnect where both resumes are taken (nothing dropped): B records that A
    /// holds `cars` up to 201 (the control for the test above).
    @Test func controlNothingDroppedRecordsTheAcknowledgement() throws {
        let pair = try Pair.metBefore(channelNonce: 1)
        var duo = Duo(pair: pair)
        duo.extra["b"] = LogRecord(
            seq: 201, key: JSON.string(.string("c1")),
            document: WireDocument(collection: "cars", id: .string("c1"), state: [1]))
        let stored = SubscriptionDigestTests.stored
        duo.open(LinkID(2), dialer: "a", nonce: 9, checkpointsA: stored.a, checkpointsB: stored.b)
        duo.run()
        let trace = duo.log.map { "\($0.from) \($0.message)" }
        #expect(!duo.log.contains { $0.message == .helloRequest }, "\(trace)")
        #expect(duo.held.contains { $0.node == "b" && $0.upTo == 201 }, "\(duo.held) \(trace)")
    }

    /// A hostile or broken peer: random sequences of `r` (the right digest or another),
    /// `helloreq`, `hello`, `subs`, batches and pings on a link opened with a channel number to a
    /// peer met before. Nothing may trap.
    @Test func randomFirstMessagesDoNotTrap() throws {
        let base = try Pair.metBefore(channelNonce: 1)
        var probe = base
        probe.channelNonce = 2
        probe.connect(checkpointsA: SubscriptionDigestTests.stored.a, checkpointsB: SubscriptionDigestTests.stored.b)
        let fromA = probe.messages.filter { $0.from == "a" }.map(\.message)
        let hello =
            probe.messages.compactMap { if case .hello(let h) = $0.message { h } else { nil } }.first
            ?? Hello(
                version: WireMessage.protocolVersion, peerKey: Self.keyA, site: 0x101,
                epoch: SubscriptionDigestTests.epochA)
        var menu: [WireMessage] =
            fromA + [
                .helloRequest, .resume(StateDigest(bytes: [UInt8](repeating: 3, count: 16)[...])), .hello(hello),
                .subscriptions([WireSubscription(spec: Self.cars, since: 0, hops: 0)], version: 1),
                .caughtUp(subscription: .key(Self.cars.key), generation: 0),
                .caughtUp(subscription: .number(0), generation: 0),
                .ack(subscription: .key(Self.cars.key), upTo: 5), .ping(1), .pong(1), .presence([]),
                .subscriptionsDigest(StateDigest(bytes: [UInt8](repeating: 4, count: 16)[...]), version: 1),
                .subscriptionsRequest(version: 1),
            ]
        var h2 = hello
        h2.nonce = 2
        menu.append(.hello(h2))
        var rng = SplitMix64(seed: 7)
        for _ in 0..<400 {
            var b = base.b
            let link = LinkID(2)
            _ = b.linkOpened(
                link, peerKey: Self.keyA, initiator: false, address: "a", endpoint: nil,
                checkpoints: SubscriptionDigestTests.stored.b, channelNonce: 2, now: 10)
            for i in 0..<Int(rng.next() % 8 + 1) {
                let m = menu[Int(rng.next() % UInt64(menu.count))]
                _ = b.received(m, on: link, now: 11 + Millis(i))
            }
            _ = b.tick(now: 5_000)
            _ = b.linkClosed(link, reason: "x", now: 5_001)
        }
    }

    /// Two replicators and any number of links between them, driven message by message through
    /// one FIFO (so each link is in order). A `close` closes the link at both ends at once.
    struct Duo {
        var a: Replicator
        var b: Replicator
        var now: Millis = 0
        var closed: Set<LinkID> = []
        var log: [(from: String, link: LinkID, message: WireMessage)] = []
        var queue: [(String, ReplicatorDirective)] = []
        /// A record each node's scans find after its log's usual end (B's new write).
        var extra: [String: LogRecord] = [:]
        /// Every `heldAcknowledged` directive, by node.
        var held: [(node: String, upTo: Int64)] = []

        init(pair: Pair) {
            a = pair.a
            b = pair.b
            now = pair.now
        }

        mutating func open(
            _ link: LinkID, dialer: String, nonce: UInt64?, checkpointsA: [UTF8Key: Checkpoint],
            checkpointsB: [UTF8Key: Checkpoint]
        ) {
            let openA = a.linkOpened(
                link, peerKey: keyB, initiator: dialer == "a", address: "b", endpoint: nil, checkpoints: checkpointsA,
                channelNonce: nonce, now: now)
            let openB = b.linkOpened(
                link, peerKey: keyA, initiator: dialer == "b", address: "a", endpoint: nil, checkpoints: checkpointsB,
                channelNonce: nonce, now: now)
            queue += openA.map { ("a", $0) } + openB.map { ("b", $0) }
        }

        mutating func step(_ node: String, _ d: [ReplicatorDirective]) { queue += d.map { (node, $0) } }

        mutating func run(limit: Int = 10_000) {
            var n = 0
            while !queue.isEmpty && n < limit {
                n += 1
                let (node, directive) = queue.removeFirst()
                now += 1
                let peer = node == "a" ? "b" : "a"
                switch directive {
                case .send(let link, let message):
                    guard !closed.contains(link) else { continue }
                    log.append((node, link, message))
                    let decoded = try! WireMessage(serialized: message.serialized())
                    let next =
                        peer == "a" ? a.received(decoded, on: link, now: now) : b.received(decoded, on: link, now: now)
                    step(peer, next)
                case .close(let link, _):
                    guard closed.insert(link).inserted else { continue }
                    step("a", a.linkClosed(link, reason: "closed", now: now))
                    step("b", b.linkClosed(link, reason: "closed", now: now))
                case .scan(let link, let request):
                    guard !closed.contains(link) else { continue }
                    var end: Int64 = node == "a" ? 100 : 200
                    var records: [LogRecord] = []
                    if let record = extra[node] {
                        end = record.seq
                        if request.after < record.seq { records = [record] }
                    }
                    let page = ScanPage(records: records, upTo: max(request.after, end), exhausted: true)
                    let next =
                        node == "a"
                        ? a.scanned(link, request, page: page, now: now)
                        : b.scanned(link, request, page: page, now: now)
                    step(node, next)
                case .apply(let link, let request):
                    guard !closed.contains(link) else { continue }
                    let next =
                        node == "a"
                        ? a.applied(
                            link, subscription: request.subscription, upTo: request.upTo,
                            checkpointStored: request.storeCheckpoint, deferred: 0, now: now)
                        : b.applied(
                            link, subscription: request.subscription, upTo: request.upTo,
                            checkpointStored: request.storeCheckpoint, deferred: 0, now: now)
                    step(node, next)
                case .heldAcknowledged(_, _, let upTo, _):
                    held.append((node, upTo))
                case .takeHeld(let link):
                    step(node, node == "a" ? a.takeHeld(link, now: now) : b.takeHeld(link, now: now))
                default:
                    continue
                }
            }
        }

        /// As ``run(limit:)``, but in a random order that keeps each link direction (and each
        /// node's own work) in order.
        mutating func runRandom(
            _ rng: inout SplitMix64, limit: Int = 10_000, hook: (inout Duo, Int) -> Void = { _, _ in }
        ) {
            var n = 0
            while !queue.isEmpty && n < limit {
                n += 1
                func channel(_ e: (String, ReplicatorDirective)) -> String {
                    if case .send(let l, _) = e.1 { return "\(e.0)-\(l)" }
                    if case .close = e.1 { return "close" }
                    return "\(e.0)-local"
                }
                var seen: Set<String> = []
                var candidates: [Int] = []
                for (i, e) in queue.enumerated() where seen.insert(channel(e)).inserted { candidates.append(i) }
                let i = candidates[Int(rng.next() % UInt64(candidates.count))]
                let e = queue.remove(at: i)
                queue.insert(e, at: 0)
                run(limit: 1)
                hook(&self, n)
            }
        }

        /// Ticks both sides (keepalives, probes) a few times, `by` ms apart, running to quiet.
        mutating func tick(times: Int, by: Millis) {
            for _ in 0..<times {
                now += by
                step("a", a.tick(now: now))
                step("b", b.tick(now: now))
                run()
            }
        }

        func phases(_ r: Replicator) -> [LinkID: String] {
            Dictionary(uniqueKeysWithValues: r.status.peers.map { ($0.link, $0.phase) })
        }
    }

    /// Random interleavings of a reconnect: random checkpoint moves (so either side may not take
    /// the other's `r`), a second connection opened at a random step, a subscription added or
    /// removed on either side at a random step. At the end both sides keep one link, the same,
    /// and each serves exactly what the other asks.
    @Test func randomReconnects() throws {
        var failures: [String] = []
        for seed in UInt64(1)...300 {
            var rng = SplitMix64(seed: seed)
            let pair = try Pair.metBefore(channelNonce: 1)
            var duo = Duo(pair: pair)
            let stored = SubscriptionDigestTests.stored
            let ca = rng.next() % 2 == 0 ? Self.movedA : stored.a
            let cb = rng.next() % 2 == 0 ? Self.movedB : stored.b
            duo.open(
                LinkID(2), dialer: rng.next() % 2 == 0 ? "a" : "b", nonce: rng.next(), checkpointsA: ca,
                checkpointsB: cb)
            let secondAt = Int(rng.next() % 12)
            let secondDialer = rng.next() % 2 == 0 ? "a" : "b"
            let secondNonce = rng.next()
            let changeAt = Int(rng.next() % 12)
            let changer = rng.next() % 2 == 0 ? "a" : "b"
            let change = rng.next() % 3
            duo.runRandom(&rng) { duo, n in
                if n == secondAt {
                    duo.open(LinkID(3), dialer: secondDialer, nonce: secondNonce, checkpointsA: ca, checkpointsB: cb)
                }
                if n == changeAt {
                    var r = changer == "a" ? duo.a : duo.b
                    let d: [ReplicatorDirective]
                    switch change {
                    case 0: d = (try? r.subscribe(Self.birds, now: duo.now)) ?? []
                    case 1: d = r.unsubscribe(Self.cars, now: duo.now)
                    default: d = []
                    }
                    if changer == "a" { duo.a = r } else { duo.b = r }
                    duo.step(changer, d)
                }
            }
            duo.tick(times: 6, by: 1_000)
            let pa = duo.phases(duo.a).filter { $0.value == "established" }.keys.sorted()
            let pb = duo.phases(duo.b).filter { $0.value == "established" }.keys.sorted()
            var problem: [String] = []
            if !(pa.count == 1 && pa == pb) { problem.append("links A \(duo.phases(duo.a)) B \(duo.phases(duo.b))") }
            if let kept = pa.first, pa == pb {
                let peerA = duo.a.status.peers.first { $0.link == kept }!
                let peerB = duo.b.status.peers.first { $0.link == kept }!
                if Set(peerA.served.map(\.spec.key)) != Set(peerB.asked.map(\.spec.key)) {
                    problem.append("A serves \(peerA.served.map(\.spec.key)) B asks \(peerB.asked.map(\.spec.key))")
                }
                if Set(peerB.served.map(\.spec.key)) != Set(peerA.asked.map(\.spec.key)) {
                    problem.append("B serves \(peerB.served.map(\.spec.key)) A asks \(peerA.asked.map(\.spec.key))")
                }
                for (name, peer) in [("A", peerA), ("B", peerB)] {
                    for asked in peer.asked where asked.progress?.initialSyncComplete != true && asked.error == nil {
                        problem.append(
                            "\(name)'s \(asked.spec.key) not caught up: \(String(describing: asked.progress))")
                    }
                }
            }
            if !problem.isEmpty {
                failures.append(
                    "seed \(seed) (second at \(secondAt) by \(secondDialer), change \(change) by \(changer) at \(changeAt)): \(problem)"
                )
            }
        }
        #expect(failures.isEmpty, "\(failures.count) failures; first: \(failures.prefix(3))")
    }

    static func errors(_ r: Replicator) -> [String: String] {
        var out: [String: String] = [:]
        for peer in r.status.peers { for a in peer.asked { if let e = a.error { out[a.spec.key] = e } } }
        return out
    }
}
