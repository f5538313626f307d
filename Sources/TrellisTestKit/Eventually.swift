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

/// Runs `body` on a thread of its own and returns its result, for blocking work whose timing
/// matters (a kill at a chosen instant) and for long computations (a sweep of seeds).
///
/// The test runner shares the cooperative pool (one thread per core, and on Linux the global
/// dispatch queues draw from the same few threads) among the tests that run at the same time: a
/// test that computes on it for minutes leaves the others' tasks waiting, and their deadlines
/// expire although nothing is wrong. A dedicated thread leaves the pool to them.
///
/// - Returns: what `body` returned.
/// - Throws: what `body` threw.
public func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        startThread { continuation.resume(with: Result { try body() }) }
    }
}

/// ``onOwnThread(_:)`` for a body that cannot throw.
public func offPool<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        startThread { continuation.resume(returning: body()) }
    }
}

/// Starts `body` on a new thread with an 8 MiB stack.
private func startThread(_ body: @escaping @Sendable () -> Void) {
    let thread = Thread(block: body)
    thread.stackSize = 8 << 20
    thread.start()
}
