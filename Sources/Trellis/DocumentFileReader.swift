import Foundation
public import TrellisCore

/// Reads the documents of a JSON file one at a time, in bounded memory: a JSON array of objects,
/// or JSON lines (one object per line; blank lines are skipped). UTF-8, an optional byte-order
/// mark, `\n` or `\r\n` line ends; the form is chosen by the first character that is not
/// whitespace (`[` for an array).
///
/// The file is read in 1 MiB chunks and each document is parsed on its own, so memory follows the
/// largest document, not the file (`trellis import` streams through it into one transaction).
///
/// ```swift
/// let reader = try DocumentFileReader(path: "cars.jsonl")
/// while let car = try reader.next() { print(car["Name"] ?? "?") }
/// ```
public final class DocumentFileReader {
    /// The most bytes one document (one line, or one element of the array) may take: 64 MiB.
    public static let maxDocumentBytes = 64 << 20

    /// The file's path, as given.
    public let path: String
    /// The file's size in bytes when it was opened.
    public let size: Int
    /// How many bytes were consumed so far (for a progress line).
    public private(set) var bytesRead = 0
    /// How many documents ``next()`` returned so far.
    public private(set) var count = 0
    /// Where the document ``next()`` last returned, or last refused, is in the file: `line 3` in
    /// JSON lines, `element 2 (line 5)` in an array (the line its text starts on); empty before the
    /// first.
    public private(set) var place = ""

    private let fd: Int32
    private var buffer: [UInt8] = []
    /// The first unconsumed byte of `buffer`.
    private var start = 0
    private var atEnd = false
    private var form: Form?
    private var line = 0
    /// The elements of the array met so far, parsed or not.
    private var elements = 0
    /// The newlines in the bytes consumed so far (an array element's line).
    private var newlinesConsumed = 0

    private enum Form {
        case lines
        /// Inside the array; `closed` once its `]` was read.
        case array(closed: Bool)
    }

    /// Opens the file.
    ///
    /// - Throws: ``FileError`` naming the path: missing, a directory, unreadable.
    public init(path: String) throws(FileError) {
        (fd, size) = try Files.openForReading(path)
        self.path = path
    }

    /// Opens the file at `path`, named `name` in ``path`` and in every error (a copy of a file
    /// named as the user gave it, such as the bytes a node received for `trellis import`).
    ///
    /// - Throws: ``FileError`` naming `path`: missing, a directory, unreadable.
    public init(path: String, name: String) throws(FileError) {
        (fd, size) = try Files.openForReading(path)
        self.path = name
    }

    deinit { close(fd) }

    /// The next document, or `nil` after the last.
    ///
    /// - Throws: ``FileError`` naming the path and where (line, or element of the array and its
    ///   line) when the file cannot be read, a document does not parse, is not a JSON object, or
    ///   is longer than ``maxDocumentBytes``, or the array is not closed properly. For a document
    ///   that does not parse or is not an object the error is ``FileError/recoverable``: the
    ///   reader is past it, and the next call returns the document after it.
    /// - Complexity: O(size of the document) amortised.
    public func next() throws(FileError) -> Value? {
        if form == nil { try detectForm() }
        switch form! {
        case .lines: return try nextLine()
        case .array(let closed): return closed ? nil : try nextElement()
        }
    }

    // MARK: Lines

    private func nextLine() throws(FileError) -> Value? {
        while true {
            guard let (lineStart, lineEnd, next) = try takeLine() else { return nil }
            line += 1
            var end = lineEnd
            if end > lineStart, buffer[end - 1] == 0x0D { end -= 1 }
            let blank = buffer[lineStart..<end].allSatisfy { $0 == 0x20 || $0 == 0x09 }
            defer { consume(upTo: next) }
            if blank { continue }
            place = "line \(line)"
            return try document(buffer[lineStart..<end], " \(place):", "")
        }
    }

    /// The next line's bounds in `buffer` and where the line after it starts; `nil` at the end.
    private func takeLine() throws(FileError) -> (Int, Int, Int)? {
        var searched = 0  // bytes after `start` known to hold no newline (`start` moves on fill)
        while true {
            if let newline = buffer[(start + searched)...].firstIndex(of: 0x0A) { return (start, newline, newline + 1) }
            searched = buffer.count - start
            if atEnd { return searched > 0 ? (start, buffer.count, buffer.count) : nil }
            guard searched <= Self.maxDocumentBytes else {
                throw FileError("\(path) line \(line + 1) is longer than \(Self.maxDocumentBytes) bytes")
            }
            try fill()
        }
    }

    // MARK: Array

    /// Finds the first non-whitespace byte and chooses the form.
    private func detectForm() throws(FileError) {
        while true {
            if buffer.count - start >= 3, buffer[start..<start + 3].elementsEqual([0xEF, 0xBB, 0xBF]) {
                consume(upTo: start + 3)
            }
            if let first = buffer[start...].firstIndex(where: { !Self.isSpace($0) }) {
                if buffer[first] == UInt8(ascii: "[") {
                    // Newlines before the `[` still count for line numbers of JSON lines only.
                    consume(upTo: first + 1)
                    form = .array(closed: false)
                } else {
                    form = .lines
                }
                return
            }
            if atEnd {
                form = .lines
                return
            }
            try fill()
        }
    }

