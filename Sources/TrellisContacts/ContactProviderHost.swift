public import ContactProvider
public import Foundation
import Synchronization

/// Where the host is in its enumerations, persisted after every page and batch.
public struct ContactHostState: Sendable, Hashable, Codable {
    /// `true` while content is enumerated, `false` while changes are.
    public var enumeratingContent = true
    /// The page's or anchor's generation marker.
    public var marker = Data()
    /// The page's or anchor's offset.
    public var offset = 0
    /// Whether the sink was told a full enumeration began (so a resumed one does not begin again).
    public var fullEnumerationBegun = false
    public var enabled = false

    public init() {}

    var page: ContactItemPage { ContactItemPage(generationMarker: marker, offset: offset) }
    var anchor: ContactItemSyncAnchor { ContactItemSyncAnchor(generationMarker: marker, offset: offset) }
}

/// A rule of Apple's ContactProvider API that a provider broke, as ``ContactProviderHost`` found
/// it: thrown by the host (content rules) or recorded in ``ContactProviderHost/lastViolation``.
///
/// iOS reports such a provider as unable to enumerate; ``code`` is that error. The rules are those
/// of `ContactItemPage.generationMarker` ("you must use the same `generationMarker` until the
/// enumeration completes") and `ContactItemChangeObserver` (a batch with no changes does not say
/// `moreComing`).
public struct ContactProviderRuleViolation: Error, Sendable, Hashable, CustomStringConvertible {
    /// Which rule was broken.
    public enum Rule: String, Sendable, Hashable {
        /// `didFinishEnumeratingPage(upTo:)` or `didFinishEnumeratingContent(upTo:)` was given an
        /// empty generation marker.
        case emptyGenerationMarker
        /// A content page's generation marker differs from the one the same enumeration's earlier
        /// pages carried.
        case changedGenerationMarker
        /// A change batch said `moreComing: true` with no change and an anchor already seen in
        /// this run's run of such batches (the same one, or a cycle).
        case moreComingWithoutProgress
    }

    /// The rule broken.
    public var rule: Rule
    /// The observer call that broke it, e.g. `didFinishEnumeratingPage(upTo:)`.
    public var call: String
    /// The generation marker given (hex, at most 32 bytes shown).
    public var marker: String
    /// For ``Rule/changedGenerationMarker``, the marker of the earlier pages (hex); else empty.
    public var expectedMarker: String
    /// For ``Rule/moreComingWithoutProgress``, the anchor's offset; else 0.
    public var offset: Int

    /// The `ContactProviderError` iOS reports for a provider that breaks a rule.
    public var code: ContactProviderError { .cannotEnumerate }

    /// A violation of `rule` by the observer call `call`.
    /// - Parameters:
    ///   - marker: the generation marker given (shown in hex, at most 32 bytes).
    ///   - expectedMarker: the marker the enumeration's earlier pages carried, if any.
    ///   - offset: the anchor's offset, for ``Rule/moreComingWithoutProgress``.
    public init(rule: Rule, call: String, marker: Data, expectedMarker: Data = Data(), offset: Int = 0) {
        self.rule = rule
        self.call = call
        self.marker = Self.hex(marker)
        self.expectedMarker = Self.hex(expectedMarker)
        self.offset = offset
    }

    static func hex(_ data: Data) -> String {
        data.prefix(32).map { String(format: "%02x", $0) }.joined() + (data.count > 32 ? "…" : "")
    }

    /// What was broken, by which call, with the markers, and what the host did about it.
    public var description: String {
        let broken: String
        switch rule {
        case .emptyGenerationMarker:
            broken =
                "\(call) was given an empty generation marker (every page of a content enumeration, and its "
                + "end, must carry the same non-empty marker); not retried, since the same provider code "
                + "would break the rule again"
        case .changedGenerationMarker:
            broken =
                "\(call) was given generation marker \(marker) while the enumeration's earlier pages carried "
                + "\(expectedMarker) (the marker must not change until the enumeration completes); not "
                + "retried, since the same provider code would break the rule again"
        case .moreComingWithoutProgress:
            broken =
                "\(call) said moreComing: true with no change and an anchor already seen (generation "
                + "marker \(marker), offset \(offset)); change enumeration stopped until the next signal"
        }
        return "the contact provider broke a ContactProvider rule: " + broken
    }
}

