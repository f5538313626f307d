/// Limits on inbound connections before they proved the mesh key (docs/SECURITY.md, "Before
/// authentication").
///
/// An inbound connection is **unproved** from accept until its first handshake message
/// authenticates under a mesh key this node holds (with `Noise_XXpsk0` that is message 1, before
/// the node does any DH with its static key), then **proved** until the handshake ends.
public struct PreAuthLimits: Sendable, Equatable {
    /// Unproved connections at once from one source (an IPv4 address, or an IPv6 /64). A new
    /// connection from a source at the limit cuts that source's oldest unproved connection.
    public var perSource = 4
    /// Unproved connections at once from all sources. A new connection beyond it cuts the oldest
    /// unproved connection of the source holding the most.
    public var total = 64
    /// How long message 1 may take to arrive after accept.
    public var firstMessageTimeout: Duration = .seconds(2)
    /// Proved handshakes in progress at once (their peers hold the mesh key); connections that
    /// prove a key beyond it are closed.
    public var proved = 64

    /// The defaults: 4 per source, 64 in all, 2 s for message 1, 64 proved.
    public init() {}
}

/// What the accept path did with inbound connections before authentication, since the node
/// started (``MeshNetwork/preAuthCounters``; shown by `status`).
public struct PreAuthCounters: Sendable, Equatable, CustomStringConvertible {
    /// Inbound connections accepted.
    public var accepted = 0
    /// Unproved connections cut to make room for a newer one (per-source or total limit).
    public var evicted = 0
    /// Connections closed because message 1 did not arrive in time.
    public var firstMessageTimeouts = 0
    /// Connections whose message 1 authenticated under no mesh key held (or used an older protocol).
    public var wrongKey = 0
    /// Proved connections refused because ``PreAuthLimits/proved`` handshakes were in progress.
    public var provedRefused = 0
    /// Handshakes that failed otherwise (malformed messages, a peer that hung up, the whole
    /// handshake's deadline).
    public var failed = 0
    /// Handshakes that completed.
    public var completed = 0

    /// - Parameters: the counts, each ≥ 0; all default to 0.
    public init(
        accepted: Int = 0, evicted: Int = 0, firstMessageTimeouts: Int = 0, wrongKey: Int = 0, provedRefused: Int = 0,
        failed: Int = 0, completed: Int = 0
    ) {
        self.accepted = accepted
        self.evicted = evicted
        self.firstMessageTimeouts = firstMessageTimeouts
        self.wrongKey = wrongKey
        self.provedRefused = provedRefused
        self.failed = failed
        self.completed = completed
    }

    /// One line: `inbound handshakes: 12 accepted, 9 completed, 1 cut for room, ...`.
    public var description: String {
        let parts: [String] = [
            "\(accepted) accepted", "\(completed) completed", "\(evicted) cut to make room",
            "\(firstMessageTimeouts) without message 1 in time", "\(wrongKey) under another mesh key or protocol",
            "\(provedRefused) refused as too many", "\(failed) failed otherwise",
        ]
        return "inbound handshakes: " + parts.joined(separator: ", ")
    }
}

/// The bookkeeping of ``PreAuthLimits``: which inbound connections are unproved, per source, in
/// arrival order. Pure: the caller closes the connections it is told to evict.
struct PreAuthTable {
    let limits: PreAuthLimits
    private var nextID = 0
    /// Unproved connection ids per source, oldest first.
    private var unproved: [String: [Int]] = [:]
    private var unprovedCount = 0
    private var sourceOf: [Int: String] = [:]
    /// Proved handshakes in progress.
    private(set) var provedCount = 0

    init(limits: PreAuthLimits) { self.limits = limits }

    /// Unproved connections in the table.
    var unprovedTotal: Int { unprovedCount }

    /// Unproved connections from `source`.
    func unproved(from source: String) -> Int { unproved[source]?.count ?? 0 }

