import ContactProvider
import Foundation
import Synchronization
import Testing
import TrellisContacts
import TrellisCore
import TrellisStore
import TrellisTestKit

@Suite("Contacts enumerator over the change log")
struct EnumeratorTests {
    /// (a) Content then changes give exactly the live set while local writes, removes and remote
    /// merges land between pages.
    @Test("(a) content then changes give exactly the live set with writes between pages", arguments: [3, 7, 50])
    func liveSetWithConcurrentWrites(pageSize: Int) async throws {
        var (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        print("seed: \(seed)")
        let a = try ContactsFixture()
        let b = try ContactsFixture(name: "b.sqlite")
        for i in 0..<120 { try a.put("c\(i)", "v0-\(i)") }
        try b.mergeFrom(a.store)
        var next = 120
        var run = try await enumerateContent(a.enumerator, pageSize: pageSize) { page in
            for _ in 0..<3 {
                let i = Int.random(in: 0..<next, using: &rng)
                switch Int.random(in: 0..<5, using: &rng) {
                case 0: try a.put("c\(i)", "local-\(page)")
                case 1: try a.remove("c\(i)")
                case 2:
                    try a.put("c\(next)", "new-\(page)")
                    next += 1
                case 3:
                    // A remote write merged from the other node.
                    let before = b.store.lastSeq
                    try b.put("c\(i)", "remote-\(page)")
                    try a.mergeFrom(b.store, after: before)
                default:
                    let before = b.store.lastSeq
                    try b.remove("c\(i)")
                    try a.mergeFrom(b.store, after: before)
                }
            }
        }
        var contacts: [String: String] = [:]
        for item in run.items {
            // Duplicates are only idempotent updates: a contact listed twice is listed the same.
            if let earlier = contacts[item.identifier.value] { #expect(earlier == item.contact.givenName) }
            contacts[item.identifier.value] = item.contact.givenName
        }
        var batches: [RecordingChangeObserver] = []
        try await applyChanges(
            a.enumerator, from: ContactItemSyncAnchor(generationMarker: run.marker, offset: 0), batchSize: 10,
            to: &contacts, batches: &batches)
        #expect(contacts == (try a.live()), "seed \(seed)")
        run.items = []
    }

    /// (b) Every non-initial page carries the same non-empty marker, handed to the end of content.
    @Test("(b) one marker for every non-initial page, given to didFinishEnumeratingContent")
    func oneMarkerPerEnumeration() async throws {
        let a = try ContactsFixture()
        for i in 0..<25 { try a.put("c\(i)", "g\(i)") }
        let run = try await enumerateContent(a.enumerator, pageSize: 4) { i in try a.put("n\(i)", "new") }
        #expect(run.pages.count == 6)
        #expect(!run.marker.isEmpty)
        #expect(run.marker.count <= 500)
        for page in run.pages { #expect(page.generationMarker == run.marker) }
        #expect(run.items.count == 25)
    }

    /// (c) and F07: every change after the marker appears in the first change enumeration.
    @Test("(c, F07) every change after the marker is in the first change enumeration")
    func handOffFromFullToIncremental() async throws {
        let a = try ContactsFixture()
        for i in 1...100 { try a.put("d\(i)", "v1") }
        let run = try await enumerateContent(a.enumerator, pageSize: 10) { i in
            // F07 variant: d50 is updated while the enumeration runs.
            if i == 6 { try a.put("d50", "v2") }
        }
        var contacts: [String: String] = [:]
        for item in run.items { contacts[item.identifier.value] = item.contact.givenName }
        var batches: [RecordingChangeObserver] = []
        let start = ContactItemSyncAnchor(generationMarker: run.marker, offset: 0)
        let anchor = try await applyChanges(a.enumerator, from: start, batchSize: 50, to: &contacts, batches: &batches)
        // d50's new state is delivered at least once (by content or by the changes).
        #expect(contacts["d50"] == "v2")
        #expect(contacts.count == 100)
        // Nothing else changed: asking again yields no items.
        batches = []
        let again = try await applyChanges(a.enumerator, from: anchor, batchSize: 50, to: &contacts, batches: &batches)
        #expect(batches.allSatisfy { $0.updates.isEmpty && $0.deletes.isEmpty })
        #expect(again == anchor)
        try a.put("d101", "v1")
        batches = []
        try await applyChanges(a.enumerator, from: anchor, batchSize: 50, to: &contacts, batches: &batches)
        #expect(batches.flatMap { $0.updates.map(\.identifier.value) } == ["d101"])
        #expect(batches.flatMap(\.deletes).isEmpty)
    }

    /// (d) Re-running a page gives the same items in the same order, minus the changed ones.
    @Test("(d) re-running a page gives the same items minus those changed since")
    func rerunPage() async throws {
        let a = try ContactsFixture()
        for i in 0..<30 { try a.put("c\(i)", "g\(i)") }
        let run = try await enumerateContent(a.enumerator, pageSize: 10)
        let page = run.pages[0]
        let first = RecordingContentObserver(pageSize: 10)
        await a.enumerator.enumerateContent(in: page, for: first)
        let second = RecordingContentObserver(pageSize: 10)
        await a.enumerator.enumerateContent(in: page, for: second)
        #expect(first.items.map(\.identifier) == second.items.map(\.identifier))
        #expect(first.items == run.pageItems[1])
        let changed = first.items[3].identifier.value
        try a.put(changed, "changed")
        let third = RecordingContentObserver(pageSize: 10)
        await a.enumerator.enumerateContent(in: page, for: third)
        // The same items in the same order minus the changed one; the page still holds up to its
        // size, so it ends with the first item of the following page.
        let expected = first.items.map(\.identifier).filter { $0.value != changed }
        #expect(Array(third.items.map(\.identifier).prefix(expected.count)) == expected)
        #expect(third.items.dropFirst(expected.count).map(\.identifier) == [run.pageItems[2][0].identifier])
    }

    /// (e) Resuming from a saved page after a crash loses nothing.
    @Test("(e) resuming at a saved page after a crash loses nothing")
    func resumeAfterCrash() async throws {
        let a = try ContactsFixture()
        for i in 0..<40 { try a.put("c\(i)", "g\(i)") }
        let stateFile = a.dir.url.appendingPathComponent("host.json")
        let sink = MemoryContactSink()
        let provider = TrellisContactProvider(store: a.store)
        do {
            let host = ContactProviderHost(provider: provider, sink: sink, stateFile: stateFile)
            await host.setPageSize(6)
            await host.setMaxRetries(0)
            let pages = Counter()
            await host.setProgressHandler { progress in
                if case .contentPage = progress {
                    // The crash: the host dies after its third saved page.
                    if pages.increment() == 3 { sink.failNextUpdate(with: CocoaError(.fileWriteUnknown)) }
                }
            }
            await #expect(throws: (any Error).self) { try await host.enable() }
        }
        // Writes land while the host is down.
        try a.remove("c1")
        try a.remove("c30")
        try a.put("late", "late")
        let restarted = ContactProviderHost(provider: provider, sink: sink, stateFile: stateFile)
        #expect(await restarted.state.enumeratingContent)
        #expect(await restarted.state.offset > 0)
        try await restarted.signalEnumerator()
        #expect(
            Dictionary(uniqueKeysWithValues: sink.contacts.map { ($0.key.value, $0.value.givenName) }) == (try a.live())
        )
        // Resuming did not start over: the first pages were not enumerated again.
        #expect(sink.log.filter { $0 == .update(.init("c0")) }.count == 1)
    }

    /// (f) and F08(a): unknown, reaped or lost markers expire explicitly.
    @Test("(f, F08a) unknown, reaped or lost markers and anchors expire, never 'no changes'")
    func expiredMarkers() async throws {
        let a = try ContactsFixture()
        for i in 0..<20 { try a.put("c\(i)", "g\(i)") }
        let run = try await enumerateContent(a.enumerator, pageSize: 5)
        let marker = try #require(GenerationMarker(data: run.marker))

        func contentError(_ page: ContactItemPage) async -> ContactProviderError? {
            let o = RecordingContentObserver(pageSize: 5)
            await a.enumerator.enumerateContent(in: page, for: o)
            #expect(o.terminals.count == 1)
            return o.providerError
        }
        func changeError(_ anchor: ContactItemSyncAnchor, in store: DocumentStore? = nil) async -> ContactProviderError?
        {
            let o = RecordingChangeObserver(batchSize: 5)
            await ContactsEnumerator(store: store ?? a.store, collection: "contacts").enumerateChanges(
                startingAt: anchor, for: o)
            #expect(o.terminalCount == 1)
            return o.providerError
        }
        // Unknown: garbage, another epoch, another collection.
        #expect(await contentError(ContactItemPage(generationMarker: Data([1, 2, 3]), offset: 4)) == .pageExpired)
        var other = marker
        other.epoch = Array(repeating: 9, count: 16)
        #expect(await contentError(ContactItemPage(generationMarker: other.data, offset: 4)) == .pageExpired)
        #expect(
            await changeError(ContactItemSyncAnchor(generationMarker: other.data, offset: 0)) == .changeAnchorExpired)
        let elsewhere = GenerationMarker(epoch: a.store.epoch, snapshot: marker.snapshot, collection: "people")
        #expect(await contentError(ContactItemPage(generationMarker: elsewhere.data, offset: 1)) == .pageExpired)
        // Lost: the marker names a state this store never reached (a store replaced from a backup).
        let future = GenerationMarker(epoch: a.store.epoch, snapshot: a.store.lastSeq + 50, collection: "contacts")
        #expect(await contentError(ContactItemPage(generationMarker: future.data, offset: 1)) == .pageExpired)
        #expect(
            await changeError(ContactItemSyncAnchor(generationMarker: run.marker, offset: Int(a.store.lastSeq) + 1))
                == .changeAnchorExpired)
        // A store wiped and recreated: a new epoch, so the old marker expires (F08 c on the contacts side).
        let fresh = try DocumentStore(path: a.dir.path("fresh.sqlite"))
        #expect(
            await changeError(ContactItemSyncAnchor(generationMarker: run.marker, offset: 0), in: fresh)
                == .changeAnchorExpired)