/// What a host reports while it works.
public enum ContactHostProgress: Sendable, Hashable {
    /// A content page was applied; `items` counts the items of this content enumeration so far.
    case contentPage(items: Int, pages: Int)
    /// A content enumeration finished with `items` items in `pages` pages.
    case contentFinished(items: Int, pages: Int)
    /// A change batch was applied.
    case changes(updates: Int, deletes: Int)
}

/// The system side of a contact provider, the role iOS plays: drives content enumeration from
/// ``ContactProvider/ContactItemPage/initialPage``, then change enumeration while `moreComing`,
/// applying what it receives to a ``ContactSink``.
///
/// - Saves the last page and anchor (``ContactHostState``, in a file when given one) after each
///   page or batch is applied, and resumes from them.
/// - Retries other errors up to ``maxRetries`` times from the last saved page or anchor; restarts
///   from the initial page on `pageExpired` or `changeAnchorExpired`.
/// - Checks what iOS checks, and fails without retrying when a provider breaks a rule (retrying
///   the same code cannot help): a page handed to `didFinishEnumeratingPage(upTo:)` with an
///   empty generation marker, or a marker that changes between the pages of one content
///   enumeration (or at its end), throws ``ContactProviderRuleViolation`` naming the rule, the
///   call and the markers (its ``ContactProviderRuleViolation/code`` is iOS's
///   ``ContactProvider/ContactProviderError/cannotEnumerate``); ``lastViolation`` keeps it. A
///   change batch with `moreComing: true` that carries no change and returns an anchor already
///   seen since the last batch with changes (the one it started from, or an earlier one: a
///   cycle) ends the change enumeration of this run, which would otherwise ask forever; the run
///   succeeds and ``lastViolation`` records it.
/// - Coalesces ``signalEnumerator(for:)``: enumerations never overlap; signals arriving during
///   one are served together by one more.
/// - Creates a new enumerator for every call, so providers cannot keep state in them.
/// - Calls the provider and its enumerators one method at a time (enumerations never overlap),
///   so neither needs to be `Sendable`: a non-final class conforms, as on iOS.
/// - Copies the contacts it receives: a provider may reuse a `CNMutableContact` it handed over.
public actor ContactProviderHost: ContactProviderSystem {
    public nonisolated let domain: any ContactProviderDomain
    /// The provider, reached only through ``calls``.
    private nonisolated let calls: ProviderCalls
    /// The provider hosted.
    public var provider: any ContactProviding { calls.provider }
    public let sink: any ContactSink
    /// The file holding ``ContactHostState`` (JSON), or `nil` to keep it in memory.
    public nonisolated let stateFile: URL?
    /// Attempts after the first for one failing page or batch.
    public var maxRetries = 3
    /// Items asked for per content page.
    public var pageSize = 500
    /// Updates plus deletes asked for per change batch.
    public var batchSize = 500
    /// Called after each page and batch.
    public var onProgress: (@Sendable (ContactHostProgress) -> Void)?

    public private(set) var state: ContactHostState
    /// The last rule a provider broke (see the type's description), or `nil`.
    public private(set) var lastViolation: ContactProviderRuleViolation?
    private var running = false
    private var waiting: [CheckedContinuation<Void, any Error>] = []
    /// Calls waiting for the run under way to end.
    private var idle: [CheckedContinuation<Void, Never>] = []
    /// Bumped by disable, reset and invalidate: a run started under an older one stops.
    private var generation = 0
    private var contentItems = 0
    private var contentPages = 0

    /// Creates a host; `stateFile`, when it exists, holds the state to resume from.
    public init(
        provider: sending any ContactProviding, sink: any ContactSink,
        domain: any ContactProviderDomain = DefaultContactProviderDomain(), stateFile: URL? = nil
    ) {
        self.calls = ProviderCalls(provider)
        self.sink = sink
        self.domain = domain
        self.stateFile = stateFile
        if let stateFile, let data = try? Data(contentsOf: stateFile),
            let saved = try? JSONDecoder().decode(ContactHostState.self, from: data)
        {
            state = saved
        } else {
            state = ContactHostState()
        }
        calls.provider.configure(for: domain)
    }

    public func setPageSize(_ size: Int) { pageSize = size }
    public func setBatchSize(_ size: Int) { batchSize = size }
    public func setMaxRetries(_ count: Int) { maxRetries = count }
    public func setProgressHandler(_ handler: (@Sendable (ContactHostProgress) -> Void)?) { onProgress = handler }

    public var isEnabled: Bool { state.enabled }

    /// Turns the provider on (persisted) and enumerates until caught up.
    public func enable() async throws {
        if !state.enabled {
            state.enabled = true
            try save()
        }
        try await sync()
    }

    /// Turns the provider off and removes its contacts from the sink; a running enumeration ends
    /// with ``ContactProvider/ContactProviderError/extensionInvalidated``.
    public func disable() async throws {
        generation += 1
        state = ContactHostState()
        try sink.removeAll()
        try save()
    }

    /// Removes the contacts and enumerates content again from the initial page; a running
    /// enumeration ends with ``ContactProvider/ContactProviderError/extensionInvalidated``.
    public func reset() async throws {
        generation += 1
        let enabled = state.enabled
        state = ContactHostState()
        state.enabled = enabled
        try sink.removeAll()
        try save()
        try await sync()
    }

    /// Enumerates until caught up (coalesced with any enumeration already running).
    public func signalEnumerator(for collection: ContactItem.Identifier = .rootContainer) async throws {
        try await sync()
    }

    /// Stops: a running enumeration ends with `extensionInvalidated`; the provider is invalidated
    /// once the enumerator call under way (if any) has returned.
    public func invalidate() async throws {
        generation += 1
        if running { await withCheckedContinuation { idle.append($0) } }
        try await calls.invalidate()
    }

    /// Runs enumerations until caught up. A call made while one runs waits for the next run,
    /// which serves every call made meanwhile.
    public func sync() async throws {
        if running {
            try await withCheckedThrowingContinuation { waiting.append($0) }
            return
        }
        running = true
        defer {
            running = false
            for continuation in idle { continuation.resume() }
            idle = []
        }
        let first: Result<Void, any Error>
        do {
            try await runOnce()
            first = .success(())
        } catch {
            first = .failure(error)
        }
        while !waiting.isEmpty {
            let served = waiting
            waiting = []
            let result: Result<Void, any Error>
            do {
                try await runOnce()
                result = .success(())
            } catch {
                result = .failure(error)
            }
            for continuation in served { continuation.resume(with: result) }
        }
        try first.get()
    }

    private func save() throws {
        guard let stateFile else { return }
        let data = try JSONEncoder().encode(state)
        try data.write(to: stateFile, options: .atomic)
    }

    private func checkGeneration(_ started: Int) throws {
        guard generation == started else { throw ContactProviderError.extensionInvalidated }
    }

    private func runOnce() async throws {
        guard state.enabled else { return }
        let started = generation
        var failures = 0
        var restarts = 0
        // Anchors change batches started from since the last batch with changes.
        var quietAnchors: Set<ContactItemSyncAnchor> = []
        while true {
            try checkGeneration(started)
            if state.enumeratingContent {
                quietAnchors = []
                if state.marker.isEmpty && state.offset == 0 && !state.fullEnumerationBegun {
                    try sink.beginFullEnumeration()
                    state.fullEnumerationBegun = true
                    contentItems = 0
                    contentPages = 0
                    try save()
                }
                let observer = HostContentObserver(pageSize: pageSize)
                await calls.enumerateContent(in: state.page, for: observer)
                try checkGeneration(started)
                switch observer.outcome {
                case .page(let items, let next):
                    try checkMarker(next.generationMarker, "didFinishEnumeratingPage(upTo:)")
                    try sink.update(items)
                    state.marker = next.generationMarker
                    state.offset = next.offset
                    contentItems += items.count
                    contentPages += 1
                    try save()
                    failures = 0
                    onProgress?(.contentPage(items: contentItems, pages: contentPages))
                case .finished(let items, let marker):
                    try checkMarker(marker, "didFinishEnumeratingContent(upTo:)")
                    try sink.update(items)
                    try sink.finishFullEnumeration()
                    contentItems += items.count
                    contentPages += 1
                    state.enumeratingContent = false
                    state.fullEnumerationBegun = false
                    state.marker = marker
                    state.offset = 0
                    try save()
                    failures = 0
                    onProgress?(.contentFinished(items: contentItems, pages: contentPages))
                case .failed(let error):
                    try handle(error, failures: &failures, restarts: &restarts)
                }
            } else {
                let observer = HostChangeObserver(batchSize: batchSize)
                await calls.enumerateChanges(startingAt: state.anchor, for: observer)
                try checkGeneration(started)
                switch observer.outcome {
                case .batch(let updates, let deletes, let anchor, let more):
                    let quiet = updates.isEmpty && deletes.isEmpty
                    if quiet { quietAnchors.insert(state.anchor) } else { quietAnchors = [] }
                    let stalled = more && quiet && quietAnchors.contains(anchor)
                    try sink.delete(deletes)
                    try sink.update(updates)
                    state.marker = anchor.generationMarker
                    state.offset = anchor.offset
                    try save()
                    failures = 0
                    onProgress?(.changes(updates: updates.count, deletes: deletes.count))
                    if stalled {
                        lastViolation = ContactProviderRuleViolation(
                            rule: .moreComingWithoutProgress, call: "didFinishEnumeratingChanges(upTo:moreComing:)",
                            marker: anchor.generationMarker, offset: anchor.offset)
                        return
                    }
                    if !more { return }
                case .failed(let error):
                    try handle(error, failures: &failures, restarts: &restarts)
                }
            }
        }
    }

    /// Fails, without retry, when a content page's generation marker is empty or differs from
    /// the one the enumeration's earlier pages carried.
    private func checkMarker(_ marker: Data, _ call: String) throws(ContactProviderRuleViolation) {
        let violation: ContactProviderRuleViolation
        if marker.isEmpty {
            violation = ContactProviderRuleViolation(rule: .emptyGenerationMarker, call: call, marker: marker)
        } else if !state.marker.isEmpty && marker != state.marker {
            violation = ContactProviderRuleViolation(
                rule: .changedGenerationMarker, call: call, marker: marker, expectedMarker: state.marker)
        } else {
            return
        }
        lastViolation = violation
        throw violation
    }

    /// Restarts on expiry (at most ``maxRetries`` + 1 times per run), otherwise counts a failure
    /// and throws once there were more than ``maxRetries``.
    private func handle(_ error: any Error, failures: inout Int, restarts: inout Int) throws {
        if let e = error as? ContactProviderError, e == .pageExpired || e == .changeAnchorExpired {
            restarts += 1
            guard restarts <= maxRetries + 1 else { throw error }
            let enabled = state.enabled
            state = ContactHostState()
            state.enabled = enabled
            try save()
            return
        }
        if let e = error as? ContactProviderError, e == .extensionInvalidated { throw error }
        failures += 1
        if failures > maxRetries { throw error }
    }
}

