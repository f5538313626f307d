import Testing
import TrellisCore

/// Attempts to break taking the messages kept before an asked hello one at a time
/// (``ReplicatorDirective/takeHeld(_:)``, docs/PROTOCOL.md §2 step 1). Driven through
/// `ResumedSessionBreakTests.Duo`, whose FIFO lets messages arrive between two `takeHeld`s (a
/// host that carries out directives as a queue, not depth first as `SyncHost` does).
@Suite struct TakeHeldBreakTests {
    typealias Duo = ResumedSessionBreakTests.Duo
    static let cars = SubscriptionDigestTests.spec

    /// A reconnect where one side cannot take the other's `r` (`mismatch`), run until a
    /// `takeHeld` waits in the queue: that node is taking what it kept before the asked hello.
    static func untilTakingHeld(mismatch: String) throws -> (Duo, String, LinkID)? {
        let pair = try SubscriptionDigestTests.Pair.metBefore(channelNonce: 1)
        var duo = Duo(pair: pair)
        let (ca, cb) = ResumedSessionBreakTests.checkpoints(mismatch: mismatch)
        duo.open(LinkID(2), dialer: "a", nonce: 2, checkpointsA: ca, checkpointsB: cb)
        for _ in 0..<10_000 where !duo.queue.isEmpty {
            if let (node, directive) = duo.queue.first(where: {
                if case .takeHeld = $0.1 { true } else { false }
            }), case .takeHeld(let link) = directive {
                return (duo, node, link)
            }
            duo.run(limit: 1)
        }
        return nil
    }

    static func closes(_ directives: [ReplicatorDirective]) -> Bool {
        directives.contains {
            if case .close = $0 { return true }
            if case .send(_, .error) = $0 { return true }
            return false
        }
    }

    /// Promised (PROTOCOL.md §2 step 1): "It keeps at most 4,096 such messages and 256 MiB of
    /// document states, and closes the session (`error {code: "protocol"}`) beyond." Messages that
    /// arrive while the kept ones are being taken are kept too ("whatever arrives meanwhile waits
    /// behind them"). Here 20 batches of 16 MiB of states (one shared buffer: little memory) arrive
    /// then.
    ///
    /// Failed on the first version of the change: all 320 MiB were kept, only the count being
    /// checked while taking (the bytes were set to 0 when the taking began). Now the bytes of what
    /// is kept and appended are counted until the last is taken. `SyncHost` takes every kept
    /// message before it reads the next one, so it was not exposed; a host carrying out
    /// directives as a queue was.
    @Test func theByteBoundHoldsWhileKeptMessagesAreTaken() throws {
        var found: (Duo, String, LinkID)?
        for mismatch in ["a", "b", "both"] where found == nil { found = try Self.untilTakingHeld(mismatch: mismatch) }
        var (duo, node, link) = try #require(found, "no reconnect kept a message before the asked hello")
        let state = [UInt8](repeating: 7, count: 16 << 20)
        var closed = false
        for i in 0..<20 where !closed {
            let batch = WireMessage.batch(
                subscription: .key(Self.cars.key),
                documents: [WireDocument(collection: "cars", id: .string("d\(i)"), state: state)],
                upTo: Int64(1_000 + i), generation: 0)
            let directives =
                node == "a"
                ? duo.a.received(batch, on: link, now: duo.now) : duo.b.received(batch, on: link, now: duo.now)
            closed = Self.closes(directives)
        }
        #expect(closed, "320 MiB of states kept on \(node) while it took what it held before the hello")
    }

    /// A `ping` arriving while the kept messages are taken is answered after them, and the
    /// session then syncs as usual: nothing is frozen behind `takingHeld`. Passes.
    @Test(arguments: ["a", "b", "both"]) func aMessageArrivingWhileKeptOnesAreTakenIsTakenAfterThem(
        mismatch: String
    ) throws {
        guard var (duo, node, link) = try Self.untilTakingHeld(mismatch: mismatch) else { return }
        let directives =
            node == "a"
            ? duo.a.received(.ping(77), on: link, now: duo.now) : duo.b.received(.ping(77), on: link, now: duo.now)
        #expect(directives.isEmpty, "kept behind the ones being taken")
        duo.log = []
        duo.run()
        duo.tick(times: 5, by: 1_000)
        let pongs = duo.log.filter {
            if case .pong(77) = $0.message { $0.from == node } else { false }
        }
        #expect(pongs.count == 1, "\(node) answered the ping \(pongs.count) times")
        ResumedSessionBreakTests.expectOneAgreedLinkServingCars(duo, mismatch: mismatch)
    }

    /// An `error` arriving while the kept messages are taken closes the session once its turn
    /// comes; the remaining `takeHeld` then does nothing. Passes.
    @Test func anErrorArrivingWhileKeptOnesAreTakenClosesTheSession() throws {
        var found: (Duo, String, LinkID)?
        for mismatch in ["a", "b", "both"] where found == nil { found = try Self.untilTakingHeld(mismatch: mismatch) }
        var (duo, node, link) = try #require(found)
        _ =
            node == "a"
            ? duo.a.received(.error(code: "x", message: "bye"), on: link, now: duo.now)
            : duo.b.received(.error(code: "x", message: "bye"), on: link, now: duo.now)
        duo.run()
        let phases = duo.phases(node == "a" ? duo.a : duo.b)
        #expect(phases[link] == nil || phases[link] == "closed", "\(phases)")
    }
}
