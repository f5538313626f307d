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
            let page = try read(after: after, through: marker.snapshot, limit: pageSize, includeDeleted: false)
            if page.listed > 0 { observer.didEnumerate(page.updates) }
            if page.more {
                observer.didFinishEnumeratingPage(
                    upTo: ContactItemPage(generationMarker: marker.data, offset: Int(page.last)))
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
            let batch = try read(after: cursor, through: nil, limit: batchSize, includeDeleted: true)
            if !batch.deletes.isEmpty { observer.didDelete(batch.deletes) }
            if !batch.updates.isEmpty { observer.didUpdate(batch.updates) }
            observer.didFinishEnumeratingChanges(
                upTo: ContactItemSyncAnchor(generationMarker: marker.data, offset: Int(batch.last)),
                moreComing: batch.more)
        } catch {
            observer.didFinishEnumeratingChangesWithError(error)
        }
    }

    /// What one page or batch read from the change log holds.
    private struct Batch {
        /// The live entries' items, in `seq` order.
        var updates: [ContactItem] = []
        /// The removed or evicted entries' identifiers, in `seq` order.
        var deletes: [ContactItem.Identifier] = []
        /// How many entries are listed (a live row without JSON text counts, as an entry with no
        /// item).
        var listed = 0
        /// The `seq` of the last entry listed (the cursor the read started from when none was).
        var last: Int64
        /// Whether the log holds entries after the last one listed.
        var more = false
    }

    /// Up to `limit` entries with `after < seq <= through`
    /// (``DocumentStore/readLogRows(in:after:through:limit:includeDeleted:_:)``), each live one a
    /// contact read from the stored JSON text when a property is first asked for
    /// (``ContactDocument/contact(deferringJSON:into:)``, the batch's texts copied into shared
    /// blocks) and its identifier, made straight from the row: no ``Value`` and no list of
    /// entries in between.
    ///
    /// One entry more than `limit` is read to tell whether more are coming; a row whose text is
    /// not JSON is skipped (and named by the store) wherever it is, that entry included.
    private func read(after: Int64, through: Int64?, limit: Int, includeDeleted: Bool) throws(StoreError) -> Batch {
        var batch = Batch(last: after)
        batch.updates.reserveCapacity(min(limit, 1_024))
        var count = 0
        var texts = ContactTexts()
        try store.readLogRows(
            in: collection, after: after, through: through, limit: limit + 1, includeDeleted: includeDeleted
        ) { seq, _, id, json in
            var contact: CNMutableContact?
            if let json {
                guard let read = ContactDocument.contact(deferringJSON: json, into: &texts) else { return false }
                contact = read
            }
            count += 1
            guard count <= limit else {
                batch.more = true
                return true
            }
            batch.listed = count
            batch.last = seq
            if let contact {
                batch.updates.append(.contact(contact, ContactDocument.identifier(for: id)))
            } else {
                batch.deletes.append(ContactDocument.identifier(for: id))
            }
            return true
        }
        return batch
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
