import Foundation
import Synchronization
import Testing
import TrellisTestKit

@testable import TrellisCore

/// Threads name themselves for `top -H`, `perf` and /proc (`Thread.nameCurrent`).
@Suite struct ThreadNameTests {
    /// Every one of 400 threads started at once shows its name: with Foundation's
    /// `Thread.current.name` a few in each run stayed unnamed, the CI failure of
    /// `TwoProcessTests.replicationRunsAtTheChosenPriority`.
    @Test func everyThreadStartedAtOnceShowsItsName() {
        let count = 400
        let started = DispatchGroup()
        let release = DispatchSemaphore(value: 0)
        for i in 0..<count {
            started.enter()
            Thread {
                Thread.nameCurrent("trellis.tn\(i % 10)")
                started.leave()
                release.wait()
            }.start()
        }
        started.wait()
        let named = threadNames().filter { $0.hasPrefix("trellis.tn") }.count
        for _ in 0..<count { release.signal() }
        #expect(named == count, "\(count - named) of \(count) threads did not show their name")
    }

    /// Linux keeps 15 bytes of a name; a longer one is cut before a character, never inside it.
    @Test func aLongNameIsCutAtACharacterBoundary() {
        let names = Mutex<[String]>([])
        let done = DispatchSemaphore(value: 0)
        for name in ["trellis.a-long-thread-name", "trellis.aaaaaaé", "trellis.aaaaaéé"] {
            Thread {
                Thread.nameCurrent(name)
                let shown = currentThreadName()
                names.withLock { $0.append(shown) }
                done.signal()
            }.start()
            done.wait()
        }
        #expect(names.withLock { $0 } == ["trellis.a-long-", "trellis.aaaaaa", "trellis.aaaaaé"])
    }
}
