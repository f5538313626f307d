import Foundation
import Testing
import Trellis
import TrellisSimulation

/// The failure scenarios of ../shared/cases/FAILURES.md that concern sync, each on the simulator
/// with the expected value written there.
@Suite struct FieldCaseSimulationTests {
    /// Every node subscribes to the whole collection; the subscriptions live as long as the test.
    final class Mesh {
        let sim: Simulation
        var subscriptions: [Subscription] = []

        init(
            seed: UInt64, nodes: Int, collection: String = "items", connect: Bool = true,
            configure: @escaping (inout ReplicatorConfiguration) -> Void = { _ in }
        ) throws {
            sim = try Simulation(seed: seed)
            sim.replicatorConfiguration = configure
            for _ in 0..<nodes { try sim.addNode() }
            if connect { sim.connectAll() }
            for node in sim.nodes { try subscribe(node, collection) }
        }

        func subscribe(_ node: SimulatedNode, _ collection: String, query: String = "true") throws {
            subscriptions.append(try node.store.collection(collection).find(query).subscribe())
        }

        subscript(_ i: Int) -> SimulatedNode { sim.nodes[i] }
    }

    static func get(_ node: SimulatedNode, _ id: String, in collection: String = "items") throws -> Document? {
        try node.store.collection(collection).findByID(.string(id)).exec()
    }

    // MARK: Deletes and convergence

    /// F01: A and B hold d1 {v:"one"}; A removes it; A writes d1 {v:"new"}; a fresh C joins.
    @Test func f01ARecreatedIDIsNewEverywhere() throws {
        let mesh = try Mesh(seed: 101, nodes: 2)
        let (a, b) = (mesh[0], mesh[1])
        try a.store.collection("items").upsert(["_id": "d1", "v": "one"])
        try mesh.sim.runUntilQuiet()
        try a.store.collection("items").findByID("d1").remove()
        try mesh.sim.runUntilQuiet()
        try a.store.collection("items").upsert(["_id": "d1", "v": "new"])
        try mesh.sim.runUntilQuiet()
        let c = try mesh.sim.addNode()
        try mesh.subscribe(c, "items")
        try c.watch("items")
        mesh.sim.connect(c, a)
        mesh.sim.connect(c, b)
        try mesh.sim.runUntilQuiet()
        try mesh.sim.check()
        for node in mesh.sim.nodes {
            #expect(try Self.get(node, "d1")?["v"] == "new", "\(node.name)")
            #expect(try node.store.collection("items").findAll().exec().count == 1)
        }
    }

    /// F02: A and B hold d1 {n:1}; apart, A removes d1 and B sets n=2; heal; a new C joins. All
    /// converge to the add-wins outcome: d1 present with what the remover had not seen.
    @Test func f02AnOfflineEditSurvivesAConcurrentRemove() throws {
        let mesh = try Mesh(seed: 102, nodes: 2)
        let (a, b) = (mesh[0], mesh[1])
        try a.store.collection("items").upsert(["_id": "d1", "n": 1])
        try mesh.sim.runUntilQuiet()
        mesh.sim.partition([[a], [b]])
        try a.store.collection("items").findByID("d1").remove()
        _ = try b.store.collection("items").findByID("d1").update { $0?["n"].set(2) }
        mesh.sim.heal()
        try mesh.sim.runUntilQuiet()
        let c = try mesh.sim.addNode()
        try mesh.subscribe(c, "items")
        mesh.sim.connect(c, a)
        try mesh.sim.runUntilQuiet()
        try mesh.sim.check()
        for node in mesh.sim.nodes {
            #expect(try Self.get(node, "d1")?.value == ["_id": "d1", "n": 2], "\(node.name)")
        }
    }

    /// F03: created and removed inside one batch: a new C never shows d1, and no live query on C
    /// ever reports it.
    @Test func f03CreatedAndRemovedBeforeSyncIsNeverShown() throws {
        let mesh = try Mesh(seed: 103, nodes: 1)
        let a = mesh[0]
        try a.store.collection("items").upsert(["_id": "d1", "v": 1])
        try a.store.collection("items").findByID("d1").remove()
        try a.store.collection("items").upsert(["_id": "d2", "v": 2])
        let c = try mesh.sim.addNode()
        let seen = SeenIDs()
        let live = try c.store.collection("items").findAll().observeLocal { docs, _ in seen.add(docs.map(\.id)) }
        try mesh.subscribe(c, "items")
        mesh.sim.connect(c, a)
        try mesh.sim.runUntilQuiet()
        c.store.flushLiveQueries()
        #expect(try Self.get(c, "d1") == nil)
        #expect(try Self.get(c, "d2") != nil)
        #expect(!seen.ids.contains("d1"))
        #expect(seen.ids.contains("d2"))
        live.stop()
    }

