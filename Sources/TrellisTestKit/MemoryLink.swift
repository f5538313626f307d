import Dispatch
import Synchronization
public import TrellisNet

/// An in-memory ``MessageLink``: two ends that deliver each other's messages in order on a
/// private queue. For tests that run sync engines in one process without sockets.
public final class MemoryLink: MessageLink {
    public let remotePeerKey: [UInt8]
    public let isInitiator: Bool
    public let remoteAddress: String
    private let queue: DispatchQueue
    private struct State {
        var peer: MemoryLink?
        var onMessage: (@Sendable ([UInt8]) -> Void)?
        var onClose: (@Sendable (String) -> Void)?
        var pending: [[UInt8]] = []
        var closed = false
    }
    private let state = Mutex(State())

    private init(remoteKey: [UInt8], initiator: Bool, name: String) {
        remotePeerKey = remoteKey
        isInitiator = initiator
        remoteAddress = "memory:\(name)"
        queue = DispatchQueue(label: "trellis.memory-link.\(name)")
    }

    /// Two connected ends: the first is held by the node with `initiatorKey` and dials.
    public static func pair(initiatorKey: [UInt8], responderKey: [UInt8]) -> (MemoryLink, MemoryLink) {
        let a = MemoryLink(remoteKey: responderKey, initiator: true, name: "to-responder")
        let b = MemoryLink(remoteKey: initiatorKey, initiator: false, name: "to-initiator")
        a.state.withLock { $0.peer = b }
        b.state.withLock { $0.peer = a }
        return (a, b)
    }

    public var queuedBytes: Int { 0 }

    public func start(
        onMessage: @escaping @Sendable ([UInt8]) -> Void, onDrain: @escaping @Sendable () -> Void,
        onClose: @escaping @Sendable (String) -> Void
    ) {
        let pending = state.withLock { s -> [[UInt8]] in
            s.onMessage = onMessage
            s.onClose = onClose
            defer { s.pending = [] }
            return s.pending
        }
        for message in pending { deliver(message) }
    }

    private func deliver(_ message: [UInt8]) {
        queue.async { [self] in
            let handler = state.withLock { s -> (@Sendable ([UInt8]) -> Void)? in
                guard !s.closed else { return nil }
                guard let h = s.onMessage else {
                    s.pending.append(message)
                    return nil
                }
                return h
            }
            handler?(message)
        }
    }

    @discardableResult
    public func send(_ message: [UInt8]) throws -> Int {
        let peer = state.withLock { s -> MemoryLink? in s.closed ? nil : s.peer }
        guard let peer else { throw LinkError.closed }
        peer.deliver(message)
        return 0
    }

    public func close() {
        let (peer, handler) = state.withLock { s -> (MemoryLink?, (@Sendable (String) -> Void)?) in
            guard !s.closed else { return (nil, nil) }
            s.closed = true
            defer {
                s.onClose = nil
                s.peer = nil
            }
            return (s.peer, s.onClose)
        }
        if let handler { queue.async { handler("closed") } }
        peer?.close()
    }
}
