import ContactProvider
import Foundation
import Synchronization
import Testing
import TrellisContacts
import TrellisCore
import TrellisStore
import TrellisTestKit

/// A vdir mirror whose process dies (an `update` that throws) at the `crashAt`-th call of
/// `update`: the host saves nothing after it, as after kill -9. With `outsideContent`, only
/// updates made before a full enumeration begins count (crashes during change batches only).
final class CrashingSink: ContactSink {
    let inner: VdirMirror
    let crashAt: Int
    let outsideContent: Bool
    let updates = Mutex(0)
    let began = Mutex(false)

    init(_ inner: VdirMirror, crashAt: Int, outsideContent: Bool = false) {
        self.inner = inner
        self.crashAt = crashAt
        self.outsideContent = outsideContent
    }

    func beginFullEnumeration() throws {
        began.withLock { $0 = true }
        try inner.beginFullEnumeration()
    }
    func update(_ items: [ContactItem]) throws {
        let counts = !outsideContent || !began.withLock { $0 }
        let n = updates.withLock {
            if counts { $0 += 1 }
            return $0
        }
        if counts, n == crashAt { throw CocoaError(.fileWriteUnknown) }
        try inner.update(items)
    }
    func delete(_ identifiers: [ContactItem.Identifier]) throws { try inner.delete(identifiers) }
    func finishFullEnumeration() throws { try inner.finishFullEnumeration() }
    func removeAll() throws { try inner.removeAll() }
}

/// Attacks on the contacts enumerator, its host and the vdir mirror: after crashes, restarts,
/// expiry, merges, evictions and re-creations, the mirror must hold exactly one file per live
/// contact of the store, with the store's value.
@Suite struct ContactsMirrorBreakTests {
    /// The vdir's files must be exactly the live contacts, each with the store's given name.
    func expectMirror(_ vdir: URL, matches f: ContactsFixture, _ comment: String = "") throws {
        let live = try f.live()
        let files = try VdirMirror(directory: vdir).files()
        let expected = live.keys.map { VdirMirror.fileName(for: .init($0)) }.sorted()
        #expect(files == expected, "\(comment): files \(files), expected \(expected)")
        for (id, given) in live {
            let url = vdir.appendingPathComponent(VdirMirror.fileName(for: .init(id)))
            guard let text = try? String(contentsOf: url, encoding: .utf8) else { continue }
            let card = VCard.parse(text).contacts.first
            #expect(card?.uid == id && card?.contact.givenName == given, "\(comment): \(id) reads \(text)")
        }
    }

    /// A mirror that already holds every contact must enumerate everything again (its change
    /// anchor expired: a removal's tombstone was reaped while it was away, docs/CONTACTS.md,
    /// "Limits"). The process dies after the first content page was written and saved; it is
    /// started again (a new `VdirMirror`, a new host on the same state file) and resumes from
    /// the saved page.
    ///
    /// Expected: the resumed enumeration ends with one file per live contact (the removed one's
    /// file gone, all others present).
    ///
    /// Passes on this machine (Linux 6.18), failure expected elsewhere (not observed here): the
    /// files written by the first page before the crash (c0…c4) are removed at the end of the
    /// resumed enumeration when their modification time is earlier than the recorded start, and
    /// no later change batch brings them back. On kernels with multigrain timestamps (6.13+,
    /// ext4/xfs/btrfs/tmpfs) the host's own state-file write between the start and the first
    /// page moves the timestamp floor past the start and hides the fault here;
    /// ``aFileRewrittenRightAfterTheStartOfAFullEnumerationIsNotStale()`` shows it without the
    /// host in between. Cause: `VdirMirror.finishFullEnumeration` (Sources/TrellisContacts/VdirMirror.swift,
    /// "After a resumed enumeration, a file written since the start is current") tells the
    /// files rewritten before the crash by their modification time, `modified >= startedAt`,
    /// against `Date()` read in `beginFullEnumeration`. Linux stamps a new inode with the
    /// coarse clock (one jiffy, up to 4 ms behind `Date()`; every rename-into-place file is a
    /// new inode), so a file written within a tick of the start carries an earlier time and is
    /// taken for stale. (Time comparisons are also wrong after a clock step backwards.)
    /// Proposed fix: do not compare clocks. Record progress on disk instead: e.g. have
    /// `update` remove the written names from `.trellis-full-enumeration` (or append them to a
    /// journal next to it) before or with the rename, and make `finishFullEnumeration` remove
    /// only names still listed; or let the host resume a crashed full enumeration by
    /// re-reading the pages before the saved one (re-applying them is idempotent).
    @Test func aResumedFullEnumerationKeepsTheFilesWrittenBeforeTheCrash() async throws {
        let clock = ManualClock()
        let f = try ContactsFixture(clock: clock)
        for i in 0..<20 { try f.put("c\(i)", "g\(i)") }
        let vdir = f.dir.url.appendingPathComponent("vdir")
        let stateFile = vdir.appendingPathComponent(".trellis-host.json")
        let provider = TrellisContactProvider(store: f.store)
        do {
            let host = ContactProviderHost(
                provider: provider, sink: try VdirMirror(directory: vdir), stateFile: stateFile)
            try await host.enable()
        }
        try expectMirror(vdir, matches: f, "first mirror")
        // While the mirror is away, c19 is removed and its tombstone reaped: its anchor expires.
        try f.remove("c19")
        clock.advance(by: f.store.options.tombstoneTTL + 1)
        #expect(try f.store.reapOnceAcknowledged().reaped == 1)
        do {
            let sink = CrashingSink(try VdirMirror(directory: vdir), crashAt: 2)
            let host = ContactProviderHost(provider: provider, sink: sink, stateFile: stateFile)
            await host.setPageSize(5)
            await host.setMaxRetries(0)
            await #expect(throws: (any Error).self) { try await host.signalEnumerator() }
            let state = await host.state
            #expect(state.enumeratingContent && state.fullEnumerationBegun && state.offset > 0)
        }
        // The restarted process.
        let host = ContactProviderHost(provider: provider, sink: try VdirMirror(directory: vdir), stateFile: stateFile)
        await host.setPageSize(5)
        try await host.signalEnumerator()
        try expectMirror(vdir, matches: f, "after the resumed enumeration")
    }

