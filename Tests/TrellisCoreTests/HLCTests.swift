import Testing
import TrellisCore

@Suite struct HLCTests {
    @Test func packsMillisAndLogical() {
        let t = HLCTimestamp(millis: 1_700_000_000_123, logical: 7)
        #expect(t.millis == 1_700_000_000_123)
        #expect(t.logical == 7)
        #expect(HLCTimestamp(millis: 5, logical: 65535) < HLCTimestamp(millis: 6, logical: 0))
    }

    @Test func nowIsStrictlyMonotonicWhenPhysicalTimeStallsOrGoesBack() {
        var clock = HybridLogicalClock()
        let a = clock.now(physicalMillis: 1000)
        let b = clock.now(physicalMillis: 1000)
        let c = clock.now(physicalMillis: 900)  // the wall clock stepped back
        let d = clock.now(physicalMillis: 2000)
        #expect(a < b && b < c && c < d)
        #expect(a == HLCTimestamp(millis: 1000, logical: 0))
        #expect(c == HLCTimestamp(millis: 1000, logical: 2))
        #expect(d == HLCTimestamp(millis: 2000, logical: 0))
    }

    @Test func logicalOverflowCarriesIntoMillis() {
        var clock = HybridLogicalClock(last: HLCTimestamp(millis: 1000, logical: .max))
        #expect(clock.now(physicalMillis: 1000) == HLCTimestamp(millis: 1001, logical: 0))
    }

    @Test func receiveAdvancesPastRemoteStamps() {
        var clock = HybridLogicalClock()
        _ = clock.now(physicalMillis: 1000)
        let adopted = clock.receive(HLCTimestamp(millis: 5000, logical: 3), physicalMillis: 1000)
        #expect(adopted)
        #expect(clock.now(physicalMillis: 1000) == HLCTimestamp(millis: 5000, logical: 4))
    }

    @Test func remoteStampsBeyondTheDriftBoundAreNotAdopted() {
        var clock = HybridLogicalClock(maxForwardDrift: 60_000)
        _ = clock.now(physicalMillis: 1000)
        let tooFar = clock.receive(HLCTimestamp(millis: 1000 + 60_001, logical: 0), physicalMillis: 1000)
        #expect(!tooFar)
        #expect(clock.now(physicalMillis: 1000) == HLCTimestamp(millis: 1000, logical: 1))
        let atBound = clock.receive(HLCTimestamp(millis: 1000 + 60_000, logical: 0), physicalMillis: 1000)
        #expect(atBound)
    }
}
