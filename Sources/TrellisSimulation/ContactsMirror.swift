import ContactProvider
import Foundation
import Synchronization
import TrellisContacts
import TrellisCore
import TrellisStore

/// A contacts mirror of one simulated node: the real ``ContactsEnumerator`` of the node's store,
/// driven as a contacts host drives it — a content enumeration, then change batches from the
/// anchor it ended with; an expired page or anchor (a rotated log, a wiped store) starts a full
/// enumeration again — into an in-memory vdir (one vCard per identifier).
///
/// The enumerator's methods are `async` but never suspend, so they run to completion on the
/// simulation's thread (``InlineExecutor``): no thread pool, and the same order every run.
final class SimulatedContactsMirror {
    let collection: String
    /// vCard text by identifier: what a vdir of this node would hold.
    private(set) var cards: [String: String] = [:]
    private var anchor: ContactItemSyncAnchor?
    /// Full enumerations made (the first one included).
    private(set) var fullEnumerations = 0

    init(collection: String) { self.collection = collection }

    /// Brings the mirror up to date with `store`.
    ///
    /// - Throws: an enumeration error other than an expired page or anchor.
    func sync(_ store: DocumentStore) throws {
        let enumerator = ContactsEnumerator(store: store, collection: collection)
        for _ in 0..<1_000 {
            guard let anchor else {
                try enumerateContent(enumerator)
                continue
            }
            let observer = ChangeCollector()
            InlineExecutor.run { await enumerator.enumerateChanges(startingAt: anchor, for: observer) }
            let outcome = observer.state.withLock { $0 }
            if let error = outcome.error {
                guard let expired = error as? ContactProviderError, expired == .changeAnchorExpired else { throw error }
                self.anchor = nil
                continue
            }
            for identifier in outcome.deleted { cards[identifier.value] = nil }
            for item in outcome.updated {
                cards[item.identifier.value] = VCard.serialize(item.contact, uid: item.identifier.value)
            }
            self.anchor = outcome.next
            if !outcome.moreComing { return }
        }
        throw SimulationMirrorError("the contacts mirror of '\(collection)' did not catch up in 1,000 batches")
    }

    private func enumerateContent(_ enumerator: ContactsEnumerator) throws {
        fullEnumerations += 1
        var fresh: [String: String] = [:]
        var page = ContactItemPage.initialPage
        for _ in 0..<10_000 {
            let observer = ContentCollector()
            let current = page
            InlineExecutor.run { await enumerator.enumerateContent(in: current, for: observer) }
            let outcome = observer.state.withLock { $0 }
            if let error = outcome.error {
                guard let expired = error as? ContactProviderError, expired == .pageExpired else { throw error }
                fresh = [:]
                page = .initialPage
                continue
            }
            for item in outcome.items {
                fresh[item.identifier.value] = VCard.serialize(item.contact, uid: item.identifier.value)
            }
            if let next = outcome.nextPage {
                page = next
                continue
            }
            cards = fresh
            anchor = ContactItemSyncAnchor(generationMarker: outcome.marker ?? Data(), offset: 0)
            return
        }
        throw SimulationMirrorError("the contacts content of '\(collection)' did not end in 10,000 pages")
    }

    /// What the mirror should hold: every live document of the collection as a vCard.
    static func expected(_ store: DocumentStore, collection: String) throws -> [String: String] {
        var out: [String: String] = [:]
        for value in try store.documents(in: collection) {
            guard let id = value["_id"] else { continue }
            let identifier = ContactDocument.identifier(for: id)
            out[identifier.value] = VCard.serialize(ContactDocument.contact(from: value), uid: identifier.value)
        }
        return out
    }
}

struct SimulationMirrorError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

private final class ContentCollector: ContactItemContentObserver {
    struct Outcome {
        var items: [ContactItem] = []
        var nextPage: ContactItemPage?
        var marker: Data?
        var error: (any Error)?
    }
    let state = Mutex(Outcome())
    var suggestedPageSize: Int { 50 }
    func didEnumerate(_ items: [ContactItem]) { state.withLock { $0.items += items } }
    func didFinishEnumeratingPage(upTo nextPage: ContactItemPage) { state.withLock { $0.nextPage = nextPage } }
    func didFinishEnumeratingContent(upTo generationMarker: Data) { state.withLock { $0.marker = generationMarker } }
    func didFinishEnumeratingContentWithError(_ error: any Error) { state.withLock { $0.error = error } }
}

private final class ChangeCollector: ContactItemChangeObserver {
    struct Outcome {
        var updated: [ContactItem] = []
        var deleted: [ContactItem.Identifier] = []
        var next: ContactItemSyncAnchor?
        var moreComing = false
        var error: (any Error)?
    }
    let state = Mutex(Outcome())
    var suggestedBatchSize: Int { 50 }
    func didUpdate(_ items: [ContactItem]) { state.withLock { $0.updated += items } }
    func didDelete(_ identifiers: [ContactItem.Identifier]) { state.withLock { $0.deleted += identifiers } }
    func didFinishEnumeratingChanges(upTo syncAnchor: ContactItemSyncAnchor, moreComing: Bool) {
        state.withLock {
            $0.next = syncAnchor
            $0.moreComing = moreComing
        }
    }
    func didFinishEnumeratingChangesWithError(_ error: any Error) { state.withLock { $0.error = error } }
}

/// Runs an `async` operation to completion on the calling thread: its jobs are queued on this
/// task executor and run here, so nothing depends on (or blocks) the cooperative thread pool.
final class InlineExecutor: TaskExecutor, @unchecked Sendable {
    private let jobs = Mutex<[UnownedJob]>([])
    private let ready = DispatchSemaphore(value: 0)

    func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        jobs.withLock { $0.append(unowned) }
        ready.signal()
    }

    /// Runs `operation` and returns when it has finished.
    static func run(_ operation: @escaping @Sendable () async -> Void) {
        let executor = InlineExecutor()
        let done = Atomic<Bool>(false)
        Task(executorPreference: executor) {
            await operation()
            done.store(true, ordering: .releasing)
        }
        while !done.load(ordering: .acquiring) {
            executor.ready.wait()
            while let job = executor.jobs.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) {
                job.runSynchronously(on: executor.asUnownedTaskExecutor())
            }
        }
    }
}