/// The outcome of one content page, as a host sees it.
enum ContentOutcome {
    case page([ContactItem], ContactItemPage)
    case finished([ContactItem], Data)
    case failed(any Error)
}

enum ChangeOutcome {
    case batch(updates: [ContactItem], deletes: [ContactItem.Identifier], ContactItemSyncAnchor, moreComing: Bool)
    case failed(any Error)
}

/// Calls a provider that need not be `Sendable`. Safe because the host makes one call at a time
/// (a run holds the actor's `running` flag; `invalidate` comes after the run stops or instead
/// of it) and each enumeration gets a new enumerator that lives only for that call.
final class ProviderCalls: @unchecked Sendable {
    let provider: any ContactProviding

    init(_ provider: any ContactProviding) { self.provider = provider }

    func enumerateContent(in page: ContactItemPage, for observer: HostContentObserver) async {
        let enumerator = provider.enumerator(for: .rootContainer)
        await enumerator.enumerateContent(in: page, for: observer)
    }

    func enumerateChanges(startingAt anchor: ContactItemSyncAnchor, for observer: HostChangeObserver) async {
        let enumerator = provider.enumerator(for: .rootContainer)
        await enumerator.enumerateChanges(startingAt: anchor, for: observer)
    }

    func invalidate() async throws { try await provider.invalidate() }
}

