import Foundation
import Synchronization
import TrellisCore
import TrellisNet
import TrellisStore
import TrellisSync

// Fuzz checks for the sync path: the link framing and a sync session fed whatever a peer sends.

extension FuzzChecks {
    // MARK: Frames

    /// `FrameDecoder` (2-byte Noise frames) and `MessageAssembler` (4-byte application messages),
    /// docs/PROTOCOL.md §1. The first input byte chooses how the rest is cut into reads (as TCP
    /// may cut it); the messages out must not depend on the cut, the decoder holds at most one
    /// unfinished frame, and the assembler refuses a length above its limit at the same message
    /// whatever the cut.
    public static func frames(_ input: [UInt8]) throws(FuzzCheckFailure) {
        let fail = failing("FuzzFrames", input)
        guard let first = input.first else { return }
        let stream = Array(input.dropFirst())
        var cuts: [Int] = []
        var random = SplitMix64(seed: UInt64(first))
        var at = 0
        while at < stream.count {
            let step = first & 1 == 0 ? 1 + Int(random.next() % 7) : 1 + Int(random.next() % 300)
            at = min(stream.count, at + step)
            cuts.append(at)
        }

        // 2-byte frames: whole stream at once vs cut into reads.
        var whole: [[UInt8]] = []
        var decoder = FrameDecoder()
        decoder.feed(stream[...]) { whole.append($0) }
        var pieces: [[UInt8]] = []
        var cutDecoder = FrameDecoder()
        var start = 0
        for end in cuts {
            cutDecoder.feed(stream[start..<end]) { pieces.append($0) }
            guard cutDecoder.bufferedBytes <= 65_536 + 1 else {
                throw fail("FrameDecoder holds \(cutDecoder.bufferedBytes) bytes, more than one frame")
            }
            start = end
        }
        guard whole == pieces else {
            throw fail("FrameDecoder gave \(whole.count) frames at once but \(pieces.count) when cut")
        }
        guard decoder.bufferedBytes == cutDecoder.bufferedBytes else {
            throw fail("FrameDecoder keeps \(decoder.bufferedBytes) vs \(cutDecoder.bufferedBytes) bytes")
        }
        var consumed = 0
        for frame in whole { consumed += 2 + frame.count }
        guard consumed + decoder.bufferedBytes == stream.count else {
            throw fail(
                "FrameDecoder lost bytes: \(consumed) in frames + \(decoder.bufferedBytes) held of \(stream.count)")
        }

        // 4-byte messages with a small limit, so that both outcomes are reached.
        let limit = Int(first) * 64
        func assemble(_ reads: [ArraySlice<UInt8>]) -> (messages: [[UInt8]], error: FramingError?) {
            var assembler = MessageAssembler(limit: limit)
            var messages: [[UInt8]] = []
            for read in reads {
                do {
                    try assembler.append(Array(read)) { messages.append($0) }
                } catch {
                    return (messages, error)
                }
            }
            return (messages, nil)
        }
        var reads: [ArraySlice<UInt8>] = []
        start = 0
        for end in cuts {
            reads.append(stream[start..<end])
            start = end
        }
        let once = assemble([stream[...]])
        let cut = assemble(reads)
        guard once.messages == cut.messages, once.error == cut.error else {
            throw fail(
                "MessageAssembler gave \(once.messages.count) messages (\(String(describing: once.error))) at once but "
                    + "\(cut.messages.count) (\(String(describing: cut.error))) when cut")
        }
        for message in once.messages where message.count > limit {
            throw fail("MessageAssembler delivered \(message.count) bytes above its \(limit)-byte limit")
        }
    }

    // MARK: Sync session

