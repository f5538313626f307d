import ContactProvider
import Foundation
import Synchronization
import Testing
import TrellisContacts
import TrellisCore
import TrellisStore
import TrellisTestKit

@Suite("Contact provider host")
struct HostTests {
    func names(_ sink: MemoryContactSink) -> [String: String] {
        Dictionary(uniqueKeysWithValues: sink.contacts.map { ($0.key.value, $0.value.givenName) })
    }

    @Test("the host enumerates content, then changes, creating an enumerator per call")
    func contentThenChanges() async throws {
        let a = try ContactsFixture()
        for i in 0..<23 { try a.put("c\(i)", "g\(i)") }
        let provider = FlakyProvider(TrellisContactProvider(store: a.store), failures: 0)
        let sink = MemoryContactSink()
        let host = ContactProviderHost(provider: provider, sink: sink)
        await host.setPageSize(5)
        await host.setBatchSize(2)
        try await host.enable()
        #expect(names(sink) == (try a.live()))
        // 5 content pages and one empty change batch, each with its own enumerator.
        #expect(provider.calls.withLock { $0 } == 6)
        for i in 0..<5 { try a.put("c\(i)", "new") }
        try a.remove("c10")
        try await host.signalEnumerator()
        #expect(names(sink) == (try a.live()))
        #expect(await host.state.enumeratingContent == false)
    }

    @Test("a plain-class provider that reuses one contact object delivers each contact as handed over")
    func plainClassProvider() async throws {
        let sink = MemoryContactSink()
        let host = ContactProviderHost(provider: ReusingProvider(), sink: sink)
        try await host.enable()
        #expect(names(sink) == ["ada": "ada", "alan": "alan", "grace": "grace"])
        try await host.invalidate()
    }

    @Test("other errors are retried a bounded number of times from the saved page or anchor")
    func boundedRetries() async throws {
        let a = try ContactsFixture()
        for i in 0..<10 { try a.put("c\(i)", "g\(i)") }
        let sink = MemoryContactSink()
        let flaky = FlakyProvider(TrellisContactProvider(store: a.store), failures: 2)
        let host = ContactProviderHost(provider: flaky, sink: sink)
        await host.setMaxRetries(3)
        try await host.enable()
        #expect(names(sink) == (try a.live()))
        let broken = FlakyProvider(TrellisContactProvider(store: a.store), failures: 100)
        let failing = ContactProviderHost(provider: broken, sink: MemoryContactSink())
        await failing.setMaxRetries(3)
        await #expect(throws: ContactProviderError.cannotEnumerate) { try await failing.enable() }
        #expect(broken.calls.withLock { $0 } == 4)
    }

    @Test("an expired anchor restarts with a full content enumeration that drops reaped removals (F08a)")
    func expiryRestarts() async throws {
        let a = try ContactsFixture()
        for i in 0..<10 { try a.put("c\(i)", "g\(i)") }
        let sink = MemoryContactSink()
        let host = ContactProviderHost(provider: TrellisContactProvider(store: a.store), sink: sink)
        await host.setPageSize(3)
        try await host.enable()
        let anchor = await host.state.offset
        try a.remove("c2")
        try a.put("c3", "changed")
        try a.store.reapTombstones(in: "contacts", through: a.store.lastSeq)
        try await host.signalEnumerator()
        // The delete of c2 was reaped; the fresh content enumeration removed it anyway.
        #expect(names(sink) == (try a.live()))
        #expect(sink.contacts[.init("c2")] == nil)
        let marker = try #require(GenerationMarker(data: await host.state.marker))
        #expect(Int(marker.snapshot) > anchor)
    }

    @Test("signals are coalesced: enumerations never overlap")
    func coalescedSignals() async throws {
        let a = try ContactsFixture()
        for i in 0..<4 { try a.put("c\(i)", "g\(i)") }
        let gated = GatedProvider(TrellisContactProvider(store: a.store))
        let sink = MemoryContactSink()
        let host = ContactProviderHost(provider: gated, sink: sink)
        let first = Task { try await host.enable() }
        #expect(await eventuallyAsync { gated.entered.withLock { $0 } == 1 })
        // Ten signals while the first enumeration is held: they share one more enumeration.
        let signals = (0..<10).map { _ in Task { try await host.signalEnumerator() } }
        try await Task.sleep(for: .milliseconds(50))
        #expect(gated.entered.withLock { $0 } == 1)
        try a.put("late", "late")
        let opener = gated.keepOpening()
        try await first.value
        for s in signals { try await s.value }
        opener.cancel()
        #expect(names(sink) == (try a.live()))
        // Content (1 page) + changes (1 batch) for the first run, 1 change batch for all signals.
        #expect(gated.entered.withLock { $0 } == 3)
    }

