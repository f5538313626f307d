import Testing
import TrellisCore

/// The `h` of a subscription (docs/PROTOCOL.md §2 step 5, `WireSubscription.holds`): a node that
/// asks a peer from 0 for a collection it holds rows of says so, and the peer's pages from 0 then
/// carry every tombstone it reaped (`ScanRequest.reapedAfter` 0), so that documents removed and
/// reaped there go on the subscriber too, whoever it had them from. A node that holds nothing of
/// the collection does not say so, and gets none of them.
@Suite struct HeldCollectionHintTests {
    static let keyA = ReplicatorTests.keyA
    static let keyB = ReplicatorTests.keyB
    static let epochB = ReplicatorTests.epochB
    let link = LinkID(1)
    let spec = SubscriptionSpec(collection: "cars")

    static func hello() -> WireMessage {
        .hello(
            Hello(
                version: WireMessage.protocolVersion, peerKey: keyB, site: 0x102, epoch: epochB, nonce: 7,
                earlySubscriptions: true, compactNames: true, caughtUpBatches: true))
    }

    /// The subscriptions node A sends B once their hellos crossed, A holding rows of `held`.
    func asked(held: [String], committedLater: Set<UTF8Key> = [], checkpoints: [UTF8Key: Checkpoint] = [:])
        throws -> [WireSubscription]
    {
        var r = Replicator(
            configuration: ReplicatorConfiguration(peerKey: Self.keyA),
            local: LocalLog(epoch: Array(repeating: 0xA, count: 16), site: 0x101, lastSeq: 100),
            heldCollections: held, seed: 42)
        _ = r.committed(collections: committedLater, lastSeq: 100, now: 0)
        _ = try r.subscribe(spec, now: 0)
        _ = try r.subscribe(SubscriptionSpec(collection: "boats"), now: 0)
        _ = r.linkOpened(
            link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: checkpoints, now: 0)
        let sent = ReplicatorTests.sent(r.received(Self.hello(), on: link, now: 0))
        let sets = sent.compactMap { if case .subscriptions(let subs, _) = $0 { subs } else { nil } }
        return try #require(sets.last)
    }

    @Test func aSubscriptionFromZeroSaysWhetherItsCollectionHoldsRows() throws {
        let subs = try asked(held: ["cars"])
        #expect(subs.map(\.spec.collection) == ["boats", "cars"])
        #expect(subs.map(\.holds) == [false, true])
        // A commit in a collection makes it held (a first write, or documents merged from a peer).
        #expect(try asked(held: [], committedLater: ["boats"]).map(\.holds) == [true, false])
    }

    @Test(arguments: [ReapedKeys.received, .notAsked, .wanted])
    func aSubscriptionWithACheckpointSaysItOnlyWhileItWantsThePeersReapedTombstones(reapedKeys: ReapedKeys) throws {
        let subs = try asked(
            held: ["cars"],
            checkpoints: [UTF8Key(spec.key): Checkpoint(epoch: Self.epochB, seq: 40, reapedKeys: reapedKeys)])
        let cars = try #require(subs.first { $0.spec == spec })
        #expect(cars.since == 40)
        #expect(cars.holds == (reapedKeys == .wanted))
    }

    @Test func theHintTravelsOnlyWhenSet() throws {
        for holds in [false, true] {
            let message = WireMessage.subscriptions(
                [WireSubscription(spec: spec, since: 0, hops: 0, holds: holds)], version: 1)
            let bytes = message.serialized()
            #expect(try WireMessage(serialized: bytes) == message)
            guard case .map(let map) = try CBOR.decode(bytes), case .array(let list)? = map["subs"],
                case .map(let entry)? = list.first
            else { return #expect(Bool(false), "not a subs map") }
            #expect(entry["h"] == (holds ? .int(1) : nil))
        }
        // With a `since` above 0 it asks for the tombstones reaped up to it, and travels too.
        let later = CBOR.encode(
            .map([
                "t": "subs", "v": 1, "subs": .array([.map(["c": "cars", "q": "true", "since": 5, "hops": 0, "h": 1])]),
            ]))
        guard case .subscriptions(let subs, _) = try WireMessage(serialized: later) else {
            return #expect(Bool(false), "not subs")
        }
        #expect(subs.map(\.holds) == [true])
        #expect(
            try WireMessage(serialized: WireMessage.subscriptions(subs, version: 1).serialized())
                == .subscriptions(subs, version: 1))
        // Anything but 0 or 1 is refused, naming the field.
        let bad = CBOR.encode(
            .map(["t": "subs", "v": 1, "subs": .array([.map(["c": "cars", "since": 0, "h": 2])])]))
        #expect(throws: WireError.self) { try WireMessage(serialized: bad) }
    }