    /// A sync session fed what a peer sends: a real ``DocumentStore`` (in memory, fixed clock and
    /// seed) behind a ``SyncHost`` and its ``Replicator``, one link from a fixed peer key.
    ///
    /// The input is a sequence of messages, each a 2-byte big-endian length and that many bytes
    /// (a short tail is one message); each is handed to the host as the link delivered it, then the
    /// host runs its scans and its clock moves 0.1 s. The first input byte's low bit sends a valid
    /// `hello` first, so that the fuzzer reaches the messages after it; its bit 2 makes that hello
    /// say `x: 1` and `es: 1` (compact names: numbered subscriptions, deltas), its bit 3 leaves
    /// out its key, its bit 4 makes it say `f: 3` (caught-up batches both ways, and `subs` digests
    /// and requests), and its bit 5 gives the link a channel number and sends, before anything
    /// else, an `r` the node cannot take (it never met the peer): the node answers `helloreq` and
    /// keeps what comes until a `hello` and a `subs`. Checks: nothing traps, and
    /// everything this node sends decodes as a ``WireMessage`` (never a malformed reply), no
    /// message follows the close of the link, and the store still answers queries.
    ///
    /// Every input starts from the same store: two documents in `items`, one of them removed, the
    /// clocks and random numbers at their start. The store is opened once and put back after each
    /// input (``DocumentStore/restoreSnapshot()``, which costs a few statements where opening costs
    /// the schema and every statement prepared again); the host is new for each input. An input's
    /// outcome never depends on the inputs before it, so a crash replays from its input alone.
    /// Calls are serialised (the store is shared).
    public static func session(_ input: [UInt8]) throws(FuzzCheckFailure) {
        _ = try sessionReplies(input)
    }

    /// Runs ``session(_:)``'s check on `input` and returns what the node sent to the peer, in
    /// order (nothing for an empty input): tests use it to show that an input's outcome does not
    /// depend on the inputs before it.
    ///
    /// - Throws: ``FuzzCheckFailure`` as ``session(_:)`` does.
    public static func sessionReplies(_ input: [UInt8]) throws(FuzzCheckFailure) -> [[UInt8]] {
        let fail = failing("FuzzSession", input)
        guard let flags = input.first else { return [] }
        return try sessionStore.withLock { (kept: inout SessionStore?) throws(FuzzCheckFailure) -> [[UInt8]] in
            guard let fixture = kept ?? SessionStore() else { throw fail("an in-memory store does not open") }
            // Kept again only once it is back at its start.
            kept = nil
            fixture.clock.restart()
            fixture.random.restart()
            let replies = try session(input, flags: flags, store: fixture.store, clock: fixture.clock, fail)
            // The store's events (none observed) are freed on its queue: let that finish within
            // the input, not while the next one runs.
            fixture.store.waitForObservers()
            if (try? fixture.store.restoreSnapshot()) != nil {
                kept = fixture
            } else {
                fixture.store.close()
            }
            return replies
        }
    }

    /// The store every ``session(_:)`` input starts from: opened by the first, opened again only
    /// when putting it back fails.
    private static let sessionStore = Mutex<SessionStore?>(nil)

