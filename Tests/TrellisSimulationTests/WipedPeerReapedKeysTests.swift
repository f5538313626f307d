import Testing
import Trellis
import TrellisCore
import TrellisSimulation

/// A subscriber whose checkpoint on a peer counts in an older epoch of the peer's log (the peer's
/// store was wiped or rotated since) is served from 0; it holds the documents it got from the
/// peer's old log, so the peer's reaped tombstones must come too (docs/PROTOCOL.md §2 step 5).
/// Before, it was served from 0 without them whenever it had first asked the peer holding nothing
/// (its checkpoint said `notAsked`) or sent its subscriptions before reading the peer's hello (the
/// peer turned the old-epoch `since` into 0 and knew nothing of `h`): a stale copy of a document
/// removed and reaped in the peer's new log stayed live there (simulator seed 7900056).
///
/// R writes d1 and d2; W relays them to S, which subscribes to the whole collection and holds
/// both. S's link to W goes down. W crashes and comes back with a wiped store (a new epoch and
/// site ID), gets d1 and d2 again from R, and R removes d1: W and R both reap its tombstone after
/// the TTL. W then cancels its subscription (asking S for d1, W would get S's copy and remove it
/// again itself). R and S never meet; S's link to W comes back.
@Suite struct WipedPeerReapedKeysTests: StaleCopyChecks {
    static let ttl: Millis = 120_000

    /// Which of S and W dials the link between them.
    enum Dialer: String, CaseIterable, Sendable {
        /// S dials: it sends its subscriptions with the `resume` message, before it reads W's
        /// hello, each `since` with the epoch it counts in; W serves the old-epoch ones from 0.
        case stale
        /// W dials: S reads W's hello first and asks from 0 itself.
        case wiped
    }

    /// Promised (docs/MESH.md "Tombstones"): d1 shows nowhere once the mesh is quiet.
    ///
    /// Failed before with both dialers: S showed d1 for good.
    @Test(arguments: Dialer.allCases)
    func aStaleCopyFromAWipedPeersOldLogMeetsItsReapedRemove(dialer: Dialer) throws {
        let sim = try Simulation(seed: 9701 + UInt64(Dialer.allCases.firstIndex(of: dialer)!))
        sim.storeOptions.tombstoneTTL = UInt64(Self.ttl)
        let r = try sim.addNode("r")
        let w = try sim.addNode("w")
        let s = try sim.addNode("s")
        sim.connect(w, r)
        if dialer == .stale { sim.connect(s, w) } else { sim.connect(w, s) }
        // W's subscription lasts across its restart (the node subscribes again when it starts).
        let whole = try w.store.collection("items").findAll().subscribe()
        let sWhole = try s.store.collection("items").findAll().subscribe()
        try r.store.collection("items").upsert([["_id": "d1", "v": 1], ["_id": "d2", "v": 2]])
        try sim.runUntilQuiet()
        #expect(try Self.ids(s) == ["\"d1\"", "\"d2\""])

        sim.setLink(s, w, up: false)
        sim.crash(w)
        try sim.restart(w, wipe: true)
        try sim.runUntilQuiet()
        #expect(try Self.ids(w) == ["\"d1\"", "\"d2\""])
        try r.store.collection("items").findByID("d1").remove()
        sim.run(for: Self.ttl + 2 * 60_000)
        whole.cancel()
        #expect(try w.documents.state(id: "d1", in: "items") == nil, "W reaped d1's tombstone")
        #expect(try r.documents.state(id: "d1", in: "items") == nil, "R reaped d1's tombstone")

        sim.setLink(s, w, up: true)
        try sim.runUntilQuiet()
        for node in [r, w, s] {
            let shown = try Self.ids(node)
            #expect(shown == ["\"d2\""], "\(node.name) shows \(shown)")
        }
        try sim.check()
        _ = sWhole
    }
}
