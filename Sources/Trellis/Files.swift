public import Foundation
public import TrellisCrypto

/// A file-system problem, described in one line with the path and the system's reason.
public struct FileError: Error, Sendable, CustomStringConvertible {
    public var description: String
    /// Whether the error concerns one record that the reader has moved past, so that reading on
    /// gives the records after it (``DocumentFileReader``: a document that does not parse or is
    /// not an object); `false` when the file cannot be read on.
    public var recoverable: Bool
    init(_ description: String, recoverable: Bool = false) {
        self.description = description
        self.recoverable = recoverable
    }
}

/// Small, exact file helpers whose errors name the path and say what is wrong (Foundation's
/// file errors print as multi-line `NSError` dumps on Linux).
public enum Files {
    /// Reads a whole regular file.
    ///
    /// - Throws: ``FileError``: missing, a directory, unreadable, or a read error, with the path.
    public static func read(_ path: String) throws(FileError) -> Data {
        let (fd, _) = try openForReading(path)
        defer { close(fd) }
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw FileError("cannot read \(path): \(String(cString: strerror(errno)))")
            }
            if n == 0 { break }
            data.append(contentsOf: buffer[0..<n])
        }
        return data
    }

    /// Opens a file that is not a directory for reading.
    ///
    /// - Returns: the descriptor (the caller closes it) and the file's size in bytes.
    /// - Throws: ``FileError``: missing, a directory, or unreadable, with the path.
    public static func openForReading(_ path: String) throws(FileError) -> (fd: Int32, size: Int) {
        var info = stat()
        guard stat(path, &info) == 0 else {
            throw FileError("cannot read \(path): \(String(cString: strerror(errno)))")
        }
        if info.st_mode & S_IFMT == S_IFDIR { throw FileError("cannot read \(path): it is a directory") }
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw FileError("cannot read \(path): \(String(cString: strerror(errno)))") }
        return (fd, Int(info.st_size))
    }

    /// Creates a directory (and its parents) unless it exists.
    ///
    /// - Throws: ``FileError`` when the path exists as something else or cannot be created.
    public static func makeDirectory(_ path: String) throws(FileError) {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) {
            guard isDirectory.boolValue else { throw FileError("\(path) exists and is not a directory") }
            return
        }
        do {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        } catch {
            throw FileError("cannot create directory \(path): \(reason(error))")
        }
    }

    /// The system's reason inside a Foundation error, in one line.
    static func reason(_ error: any Error) -> String {
        let ns = error as NSError
        if let underlying = ns.userInfo[NSUnderlyingErrorKey] as? NSError, underlying.domain == NSPOSIXErrorDomain {
            return String(cString: strerror(Int32(underlying.code)))
        }
        return ns.localizedDescription.replacingOccurrences(of: "\n", with: " ")
    }
}

extension Files {
    /// The largest secret file read, bytes: a key file holds 32 bytes or 64 hex digits, so
    /// anything much larger is not a key file.
    static let maxSecretFileBytes = 4_096

    /// The temporary file ``writeSecret(_:to:)`` writes before renaming it over `path`.
    static func secretTemporary(_ path: String) -> String { path + ".tmp" }

