import Testing

@testable import TrellisSync

/// Which refused connections are logged (docs/SECURITY.md, "Admission"): a peer refused again
/// and again fills neither the log nor hides another peer's refusal.
@Suite struct RefusalLogTests {
    let start = ContinuousClock.now

    func at(_ milliseconds: Int) -> ContinuousClock.Instant { start + .milliseconds(milliseconds) }

    @Test func aSourceRefusedInALoopIsLoggedOnceASecondWithTheRestCounted() {
        var log = RefusalLog()
        var logged: [(Int, Int)] = []
        for ms in stride(from: 0, to: 3_000, by: 10) {
            if let left = log.admit(from: "stranger", at: at(ms)) { logged.append((ms, left)) }
        }
        #expect(logged.map(\.0) == [0, 1_000, 2_000])
        #expect(logged.map(\.1) == [0, 99, 99])
    }

    /// The fault this replaces: one line a second for every source together, so a peer
    /// redialling more often than once a second kept another peer's refusal out of the log.
    @Test func anotherPeerRefusedMeanwhileIsNamed() {
        var log = RefusalLog()
        #expect(log.admit(from: "c", at: at(0)) == 0)
        #expect(log.admit(from: "c", at: at(300)) == nil)
        #expect(log.admit(from: "d", at: at(600)) == 1)
        #expect(log.admit(from: "c", at: at(900)) == nil)
        #expect(log.admit(from: "c", at: at(1_000)) == 1)
    }

    @Test func manySourcesAtOnceAreLoggedAtFiveLinesASecond() {
        var log = RefusalLog()
        var logged: [Int] = []
        for n in 0..<2_000 where log.admit(from: "host-\(n)", at: at(n)) != nil { logged.append(n) }
        #expect(logged.count == 2 * RefusalLog.linesPerSecond)
        #expect(logged.prefix(5) == [0, 1, 2, 3, 4] && logged.dropFirst(5).first == 1_000)
    }
}
