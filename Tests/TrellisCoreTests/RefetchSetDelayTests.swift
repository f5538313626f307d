import Testing
import TrellisCore

/// The bound on how long answered refetch subscriptions stay asked (docs/PROTOCOL.md §2, the
/// refetch paragraph of step 3): the set goes again once no refetch subscription asked of a peer
/// waits for its answer, or one second after the first answer, whichever comes first. Driven
/// message by message against a peer that answers one refetch subscription and never the other
/// (an older build, a lost answer): the answered one must not stay asked for good.
@Suite struct RefetchSetDelayTests {
    let link = LinkID(1)
    let spec = SubscriptionSpec(collection: "cars")

    /// The subscription sets among `messages`, in order.
    static func sets(_ messages: [WireMessage]) -> [[WireSubscription]] {
        messages.compactMap { if case .subscriptions(let list, _) = $0 { list } else { nil } }
    }

    /// A tick at `now` on a link that heard from its peer just before (a keepalive, so no
    /// liveness timeout acts); the messages it sends.
    func tick(_ r: inout Replicator, at now: Millis) -> [WireMessage] {
        _ = r.received(.ping(1), on: link, now: now - 1)
        return ReplicatorTests.sent(r.tick(now: now))
    }

    /// A, subscribed to `cars`, established with B (whose `hello` says it sends caught-up
    /// batches and reads compact names), evicts 300 documents: the set it sends asks B for two
    /// refetch subscriptions (256 and 44 `_id`s). A and the set.
    func evictedThreeHundred() throws -> (Replicator, [WireSubscription]) {
        var r = try CaughtUpBatchTests().established(caughtUp: true)
        let sent = ReplicatorTests.sent(r.refetch("cars", ids: (0..<300).map { .string("d\($0)") }, now: 10))
        let set = try #require(Self.sets(sent).last)
        #expect(set.compactMap { Refetch.ids(of: $0.spec)?.count } == [256, 44], "\(set.map(\.spec))")
        #expect(set.contains { $0.spec == spec })
        return (r, set)
    }

    /// The refetch subscription of `set` whose list has `count` `_id`s, and its number.
    static func refetch(_ set: [WireSubscription], listing count: Int) throws -> (WireSubscription, UInt32) {
        let entry = try #require(set.first { Refetch.ids(of: $0.spec)?.count == count })
        return (entry, try #require(entry.number))
    }

    @Test func answeredRefetchesStayAskedAtMostOneSecondWhileAnotherWaits() throws {
        var (r, set) = try evictedThreeHundred()
        let (first, firstNumber) = try Self.refetch(set, listing: 256)
        // B answers the first to its end at 100; the second still waits, so the set stays.
        let answered = r.received(
            .caughtUp(subscription: .number(firstNumber), generation: first.generation), on: link, now: 100)
        #expect(Self.sets(ReplicatorTests.sent(answered)).isEmpty)
        #expect(Self.sets(tick(&r, at: 600)).isEmpty)
        #expect(Self.sets(tick(&r, at: 1_099)).isEmpty)
        // One second after the answer the set goes without the answered one, the other still
        // asked beside the base subscription.
        let due = try #require(Self.sets(tick(&r, at: 1_100)).last)
        #expect(!due.contains { $0.spec == first.spec }, "\(due.map(\.spec))")
        #expect(due.compactMap { Refetch.ids(of: $0.spec)?.count } == [44])
        #expect(due.contains { $0.spec == spec })
        // Nothing more goes on later ticks.
        #expect(Self.sets(tick(&r, at: 5_000)).isEmpty)
        // The second, answered at last, goes at once: nothing else waits.
        let (second, secondNumber) = try Self.refetch(due, listing: 44)
        let last = ReplicatorTests.sent(
            r.received(
                .caughtUp(subscription: .number(secondNumber), generation: second.generation), on: link, now: 5_100))
        let final = try #require(Self.sets(last).last)
        #expect(final.map(\.spec) == [spec])
    }

    /// Control: both answered within the second, the set goes once, at the second answer, and
    /// the tick sends nothing after.
    @Test func bothAnsweredTheSetGoesAtTheSecondAnswer() throws {
        var (r, set) = try evictedThreeHundred()
        let (first, firstNumber) = try Self.refetch(set, listing: 256)
        let (second, secondNumber) = try Self.refetch(set, listing: 44)
        let answered = r.received(
            .caughtUp(subscription: .number(firstNumber), generation: first.generation), on: link, now: 100)
        #expect(Self.sets(ReplicatorTests.sent(answered)).isEmpty)
        let both = ReplicatorTests.sent(
            r.received(
                .caughtUp(subscription: .number(secondNumber), generation: second.generation), on: link, now: 400))
        #expect(Self.sets(both).map { $0.map(\.spec) } == [[spec]])
        #expect(Self.sets(tick(&r, at: 1_100)).isEmpty)
        #expect(Self.sets(tick(&r, at: 3_000)).isEmpty)
    }
}
