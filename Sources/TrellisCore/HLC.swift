/// A hybrid logical clock timestamp: 48-bit physical milliseconds and a 16-bit logical counter,
/// packed into one `UInt64` so that numeric order is timestamp order.
///
/// After Kulkarni et al., "Logical Physical Clocks and Consistent Snapshots in Globally
/// Distributed Databases" (2014), Algorithm 2, simplified: a receive adopts the later of the two
/// stamps without ticking (``HybridLogicalClock/receive(_:physicalMillis:)``), and the next local
/// stamp (``HybridLogicalClock/now(physicalMillis:)``) orders after it; a full logical counter
/// carries into the milliseconds.
public struct HLCTimestamp: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// `millis << 16 | logical`.
    public var rawValue: UInt64

    public init(rawValue: UInt64) { self.rawValue = rawValue }

    public init(millis: UInt64, logical: UInt16) {
        rawValue = (millis & 0xFFFF_FFFF_FFFF) << 16 | UInt64(logical)
    }

    /// Physical component, milliseconds since the Unix epoch.
    public var millis: UInt64 { rawValue >> 16 }
    /// Logical counter within one millisecond.
    public var logical: UInt16 { UInt16(truncatingIfNeeded: rawValue) }

    public static let zero = HLCTimestamp(rawValue: 0)
    /// The largest physical component a timestamp holds: 2^48 − 1 ms (the year 10889).
    public static let maxMillis: UInt64 = 0xFFFF_FFFF_FFFF

    public static func < (lhs: HLCTimestamp, rhs: HLCTimestamp) -> Bool { lhs.rawValue < rhs.rawValue }

    public var description: String { "\(millis).\(logical)" }
}

/// The state machine of a hybrid logical clock. Reads no clock: the caller passes physical time.
///
/// Rule for remote stamps far in the future: a stamp more than ``maxForwardDrift`` milliseconds
/// ahead of local physical time is *not* adopted (the clock would otherwise be dragged forward for
/// every later write); ``receive(_:physicalMillis:)`` returns `false`. The store goes further: it
/// does not apply a document whose latest stamp is that far ahead but defers it (keeps it and
/// retries it), measuring the drift from the later of its physical clock and its HLC
/// (docs/DATA-MODEL.md, "Stamps and the clock").
public struct HybridLogicalClock: Sendable {
    public private(set) var last: HLCTimestamp
    /// Milliseconds a remote stamp may lead local physical time and still be adopted.
    public var maxForwardDrift: UInt64

    public init(last: HLCTimestamp = .zero, maxForwardDrift: UInt64 = 60_000) {
        self.last = last
        self.maxForwardDrift = maxForwardDrift
    }

    /// A new timestamp for a local event, strictly greater than every stamp issued or adopted.
    ///
    /// A physical time beyond ``HLCTimestamp/maxMillis`` counts as that maximum, so an absurd
    /// system clock cannot wrap the clock round to a small time; at the very largest timestamp
    /// the clock stays (the only case where a stamp repeats).
    public mutating func now(physicalMillis: UInt64) -> HLCTimestamp {
        let physical = min(physicalMillis, HLCTimestamp.maxMillis)
        if physical > last.millis {
            last = HLCTimestamp(millis: physical, logical: 0)
        } else if last.logical == UInt16.max {
            if last.millis < HLCTimestamp.maxMillis { last = HLCTimestamp(millis: last.millis + 1, logical: 0) }
        } else {
            last = HLCTimestamp(rawValue: last.rawValue + 1)
        }
        return last
    }

    /// Advances past a remote stamp so later local stamps order after it.
    ///
    /// - Returns: `false` when the stamp was further ahead than ``maxForwardDrift`` and not adopted.
    @discardableResult
    public mutating func receive(_ remote: HLCTimestamp, physicalMillis: UInt64) -> Bool {
        guard remote.millis <= physicalMillis &+ maxForwardDrift else { return false }
        if remote > last { last = remote }
        return true
    }
}