    /// B's side: scans of A's subscription.
    func firstScan(holds: Bool, since: Int64 = 0, generation: UInt32 = 0, on r: inout Replicator) throws
        -> ScanRequest
    {
        let asked = r.received(
            .subscriptions(
                [WireSubscription(spec: spec, since: since, hops: 0, generation: generation, holds: holds)],
                version: UInt64(generation) + 1),
            on: link, now: 1)
        return try #require(ReplicatorTests.scans(asked).first)
    }

    func served() -> Replicator {
        var r = ReplicatorTests().replicator()
        _ = r.linkOpened(
            link, peerKey: Self.keyB, initiator: false, address: "b", endpoint: nil, checkpoints: [:], now: 0)
        _ = r.received(Self.hello(), on: link, now: 0)
        return r
    }

    @Test func aPeerThatHoldsRowsIsServedEveryReapedTombstoneFromTheStart() throws {
        var r = served()
        let scan = try firstScan(holds: true, on: &r)
        #expect(scan.after == 0)
        #expect(scan.reapedAfter == 0)
        // Later pages too.
        let next = r.scanned(link, scan, page: ScanPage(records: [], upTo: 10, exhausted: false, floor: 50), now: 2)
        #expect(ReplicatorTests.scans(next).first?.reapedAfter == 0)
    }

    @Test func aPeerThatHoldsNothingGetsOnlyThoseReapedFromItsFirstPageOn() throws {
        var r = served()
        let scan = try firstScan(holds: false, on: &r)
        #expect(scan.reapedAfter == nil)
        let next = r.scanned(link, scan, page: ScanPage(records: [], upTo: 10, exhausted: false, floor: 50), now: 2)
        #expect(ReplicatorTests.scans(next).first?.reapedAfter == 50)
    }

