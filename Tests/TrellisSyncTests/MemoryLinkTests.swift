import Foundation
import Testing
import TrellisNet
import TrellisTestKit

/// `MemoryLink` keeps the ``MessageLink`` contract that ``SecureLink`` keeps, so engine tests on
/// it mean something on sockets too.
@Suite struct MemoryLinkTests {
    static func pair(highWater: Int = 1000, lowWater: Int = 200) -> (MemoryLink, MemoryLink) {
        MemoryLink.pair(
            initiatorKey: Array(repeating: 1, count: 32), responderKey: Array(repeating: 2, count: 32),
            highWater: highWater, lowWater: lowWater)
    }

    /// A started pair and what each end receives.
    static func startedPair() -> (a: MemoryLink, b: MemoryLink, atA: LinkRecorder, atB: LinkRecorder) {
        let (a, b) = pair()
        let atA = LinkRecorder()
        let atB = LinkRecorder()
        atA.start(a)
        atB.start(b)
        return (a, b, atA, atB)
    }

    @Test func messagesArriveInOrderBothWays() throws {
        let (a, b) = Self.pair()
        let atA = LinkRecorder()
        let atB = LinkRecorder()
        // Sent before either end started: held until it starts.
        try a.send([0])
        atA.start(a)
        atB.start(b)
        for i in 1..<200 { try a.send([UInt8(i)]) }
        for i in 0..<50 { try b.send([UInt8(i), 0]) }
        #expect(eventually { atB.messageCount == 200 && atA.messageCount == 50 })
        #expect(atB.messages == (0..<200).map { [UInt8($0)] })
        #expect(atA.messages == (0..<50).map { [UInt8($0), 0] })
        #expect(a.isInitiator && !b.isInitiator)
        #expect(a.remotePeerKey == Array(repeating: 2, count: 32))
    }

    /// An end that stops reading: sends still return at once, the sender's queue grows past
    /// `highWater`; when the end resumes, everything arrives and `onDrain` runs once.
    @Test func anEndThatStopsReadingBacksUpItsPeer() throws {
        let (a, b, atA, atB) = Self.startedPair()
        b.stopReading()
        var returned: [Int] = []
        for i in 0..<30 { returned.append(try a.send([UInt8](repeating: UInt8(i), count: 96))) }
        #expect(returned == (1...30).map { $0 * 100 })
        #expect(a.queuedBytes == 3000)
        #expect(atB.messageCount == 0)
        #expect(atA.drains == 0)
        b.resumeReading()
        #expect(eventually { atB.messageCount == 30 })
        #expect(eventually { atA.drains == 1 })
        #expect(eventually { a.queuedBytes == 0 })
        // Below highWater again: no further drain.
        try a.send([1])
        #expect(eventually { atB.messageCount == 31 })
        #expect(atA.drains == 1)
    }

    /// Closing one end: its `onClose` runs even while the other end is stuck; the stuck end learns
    /// of it when it reads again; neither end can send afterwards.
    @Test func closeNeverWaitsForAStuckPeer() throws {
        let (a, b, atA, atB) = Self.startedPair()
        b.stopReading()
        for _ in 0..<30 { try a.send([UInt8](repeating: 0, count: 96)) }
        a.close()
        #expect(atA.waitForClose(seconds: 10))
        #expect(atA.closeReasons == ["closed by this node"])
        #expect(throws: LinkError.closed) { try a.send([1]) }
        #expect(throws: LinkError.closed) { try b.send([1]) }
        #expect(atB.closeReasons.isEmpty)
        b.resumeReading()
        #expect(atB.waitForClose(seconds: 10))
        #expect(atB.closeReasons == ["peer closed the connection"])
        #expect(atB.messageCount == 0)  // dropped, as a socket shut down under a stuck writer drops it
        #expect(atA.eventsAfterClose == 0 && atB.eventsAfterClose == 0)
    }

    /// A peer that reads receives what was sent before the close, then `onClose`.
    @Test func whatWasSentBeforeCloseArrivesFirst() throws {
        let (a, b) = Self.pair()
        let atB = LinkRecorder()
        atB.start(b)
        for i in 0..<10 { try a.send([UInt8(i)]) }
        a.close()
        a.close()
        LinkRecorder().start(a)
        #expect(atB.waitForClose(seconds: 10))
        #expect(atB.messages == (0..<10).map { [UInt8($0)] })
        #expect(atB.closeReasons == ["peer closed the connection"])
    }

    @Test func anOversizedMessageIsRefused() {
        let (a, _) = Self.pair()
        #expect(throws: LinkError.messageTooLarge(LinkLimits.maxMessageBytes + 1)) {
            try a.send([UInt8](repeating: 0, count: LinkLimits.maxMessageBytes + 1))
        }
        #expect(a.queuedBytes == 0)
    }
}