    @Test("(n) reset forces a fresh content enumeration; disable deletes the mirrored contacts")
    func resetAndDisable() async throws {
        let a = try ContactsFixture()
        for i in 0..<6 { try a.put("c\(i)", "g\(i)") }
        let sink = MemoryContactSink()
        let provider = FlakyProvider(TrellisContactProvider(store: a.store), failures: 0)
        let host = ContactProviderHost(provider: provider, sink: sink)
        ContactProviderManager.register(host)
        defer { ContactProviderManager.unregister(domainIdentifier: "defaultDomain") }
        let manager = try ContactProviderManager(domainIdentifier: "defaultDomain")
        try await manager.enable()
        #expect(await manager.isEnabled)
        #expect(names(sink) == (try a.live()))
        try await manager.reset()
        #expect(sink.log.contains(.removeAll))
        #expect(await host.state.enumeratingContent == false)
        #expect(names(sink) == (try a.live()))
        // The reset enumerated content again: c0 was updated twice.
        #expect(sink.log.filter { $0 == .update(.init("c0")) }.count == 2)
        try await manager.disable()
        #expect(sink.contacts.isEmpty)
        #expect(await manager.isEnabled == false)
        try await manager.signalEnumerator()
        #expect(sink.contacts.isEmpty)
        #expect(throws: ContactProviderError.domainNotRegistered) {
            try ContactProviderManager(domainIdentifier: "nope")
        }
    }

    @Test("(n) disable or reset during an enumeration ends it with extensionInvalidated", arguments: [false, true])
    func invalidatedDuringEnumeration(reset: Bool) async throws {
        let a = try ContactsFixture()
        for i in 0..<6 { try a.put("c\(i)", "g\(i)") }
        let gated = GatedProvider(TrellisContactProvider(store: a.store))
        let sink = MemoryContactSink()
        let host = ContactProviderHost(provider: gated, sink: sink)
        await host.setPageSize(2)
        let running = Task { try await host.enable() }
        #expect(await eventuallyAsync { gated.entered.withLock { $0 } == 1 })
        let second = Task { reset ? try await host.reset() : try await host.disable() }
        try await Task.sleep(for: .milliseconds(20))
        let opener = gated.keepOpening()
        await #expect(throws: ContactProviderError.extensionInvalidated) { try await running.value }
        try await second.value
        opener.cancel()
        if reset {
            #expect(names(sink) == (try a.live()))
            #expect(await host.isEnabled)
        } else {
            #expect(sink.contacts.isEmpty)
            #expect(await host.isEnabled == false)
        }
    }

    /// A provider that breaks one of the rules iOS checks: the host fails at once, without
    /// retrying, with an error that names the rule, the call and the markers.
    @Test(
        "a page with an empty or a changed generation marker fails without retry",
        arguments: [
            ("empty", ContactProviderRuleViolation.Rule.emptyGenerationMarker, "an empty generation marker"),
            (
                "changed", .changedGenerationMarker,
                "marker 67656e2d32 while the enumeration's earlier pages carried 67656e2d31"
            ),
        ])
    func markerRules(_ fault: String, _ rule: ContactProviderRuleViolation.Rule, _ expected: String) async throws {
        let provider = ScriptedProvider(
            content: { page, observer in
                observer.didEnumerate([ScriptedProvider.item("c\(page.offset)")])
                switch (fault, page.offset) {
                case ("empty", _):
                    observer.didFinishEnumeratingPage(upTo: ContactItemPage(generationMarker: Data(), offset: 1))
                case (_, 0):
                    observer.didFinishEnumeratingPage(
                        upTo: ContactItemPage(generationMarker: Data("gen-1".utf8), offset: 1))
                default:
                    observer.didFinishEnumeratingPage(
                        upTo: ContactItemPage(generationMarker: Data("gen-2".utf8), offset: 2))
                }
            },
            changes: { anchor, observer in observer.didFinishEnumeratingChanges(upTo: anchor, moreComing: false) })
        let sink = MemoryContactSink()
        let host = ContactProviderHost(provider: provider, sink: sink)
        await host.setMaxRetries(3)
        let error = try await #require(throws: ContactProviderRuleViolation.self) { try await host.enable() }
        #expect(error.rule == rule)
        #expect(error.code == .cannotEnumerate)
        #expect(error.description.contains("didFinishEnumeratingPage(upTo:)"))
        #expect(error.description.contains(expected), "\(error)")
        // One call that broke the rule (and, for a changed marker, the good page before it): no retry.
        #expect(provider.contentCalls.withLock { $0 } == (fault == "empty" ? 1 : 2))
        #expect(await host.lastViolation == error)
        // What the good page brought is applied; nothing of the bad page is.
        #expect(sink.contacts.keys.map(\.value).sorted() == (fault == "empty" ? [] : ["c0"]))
    }

    /// `moreComing: true` with no change and the same anchor ends this run's change enumeration
    /// instead of asking for the same batch forever.
    @Test("moreComing with nothing new does not spin")
    func moreComingWithNothingNewStops() async throws {
        let marker = Data("gen-1".utf8)
        let provider = ScriptedProvider(
            content: { _, observer in observer.didFinishEnumeratingContent(upTo: marker) },
            changes: { anchor, observer in observer.didFinishEnumeratingChanges(upTo: anchor, moreComing: true) })
        let host = ContactProviderHost(provider: provider, sink: MemoryContactSink())
        try await host.enable()
        #expect(provider.changeCalls.withLock { $0 } == 1)
        let violation = try #require(await host.lastViolation)
        #expect(violation.rule == .moreComingWithoutProgress)
        #expect(violation.description.contains("moreComing: true"))
        try await host.signalEnumerator()
        #expect(provider.changeCalls.withLock { $0 } == 2)
    }

    /// Anchors that go round in a circle with nothing new are no progress either.
    @Test("moreComing with nothing new and anchors in a cycle does not spin")
    func moreComingInACycleStops() async throws {
        let marker = Data("gen-1".utf8)
        let provider = ScriptedProvider(
            content: { _, observer in observer.didFinishEnumeratingContent(upTo: marker) },
            changes: { anchor, observer in
                let next = ContactItemSyncAnchor(generationMarker: marker, offset: (anchor.offset + 1) % 3)
                observer.didFinishEnumeratingChanges(upTo: next, moreComing: true)
            })
        let host = ContactProviderHost(provider: provider, sink: MemoryContactSink())
        try await host.enable()
        // 0 → 1 → 2 → 0: the third batch comes back to an anchor already seen.
        #expect(provider.changeCalls.withLock { $0 } == 3)
        #expect(await host.lastViolation?.rule == .moreComingWithoutProgress)
    }
}

