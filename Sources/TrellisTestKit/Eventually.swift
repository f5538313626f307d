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