    /// Admits a new connection from `source`.
    ///
    /// - Returns: the new connection's id, and the id of an older unproved connection to close
    ///   (already removed from the table) when a limit was reached.
    /// - Complexity: O(sources) when the total limit is reached, else O(1) amortized.
    mutating func admit(source: String) -> (id: Int, evict: Int?) {
        var evict: Int?
        if unproved(from: source) >= max(1, limits.perSource) {
            evict = unproved[source]?.first
        } else if unprovedCount >= max(1, limits.total) {
            // The source holding the most; among equals, the one whose oldest is oldest.
            let victim = unproved.max { a, b in
                a.value.count != b.value.count ? a.value.count < b.value.count : a.value[0] > b.value[0]
            }
            evict = victim?.value.first
        }
        if let evict { remove(evict) }
        let id = nextID
        nextID += 1
        unproved[source, default: []].append(id)
        sourceOf[id] = source
        unprovedCount += 1
        return (id, evict)
    }

    /// What ``prove(_:)`` did.
    enum ProveOutcome: Equatable {
        /// The connection counts as proved until ``finish(_:proved:)``.
        case proved
        /// ``PreAuthLimits/proved`` handshakes are in progress: close it (it is forgotten).
        case overLimit
        /// It was evicted before: it is closed already.
        case evicted
    }

    /// Connection `id` proved a mesh key: it leaves the unproved set.
    mutating func prove(_ id: Int) -> ProveOutcome {
        guard remove(id) else { return .evicted }
        guard provedCount < max(1, limits.proved) else { return .overLimit }
        provedCount += 1
        return .proved
    }

    /// A connection ended (handshake done or failed).
    ///
    /// - Parameters:
    ///   - id: its id.
    ///   - proved: whether ``prove(_:)`` accepted it.
    mutating func finish(_ id: Int, proved: Bool) {
        if proved {
            provedCount -= 1
        } else {
            remove(id)
        }
    }

    /// Whether `id` is still unproved in the table (false once evicted).
    func isUnproved(_ id: Int) -> Bool { sourceOf[id] != nil }

    @discardableResult
    private mutating func remove(_ id: Int) -> Bool {
        guard let source = sourceOf.removeValue(forKey: id) else { return false }
        unproved[source]?.removeAll { $0 == id }
        if unproved[source]?.isEmpty == true { unproved[source] = nil }
        unprovedCount -= 1
        return true
    }

    /// The source an address is counted under: an IPv4 address as is (an IPv4-mapped IPv6 address
    /// as its IPv4 address), an IPv6 address by its first 64 bits.
    ///
    /// - Parameter host: a numeric address as `getnameinfo` prints it (no port, no brackets; an
    ///   IPv6 zone suffix `%if` is ignored).
    /// - Returns: the source key.
    static func source(of host: String) -> String {
        var host = host
        if let percent = host.firstIndex(of: "%") { host = String(host[..<percent]) }
        guard host.contains(":") else { return host }
        let lower = host.lowercased()
        if lower.hasPrefix("::ffff:"), lower.contains(".") { return String(host.dropFirst(7)) }
        guard let groups = expandIPv6(lower) else { return lower }
        return groups.prefix(4).map { String($0, radix: 16) }.joined(separator: ":") + "::/64"
    }

    /// The eight 16-bit groups of an IPv6 address in text form, or nil when it is not one.
    static func expandIPv6(_ text: String) -> [UInt16]? {
        let halves = text.components(separatedBy: "::")
        guard halves.count <= 2 else { return nil }
        func groups(_ part: String) -> [UInt16]? {
            if part.isEmpty { return [] }
            var out: [UInt16] = []
            for piece in part.split(separator: ":", omittingEmptySubsequences: false) {
                if piece.contains(".") {
                    let bytes = piece.split(separator: ".").compactMap { UInt8($0) }
                    guard bytes.count == 4 else { return nil }
                    out.append(UInt16(bytes[0]) << 8 | UInt16(bytes[1]))
                    out.append(UInt16(bytes[2]) << 8 | UInt16(bytes[3]))
                } else {
                    guard piece.count <= 4, let value = UInt16(piece, radix: 16) else { return nil }
                    out.append(value)
                }
            }
            return out
        }
        guard let head = groups(halves[0]) else { return nil }
        if halves.count == 1 { return head.count == 8 ? head : nil }
        guard let tail = groups(halves[1]), head.count + tail.count < 8 else { return nil }
        return head + [UInt16](repeating: 0, count: 8 - head.count - tail.count) + tail
    }
}
