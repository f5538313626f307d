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
    static func writeAll(_ bytes: [UInt8], to descriptor: Int32) {
        bytes.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let n = Glibc.write(descriptor, buffer.baseAddress! + offset, buffer.count - offset)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return }
                offset += n
            }
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
    private let sink: any ShellSink

    init(sink: any ShellSink = FileSink()) { self.sink = sink }

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
    /// line of its own and the prompt is shown again after it.
    func event(_ text: String) {
        state.withLock { s in
            if s.running {
                s.held.append(text)
                return
            }
            var bytes = Array(((s.prompt != nil ? "\n" : "") + text + "\n").utf8)
            if let prompt = s.prompt { bytes.append(contentsOf: prompt.utf8) }
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