    /// The same at the level of the sink alone: a full enumeration begins, one contact's file
    /// is rewritten at once, the process dies, and the restarted mirror finishes the
    /// enumeration. The rewritten file was delivered by this enumeration and must stay.
    ///
    /// Failed before the journal of written names (here `lost` was 6 to 42 of 100 rounds), same cause as above: the
    /// file's modification time, taken from the kernel's coarse clock, is before the `Date()`
    /// recorded by `beginFullEnumeration`, and `finishFullEnumeration` removes the file of a
    /// contact this enumeration delivered.
    @Test func aFileRewrittenRightAfterTheStartOfAFullEnumerationIsNotStale() throws {
        let dir = TemporaryDirectory("trellis-vdir-mtime")
        let vdir = dir.url.appendingPathComponent("vdir")
        let contact = CNMutableContact()
        contact.givenName = "Ada"
        let item = ContactItem.contact(contact, .init("ada"))
        // The process that begins and dies, and the one that finishes.
        let (crashed, restarted) = (try VdirMirror(directory: vdir), try VdirMirror(directory: vdir))
        try crashed.update([item])
        var lost = 0
        for _ in 0..<100 {
            try crashed.beginFullEnumeration()
            try crashed.update([item])
            try restarted.finishFullEnumeration()
            if !FileManager.default.fileExists(atPath: vdir.appendingPathComponent("ada.vcf").path) {
                lost += 1
                try crashed.update([item])
            }
        }
        #expect(lost == 0, "the contact's file was removed in \(lost) of 100 resumed enumerations")
    }

    /// A document's `_id` is a string or a map; the contact's identifier is the string itself or
    /// the canonical JSON of the map (`ContactDocument.identifier(for:)`). A string `_id` whose
    /// text is a map's canonical JSON names the same contact as that map: two live documents,
    /// one file.
    ///
    /// Expected: two documents, two contacts, two files; removing one leaves the other's file.
    ///
    /// Failed before identifiers were one to one: the host and the vdir saw one contact (`{"k":"x"}.vcf`, written twice with
    /// whichever came last), and removing the string-keyed document deletes the file of the
    /// map-keyed one, which is still live: the mirror diverges from the store until the next
    /// full enumeration, and the enumerator's change batches report a deletion and an update of
    /// one identifier for two documents.
    /// Cause: `ContactDocument.identifier(for:)` (Sources/TrellisContacts/ContactDocument.swift:26)
    /// is not injective: `.string(s)` maps to `s`, `.map(m)` to `JSON.string(m)`, and `s` may
    /// equal that text (a peer, or `contacts import` of a card with such a UID, can write it).
    /// Proposed fix: make the mapping injective, e.g. give map keys a form no string key has
    /// (escape a string key that starts with `{` or the escape character), and parse it back
    /// the same way where identifiers become `_id`s (`ContactDocument.value(for:identifier:)`).
    @Test func aMapIDAndAStringIDSpellingItAreTwoContacts() async throws {
        let f = try ContactsFixture()
        let mapID = Value.map(["k": .string("x")])
        let textID = Value.string(JSON.string(mapID))
        try f.store.upsert(.map(["_id": mapID, "givenName": "Map"]), in: f.collection)
        try f.store.upsert(.map(["_id": textID, "givenName": "Text"]), in: f.collection)
        #expect(try f.store.documents(in: f.collection).count == 2)
        let vdir = f.dir.url.appendingPathComponent("vdir")
        let mirror = try VdirMirror(directory: vdir)
        let memory = MemoryContactSink()
        let hosts = [
            ContactProviderHost(provider: TrellisContactProvider(store: f.store), sink: mirror),
            ContactProviderHost(provider: TrellisContactProvider(store: f.store), sink: memory),
        ]
        for host in hosts { try await host.enable() }
        #expect(memory.contacts.count == 2, "the host holds \(memory.contacts.count) contact(s) for 2 documents")
        let files = try mirror.files()
        #expect(files.count == 2, "the vdir holds \(files)")
        // The string-keyed one is removed; the map-keyed one is still live.
        #expect(try f.store.remove(id: textID, in: f.collection))
        for host in hosts { try await host.signalEnumerator() }
        #expect(try f.store.documents(in: f.collection).map { $0["givenName"] } == ["Map"])
        #expect(memory.contacts.values.map(\.givenName) == ["Map"], "the host holds \(memory.contacts)")
        let left = try mirror.files()
        #expect(left.count == 1, "the vdir holds \(left) for one live contact")
    }

