public import Foundation

/// Receives the items of one page of a content enumeration (Apple: `ContactItemContentObserver`).
///
/// An enumerator calls ``didEnumerate(_:)`` any number of times, then exactly one of the three
/// terminal calls, before its `enumerateContent` returns.
public protocol ContactItemContentObserver: Sendable {
    /// Items of the page (may be called several times per page).
    func didEnumerate(_ items: [ContactItem])
    /// The page is done and more items remain, starting at `nextPage` (the host saves it).
    func didFinishEnumeratingPage(upTo nextPage: ContactItemPage)
    /// The content is done; changes are asked for from `generationMarker` on.
    func didFinishEnumeratingContent(upTo generationMarker: Data)
    /// The page failed; ``ContactProviderError/pageExpired`` restarts the enumeration.
    func didFinishEnumeratingContentWithError(_ error: any Error)
    /// The upper bound on the items of one page, across all ``didEnumerate(_:)`` calls.
    var suggestedPageSize: Int { get }
}

/// Receives one batch of changes (Apple: `ContactItemChangeObserver`).
///
/// An enumerator calls ``didUpdate(_:)`` and ``didDelete(_:)`` any number of times, then exactly one
/// of the two terminal calls, before its `enumerateChanges` returns.
public protocol ContactItemChangeObserver: Sendable {
    /// Items added or changed (upserts).
    func didUpdate(_ items: [ContactItem])
    /// Items removed.
    func didDelete(_ identifiers: [ContactItem.Identifier])
    /// The batch is done; the host saves `syncAnchor` and, when `moreComing`, asks again from it.
    func didFinishEnumeratingChanges(upTo syncAnchor: ContactItemSyncAnchor, moreComing: Bool)
    /// The batch failed; ``ContactProviderError/changeAnchorExpired`` restarts with content.
    func didFinishEnumeratingChangesWithError(_ error: any Error)
    /// The upper bound on updates plus deletes of one batch.
    var suggestedBatchSize: Int { get }
}

/// Enumerates the contacts of one collection (Apple: `ContactItemEnumerator`). No method throws:
/// every outcome reaches the observer, before the method returns.
///
/// Not `Sendable`, as Apple's: a non-final class conforms. The host calls one method at a time and
/// makes a new enumerator for every call.
public protocol ContactItemEnumerator {
    /// Enumerates one page of content.
    func enumerateContent(in page: ContactItemPage, for observer: any ContactItemContentObserver) async
    /// Enumerates one batch of changes after `syncAnchor`.
    func enumerateChanges(startingAt syncAnchor: ContactItemSyncAnchor, for observer: any ContactItemChangeObserver)
        async
    /// Releases the enumerator's resources.
    func invalidate() async
}

/// Supplies enumerators (Apple: `ContactItemEnumerating`).
public protocol ContactItemEnumerating {
    /// An enumerator for `collection` (``ContactItem/Identifier/rootContainer``: every contact).
    func enumerator(for collection: ContactItem.Identifier) -> any ContactItemEnumerator
}

/// A set of contacts a provider supplies (Apple: `ContactProviderDomain`).
public protocol ContactProviderDomain: Sendable {
    var displayName: String { get }
    var identifier: String { get }
    var userInfo: [String: String] { get }
}

/// The domain a provider gets when it declares none (Apple: `DefaultContactProviderDomain`).
public struct DefaultContactProviderDomain: ContactProviderDomain, Hashable {
    public var displayName: String
    public var identifier: String { "defaultDomain" }
    public var userInfo: [String: String] { [:] }

    public init(displayName: String = "Contacts") { self.displayName = displayName }
}

/// What a host drives (Trellis only): a provider of enumerators that is configured before the first
/// one and invalidated at the end. Apple's ``ContactProviderExtension`` is this and an
/// ``AppExtension``; a provider built in code (TrellisContacts' `TrellisContactProvider`, which
/// needs a store) is only this.
///
/// Not `Sendable`: the host calls one method at a time. Its conformances are not isolated to an
/// actor (`SendableMetatype`), so a new provider can be handed to a host.
public protocol ContactProviding: ContactItemEnumerating, SendableMetatype {
    /// Called once, before any enumeration.
    func configure(for domain: any ContactProviderDomain)
    /// Called when the provider is disabled or the system stops it.
    func invalidate() async throws
}

/// A type the system creates and runs as an extension (Apple's ExtensionFoundation
/// `AppExtension`, reduced to its initializer: Linux has no extension points). TrellisContacts
/// gives a ``ContactProviderExtension`` the `static func main()` that `@main` needs.
public protocol AppExtension {
    /// The system creates the extension with this initializer (a class conforms with
    /// `required init()`, as on iOS).
    init()
}

/// A contact provider extension (Apple: `ContactProviderExtension`), the type an `@main`
/// provider declares: `@main class Provider: ContactProviderExtension`. Importing TrellisContacts
/// gives it the entry point that runs it on a ``ContactProviderManager``'s host (see
/// docs/CONTACTS.md, "Porting a provider").
public protocol ContactProviderExtension: ContactProviding, AppExtension {}
