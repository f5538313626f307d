public import ContactProvider
public import Foundation
import Synchronization
import TrellisCrypto

#if canImport(Glibc)
    import Glibc
#endif

/// A vdir (one vCard per file, as khard and vdirsyncer read them): a ``ContactSink`` writing one
/// `UID.vcf` vCard 4.0 file per contact.
///
/// Files are written atomically (a hidden temporary file in the same directory, then `rename(2)`),
/// so readers never see half a card; a delete removes the file. The UID is the contact's
/// identifier; characters outside `A–Z a–z 0–9 . _ - @` are written `%XX` in the file name.
public final class VdirMirror: ContactSink {
    public let directory: URL
    /// The names of files present when a full enumeration began and not written since.
    private let stale = Mutex<Set<String>?>(nil)
    private var staleFile: URL { directory.appendingPathComponent(".trellis-full-enumeration") }
    /// The names written since the full enumeration began, one per line, appended after each
    /// batch: a host that resumes the enumeration after a crash keeps them
    /// (``finishFullEnumeration()``).
    private var writtenFile: URL { directory.appendingPathComponent(".trellis-full-enumeration-written") }

    /// Creates the directory when needed.
    public init(directory: URL) throws {
        self.directory = directory
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    }

    /// The file name for an identifier.
    public static func fileName(for identifier: ContactItem.Identifier) -> String {
        var name = ""
        for byte in identifier.value.utf8 {
            let c = Character(Unicode.Scalar(byte))
            if byte < 0x80, c.isLetter || c.isNumber || c == "." || c == "_" || c == "-" || c == "@" {
                name.append(c)
            } else {
                name += String(format: "%%%02X", byte)
            }
        }
        if name.hasPrefix(".") { name = "%2E" + name.dropFirst() }
        // File names are at most 255 bytes: a long identifier keeps a readable prefix and a
        // digest of the whole identifier, so it still names one file, always the same.
        if name.utf8.count > 200 {
            let digest = SHA256.hash(Array(identifier.value.utf8)).prefix(16).map { String(format: "%02x", $0) }
            name = String(name.prefix(120)) + "~" + digest.joined()
        }
        return name + ".vcf"
    }

    /// The `.vcf` files in the directory.
    public func files() throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: directory.path).filter {
            $0.hasSuffix(".vcf") && !$0.hasPrefix(".")
        }.sorted()
    }

    private func write(_ text: String, to name: String) throws {
        let final = directory.appendingPathComponent(name)
        let temp = directory.appendingPathComponent(".\(name).\(UUID().uuidString).tmp")
        try Data(text.utf8).write(to: temp)
        guard rename(temp.path, final.path) == 0 else {
            let code = errno
            try? FileManager.default.removeItem(at: temp)
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: final.path, "errno": code])
        }
    }

    private func removeFile(_ name: String) throws {
        let path = directory.appendingPathComponent(name).path
        // A name that cannot exist (too long) was never written: removing it is done.
        guard unlink(path) == 0 || errno == ENOENT || errno == ENAMETOOLONG else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: path])
        }
    }

    public func beginFullEnumeration() throws {
        let names = Set(try files())
        // Kept on disk too, with the start time, so a host resuming after a crash still removes
        // the files that the enumeration does not write.
        let record = ["\(Date().timeIntervalSince1970)"] + names.sorted()
        try Data(record.joined(separator: "\n").utf8).write(to: staleFile, options: .atomic)
        // After the list: a crash between the two leaves names of an earlier enumeration marked
        // written, which keeps files, never removes one.
        try? FileManager.default.removeItem(at: writtenFile)
        stale.withLock { $0 = names }
    }

    public func update(_ items: [ContactItem]) throws {
        let enumerating = stale.withLock { $0 != nil } || FileManager.default.fileExists(atPath: staleFile.path)
        var written: [String] = []
        defer { if enumerating { noteWritten(written) } }
        for item in items {
            let name = Self.fileName(for: item.identifier)
            do {
                try write(VCard.serialize(item.contact, uid: item.identifier.value), to: name)
            } catch {
                // One contact that cannot be written must not hold up the others (or every later
                // change): report it and go on.
                let reason = (error as NSError).userInfo["errno"].flatMap { $0 as? Int32 }.map {
                    String(cString: strerror($0))
                }
                FileHandle.standardError.write(
                    Data("trellis: warning: cannot write \(name): \(reason ?? "\(error)"); skipped\n".utf8))
            }
            _ = stale.withLock { $0?.remove(name) }
            written.append(name)
        }
    }

    /// Appends `names` to ``writtenFile``. A batch cut short by a crash is delivered again by the
    /// resuming host (it resumes after the last batch it finished), so the names of a batch are
    /// appended once it is written. Without the file, a resumed enumeration would remove them.
    private func noteWritten(_ names: [String]) {
        guard !names.isEmpty else { return }
        let fd = open(writtenFile.path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return }
        defer { close(fd) }
        let bytes = Array((names.joined(separator: "\n") + "\n").utf8)
        _ = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
    }

    public func delete(_ identifiers: [ContactItem.Identifier]) throws {
        for id in identifiers { try removeFile(Self.fileName(for: id)) }
    }

    public func finishFullEnumeration() throws {
        var names = stale.withLock { $0 }
        if names == nil, let text = try? String(contentsOf: staleFile, encoding: .utf8) {
            // A resumed enumeration (this mirror did not begin it): the names present at its
            // start, after the line of its start time, less those written since. Written
            // names are read from ``writtenFile``, not judged by modification times: a file
            // renamed into place within a tick of the start can carry an earlier time.
            var lines = text.split(separator: "\n").map(String.init)
            if let first = lines.first, Double(first) != nil { lines.removeFirst() }
            var present = Set(lines)
            if let written = try? String(contentsOf: writtenFile, encoding: .utf8) {
                present.subtract(written.split(separator: "\n").map(String.init))
            }
            names = present
        }
        for name in names ?? [] { try removeFile(name) }
        stale.withLock { $0 = nil }
        try? FileManager.default.removeItem(at: staleFile)
        try? FileManager.default.removeItem(at: writtenFile)
    }

    public func removeAll() throws {
        for name in try files() { try removeFile(name) }
        stale.withLock { $0 = nil }
        try? FileManager.default.removeItem(at: staleFile)
        try? FileManager.default.removeItem(at: writtenFile)
    }
}
