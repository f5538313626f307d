import Foundation
import Synchronization

/// The shell's standard output: the only writer of file descriptor 1, writing whole lines.
///
/// Command output (from the thread reading commands) and live query events (from the delivery
/// queue) go out under one lock, each piece with one `write` of whole lines, so no line is ever
/// split by another. While a command runs, events are held and written after its output: a
/// command's lines stay together and the events it caused follow them. Command output is
/// buffered up to 64 KiB, so a large `find` costs few system calls.
final class ShellOutput: Sendable {
    private struct State {
        /// A command runs: events wait in `held`.
        var running = false
        /// Command output not written yet.
        var pending: [UInt8] = []
        /// Events that arrived while a command ran, each one or more whole lines.
        var held: [String] = []
        /// The prompt shown at a terminal while it waits for a line, if any.
        var prompt: String?
    }

    private let state = Mutex(State())
    private let descriptor: Int32

    init(descriptor: Int32 = STDOUT_FILENO) { self.descriptor = descriptor }

    /// Writes one line (or several, separated by newlines) of command output.
    func line(_ text: String) {
        state.withLock { s in
            s.pending.append(contentsOf: text.utf8)
            s.pending.append(0x0A)
            if !s.running || s.pending.count >= 65_536 { flush(&s.pending) }
        }
    }

    /// Writes a live query event (one or more lines): at once between commands, after the
    /// running command's output otherwise. At a terminal waiting for input, the event goes on a
    /// line of its own and the prompt is shown again after it.
    func event(_ text: String) {
        state.withLock { s in
            if s.running {
                s.held.append(text)
                return
            }
            var bytes = Array(((s.prompt != nil ? "\n" : "") + text + "\n").utf8)
            if let prompt = s.prompt { bytes.append(contentsOf: prompt.utf8) }
            flush(&bytes)
        }
    }

    /// Shows the prompt (no newline) and remembers it until the next command starts.
    func prompt(_ text: String) {
        state.withLock { s in
            var bytes = Array(text.utf8)
            flush(&bytes)
            s.prompt = text
        }
    }

    /// A command starts: from now until ``endCommand()`` events are held.
    func beginCommand() {
        state.withLock { s in
            s.running = true
            s.prompt = nil
        }
    }

    /// The command ended: its output is written, then the events held meanwhile.
    func endCommand() {
        state.withLock { s in
            s.running = false
            for event in s.held {
                s.pending.append(contentsOf: event.utf8)
                s.pending.append(0x0A)
            }
            s.held = []
            flush(&s.pending)
        }
    }

    /// Writes `bytes` in full (retrying short writes and EINTR) and empties them. A closed
    /// output (EPIPE) drops them: there is no one left to read them.
    private func flush(_ bytes: inout [UInt8]) {
        defer { bytes.removeAll(keepingCapacity: bytes.count <= 65_536) }
        bytes.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let n = write(descriptor, buffer.baseAddress! + offset, buffer.count - offset)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return }
                offset += n
            }
        }
    }
}
