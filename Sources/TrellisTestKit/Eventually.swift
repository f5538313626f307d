import Foundation

/// Polls `condition` every 10 ms until it holds or `timeout` seconds pass.
///
/// - Returns: whether the condition held (tests `#expect` on it; no timing goal is asserted).
public func eventually(timeout: Double = 20, _ condition: () throws -> Bool) rethrows -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if try condition() { return true }
        usleep(10_000)
    }
    return try condition()
}

/// ``eventually(timeout:_:)`` for async tests: polls `condition` every 10 ms until it holds or
/// `timeout` seconds pass, sleeping without holding a thread of the cooperative pool, which the
/// test runner shares among the tests that run at the same time.
///
/// - Returns: whether the condition held (tests `#expect` on it; no timing goal is asserted).
public func waitUntil(timeout: Double = 20, _ condition: () throws -> Bool) async rethrows -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if try condition() { return true }
        try? await Task.sleep(for: .milliseconds(10))
    }
    return try condition()
}

/// Sleeps `seconds` without holding a thread of the cooperative pool.
public func pause(_ seconds: Double) async {
    try? await Task.sleep(for: .microseconds(Int(seconds * 1_000_000)))
}

/// Runs `body` on a global dispatch thread and returns its result, for blocking work whose
/// timing matters (a kill at a chosen instant): on the cooperative pool, which the test runner
/// shares among the tests that run at the same time, a sleeping task may wake up late.
public func offPool<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        DispatchQueue.global().async { continuation.resume(returning: body()) }
    }
}
