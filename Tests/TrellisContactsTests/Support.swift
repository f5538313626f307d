import ContactProvider
import Foundation
import Synchronization
import Testing
import TrellisContacts
import TrellisCore
import TrellisStore
import TrellisTestKit

/// A store in a temporary directory, with helpers to write contacts.
final class ContactsFixture: Sendable {
    let dir = TemporaryDirectory("trellis-contacts")
    let store: DocumentStore
    let collection = "contacts"

    /// - Parameter clock: the store's clock (``StoreOptions/now``), when the test moves time.
    init(name: String = "a.sqlite", clock: ManualClock? = nil) throws {
        var options = StoreOptions()
        if let clock {
            options.now = clock.source
            options.elapsed = clock.source
        }
        store = try DocumentStore(path: dir.path(name), options: options)
    }

    var enumerator: ContactsEnumerator { ContactsEnumerator(store: store, collection: collection) }

    static func contact(_ id: String, _ given: String, family: String = "Doe") -> Value {
        .map(["_id": .string(id), "givenName": .string(given), "familyName": .string(family)])
    }

    func put(_ id: String, _ given: String) throws {
        try store.upsert(Self.contact(id, given), in: collection)
    }

    func remove(_ id: String) throws {
        _ = try store.remove(id: .string(id), in: collection)
    }

    /// The live contacts by identifier: what every enumeration must end with.
    func live() throws -> [String: String] {
        var result: [String: String] = [:]
        for doc in try store.documents(in: collection) {
            result[doc["_id"]?.stringValue ?? ""] = doc["givenName"]?.stringValue ?? ""
        }
        return result
    }

    /// Merges into this store every change `other` has after `after` (a remote batch).
    func mergeFrom(_ other: DocumentStore, after: Int64 = 0) throws {
        let page = try other.changes(in: collection, after: after, limit: 100_000, maxBytes: .max)
        let docs = page.records.map { RemoteDocument(collection: $0.collection, id: $0.id, state: $0.state) }
        _ = try store.merge(docs, from: Array(repeating: 7, count: 32), checkpoint: nil)
    }
}

/// Records every call of a content enumeration call.
final class RecordingContentObserver: ContactItemContentObserver {
    enum Terminal: Sendable {
        case page(ContactItemPage)
        case content(Data)
        case error(String)
    }
    struct State {
        var items: [ContactItem] = []
        var terminals: [Terminal] = []
        var error: (any Error)?
    }
    let suggestedPageSize: Int
    let state = Mutex(State())

    init(pageSize: Int) { suggestedPageSize = pageSize }

    func didEnumerate(_ items: [ContactItem]) { state.withLock { $0.items += items } }
    func didFinishEnumeratingPage(upTo nextPage: ContactItemPage) {
        state.withLock { $0.terminals.append(.page(nextPage)) }
    }
    func didFinishEnumeratingContent(upTo generationMarker: Data) {
        state.withLock { $0.terminals.append(.content(generationMarker)) }
    }
    func didFinishEnumeratingContentWithError(_ error: any Error) {
        state.withLock {
            $0.terminals.append(.error("\(error)"))
            $0.error = error
        }
    }

    var items: [ContactItem] { state.withLock { $0.items } }
    var terminals: [Terminal] { state.withLock { $0.terminals } }
    var providerError: ContactProviderError? { state.withLock { $0.error as? ContactProviderError } }
}

/// Records every call of a change enumeration call.
final class RecordingChangeObserver: ContactItemChangeObserver {
    struct State {
        var updates: [ContactItem] = []
        var deletes: [ContactItem.Identifier] = []
        var anchors: [(ContactItemSyncAnchor, Bool)] = []
        var errors: [any Error] = []
    }
    let suggestedBatchSize: Int
    let state = Mutex(State())

    init(batchSize: Int) { suggestedBatchSize = batchSize }

    func didUpdate(_ items: [ContactItem]) { state.withLock { $0.updates += items } }
    func didDelete(_ identifiers: [ContactItem.Identifier]) { state.withLock { $0.deletes += identifiers } }
    func didFinishEnumeratingChanges(upTo syncAnchor: ContactItemSyncAnchor, moreComing: Bool) {
        state.withLock { $0.anchors.append((syncAnchor, moreComing)) }
    }
    func didFinishEnumeratingChangesWithError(_ error: any Error) { state.withLock { $0.errors.append(error) } }

    var updates: [ContactItem] { state.withLock { $0.updates } }
    var deletes: [ContactItem.Identifier] { state.withLock { $0.deletes } }
    var terminalCount: Int { state.withLock { $0.anchors.count + $0.errors.count } }
    var anchor: (ContactItemSyncAnchor, Bool)? { state.withLock { $0.anchors.first } }
    var providerError: ContactProviderError? { state.withLock { $0.errors.first as? ContactProviderError } }
}

/// The result of a whole content enumeration driven by hand.
struct ContentRun {
    var items: [ContactItem] = []
    var pages: [ContactItemPage] = []
    var pageItems: [[ContactItem]] = []
    var marker = Data()
}

/// Pages through the content from the initial page, calling `between` after each page.
func enumerateContent(
    _ enumerator: any ContactItemEnumerator, pageSize: Int, between: (Int) throws -> Void = { _ in }
) async throws -> ContentRun {
    var run = ContentRun()
    var page = ContactItemPage.initialPage
    for index in 0..<100_000 {
        let observer = RecordingContentObserver(pageSize: pageSize)
        await enumerator.enumerateContent(in: page, for: observer)
        let terminals = observer.terminals
        try #require(terminals.count == 1)
        run.items += observer.items
        run.pageItems.append(observer.items)
        switch terminals[0] {
        case .page(let next):
            run.pages.append(next)
            page = next
            try between(index)
        case .content(let marker):
            run.marker = marker
            return run
        case .error(let text):
            Issue.record("content enumeration failed: \(text)")
            return run
        }
    }
    Issue.record("content enumeration did not end")
    return run
}

