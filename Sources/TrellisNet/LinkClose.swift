import Synchronization

/// Why a link ended, by kind: what the node status counts (docs/SECURITY.md, "Channel").
///
/// The kinds separate an end both sides agreed on (``closedHere``, ``peerClosed``, both through
/// the authenticated close) from a connection that merely stopped (``unauthenticatedClose``: a
/// TCP FIN or RST anyone on the path can forge) and from traffic that was tampered with.
public enum LinkCloseReason: String, Sendable, CaseIterable, CustomStringConvertible {
    /// This node closed the link.
    case closedHere = "closed-here"
    /// The peer sent the authenticated close (an encrypted, empty transport message).
    case peerClosed = "peer-closed"
    /// The TCP connection ended (FIN or RST) without the authenticated close: the peer crashed
    /// or lost power, or someone on the path ended the connection.
    case unauthenticatedClose = "unauthenticated-close"
    /// A transport message failed authentication (a changed bit, forged or injected bytes).
    case tampered
    /// A transport message authenticates at an earlier nonce: a copy of a message already
    /// received.
    case replayed
    /// A transport message authenticates at a later nonce: messages arrived out of order, or one
    /// was dropped.
    case reordered
    /// The connection ended inside a frame (a frame was cut short).
    case truncated
    /// The peer broke the framing rules: a message over the size limit, a transport message
    /// shorter than its tag, a bad rekey marker.
    case malformed
    /// The connection failed: a socket error other than a reset, the 30 s user timeout, an
    /// exhausted nonce.
    case failed
    /// This node cut the link to stay within a resource limit: the link held the most of the
    /// node's inbound message bytes when they would have gone above the inbound buffer limit
    /// (``InboundBudget``).
    case overLimit = "over-limit"

    /// The kind as shown in status output (`tampered`, `peer-closed`).
    public var description: String { rawValue }
}

/// Counts of links closed, per ``LinkCloseReason``, for one node. Thread-safe.
public final class LinkCloseCounters: Sendable {
    private let counts = Mutex([Int](repeating: 0, count: LinkCloseReason.allCases.count))

    /// Counters at zero.
    public init() {}

    /// Counts one link that ended for `reason`.
    public func record(_ reason: LinkCloseReason) {
        let index = LinkCloseReason.allCases.firstIndex(of: reason)!
        counts.withLock { $0[index] += 1 }
    }

    /// Links closed so far for each reason that occurred (reasons never seen are absent).
    public var snapshot: [LinkCloseReason: Int] {
        let values = counts.withLock { $0 }
        var result: [LinkCloseReason: Int] = [:]
        for (reason, count) in zip(LinkCloseReason.allCases, values) where count > 0 { result[reason] = count }
        return result
    }
}
