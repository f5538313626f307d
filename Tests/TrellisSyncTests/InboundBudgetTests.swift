import Synchronization
import Testing
import TrellisNet

/// The node-wide count of inbound message bytes (``InboundBudget``): who is cut, what is given
/// back, when a reader waits.
@Suite struct InboundBudgetTests {
    /// Growing past the limit cuts the link holding the most, whose bytes stop counting at once;
    /// the link asking is cut itself when it holds the most (ties included).
    @Test func theLinkHoldingTheMostIsCut() {
        let budget = InboundBudget(limit: 100, perLinkQueued: 50)
        let cuts = Mutex<[String]>([])
        let a = budget.open { _ in cuts.withLock { $0.append("a") } }
        let b = budget.open { _ in cuts.withLock { $0.append("b") } }
        let c = budget.open { _ in cuts.withLock { $0.append("c") } }
        #expect(a.grow(by: 60) == nil)
        #expect(b.grow(by: 30) == nil)
        // c would take the total to 110: a holds the most and is cut.
        #expect(c.grow(by: 20) == nil)
        #expect(cuts.withLock { $0 } == ["a"])
        #expect(budget.heldBytes == 50)
        #expect(budget.cuts == 1)
        // A cut account accepts anything and counts nothing (its reader is ending).
        #expect(a.grow(by: 1_000) == nil)
        #expect(budget.heldBytes == 50)
        // c now holds 20 of 50 and asks for 60 more: it holds the most, so it is the one cut.
        let reason = c.grow(by: 60)
        #expect(reason?.contains("held the most") == true)
        #expect(budget.heldBytes == 30)
        #expect(budget.peakBytes == 90)  // never above the limit
    }

    /// Bytes of a delivered message leave the count once consumed; closing gives back the rest.
    @Test func consumedAndClosedBytesAreGivenBack() {
        let budget = InboundBudget(limit: 1_000, perLinkQueued: 500)
        let link = budget.open { _ in }
        #expect(link.grow(by: 300) == nil)
        link.delivered(200)
        link.consumed(200)
        #expect(budget.heldBytes == 100)
        link.close()
        #expect(budget.heldBytes == 0)
        link.consumed(50)  // after the close: nothing to give back
        #expect(budget.heldBytes == 0)
    }

    /// A reader waits while its delivered, unconsumed messages hold the per-link bytes or more,
    /// and goes on when the receiver consumes them or the link closes.
    @Test func aReaderWaitsForTheReceiver() async {
        let budget = InboundBudget(limit: 1_000, perLinkQueued: 100)
        let link = budget.open { _ in }
        #expect(link.grow(by: 150) == nil)
        link.delivered(150)
        let resumed = Mutex(false)
        let waiter = Task.detached {
            link.waitForRoom()
            resumed.withLock { $0 = true }
        }
        try? await Task.sleep(for: .milliseconds(100))
        let early = resumed.withLock { $0 }
        #expect(!early)
        link.consumed(150)
        await waiter.value
        let late = resumed.withLock { $0 }
        #expect(late)

        #expect(link.grow(by: 150) == nil)
        link.delivered(150)
        let closing = Task.detached { link.waitForRoom() }
        link.close()
        await closing.value
    }
}