    @Test func aNewGenerationFromZeroFromAPeerThatHoldsRowsStartsOver() throws {
        var r = served()
        let scan = try firstScan(holds: false, on: &r)
        let next = r.scanned(link, scan, page: ScanPage(records: [], upTo: 10, exhausted: false, floor: 50), now: 2)
        let inFlight = try #require(ReplicatorTests.scans(next).first)
        // Asked again (after an eviction, say) while that page is read: the page is dropped and
        // the scan starts over from 0, with every reaped tombstone.
        let asked = r.received(
            .subscriptions([WireSubscription(spec: spec, since: 0, hops: 0, generation: 1, holds: true)], version: 2),
            on: link, now: 3)
        #expect(ReplicatorTests.scans(asked).isEmpty)
        let again = try #require(
            ReplicatorTests.scans(
                r.scanned(link, inFlight, page: ScanPage(records: [], upTo: 20, exhausted: false, floor: 50), now: 4)
            ).first)
        #expect(again.after == 0)
        #expect(again.reapedAfter == 0)
    }

    // MARK: Asked again, from a checkpoint, for the reaped tombstones

    /// B's side: A asks with `h` from its checkpoint at 40 (it asked from 0 holding nothing, and
    /// has since had documents from another peer). The tombstones B reaped up to 40 go first, in
    /// batches of their own whose `upTo` is 40, then the scan resumes from 40, and its end is a
    /// batch (`left: 0`) that A stores a checkpoint for, not a caught-up batch.
    @Test func aPeerAskingWithHFromACheckpointGetsTheReapedTombstonesUpToItFirst() throws {
        var r = served()
        let first = try firstScan(holds: true, since: 40, on: &r)
        #expect(first.reapedBacklog == ReapedBacklog(after: 0, through: 40))
        let reaped = ReplicatorTests.record(5, "gone")
        var out = r.scanned(link, first, page: ScanPage(records: [reaped], upTo: 5, exhausted: false), now: 2)
        guard case .batch(_, let documents, let upTo, _, let left)? = ReplicatorTests.sent(out).first else {
            return #expect(Bool(false), "no batch of reaped tombstones")
        }
        #expect(documents.map(\.id) == ["gone"])
        #expect(upTo == 40)
        #expect((left ?? 0) > 0)
        let second = try #require(ReplicatorTests.scans(out).first)
        #expect(second.reapedBacklog == ReapedBacklog(after: 5, through: 40))
        out = r.scanned(link, second, page: ScanPage(records: [], upTo: 40, exhausted: true), now: 3)
        #expect(ReplicatorTests.sent(out).isEmpty)
        let resumed = try #require(ReplicatorTests.scans(out).first)
        #expect(resumed.reapedBacklog == nil)
        #expect(resumed.after == 40)
        out = r.scanned(link, resumed, page: ScanPage(records: [], upTo: 40, exhausted: true, floor: 30), now: 4)
        guard case .batch(_, let none, let end, _, let endLeft)? = ReplicatorTests.sent(out).first else {
            return #expect(Bool(false), "the end is not a batch: \(ReplicatorTests.sent(out))")
        }
        #expect(none.isEmpty)
        #expect(end == 40)
        #expect(endLeft == 0)
    }

    /// A's side: A holds nothing of `cars` and asks B and C from 0 without `h`. Documents from B
    /// make it ask C again, under a new generation, with `h`; B is not asked again. A batch of C's
    /// from a checkpoint asked with `h` stores `wanted` until one ends the scan.
    @Test func documentsFromOnePeerMakeTheOthersAskedFromZeroWithoutHAskedAgain() throws {
        let c = LinkID(2)
        var r = ReplicatorTests().replicator()
        _ = try r.subscribe(spec, now: 0)
        for (link, key, address) in [(link, Self.keyB, "b"), (c, ReplicatorTests.keyC, "c")] {
            _ = r.linkOpened(
                link, peerKey: key, initiator: true, address: address, endpoint: nil, checkpoints: [:], now: 0)
            let sets = ReplicatorTests.sent(r.received(ReplicatorTests().hello(key), on: link, now: 0))
            guard
                case .subscriptions(let subs, _)? = sets.last(where: {
                    if case .subscriptions = $0 { true } else { false }
                })
            else {
                return #expect(Bool(false), "no set sent to \(address)")
            }
            #expect(subs.map(\.holds) == [false])
        }
        let fromB = r.received(
            .batch(
                subscription: .key(spec.key), documents: [WireDocument(collection: "cars", id: "x", state: [1])],
                upTo: 10, generation: 0, left: 0), on: link, now: 1)
        #expect(ReplicatorTests.applies(fromB).first?.reapedKeys == .notAsked)
        let again = r.applied(
            link, subscription: spec.key, upTo: 10, checkpointStored: true, reapedKeys: .notAsked, deferred: 0,
            broughtLive: true, now: 1)
        let sets = again.compactMap { directive -> (LinkID, [WireSubscription])? in
            if case .send(let to, .subscriptions(let subs, _)) = directive { (to, subs) } else { nil }
        }
        #expect(sets.map(\.0) == [c])
        #expect(sets.first?.1.map(\.holds) == [true])
        #expect(sets.first?.1.map(\.generation) == [1])
        // Live documents from C then make A's checkpoint on B (`notAsked`) `wanted`: B is asked
        // again with `h`, from that checkpoint.
        let fromC = r.applied(
            c, subscription: spec.key, upTo: 7, checkpointStored: true, reapedKeys: .received, deferred: 0,
            broughtLive: true, now: 2)
        let toB = fromC.compactMap { directive -> [WireSubscription]? in
            if case .send(self.link, .subscriptions(let subs, _)) = directive { subs } else { nil }
        }
        #expect(toB.first?.map(\.since) == [10])
        #expect(toB.first?.map(\.holds) == [true])
    }
}