/// Polls `condition` every 5 ms for up to `timeout` seconds.
///
/// The bound only ends a test that fails, so it is generous: what the condition waits for runs
/// on the cooperative pool, which the whole suite shares, and a task queued behind other tests'
/// work has waited more than a minute on the 2-core CI machine.
func eventuallyAsync(timeout: Double = 300, _ condition: @Sendable () async -> Bool) async -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if await condition() { return true }
        try? await Task.sleep(for: .milliseconds(5))
    }
    return await condition()
}

/// A provider as iOS allows one: a plain class, neither final nor `Sendable`, whose enumerator
/// hands over one `CNMutableContact` object again and again, changed in between.
class ReusingProvider: ContactProviding {
    func configure(for domain: any ContactProviderDomain) {}
    func invalidate() async throws {}
    func enumerator(for collection: ContactItem.Identifier) -> any ContactItemEnumerator { ReusingEnumerator() }
}

class ReusingEnumerator: ContactItemEnumerator {
    let contact = CNMutableContact()

    func enumerateContent(in page: ContactItemPage, for observer: any ContactItemContentObserver) async {
        for name in ["ada", "alan", "grace"] {
            contact.givenName = name
            observer.didEnumerate([.contact(contact, ContactItem.Identifier(name))])
        }
        observer.didFinishEnumeratingContent(upTo: Data("generation".utf8))
    }

    func enumerateChanges(startingAt syncAnchor: ContactItemSyncAnchor, for observer: any ContactItemChangeObserver)
        async
    {
        observer.didFinishEnumeratingChanges(upTo: syncAnchor, moreComing: false)
    }

    func invalidate() async {}
}

/// A provider whose enumerators run the given closures, to break the rules on purpose.
final class ScriptedProvider: ContactProviding, Sendable {
    typealias Content = @Sendable (ContactItemPage, any ContactItemContentObserver) -> Void
    typealias Changes = @Sendable (ContactItemSyncAnchor, any ContactItemChangeObserver) -> Void
    let content: Content
    let changes: Changes
    let contentCalls = Mutex(0)
    let changeCalls = Mutex(0)

    init(content: @escaping Content, changes: @escaping Changes) {
        self.content = content
        self.changes = changes
    }

    static func item(_ id: String) -> ContactItem {
        let contact = CNMutableContact()
        contact.givenName = id
        return .contact(contact, ContactItem.Identifier(id))
    }

    func configure(for domain: any ContactProviderDomain) {}
    func invalidate() async throws {}

    func enumerator(for collection: ContactItem.Identifier) -> any ContactItemEnumerator { Enumerator(provider: self) }

    struct Enumerator: ContactItemEnumerator {
        let provider: ScriptedProvider
        func enumerateContent(in page: ContactItemPage, for observer: any ContactItemContentObserver) async {
            provider.contentCalls.withLock { $0 += 1 }
            provider.content(page, observer)
        }
        func enumerateChanges(startingAt syncAnchor: ContactItemSyncAnchor, for observer: any ContactItemChangeObserver)
            async
        {
            provider.changeCalls.withLock { $0 += 1 }
            provider.changes(syncAnchor, observer)
        }
        func invalidate() async {}
    }
}