    /// A seeded random life of a mirrored node: local writes, removes and re-creations,
    /// evictions, batches merged from a peer (including documents it removed and re-created),
    /// tombstones reaped past the TTL (so the host's anchor expires and it enumerates everything
    /// again), host restarts with a fresh `VdirMirror`, crashes of the sink during change
    /// batches, and signals at random points with small pages and batches. After each signal
    /// the vdir must hold exactly the live contacts with their current names.
    ///
    /// Crashes during a content enumeration are left out: they hit the fault of
    /// ``aResumedFullEnumerationKeepsTheFilesWrittenBeforeTheCrash()``.
    ///
    /// Replay: `TRELLIS_SEED=<seed printed>`.
    @Test func randomLifeOfAMirroredNodeKeepsTheVdirEqualToTheStore() async throws {
        let (seeded, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        var rng = seeded
        print("randomLifeOfAMirroredNodeKeepsTheVdirEqualToTheStore seed \(seed) (replay: TRELLIS_SEED=\(seed))")
        let clock = ManualClock()
        let f = try ContactsFixture(clock: clock)
        let peer = try ContactsFixture(name: "peer.sqlite", clock: clock)
        let vdir = f.dir.url.appendingPathComponent("vdir")
        let stateFile = vdir.appendingPathComponent(".trellis-host.json")
        let provider = TrellisContactProvider(store: f.store)
        func newHost(crashAt: Int = 0) async throws -> ContactProviderHost {
            let mirror = try VdirMirror(directory: vdir)
            let sink: any ContactSink =
                crashAt > 0 ? CrashingSink(mirror, crashAt: crashAt, outsideContent: true) : mirror
            let host = ContactProviderHost(provider: provider, sink: sink, stateFile: stateFile)
            await host.setPageSize(Int.random(in: 1...4, using: &rng))
            await host.setBatchSize(Int.random(in: 1...4, using: &rng))
            await host.setMaxRetries(0)
            return host
        }
        var host = try await newHost()
        try await host.enable()
        var peerSeq: Int64 = 0
        for step in 0..<120 {
            let id = "c\(Int.random(in: 0..<15, using: &rng))"
            let name = "n\(step)"
            switch Int.random(in: 0..<12, using: &rng) {
            case 0..<3: try f.put(id, name)
            case 3: try f.remove(id)
            case 4: _ = try f.store.evict(id: .string(id), in: f.collection)
            case 5..<7: try peer.put(id, name)
            case 7: try peer.remove(id)
            case 8:
                try f.mergeFrom(peer.store, after: peerSeq)
                peerSeq = peer.store.lastSeq
            case 9:
                clock.advance(by: f.store.options.tombstoneTTL + 1)
                _ = try f.store.reapOnceAcknowledged()
                _ = try peer.store.reapOnceAcknowledged()
            case 10:
                host = try await newHost()
            default:
                // A crash while a change batch is applied: the next process starts over from
                // the saved anchor.
                let state = await host.state
                if !state.enumeratingContent {
                    let crashing = try await newHost(crashAt: 1)
                    _ = try? await crashing.signalEnumerator()
                    host = try await newHost()
                }
            }
            if Bool.random(using: &rng) {
                try await host.signalEnumerator()
                try expectMirror(vdir, matches: f, "seed \(seed) step \(step)")
            }
        }
        try await host.signalEnumerator()
        try expectMirror(vdir, matches: f, "seed \(seed) at the end")
    }
}