/// Collects one page; checks the terminal-call and page-size rules.
final class HostContentObserver: ContactItemContentObserver {
    struct State {
        var items: [ContactItem] = []
        var terminal: [ContentOutcome] = []
    }
    let suggestedPageSize: Int
    private let state = Mutex(State())

    init(pageSize: Int) { suggestedPageSize = pageSize }

    func didEnumerate(_ items: [ContactItem]) { state.withLock { $0.items += items.map(\.copied) } }
    func didFinishEnumeratingPage(upTo nextPage: ContactItemPage) {
        state.withLock { $0.terminal.append(.page($0.items, nextPage)) }
    }
    func didFinishEnumeratingContent(upTo generationMarker: Data) {
        state.withLock { $0.terminal.append(.finished($0.items, generationMarker)) }
    }
    func didFinishEnumeratingContentWithError(_ error: any Error) {
        state.withLock { $0.terminal.append(.failed(error)) }
    }

    var outcome: ContentOutcome {
        state.withLock { s in
            guard s.terminal.count == 1 else {
                return .failed(
                    s.terminal.isEmpty ? ContactProviderError.enumerationTimeout : ContactProviderError.cannotEnumerate)
            }
            if s.items.count > suggestedPageSize { return .failed(ContactProviderError.itemsLimitReached) }
            return s.terminal[0]
        }
    }
}

