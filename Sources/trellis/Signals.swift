import Foundation
import TrellisCore

/// SIGINT and SIGTERM for the commands that run until stopped (`node`, `contacts mirror`).
///
/// They are blocked in the main thread before anything else starts, so every thread created later
/// inherits the mask and a signal stays pending until ``onTermination(_:)``'s thread takes it with
/// `sigwait`: none is lost however early it arrives, and none kills the process half-way. (A
/// dispatch signal source installs its handler asynchronously after `resume()`, so a signal sent
/// right after start could be ignored or kill the process.)
enum Signals {
    static func termination(_ signals: [Int32] = [SIGINT, SIGTERM]) -> sigset_t {
        var set = sigset_t()
        sigemptyset(&set)
        for signal in signals { sigaddset(&set, signal) }
        return set
    }

    /// Blocks `signals` (SIGINT and SIGTERM by default) in the calling thread and in threads it
    /// creates from now on. Call first thing in `main`.
    static func block(_ signals: [Int32] = [SIGINT, SIGTERM]) {
        var set = termination(signals)
        pthread_sigmask(SIG_BLOCK, &set, nil)
    }

    /// Gives SIGINT and SIGTERM their default action (ending the process) and unblocks them, in
    /// case the parent ignored or blocked them (both are inherited). Call first thing in `main`.
    static func restoreDefault() {
        signal(SIGINT, SIG_DFL)
        signal(SIGTERM, SIG_DFL)
        var set = termination()
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
    }

    /// Runs `handler` on a dedicated thread at each of `signals` (SIGINT and SIGTERM by default,
    /// blocked with ``block(_:)``; pending ones included).
    static func onTermination(of signals: [Int32] = [SIGINT, SIGTERM], _ handler: @escaping @Sendable () -> Void) {
        let thread = Thread {
            Thread.nameCurrent("trellis.signals")
            var set = termination(signals)
            while true {
                var received: Int32 = 0
                if sigwait(&set, &received) == 0 { handler() }
            }
        }
        thread.start()
    }
}
