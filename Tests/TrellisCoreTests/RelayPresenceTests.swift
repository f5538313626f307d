import Testing
import TrellisCore

/// Which of a neighbour's subscriptions a node relays, by the neighbour's own presence record
/// (docs/MESH.md, "Relay"), driven message by message: this node (A) has sessions with B (link 1)
/// and C (link 2); C subscribes to `x`.
@Suite struct RelayPresenceTests {
    let b = LinkID(1)
    let c = LinkID(2)
    static let keyB = ReplicatorTests.keyB
    static let keyC = ReplicatorTests.keyC

    /// The collections of the last subscription set sent to B among `directives`, or `nil`.
    func askedOfB(_ directives: [ReplicatorDirective]) -> [String]? {
        var last: [String]?
        for case .send(let link, .subscriptions(let list, _)) in directives where link == b {
            last = list.map(\.spec.collection)
        }
        return last
    }

    static func record(_ key: [UInt8], seq: UInt64, neighbors: [[UInt8]]) -> WireMessage {
        .presence([PresenceRecord(peerKey: key, version: WireMessage.protocolVersion, seq: seq, neighbors: neighbors)])
    }

    /// A with B and C established, C's subscription to `x` received at 10 (no record from C yet).
    func meshed() -> (Replicator, [ReplicatorDirective]) {
        var r = ReplicatorTests().established()
        _ = r.linkOpened(c, peerKey: Self.keyC, initiator: false, address: "c", endpoint: nil, checkpoints: [:], now: 0)
        _ = r.received(ReplicatorTests().hello(Self.keyC), on: c, now: 0)
        let subs = r.received(.subscriptions([WireSubscription(spec: .all("x"), since: 0, hops: 0)]), on: c, now: 10)
        return (r, subs)
    }

    @Test func onlyTheNeighboursOwnRecordOnItsOwnLinkCounts() {
        var (r, subs) = meshed()
        // Before C's record: not relayed yet (the grace).
        #expect(askedOfB(subs) == nil)
        // A record about C forwarded by B, saying C meets B: not C's word, changes nothing.
        let forged = r.received(Self.record(Self.keyC, seq: 5, neighbors: [Self.keyB]), on: b, now: 20)
        #expect(askedOfB(forged) == nil)
        // C's own record: no session with B, so B is asked for x on C's behalf.
        let own = r.received(Self.record(Self.keyC, seq: 1, neighbors: []), on: c, now: 30)
        #expect(askedOfB(own) == ["x"])
        // C now meets B: A takes the relay back.
        let meets = r.received(Self.record(Self.keyC, seq: 2, neighbors: [Self.keyB]), on: c, now: 40)
        #expect(askedOfB(meets) == [])
        // An older record of C's changes nothing; a newer one without B relays again.
        #expect(askedOfB(r.received(Self.record(Self.keyC, seq: 1, neighbors: []), on: c, now: 50)) == nil)
        #expect(askedOfB(r.received(Self.record(Self.keyC, seq: 3, neighbors: []), on: c, now: 60)) == ["x"])
    }

    @Test func aNeighbourThatSendsNoRecordIsRelayedForAfterTheGrace() {
        var (r, _) = meshed()
        func tick(_ now: Millis) -> [ReplicatorDirective] {
            _ = r.received(.ping(1), on: b, now: now - 1)
            _ = r.received(.ping(1), on: c, now: now - 1)
            return r.tick(now: now)
        }
        #expect(askedOfB(tick(1_999)) == nil)
        #expect(askedOfB(tick(2_000)) == ["x"])
        #expect(askedOfB(tick(3_000)) == nil)
    }
}
