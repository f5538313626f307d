import CLibEdit
import Foundation

/// Line editing for `trellis shell` at a terminal, over libedit (BSD editline, Debian `libedit`):
/// emacs keys (arrows, Home/End, Ctrl-A/E/K/U/W/L, Alt-B/F), history with Up/Down kept in a file,
/// Ctrl-R (incremental search back through the history), Tab completion, and text from other
/// threads (live query events, log lines) shown above the line being typed, which is then drawn
/// again below it, as typed. `~/.editrc` (or `$EDITRC`) may rebind keys (`man editrc`).
///
/// Everything libedit touches runs on the thread calling ``readLine()``. While it edits a line no
/// other thread writes to the terminal: ``ShellOutput`` queues their text and wakes this thread
/// through a pipe; this thread waits for a key or that wakeup with `poll`, clears the line being
/// edited, writes the text, and has libedit redraw the prompt and the line.
final class LineEditor {
    /// What Tab may insert at the cursor.
    struct Completion {
        /// The text before the cursor that the candidates complete (each starts with it).
        var word: String
        /// The possible completions, whole (the word included).
        var candidates: [String]
        /// Whether a unique candidate is followed by a space (a finished word).
        var appendsSpace: Bool
    }

    /// The most lines the history keeps, in memory and in its file.
    static let historySize: Int32 = 1_000

    /// The history file, or `nil` when history is not kept in a file.
    let historyFile: String?
    private let output: ShellOutput
    private let complete: (String) -> Completion
    private let editLine: OpaquePointer
    private let history: OpaquePointer
    private let prompt: UnsafeMutablePointer<CChar>
    private let promptWidth: Int
    private let wakeRead: Int32
    private let wakeWrite: Int32
    /// A UTF-8 sequence being decoded from the keyboard: its bits so far and how many bytes remain.
    private var partial: (scalar: UInt32, remaining: Int) = (0, 0)
    private var historyWarned = false

