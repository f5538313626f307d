import Foundation
import Synchronization
import Testing
import TrellisCore
import TrellisNet
import TrellisStore
import TrellisTestKit

@testable import TrellisSync

/// A ``SecureLink`` that notes the nice value of the thread that starts it (the engine's queue)
/// and of the thread each message arrives on (the link's own reader thread).
private final class NiceRecordingLink: MessageLink {
    /// The nice values seen, in an object of their own so the reader's callback can hold them.
    final class Seen: Sendable {
        let starter = Mutex<Int32?>(nil)
        let readers = Mutex<Set<Int32>>([])
    }
    let inner: SecureLink
    let seen = Seen()

    init(_ inner: SecureLink) { self.inner = inner }

    var remotePeerKey: [UInt8] { inner.remotePeerKey }
    var isInitiator: Bool { inner.isInitiator }
    var remoteAddress: String { inner.remoteAddress }
    var queuedBytes: Int { inner.queuedBytes }
    var closeReason: LinkCloseReason? { inner.closeReason }
    func send(_ message: [UInt8]) throws -> Int { try inner.send(message) }
    func close() { inner.close() }
    func consumed(_ byteCount: Int) { inner.consumed(byteCount) }
    func onPartialMessage(_ handler: @escaping @Sendable () -> Void) { inner.onPartialMessage(handler) }
    func start(
        onMessage: @escaping @Sendable ([UInt8]) -> Void, onDrain: @escaping @Sendable () -> Void,
        onClose: @escaping @Sendable (String) -> Void
    ) {
        seen.starter.withLock { $0 = SyncEngine.currentThreadNice() }
        inner.start(
            onMessage: { [seen] bytes in
                _ = seen.readers.withLock { $0.insert(SyncEngine.currentThreadNice()) }
                onMessage(bytes)
            }, onDrain: onDrain, onClose: onClose)
    }
}

/// Replication runs as background work: the engine's queue at its quality of service, and the
/// threads of its links at the same nice value, so the application's threads go first.
@Suite struct ReplicationPriorityTests {
    let dir = TemporaryDirectory()

    func engine(_ name: String, _ qos: DispatchQoS, key: [UInt8]? = nil) throws -> SyncEngine {
        let store = try DocumentStore(path: dir.path("\(name).sqlite"))
        return try SyncEngine(
            store: store, peerKey: key ?? Array(name.utf8) + [UInt8](repeating: 0, count: 31), qos: qos)
    }

    /// libdispatch on Linux runs each quality of service at a nice value of its own.
    @Test func theEngineTakesTheNiceValueOfItsQualityOfService() throws {
        #expect(try engine("a", .background).threadNice == 10)
        #expect(try engine("b", .utility).threadNice == 2)
        #expect(try engine("c", .default).threadNice == 0)
    }

    /// Two engines sync over encrypted loopback: each link is started on its engine's queue, and
    /// its reader thread (and its writer, started with it) runs at the engine's nice value, not
    /// at that of the thread that made the link.
    @Test(arguments: [("background", 10), ("default", 0)] as [(String, Int32)])
    func linkThreadsRunAtTheEnginesNiceValue(qosName: String, expected: Int32) throws {
        let qos: DispatchQoS = qosName == "background" ? .background : .default
        let (client, server) = try securePair()
        // b dials a: each engine's key is the one its end of the link authenticated.
        let a = try engine("a", qos, key: client.remotePeerKey)
        let b = try engine("b", qos, key: server.remotePeerKey)
        try a.store.upsert((0..<50).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] }, in: "items")
        try b.subscribe(SubscriptionSpec(collection: "items"))
        let toA = NiceRecordingLink(client)
        let toB = NiceRecordingLink(server)
        b.attach(toA)
        a.attach(toB)
        defer {
            a.close()
            b.close()
        }
        #expect(eventually { (try? b.store.count(in: "items")) == 50 })
        for link in [toA, toB] {
            #expect(link.seen.starter.withLock { $0 } == expected)
            #expect(link.seen.readers.withLock { $0 } == [expected])
        }
    }

    /// The network's own threads (accept, dial, handshake, discovery) take the engine's nice value
    /// when they start.
    @Test func aThreadAdoptsTheEnginesNiceValue() throws {
        let a = try engine("a", .background)
        let seen = Mutex<(Int32, Int32)?>(nil)
        let done = DispatchSemaphore(value: 0)
        Thread {
            let before = SyncEngine.currentThreadNice()
            a.adoptThreadNice()
            seen.withLock { $0 = (before, SyncEngine.currentThreadNice()) }
            done.signal()
        }.start()
        done.wait()
        let (before, after) = try #require(seen.withLock { $0 })
        #expect(before == 0)
        #expect(after == 10)
    }
}
