public import TrellisCore

/// The site pins file (`DIR/site-pins`): one pin a line, `SITE KEY` (the site ID as 16 hex
/// digits, one space, the 32-byte peer key as 64 hex digits), least recently seen first; blank
/// lines and lines starting with `#` are ignored (docs/SECURITY.md, "Site IDs").
public enum SitePinFile {
    /// Largest site pins file read, bytes (10,000 pins take about 820 kB).
    public static let maxBytes = 2 << 20

    /// Reads a site pins file's text.
    ///
    /// - Parameters:
    ///   - text: the file's content.
    ///   - path: the file, for messages.
    /// - Returns: the pins in file order.
    /// - Throws: ``AuthorizationError`` naming the path and line of a malformed line or a site
    ///   pinned twice.
    /// - Complexity: O(n) in the text's length.
    public static func parse(_ text: String, path: String) throws(AuthorizationError) -> [SitePin] {
        var pins: [SitePin] = []
        var sites = Set<SiteID>()
        for (index, line) in contentLines(of: text) {
            func bad(_ problem: String) -> AuthorizationError {
                AuthorizationError(
                    "\(path) line \(index + 1): \(problem) (each line is `SITE KEY`: 16 hex digits, a space, 64 hex digits)"
                )
            }
            let parts = line.split(separator: " ", omittingEmptySubsequences: false)
            guard parts.count == 2 else { throw bad("expected two fields") }
            guard parts[0].utf8.count == 16, let site = UInt64(parts[0], radix: 16) else {
                throw bad("'\(parts[0])' is not a site ID")
            }
            guard let key = PinFile.peerKey(hex: String(parts[1])) else { throw bad("'\(parts[1])' is not a peer key") }
            guard sites.insert(site).inserted else { throw bad("site \(parts[0]) is pinned twice") }
            pins.append(SitePin(site: site, peerKey: key))
        }
        return pins
    }

    /// The site pins file's text for `pins`, with a comment saying what it is.
    public static func render(_ pins: [SitePin]) -> String {
        var text = "# Trellis site pins: each site ID (SITE) is bound to the peer key (KEY) that first presented it.\n"
        for pin in pins {
            let hex = String(pin.site, radix: 16)
            text += String(repeating: "0", count: 16 - hex.count) + hex + " " + PeerInfo.hex(pin.peerKey) + "\n"
        }
        return text
    }
}
