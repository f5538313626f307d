import Synchronization
import Testing
import TrellisCore
import TrellisStore
import TrellisSync

/// Scan time shared among peers (``SyncHost/scanClock``): a peer whose subscriptions are
/// expensive to scan gets no more of it than a peer whose scans are cheap.
@Suite struct ScanFairnessTests {
    /// Peer 1 asks for 64 subscriptions whose scans cost 10 units each (on the test's clock);
    /// peer 2 then asks for the whole collection, 20 pages at 1 unit each. While peer 2 catches
    /// up, peer 1 gets about as much scan time as peer 2 (2 or 3 scans), not one scan per page
    /// of peer 2's (20), as taking turns scan by scan gave.
    @Test func anExpensivePeerGetsNoMoreScanTimeThanACheapOne() throws {
        let store = try DocumentStore(path: ":memory:")
        defer { store.close() }
        let documents: [Value] = (0..<20_000).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] }
        _ = try store.upsert(documents, in: "items", writeStrategy: .merge)
        let costly = CostlyStore(store)
        let transport = RecordingTransport()
        let host = try SyncHost(
            configuration: ReplicatorConfiguration(peerKey: [UInt8](repeating: 1, count: 32)), store: costly,
            transport: transport, seed: 1, now: { 1_000 }, log: { _ in })
        host.scanClock = { costly.clock.withLock { $0 } }

        func open(_ link: LinkID, _ subscriptions: [WireSubscription]) {
            host.linkOpened(
                link, peerKey: [UInt8](repeating: UInt8(10 + link.raw), count: 32), initiator: false,
                address: "peer \(link.raw)", endpoint: nil)
            let hello = Hello(
                version: WireMessage.protocolVersion, peerKey: [UInt8](repeating: UInt8(10 + link.raw), count: 32),
                site: SiteID(link.raw), epoch: [UInt8](repeating: UInt8(link.raw), count: 16))
            host.received(WireMessage.hello(hello).serialized(), on: link)
            host.received(WireMessage.subscriptions(subscriptions, version: 1).serialized(), on: link)
        }
        // Matches nothing, so peer 1 never waits for acknowledgements: it always has a scan waiting.
        open(
            LinkID(1),
            (0..<64).map {
                WireSubscription(
                    spec: SubscriptionSpec(collection: "items", query: "n < 0 && n != \($0)"), since: 0, hops: 0)
            })
        host.runScans(limit: 8)
        open(LinkID(2), [WireSubscription(spec: SubscriptionSpec(collection: "items"), since: 0, hops: 0)])
        costly.scans.withLock { $0 = [:] }
        // Peer 2 is answered 1,024 entries a page and acknowledges each batch at once.
        var rounds = 0
        while !transport.finished(on: LinkID(2)), rounds < 10_000 {
            host.runScans(limit: 1)
            for upTo in transport.takeBatches(on: LinkID(2)) {
                host.received(
                    WireMessage.ack(subscription: .key(SubscriptionSpec.all("items").key), upTo: upTo).serialized(),
                    on: LinkID(2))
            }
            rounds += 1
        }
        let scans = costly.scans.withLock { $0 }
        print("scans while peer 2 caught up: \(scans)")
        #expect(transport.finished(on: LinkID(2)))
        #expect(scans["items true", default: 0] >= 20)
        #expect(scans["expensive", default: 0] <= 4)
    }
}

/// A store whose scans advance a test clock: 10 units for a query with `!=`, 1 for others.
private final class CostlyStore: SyncStore {
    let store: DocumentStore
    let clock = Mutex<UInt64>(0)
    let scans = Mutex<[String: Int]>([:])

    init(_ store: DocumentStore) { self.store = store }

    var localLog: LocalLog { store.localLog }
    var rescanGenerations: [UTF8Key: UInt32] { store.rescanGenerations }
    func rescanGeneration(collection: String) -> UInt32 { store.rescanGeneration(collection: collection) }
    func collectionsHoldingRows() throws -> [String] { try store.collectionsHoldingRows() }
    func checkpoints(peer: [UInt8]) throws -> [UTF8Key: Checkpoint] { try store.checkpoints(peer: peer) }
    func scan(_ request: ScanRequest) throws -> ScanPage {
        let expensive = request.spec.query.contains("!=")
        clock.withLock { $0 += expensive ? 10 : 1 }
        scans.withLock { $0[expensive ? "expensive" : "items \(request.spec.query)", default: 0] += 1 }
        return try store.scan(request)
    }
    func apply(_ request: ApplyRequest) throws -> (
        deferred: Int, refusals: [String], withholding: [Value], heldBehind: Int, live: Int, reapedKeys: ReapedKeys?
    ) {
        try store.apply(request)
    }
    func acknowledge(_ entries: [AcknowledgedEntry]) throws { try store.acknowledge(entries) }
    func wantReapedKeys(in collection: String, besides peer: [UInt8]) throws {
        try store.wantReapedKeys(in: collection, besides: peer)
    }
    func acknowledgeTombstones(in collection: String, through seq: Int64) throws {
        try store.acknowledgeTombstones(in: collection, through: seq)
    }
    func heldAcknowledged(peer: [UInt8], collection: String, upTo: Int64, carriedFrom: Int64?) throws {
        try store.heldAcknowledged(peer: peer, collection: collection, upTo: upTo, carriedFrom: carriedFrom)
    }
    func retryDeferredDocuments() throws -> (remaining: Int, withholding: [(collection: String, id: Value)]) {
        try store.retryDeferredDocuments()
    }
    func evictedIDs(in collection: String, limit: Int) throws -> [Value] {
        try store.evictedIDs(in: collection, limit: limit)
    }
    func evictedCollections() throws -> [String] { try store.evictedCollections() }
    func reapTombstones(limit: Int) throws -> Bool { try store.reapTombstones(limit: limit) }
    func rotatedLog(reason: String) throws -> LocalLog { try store.rotatedLog(reason: reason) }
    func servedQueries(peer: [UInt8], subscriptions: [SubscriptionSpec], askAgain: Bool) throws -> Int64? {
        try store.servedQueries(peer: peer, subscriptions: subscriptions, askAgain: askAgain)
    }
}

/// Keeps what the host sends to each link: the `upTo` of each batch not yet taken, and whether a
/// batch said nothing is left (`left: 0`).
private final class RecordingTransport: SyncTransport {
    private var batches: [LinkID: [Int64]] = [:]
    private var done: Set<LinkID> = []

    func send(_ bytes: [UInt8], on link: LinkID) -> Bool {
        if case .batch(_, _, let upTo, _, let left) = try? WireMessage(serialized: bytes) {
            batches[link, default: []].append(upTo)
            if left == 0 { done.insert(link) }
        }
        return false
    }

    func close(_ link: LinkID, reason: String) {}
    func dial(_ endpoint: String) {}

    func takeBatches(on link: LinkID) -> [Int64] {
        defer { batches[link] = [] }
        return batches[link] ?? []
    }

    func finished(on link: LinkID) -> Bool { done.contains(link) }
}
