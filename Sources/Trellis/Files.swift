public import Foundation

/// A file-system problem, described in one line with the path and the system's reason.
public struct FileError: Error, Sendable, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}

/// Small, exact file helpers whose errors name the path and say what is wrong (Foundation's
/// file errors print as multi-line `NSError` dumps on Linux).
public enum Files {
    /// Reads a whole regular file.
    ///
    /// - Throws: ``FileError``: missing, a directory, unreadable, or a read error, with the path.
    public static func read(_ path: String) throws(FileError) -> Data {
        var info = stat()
        guard stat(path, &info) == 0 else {
            throw FileError("cannot read \(path): \(String(cString: strerror(errno)))")
        }
        if info.st_mode & S_IFMT == S_IFDIR { throw FileError("cannot read \(path): it is a directory") }
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { throw FileError("cannot read \(path): \(String(cString: strerror(errno)))") }
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
