import Synchronization

/// What the system side offers the app side: implemented by a host that drives enumerations
/// (TrellisContacts' `ContactProviderHost`), registered with
/// ``ContactProviderManager/register(_:)``.
public protocol ContactProviderSystem: Sendable {
    /// The domain the system hosts.
    var domain: any ContactProviderDomain { get }
    /// Whether the provider's contacts are shown.
    var isEnabled: Bool { get async }
    /// Turns the provider on and enumerates its content.
    func enable() async throws
    /// Turns the provider off and deletes the contacts it provided.
    func disable() async throws
    /// Deletes the provided contacts and enumerates content again from the initial page.
    func reset() async throws
    /// Asks for an enumeration of changes; calls are coalesced, enumerations never overlap.
    func signalEnumerator(for collection: ContactItem.Identifier) async throws
    /// Stops the system's work for this domain.
    func invalidate() async throws
}

private let registry = Mutex<[String: any ContactProviderSystem]>([:])

/// The app side's handle on a contact provider domain (Apple: `ContactProviderManager`).
public final class ContactProviderManager: Sendable {
    private let system: any ContactProviderSystem

    /// The domain managed.
    public var domain: any ContactProviderDomain { system.domain }

    /// A manager for the domain with this identifier.
    ///
    /// - Throws: ``ContactProviderError/domainNotRegistered`` when no system hosts the domain.
    public init(domainIdentifier: String = "defaultDomain") throws {
        guard let system = registry.withLock({ $0[domainIdentifier] }) else {
            throw ContactProviderError.domainNotRegistered
        }
        self.system = system
    }

    /// A manager for a given system (no registry lookup).
    public init(system: any ContactProviderSystem) { self.system = system }

    /// Registers the system hosting a domain, replacing any earlier one.
    public static func register(_ system: any ContactProviderSystem) {
        registry.withLock { $0[system.domain.identifier] = system }
    }

    /// Removes the registration of a domain.
    public static func unregister(domainIdentifier: String) {
        _ = registry.withLock { $0.removeValue(forKey: domainIdentifier) }
    }

    /// Whether the provider's contacts are shown.
    public var isEnabled: Bool { get async { await system.isEnabled } }

    public func enable() async throws { try await system.enable() }
    public func disable() async throws { try await system.disable() }
    public func reset() async throws { try await system.reset() }
    public func signalEnumerator(for collection: ContactItem.Identifier = .rootContainer) async throws {
        try await system.signalEnumerator(for: collection)
    }
    public func invalidate() async throws { try await system.invalidate() }
}
