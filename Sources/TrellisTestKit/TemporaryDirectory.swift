public import Foundation
import Synchronization

/// A fresh directory under the system temporary directory, removed when the value is dropped.
public final class TemporaryDirectory: Sendable {
    public let url: URL

    public init(_ prefix: String = "trellis-test") {
        url = FileManager.default.temporaryDirectory
            .appendingPathComponent("\(prefix)-\(UUID().uuidString)")
        try? FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    /// A path inside the directory.
    public func path(_ name: String) -> String { url.appendingPathComponent(name).path }

    deinit { try? FileManager.default.removeItem(at: url) }
}

/// A clock for tests: milliseconds that only move when told to.
public final class ManualClock: Sendable {
    private let millis: Atomic<UInt64>

    public init(startingAt start: UInt64 = 1_700_000_000_000) { millis = Atomic(start) }

    /// The current time in milliseconds.
    public var now: UInt64 { millis.load(ordering: .relaxed) }

    /// Moves the clock forward.
    public func advance(by delta: UInt64) { millis.add(delta, ordering: .relaxed) }

    /// Sets the clock (it may move backwards, to test skew).
    public func set(_ value: UInt64) { millis.store(value, ordering: .relaxed) }

    /// A `now` closure for ``StoreOptions``.
    public var source: @Sendable () -> UInt64 { { [self] in now } }
}

/// Locations in the repository, found from this source file.
public enum Repository {
    /// The package root.
    public static let root: URL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// `Tests/Vectors`: the published Noise and CBOR test vectors.
    public static let vectors: URL = root.appendingPathComponent("Tests/Vectors")

    /// The built `trellis` executable: `$TRELLIS_BIN`, or `.build/debug/trellis`.
    public static var trellisBinary: URL {
        if let env = ProcessInfo.processInfo.environment["TRELLIS_BIN"] { return URL(fileURLWithPath: env) }
        return root.appendingPathComponent(".build/debug/trellis")
    }

    /// A built executable of the package beside ``trellisBinary``, such as an example
    /// (`Examples/ChatRoom` builds `ChatRoom`).
    public static func example(_ name: String) -> URL {
        trellisBinary.deletingLastPathComponent().appendingPathComponent(name)
    }

    /// The Python interpreter with the test packages: `$TRELLIS_PYTHON`, `.venv/bin/python`, or `python3`.
    public static var python: String {
        if let env = ProcessInfo.processInfo.environment["TRELLIS_PYTHON"] { return env }
        let venv = root.appendingPathComponent(".venv/bin/python").path
        return FileManager.default.isExecutableFile(atPath: venv) ? venv : "/usr/bin/env python3"
    }
}
