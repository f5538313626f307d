import Foundation
import Synchronization

/// The shell's standard output: the only writer of file descriptor 1, writing whole lines.
///
/// Command output (from the thread reading commands) and live query events (from the delivery
/// queue) go out under one lock, each piece with one `write` of whole lines, so no line is ever
/// split by another. While a command runs, events are held and written after its output: a
/// command's lines stay together and the events it caused follow them. Command output is
/// buffered up to 64 KiB, so a large `find` costs few system calls.
///
/// While the line editor (``LineEditor``) edits a line at a terminal, no other thread writes to
/// the terminal: events and log lines are queued and the editor is woken to show them above the
/// line being typed (``beginEditing(wake:)``, ``takeBackground()``).
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
        /// The line editor edits a line: other threads' text waits in `background`, and a byte
        /// written to `wake` tells the editor.
        var editing = false
        var wake: Int32 = -1
        /// Text to show above the line being edited: (file descriptor, whole lines).
        var background: [(Int32, [UInt8])] = []
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
    /// line of its own and the prompt is shown again after it; with the line editor, above the
    /// line being typed, which is drawn again below it.
    func event(_ text: String) {
        state.withLock { s in
            if s.running {
                s.held.append(text)
                return
            }
            if s.editing {
                s.background.append((descriptor, Array((text + "\n").utf8)))
                Self.wake(s.wake)
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

    /// A log line (whole, ending with a newline) for standard error: written at once, or while
    /// the line editor edits a line, shown above it.
    func log(_ line: [UInt8]) {
        state.withLock { s in
            if s.editing {
                s.background.append((STDERR_FILENO, line))
                Self.wake(s.wake)
                return
            }
            var bytes = line
            Self.flush(&bytes, to: STDERR_FILENO)
        }
    }

    /// The line editor shows a prompt and edits a line: until ``endEditing(lineEnd:)`` other
    /// threads' text is queued and a byte is written to `wake` (a non-blocking pipe).
    func beginEditing(wake: Int32) {
        state.withLock { s in
            s.editing = true
            s.wake = wake
            if !s.background.isEmpty { Self.wake(wake) }
        }
    }

    /// The text queued for showing above the line being edited, emptied.
    func takeBackground() -> [(Int32, [UInt8])] {
        state.withLock { s in
            defer { s.background = [] }
            return s.background
        }
    }

    /// The line editor is done with its line: text queued since it last looked is written now.
    /// With `lineEnd` (input ended on the edited line) a newline is written first.
    func endEditing(lineEnd: Bool) {
        state.withLock { s in
            s.editing = false
            if lineEnd {
                var newline: [UInt8] = [0x0A]
                flush(&newline)
            }
            for (fd, var bytes) in s.background { Self.flush(&bytes, to: fd) }
            s.background = []
        }
    }

    /// Writes a byte to the editor's wakeup pipe (a full pipe already wakes it).
    private static func wake(_ fd: Int32) {
        var byte: UInt8 = 1
        if fd >= 0 { _ = write(fd, &byte, 1) }
    }

    /// Writes `bytes` (no newline added) at once: a command's screen control (`clear`).
    func raw(_ bytes: [UInt8]) {
        state.withLock { s in
            s.pending.append(contentsOf: bytes)
            flush(&s.pending)
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
    private func flush(_ bytes: inout [UInt8]) { Self.flush(&bytes, to: descriptor) }

    private static func flush(_ bytes: inout [UInt8], to fd: Int32) {
        defer { bytes.removeAll(keepingCapacity: bytes.count <= 65_536) }
        writeAll(fd, bytes)
    }
}