    /// F04: A creates and removes 3,000 documents, and sets and unsets 3,000 keys of one
    /// document; a new C syncs. C shows none of the removed documents but holds every tombstone
    /// (so no stale copy can bring one back), the document whose keys were unset shows only its
    /// `_id`, and no removed or unset value travels (removes and unsets keep stamps, not values).
    /// Once the tombstone TTL has passed, both reap them: the change log (what a new peer's first
    /// sync and an enumeration read) holds the live document only. Scaled down from the case's
    /// 1,000,000 so that it runs in the debug build in seconds.
    @Test func f04TombstonesSyncWithoutTheirValues() throws {
        let mesh = try Mesh(seed: 104, nodes: 1)
        let a = mesh[0]
        let items = a.store.collection("items")
        let secret = String(repeating: "s", count: 64)
        for start in stride(from: 0, to: 3_000, by: 500) {
            try items.upsert((start..<(start + 500)).map { ["_id": .string("r\($0)"), "body": .string(secret)] })
            _ = try items.find("_id >= 'r'").remove()
        }
        try items.upsert(["_id": "big"])
        for chunk in stride(from: 0, to: 3_000, by: 500) {
            _ = try items.findByID("big").update { doc in
                for k in chunk..<(chunk + 500) { doc?["k\(k)"].set(.string(secret)) }
            }
            _ = try items.findByID("big").update { doc in
                for k in chunk..<(chunk + 500) { doc?["k\(k)"].remove() }
            }
        }
        let c = try mesh.sim.addNode()
        try mesh.subscribe(c, "items")
        c.mirrorContacts("items")
        mesh.sim.connect(c, a)
        try mesh.sim.runUntilQuiet()
        try mesh.sim.check()
        #expect(try c.store.collection("items").findAll().exec().map(\.id) == ["big"])
        #expect(try Self.get(c, "big")?.value == ["_id": "big"])
        let page = try c.documents.changes(in: "items", after: 0, limit: 10_000, maxBytes: .max)
        #expect(page.records.filter(\.isDeleted).count == 3_000)
        // Not one removed or unset value reached C.
        let secretBytes = Array(secret.utf8)
        for record in page.records {
            #expect(
                !record.state.indices.contains { i in record.state[i...].starts(with: secretBytes) },
                "\(record.id) carries a removed value")
        }
        let unsetState = try #require(try a.documents.state(id: "big", in: "items")).cbor().count
        #expect(unsetState > 30_000)  // 3,000 remove contexts
        try Self.passTheTTL(mesh)
        for node in [a, c] {
            let log = try node.documents.changes(in: "items", after: 0, limit: 10_000, maxBytes: .max)
            #expect(log.records.map(\.key) == ["\"big\""], "\(node.name)")
        }
        #expect(try c.store.collection("items").findAll().exec().map(\.id) == ["big"])
        // The unset keys' remove contexts are past the TTL too: the next write of the document reaps
        // them, and its state is bounded by its live fields again, on both nodes, byte for byte.
        try items.upsert(["_id": "big", "after": 1])
        try mesh.sim.runUntilQuiet()
        let reaped = try #require(try a.documents.state(id: "big", in: "items")).cbor()
        #expect(reaped.count < 200, "\(reaped.count) bytes after the TTL, \(unsetState) before")
        #expect(try c.documents.state(id: "big", in: "items")?.cbor() == reaped)
        #expect(try Self.get(c, "big")?.value == ["_id": "big", "after": 1])
    }

    /// F04, unset fields: S is away for longer than the tombstone TTL while A unsets `x` of d (S
    /// still holds `x`) and B receives the unset; at their next write of d, A and B reap the
    /// field's remove context. S, still holding `x`, comes back: `x` does not come back (the join
    /// drops what A's write vector shows A saw and no longer holds), S's own write made while away
    /// arrives everywhere, every node ends with the same state bytes, and once converged the links
    /// carry no more documents (a node that reaped and one that had not do not send d back and
    /// forth).
    @Test func f04ANodeAwayLongerThanTheTTLDoesNotBringAnUnsetFieldBack() throws {
        let mesh = try Mesh(seed: 224, nodes: 3)
        let (a, b, s) = (mesh[0], mesh[1], mesh[2])
        let items = a.store.collection("items")
        try items.upsert(["_id": "d", "x": "old", "keep": 1])
        try mesh.sim.runUntilQuiet()
        mesh.sim.partition([[a, b], [s]])
        _ = try items.findByID("d").update { doc in doc?["x"].remove() }
        try s.store.collection("items").upsert(["_id": "d", "y": "away"])
        try mesh.sim.runUntilQuiet()
        let withContext = try #require(try b.documents.state(id: "d", in: "items")).cbor().count
        try Self.passTheTTL(mesh)
        try items.upsert(["_id": "d", "keep": 2])
        try mesh.sim.runUntilQuiet()
        for node in [a, b] {
            let state = try #require(try node.documents.state(id: "d", in: "items"))
            #expect(state.root.entries["x"] == nil, "\(node.name) reaped x's remove context")
            #expect(state.cbor().count < withContext, "\(node.name)")
        }
        #expect(try Self.get(s, "d")?["x"] == "old")  // S still holds it
        mesh.sim.heal()
        try mesh.sim.runUntilQuiet()
        try mesh.sim.check()
        let expected: Value = ["_id": "d", "keep": 2, "y": "away"]
        let bytes = try a.documents.state(id: "d", in: "items")?.cbor()
        for node in mesh.sim.nodes {
            #expect(try Self.get(node, "d")?.value == expected, "\(node.name)")
            #expect(try node.documents.state(id: "d", in: "items")?.cbor() == bytes, "\(node.name)")
        }
        let batches = mesh.sim.messageCounts["batch"] ?? 0
        mesh.sim.run(for: 120_000)
        #expect(mesh.sim.messageCounts["batch"] ?? 0 == batches)  // nothing more moves
    }

    /// F04, unset fields, clocks apart: B's clock is behind, so after A reaps a removed field's
    /// context B still holds it. A merging B's state (which differs only by that context) is no
    /// change there, and B merging A's reaped state is none either: no new `seq`, no document sent
    /// back and forth. Once B's clock is past the TTL too, its next write reaps it, and both hold
    /// the same bytes.
    @Test func f04NodesThatReapedAndNotYetDoNotSendADocumentBackAndForth() throws {
        let mesh = try Mesh(seed: 234, nodes: 2)
        let (a, b) = (mesh[0], mesh[1])
        try a.store.collection("items").upsert(["_id": "d", "x": 1, "keep": true])
        try mesh.sim.runUntilQuiet()
        let written = try #require(try a.documents.state(id: "d", in: "items")?.stamp(at: .key("x"))).time.millis
        _ = try a.store.collection("items").findByID("d").update { doc in doc?["x"].remove() }
        try mesh.sim.runUntilQuiet()
        // A's clock 20 s past the TTL of x's write, B's 30 s short of it: 50 s apart, within the
        // allowed drift, so each accepts the other's states.
        let ttl = Millis(mesh.sim.storeOptions.tombstoneTTL)
        let atTTL = Millis(written) + ttl - Simulation.startWallClock - mesh.sim.now
        mesh.sim.setClockOffset(a, atTTL + 20_000)
        mesh.sim.setClockOffset(b, atTTL - 30_000)
        try a.store.collection("items").upsert(["_id": "d", "n": 1])  // A reaps
        try b.store.collection("items").upsert(["_id": "e"])
        try mesh.sim.runUntilQuiet()
        try mesh.sim.check()
        let (lastA, lastB) = (a.documents.lastSeq, b.documents.lastSeq)
        let batches = mesh.sim.messageCounts["batch"] ?? 0
        mesh.sim.run(for: 120_000)
        #expect(mesh.sim.messageCounts["batch"] ?? 0 == batches)
        #expect(a.documents.lastSeq == lastA)
        #expect(b.documents.lastSeq == lastB)
        #expect(try a.documents.state(id: "d", in: "items")?.root.entries["x"] == nil)
        #expect(try b.documents.state(id: "d", in: "items")?.root.entries["x"] != nil)  // not yet
        mesh.sim.setClockOffset(b, b.clockOffset + 40_000)
        try b.store.collection("items").upsert(["_id": "d", "n": 2])  // B reaps
        try mesh.sim.runUntilQuiet()
        try mesh.sim.check()
        let bytes = try #require(try a.documents.state(id: "d", in: "items")).cbor()
        #expect(try b.documents.state(id: "d", in: "items")?.cbor() == bytes)
        #expect(try Self.get(a, "d")?.value == ["_id": "d", "keep": true, "n": 2])
    }

    // MARK: Change log and checkpoints

    /// F05 on the simulator: B pulls 500 changes from A and is killed at many points; after each
    /// restart it resyncs; B holds all 500 exactly once and its log has no duplicate entries.
    @Test func f05ACrashAnywhereInAPullLosesAndRepeatsNothing() throws {
        let mesh = try Mesh(seed: 105, nodes: 2)
        let (a, b) = (mesh[0], mesh[1])
        mesh.sim.setProfile(LinkProfile(latency: 2, bytesPerSecond: 40_000), between: a, and: b)
        try a.store.collection("items").upsert((0..<500).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] })
        var kills = 0
        for step in 0..<40 {
            mesh.sim.run(for: Millis(37 + step * 11))
            mesh.sim.crash(b)
            kills += 1
            mesh.sim.run(for: 50)
            try mesh.sim.restart(b)
        }
        try mesh.sim.runUntilQuiet()
        try mesh.sim.check()
        #expect(kills == 40)
        let log = try mesh.sim.log(of: b, collection: "items")
        #expect(log.count == 500)
        #expect(try b.store.collection("items").findAll().exec().count == 500)
        // Every entry once: as many log rows as documents.
        let page = try b.documents.changes(in: "items", after: 0, limit: 10_000, maxBytes: .max)
        #expect(page.records.count == 500)
    }

    /// F06: 1,000 changes of which 30 match, scanned 7 entries at a time, 10 more matching
    /// written meanwhile: the subscriber gets exactly the 40 matching documents.
    @Test func f06FilteredPagingNeitherOvershootsNorRepeats() throws {
        let sim = try Simulation(seed: 106)
        sim.replicatorConfiguration = { $0.batchEntries = 7 }
        let a = try sim.addNode()
        let b = try sim.addNode()
        sim.connect(b, a)
        try a.store.collection("items").upsert(
            (0..<1_000).map { ["_id": .string("d\($0)"), "q": .bool($0 % 33 == 0 && $0 < 990)] })
        let matching = try a.store.collection("items").find("q == true").count()
        #expect(matching == 30)
        let subscription = try b.store.collection("items").find("q == true").subscribe()
        sim.run(for: 200)
        try a.store.collection("items").upsert((0..<10).map { ["_id": .string("late\($0)"), "q": true] })
        try sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().count() == 40)
        #expect(try b.documents.changes(in: "items", after: 0, limit: 10_000, maxBytes: .max).records.count == 40)
        subscription.cancel()
    }

    /// F08 (b): B's store is wiped but B keeps its peer key: it receives every document again.
    /// (c): A's store is reset (new epoch): B notices and resyncs, and A gets back from B what it
    /// lost.
    @Test func f08WipedStoresResyncEitherWay() throws {
        let mesh = try Mesh(seed: 108, nodes: 2)
        let (a, b) = (mesh[0], mesh[1])
        try a.store.collection("items").upsert((0..<50).map { ["_id": .string("d\($0)")] })
        try mesh.sim.runUntilQuiet()
        mesh.sim.crash(b)
        try mesh.sim.restart(b, wipe: true)
        try mesh.sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().count() == 50)
        mesh.sim.crash(a)
        try mesh.sim.restart(a, wipe: true)
        try a.store.collection("items").upsert(["_id": "after-reset"])
        try mesh.sim.runUntilQuiet()
        try mesh.sim.check()
        #expect(try a.store.collection("items").findAll().count() == 51)
        #expect(try b.store.collection("items").findAll().count() == 51)
    }

    // MARK: Subscriptions and live queries

    /// F09: B subscribes to city == 'Oslo' and holds d1; A removes d1 and moves d2 to Bergen. B
    /// records d1 as removed (its live query drops it); re-subscribing does not bring d1 back.
    @Test func f09ARemoveReachesASubscriberWhoseFilterTheTombstoneDoesNotMatch() throws {
        let mesh = try Mesh(seed: 109, nodes: 1)
        let a = mesh[0]
        let b = try mesh.sim.addNode()
        var oslo = try b.store.collection("items").find("city == 'Oslo'").subscribe()
        try b.watch("items", query: "city == 'Oslo'")
        mesh.sim.connect(b, a)
        try a.store.collection("items").upsert([["_id": "d1", "city": "Oslo"], ["_id": "d2", "city": "Oslo"]])
        try mesh.sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().count() == 2)
        try a.store.collection("items").findByID("d1").remove()
        _ = try a.store.collection("items").findByID("d2").update { $0?["city"].set("Bergen") }
        try mesh.sim.runUntilQuiet()
        b.store.flushLiveQueries()
        #expect(try Self.get(b, "d1") == nil)
        #expect(try b.documents.state(id: "d1", in: "items")?.isDeleted == true)
        #expect(b.lastLiveResults["items: city == 'Oslo'"]?.map(\.id) == [])
        oslo.cancel()
        oslo = try b.store.collection("items").find("city == 'Oslo'").subscribe()
        try mesh.sim.runUntilQuiet()
        #expect(try Self.get(b, "d1") == nil)
        oslo.cancel()
    }

    /// F04, expiry: S is away for longer than the tombstone TTL while A removes d1 and d2 and B
    /// receives the removes; A and B reap the tombstones. When S comes back, still holding d1 and
    /// d2, they do not come back: they stay removed on every node, S's own write made while away
    /// arrives everywhere, and every node ends with the same documents.
    @Test func f04ANodeAwayLongerThanTheTTLDoesNotBringReapedDocumentsBack() throws {
        let mesh = try Mesh(seed: 204, nodes: 3)
        let (a, b, s) = (mesh[0], mesh[1], mesh[2])
        // More documents than one batch holds, so the full resync spans several pages below the floor.
        try a.store.collection("items").upsert((1...600).map { ["_id": .string("d\($0)"), "v": .int(Int64($0))] })
        try mesh.sim.runUntilQuiet()
        #expect(try s.store.collection("items").findAll().count() == 600)
        mesh.sim.partition([[a, b], [s]])
        try a.store.collection("items").findByID("d1").remove()
        try a.store.collection("items").findByID("d2").remove()
        try s.store.collection("items").upsert(["_id": "away", "v": 0])
        try mesh.sim.runUntilQuiet()
        try Self.passTheTTL(mesh)
        for node in [a, b] { #expect(try node.documents.state(id: "d1", in: "items") == nil, "\(node.name) reaped") }
        mesh.sim.heal()
        try mesh.sim.runUntilQuiet()
        try mesh.sim.check()
        for node in mesh.sim.nodes {
            let items = node.store.collection("items")
            #expect(try items.findAll().count() == 599, "\(node.name)")
            #expect(try items.find("_id == 'd1' || _id == 'd2'").count() == 0, "\(node.name)")
            #expect(try items.findByID("away").exec() != nil, "\(node.name)")
        }
    }

    /// F04, expiry through a relay: as above, but S comes back connected only to R, a node that
    /// joined after the tombstones were reaped and so never saw d1 or its remove (K, linked to A
    /// alone, took the remove meanwhile). R takes S's copy
    /// for a moment; A removes it again when R relays it, and the remove travels back through R to
    /// S: in the end no node shows d1.
    @Test func f04AStaleNodeCannotBringReapedDocumentsBackThroughARelay() throws {
        let mesh = try Mesh(seed: 214, nodes: 2)
        let (a, s) = (mesh[0], mesh[1])
        // K takes A's remove and acknowledges it, so A may reap it: the reaper keeps a remove no
        // peer has (ExpirySweepTests, seed 4500046).
        let (k, kept) = try mesh.sim.addKeeper(beside: a)
        try a.store.collection("items").upsert((1...3).map { ["_id": .string("d\($0)")] })
        try mesh.sim.runUntilQuiet()
        mesh.sim.partition([[a, k], [s]])
        try a.store.collection("items").findByID("d1").remove()
        try mesh.sim.runUntilQuiet()
        try Self.passTheTTL(mesh)
        #expect(try a.documents.state(id: "d1", in: "items") == nil)
        let r = try mesh.sim.addNode()
        try mesh.subscribe(r, "items")
        mesh.sim.setClockOffset(r, mesh.sim.nodes[0].clockOffset)
        mesh.sim.connect(r, a)
        try mesh.sim.runUntilQuiet()
        mesh.sim.setLink(a, s, up: false)
        mesh.sim.heal()
        mesh.sim.connect(r, s)
        try mesh.sim.runUntilQuiet()
        for node in mesh.sim.nodes {
            let ids = try node.store.collection("items").findAll().exec().map { JSON.string($0.id) }
            #expect(ids.sorted() == ["\"d2\"", "\"d3\""], "\(node.name)")
        }
        _ = kept
    }

    /// Moves every node's clock past the tombstone TTL and lets their sync hosts reap.
    static func passTheTTL(_ mesh: Mesh) throws {
        let ttl = Millis(mesh.sim.storeOptions.tombstoneTTL)
        for node in mesh.sim.nodes { mesh.sim.passTime(node, by: ttl + 60_000) }
        mesh.sim.run(for: 120_000)
    }

    /// F10: (a) evicting documents an active subscription matches brings them back once, with no
    /// evict/re-fetch loop; (b) cancel, evict, subscribe again with no change on A: they come back.
    @Test func f10EvictedDocumentsComeBackOnceWhileASubscriptionMatches() throws {
        let mesh = try Mesh(seed: 110, nodes: 1)
        let a = mesh[0]
        let b = try mesh.sim.addNode()
        var sub = try b.store.collection("items").findAll().subscribe()
        mesh.sim.connect(b, a)
        try a.store.collection("items").upsert((1...50).map { ["_id": .string("d\($0)")] })
        try mesh.sim.runUntilQuiet()
        for i in 1...10 { try b.store.collection("items").findByID(.string("d\(i)")).evict() }
        try mesh.sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().count() == 50)
        let batches = mesh.sim.messageCounts["batch"] ?? 0
        mesh.sim.run(for: 60_000)
        #expect(mesh.sim.messageCounts["batch"] ?? 0 == batches)  // nothing more moves
        sub.cancel()
        for i in 1...10 { try b.store.collection("items").findByID(.string("d\(i)")).evict() }
        #expect(try b.store.collection("items").findAll().count() == 40)
        sub = try b.store.collection("items").findAll().subscribe()
        try mesh.sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().count() == 50)
        sub.cancel()
    }

    /// F10, precisely: evicting k documents makes peers send about k documents again, not the
    /// collection. B holds A's 1,000 documents; evicting 10 brings exactly those 10 back. Then B
    /// cancels, evicts 20 and subscribes to a narrower query: of the 20, the 10 the new query
    /// matches come back, the others stay evicted, and A sends only what the new query matches.
    @Test func f10EvictingKDocumentsMakesPeersSendKAgain() throws {
        let mesh = try Mesh(seed: 120, nodes: 1)
        let a = mesh[0]
        let b = try mesh.sim.addNode()
        var sub = try b.store.collection("items").findAll().subscribe()
        mesh.sim.connect(b, a)
        try a.store.collection("items").upsert((0..<1_000).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] })
        try mesh.sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().count() == 1_000)
        var sent = mesh.sim.documentsSent
        _ = try b.store.collection("items").find("n >= 100 && n < 110").evict()
        try mesh.sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().count() == 1_000)
        #expect(mesh.sim.documentsSent - sent == 10)
        sub.cancel()
        try mesh.sim.runUntilQuiet()
        _ = try b.store.collection("items").find("n >= 190 && n < 210").evict()
        sent = mesh.sim.documentsSent
        sub = try b.store.collection("items").find("n < 200").subscribe()
        try mesh.sim.runUntilQuiet()
        #expect(try b.store.collection("items").find("n >= 190 && n < 200").count() == 10)
        #expect(try b.store.collection("items").find("n >= 200 && n < 210").count() == 0)
        #expect(mesh.sim.documentsSent - sent <= 200 + 10)
        sub.cancel()
    }

    /// F10, the ask ends: B evicts 20 documents and subscribes to a narrower query, which
    /// matches 10 of them. A answers the refetch to the end without the other 10 (they do not
    /// match there), so B stops asking A for them; before, they stayed in every set B sent A, and
    /// counted toward `maxAskedSubscriptions`, for as long as B ran.
    @Test func f10ARefetchOfDocumentsNoPeerMatchesEndsOncePeersAnswer() throws {
        let mesh = try Mesh(seed: 121, nodes: 1)
        let a = mesh[0]
        let b = try mesh.sim.addNode("b")
        var sub = try b.store.collection("items").findAll().subscribe()
        mesh.sim.connect(b, a)
        try a.store.collection("items").upsert((0..<300).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] })
        try mesh.sim.runUntilQuiet()
        sub.cancel()
        try mesh.sim.runUntilQuiet()
        _ = try b.store.collection("items").find("n >= 190 && n < 210").evict()
        sub = try b.store.collection("items").find("n < 200").subscribe()
        try mesh.sim.runUntilQuiet()
        #expect(try b.store.collection("items").find("n >= 190 && n < 200").count() == 10)
        #expect(try b.store.collection("items").find("n >= 200 && n < 210").count() == 0)
        let asked = mesh.sim.trace.last { $0.contains(" b -> ") && $0.contains(" subs v") }
        #expect(asked?.contains("trellisEvicted") == false, "still asked: \(asked ?? "nothing")")
        try mesh.sim.check()
        sub.cancel()
    }

    /// F10 above the cap: with `maxAskedSubscriptions` 2, B's two query subscriptions and their
    /// refetches do not fit, and the collection collapses into the whole one, asked from the
    /// checkpoint B kept from its earlier whole subscription: the evicted documents never came
    /// back (B's `n < 200` lacked d190–d199), and the unanswered refetches kept the collapse for
    /// as long as B ran. The refetch is now derived from the whole collection after the collapse
    /// (by key, whatever the checkpoint), and ends once A answered it: the documents are back and
    /// the collapse ends. A collapse asks for a superset, so the 10 documents no query matches
    /// come back too.
    @Test func f10EvictedDocumentsComeBackAboveTheSubscriptionCap() throws {
        let mesh = try Mesh(seed: 122, nodes: 1)
        let a = mesh[0]
        mesh.sim.replicatorConfiguration = { $0.maxAskedSubscriptions = 2 }
        let b = try mesh.sim.addNode("b")
        var sub = try b.store.collection("items").findAll().subscribe()
        mesh.sim.connect(b, a)
        try a.store.collection("items").upsert((0..<300).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] })
        try mesh.sim.runUntilQuiet()
        sub.cancel()
        try mesh.sim.runUntilQuiet()
        _ = try b.store.collection("items").find("n >= 190 && n < 210").evict()
        sub = try b.store.collection("items").find("n < 200").subscribe()
        let other = try b.store.collection("items").find("n >= 1000").subscribe()
        try mesh.sim.runUntilQuiet()
        #expect(try b.store.collection("items").find("n >= 190 && n < 200").count() == 10)
        let asked = mesh.sim.trace.last { $0.contains(" b -> ") && $0.contains(" subs v") }
        #expect(asked?.contains("trellisEvicted") == false, "still asked: \(asked ?? "nothing")")
        #expect(asked?.contains("items: true") == false, "still collapsed: \(asked ?? "nothing")")
        try mesh.sim.check()
        sub.cancel()
        other.cancel()
    }

    /// F10 at its cost: B evicts 2,048 documents (eight refetch subscriptions of 256 `_id`s) while
    /// its whole-collection subscription stays. Its set goes to the peer once with the eight and
    /// once without them, not once more after each is answered (each of those re-sent every
    /// refetch subscription still asked, 256 `_id`s apiece), and no `ack` names a refetch
    /// subscription by its key (several KiB: one the peer no longer serves, which it ignores).
    @Test func f10ARefetchSendsTheSetTwiceAndNoAckByKey() throws {
        let mesh = try Mesh(seed: 123, nodes: 2)
        let (a, b) = (mesh[0], mesh[1])
        let count = 8 * Refetch.chunk
        try a.store.collection("items").upsert((0..<count).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] })
        try mesh.sim.runUntilQuiet()
        let (subs, acks, ackBytes) = (
            mesh.sim.messageCounts["subs", default: 0], mesh.sim.messageCounts["ack", default: 0],
            mesh.sim.messageBytes["ack", default: 0]
        )
        #expect(try b.store.collection("items").findAll().evict().count == count)
        try mesh.sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().count() == count)
        #expect(mesh.sim.messageCounts["subs", default: 0] - subs == 2)
        let newAcks = mesh.sim.messageCounts["ack", default: 0] - acks
        let newAckBytes = mesh.sim.messageBytes["ack", default: 0] - ackBytes
        #expect(newAckBytes <= 64 * newAcks, "\(newAcks) acks of \(newAckBytes) B")
        try mesh.sim.check()
    }

    /// F10 beyond the refetch list's bound: B evicts more documents of a collection than one
    /// refetch list holds (``Refetch/maxPerCollection``, 4,096) while its whole-collection
    /// subscription stays. Every one comes back: once the listed ones have, B reads the rest of
    /// its stubs and asks for them. Before, the rest stayed stubs until B restarted (and only the
    /// next 4,096 came back then), found by a reviewer.
    @Test func f10EvictingMoreThanOneRefetchListHoldsBringsEveryDocumentBack() throws {
        let mesh = try Mesh(seed: 123, nodes: 2)
        let (a, b) = (mesh[0], mesh[1])
        let count = Refetch.maxPerCollection + 904
        try a.store.collection("items").upsert((0..<count).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] })
        try mesh.sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().count() == count)
        let evicted = try b.store.collection("items").findAll().evict()
        #expect(evicted.count == count)
        try mesh.sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().count() == count)
        try mesh.sim.check()
    }

    /// F10 through a relay that evicted while nothing was asked: P — R — M, P and R with no
    /// subscription of their own. M subscribes to the
    /// whole collection through R, gets d9 and cancels; R, asked for nothing in the collection
    /// any more, evicts d9. N then subscribes through R: R must ask P for d9 again (its
    /// checkpoint at P is past it). Before, an eviction while no subscription was active asked
    /// nothing later, so N never got d9 (simulation seed 530774 with `--queries 2`).
    @Test func f10ARelayThatEvictedWhileNothingWasAskedFetchesForALaterSubscriber() throws {
        let mesh = try Mesh(seed: 123, nodes: 0)
        let p = try mesh.sim.addNode("p")
        let r = try mesh.sim.addNode("r")
        let m = try mesh.sim.addNode("m")
        mesh.sim.connect(r, p)
        mesh.sim.connect(m, r)
        try p.store.collection("items").upsert(["_id": "d9", "v": 9])
        let first = try m.store.collection("items").findAll().subscribe()
        try mesh.sim.runUntilQuiet()
        #expect(try Self.get(m, "d9") != nil)
        first.cancel()
        try mesh.sim.runUntilQuiet()
        #expect(try r.store.collection("items").findByID("d9").evict())
        try mesh.sim.runUntilQuiet()
        let n = try mesh.sim.addNode("n")
        mesh.sim.connect(n, r)
        let second = try n.store.collection("items").findAll().subscribe()
        try mesh.sim.runUntilQuiet()
        #expect(try Self.get(n, "d9")?["v"] == 9)
        try mesh.sim.check()
        second.cancel()
    }

    /// The same through a relay that restarted after its eviction (M evicted d9 too: only P
    /// holds it). The list of documents to ask for again lived only in memory, so R, relaying
    /// nothing of its own, asked P for nothing after its restart, and N lacked d9 for good
    /// (simulation seed 612180 with `--queries 2`: a whole-collection subscriber lacked a write
    /// the relay had evicted before it crashed). The scenario is shared with a query subscriber's
    /// (`RestartRefetchBreakTests.evictRestartAndSubscribeLater`).
    @Test func f10ARelayThatEvictedAndRestartedFetchesForALaterSubscriber() throws {
        try RestartRefetchBreakTests.evictRestartAndSubscribeLater(seed: 124, query: "true")
    }

    /// F11: B is offline while A inserts 100 matching documents; B registers a live query, then
    /// connects: the live query ends with 100 results. Variant: B writes d1, A (having seen it)
    /// removes it: B's live query reports d1 gone.
    @Test func f11ALiveQueryFollowsACatchUp() throws {
        let mesh = try Mesh(seed: 111, nodes: 1)
        let a = mesh[0]
        try a.store.collection("items").upsert((0..<100).map { ["_id": .string("d\($0)"), "k": "x"] })
        let b = try mesh.sim.addNode()
        try b.watch("items", query: "k == 'x'")
        try mesh.subscribe(b, "items")
        mesh.sim.connect(b, a)
        try mesh.sim.runUntilQuiet()
        b.store.flushLiveQueries()
        #expect(b.lastLiveResults["items: k == 'x'"]?.count == 100)
        try b.store.collection("items").upsert(["_id": "mine", "k": "x"])
        try mesh.sim.runUntilQuiet()
        try a.store.collection("items").findByID("mine").remove()
        try mesh.sim.runUntilQuiet()
        b.store.flushLiveQueries()
        #expect(b.lastLiveResults["items: k == 'x'"]?.count == 100)
        #expect(b.lastLiveResults["items: k == 'x'"]?.contains { $0.id == "mine" } == false)
    }

    // MARK: Payloads

    /// F13: odd field names replicate byte for byte, and d2 is never blocked behind d1.
    @Test func f13OddFieldNamesReplicateExactly() throws {
        let mesh = try Mesh(seed: 113, nodes: 2)
        let (a, b) = (mesh[0], mesh[1])
        let odd: Value = ["_id": "d1", "": 1, "_x": 2, "a.b": 3, "$c": 4]
        try a.store.collection("items").upsert(odd)
        try a.store.collection("items").upsert(["_id": "d2", "v": 1])
        try mesh.sim.runUntilQuiet()
        #expect(try Self.get(b, "d1")?.value == odd)
        #expect(try Self.get(b, "d2") != nil)
    }

    /// F14: a document above the size limit is refused on the writing side with an error naming
    /// it; a small d3 written after it always arrives.
    @Test func f14BigDocumentsAreRefusedAtTheWriterAndNeverBlockOthers() throws {
        let mesh = try Mesh(seed: 114, nodes: 2)
        let (a, b) = (mesh[0], mesh[1])
        let big = String(repeating: "x", count: 8 << 20)
        #expect(throws: StoreError.self) { try a.store.collection("items").upsert(["_id": "d1", "s": .string(big)]) }
        #expect(throws: StoreError.self) {
            try a.store.collection("items").upsert(["_id": "d2", "b": .bytes(Array(repeating: 1, count: 64 << 20))])
        }
        try a.store.collection("items").upsert(["_id": "d3", "v": 3])
        try mesh.sim.runUntilQuiet()
        #expect(try Self.get(b, "d3")?["v"] == 3)
    }

    // MARK: Network

    /// F15: (a) A's port is closed for 60 s: B backs off (at most about 10 attempts a minute at
    /// the plateau); (b) A restarts half-way through a 1,000-document push from B: all arrive,
    /// none twice.
    @Test func f15ReconnectionsBackOffAndATransferResumes() throws {
        // Batches of 100 entries: the push is ten batches, so a restart can fall between them.
        let mesh = try Mesh(seed: 115, nodes: 2, connect: false) { $0.batchEntries = 100 }
        let (a, b) = (mesh[0], mesh[1])
        mesh.sim.connect(b, a)
        try mesh.sim.runUntilQuiet()
        mesh.sim.crash(a)
        mesh.sim.run(for: 60_000)
        let firstMinute = mesh.sim.dialCounts["n1->n0"] ?? 0
        mesh.sim.run(for: 60_000)
        let plateau = (mesh.sim.dialCounts["n1->n0"] ?? 0) - firstMinute
        #expect(plateau <= 10, "\(plateau) dials in the second minute")
        try mesh.sim.restart(a)
        try mesh.sim.runUntilQuiet()
        mesh.sim.setProfile(LinkProfile(latency: 2, bytesPerSecond: 30_000), between: a, and: b)
        try b.store.collection("items").upsert((0..<1_000).map { ["_id": .string("p\($0)"), "n": .int(Int64($0))] })
        mesh.sim.run(for: 1_500)
        let halfway = try a.store.collection("items").findAll().count()
        #expect(halfway > 0 && halfway < 1_000, "\(halfway) arrived before the restart")
        mesh.sim.crash(a)
        try mesh.sim.restart(a)
        try mesh.sim.runUntilQuiet()
        try mesh.sim.check()
        #expect(try a.store.collection("items").findAll().count() == 1_000)
        #expect(try a.documents.changes(in: "items", after: 0, limit: 10_000, maxBytes: .max).records.count == 1_000)
    }

    /// F16: a diamond A–B, A–C, B–D, C–D; A inserts 500 documents, then 20 with identical bodies,
    /// and increments a counter 100 times; B restarts in the middle. D holds 520 documents, the
    /// counter reads 100 everywhere, and a live query on D reports each document once.
    @Test func f16DuplicatesThroughADiamond() throws {
        let sim = try Simulation(seed: 116)
        let a = try sim.addNode("A")
        let b = try sim.addNode("B")
        let c = try sim.addNode("C")
        let d = try sim.addNode("D")
        sim.connect(a, b)
        sim.connect(a, c)
        sim.connect(b, d)
        sim.connect(c, d)
        var subs: [Subscription] = []
        for node in sim.nodes { subs.append(try node.store.collection("events").findAll().subscribe()) }
        let seen = SeenIDs()
        let live = try d.store.collection("events").findAll().observeLocal { docs, event in
            seen.addInsertions(event, docs)
        }
        try a.store.collection("events").upsert(["_id": "counter", "n": 0])
        try sim.runUntilQuiet()
        try a.store.collection("events").upsert((0..<500).map { ["_id": .string("e\($0)"), "i": .int(Int64($0))] })
        sim.run(for: 20)
        sim.crash(b)
        try a.store.collection("events").upsert((0..<20).map { ["_id": .string("same\($0)"), "body": "identical"] })
        for _ in 0..<100 {
            _ = try a.store.collection("events").findByID("counter").update { $0?["n"].increment(by: 1) }
            sim.run(for: 3)
        }
        try sim.restart(b)
        try sim.runUntilQuiet()
        try sim.check()
        d.store.flushLiveQueries()
        #expect(try d.store.collection("events").findAll().count() == 521)  // 500 + 20 + the counter
        for node in sim.nodes {
            #expect(
                try node.store.collection("events").findByID("counter").exec()?["n"]?.numberValue == 100, "\(node.name)"
            )
            #expect(try node.store.collection("events").find("body == 'identical'").count() == 20)
        }
        #expect(seen.duplicates.isEmpty, "reported twice: \(seen.duplicates)")
        live.stop()
        _ = subs
    }

    /// F17: five fully connected nodes split into {1,2} and {3,4,5}; 50 concurrent edits to the
    /// same 10 documents on each side; heal: all converge, and soon links carry only keepalives
    /// (no batch with the same documents is sent more than twice).
    @Test func f17AHealedSplitGoesQuiet() throws {
        let mesh = try Mesh(seed: 117, nodes: 5)
        for i in 0..<10 { try mesh[0].store.collection("items").upsert(["_id": .string("d\(i)"), "v": 0]) }
        try mesh.sim.runUntilQuiet()
        mesh.sim.partition([[mesh[0], mesh[1]], [mesh[2], mesh[3], mesh[4]]])
        var random = SplitMix64(seed: 117)
        for step in 0..<50 {
            for side in [[0, 1], [2, 3, 4]] {
                let node = mesh[side.randomElement(using: &random)!]
                let id = Value.string("d\(Int.random(in: 0..<10, using: &random))")
                _ = try node.store.collection("items").findByID(id).update { $0?["v"].set(.int(Int64(step))) }
            }
            mesh.sim.run(for: 100)
        }
        try mesh.sim.runUntilQuiet()
        mesh.sim.countRepeatedBatches()
        mesh.sim.heal()
        try mesh.sim.runUntilQuiet(quietFor: 30_000, timeout: 120_000)
        try mesh.sim.check()
        let repeated = mesh.sim.batchRepeats.filter { $0.value > 2 }
        #expect(repeated.isEmpty, "batches sent more than twice over one link: \(repeated)")
        let before = mesh.sim.messageCounts
        mesh.sim.run(for: 120_000)
        let after = mesh.sim.messageCounts
        for type in ["batch", "subs", "ack"] { #expect(before[type] == after[type], "\(type) kept flowing") }
    }

    /// F18: two nodes dial each other at the same instant, 200 times, a quarter of them with a
    /// connection reset in one of the handshakes: exactly one session per pair every time,
    /// keyed by identity, and both ends keep the same connection.
    @Test func f18SimultaneousDialsEndWithOneSession() throws {
        for round in 0..<200 {
            let sim = try Simulation(seed: 1_800 + UInt64(round))
            let a = try sim.addNode()
            let b = try sim.addNode()
            sim.setProfile(LinkProfile(latency: Millis(1 + round % 7), jitter: Millis(round % 3)), between: a, and: b)
            if round % 4 == 0 { sim.setProfile(LinkProfile(latency: 3, reset: 0.5), between: a, and: b) }
            sim.connect(a, b)
            sim.connect(b, a)
            sim.run(for: 200)
            if round % 4 == 0 { sim.resetProfiles() }
            try sim.runUntilQuiet(quietFor: 10_000, timeout: 600_000)
            let aPeers = a.replicator?.status.peers.filter { $0.phase == "established" } ?? []
            let bPeers = b.replicator?.status.peers.filter { $0.phase == "established" } ?? []
            #expect(
                aPeers.count == 1 && bPeers.count == 1, "round \(round): \(aPeers.count) and \(bPeers.count) sessions")
            #expect(aPeers.first?.peerKey == b.peerKey && bPeers.first?.peerKey == a.peerKey)
            #expect(
                aPeers.first?.initiator != bPeers.first?.initiator,
                "round \(round): the ends kept different connections")
        }
    }

    /// F20: B subscribes to status == 'open' and holds X; in one transaction A edits X and closes
    /// it. B learns of the change: neither `find` nor a live query on B returns X any more.
    /// Policy (docs/PROTOCOL.md): B receives the new state of a document that leaves its scope,
    /// and keeps it (it simply no longer matches).
    @Test func f20ADocumentLeavingScopeIsSeenLeaving() throws {
        let mesh = try Mesh(seed: 120, nodes: 1)
        let a = mesh[0]
        let b = try mesh.sim.addNode()
        let open = try b.store.collection("items").find("status == 'open'").subscribe()
        try b.watch("items", query: "status == 'open'")
        mesh.sim.connect(b, a)
        try a.store.collection("items").upsert(["_id": "X", "status": "open", "title": "draft"])
        try mesh.sim.runUntilQuiet()
        #expect(try b.store.collection("items").find("status == 'open'").count() == 1)
        _ = try a.store.collection("items").findByID("X").update { doc in
            doc?["title"].set("final")
            doc?["status"].set("closed")
        }
        try mesh.sim.runUntilQuiet()
        b.store.flushLiveQueries()
        #expect(try b.store.collection("items").find("status == 'open'").count() == 0)
        #expect(b.lastLiveResults["items: status == 'open'"]?.isEmpty == true)
        #expect(try Self.get(b, "X")?["status"] == "closed")
        open.cancel()
    }

    /// F20's other way in: B, subscribed to `v >= 5`, writes d9 {v: 6} while apart; A writes
    /// d9 {v: 2} later. When they meet, A merges B's d9 (v: 2 wins) and must send the result
    /// back, although it does not match B's query: B holds d9. Found by the sweep (seed 3463 of
    /// the wide workload): B kept showing v: 6 in its `v >= 5` results for good.
    @Test func aDocumentASubscriberWroteApartComesBackWithTheMeshsState() throws {
        let mesh = try Mesh(seed: 121, nodes: 1)
        let a = mesh[0]
        let b = try mesh.sim.addNode()
        let high = try b.store.collection("items").find("v >= 5").subscribe()
        try b.watch("items", query: "v >= 5")
        try b.store.collection("items").upsert(["_id": "d9", "v": 6])
        mesh.sim.run(for: 1_000)
        try a.store.collection("items").upsert(["_id": "d9", "v": 2])
        mesh.sim.connect(b, a)
        try mesh.sim.runUntilQuiet()
        b.store.flushLiveQueries()
        #expect(try Self.get(a, "d9")?["v"] == 2)
        #expect(try Self.get(b, "d9")?["v"] == 2)
        #expect(try b.store.collection("items").find("v >= 5").count() == 0)
        #expect(b.lastLiveResults["items: v >= 5"]?.isEmpty == true)
        try mesh.sim.check()
        high.cancel()
    }

    /// A (a whole subscriber of B) and B, connected; B writes d9 {v: 2} while it subscribes to
    /// nothing, and A merges it.
    static func aWriterBeforeItSubscribes(seed: UInt64) throws -> (Mesh, SimulatedNode, SimulatedNode) {
        let mesh = try Mesh(seed: seed, nodes: 1)
        let a = mesh[0]
        let b = try mesh.sim.addNode()
        try mesh.subscribe(a, "items")
        mesh.sim.connect(b, a)
        try b.store.collection("items").upsert(["_id": "d9", "v": 2])
        try mesh.sim.runUntilQuiet()
        #expect(try get(a, "d9")?["v"] == 2)
        return (mesh, a, b)
    }

    /// F20 for a subscription that comes after the writes: B writes d9 {v: 2}, which A (a whole
    /// subscriber of B) merges; only then does B subscribe to `v >= 5` of A. A changes d9 to v: 3.
    /// B holds d9, so the change must reach it although it never matched B's query. A merged d9
    /// while it served B nothing in `items`, so nothing recorded that B holds it: B kept v: 2.
    /// Now A notes that B sent documents while served nothing, and asks B for them again once
    /// B's query subscription is served (docs/PROTOCOL.md §2 step 5).
    @Test func aDocumentSentBeforeTheSubscriptionComesBackChanged() throws {
        let (mesh, a, b) = try Self.aWriterBeforeItSubscribes(seed: 124)
        let high = try b.store.collection("items").find("v >= 5").subscribe()
        try mesh.sim.runUntilQuiet()
        _ = try a.store.collection("items").findByID("d9").update { $0?["v"].set(3) }
        try mesh.sim.runUntilQuiet()
        #expect(try Self.get(a, "d9")?["v"] == 3)
        #expect(try Self.get(b, "d9")?["v"] == 3)
        try mesh.sim.check()
        high.cancel()
    }

    /// The same across a restart and a new connection: A merges B's d9 while it serves B
    /// nothing, and restarts; B subscribes to `v >= 5` while apart, and they meet again. A's note
    /// is stored, so it asks B again on the new connection.
    @Test func aDocumentSentBeforeASubscriptionComesBackChangedAfterARestart() throws {
        let (mesh, a, b) = try Self.aWriterBeforeItSubscribes(seed: 125)
        mesh.sim.setLink(a, b, up: false)
        mesh.sim.crash(a)
        try mesh.sim.restart(a)
        let high = try b.store.collection("items").find("v >= 5").subscribe()
        _ = try a.store.collection("items").findByID("d9").update { $0?["v"].set(3) }
        mesh.sim.setLink(a, b, up: true)
        try mesh.sim.runUntilQuiet()
        #expect(try Self.get(b, "d9")?["v"] == 3)
        _ = try a.store.collection("items").findByID("d9").update { $0?["v"].set(4) }
        try mesh.sim.runUntilQuiet()
        #expect(try Self.get(b, "d9")?["v"] == 4)
        try mesh.sim.check()
        high.cancel()
    }

    /// F20 through an eviction: B (subscribed to `v >= 5`, connected to A only) holds d0 {v: 7};
    /// A evicts d0, C changes it to v: 2, A fetches it again. B must hear that d0 left its query.
    /// A's row went from a stub to v: 2, and the store records no scope change for a stub ("what it
    /// matched is unknown"), so A sent d0 to B never again, and B showed v: 7 in its results for
    /// good. Found by the wide sweep (seed 5512). An eviction now records the served query
    /// subscriptions the document's value matched (as if it left their scope).
    @Test func aDocumentEvictedAndFetchedAgainIsSeenLeavingScope() throws {
        let mesh = try Mesh(seed: 122, nodes: 1)
        let a = mesh[0]
        let (b, c) = (try mesh.sim.addNode(), try mesh.sim.addNode())
        try mesh.subscribe(c, "items")
        let high = try b.store.collection("items").find("v >= 5").subscribe()
        try b.watch("items", query: "v >= 5")
        mesh.sim.connect(b, a)
        mesh.sim.connect(c, a)
        try a.store.collection("items").upsert(["_id": "d0", "v": 7])
        try mesh.sim.runUntilQuiet()
        #expect(try b.store.collection("items").find("v >= 5").count() == 1)
        mesh.sim.partition([[a, b], [c]])
        try a.store.collection("items").findByID("d0").evict()
        _ = try c.store.collection("items").findByID("d0").update { $0?["v"].set(2) }
        mesh.sim.heal()
        try mesh.sim.runUntilQuiet()
        b.store.flushLiveQueries()
        #expect(try Self.get(a, "d0")?["v"] == 2)
        #expect(try Self.get(b, "d0")?["v"] == 2)
        #expect(b.lastLiveResults["items: v >= 5"]?.isEmpty == true)
        try mesh.sim.check()
        high.cancel()
    }

    /// An eviction must not lose a write no other node holds. A sets `u = "new"` while
    /// partitioned from B and evicts the document. A stub that withheld the write's value (rule
    /// 8) would, once fetched back, carry a withheld entry that beats B's `u = "old"` everywhere:
    /// the field would show nothing on every node (this test failed so, before the store
    /// recorded unacknowledged writes). The stub keeps the values of a document holding a write
    /// no peer has acknowledged, so after the heal the write reaches B.
    @Test func evictingAnUnsentWriteKeepsIt() throws {
        let mesh = try Mesh(seed: 123, nodes: 2)
        let (a, b) = (mesh[0], mesh[1])
        try a.store.collection("items").upsert(["_id": "d0", "u": "old", "k": 1])
        try mesh.sim.runUntilQuiet()
        #expect(try Self.get(b, "d0")?["u"] == "old")
        mesh.sim.partition([[a], [b]])
        _ = try a.store.collection("items").findByID("d0").update { $0?["u"].set("new") }
        #expect(try a.store.collection("items").findByID("d0").evict())
        #expect(try a.store.documents.state(id: "d0", in: "items")?.withheldEntryCount == 0)
        mesh.sim.heal()
        try mesh.sim.runUntilQuiet()
        let (onA, onB) = (try Self.get(a, "d0"), try Self.get(b, "d0"))
        #expect(onB?["u"] == "new", "b: \(String(describing: onB))")
        #expect(onA?["u"] == "new", "a: \(String(describing: onA))")
        try mesh.sim.check()
    }

    /// The same write, once B acknowledged it: the stub withholds the values (eviction frees the
    /// space), and the document fetched back shows B's copy of the write.
    @Test func evictingAnAcknowledgedWriteWithholdsItsValue() throws {
        let mesh = try Mesh(seed: 124, nodes: 2)
        let (a, b) = (mesh[0], mesh[1])
        try a.store.collection("items").upsert(["_id": "d0", "u": "old", "k": 1])
        _ = try a.store.collection("items").findByID("d0").update { $0?["u"].set("new") }
        try mesh.sim.runUntilQuiet()
        mesh.sim.partition([[a], [b]])
        #expect(try a.store.collection("items").findByID("d0").evict())
        #expect(try a.store.documents.state(id: "d0", in: "items")?.withheldEntryCount ?? 0 > 0)
        mesh.sim.heal()
        try mesh.sim.runUntilQuiet()
        #expect(try Self.get(a, "d0")?["u"] == "new")
        #expect(try Self.get(b, "d0")?["u"] == "new")
        try mesh.sim.check()
    }

    /// A document created and evicted before any peer received it: its stub keeps the whole
    /// state and is still offered to peers (it is not shown here). B receives it after the heal;
    /// A, whose subscription matches it, fetches it back. A node that cancelled its subscription
    /// first keeps only a stub once B acknowledged the write.
    @Test func aDocumentEvictedBeforeItTravelledStillReachesPeers() throws {
        let mesh = try Mesh(seed: 126, nodes: 2)
        let (a, b) = (mesh[0], mesh[1])
        mesh.sim.partition([[a], [b]])
        try a.store.collection("items").upsert(["_id": "kept", "v": 1])
        #expect(try a.store.collection("items").findByID("kept").evict())
        mesh.sim.heal()
        try mesh.sim.runUntilQuiet()
        #expect(try Self.get(b, "kept")?["v"] == 1)
        #expect(try Self.get(a, "kept")?["v"] == 1)
        // Without a subscription on A, the evicted document stays evicted there.
        mesh.sim.partition([[a], [b]])
        mesh.subscriptions[0].cancel()  // A's
        try a.store.collection("items").upsert(["_id": "dropped", "v": 2])
        #expect(try a.store.collection("items").findByID("dropped").evict())
        mesh.sim.heal()
        try mesh.sim.runUntilQuiet()
        #expect(try Self.get(b, "dropped")?["v"] == 2)
        #expect(try Self.get(a, "dropped") == nil)
        #expect(try a.store.documents.state(id: "dropped", in: "items")?.withheldEntryCount ?? 0 > 0)
    }

    /// A write that takes a document out of a subscriber's query, then evicted before it
    /// travelled (A holds no subscription, so it does not fetch the document back): the stub
    /// offered to peers reaches the query subscriber B, which sees the document leave its query.
    @Test func anEvictedUnsentWriteStillTakesADocumentOutOfAQuery() throws {
        let mesh = try Mesh(seed: 127, nodes: 1)
        let a = mesh[0]
        let b = try mesh.sim.addNode()
        let high = try b.store.collection("items").find("v >= 5").subscribe()
        try b.watch("items", query: "v >= 5")
        mesh.sim.connect(b, a)
        try a.store.collection("items").upsert(["_id": "d0", "v": 7])
        try mesh.sim.runUntilQuiet()
        #expect(try b.store.collection("items").find("v >= 5").count() == 1)
        mesh.sim.partition([[a], [b]])
        mesh.subscriptions[0].cancel()  // A's
        _ = try a.store.collection("items").findByID("d0").update { $0?["v"].set(2) }
        #expect(try a.store.collection("items").findByID("d0").evict())
        mesh.sim.heal()
        try mesh.sim.runUntilQuiet()
        b.store.flushLiveQueries()
        #expect(try Self.get(a, "d0") == nil)
        #expect(try Self.get(b, "d0")?["v"] == 2)
        #expect(b.lastLiveResults["items: v >= 5"]?.isEmpty == true)
        high.cancel()
    }

    /// What a peer has not acknowledged survives a crash: A writes while partitioned, crashes,
    /// restarts, then evicts. The write still reaches B after the heal.
    @Test func anUnsentWriteSurvivesARestartAndAnEviction() throws {
        let mesh = try Mesh(seed: 125, nodes: 2)
        let (a, b) = (mesh[0], mesh[1])
        try a.store.collection("items").upsert(["_id": "d0", "u": "old"])
        try mesh.sim.runUntilQuiet()
        mesh.sim.partition([[a], [b]])
        _ = try a.store.collection("items").findByID("d0").update { $0?["u"].set("new") }
        mesh.sim.crash(a)
        try mesh.sim.restart(a)
        #expect(try a.store.collection("items").findByID("d0").evict())
        mesh.sim.heal()
        try mesh.sim.runUntilQuiet()
        #expect(try Self.get(a, "d0")?["u"] == "new")
        #expect(try Self.get(b, "d0")?["u"] == "new")
        try mesh.sim.check()
    }
}