    /// Sets the terminal up for editing (libedit changes its modes only while a line is read).
    ///
    /// - Parameters:
    ///   - prompt: shown before each line (one line, no escape sequences).
    ///   - historyFile: lines are loaded from it and it is rewritten after each line entered
    ///     (at most ``historySize`` lines, mode 0600, its directory made with mode 0700);
    ///     `nil`: history lasts for this session only.
    ///   - complete: given the text before the cursor, what Tab may insert.
    /// - Throws: ``UsageError`` when libedit cannot be set up (no terminal description).
    init(
        prompt: String, historyFile: String?, output: ShellOutput, complete: @escaping (String) -> Completion
    ) throws {
        // libedit reads and writes characters in the locale's encoding; Trellis text is UTF-8.
        if setlocale(LC_CTYPE, "") == nil || String(cString: nl_langinfo(Int32(CODESET))) != "UTF-8" {
            setlocale(LC_CTYPE, "C.UTF-8")
        }
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else {
            throw UsageError("line editing: cannot make a pipe: \(String(cString: strerror(errno)))")
        }
        for fd in fds {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        }
        (wakeRead, wakeWrite) = (fds[0], fds[1])
        self.prompt = strdup(prompt)
        promptWidth = prompt.unicodeScalars.count
        self.historyFile = historyFile
        self.output = output
        self.complete = complete
        history = history_init()
        trellis_history_setsize(history, Self.historySize)
        trellis_history_setunique(history, 1)
        if let historyFile {
            let directory = URL(fileURLWithPath: historyFile).deletingLastPathComponent()
            try? FileManager.default.createDirectory(
                at: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            trellis_history_load(history, historyFile)  // absent at first: nothing to load
        }
        guard let editLine = trellis_el_init_std("trellis") else {
            throw UsageError("line editing: libedit cannot use this terminal")
        }
        self.editLine = editLine
        trellis_el_set_clientdata(editLine, Unmanaged.passUnretained(self).toOpaque())
        trellis_el_set_editor(editLine, "emacs")
        trellis_el_set_signal(editLine, 1)  // Ctrl-C, Ctrl-Z and resizing leave the terminal sane
        trellis_el_set_prompt(editLine) { e in LineEditor.of(e).prompt }
        trellis_el_set_history(editLine, history)
        trellis_el_set_getc(editLine) { e, character in LineEditor.of(e).readCharacter(into: character!) }
        trellis_el_addfn(editLine, "trellis-complete", "complete a command, collection or field path") { e, _ in
            LineEditor.of(e).completeAtCursor()
        }
        trellis_el_bind(editLine, "^I", "trellis-complete")
        // libedit's emacs keys bind Ctrl-R to redisplay; make it search back, as readline does.
        trellis_el_bind(editLine, "^R", "em-inc-search-prev")
        el_source(editLine, nil)  // the user's ~/.editrc, if any
    }

    deinit {
        el_end(editLine)
        history_end(history)
        free(prompt)
        close(wakeRead)
        close(wakeWrite)
    }

    private static func of(_ e: OpaquePointer?) -> LineEditor {
        Unmanaged<LineEditor>.fromOpaque(trellis_el_clientdata(e)!).takeUnretainedValue()
    }

    /// Shows the prompt and edits one line until Enter; a line not blank goes into the history
    /// (and its file).
    ///
    /// - Returns: the line without its line end, or `nil` at the end of input (Ctrl-D on an
    ///   empty line) or when the terminal cannot be read.
    func readLine() -> String? {
        output.beginEditing(wake: wakeWrite)
        var count: Int32 = 0
        guard let line = el_gets(editLine, &count), count > 0 else {
            output.endEditing(lineEnd: true)
            return nil
        }
        output.endEditing(lineEnd: false)
        var text = String(cString: line)
        if text.hasSuffix("\n") { text.removeLast() }
        if !text.allSatisfy(\.isWhitespace) { remember(text) }
        return text
    }

    /// Adds `line` to the history and rewrites the history file (a new file renamed over the
    /// old: a crash leaves one or the other). A file that cannot be written is reported once.
    private func remember(_ line: String) {
        trellis_history_enter(history, line)
        guard let historyFile else { return }
        let temporary = "\(historyFile).\(getpid()).tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        var failure = fd < 0 ? errno : 0
        if fd >= 0 {
            close(fd)
            if trellis_history_save(history, temporary) < 0 {
                failure = errno == 0 ? EIO : errno
            } else if rename(temporary, historyFile) != 0 {
                failure = errno
            }
            if failure != 0 { unlink(temporary) }
        }
        if failure != 0 && !historyWarned {
            historyWarned = true
            let reason = String(cString: strerror(failure))
            output.log(Array("warning: cannot write the history file \(historyFile): \(reason)\n".utf8))
        }
    }

    /// libedit's character reader: the next key's character, decoded from UTF-8, while text
    /// queued by other threads is shown as it arrives.
    ///
    /// - Returns: 1 with a character, 0 at the end of input, -1 on a read error (libedit's
    ///   convention).
    private func readCharacter(into character: UnsafeMutablePointer<wchar_t>) -> Int32 {
        while true {
            var fds = [
                pollfd(fd: STDIN_FILENO, events: Int16(POLLIN), revents: 0),
                pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0),
            ]
            if poll(&fds, 2, -1) < 0 {
                if errno == EINTR { continue }  // a signal (a resized window): libedit handled it
                return -1
            }
            if fds[1].revents != 0 { showBackground() }
            guard fds[0].revents != 0 else { continue }
            var byte: UInt8 = 0
            let n = read(STDIN_FILENO, &byte, 1)
            if n < 0 {
                if errno == EINTR || errno == EAGAIN { continue }
                return -1
            }
            if n == 0 { return 0 }
            if let scalar = decode(byte) {
                character.pointee = wchar_t(bitPattern: scalar)
                return 1
            }
        }
    }

    /// Feeds one byte of UTF-8: the scalar when it completes one; U+FFFD for a bad byte.
    private func decode(_ byte: UInt8) -> UInt32? {
        switch byte {
        case 0x00..<0x80:
            partial = (0, 0)
            return UInt32(byte)
        case 0x80..<0xC0:
            guard partial.remaining > 0 else { return 0xFFFD }
            partial.scalar = partial.scalar << 6 | UInt32(byte & 0x3F)
            partial.remaining -= 1
            return partial.remaining == 0 ? partial.scalar : nil
        case 0xC2..<0xE0: partial = (UInt32(byte & 0x1F), 1)
        case 0xE0..<0xF0: partial = (UInt32(byte & 0x0F), 2)
        case 0xF0..<0xF5: partial = (UInt32(byte & 0x07), 3)
        default:
            partial = (0, 0)
            return 0xFFFD
        }
        return nil
    }

    /// Writes what other threads queued above the line being edited, then redraws the prompt
    /// and the line.
    private func showBackground() {
        var sink = [UInt8](repeating: 0, count: 256)
        while read(wakeRead, &sink, sink.count) > 0 {}
        let pieces = output.takeBackground()
        guard !pieces.isEmpty else { return }
        FileSink.writeAll(Array(clearLine().utf8), to: STDOUT_FILENO)
        for (stream, bytes) in pieces {
            FileSink.writeAll(Self.terminalLines(bytes), to: stream == .error ? STDERR_FILENO : STDOUT_FILENO)
        }
        trellis_el_refresh(editLine)
    }