    /// Writes a secret file (identity key, mesh key): mode 0600 from its creation, atomically.
    ///
    /// The bytes go to `PATH.tmp`, created with `O_EXCL` and mode 0600 (a leftover one from an
    /// interrupted write is removed first), which is fsynced, renamed over `path`, and the directory
    /// fsynced. A crash at any point leaves either the old file whole or the new one whole, never
    /// an empty or partial key.
    ///
    /// - Parameters:
    ///   - secret: the file's content; the caller wipes it.
    ///   - path: the file to create or replace.
    /// - Throws: ``FileError`` naming the path and the system's reason.
    public static func writeSecret(_ secret: UnsafeRawBufferPointer, to path: String) throws(FileError) {
        func failure(_ action: String, _ file: String) -> FileError {
            FileError("cannot \(action) \(file): \(String(cString: strerror(errno)))")
        }
        let temporary = secretTemporary(path)
        guard unlink(temporary) == 0 || errno == ENOENT else { throw failure("remove the leftover", temporary) }
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw failure("create", temporary) }
        var written = 0
        var problem: FileError?
        if fchmod(fd, 0o600) != 0 { problem = failure("set mode 0600 on", temporary) }
        while problem == nil, written < secret.count {
            let n = Glibc.write(fd, secret.baseAddress! + written, secret.count - written)
            if n < 0 {
                if errno == EINTR { continue }
                problem = failure("write", temporary)
            } else {
                written += n
            }
        }
        if problem == nil, fsync(fd) != 0 { problem = failure("fsync", temporary) }
        if close(fd) != 0, problem == nil { problem = failure("close", temporary) }
        if problem == nil, rename(temporary, path) != 0 { problem = failure("rename \(temporary) to", path) }
        if let problem {
            unlink(temporary)
            throw problem
        }
        let directory = (path as NSString).deletingLastPathComponent
        let dirfd = open(directory.isEmpty ? "." : directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dirfd >= 0 else { throw failure("open the directory", directory.isEmpty ? "." : directory) }
        defer { close(dirfd) }
        guard fsync(dirfd) == 0 else { throw failure("fsync the directory", directory.isEmpty ? "." : directory) }
    }

    /// Reads a secret file (identity key, mesh key) into wiped-on-release memory, refusing one
    /// that others may read or change.
    ///
    /// - Parameters:
    ///   - path: the file.
    ///   - what: what the file is, for messages ("mesh key file").
    ///   - maxBytes: the largest content accepted.
    /// - Returns: the whole content (at most `maxBytes` bytes); the read buffer is wiped.
    /// - Throws: ``FileError`` when the file is missing, not a regular file, readable or writable
    ///   by group or others (the message gives its mode and `chmod 600 PATH`), larger than
    ///   `maxBytes`, or cannot be read.
    public static func readSecret(_ path: String, what: String, maxBytes: Int = 4_096) throws(FileError)
        -> SecretBytes
    {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw FileError("cannot read \(what) \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            throw FileError("cannot read \(what) \(path): \(String(cString: strerror(errno)))")
        }
        guard info.st_mode & S_IFMT == S_IFREG else {
            let kind = info.st_mode & S_IFMT == S_IFDIR ? "it is a directory" : "it is not a regular file"
            throw FileError("cannot read \(what) \(path): \(kind); give the key file's path")
        }
        let mode = info.st_mode & 0o777
        guard mode & 0o077 == 0 else {
            throw FileError(
                "\(what) \(path) has mode \(String(mode, radix: 8).leftPadded(to: 4)): group or others may read or "
                    + "change it, so it is refused; keep it private with `chmod 600 \(path)` (and check who saw it)")
        }
        var buffer = [UInt8](repeating: 0, count: maxBytes + 1)
        defer { Sodium.wipe(&buffer) }
        var count = 0
        while count < buffer.count {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress! + count, $0.count - count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw FileError("cannot read \(what) \(path): \(String(cString: strerror(errno)))")
            }
            if n == 0 { break }
            count += n
        }
        guard count <= maxBytes else {
            throw FileError("\(what) \(path) is larger than \(maxBytes) bytes; it is not a \(what)")
        }
        return SecretBytes(count: count) { out in
            buffer.withUnsafeBytes { out.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0.prefix(count))) }
        }
    }
}

extension String {
    /// The string with leading zeros up to `width` characters (file modes: `0644`).
    fileprivate func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}

/// An exclusive lock on a data directory (`flock` on `DIR/lock`), held while the value lives:
/// two processes writing one store would issue the same `seq` twice.
public final class DataDirectoryLock: Sendable {
    private let fd: Int32

    /// Takes the lock.
    ///
    /// - Throws: ``FileError`` when another process holds it, or the lock file cannot be opened.
    public init(directory: String) throws(FileError) {
        let path = (directory as NSString).appendingPathComponent("lock")
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw FileError("cannot open \(path): \(String(cString: strerror(errno)))") }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            close(fd)
            throw FileError(
                "data directory \(directory) is in use by another trellis process; stop it, or work through it "
                    + "(a shell peer, or `trellis find`/`get`, which only read)")
        }
        self.fd = fd
    }

    deinit { close(fd) }
}
