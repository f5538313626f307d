import Dispatch
import Synchronization
public import TrellisNet

/// An in-memory ``MessageLink``: two ends that deliver each other's messages in order. For tests
/// that run sync engines in one process without sockets.
///
/// It behaves like ``SecureLink`` where the engine can tell: ``send(_:)`` queues and returns the
/// bytes queued; each end has its own serial delivery queue (its "reader thread") that runs
/// `onMessage` one message at a time, and a message leaves the sender's queue when it is handed to
/// the receiver; `onDrain` and `onClose` follow the ``MessageLink`` rules. ``stopReading()`` makes
/// an end stop taking messages, as a peer that stops reading its socket would, so the other end's
/// ``queuedBytes`` grows; ``resumeReading()`` lets it catch up (and `onDrain` fires on the other
/// end once its queue falls to ``lowWater``).
///
/// Closing: `close()` on one end runs that end's `onClose` ("closed by this node") once its
/// current `onMessage` returns, and stops its delivery. The other end can send no more; it
/// receives what was already queued for it, then its `onClose` runs ("peer closed the
/// connection"). If that end had stopped reading, what was queued for it is dropped, as a socket
/// shut down under a stuck writer drops it, and its `onClose` runs when it resumes reading.
public final class MemoryLink: MessageLink {
    public let remotePeerKey: [UInt8]
    public let isInitiator: Bool
    public let remoteAddress: String
    /// A random number shared by the two ends of a pair, as a secure channel's handshake hash is.
    public var channelNonce: UInt64? { pair.nonce }
    public let highWater: Int
    public let lowWater: Int
    private let pair: Pair
    private let side: Int

    private struct End {
        /// Messages this end sent that the other end has not taken yet; `head` is the next one.
        var outbound: [[UInt8]] = []
        var head = 0
        var queued = 0
        var drainArmed = false
        var started = false
        /// No more sends: this end closed, or its peer did.
        var closed = false
        /// This end called `close()`: its inbound is dropped and its `onClose` does not wait.
        var closedHere = false
        var readingStopped = false
        /// A delivery pump for this end is scheduled or running on its queue.
        var pumping = false
        /// Set once this end's `onClose` is due; delivered after its inbound (unless `closedHere`).
        var closeReason: String?
        var closeDelivered = false
        var onMessage: (@Sendable ([UInt8]) -> Void)?
        var onDrain: (@Sendable () -> Void)?
        var onClose: (@Sendable (String) -> Void)?

        var hasOutbound: Bool { head < outbound.count }

        mutating func popOutbound() -> [UInt8] {
            let message = outbound[head]
            outbound[head] = []
            head += 1
            if head == outbound.count {
                outbound.removeAll(keepingCapacity: true)
                head = 0
            } else if head >= 1024 && head * 2 >= outbound.count {
                outbound.removeFirst(head)
                head = 0
            }
            queued -= 4 + message.count
            return message
        }

        mutating func dropOutbound() {
            outbound = []
            head = 0
            queued = 0
            drainArmed = false
        }
    }

    private final class Pair: Sendable {
        let ends = Mutex([End(), End()])
        let queues: [DispatchQueue]
        let limits: [(high: Int, low: Int)]
        let nonce = UInt64.random(in: .min ... .max)

        init(names: [String], limits: [(high: Int, low: Int)]) {
            queues = names.map { DispatchQueue(label: "trellis.memory-link.\($0)") }
            self.limits = limits
        }

        /// Schedules delivery to end `r` if it can take something. Call with the lock held.
        func schedulePump(_ r: Int, _ ends: inout [End]) {
            let due = ends[1 - r].hasOutbound || ends[r].closeReason != nil
            guard ends[r].started, !ends[r].pumping, !ends[r].closeDelivered, due,
                !ends[r].readingStopped || ends[r].closedHere
            else { return }
            ends[r].pumping = true
            queues[r].async { self.pump(r) }
        }

        /// Delivers to end `r`, one message at a time, then its `onClose` when due.
        func pump(_ r: Int) {
            let s = 1 - r
            enum Step {
                case message(@Sendable ([UInt8]) -> Void, [UInt8])
                case close(@Sendable (String) -> Void, String)
                case stop
            }
            while true {
                let step = ends.withLock { ends -> Step in
                    if ends[r].closedHere || !ends[r].readingStopped, !ends[r].closeDelivered {
                        if !ends[r].closedHere, ends[s].hasOutbound, let onMessage = ends[r].onMessage {
                            let message = ends[s].popOutbound()
                            if ends[s].drainArmed, ends[s].queued <= limits[s].low, !ends[s].closed {
                                ends[s].drainArmed = false
                                queues[s].async { self.drain(s) }
                            }
                            return .message(onMessage, message)
                        }
                        if let reason = ends[r].closeReason, let onClose = ends[r].onClose {
                            ends[r].closeDelivered = true
                            ends[r].onMessage = nil
                            ends[r].onDrain = nil
                            ends[r].onClose = nil
                            return .close(onClose, reason)
                        }
                    }
                    ends[r].pumping = false
                    return .stop
                }
                switch step {
                case .message(let onMessage, let message): onMessage(message)
                case .close(let onClose, let reason):
                    onClose(reason)
                    return
                case .stop: return
                }
            }
        }

