import Foundation
import Testing
import TrellisCrypto
import TrellisTestKit

@testable import Trellis

/// Key files (`identity.key`, mesh key files): private, written atomically, refused with a fix
/// when others may read them, and refused clearly when empty or cut short.
@Suite struct KeyFileTests {
    let dir = TemporaryDirectory()

    func mode(_ path: String) -> mode_t {
        var info = stat()
        _ = stat(path, &info)
        return info.st_mode & 0o777
    }

    func write(_ bytes: [UInt8], to path: String, mode: mode_t) throws {
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        chmod(path, mode)
    }

    /// A mesh key file with mode 0644 is refused; the message names the file, its mode and the
    /// fix, and the fix works.
    @Test func aMeshKeyFileReadableByOthersIsRefusedWithTheFix() throws {
        let path = dir.path("mesh.key")
        try MeshKey.generate().write(to: URL(fileURLWithPath: path))
        #expect(mode(path) == 0o600)
        chmod(path, 0o644)
        let error = #expect(throws: MeshKeyError.self) { try MeshKey(contentsOf: URL(fileURLWithPath: path)) }
        let message = error?.description ?? ""
        #expect(message.contains(path))
        #expect(message.contains("0644"))
        #expect(message.contains("chmod 600 \(path)"))
        chmod(path, 0o600)
        _ = try MeshKey(contentsOf: URL(fileURLWithPath: path))
    }