        // Reaped (F08 a): removes after the anchor, then the log is reaped past it.
        let anchor = ContactItemSyncAnchor(generationMarker: run.marker, offset: 0)
        try a.remove("c3")
        try a.remove("c4")
        try a.put("c5", "changed")
        #expect(try a.store.reapTombstones(in: "contacts", through: a.store.lastSeq) == 2)
        #expect(await changeError(anchor) == .changeAnchorExpired)
        #expect(await contentError(run.pages[1]) == .pageExpired)
        // A full re-enumeration then gives a fresh marker whose changes work.
        let again = try await enumerateContent(a.enumerator, pageSize: 5)
        #expect(again.marker != run.marker)
        #expect(Set(again.items.map(\.identifier.value)) == Set((try a.live()).keys))
        #expect(await changeError(ContactItemSyncAnchor(generationMarker: again.marker, offset: 0)) == nil)
    }

    /// Tombstones reaped by age (F04) expire the anchors taken before them: the change
    /// enumeration answers `changeAnchorExpired` instead of leaving the removed contact in place,
    /// a full re-enumeration no longer lists it, and its fresh anchor then follows changes.
    @Test func anAnchorOlderThanReapedTombstonesExpires() async throws {
        let clock = ManualClock()
        let a = try ContactsFixture(clock: clock)
        for i in 0..<5 { try a.put("c\(i)", "g\(i)") }
        let run = try await enumerateContent(a.enumerator, pageSize: 10)
        let anchor = ContactItemSyncAnchor(generationMarker: run.marker, offset: 0)
        try a.remove("c3")
        clock.advance(by: a.store.options.tombstoneTTL + 1)
        #expect(try a.store.reapOnceAcknowledged().reaped == 1)
        let expired = RecordingChangeObserver(batchSize: 5)
        await a.enumerator.enumerateChanges(startingAt: anchor, for: expired)
        #expect(expired.providerError == .changeAnchorExpired)
        let again = try await enumerateContent(a.enumerator, pageSize: 10)
        #expect(Set(again.items.map(\.identifier.value)) == ["c0", "c1", "c2", "c4"])
        try a.put("c5", "new")
        let changes = RecordingChangeObserver(batchSize: 5)
        await a.enumerator.enumerateChanges(
            startingAt: ContactItemSyncAnchor(generationMarker: again.marker, offset: 0), for: changes)
        #expect(changes.providerError == nil)
        #expect(changes.updates.map(\.identifier.value) == ["c5"])
    }

    /// (g) An anchor only moves forward; re-requesting the last anchor is harmless.
    @Test("(g) anchors move forward; re-requesting the last anchor is harmless")
    func anchorsMoveForward() async throws {
        let a = try ContactsFixture()
        for i in 0..<10 { try a.put("c\(i)", "g\(i)") }
        let run = try await enumerateContent(a.enumerator, pageSize: 100)
        var anchor = ContactItemSyncAnchor(generationMarker: run.marker, offset: 0)
        var offsets: [Int] = []
        for round in 0..<5 {
            for i in 0..<7 { try a.put("c\(i + round)", "r\(round)") }
            try a.remove("c\(round)")
            let o = RecordingChangeObserver(batchSize: 3)
            await a.enumerator.enumerateChanges(startingAt: anchor, for: o)
            let (next, _) = try #require(o.anchor)
            #expect(next.offset > anchor.offset)
            #expect(next.generationMarker.count <= 500)
            offsets.append(next.offset)
            // The same request again: the same batch and anchor.
            let repeated = RecordingChangeObserver(batchSize: 3)
            await a.enumerator.enumerateChanges(startingAt: anchor, for: repeated)
            #expect(repeated.updates == o.updates)
            #expect(repeated.deletes == o.deletes)
            #expect(repeated.anchor?.0 == next)
            anchor = next
        }
        #expect(offsets == offsets.sorted())
        // With no changes, the anchor stays and moreComing is false.
        var contacts: [String: String] = [:]
        var batches: [RecordingChangeObserver] = []
        let end = try await applyChanges(a.enumerator, from: anchor, batchSize: 100, to: &contacts, batches: &batches)
        let o = RecordingChangeObserver(batchSize: 5)
        await a.enumerator.enumerateChanges(startingAt: end, for: o)
        #expect(o.anchor?.0 == end)
        #expect(o.anchor?.1 == false)
    }

    /// (h) Page and batch sizes are bounds; the rest comes through moreComing.
    @Test("(h) items per page and changes per batch respect the suggested sizes")
    func sizesAreBounds() async throws {
        let a = try ContactsFixture()
        for i in 0..<47 { try a.put("c\(i)", "g\(i)") }
        let run = try await enumerateContent(a.enumerator, pageSize: 5)
        #expect(run.pageItems.allSatisfy { $0.count <= 5 })
        #expect(run.items.count == 47)
        for i in 0..<30 { try a.put("c\(i)", "x") }
        for i in 30..<43 { try a.remove("c\(i)") }
        var contacts: [String: String] = [:]
        var batches: [RecordingChangeObserver] = []
        try await applyChanges(
            a.enumerator, from: ContactItemSyncAnchor(generationMarker: run.marker, offset: 0), batchSize: 4,
            to: &contacts, batches: &batches)
        #expect(batches.allSatisfy { $0.updates.count + $0.deletes.count <= 4 })
        #expect(batches.dropLast().allSatisfy { $0.anchor?.1 == true })
        #expect(batches.last?.anchor?.1 == false)
        #expect(batches.reduce(0) { $0 + $1.updates.count + $1.deletes.count } == 43)
    }

    /// (i) Exactly one terminal call per enumerate call, before it returns (checked in every
    /// helper with #require; here also for errors and empty stores).
    @Test("(i) exactly one terminal observer call per enumerate call, before it returns")
    func oneTerminalCall() async throws {
        let a = try ContactsFixture()
        let empty = RecordingContentObserver(pageSize: 10)
        await a.enumerator.enumerateContent(in: .initialPage, for: empty)
        #expect(empty.terminals.count == 1)
        if case .content(let m)? = empty.terminals.first { #expect(!m.isEmpty) } else { Issue.record("no content end") }
        let bad = RecordingChangeObserver(batchSize: 10)
        await a.enumerator.enumerateChanges(
            startingAt: ContactItemSyncAnchor(generationMarker: Data(), offset: 0), for: bad)
        #expect(bad.terminalCount == 1)
        #expect(bad.providerError == .changeAnchorExpired)
        let enumerator = a.enumerator
        await enumerator.invalidate()
        let after = RecordingContentObserver(pageSize: 10)
        await enumerator.enumerateContent(in: .initialPage, for: after)
        #expect(after.terminals.count == 1)
        #expect(after.providerError == .extensionInvalidated)
    }

    /// (j) and (k): no batch both updates and deletes an identifier; remove then re-add arrives as
    /// an update after the delete.
    @Test("(j, k) no batch updates and deletes one identifier; re-added contacts come after the delete")
    func removeAndReAdd() async throws {
        let a = try ContactsFixture()
        for i in 0..<5 { try a.put("c\(i)", "g\(i)") }
        let run = try await enumerateContent(a.enumerator, pageSize: 10)
        let anchor = ContactItemSyncAnchor(generationMarker: run.marker, offset: 0)
        try a.remove("c1")
        // Seen between two batches: the delete, then later the re-add.
        let first = RecordingChangeObserver(batchSize: 10)
        await a.enumerator.enumerateChanges(startingAt: anchor, for: first)
        #expect(first.deletes.map(\.value) == ["c1"])
        try a.put("c1", "back")
        try a.remove("c2")
        try a.put("c2", "back too")
        let (mid, _) = try #require(first.anchor)
        let second = RecordingChangeObserver(batchSize: 10)
        await a.enumerator.enumerateChanges(startingAt: mid, for: second)
        #expect(Set(second.updates.map(\.identifier.value)) == ["c1", "c2"])
        #expect(second.deletes.isEmpty)
        // From the original anchor everything collapses to the latest state: updates only.
        let whole = RecordingChangeObserver(batchSize: 10)
        await a.enumerator.enumerateChanges(startingAt: anchor, for: whole)
        let updated = Set(whole.updates.map(\.identifier))
        #expect(updated.isDisjoint(with: Set(whole.deletes)))
        #expect(updated.map(\.value).sorted() == ["c1", "c2"])
        // Through the host: the delete is applied before the update of the same identifier.
        let sink = MemoryContactSink()
        let host = ContactProviderHost(provider: TrellisContactProvider(store: a.store), sink: sink)
        try await host.enable()
        try a.remove("c3")
        try await host.signalEnumerator()
        try a.put("c3", "again")
        try await host.signalEnumerator()
        let ops = sink.log.filter { $0 == .delete(.init("c3")) || $0 == .update(.init("c3")) }
        #expect(ops == [.update(.init("c3")), .delete(.init("c3")), .update(.init("c3"))])
        #expect(sink.contacts[.init("c3")]?.givenName == "again")
    }

    /// (l) Deletions come from tombstones: a contact missing without a tombstone (evicted) is not
    /// reported deleted, and a tombstone of a contact never seen is.
    @Test("(l) deletions come from tombstones, never from diffing")
    func deletionsFromTombstones() async throws {
        let a = try ContactsFixture()
        for i in 0..<5 { try a.put("c\(i)", "g\(i)") }
        let run = try await enumerateContent(a.enumerator, pageSize: 10)
        let anchor = ContactItemSyncAnchor(generationMarker: run.marker, offset: 0)
        // A remote remove of a contact this node never held arrives as a tombstone only.
        let b = try ContactsFixture(name: "b.sqlite")
        try b.put("ghost", "boo")
        try b.remove("ghost")
        try a.mergeFrom(b.store)
        try a.remove("c0")
        let o = RecordingChangeObserver(batchSize: 10)
        await a.enumerator.enumerateChanges(startingAt: anchor, for: o)
        #expect(Set(o.deletes.map(\.value)) == ["ghost", "c0"])
        #expect(o.updates.isEmpty)
    }

    /// (m) Identifiers are stable across re-enumerations and across nodes.
    @Test("(m) identifiers are stable across re-enumerations and nodes")
    func stableIdentifiers() async throws {
        let a = try ContactsFixture()
        let b = try ContactsFixture(name: "b.sqlite")
        for i in 0..<15 { try a.put("c\(i)", "g\(i)") }
        try a.store.upsert(
            .map(["_id": .map(["org": .string("x"), "n": .int(1)]), "givenName": .string("m")]), in: "contacts")
        try b.mergeFrom(a.store)
        let first = try await enumerateContent(a.enumerator, pageSize: 4)
        let second = try await enumerateContent(a.enumerator, pageSize: 7)
        let remote = try await enumerateContent(b.enumerator, pageSize: 3)
        let ids = Set(first.items.map(\.identifier))
        #expect(ids.count == 16)
        #expect(Set(second.items.map(\.identifier)) == ids)
        #expect(Set(remote.items.map(\.identifier)) == ids)
        #expect(ids.contains(.init("c3")))
    }

    /// F09: a tombstone is reported as a deletion; a contact no longer matching anything is not.
    @Test("(F09) a remote remove is a deletion; re-enumerating does not bring it back")
    func tombstoneDoesNotMatchFilter() async throws {
        let a = try ContactsFixture()
        let b = try ContactsFixture(name: "b.sqlite")
        try a.store.upsert(
            .map(["_id": .string("d1"), "givenName": .string("A"), "city": .string("Oslo")]), in: "contacts")
        try a.store.upsert(
            .map(["_id": .string("d2"), "givenName": .string("B"), "city": .string("Oslo")]), in: "contacts")
        try b.mergeFrom(a.store)
        let run = try await enumerateContent(b.enumerator, pageSize: 10)
        #expect(run.items.count == 2)
        let before = a.store.lastSeq
        _ = try a.store.remove(id: .string("d1"), in: "contacts")
        try a.store.upsert(.map(["_id": .string("d2"), "city": .string("Bergen")]), in: "contacts")
        try b.mergeFrom(a.store, after: before)
        let o = RecordingChangeObserver(batchSize: 10)
        await b.enumerator.enumerateChanges(
            startingAt: ContactItemSyncAnchor(generationMarker: run.marker, offset: 0), for: o)
        #expect(o.deletes.map(\.value) == ["d1"])
        #expect(o.updates.map(\.identifier.value) == ["d2"])
        let again = try await enumerateContent(b.enumerator, pageSize: 10)
        #expect(again.items.map(\.identifier.value) == ["d2"])
    }
}

/// A thread-safe counter for callbacks.
final class Counter: Sendable {
    private let value = Mutex(0)
    func increment() -> Int {
        value.withLock {
            $0 += 1
            return $0
        }
    }
    var count: Int { value.withLock { $0 } }
}
