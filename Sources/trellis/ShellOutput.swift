import Foundation
import Synchronization

/// Where the shell's bytes go, by kind: a ``ShellOutput`` hands each piece to its sink whole.
enum ShellStream: UInt8, Sendable {
    /// Command output.
    case output
    /// An error line (`error: …`).
    case error
    /// A live query event (one or more lines; at a terminal, with the prompt shown again after it).
    case event
    /// The prompt, shown while the shell waits for a line.
    case prompt
}

/// Takes the shell's bytes: the process's standard output and error (``FileSink``), or a client
/// attached through the control socket (``ControlConnection``).
protocol ShellSink: Sendable {
    /// Writes `bytes` in full, or drops them when no one reads any more. Called under the
    /// output's lock: pieces arrive in the order the user must see them.
    func write(_ bytes: [UInt8], to stream: ShellStream)
}

/// The sink of `trellis shell`: output, events and the prompt to standard output, errors to
/// standard error.
struct FileSink: ShellSink {
    var output: Int32 = STDOUT_FILENO
    var error: Int32 = STDERR_FILENO

    func write(_ bytes: [UInt8], to stream: ShellStream) {
        Self.writeAll(bytes, to: stream == .error ? error : output)
    }

    /// Writes `bytes` in full (retrying short writes and EINTR). A closed output (EPIPE) drops
    /// them: there is no one left to read them.
    ///
    /// - Returns: whether every byte was written (`errno` says why not).
    @discardableResult
    static func writeAll(_ bytes: [UInt8], to descriptor: Int32) -> Bool {
        bytes.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let n = Glibc.write(descriptor, buffer.baseAddress! + offset, buffer.count - offset)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return false }
                offset += n
            }
            return true
        }
    }
}

/// The shell's output: the only writer of its sink (standard output and error, or an attached
/// client), writing whole lines.
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
        /// Text to show above the line being edited: (stream, whole lines).
        var background: [(ShellStream, [UInt8])] = []
    }

    private let state = Mutex(State())
    private let sink: any ShellSink

    /// Whether an event shown at the prompt is followed by the prompt again (off for a client
    /// whose line editor draws its own prompt and line after it).
    private let redrawsPrompt: Bool

    init(sink: any ShellSink = FileSink(), redrawsPrompt: Bool = true) {
        self.sink = sink
        self.redrawsPrompt = redrawsPrompt
    }

    /// Writes one line (or several, separated by newlines) of command output.
    func line(_ text: String) {
        state.withLock { s in
            s.pending.append(contentsOf: text.utf8)
            s.pending.append(0x0A)
            if !s.running || s.pending.count >= 65_536 { flush(&s.pending) }
        }
    }

    /// Writes `error: TEXT` (one line) to the error stream, after the command output before it.
    func error(_ text: String) {
        state.withLock { s in
            flush(&s.pending)
            var bytes = Array("error: \(text)\n".utf8)
            flush(&bytes, to: .error)
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
                s.background.append((.output, Array((text + "\n").utf8)))
                Self.wake(s.wake)
                return
            }
            let prompt = redrawsPrompt ? s.prompt : nil
            var bytes = Array(((prompt != nil ? "\n" : "") + text + "\n").utf8)
            if let prompt { bytes.append(contentsOf: prompt.utf8) }
            flush(&bytes, to: .event)
        }
    }

    /// Shows the prompt (no newline) and remembers it until the next command starts.
    func prompt(_ text: String) {
        state.withLock { s in
            var bytes = Array(text.utf8)
            flush(&bytes, to: .prompt)
            s.prompt = text
        }
    }

    /// A log line (whole, ending with a newline) for standard error: written at once, or while
    /// the line editor edits a line, shown above it.
    func log(_ line: [UInt8]) { show(line, on: .error) }

    /// Whole lines from another thread (a log line, or what an attached node sent): written at
    /// once, or while the line editor edits a line, shown above it.
    func show(_ lines: [UInt8], on stream: ShellStream) {
        state.withLock { s in
            if s.editing {
                s.background.append((stream, lines))
                Self.wake(s.wake)
                return
            }
            var bytes = lines
            flush(&bytes, to: stream)
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
    func takeBackground() -> [(ShellStream, [UInt8])] {
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
            for (stream, var bytes) in s.background { flush(&bytes, to: stream) }
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

    /// Hands `bytes` to the sink (nothing when empty) and empties them.
    private func flush(_ bytes: inout [UInt8], to stream: ShellStream = .output) {
        defer { bytes.removeAll(keepingCapacity: bytes.count <= 65_536) }
        guard !bytes.isEmpty else { return }
        sink.write(bytes, to: stream)
    }
}
