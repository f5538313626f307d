import Testing
import TrellisCore

/// Authorization rules and site pins in the pure core: what a peer may read is served, what it
/// may write is asked of it and merged, and no two keys share a site ID.
extension ReplicatorTests {
    static func rules(forB access: Authorization.CollectionAccess) -> Authorization {
        Authorization(rules: [.anyPeer: .init(default: .readWrite), .peer(keyB): access])
    }

    static func subscriptionErrors(_ directives: [ReplicatorDirective]) -> [(String, String)] {
        sent(directives).compactMap { if case .subscriptionError(.key(let s), let c, _) = $0 { (s, c) } else { nil } }
    }

    static func asked(_ directives: [ReplicatorDirective]) -> [String]? {
        for case .subscriptions(let list, _) in sent(directives) { return list.map(\.spec.collection) }
        return nil
    }

    static func logs(_ directives: [ReplicatorDirective]) -> [String] {
        directives.compactMap { if case .log(let text) = $0 { text } else { nil } }
    }

    // MARK: Read

    @Test func aSubscriptionToACollectionThePeerMayNotReadIsAnsweredForbiddenAndNeverScanned() {
        var r = established {
            $0.authorization = Self.rules(forB: .init(default: .readWrite, collections: ["secrets": .none]))
        }
        let subs = [
            WireSubscription(spec: .all("cars"), since: 0, hops: 0),
            WireSubscription(spec: .all("secrets"), since: 0, hops: 0),
        ]
        let directives = r.received(.subscriptions(subs, version: 1), on: link, now: 1)
        #expect(Self.scans(directives).map(\.spec.collection) == ["cars"])
        #expect(Self.subscriptionErrors(directives).map(\.1) == ["forbidden"])
        #expect(Self.subscriptionErrors(directives).first?.0 == SubscriptionSpec.all("secrets").key)
        #expect(r.refusals.subscriptions == 1)
        #expect(
            r.status.peers[0].served.first { $0.spec.collection == "secrets" }?.error?.hasPrefix("forbidden") == true)
        // The same set again: no second error, still no scan of it.
        let again = r.received(.subscriptions(subs, version: 2), on: link, now: 2)
        #expect(
            Self.subscriptionErrors(again).isEmpty && !Self.scans(again).contains { $0.spec.collection == "secrets" })
        // A commit in the collection scans nothing for it.
        #expect(Self.scans(r.committed(collections: ["secrets"], lastSeq: 101, now: 3)).isEmpty)
    }

    // MARK: Write

    @Test func aCollectionThePeerMayNotWriteIsNotAskedForAndItsBatchesAreRefusedWhole() throws {
        var r = established {
            $0.authorization = Self.rules(forB: .init(default: .readWrite, collections: ["secrets": .read]))
        }
        _ = try r.subscribe(.all("cars"), now: 0)
        let asked = try r.subscribe(.all("secrets"), now: 0)
        #expect(Self.asked(asked) == nil)  // nothing to add: B is not asked for secrets
        #expect(r.status.peers[0].asked.map(\.spec.collection) == ["cars"])
        let documents = [
            WireDocument(collection: "secrets", id: "s1", state: [1]),
            WireDocument(collection: "secrets", id: "s2", state: [2]),
        ]
        let refused = r.received(
            .batch(
                subscription: .key(SubscriptionSpec.all("secrets").key), documents: documents, upTo: 9, generation: 0),
            on: link, now: 5)
        #expect(Self.applies(refused).isEmpty && Self.sent(refused).isEmpty)  // not merged, not acknowledged
        #expect(Self.logs(refused).count == 1 && Self.logs(refused)[0].contains("may not write 'secrets'"))
        // Within the second: counted, not logged.
        let second = r.received(
            .batch(
                subscription: .key(SubscriptionSpec.all("secrets").key), documents: documents, upTo: 10, generation: 0),
            on: link, now: 6)
        #expect(Self.logs(second).isEmpty)
        #expect(r.refusals.batches == 2 && r.refusals.documents == 4)
        let later = r.received(
            .batch(subscription: .key(SubscriptionSpec.all("secrets").key), documents: [], upTo: 11, generation: 0),
            on: link, now: 1_100)
        #expect(Self.logs(later).first?.contains("1 refusal(s) not logged") == true)
        // The permitted collection still merges.
        let cars = r.received(
            .batch(
                subscription: .key(SubscriptionSpec.all("cars").key),
                documents: [WireDocument(collection: "cars", id: "c1", state: [3])], upTo: 4, generation: 0),
            on: link, now: 1_200)
        #expect(Self.applies(cars).map(\.documents.count) == [1])
    }

    // MARK: Relays

    @Test func aRelayForwardsOnlyWhatTheSubscriberMayReadToPeersThatMayWriteIt() {
        // B may not write "x" here; C may not read "y".
        let rules = Authorization(rules: [
            .anyPeer: .init(default: .readWrite),
            .peer(Self.keyB): .init(default: .readWrite, collections: ["x": .read]),
            .peer(Self.keyC): .init(default: .readWrite, collections: ["y": .none]),
        ])
        var r = established { $0.authorization = rules }
        let linkC = LinkID(2)
        _ = r.linkOpened(
            linkC, peerKey: Self.keyC, initiator: false, address: "c", endpoint: nil, checkpoints: [:], now: 0)
        _ = r.received(hello(Self.keyC), on: linkC, now: 0)
        // C's own presence record: it has no other session (its subscriptions are relayed).
        _ = r.received(
            .presence([PresenceRecord(peerKey: Self.keyC, version: 5, seq: 1, neighbors: [])]), on: linkC, now: 0)
        let subs = ["x", "y", "z"].map { WireSubscription(spec: .all($0), since: 0, hops: 0) }
        let directives = r.received(.subscriptions(subs, version: 1), on: linkC, now: 1)
        // C's y is forbidden; of x and z, B is asked only for z (B may not write x).
        #expect(Self.subscriptionErrors(directives).map(\.1) == ["forbidden"])
        #expect(Self.asked(directives) == ["z"])
    }

    // MARK: Run time

    @Test func rulesChangedAtRunTimeApplyAtOnceWithoutRestartingTheSession() throws {
        var r = established()
        let subs = [WireSubscription(spec: .all("cars"), since: 7, hops: 0)]
        let first = r.received(.subscriptions(subs, version: 1), on: link, now: 1)
        let scan = try #require(Self.scans(first).first)
        _ = try r.subscribe(.all("notes"), now: 1)
        // Revoke B's read of cars and its write of notes.
        let revoked = r.setAuthorization(
            Self.rules(forB: .init(default: .readWrite, collections: ["cars": .write, "notes": .read])), now: 2)
        #expect(Self.subscriptionErrors(revoked).map(\.1) == ["forbidden"])
        #expect(Self.asked(revoked) == [])  // notes no longer asked for
        #expect(Self.closes(revoked).isEmpty)
        // The scan that was running answers: nothing is sent of it.
        let page = ScanPage(records: [Self.record(8, "c1")], upTo: 8, exhausted: true)
        #expect(Self.sent(r.scanned(link, scan, page: page, now: 3)).isEmpty)
        let late = r.received(
            .batch(
                subscription: .key(SubscriptionSpec.all("notes").key),
                documents: [WireDocument(collection: "notes", id: "n1", state: [1])], upTo: 3, generation: 0),
            on: link, now: 4)
        #expect(Self.applies(late).isEmpty)
        // Grant again: cars is served from the peer's checkpoint, notes asked again.
        let granted = r.setAuthorization(.open, now: 5)
        #expect(Self.scans(granted).map(\.after) == [7])
        #expect(Self.asked(granted) == ["notes"])
    }

    // MARK: Site pins

    @Test func aSiteIDIsPinnedToTheFirstKeyAndRefusedToAnother() {
        var r = established()
        #expect(r.sitePins.contains(SitePin(site: 0x102, peerKey: Self.keyB)))
        #expect(r.sitePins.contains(SitePin(site: 0x101, peerKey: Self.keyA)))  // its own
        // C presents B's site.
        let linkC = LinkID(2)
        _ = r.linkOpened(
            linkC, peerKey: Self.keyC, initiator: false, address: "c", endpoint: nil, checkpoints: [:], now: 0)
        let forged = r.received(
            .hello(Hello(version: WireMessage.protocolVersion, peerKey: Self.keyC, site: 0x102, epoch: Self.epochB)),
            on: linkC, now: 1)
        guard case .error(let code, let message)? = Self.sent(forged).first else {
            Issue.record("expected an error, got \(forged)")
            return
        }
        #expect(code == "site" && message.contains("bound to peer key 0202"))
        #expect(Self.closes(forged) == [linkC] && r.refusals.sites == 1)
        #expect(r.status.peers.first { $0.link == link }?.phase == "established")  // B is unaffected
        // And this node's own site.
        let linkD = LinkID(3)
        _ = r.linkOpened(
            linkD, peerKey: Self.keyC, initiator: false, address: "c", endpoint: nil, checkpoints: [:], now: 2)
        let mine = r.received(
            .hello(Hello(version: WireMessage.protocolVersion, peerKey: Self.keyC, site: 0x101, epoch: Self.epochB)),
            on: linkD, now: 2)
        #expect(
            Self.sent(mine).first.map { if case .error("site", let m) = $0 { m.contains("this node") } else { false } }
                == true)
    }

    @Test func sitePinsAreSavedAndTakenBackAtTheNextStart() throws {
        var r = replicator()
        _ = r.linkOpened(
            link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 0)
        let directives = r.received(hello(), on: link, now: 0)
        let saved = directives.compactMap { if case .saveSitePins(let pins) = $0 { pins } else { nil } }
        #expect(saved.count == 1)
        let pins = try #require(saved.first)
        var restarted = replicator { $0.sitePins = pins }
        _ = restarted.linkOpened(
            link, peerKey: Self.keyC, initiator: true, address: "c", endpoint: nil, checkpoints: [:], now: 0)
        let forged = restarted.received(
            .hello(Hello(version: WireMessage.protocolVersion, peerKey: Self.keyC, site: 0x102, epoch: Self.epochB)),
            on: link, now: 1)
        #expect(Self.closes(forged) == [link])
        // A known site seen again saves nothing.
        var again = replicator { $0.sitePins = pins }
        _ = again.linkOpened(
            link, peerKey: Self.keyB, initiator: true, address: "b", endpoint: nil, checkpoints: [:], now: 0)
        #expect(
            !again.received(hello(), on: link, now: 0).contains { if case .saveSitePins = $0 { true } else { false } })
    }

    @Test func aKeyPresentingManySitesKeepsOnlyItsNewestPins() {
        var r = replicator { $0.maxSitesPerPeer = 3 }
        for n in 1...10 {
            let l = LinkID(UInt64(n))
            _ = r.linkOpened(
                l, peerKey: Self.keyB, initiator: false, address: "b", endpoint: nil, checkpoints: [:], now: 0)
            _ = r.received(
                .hello(
                    Hello(
                        version: WireMessage.protocolVersion, peerKey: Self.keyB, site: 1000 + UInt64(n),
                        epoch: Self.epochB)
                ), on: l, now: 0)
            _ = r.linkClosed(l, reason: "gone", now: 0)
        }
        #expect(r.sitePins.filter { $0.peerKey == Self.keyB }.map(\.site) == [1008, 1009, 1010])
        #expect(r.sitePins.contains(SitePin(site: 0x101, peerKey: Self.keyA)))
    }

    // MARK: Rules

    @Test func theMostSpecificRuleAppliesWhole() {
        let k1: [UInt8] = Array(repeating: 9, count: 32)
        let k2: [UInt8] = Array(repeating: 8, count: 32)
        let k3: [UInt8] = Array(repeating: 7, count: 32)
        let rules = Authorization(
            groups: ["family": [k1, k2], "audit": [k2]],
            rules: [
                .anyPeer: .init(default: .read),
                .group("family"): .init(default: .readWrite, collections: ["log": .read]),
                .group("audit"): .init(default: .none, collections: ["log": .write]),
                .peer(k1): .init(default: .none, collections: ["notes": .read]),
            ])
        #expect(rules.access(of: k1, to: "cars") == .none)  // its key's rule, whole
        #expect(rules.access(of: k1, to: "notes") == .read)
        #expect(rules.access(of: k2, to: "log") == .readWrite)  // union of its groups
        #expect(rules.access(of: k2, to: "cars") == .readWrite)
        #expect(rules.access(of: k3, to: "cars") == .read)  // any peer
        #expect(Authorization(rules: [:]).access(of: k3, to: "cars") == .none)
        #expect(Authorization.open.isOpen && !rules.isOpen)
        // Collections compare byte-wise.
        let accents = Authorization(rules: [.anyPeer: .init(default: .none, collections: ["\u{E9}": .read])])
        #expect(accents.mayRead(k3, "\u{E9}") && !accents.mayRead(k3, "e\u{301}"))
    }

    @Test func aRulesFileReadsBackAndItsMistakesAreNamed() throws {
        let key = String(repeating: "ab", count: 32)
        let text = """
            {"groups": {"family": ["\(key)"]},
             "rules": {"*": {"default": "read"},
                       "family": {"default": "read-write", "collections": {"audit": "read"}},
                       "\(key.uppercased())": {"collections": {"notes": "write"}}}}
            """
        let rules = try Authorization(json: text)
        let k = Array(repeating: UInt8(0xAB), count: 32)
        #expect(rules.groups["family"] == [k])
        #expect(rules.rules[.peer(k)] == .init(default: .none, collections: ["notes": .write]))
        #expect(rules.rules[.group("family")]?.access(to: "audit") == .read)
        #expect(try Authorization(json: rules.json) == rules)
        #expect(rules.description.contains("any peer: read by default"))
        let cases: [(String, String)] = [
            ("[]", "one JSON object"),
            ("{\"rules\": {}, \"extra\": 1}", "unknown key \"extra\""),
            ("{}", "no \"rules\""),
            ("{\"rules\": {\"*\": {\"default\": \"all\"}}}", "rules.\"*\".default is \"all\""),
            ("{\"rules\": {\"team\": {}}}", "rules.\"team\" names no group"),
            ("{\"groups\": {\"g\": [\"12\"]}, \"rules\": {}}", "groups.\"g\"[0] is not a peer key"),
            ("{\"rules\": {\"*\": {\"collections\": {\"\": \"read\"}}}}", "is not a collection name"),
            ("{\"rules\": {\"*\": {\"default\": \"read\", \"colections\": {}}}}", "unknown key \"colections\""),
            ("{\"rules\": ", "not JSON"),
        ]
        for (text, expected) in cases {
            #expect(throws: AuthorizationError.self) { try Authorization(json: text) }
            do { _ = try Authorization(json: text) } catch {
                #expect(error.description.contains(expected), "\(text): \(error)")
            }
        }
    }
}
