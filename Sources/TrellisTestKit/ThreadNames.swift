import Foundation

/// The names the system shows for this process's threads, one per thread, as `top -H` shows
/// them (/proc/self/task/TID/comm without its final line break).
public func threadNames() -> [String] {
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
    return tasks.compactMap {
        (try? String(contentsOfFile: "/proc/self/task/\($0)/comm", encoding: .utf8))?
            .trimmingCharacters(in: .newlines)
    }
}

/// The name the system shows for the calling thread (/proc/thread-self/comm without its final
/// line break); "?" without /proc.
public func currentThreadName() -> String {
    (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8))?
        .trimmingCharacters(in: .newlines) ?? "?"
}