    /// The same for the identity key, and for a group-writable file.
    @Test(arguments: [0o644, 0o620, 0o604, 0o660] as [mode_t])
    func anIdentityKeyFileOthersMayTouchIsRefused(_ bad: mode_t) throws {
        let path = dir.path("identity-\(bad).key")
        let first = try TrellisNode.loadOrCreateIdentity(URL(fileURLWithPath: path))
        #expect(mode(path) == 0o600)
        chmod(path, bad)
        let error = #expect(throws: MeshKeyError.self) {
            try TrellisNode.loadOrCreateIdentity(URL(fileURLWithPath: path))
        }
        #expect(error?.description.contains("chmod 600 \(path)") == true)
        #expect(error?.description.contains("0" + String(bad, radix: 8)) == true)
        chmod(path, 0o600)
        #expect(try TrellisNode.loadOrCreateIdentity(URL(fileURLWithPath: path)).publicKey == first.publicKey)
    }

    /// Empty and truncated key files get a clear error, not a crash.
    @Test func emptyAndTruncatedKeyFilesAreRefusedClearly() throws {
        let identity = dir.path("identity.key")
        try write([], to: identity, mode: 0o600)
        let empty = #expect(throws: MeshKeyError.self) {
            try TrellisNode.loadOrCreateIdentity(URL(fileURLWithPath: identity))
        }
        #expect(empty?.description.contains("empty") == true)
        try write([UInt8](repeating: 7, count: 17), to: identity, mode: 0o600)
        let cut = #expect(throws: MeshKeyError.self) {
            try TrellisNode.loadOrCreateIdentity(URL(fileURLWithPath: identity))
        }
        #expect(cut?.description.contains("17 bytes") == true)

        let mesh = dir.path("mesh.key")
        for content in [[], Array("0123456789abcdef0123".utf8), Array(repeating: UInt8(ascii: "z"), count: 64)] {
            try write(content, to: mesh, mode: 0o600)
            let error = #expect(throws: MeshKeyError.self) { try MeshKey(contentsOf: URL(fileURLWithPath: mesh)) }
            #expect(error?.description.contains(mesh) == true)
            #expect(error?.description.contains("trellis keygen") == true)
        }
        try write(Array(repeating: 0x30, count: 64) + [0x0A], to: mesh, mode: 0o600)
        let zero = #expect(throws: MeshKeyError.self) { try MeshKey(contentsOf: URL(fileURLWithPath: mesh)) }
        #expect(zero?.description.contains("all-zero") == true)
    }

    /// Hex (with surrounding whitespace) and raw 32-byte mesh key files both load, and `write`
    /// round-trips.
    @Test func meshKeyFilesRoundTrip() throws {
        let key = MeshKey.generate()
        let path = dir.path("round.key")
        try key.write(to: URL(fileURLWithPath: path))
        #expect(try MeshKey(contentsOf: URL(fileURLWithPath: path)).secret == key.secret)
        let text = try String(contentsOfFile: path, encoding: .utf8)
        #expect(text.count == 65 && text.hasSuffix("\n"))
        try write(Array(("  \n" + text + "\t").utf8), to: path, mode: 0o400)
        #expect(try MeshKey(contentsOf: URL(fileURLWithPath: path)).secret == key.secret)
        try write(key.secret.copyBytes(), to: path, mode: 0o600)
        #expect(try MeshKey(contentsOf: URL(fileURLWithPath: path)).secret == key.secret)
    }

    /// A crash between writing the temporary file and renaming it leaves the old key intact:
    /// the leftover temporary (here holding a cut-short new key) is ignored and removed, and a
    /// later write replaces the key whole.
    @Test func aCrashBeforeTheRenameLeavesTheOldKeyIntact() throws {
        let identity = dir.path("identity.key")
        let old = try TrellisNode.loadOrCreateIdentity(URL(fileURLWithPath: identity))
        let leftover = Files.secretTemporary(identity)
        try write([1, 2, 3], to: leftover, mode: 0o600)
        #expect(try TrellisNode.loadOrCreateIdentity(URL(fileURLWithPath: identity)).publicKey == old.publicKey)
        #expect(!FileManager.default.fileExists(atPath: leftover))

        let mesh = dir.path("mesh.key")
        let oldMesh = MeshKey.generate()
        try oldMesh.write(to: URL(fileURLWithPath: mesh))
        try write(Array("0123".utf8), to: Files.secretTemporary(mesh), mode: 0o644)
        #expect(try MeshKey(contentsOf: URL(fileURLWithPath: mesh)).secret == oldMesh.secret)
        // The next write goes through the leftover (removed first, then created with O_EXCL).
        let newMesh = MeshKey.generate()
        try newMesh.write(to: URL(fileURLWithPath: mesh))
        #expect(try MeshKey(contentsOf: URL(fileURLWithPath: mesh)).secret == newMesh.secret)
        #expect(mode(mesh) == 0o600)
        #expect(!FileManager.default.fileExists(atPath: Files.secretTemporary(mesh)))
    }

    /// The file is private even under a permissive umask, and a symlink planted at the temporary
    /// name is not followed.
    @Test func writesArePrivateAndDoNotFollowAPlantedLink() throws {
        let previous = umask(0)
        defer { umask(previous) }
        let path = dir.path("umask.key")
        try MeshKey.generate().write(to: URL(fileURLWithPath: path))
        #expect(mode(path) == 0o600)
        let target = dir.path("victim")
        try write([9], to: target, mode: 0o644)
        symlink(target, Files.secretTemporary(path))
        try MeshKey.generate().write(to: URL(fileURLWithPath: path))
        #expect(try Data(contentsOf: URL(fileURLWithPath: target)) == Data([9]))
        #expect(mode(path) == 0o600)
    }

    /// `trellis keygen` writes a private key file (through the same writer).
    @Test func keygenWritesAPrivateFile() throws {
        let path = dir.path("cli.key")
        let result = try TrellisProcess.run(["keygen", path])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(mode(path) == 0o600)
        _ = try MeshKey(contentsOf: URL(fileURLWithPath: path))
        chmod(path, 0o640)
        let node = try TrellisProcess.run(["node", "--data", dir.path("n"), "--mesh-key", path, "--no-discovery"])
        #expect(node.status != 0)
        #expect(node.stderr.contains("chmod 600 \(path)"), "\(node.stderr)")
    }
}
