public import Foundation

/// An item a contact provider supplies (Apple: `ContactItem`).
public enum ContactItem: Sendable, Hashable {
    /// A contact and its stable identifier.
    case contact(CNMutableContact, ContactItem.Identifier)

    /// The item's identifier.
    public var identifier: Identifier {
        switch self {
        case .contact(_, let id): return id
        }
    }

    /// The item's contact.
    public var contact: CNMutableContact {
        switch self {
        case .contact(let contact, _): return contact
        }
    }

    /// A stable identifier of an item within its domain (Apple: `ContactItem.Identifier`).
    ///
    /// Identifiers compare and hash by their UTF-8 bytes, as `NSString` compares them literally:
    /// "é" (U+00E9) and "e" + U+0301 are two identifiers, never merged by Unicode equivalence.
    public struct Identifier: Sendable, Hashable, CustomStringConvertible {
        /// The identifier's text.
        public let value: String

        public init(_ value: String) { self.value = value }

        /// The collection of all contacts of a domain.
        public static let rootContainer = Identifier("NSFileProviderRootContainerItemIdentifier")

        public var description: String { value }

        public static func == (lhs: Identifier, rhs: Identifier) -> Bool {
            lhs.value.utf8.elementsEqual(rhs.value.utf8)
        }

        public func hash(into hasher: inout Hasher) {
            for byte in value.utf8 { hasher.combine(byte) }
            hasher.combine(value.utf8.count)
        }
    }
}

/// A position in a content enumeration (Apple: `ContactItemPage`): the generation marker of the
/// enumeration and an offset whose meaning belongs to the enumerator. Both are opaque to the host.
public struct ContactItemPage: Sendable, Hashable {
    /// Names the state of the content being enumerated; empty only for ``initialPage``.
    public var generationMarker: Data
    /// Where the page starts, in the enumerator's terms.
    public var offset: Int

    public init(generationMarker: Data, offset: Int) {
        self.generationMarker = generationMarker
        self.offset = offset
    }

    /// The first page of a fresh enumeration: an empty marker and offset 0.
    public static let initialPage = ContactItemPage(generationMarker: Data(), offset: 0)
}

/// A position in the change history (Apple: `ContactItemSyncAnchor`), opaque to the host.
public struct ContactItemSyncAnchor: Sendable, Hashable {
    public var generationMarker: Data
    public var offset: Int

    public init(generationMarker: Data, offset: Int) {
        self.generationMarker = generationMarker
        self.offset = offset
    }
}

/// Errors of contact providers and of the system hosting them (Apple: `ContactProviderError`).
public enum ContactProviderError: Error, Sendable, Hashable, CustomStringConvertible {
    case featureNotAvailable
    case deniedByUser
    case extensionNotFound
    case itemsLimitReached
    case cannotEnumerate
    case enumerationTimeout
    /// The page's generation marker no longer names a state the provider can page: the host
    /// restarts from ``ContactItemPage/initialPage``.
    case pageExpired
    /// The anchor names changes the provider no longer has: the host restarts with a content
    /// enumeration.
    case changeAnchorExpired
    /// The enumeration was stopped by `disable()`, `reset()` or `invalidate()`.
    case extensionInvalidated
    case extensionInvalidateTimeout
    case domainNotRegistered

    public var description: String {
        switch self {
        case .featureNotAvailable: return "contact providers are not available"
        case .deniedByUser: return "the user denied access to the contact provider"
        case .extensionNotFound: return "no contact provider extension was found"
        case .itemsLimitReached: return "the provider supplied more items than allowed"
        case .cannotEnumerate: return "the provider cannot enumerate its contacts"
        case .enumerationTimeout: return "the enumeration did not finish in time"
        case .pageExpired: return "the page's generation marker expired; enumerate content from the initial page"
        case .changeAnchorExpired: return "the change anchor expired; enumerate content from the initial page"
        case .extensionInvalidated: return "the provider was disabled, reset or invalidated during the enumeration"
        case .extensionInvalidateTimeout: return "the provider did not finish invalidating in time"
        case .domainNotRegistered: return "no contact provider is registered for this domain"
        }
    }
}