/// Collects one change batch; checks the terminal-call and batch-size rules.
final class HostChangeObserver: ContactItemChangeObserver {
    struct State {
        var updates: [ContactItem] = []
        var deletes: [ContactItem.Identifier] = []
        var terminal: [ChangeOutcome] = []
    }
    let suggestedBatchSize: Int
    private let state = Mutex(State())

    init(batchSize: Int) { suggestedBatchSize = batchSize }

    func didUpdate(_ items: [ContactItem]) { state.withLock { $0.updates += items.map(\.copied) } }
    func didDelete(_ identifiers: [ContactItem.Identifier]) { state.withLock { $0.deletes += identifiers } }
    func didFinishEnumeratingChanges(upTo syncAnchor: ContactItemSyncAnchor, moreComing: Bool) {
        state.withLock {
            $0.terminal.append(.batch(updates: $0.updates, deletes: $0.deletes, syncAnchor, moreComing: moreComing))
        }
    }
    func didFinishEnumeratingChangesWithError(_ error: any Error) {
        state.withLock { $0.terminal.append(.failed(error)) }
    }

    var outcome: ChangeOutcome {
        state.withLock { s in
            guard s.terminal.count == 1 else {
                return .failed(
                    s.terminal.isEmpty ? ContactProviderError.enumerationTimeout : ContactProviderError.cannotEnumerate)
            }
            if s.updates.count + s.deletes.count > suggestedBatchSize {
                return .failed(ContactProviderError.itemsLimitReached)
            }
            return s.terminal[0]
        }
    }
}

extension ContactItem {
    /// The item with a contact of its own: the provider may change the one it handed over.
    var copied: ContactItem { .contact(contact.mutableContact(), identifier) }
}