/// Applies change batches from `anchor` until `moreComing` is false; returns the last anchor.
@discardableResult
func applyChanges(
    _ enumerator: any ContactItemEnumerator, from anchor: ContactItemSyncAnchor, batchSize: Int,
    to contacts: inout [String: String], batches: inout [RecordingChangeObserver]
) async throws -> ContactItemSyncAnchor {
    var anchor = anchor
    for _ in 0..<100_000 {
        let observer = RecordingChangeObserver(batchSize: batchSize)
        await enumerator.enumerateChanges(startingAt: anchor, for: observer)
        try #require(observer.terminalCount == 1)
        batches.append(observer)
        let (next, more) = try #require(observer.anchor)
        for id in observer.deletes { contacts[id.value] = nil }
        for item in observer.updates { contacts[item.identifier.value] = item.contact.givenName }
        anchor = next
        if !more { return anchor }
    }
    Issue.record("change enumeration did not end")
    return anchor
}

/// A provider wrapper whose enumerators fail the first `failures` calls with `error`.
final class FlakyProvider: ContactProviding, Sendable {
    let inner: TrellisContactProvider
    let remaining: Mutex<Int>
    let error: ContactProviderError
    let calls = Mutex(0)

    init(_ inner: TrellisContactProvider, failures: Int, error: ContactProviderError = .cannotEnumerate) {
        self.inner = inner
        self.remaining = Mutex(failures)
        self.error = error
    }

    func configure(for domain: any ContactProviderDomain) { inner.configure(for: domain) }
    func invalidate() async throws {}

    func enumerator(for collection: ContactItem.Identifier) -> any ContactItemEnumerator {
        calls.withLock { $0 += 1 }
        let fail = remaining.withLock { r -> Bool in
            defer { r = max(0, r - 1) }
            return r > 0
        }
        return fail ? FailingEnumerator(error: error) : inner.enumerator(for: collection)
    }
}

struct FailingEnumerator: ContactItemEnumerator {
    let error: ContactProviderError
    func enumerateContent(in page: ContactItemPage, for observer: any ContactItemContentObserver) async {
        observer.didFinishEnumeratingContentWithError(error)
    }
    func enumerateChanges(startingAt syncAnchor: ContactItemSyncAnchor, for observer: any ContactItemChangeObserver)
        async
    {
        observer.didFinishEnumeratingChangesWithError(error)
    }
    func invalidate() async {}
}

/// A provider whose enumerators wait on a gate before each call, so a test can act mid-enumeration.
final class GatedProvider: ContactProviding, Sendable {
    let inner: TrellisContactProvider
    let entered = Mutex(0)
    let gate = Mutex<[CheckedContinuation<Void, Never>]>([])

    init(_ inner: TrellisContactProvider) { self.inner = inner }

    func configure(for domain: any ContactProviderDomain) {}
    func invalidate() async throws {}

    func enumerator(for collection: ContactItem.Identifier) -> any ContactItemEnumerator {
        GatedEnumerator(provider: self, inner: inner.enumerator(for: collection))
    }

    func open() {
        let waiting = gate.withLock { g in
            defer { g = [] }
            return g
        }
        for c in waiting { c.resume() }
    }

    /// Opens the gate every 2 ms until the returned task is cancelled.
    func keepOpening() -> Task<Void, Never> {
        Task {
            while !Task.isCancelled {
                open()
                try? await Task.sleep(for: .milliseconds(2))
            }
        }
    }

    func wait() async {
        await withCheckedContinuation { c in
            gate.withLock { $0.append(c) }
            entered.withLock { $0 += 1 }
        }
    }
}

struct GatedEnumerator: ContactItemEnumerator {
    let provider: GatedProvider
    let inner: any ContactItemEnumerator
    func enumerateContent(in page: ContactItemPage, for observer: any ContactItemContentObserver) async {
        await provider.wait()
        await inner.enumerateContent(in: page, for: observer)
    }
    func enumerateChanges(startingAt syncAnchor: ContactItemSyncAnchor, for observer: any ContactItemChangeObserver)
        async
    {
        await provider.wait()
        await inner.enumerateChanges(startingAt: syncAnchor, for: observer)
    }
    func invalidate() async {}
}

/// Runs `trellis ARGS…` to completion, reading both pipes to their end (no race with the exit).
func runTrellis(_ arguments: [String]) throws -> (status: Int32, stdout: String, stderr: String) {
    let binary = Repository.trellisBinary
    guard FileManager.default.isExecutableFile(atPath: binary.path) else {
        throw ProcessError("no trellis binary at \(binary.path); run `swift build` (scripts/test.sh does)")
    }
    let process = Process()
    process.executableURL = binary
    process.arguments = arguments
    let out = Pipe()
    let err = Pipe()
    process.standardOutput = out
    process.standardError = err
    process.standardInput = FileHandle.nullDevice
    try process.run()
    // Read stderr on another thread so neither pipe fills up while the other is read.
    let errors = Mutex(Data())
    let done = DispatchSemaphore(value: 0)
    let errorHandle = err.fileHandleForReading
    Thread.detachNewThread {
        let data = errorHandle.readDataToEndOfFile()
        errors.withLock { $0 = data }
        done.signal()
    }
    let output = out.fileHandleForReading.readDataToEndOfFile()
    done.wait()
    process.waitUntilExit()
    return (
        process.terminationStatus, String(decoding: output, as: UTF8.self),
        String(decoding: errors.withLock { $0 }, as: UTF8.self)
    )
}
