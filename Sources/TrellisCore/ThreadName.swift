import Foundation

extension Thread {
    /// Names the calling thread as the system shows it (`top -H`, `ps -L`, `perf`,
    /// /proc/PID/task/TID/comm), by writing the name to /proc/thread-self/comm (proc(5)), which is
    /// what `pthread_setname_np` does; Swift's Glibc module offers neither it nor `prctl`.
    ///
    /// Call it first thing in a thread's body. With an empty name, or without /proc mounted, it
    /// does nothing. Foundation's `Thread.name` is no substitute on Linux: a name set before
    /// `start()` never reaches the system, and one set from inside the thread reaches it only when
    /// the starting thread has already recorded the new thread's handle, which it does after the
    /// new thread may have begun to run (under load about 1 thread in 100 stayed unnamed:
    /// `ThreadNameTests`).
    ///
    /// - Parameter name: the name; Linux keeps its first 15 bytes, cut here at a Unicode
    ///   scalar's boundary. O(length of `name`).
    package static func nameCurrent(_ name: String) {
        var kept = 0
        for scalar in name.unicodeScalars {
            let width = UTF8.width(scalar)
            guard kept + width <= 15 else { break }
            kept += width
        }
        guard kept > 0 else { return }
        let bytes = Array(name.utf8.prefix(kept))
        let file = open("/proc/thread-self/comm", O_WRONLY | O_CLOEXEC)
        guard file >= 0 else { return }  // no /proc: the thread keeps the process's name
        _ = bytes.withUnsafeBytes { write(file, $0.baseAddress, $0.count) }
        close(file)
    }
}
