import Foundation
import Synchronization
import Testing

@testable import TrellisCore

/// Threads name themselves for `top -H`, `perf` and /proc (`Thread.nameCurrent`).
@Suite struct ThreadNameTests {
    /// The names the system shows for this process's threads (/proc/self/task/TID/comm).
    func systemNames() -> [String] {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
        return tasks.compactMap {
            (try? String(contentsOfFile: "/proc/self/task/\($0)/comm", encoding: .utf8))?
                .trimmingCharacters(in: .newlines)
        }
    }

    /// The name the system shows for the calling thread.
    func currentSystemName() -> String {
        let name = try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)
        return name?.trimmingCharacters(in: .newlines) ?? "?"
    }

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
        let named = systemNames().filter { $0.hasPrefix("trellis.tn") }.count
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
                let shown = currentSystemName()
                names.withLock { $0.append(shown) }
                done.signal()
            }.start()
            done.wait()
        }
        #expect(names.withLock { $0 } == ["trellis.a-long-", "trellis.aaaaaa", "trellis.aaaaaé"])
    }
}
