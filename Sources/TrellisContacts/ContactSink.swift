public import ContactProvider
import Foundation
import Synchronization

/// Where a ``ContactProviderHost`` puts the contacts it enumerates: the role of the system's
/// contact database (a vdir mirror, or memory in tests).
public protocol ContactSink: Sendable {
    /// A content enumeration starts from the initial page: every contact held now that is not
    /// updated before ``finishFullEnumeration()`` is removed then.
    func beginFullEnumeration() throws
    /// Adds or replaces contacts (idempotent).
    func update(_ items: [ContactItem]) throws
    /// Removes contacts (an unknown identifier is ignored).
    func delete(_ identifiers: [ContactItem.Identifier]) throws
    /// Ends a full enumeration: removes the contacts held at ``beginFullEnumeration()`` and not
    /// updated since.
    func finishFullEnumeration() throws
    /// Removes every contact.
    func removeAll() throws
}

/// A contact database in memory, recording what it was told (for tests and examples).
public final class MemoryContactSink: ContactSink {
    /// One call received.
    public enum Operation: Sendable, Hashable {
        case update(ContactItem.Identifier)
        case delete(ContactItem.Identifier)
        case removeAll
    }

    struct State {
        var contacts: [ContactItem.Identifier: CNContact] = [:]
        var stale: Set<ContactItem.Identifier>?
        var log: [Operation] = []
    }

    private let state = Mutex(State())
    /// Thrown by the next ``update(_:)`` when set (to simulate a crash or a failing disk).
    private let failure = Mutex<(any Error)?>(nil)

    public init() {}

    /// The contacts held, by identifier.
    public var contacts: [ContactItem.Identifier: CNContact] { state.withLock { $0.contacts } }
    /// Every call received, in order.
    public var log: [Operation] { state.withLock { $0.log } }

    /// Makes the next ``update(_:)`` throw `error` (once).
    public func failNextUpdate(with error: any Error) { failure.withLock { $0 = error } }

    public func beginFullEnumeration() throws {
        state.withLock { $0.stale = Set($0.contacts.keys) }
    }

    public func update(_ items: [ContactItem]) throws {
        if let error = failure.withLock({ f -> (any Error)? in
            defer { f = nil }
            return f
        }) {
            throw error
        }
        state.withLock { s in
            for item in items {
                s.contacts[item.identifier] = CNContact(copying: item.contact)
                s.stale?.remove(item.identifier)
                s.log.append(.update(item.identifier))
            }
        }
    }

    public func delete(_ identifiers: [ContactItem.Identifier]) throws {
        state.withLock { s in
            for id in identifiers {
                s.contacts[id] = nil
                s.log.append(.delete(id))
            }
        }
    }

    public func finishFullEnumeration() throws {
        state.withLock { s in
            for id in s.stale ?? [] { s.contacts[id] = nil }
            s.stale = nil
        }
    }

    public func removeAll() throws {
        state.withLock { s in
            s.contacts = [:]
            s.stale = nil
            s.log.append(.removeAll)
        }
    }
}
