public import Foundation
public import TrellisCore
import TrellisSync

/// Authorization: who may read and write which collection, and the site IDs bound to peer keys
/// (docs/SECURITY.md, "Authorization" and "Site IDs").
extension TrellisNode {
    /// The site pins file, in the data directory (``SitePinFile``).
    public static let sitePinsFileName = "site-pins"

    /// Who may read and write which collection (``NodeOptions/authorization``).
    public var authorization: Authorization { engine.authorization }

    /// Replaces the authorization rules at once. Sessions stay open: each peer's subscriptions
    /// are checked again (a revoked read is answered `suberr forbidden` and no more of it is sent;
    /// a granted one is served from the peer's checkpoint), and what each peer is asked for is
    /// recomputed (a collection a peer may no longer write is no longer asked of it, and what it
    /// still sends of it is refused; once it may write again it is asked from the checkpoint
    /// stored before, so nothing it may send is lost).
    ///
    /// - Parameter rules: the new rules.
    public func setAuthorization(_ rules: Authorization) { engine.setAuthorization(rules) }

    /// What the rules and site pins refused since the node started: subscriptions, batches and
    /// their documents, sessions presenting another key's site ID.
    public var authorizationRefusals: AuthorizationRefusals { engine.authorizationRefusals }

    /// The site IDs bound to peer keys (this node's own included), least recently seen first.
    public var sitePins: [SitePin] { engine.sitePins }

    /// Reads the site pins file; a missing one holds no pins.
    ///
    /// - Throws: ``FileError`` when others may change it or it cannot be read,
    ///   ``AuthorizationError`` for a bad line.
    static func readSitePins(_ path: String) throws -> [SitePin] {
        guard let text = try readPrivateText(path, what: "site pins file", maxBytes: SitePinFile.maxBytes) else {
            return []
        }
        return try SitePinFile.parse(text, path: path)
    }

    /// Writes the site pins file as key files are written: mode 0600, atomically.
    static func writeSitePins(_ pins: [SitePin], to path: String) throws {
        try writePrivateText(SitePinFile.render(pins), to: path)
    }
}

extension Authorization {
    /// Reads a rules file (``init(json:)``).
    ///
    /// - Parameter file: the rules file; group or others must not be able to change it.
    /// - Throws: ``AuthorizationError`` naming the file and the problem: missing or unreadable,
    ///   writable by group or others (with the `chmod` fix), larger than 1 MiB, or not valid rules
    ///   (where in the file, and what).
    public init(contentsOf file: URL) throws(AuthorizationError) {
        var info = stat()
        guard stat(file.path, &info) == 0 else {
            throw AuthorizationError("rules file \(file.path): \(String(cString: strerror(errno)))")
        }
        guard info.st_mode & S_IFMT == S_IFREG else {
            throw AuthorizationError("rules file \(file.path) is not a regular file")
        }
        guard info.st_mode & 0o022 == 0 else {
            throw AuthorizationError(
                "rules file \(file.path) has mode \(String(info.st_mode & 0o777, radix: 8)): group or others may change "
                    + "it, so it is refused; fix it with `chmod go-w \(file.path)`")
        }
        guard Int(info.st_size) <= Self.maxFileBytes else {
            throw AuthorizationError("rules file \(file.path) is larger than \(Self.maxFileBytes) bytes")
        }
        let data: Data
        do { data = try Files.read(file.path) } catch { throw AuthorizationError("\(error)") }
        do { try self.init(json: String(decoding: data, as: UTF8.self)) } catch {
            throw AuthorizationError("rules file \(file.path): \(error)")
        }
    }
}