    /// Moves the cursor to the start of the prompt (up as many rows as the line wraps before the
    /// cursor) and clears from there to the end of the screen.
    private func clearLine() -> String {
        var rows = 0
        if let info = el_line(editLine)?.pointee, let start = info.buffer {
            let before = UnsafeRawBufferPointer(start: start, count: info.cursor - start)
            let columns = promptWidth + String(decoding: before, as: UTF8.self).unicodeScalars.count
            rows = columns / Self.terminalColumns()
        }
        return (rows > 0 ? "\u{1B}[\(rows)A" : "") + "\r\u{1B}[J"
    }

    /// The terminal's width in columns (80 when it does not say).
    private static func terminalColumns() -> Int {
        var size = winsize()
        guard ioctl(STDOUT_FILENO, UInt(TIOCGWINSZ), &size) == 0, size.ws_col > 0 else { return 80 }
        return Int(size.ws_col)
    }

    /// `bytes` with each `\n` written `\r\n`: the terminal may not add the carriage return while
    /// libedit has it in its editing mode.
    static func terminalLines(_ bytes: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count + 16)
        for byte in bytes {
            if byte == 0x0A { out.append(0x0D) }
            out.append(byte)
        }
        return out
    }

    /// Tab: inserts what all candidates share beyond the word typed (and a space after a unique
    /// finished word); when that is nothing, lists the candidates above the line.
    private func completeAtCursor() -> UInt8 {
        guard let info = el_line(editLine)?.pointee, let start = info.buffer else { return UInt8(CC_ERROR) }
        let before = String(decoding: UnsafeRawBufferPointer(start: start, count: info.cursor - start), as: UTF8.self)
        let completion = complete(before)
        let candidates = completion.candidates
        guard !candidates.isEmpty else { return UInt8(CC_REFRESH_BEEP) }
        var insert = String(
            Self.commonPrefix(candidates).unicodeScalars.dropFirst(completion.word.unicodeScalars.count))
        if candidates.count == 1 && completion.appendsSpace { insert += " " }
        if !insert.isEmpty {
            return el_insertstr(editLine, insert) == 0 ? UInt8(CC_REFRESH) : UInt8(CC_ERROR)
        }
        var list = Array(clearLine().utf8)
        list += Self.terminalLines(Array((Self.columns(candidates, width: Self.terminalColumns()) + "\n").utf8))
        FileSink.writeAll(list, to: STDOUT_FILENO)
        return UInt8(CC_REDISPLAY)
    }

    /// The longest run of Unicode scalars every string starts with.
    static func commonPrefix(_ strings: [String]) -> String {
        guard var prefix = strings.first.map({ Array($0.unicodeScalars) }) else { return "" }
        for string in strings.dropFirst() {
            let scalars = Array(string.unicodeScalars)
            var n = 0
            while n < prefix.count, n < scalars.count, prefix[n] == scalars[n] { n += 1 }
            prefix.removeSubrange(n...)
        }
        var text = String.UnicodeScalarView()
        text.append(contentsOf: prefix)
        return String(text)
    }

    /// `items` in columns filling `width`, row by row, as `ls` lists names.
    static func columns(_ items: [String], width: Int) -> String {
        let cell = (items.map(\.unicodeScalars.count).max() ?? 0) + 2
        let perRow = max(1, width / cell)
        var lines: [String] = []
        var index = 0
        while index < items.count {
            let row = items[index..<min(index + perRow, items.count)]
            lines.append(
                row.map { $0 + String(repeating: " ", count: cell - $0.unicodeScalars.count) }.joined()
                    .trimmingCharacters(in: .whitespaces))
            index += perRow
        }
        return lines.joined(separator: "\n")
    }

    /// The history file: `$TRELLIS_HISTORY` when set (empty: none), else
    /// `$XDG_STATE_HOME/trellis/history`, else `~/.local/state/trellis/history` (the XDG default);
    /// `nil` when none applies (no home directory) or with `--no-history`.
    static func historyFile(environment: [String: String], disabled: Bool) -> String? {
        if disabled { return nil }
        if let file = environment["TRELLIS_HISTORY"] { return file.isEmpty ? nil : file }
        if let state = environment["XDG_STATE_HOME"], state.hasPrefix("/") { return state + "/trellis/history" }
        guard let home = environment["HOME"], !home.isEmpty else { return nil }
        return home + "/.local/state/trellis/history"
    }
}
