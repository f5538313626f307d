import Foundation
import Testing
import TrellisCore
import TrellisStore
import TrellisSync
import TrellisTestKit

/// Precomposed "é" (U+00E9) and "e" + U+0301: two byte strings, so two collections, two
/// subscriptions, two `_id`s.
private let nfc = "\u{E9}"
private let nfd = "e\u{301}"

@Suite struct ByteKeySyncTests {
    let dir = TemporaryDirectory()

    @Test func subscriptionsToTheTwoSpellingsAreTwoSubscriptions() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        try a.store.upsert([["_id": "p1"], ["_id": "p2"]], in: nfc)
        try a.store.upsert([["_id": "d1"]], in: nfd)
        try b.engine.subscribe(SubscriptionSpec(collection: nfc))
        _ = b.connect(a)
        #expect(eventually { (try? b.ids(nfc)) == ["p1", "p2"] })
        #expect(try b.ids(nfd).isEmpty)
        try b.engine.subscribe(SubscriptionSpec(collection: nfd))
        #expect(b.engine.subscriptions.count == 2)
        #expect(eventually { (try? b.ids(nfd)) == ["d1"] })
        #expect(try b.ids(nfc) == ["p1", "p2"])
        // Releasing one leaves the other served.
        b.engine.unsubscribe(SubscriptionSpec(collection: nfc))
        #expect(b.engine.subscriptions.map(\.collection).map { Array($0.utf8) } == [Array(nfd.utf8)])
        try a.store.upsert(["_id": "d2"], in: nfd)
        #expect(eventually { (try? b.ids(nfd)) == ["d1", "d2"] })
    }

    @Test func queryArgumentsInTheTwoSpellingsAreTwoSubscriptions() throws {
        let a = try TestNode(dir, "a")
        let b = try TestNode(dir, "b")
        try a.store.upsert([["_id": "p", "k": .string(nfc)], ["_id": "d", "k": .string(nfd)]], in: "c")
        try b.engine.subscribe(SubscriptionSpec(collection: "c", query: "k == $args.k", args: ["k": .string(nfc)]))
        try b.engine.subscribe(SubscriptionSpec(collection: "c", query: "k == $args.k", args: ["k": .string(nfd)]))
        #expect(b.engine.subscriptions.count == 2)
        _ = b.connect(a)
        #expect(eventually { (try? b.ids("c")) == ["p", "d"] })
    }
}
