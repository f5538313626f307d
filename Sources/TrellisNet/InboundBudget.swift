import Foundation

/// The bytes of inbound application messages one node holds at once, across all its links, and
/// which link gives way when they would go above the limit (docs/SECURITY.md, "Limits").
///
/// A link's reader counts every plaintext byte it adds to the message it is assembling
/// (``Account/grow(by:)``); the bytes stay counted while the message is assembled and, once
/// delivered, until the receiver is done with it (``Account/consumed(_:)``). Counting starts with
/// the bytes that arrive, not with the length a peer announces, so announcing 64 MiB costs nothing.
///
/// When a link's bytes would take the node's total above ``limit``, the link holding the most
/// bytes is closed, and its bytes leave the count at once (the memory follows as its reader
/// ends). That may be the link asking. A member that sends most of a large message and then
/// waits holds the most, so it is the one cut; links whose messages finish give their bytes back
/// and keep going. Without this, every session could hold an unfinished message of the largest
/// size (64 MiB), 4 GiB for 64 sessions.
///
/// Each link also waits, reading nothing more from its peer, while the messages it delivered and
/// the receiver has not processed hold ``perLinkQueued`` bytes or more (``Account/waitForRoom()``),
/// so one fast peer does not fill the node's share on its own.
///
/// Thread-safe. Every operation is O(1) except a cut, O(links).
public final class InboundBudget: @unchecked Sendable {
    /// Bytes of inbound messages the node holds at most, in all (default 256 MiB).
    public let limit: Int
    /// Bytes of delivered, unprocessed messages at or above which a link reads nothing more
    /// (8 MiB, as the outbound high-water mark).
    public let perLinkQueued: Int
    /// The default ``limit``: 256 MiB.
    public static let defaultLimit = 256 * 1024 * 1024

    private struct Holder {
        var bytes = 0
        var queued = 0
        var close: @Sendable (String) -> Void
    }

    // Guarded by `condition` (a lock that links waiting for room also wait on).
    private let condition = NSCondition()
    private var total = 0
    private var peak = 0
    private var holders: [Int: Holder] = [:]
    private var nextID = 0
    private var cutCount = 0

    /// - Parameters:
    ///   - limit: bytes held at most, in all; a message longer than this can never be received
    ///     (at least 1).
    ///   - perLinkQueued: bytes of delivered, unprocessed messages at which a link's reader waits
    ///     (at least 1).
    public init(limit: Int = defaultLimit, perLinkQueued: Int = LinkLimits.highWater) {
        precondition(limit >= 1 && perLinkQueued >= 1, "inbound budget limits must be positive")
        self.limit = limit
        self.perLinkQueued = perLinkQueued
    }

    /// Bytes counted now, in all links.
    public var heldBytes: Int { locked { total } }
    /// The most bytes counted at once since the budget was made.
    public var peakBytes: Int { locked { peak } }
    /// Links closed so far because the node's total would have gone above ``limit``.
    public var cuts: Int { locked { cutCount } }

    /// Opens the account of one link.
    ///
    /// - Parameter close: closes the link, with the reason in words, when another link's growth
    ///   cuts it (called outside the budget's lock, from that other link's reader thread).
    public func open(close: @escaping @Sendable (String) -> Void) -> Account {
        let id = locked {
            nextID += 1
            holders[nextID] = Holder(close: close)
            return nextID
        }
        return Account(budget: self, id: id)
    }

    private func locked<T>(_ body: () -> T) -> T {
        condition.lock()
        defer { condition.unlock() }
        return body()
    }

    /// One link's share of an ``InboundBudget``.
    public final class Account: Sendable {
        let budget: InboundBudget
        let id: Int

        init(budget: InboundBudget, id: Int) {
            self.budget = budget
            self.id = id
        }

        /// Counts `count` more bytes on this link (plaintext about to join the message being
        /// assembled).
        ///
        /// - Returns: `nil` when they fit (another link may have been cut to make room), or why
        ///   this link must close because it holds the most; its bytes are then no longer counted.
        ///   A closed or cut account accepts anything (its reader is ending).
        public func grow(by count: Int) -> String? {
            budget.grow(id, by: count)
        }

        /// Moves `count` bytes of a delivered message out of the count once the receiver is done
        /// with it (the message's length plus its 4-byte length prefix), and wakes this link's
        /// reader if it waits for room.
        public func consumed(_ count: Int) {
            budget.consumed(id, count)
        }

        /// Records that a whole message of `count` bytes (prefix included) left the assembler and
        /// waits for the receiver: it counts toward ``InboundBudget/perLinkQueued``.
        public func delivered(_ count: Int) {
            budget.delivered(id, count)
        }

        /// Blocks while this link's delivered, unprocessed messages hold
        /// ``InboundBudget/perLinkQueued`` bytes or more; returns at once once the account is closed.
        public func waitForRoom() {
            budget.waitForRoom(id)
        }

        /// Stops counting this link's bytes (the link ended) and wakes its reader if it waits.
        public func close() {
            budget.close(id)
        }
    }

    private func grow(_ id: Int, by count: Int) -> String? {
        var cut: [(close: @Sendable (String) -> Void, reason: String)] = []
        let result: String? = locked {
            guard holders[id] != nil else { return nil }
            holders[id]!.bytes += count
            total += count
            while total > limit {
                // The link holding the most; ties go to the one asking.
                var most = id
                for (other, holder) in holders where holder.bytes > holders[most]!.bytes { most = other }
                let holder = holders.removeValue(forKey: most)!
                total -= holder.bytes
                cutCount += 1
                let reason =
                    "the node's inbound messages would take more than \(limit) bytes (the inbound buffer "
                    + "limit) and this link held the most of them (\(holder.bytes) bytes); the link is closed"
                if most == id {
                    condition.broadcast()
                    return reason
                }
                cut.append((holder.close, reason))
            }
            peak = max(peak, total)
            return nil
        }
        for victim in cut { victim.close(victim.reason) }
        return result
    }

    private func delivered(_ id: Int, _ count: Int) {
        locked { holders[id]?.queued += count }
    }

    private func consumed(_ id: Int, _ count: Int) {
        locked {
            guard holders[id] != nil else { return }
            holders[id]!.bytes -= count
            holders[id]!.queued -= count
            total -= count
            condition.broadcast()
        }
    }

    private func waitForRoom(_ id: Int) {
        condition.lock()
        defer { condition.unlock() }
        while let holder = holders[id], holder.queued >= perLinkQueued { condition.wait() }
    }

    private func close(_ id: Int) {
        locked {
            guard let holder = holders.removeValue(forKey: id) else { return }
            total -= holder.bytes
            condition.broadcast()
        }
    }
}
