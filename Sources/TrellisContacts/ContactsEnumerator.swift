public import ContactProvider
import Foundation
import Synchronization
public import TrellisStore

/// Enumerates the contacts of one collection of a ``DocumentStore`` from its change log.
///
/// - Content: a fresh enumeration (``ContactItemPage/initialPage``) takes the snapshot
///   `S = lastSeq`; its marker is ``GenerationMarker`` `(epoch, S, collection)`. Each page lists the
///   live documents with `offset < seq <= S` in `seq` order, and the next page's offset is the
///   last `seq` listed. A document written after the snapshot has moved above `S` and is not
///   listed; the change enumeration that follows (from `S`) delivers it, and delivers removals
///   made during the paging as deletions, so content plus changes is exactly the live set.
/// - Changes: the anchor carries the content's marker and a cursor `offset` in `seq` order
///   (`max(offset, S)` is where a batch starts). A batch lists the log entries after the cursor:
///   live documents as updates, tombstones as deletions; each document appears once, at its
///   latest `seq`, so one batch never both updates and deletes an identifier.
/// - Expiry: a marker of another epoch or collection, a snapshot or cursor beyond the log's end
///   (a lost or replaced store), or below the collection's ``DocumentStore/retainedFloor(in:)``
///   (reaped tombstones) answers ``ContactProviderError/pageExpired`` or
///   ``ContactProviderError/changeAnchorExpired``; never an empty result.
///
/// The enumerator keeps no state between calls (a host may create one per call).
public final class ContactsEnumerator: ContactItemEnumerator, Sendable {
    public let store: DocumentStore
    public let collection: String
    /// Upper bounds applied whatever the observer suggests.
    public static let maxPageSize = 10_000
    private let invalidated = Mutex(false)

    public init(store: DocumentStore, collection: String) {
        self.store = store
        self.collection = collection
    }

    /// Enumerates one page of content; see the type's documentation.
    ///
    /// - Complexity: O(page size · log n) through the `(collection, seq)` index, plus the
    ///   tombstones skipped in the page's range.
    public func enumerateContent(in page: ContactItemPage, for observer: any ContactItemContentObserver) async {
        guard !invalidated.withLock({ $0 }) else {
            return observer.didFinishEnumeratingContentWithError(ContactProviderError.extensionInvalidated)
        }
        let pageSize = min(max(observer.suggestedPageSize, 1), Self.maxPageSize)
        let marker: GenerationMarker
        let after: Int64
        do {
            if page.generationMarker.isEmpty && page.offset == 0 {
                marker = GenerationMarker(epoch: store.epoch, snapshot: store.lastSeq, collection: collection)
                after = 0
            } else {
                guard let m = GenerationMarker(data: page.generationMarker), page.offset >= 0,
                    Int64(page.offset) <= m.snapshot, try isCurrent(m, cursor: m.snapshot)
                else { return observer.didFinishEnumeratingContentWithError(ContactProviderError.pageExpired) }
                marker = m
                after = Int64(page.offset)
            }
            var entries = try store.entries(
                in: collection, after: after, through: marker.snapshot, limit: pageSize + 1, includeDeleted: false,
                decodingJSON: { ContactDocument.contact(deferringJSON: $0) })
            let more = entries.count > pageSize
            if more { entries.removeLast() }
            if !entries.isEmpty { observer.didEnumerate(entries.compactMap(Self.item)) }
            if more, let last = entries.last {
                observer.didFinishEnumeratingPage(
                    upTo: ContactItemPage(generationMarker: marker.data, offset: Int(last.seq)))
            } else {
                observer.didFinishEnumeratingContent(upTo: marker.data)
            }
        } catch {
            observer.didFinishEnumeratingContentWithError(error)
        }
    }

    /// Enumerates one batch of changes; see the type's documentation.
    ///
    /// - Complexity: O(batch size · log n) through the `(collection, seq)` index: the cost follows
    ///   the number of changes, not the number of contacts.
    public func enumerateChanges(
        startingAt syncAnchor: ContactItemSyncAnchor, for observer: any ContactItemChangeObserver
    ) async {
        guard !invalidated.withLock({ $0 }) else {
            return observer.didFinishEnumeratingChangesWithError(ContactProviderError.extensionInvalidated)
        }
        let batchSize = min(max(observer.suggestedBatchSize, 1), Self.maxPageSize)
        do {
            guard let marker = GenerationMarker(data: syncAnchor.generationMarker), syncAnchor.offset >= 0 else {
                return observer.didFinishEnumeratingChangesWithError(ContactProviderError.changeAnchorExpired)
            }
            let cursor = max(Int64(syncAnchor.offset), marker.snapshot)
            guard try isCurrent(marker, cursor: cursor) else {
                return observer.didFinishEnumeratingChangesWithError(ContactProviderError.changeAnchorExpired)
            }
            var entries = try store.entries(
                in: collection, after: cursor, limit: batchSize + 1, includeDeleted: true,
                decodingJSON: { ContactDocument.contact(deferringJSON: $0) })
            let more = entries.count > batchSize
            if more { entries.removeLast() }
            let updates = entries.compactMap(Self.item)
            let deletes = entries.filter { $0.document == nil }.map { ContactDocument.identifier(for: $0.id) }
            if !deletes.isEmpty { observer.didDelete(deletes) }
            if !updates.isEmpty { observer.didUpdate(updates) }
            let next = entries.last.map { Int($0.seq) } ?? Int(cursor)
            observer.didFinishEnumeratingChanges(
                upTo: ContactItemSyncAnchor(generationMarker: marker.data, offset: next), moreComing: more)
        } catch {
            observer.didFinishEnumeratingChangesWithError(error)
        }
    }

    /// The item for a live entry, `nil` for a deleted one. Contacts are read straight from the
    /// stored JSON text, not through a ``Value``, when a property is first asked for
    /// (``ContactDocument/contact(deferringJSON:)``).
    private static func item(_ entry: DecodedLogEntry<CNMutableContact>) -> ContactItem? {
        entry.document.map { .contact($0, ContactDocument.identifier(for: entry.id)) }
    }

    /// Whether a marker names this store's log and collection, and a cursor it can still answer.
    private func isCurrent(_ marker: GenerationMarker, cursor: Int64) throws -> Bool {
        guard marker.epoch == store.epoch, marker.collectionHash == GenerationMarker.hash(collection) else {
            return false
        }
        guard marker.snapshot >= 0, cursor <= store.lastSeq else { return false }
        return cursor >= (try store.retainedFloor(in: collection))
    }

    /// Makes later calls end with ``ContactProviderError/extensionInvalidated``.
    public func invalidate() async {
        invalidated.withLock { $0 = true }
    }
}

/// A contact provider serving one collection of a Trellis store.
public final class TrellisContactProvider: ContactProviding, Sendable {
    public let store: DocumentStore
    public let collection: String
    private let configured = Mutex<String?>(nil)

    public init(store: DocumentStore, collection: String = "contacts") {
        self.store = store
        self.collection = collection
    }

    public func configure(for domain: any ContactProviderDomain) {
        configured.withLock { $0 = domain.identifier }
    }

    /// A new stateless enumerator over the collection (for ``ContactItem/Identifier/rootContainer``).
    public func enumerator(for collection: ContactItem.Identifier) -> any ContactItemEnumerator {
        ContactsEnumerator(store: store, collection: self.collection)
    }

    public func invalidate() async throws {}
}
