import Foundation
import Synchronization
import Testing
import Trellis
import TrellisCore
import TrellisNet
import TrellisSync
import TrellisTestKit

/// Site IDs bound to peer keys with real nodes on loopback (docs/SECURITY.md, "Site IDs"): the
/// pins file, and a copied data directory under a new key refused by a node that knows its site.
@Suite struct SitePinTests {
    final class Lines: Sendable { let lines = Mutex<[String]>([]) }

    let dir = TemporaryDirectory("trellis-site-pins")
    let meshKey = MeshKey.generate()

    func node(_ name: String, log: Lines? = nil) throws -> TrellisNode {
        var options = NodeOptions()
        if let log { options.log = { line in log.lines.withLock { $0.append(line) } } }
        return try TrellisNode(directory: dir.url.appendingPathComponent(name), meshKey: meshKey, options: options)
    }

    /// Opens a node on a directory a closed node used, once that node has let it go.
    func reopen(_ name: String, log: Lines? = nil) throws -> TrellisNode {
        var opened: TrellisNode?
        var failure = ""
        _ = eventually {
            do { opened = try node(name, log: log) } catch { failure = "\(error)" }
            return opened != nil
        }
        guard let opened else { throw FileError(failure) }
        return opened
    }

    struct FileError: Error {
        var description: String
        init(_ d: String) { description = d }
    }

    @Test func aCopiedDataDirectoryUnderANewKeyIsRefusedByANodeThatKnowsItsSite() throws {
        let log = Lines()
        func logged(_ text: String) -> Bool { log.lines.withLock { $0.contains { $0.contains(text) } } }
        // The hub pins the original's site (in a scope of its own, so the hub lets its directory go).
        let (site, originalKey): (SiteID, String) = try {
            let hub = try node("hub", log: log)
            defer { hub.close() }
            let port = try hub.listen(on: Endpoint(host: "127.0.0.1", port: 0))
            let original = try node("original")
            defer { original.close() }
            let site = original.store.documents.siteID
            let sub = try hub.store.collection("items").findAll().subscribe()
            defer { sub.cancel() }
            try original.store.collection("items").upsert(["_id": "o1"])
            original.connect(to: Endpoint(host: "127.0.0.1", port: port))
            #expect(eventually { (try? hub.store.collection("items").findByID("o1").exec()) != nil })
            #expect(hub.sitePins.contains(SitePin(site: site, peerKey: original.identity.publicKey)))
            let pinsPath = dir.url.appendingPathComponent("hub/site-pins").path
            let text = try String(contentsOfFile: pinsPath, encoding: .utf8)
            #expect(text.contains(String(format: "%016llx", site) + " " + original.peerKeyHex + "\n"))
            #expect(try FileManager.default.attributesOfItem(atPath: pinsPath)[.posixPermissions] as? Int == 0o600)
            return (site, original.peerKeyHex)
        }()

        // A copy of the original's store under another existing identity (a device restored from
        // mixed backups): the same site ID, another key. (A copy whose site-pins bind its site to
        // its original's key takes a new site ID: aDataDirectoryUnderANewKeyTakesANewSiteIDOnceItsSiteWasSeen.)
        let cloneDir = dir.url.appendingPathComponent("clone")
        try FileManager.default.createDirectory(at: cloneDir, withIntermediateDirectories: true)
        try node("other").close()
        try FileManager.default.copyItem(
            at: dir.url.appendingPathComponent("other/identity.key"),
            to: cloneDir.appendingPathComponent("identity.key"))
        for suffix in ["", "-wal"] {
            let from = dir.url.appendingPathComponent("original/store.sqlite\(suffix)")
            if FileManager.default.fileExists(atPath: from.path) {
                try FileManager.default.copyItem(at: from, to: cloneDir.appendingPathComponent("store.sqlite\(suffix)"))
            }
        }
        let hub = try reopen("hub", log: log)  // the pins come back from the file
        let hubPort = try hub.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let clone = try node("clone")
        defer { clone.close() }
        #expect(clone.store.documents.siteID == site && clone.peerKeyHex != originalKey)
        clone.connect(to: Endpoint(host: "127.0.0.1", port: hubPort))
        #expect(
            eventually { logged("refused 127.0.0.1:") && logged("site ID \(site) is bound to peer key") },
            "\(log.lines.withLock { $0 })")
        #expect(hub.authorizationRefusals.sites >= 1)
        #expect(hub.peers.isEmpty)
        hub.close()
    }

    /// A node whose identity key was deleted (or a data directory copied without it) gets a new
    /// key; its site ID, pinned to the old key in its site-pins since it met a peer, is replaced:
    /// the old site stays the old key's. A store no peer ever saw (made by `trellis import`, say)
    /// keeps its site under its first key.
    @Test func aDataDirectoryUnderANewKeyTakesANewSiteIDOnceItsSiteWasSeen() throws {
        let (site, key): (SiteID, String) = try {
            let first = try node("first")
            defer { first.close() }
            let port = try first.listen(on: Endpoint(host: "127.0.0.1", port: 0))
            try first.store.collection("items").upsert(["_id": "f1"])
            let peer = try node("peer")
            defer { peer.close() }
            peer.connect(to: Endpoint(host: "127.0.0.1", port: port))
            #expect(eventually { first.sitePins.contains { $0.peerKey == peer.identity.publicKey } })
            return (first.store.documents.siteID, first.peerKeyHex)
        }()
        try FileManager.default.removeItem(at: dir.url.appendingPathComponent("first/identity.key"))
        let again = try reopen("first")
        defer { again.close() }
        #expect(again.peerKeyHex != key)
        #expect(again.store.documents.siteID != site)
        #expect(again.sitePins.contains { $0.site == site && $0.peerKey == TrellisNode.peerKey(hex: key) })
        #expect(try again.store.collection("items").findByID("f1").exec() != nil)

        let importedSite: SiteID = try {
            let imported = try node("imported")
            defer { imported.close() }
            try imported.store.collection("items").upsert(["_id": "i1"])
            return imported.store.documents.siteID
        }()
        try FileManager.default.removeItem(at: dir.url.appendingPathComponent("imported/identity.key"))
        let importedAgain = try reopen("imported")
        defer { importedAgain.close() }
        #expect(importedAgain.store.documents.siteID == importedSite)
    }

    @Test func aMalformedSitePinsFileStopsTheNodeNamingTheLine() throws {
        let path = dir.url.appendingPathComponent("bad")
        try FileManager.default.createDirectory(at: path, withIntermediateDirectories: true)
        let file = path.appendingPathComponent("site-pins").path
        try "# comment\n00000000000000zz \(String(repeating: "ab", count: 32))\n".write(
            toFile: file, atomically: true, encoding: .utf8)
        chmod(file, 0o600)
        #expect {
            _ = try node("bad")
        } throws: { error in
            "\(error)".contains("\(file) line 2: '00000000000000zz' is not a site ID")
        }
    }
}