    private func nextElement() throws(FileError) -> Value? {
        // Skip whitespace; an empty array, or the `]` after the last element.
        consume(upTo: try skipSpace(from: start))
        guard start < buffer.count else { throw FileError("\(path): the array is not closed (no ']' at the end)") }
        if buffer[start] == UInt8(ascii: "]") {
            guard elements == 0 else {
                throw FileError("\(path): a ',' after element \(elements) is not followed by a value")
            }
            return try closeArray(after: start)
        }
        // Scan to the ',' or ']' that ends this element, outside strings and nested values. The
        // element starts at `start`; `j` counts the bytes after it scanned so far.
        elements += 1
        let place = "element \(elements) (line \(newlinesConsumed + 1))"
        self.place = place
        var depth = 0
        var inString = false
        var escaped = false
        var j = 0
        while true {
            if start + j == buffer.count {
                guard !atEnd else { throw FileError("\(path): the array is not closed (no ']' at the end)") }
                guard j <= Self.maxDocumentBytes else {
                    throw FileError("\(path) \(place) is longer than \(Self.maxDocumentBytes) bytes")
                }
                try fill()
                continue
            }
            let byte = buffer[start + j]
            if inString {
                if escaped {
                    escaped = false
                } else if byte == UInt8(ascii: "\\") {
                    escaped = true
                } else if byte == UInt8(ascii: "\"") {
                    inString = false
                }
            } else if byte == UInt8(ascii: "\"") {
                inString = true
            } else if byte == UInt8(ascii: "{") || byte == UInt8(ascii: "[") {
                depth += 1
            } else if byte == UInt8(ascii: "}") || (byte == UInt8(ascii: "]") && depth > 0) {
                depth -= 1
            } else if depth == 0, byte == UInt8(ascii: ",") || byte == UInt8(ascii: "]") {
                break
            }
            j += 1
        }
        let end = start + j
        // Parsed before the reader moves on, thrown after: a bad element is passed over.
        let value = Result { () throws(FileError) in
            try document(buffer[start..<end], " \(place):", " \(place) is")
        }
        if buffer[end] == UInt8(ascii: "]") {
            _ = try closeArray(after: end)
        } else {
            consume(upTo: end + 1)  // the ','; the next call checks that a value follows it
        }
        return try value.get()
    }

    /// Consumes the array's `]` at `index` and checks that only whitespace follows.
    private func closeArray(after index: Int) throws(FileError) -> Value? {
        consume(upTo: index + 1)
        form = .array(closed: true)
        while true {
            if let extra = buffer[start...].firstIndex(where: { !Self.isSpace($0) }) {
                throw FileError("\(path): unexpected '\(Character(Unicode.Scalar(buffer[extra])))' after the array")
            }
            consume(upTo: buffer.count)
            if atEnd { return nil }
            try fill()
        }
    }

    /// The index of the first non-whitespace byte at or after `from`, reading more as needed
    /// (`buffer.count` at the end of the file).
    private func skipSpace(from: Int) throws(FileError) -> Int {
        var i = from
        while true {
            while i < buffer.count, Self.isSpace(buffer[i]) { i += 1 }
            if i < buffer.count || atEnd { return i }
            consume(upTo: i)
            try fill()
            i = start
        }
    }

    // MARK: Buffer

    private static func isSpace(_ byte: UInt8) -> Bool {
        byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D
    }

    /// Parses one document's text.
    ///
    /// - Parameters:
    ///   - place: where, for a parse error: `" line 3:"`, `": element 2:"`.
    ///   - kind: where, before the type of a value that is not an object (`": element 2 is"`), or
    ///     `""` to use `place`.
    private func document(_ text: ArraySlice<UInt8>, _ place: String, _ kind: String) throws(FileError) -> Value {
        let value: Value
        do { value = try text.withUnsafeBytes { buffer throws(JSONError) in try JSON.parse(buffer) } } catch {
            throw FileError("\(path)\(place) \(error)", recoverable: true)
        }
        guard case .map = value else {
            throw FileError(
                "\(path)\(kind.isEmpty ? place : kind) \(value.typeName), not a JSON object", recoverable: true)
        }
        count += 1
        return value
    }

    /// Marks `buffer[..<index]` consumed.
    private func consume(upTo index: Int) {
        newlinesConsumed += buffer[start..<index].reduce(0) { $0 + ($1 == 0x0A ? 1 : 0) }
        bytesRead += index - start
        start = index
    }

    /// Reads the next chunk, first dropping consumed bytes (indexes into `buffer` shift by the old
    /// `start`; `start` becomes 0).
    private func fill() throws(FileError) {
        if start > 0 {
            buffer.removeSubrange(0..<start)
            start = 0
        }
        let chunk = 1 << 20
        let old = buffer.count
        buffer.append(contentsOf: repeatElement(0, count: chunk))
        var n = 0
        repeat {
            n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress! + old, chunk) }
        } while n < 0 && errno == EINTR
        guard n >= 0 else {
            buffer.removeSubrange(old...)
            throw FileError("cannot read \(path): \(String(cString: strerror(errno)))")
        }
        buffer.removeSubrange((old + n)...)
        if n == 0 { atEnd = true }
    }
}