    private static func session(
        _ input: [UInt8], flags: UInt8, store: DocumentStore, clock: FuzzClock,
        _ fail: (String) -> FuzzCheckFailure
    ) throws(FuzzCheckFailure) -> [[UInt8]] {
        let transport = FuzzTransport()
        let peerKey = [UInt8](repeating: 9, count: 32)
        guard
            let host = try? SyncHost(
                configuration: ReplicatorConfiguration(peerKey: [UInt8](repeating: 1, count: 32)), store: store,
                transport: transport, seed: 1, now: { clock.monotonic }, log: { _ in })
        else { throw fail("the host does not start") }
        try? host.subscribe(SubscriptionSpec(collection: "items"))
        try? host.subscribe(SubscriptionSpec(collection: "notes", query: "n > 0"))
        let link = LinkID(1)
        host.linkOpened(
            link, peerKey: peerKey, initiator: flags & 2 != 0, address: "fuzz", endpoint: nil,
            channelNonce: flags & 32 != 0 ? 0xC0FF_EE00 : nil)
        if flags & 32 != 0 {
            host.received(WireMessage.resume(StateDigest([UInt8](repeating: 7, count: 16))).serialized(), on: link)
        }
        if flags & 1 == 1 {
            let hello = WireMessage.hello(
                Hello(
                    version: WireMessage.protocolVersion, peerKey: flags & 8 != 0 ? [] : peerKey, site: 0x5EED,
                    epoch: [UInt8](repeating: 4, count: 16), nonce: 3, earlySubscriptions: flags & 4 != 0,
                    compactNames: flags & 4 != 0, caughtUpBatches: flags & 16 != 0,
                    resumesSubscriptions: flags & 16 != 0))
            host.received(hello.serialized(), on: link)
        }
        var index = 1
        while index < input.count {
            var length = input.count - index
            if input.count - index >= 2 {
                length = min(Int(input[index]) << 8 | Int(input[index + 1]), input.count - index - 2)
                index += 2
            }
            host.received(Array(input[index..<(index + length)]), on: link)
            index += length
            if transport.closedAfter != nil {
                host.linkClosed(link, reason: "closed by this node")
                break
            }
            host.runScans()
            clock.advance(100)
            host.tick()
        }
        host.runScans()
        clock.advance(60_000)
        host.tick()
        host.runScans()
        for (n, message) in transport.sent.enumerated() {
            guard (try? WireMessage(serialized: message)) != nil else {
                throw fail("message \(n) sent to the peer does not decode: \(hex(message))")
            }
        }
        if let closedAt = transport.closedAfter, transport.sent.count > closedAt {
            throw fail("\(transport.sent.count - closedAt) messages sent after the link was closed")
        }
        guard (try? store.count(in: "items")) != nil else { throw fail("the store no longer answers") }
        host.stop()
        return transport.sent
    }
}

/// The in-memory store a fuzzed session starts from, with its clock and random numbers.
private final class SessionStore: Sendable {
    let clock = FuzzClock()
    let random = FuzzRandom()
    let store: DocumentStore

    /// Opens the store with two documents in `items`, one removed, and saves its snapshot; `nil`
    /// when that fails.
    init?() {
        var options = StoreOptions()
        options.now = { [clock] in clock.wall }
        options.elapsed = options.now
        options.random = { [random] in random.next() }
        options.log = { _ in }
        options.durability = .normal
        guard let store = try? DocumentStore(path: ":memory:", options: options) else { return nil }
        _ = try? store.upsert([["_id": "a", "n": 1], ["_id": "b", "tags": ["x"]]], in: "items")
        _ = try? store.remove(id: "b", in: "items")
        guard (try? store.saveSnapshot()) != nil else { return nil }
        random.mark()
        self.store = store
    }
}

/// The fuzzed session's clocks: wall time for the store, monotonic for the replicator.
private final class FuzzClock: @unchecked Sendable {
    private(set) var monotonic: Millis = 1_000
    var wall: UInt64 { 1_800_000_000_000 + UInt64(monotonic) }
    func advance(_ ms: Millis) { monotonic += ms }
    /// Back to the time the store was opened at, for the next input.
    func restart() { monotonic = 1_000 }
}

/// A fixed sequence of random numbers for the fuzzed store.
private final class FuzzRandom: @unchecked Sendable {
    private var generator = SplitMix64(seed: 42)
    private var marked = SplitMix64(seed: 42)
    func next() -> UInt64 { generator.next() }
    /// Remembers the sequence's position, for ``restart()``.
    func mark() { marked = generator }
    /// Back to the position of the last ``mark()``.
    func restart() { generator = marked }
}

/// Records what the host sends and whether it closed the link.
private final class FuzzTransport: SyncTransport {
    var sent: [[UInt8]] = []
    var closedAfter: Int?

    func send(_ bytes: [UInt8], on link: LinkID) -> Bool {
        sent.append(bytes)
        return false
    }

    func close(_ link: LinkID, reason: String) {
        if closedAfter == nil { closedAfter = sent.count }
    }

    func dial(_ endpoint: String) {}
}