        /// Runs end `s`'s `onDrain` on its queue, unless it has closed meanwhile.
        func drain(_ s: Int) {
            let handler = ends.withLock { ends in ends[s].closeDelivered || ends[s].closed ? nil : ends[s].onDrain }
            handler?()
        }
    }

    private init(pair: Pair, side: Int, remoteKey: [UInt8], name: String) {
        self.pair = pair
        self.side = side
        remotePeerKey = remoteKey
        isInitiator = side == 0
        remoteAddress = "memory:\(name)"
        highWater = pair.limits[side].high
        lowWater = pair.limits[side].low
    }

    /// Two connected ends: the first is held by the node with `initiatorKey` and dials.
    ///
    /// - Parameters:
    ///   - initiatorKey: the dialing node's peer key (the second end's ``remotePeerKey``).
    ///   - responderKey: the other node's peer key (the first end's ``remotePeerKey``).
    ///   - highWater: both ends' ``highWater``, bytes (default ``LinkLimits/highWater``).
    ///   - lowWater: both ends' ``lowWater``, bytes, below `highWater` (default
    ///     ``LinkLimits/lowWater``).
    public static func pair(
        initiatorKey: [UInt8], responderKey: [UInt8], highWater: Int = LinkLimits.highWater,
        lowWater: Int = LinkLimits.lowWater
    ) -> (MemoryLink, MemoryLink) {
        precondition(0 <= lowWater && lowWater < highWater, "MemoryLink needs 0 <= lowWater < highWater")
        let names = ["to-responder", "to-initiator"]
        let pair = Pair(names: names, limits: [(highWater, lowWater), (highWater, lowWater)])
        let a = MemoryLink(pair: pair, side: 0, remoteKey: responderKey, name: names[0])
        let b = MemoryLink(pair: pair, side: 1, remoteKey: initiatorKey, name: names[1])
        return (a, b)
    }

    public func start(
        onMessage: @escaping @Sendable ([UInt8]) -> Void,
        onDrain: @escaping @Sendable () -> Void,
        onClose: @escaping @Sendable (String) -> Void
    ) {
        pair.ends.withLock { ends in
            guard !ends[side].started else { return }
            ends[side].started = true
            ends[side].onMessage = onMessage
            ends[side].onDrain = onDrain
            ends[side].onClose = onClose
            pair.schedulePump(side, &ends)
        }
    }

    @discardableResult
    public func send(_ message: [UInt8]) throws -> Int {
        guard message.count <= LinkLimits.maxMessageBytes else { throw LinkError.messageTooLarge(message.count) }
        return try pair.ends.withLock { ends throws(LinkError) in
            guard !ends[side].closed else { throw LinkError.closed }
            ends[side].outbound.append(message)
            ends[side].queued += 4 + message.count
            if ends[side].queued >= highWater { ends[side].drainArmed = true }
            pair.schedulePump(1 - side, &ends)
            return ends[side].queued
        }
    }

    public var queuedBytes: Int { pair.ends.withLock { $0[side].queued } }

    public func close() {
        pair.ends.withLock { ends in
            let peer = 1 - side
            guard !ends[side].closedHere else { return }
            ends[side].closedHere = true
            ends[side].closed = true
            ends[side].drainArmed = false
            if ends[side].closeReason == nil { ends[side].closeReason = "closed by this node" }
            ends[peer].dropOutbound()  // this end reads nothing more
            if ends[peer].readingStopped { ends[side].dropOutbound() }
            ends[peer].closed = true
            ends[peer].drainArmed = false
            if ends[peer].closeReason == nil { ends[peer].closeReason = "peer closed the connection" }
            pair.schedulePump(side, &ends)
            pair.schedulePump(peer, &ends)
        }
    }

    /// Stops delivering to this end, as a peer that stops reading its socket: the other end's
    /// ``queuedBytes`` grows with every send.
    public func stopReading() {
        pair.ends.withLock { $0[side].readingStopped = true }
    }

    /// Resumes delivery to this end after ``stopReading()``.
    public func resumeReading() {
        pair.ends.withLock { ends in
            ends[side].readingStopped = false
            pair.schedulePump(side, &ends)
        }
    }
}