/// Collects the `_id`s a live query showed, and those it reported inserted twice.
final class SeenIDs: @unchecked Sendable {
    private let lock = NSLock()
    private var all: Set<Value> = []
    private var inserted: [Value: Int] = [:]

    var ids: Set<Value> { lock.withLock { all } }
    var duplicates: [Value] { lock.withLock { inserted.filter { $0.value > 1 }.map(\.key) } }

    func add(_ ids: [Value]) { lock.withLock { all.formUnion(ids) } }

    func addInsertions(_ event: LiveQueryEvent, _ docs: [Document]) {
        lock.withLock {
            switch event {
            case .initial:
                for doc in docs { inserted[doc.id, default: 0] += 1 }
            case .update(let update):
                for index in update.insertions { inserted[docs[index].id, default: 0] += 1 }
            }
        }
    }
}

/// Issue 8 item 6 and F08: a store restored from an older backup goes back in time. Its next
/// writes still reach every peer (no `seq` is issued twice), and what it lost comes back from them.
@Suite struct RestoredStoreTests {
    @Test func aRestoredBackupNeitherLosesNorHidesWrites() throws {
        let sim = try Simulation(seed: 806)
        let a = try sim.addNode()
        let b = try sim.addNode()
        sim.connect(a, b)
        var subs: [Subscription] = []
        for node in sim.nodes { subs.append(try node.store.collection("items").findAll().subscribe()) }
        try a.store.collection("items").upsert((0..<20).map { ["_id": .string("old\($0)")] })
        try sim.runUntilQuiet()
        let backup = try sim.snapshot(a)
        try a.store.collection("items").upsert((0..<20).map { ["_id": .string("lost\($0)")] })
        try sim.runUntilQuiet()
        #expect(try b.store.collection("items").findAll().count() == 40)
        try sim.restore(a, from: backup)
        #expect(try a.store.collection("items").findAll().count() == 20)
        try a.store.collection("items").upsert(["_id": "after-restore"])
        try sim.runUntilQuiet()
        try sim.check()
        for node in sim.nodes { #expect(try node.store.collection("items").findAll().count() == 41, "\(node.name)") }
        _ = subs
    }
}

extension FieldCaseSimulationTests {
    /// Issue 8 item 1 with the per-peer bound on deferred documents. A's clock is two minutes
    /// ahead when it writes d0…d9; then C (true clock, linked to A only) writes e0…e29, which A
    /// relays. B joins, takes two documents per batch and keeps at most 5 of A's documents
    /// deferred: it postpones the batches beyond them while the batches of C's documents behind
    /// them apply. No checkpoint may pass a postponed document: once B's clock reaches A's
    /// stamps, all 40 are on B, and the mesh goes quiet (no loop of postponed batches).
    @Test func postponedBatchesAreNotSkipped() throws {
        let sim = try Simulation(seed: 121)
        sim.replicatorConfiguration = { $0.batchEntries = 2 }
        let a = try sim.addNode()
        let c = try sim.addNode()
        sim.storeOptions.maxDeferredDocumentsPerPeer = 5
        let b = try sim.addNode()
        let subscriptions = try [a, b, c].map { try $0.store.collection("items").findAll().subscribe() }
        sim.connect(c, a)
        sim.setClockOffset(a, 120_000)
        try a.store.collection("items").upsert((0..<10).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] })
        sim.setClockOffset(a, 0)
        sim.run(for: 1_000)
        try c.store.collection("items").upsert((0..<30).map { ["_id": .string("e\($0)"), "n": .int(Int64($0))] })
        sim.run(for: 1_000)
        #expect(try a.store.collection("items").findAll().exec().count == 40)
        sim.connect(b, a)
        sim.run(for: 10_000)
        #expect(try b.store.collection("items").find("_id >= 'e'").exec().count == 30)  // C's documents flow
        #expect(try b.store.collection("items").find("_id < 'e'").exec().isEmpty)  // A's wait
        #expect(try b.documents.deferredDocuments().count <= 5)
        sim.run(for: 180_000)  // B's clock passes A's stamps
        try sim.runUntilQuiet()
        try sim.check()
        #expect(try b.store.collection("items").findAll().exec().count == 40)
        #expect(try b.documents.deferredDocuments().isEmpty)
        _ = subscriptions
    }
}
