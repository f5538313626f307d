/// A subscription: the documents of one collection matching a query with arguments.
///
/// Its ``key`` names it on the wire and in checkpoints: the same (collection, query, args) from
/// any node has the same key. Neither a collection name nor the JSON of the arguments holds a
/// raw U+001F, so no collection name or query text can make two subscriptions collide. Peers
/// never parse the key (the collection travels beside it); locally, the collection of a stored
/// checkpoint is recovered as the text before the first U+001F (``collection(ofKey:)``).
/// Equality and hashing compare the collection name and query text byte-wise (collections "é"
/// and "e" + U+0301 are two subscriptions).
public struct SubscriptionSpec: Hashable, Sendable, CustomStringConvertible {
    public var collection: String
    /// Query text in Ditto's predicate syntax (docs/QUERIES.md); `"true"` for the whole collection.
    public var query: String
    /// Values for `$args.name` in the query: a map.
    public var args: UTF8Map<Value>

    public init(collection: String, query: String = "true", args: UTF8Map<Value> = [:]) {
        self.collection = collection
        self.query = query.isEmpty ? "true" : query
        self.args = args
    }

    /// The whole collection.
    public static func all(_ collection: String) -> SubscriptionSpec { SubscriptionSpec(collection: collection) }

    /// `collection \u{1F} query \u{1F} JSON(args)`: deterministic. Collection names never hold
    /// control characters (``validateCollectionName(_:)``), so the first U+001F ends the name.
    public var key: String {
        "\(collection)\u{1F}\(query)\u{1F}\(JSON.string(.map(args)))"
    }

    /// The 64-bit name of this subscription where the store records its scope (the high half of
    /// the ``StateDigest`` of ``key``; `DocumentStore`'s `served` and `scopes` tables, and
    /// `StoreEvent.scopeChecks`).
    public var scopeHash: Int64 { Int64(bitPattern: StateDigest(Array(key.utf8)).high) }

    /// The collection named by a subscription ``key``: the text before the first U+001F (which
    /// collection names never hold, ``validateCollectionName(_:)``).
    public static func collection(ofKey key: String) -> String {
        String(key.unicodeScalars.prefix { $0 != "\u{1F}" })
    }

    /// Whether this subscription asks for the whole collection.
    public var isWholeCollection: Bool { query == "true" && args.isEmpty }

    public var description: String {
        args.isEmpty ? "\(collection): \(query)" : "\(collection): \(query) \(JSON.string(.map(args)))"
    }

    public static func == (lhs: SubscriptionSpec, rhs: SubscriptionSpec) -> Bool {
        UTF8Key.equal(lhs.collection, rhs.collection) && UTF8Key.equal(lhs.query, rhs.query) && lhs.args == rhs.args
    }

    public func hash(into hasher: inout Hasher) {
        UTF8Key.hash(collection, into: &hasher)
        UTF8Key.hash(query, into: &hasher)
        hasher.combine(args)
    }

    /// Checks a collection name: not empty, at most 1,024 bytes of UTF-8, no control characters
    /// (U+0000–U+001F, U+007F), which keeps subscription keys unambiguous and names printable.
    ///
    /// - Throws: ``WireError`` naming the problem.
    public static func validateCollectionName(_ name: String) throws(WireError) {
        guard !name.isEmpty else { throw WireError("empty collection name") }
        guard name.utf8.count <= 1024 else { throw WireError("collection name longer than 1024 bytes") }
        guard !name.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else {
            throw WireError("collection name holds a control character")
        }
    }
}

/// One subscription as sent to a peer: what the receiver wants and from where in the sender's log.
public struct WireSubscription: Hashable, Sendable {
    public var spec: SubscriptionSpec
    /// The sender's `seq` after which to stream (the receiver's checkpoint; 0 for everything).
    public var since: Int64
    /// Hops this subscription has travelled (0 = the peer's own); at most ``WireMessage/maxHops``.
    public var hops: Int
    /// The receiver's rescan generation for the collection, plus how often the receiver asked for
    /// this subscription again on this link after postponing a batch: it changes when the receiver
    /// evicted documents or postponed a batch and wants matching ones sent again from `since`.
    /// Echoed in every `batch`.
    public var generation: UInt32
    /// The epoch of the receiver's change log that `since` counts in (16 bytes), when the sender
    /// sent this before it read the receiver's `hello` (docs/PROTOCOL.md §2, step 3): a receiver
    /// whose epoch is another serves it from 0. `nil`: `since` counts in the receiver's current
    /// epoch.
    public var epoch: [UInt8]?
    /// Whether the sender of the subscription accepts deltas (``StateDelta``) for it: documents it
    /// holds may come as the fields local writes changed (wire `d`: 1; docs/PROTOCOL.md §2 step
    /// 5). A node sends deltas only where the subscriber's `hello` also said `x: 1`: builds from
    /// before compact names read only the old delta form, and get whole states.
    public var deltas: Bool
    /// The number the sender of the subscription gave it on this connection (wire `i`,
    /// 0…2³²−1; docs/PROTOCOL.md §2 step 4), or `nil`: the receiver then names it by this number
    /// in its `batch` and `suberr` messages instead of by its key, and the sender names it so in
    /// its `ack`s. A sender numbers its subscriptions only for a peer whose `hello` said `x: 1`.
    public var number: UInt32?
    /// Whether the sender holds rows of the subscription's collection that may have come from
    /// other peers (wire `h`: 1; docs/PROTOCOL.md §2 step 5). With `since` 0: it holds rows of
    /// the collection that did not all come from the receiver (or relays for a peer that said
    /// so); the receiver then carries, among the pages from 0, the tombstones it
    /// reaped from the start of its log, as for a peer whose checkpoint is below its floor, so
    /// that the copies of documents removed there go on the subscriber too. A subscriber that
    /// holds nothing of the collection gets none of them. With a `since` above 0: the sender
    /// asked from 0 without `h` in this chain of checkpoints and has since got live documents of
    /// the collection from another peer; the receiver sends every tombstone it reaped at or below
    /// `since` first, then resumes from `since` (``ReapedKeys/wanted``).
    public var holds: Bool

    public init(
        spec: SubscriptionSpec, since: Int64, hops: Int, generation: UInt32 = 0, epoch: [UInt8]? = nil,
        deltas: Bool = false, number: UInt32? = nil, holds: Bool = false
    ) {
        self.spec = spec
        self.since = since
        self.hops = hops
        self.generation = generation
        self.epoch = epoch
        self.deltas = deltas
        self.number = number
        self.holds = holds
    }
}

/// How a `batch`, `ack` or `suberr` names a subscription (docs/PROTOCOL.md §2 step 4): by its
/// ``SubscriptionSpec/key`` (wire `sub`), or by the number its subscriber gave it in `subs`
/// (wire `i`, ``WireSubscription/number``), which a peer that said `x: 1` in its `hello` reads.
public enum SubscriptionName: Hashable, Sendable, CustomStringConvertible, ExpressibleByStringLiteral {
    /// The subscription's key.
    case key(String)
    /// The number its subscriber gave it on this connection.
    case number(UInt32)

    public init(stringLiteral key: String) { self = .key(key) }

    public var description: String {
        switch self {
        case .key(let key): key
        case .number(let n): "#\(n)"
        }
    }

    /// Matches a name against a subscription key in patterns (`case .ack(spec.key, …)`).
    public static func ~= (key: String, name: SubscriptionName) -> Bool { name == .key(key) }
}

/// A document state on the wire.
public struct WireDocument: Sendable, Equatable {
    /// The document's collection; empty in a `batch` entry that left `c` out because it is the
    /// subscription's (a batch that names its subscription by number, docs/PROTOCOL.md §2): the
    /// receiving replicator fills it in before anything else reads it, and a sender writes an
    /// empty one as no `c`.
    public var collection: String
    public var id: Value
    /// The document's CRDT state: ``DocumentState/cbor()``.
    public var state: [UInt8]
    /// `state` decoded ahead of the merge (``WireMessage/decodingStates()``), or `nil`; not part
    /// of the message, and ignored by `==`.
    public var decoded: DecodedState?

    public init(collection: String, id: Value, state: [UInt8]) {
        self.collection = collection
        self.id = id
        self.state = state
    }

    public static func == (a: WireDocument, b: WireDocument) -> Bool {
        a.collection == b.collection && a.id == b.id && a.state == b.state
    }
}

/// The `hello` that opens a session.
public struct Hello: Sendable, Equatable {
    public var version: Int
    public var peerKey: [UInt8]
    public var site: SiteID
    public var epoch: [UInt8]
    /// A random number naming this connection, chosen by the sender (duplicate-link tie-break).
    public var nonce: UInt64
    /// Whether the sender honours a subscription's `e` (``WireSubscription/epoch``), so that a
    /// peer that saw this may send its `subs` on a later connection right after its own `hello`,
    /// without waiting for the sender's: the one-round-trip reconnect (docs/PROTOCOL.md §2, step 3).
    public var earlySubscriptions: Bool
    /// Whether the sender reads the compact names of docs/PROTOCOL.md §2 (wire `x`: 1):
    /// subscriptions numbered in `subs` and named by number in `batch`, `ack` and `suberr`, batch
    /// entries without `c`, and a `hello` without `key` (the key the channel authenticated).
    public var compactNames: Bool
    /// Whether the sender sends and reads caught-up batches (wire: bit 0 of `f`, the feature
    /// bits): a ``WireMessage/caughtUp(subscription:generation:)`` in place of the empty
    /// end-of-log `batch` whose `upTo` would equal the subscription's `since`, never acknowledged
    /// (docs/PROTOCOL.md §2, step 5). Used only when both peers' `hello`s say so.
    public var caughtUpBatches: Bool
    /// Whether the sender remembers each peer's last subscription set and reads it resumed by
    /// digest (wire: bit 1 of `f`): a peer that saw this may send, on a later connection, a
    /// ``WireMessage/subscriptionsDigest(_:version:)`` in place of its early `subs`
    /// (docs/PROTOCOL.md §2, step 3).
    public var resumesSubscriptions: Bool
    /// Whether the sender remembers each peer's last `hello` with its subscription set and reads a
    /// session resumed by digest (wire: bit 2 of `f`): a peer that saw this may open a later
    /// connection with a ``WireMessage/resume(_:)`` in place of its `hello` and early `subs`
    /// (docs/PROTOCOL.md §2, step 1).
    public var resumesSessions: Bool

    /// - Parameter peerKey: the sender's 32-byte peer key, or empty when the `hello` left `key`
    ///   out (a sender does so only to a peer that said `x: 1`): it is then the key the channel
    ///   authenticated.
    public init(
        version: Int, peerKey: [UInt8], site: SiteID, epoch: [UInt8], nonce: UInt64 = 0,
        earlySubscriptions: Bool = false, compactNames: Bool = false, caughtUpBatches: Bool = false,
        resumesSubscriptions: Bool = false, resumesSessions: Bool = false
    ) {
        self.version = version
        self.peerKey = peerKey
        self.site = site
        self.epoch = epoch
        self.nonce = nonce
        self.earlySubscriptions = earlySubscriptions
        self.compactNames = compactNames
        self.caughtUpBatches = caughtUpBatches
        self.resumesSubscriptions = resumesSubscriptions
        self.resumesSessions = resumesSessions
    }

    /// The bytes a ``WireMessage/resume(_:)`` digest covers for this `hello`: its encoding with
    /// the sender's key always present and the connection's nonce 0 (a resumed session takes its
    /// nonce from the secure channel). Both ends compute it: the sender from the `hello` it would
    /// send, the receiver from the last one it received.
    ///
    /// - Parameter key: the sender's 32-byte peer key (the channel's, when this `hello` left it out).
    public func resumeBytes(key: [UInt8]) -> [UInt8] {
        var canonical = self
        canonical.peerKey = key
        canonical.nonce = 0
        return WireMessage.hello(canonical).serialized()
    }
}

/// A message of the Trellis sync protocol (docs/PROTOCOL.md §2). Each travels as one CBOR map
/// with a `"t"` (type) key.
public enum WireMessage: Sendable, Equatable {
    /// `{t:"hello", v, key, site, epoch, n}`.
    case hello(Hello)
    /// `{t:"subs", subs:[{c, q, a, since, hops, gen}], v}`: the sender's complete subscription
    /// set, replacing any earlier one; `v` grows with each set sent on a link, so a receiver
    /// ignores a set whose `v` is not above the last one it took (unless `v` is 0 or absent).
    case subscriptions([WireSubscription], version: UInt64 = 0)
    /// `{t:"subs", v, h}` without `subs`: stands for the `subs` of version `version` whose
    /// serialized bytes have the 128-bit ``StateDigest`` `h` (16 bytes, high half first). A peer
    /// that remembers the sender's last set rebuilds it and, when the digest matches, takes it as
    /// that `subs`; otherwise it answers ``subscriptionsRequest(version:)``. Sent only to a peer
    /// whose last ``Hello/resumesSubscriptions`` said it reads one (docs/PROTOCOL.md §2, step 3).
    case subscriptionsDigest(StateDigest, version: UInt64)
    /// `{t:"subsreq", v}`: the receiver of a ``subscriptionsDigest(_:version:)`` of version `v`
    /// could not rebuild that set: the sender of the digest sends the `subs` in full.
    case subscriptionsRequest(version: UInt64)
    /// `{t:"r", h}`: a resumed session's first message, in place of `hello` and the early `subs`.
    /// `h` (16 bytes) is the ``StateDigest`` of the sender's `hello` as
    /// ``Hello/resumeBytes(key:)`` encodes it followed by the encoding of its `subs` of version
    /// 1. A receiver that remembers the sender's last `hello` and subscription set takes both when
    /// the digest matches (the `hello` with the connection's nonce from the secure channel);
    /// otherwise it answers ``helloRequest``. Sent only to a peer whose last `hello` set
    /// ``Hello/resumesSessions`` (docs/PROTOCOL.md §2, step 1).
    case resume(StateDigest)
    /// `{t:"helloreq"}`: the receiver of a ``resume(_:)`` could not rebuild the session it stands
    /// for: the sender sends its `hello` and `subs` in full.
    case helloRequest
    /// `{t:"batch", sub, docs:[{c, id, s}], upTo, gen, left}`: changes for one subscription, in
    /// the sender's `seq` order, covering the sender's log up to `upTo`. `left` (optional) is the
    /// sender's count of log entries of the collection after `upTo` when the batch was cut: an
    /// upper bound on the documents still to come, 0 once the sender reached the end of its log
    /// (the receiver's initial sync of the subscription is then complete).
    case batch(
        subscription: SubscriptionName, documents: [WireDocument], upTo: Int64, generation: UInt32, left: Int64? = nil)
    /// `{t:"batch", sub, gen}` without `docs`, `upTo` and `left`: a **caught-up batch**. Its
    /// sender scanned its log from the subscription's `since` (of generation `generation`) to
    /// the end and found nothing after it: the `batch` it stands for would carry no document, an
    /// `upTo` equal to that `since` and `left: 0`, so it moves nothing at the receiver. The
    /// receiver notes that its initial sync of the subscription is complete, stores nothing and
    /// sends no `ack`; the sender counts it in no flow control. Sent only to a peer whose
    /// ``Hello/caughtUpBatches`` said it reads one (docs/PROTOCOL.md §2, step 5).
    case caughtUp(subscription: SubscriptionName, generation: UInt32 = 0)
    /// `{t:"ack", sub, upTo}`: the receiver committed the batch up to `upTo` (with SQLite's
    /// `synchronous=NORMAL` by default: a power loss may still take the commit back).
    /// `deferred`: the receiver kept some of the batch's documents aside to retry (their clock,
    /// size or validity, docs/PROTOCOL.md §3): it does not hold them yet.
    case ack(subscription: SubscriptionName, upTo: Int64, deferred: Bool = false)
    /// `{t:"suberr", sub, code, msg}`: the sender cannot serve this one subscription (its query
    /// does not parse or bind here, reading the log failed, a limit); the session goes on.
    case subscriptionError(subscription: SubscriptionName, code: String, message: String)
    /// `{t:"ping", n}`: keepalive; answered by `pong` with the same `n`.
    case ping(UInt64)
    /// `{t:"pong", n}`.
    case pong(UInt64)
    /// `{t:"error", code, msg}`: the sender is closing the session for this reason.
    case error(code: String, message: String)
    /// `{t:"presence", nodes:[{key, v, seq, peers:[key…]}]}`: presence records (link-state
    /// gossip: who has a session with whom), at most ``PresenceRecord/maxPerMessage`` per message.
    case presence([PresenceRecord])

    /// The protocol version this build speaks (docs/PROTOCOL.md): 3 brought the Noise_XXpsk0
    /// handshake, rekey markers and states in the single-write form; 4 the join that drops what the
    /// other side saw and no longer holds, so removed fields' remove contexts can be reaped (a
    /// version 3 node would bring reaped fields back, so the versions do not sync).
    public static let protocolVersion = 5
    /// The most hops a forwarded subscription may carry on the wire.
    public static let maxHops = 16

    /// The message as a CBOR-ready value.
    public var encoded: Value {
        switch self {
        case .hello(let h):
            var map: UTF8Map<Value> = [
                "t": "hello", "v": .int(Int64(h.version)), "site": .int(Int64(bitPattern: h.site)),
                "epoch": .bytes(h.epoch), "n": .int(Int64(bitPattern: h.nonce)),
            ]
            if !h.peerKey.isEmpty { map["key"] = .bytes(h.peerKey) }
            if h.earlySubscriptions { map["es"] = 1 }
            if h.compactNames { map["x"] = 1 }
            let features =
                (h.caughtUpBatches ? 1 : 0) | (h.resumesSubscriptions ? 2 : 0) | (h.resumesSessions ? 4 : 0)
            if features != 0 { map["f"] = .int(Int64(features)) }
            return .map(map)
        case .subscriptions(let subs, let version):
            return [
                "t": "subs", "v": .int(Int64(bitPattern: version)),
                "subs": .array(
                    subs.map {
                        // `a` and `gen` are optional: left out at their defaults; so are `q` and `hops`
                        // in a numbered entry, which only a peer that reads compact names receives.
                        var entry: UTF8Map<Value> = ["c": .string($0.spec.collection), "since": .int($0.since)]
                        if $0.number == nil || $0.spec.query != "true" { entry["q"] = .string($0.spec.query) }
                        if $0.number == nil || $0.hops != 0 { entry["hops"] = .int(Int64($0.hops)) }
                        if !$0.spec.args.isEmpty { entry["a"] = .map($0.spec.args) }
                        if $0.generation != 0 { entry["gen"] = .int(Int64($0.generation)) }
                        if let epoch = $0.epoch { entry["e"] = .bytes(epoch) }
                        if $0.deltas { entry["d"] = .int(1) }
                        if let number = $0.number { entry["i"] = .int(Int64(number)) }
                        if $0.holds { entry["h"] = .int(1) }
                        return .map(entry)
                    }),
            ]
        case .batch(let sub, let docs, let upTo, let generation, let left):
            var map: UTF8Map<Value> = [
                "t": "batch",
                "docs": .array(
                    docs.map {
                        $0.collection.isEmpty
                            ? ["id": $0.id, "s": .bytes($0.state)]
                            : ["c": .string($0.collection), "id": $0.id, "s": .bytes($0.state)]
                    }),
                "upTo": .int(upTo),
            ]
            Self.name(sub, into: &map)
            if generation != 0 { map["gen"] = .int(Int64(generation)) }
            if let left { map["left"] = .int(left) }
            return .map(map)
        case .subscriptionsDigest(let digest, let version):
            return ["t": "subs", "v": .int(Int64(bitPattern: version)), "h": .bytes(digest.bytes)]
        case .subscriptionsRequest(let version):
            return ["t": "subsreq", "v": .int(Int64(bitPattern: version))]
        case .resume(let digest):
            return ["t": "r", "h": .bytes(digest.bytes)]
        case .helloRequest:
            return ["t": "helloreq"]
        case .caughtUp(let sub, let generation):
            var map: UTF8Map<Value> = ["t": "batch"]
            Self.name(sub, into: &map)
            if generation != 0 { map["gen"] = .int(Int64(generation)) }
            return .map(map)
        case .ack(let sub, let upTo, let deferred):
            var map: UTF8Map<Value> = ["t": "ack", "upTo": .int(upTo)]
            Self.name(sub, into: &map)
            if deferred { map["deferred"] = .int(1) }
            return .map(map)
        case .subscriptionError(let sub, let code, let message):
            var map: UTF8Map<Value> = ["t": "suberr", "code": .string(code), "msg": .string(message)]
            Self.name(sub, into: &map)
            return .map(map)
        case .ping(let n):
            return ["t": "ping", "n": .int(Int64(bitPattern: n))]
        case .pong(let n):
            return ["t": "pong", "n": .int(Int64(bitPattern: n))]
        case .error(let code, let message):
            return ["t": "error", "code": .string(code), "msg": .string(message)]
        case .presence(let records):
            return [
                "t": "presence",
                "nodes": .array(
                    records.map {
                        [
                            "key": .bytes($0.peerKey), "v": .int(Int64($0.version)),
                            "seq": .int(Int64(bitPattern: $0.seq)), "peers": .array($0.neighbors.map { .bytes($0) }),
                        ]
                    }),
            ]
        }
    }

    /// `sub` (a key) or `i` (a number) naming a subscription in a message map.
    private static func name(_ name: SubscriptionName, into map: inout UTF8Map<Value>) {
        switch name {
        case .key(let key): map["sub"] = .string(key)
        case .number(let number): map["i"] = .int(Int64(number))
        }
    }

    /// Encodes to CBOR bytes.
    public func serialized() -> [UInt8] {
        guard case .batch(let subscription, let documents, let upTo, let generation, let left) = self else {
            return CBOR.encode(encoded)
        }
        // The bulk of a sync, written straight into one buffer: the bytes of `CBOR.encode(encoded)`
        // (keys in deterministic order: shorter first, then bytewise), without building the tree.
        var capacity = 64
        if case .key(let key) = subscription { capacity += key.utf8.count }
        for document in documents { capacity += 48 + document.collection.utf8.count + document.state.count }
        var writer = CBORWriter(capacity: capacity)
        writer.writeMapHeader(count: 4 + (generation == 0 ? 0 : 1) + (left == nil ? 0 : 1))  // t, docs, upTo and a name
        switch subscription {
        case .number(let number):
            writer.writeText("i")
            writer.writeInt(Int64(number))
            writer.writeText("t")
            writer.writeText("batch")
            if generation != 0 {
                writer.writeText("gen")
                writer.writeInt(Int64(generation))
            }
        case .key(let key):
            writer.writeText("t")
            writer.writeText("batch")
            if generation != 0 {
                writer.writeText("gen")
                writer.writeInt(Int64(generation))
            }
            writer.writeText("sub")
            writer.writeText(key)
        }
        writer.writeText("docs")
        writer.writeArrayHeader(count: documents.count)
        for document in documents {
            if document.collection.isEmpty {
                writer.writeMapHeader(count: 2)
            } else {
                writer.writeMapHeader(count: 3)
                writer.writeText("c")
                writer.writeText(document.collection)
            }
            writer.writeText("s")
            writer.writeBytes(document.state)
            writer.writeText("id")
            writer.write(document.id)
        }
        if let left {
            writer.writeText("left")
            writer.writeInt(left)
        }
        writer.writeText("upTo")
        writer.writeInt(upTo)
        return writer.bytes
    }

    /// Decodes one message from CBOR bytes.
    ///
    /// - Throws: ``WireError`` naming the missing, mistyped or out-of-range field; peers are
    ///   untrusted, so every integer is range-checked here.
    public init(serialized bytes: [UInt8]) throws(WireError) {
        if let batch = Self.canonicalBatch(bytes) {
            self = batch
            return
        }
        let value: Value
        do { value = try CBOR.decode(bytes) } catch { throw WireError("not CBOR: \(error)") }
        try self.init(value)
    }

    /// A batch laid out exactly as ``serialized()`` writes one (definite lengths, keys in
    /// deterministic order, every field in range), read without building its ``Value`` tree;
    /// `nil` for anything else, which the general decoder then reads or refuses with its reasons.
    /// What it accepts decodes to the same message through the general decoder (tested).
    ///
    /// - Complexity: O(size of the message).
    static func canonicalBatch(_ bytes: [UInt8]) -> WireMessage? {
        var reader = CBORReader(bytes, options: CBOR.DecodingOptions())
        func key(_ expected: StaticString) -> Bool {
            guard let head = try? reader.readHead(), head.major == 3, !head.isIndefinite,
                head.argument == UInt64(expected.utf8CodeUnitCount), reader.remaining >= Int(head.argument)
            else { return false }
            let start = reader.position
            guard (try? reader.readText(head)) != nil else { return false }
            return expected.withUTF8Buffer { $0.elementsEqual(bytes[start..<reader.position]) }
        }
        func text() -> String? {
            guard let head = try? reader.readHead(), head.major == 3, !head.isIndefinite else { return nil }
            return try? reader.readText(head)
        }
        func unsigned(max: UInt64) -> Int64? {
            guard let head = try? reader.readHead(), head.major == 0, head.argument <= max else { return nil }
            return Int64(head.argument)
        }
        func documentList() -> [WireDocument]? {
            guard let list = try? reader.readHead(), list.major == 4, !list.isIndefinite,
                let count = try? reader.checkCount(list, minimumSize: 1, what: "array")
            else { return nil }
            var documents: [WireDocument] = []
            documents.reserveCapacity(count)
            for _ in 0..<count {
                guard let map = try? reader.readHead(), map.major == 5, !map.isIndefinite,
                    map.argument == 2 || map.argument == 3
                else { return nil }
                var collection = ""
                if map.argument == 3 {
                    guard key("c"), let text = text(), !text.isEmpty else { return nil }
                    collection = text
                }
                guard key("s"), let stateHead = try? reader.readHead(), stateHead.major == 2, !stateHead.isIndefinite,
                    let state = try? reader.readByteString(stateHead),
                    key("id"), let id = try? reader.readValue(depth: 3)
                else { return nil }
                documents.append(WireDocument(collection: collection, id: id, state: state))
            }
            return documents
        }
        // The keys in deterministic order, each at most once: `i` (a numbered subscription) or
        // `sub` (a key), `t`, then the optional `gen`, `docs`, the optional `left`, and `upTo`.
        guard let top = try? reader.readHead(), top.major == 5, !top.isIndefinite, (3...6).contains(top.argument)
        else { return nil }
        var name: SubscriptionName?
        if bytes.count > 2, bytes[1] == 0x61, bytes[2] == UInt8(ascii: "i") {
            guard key("i"), let number = unsigned(max: UInt64(UInt32.max)) else { return nil }
            name = .number(UInt32(number))
        }
        guard key("t"), text() == "batch" else { return nil }
        var fields = 2 + (name == nil ? 0 : 1)
        var generation: Int64 = 0
        if reader.remaining > 4, bytes[reader.position] == 0x63, bytes[reader.position + 1] == UInt8(ascii: "g") {
            guard key("gen"), let value = unsigned(max: UInt64(UInt32.max)) else { return nil }
            generation = value
            fields += 1
        }
        if name == nil {
            guard key("sub"), let subscription = text() else { return nil }
            name = .key(subscription)
            fields += 1
        }
        guard key("docs"), let documents = documentList() else { return nil }
        var left: Int64?
        if UInt64(fields) + 1 < top.argument {
            guard key("left"), let value = unsigned(max: UInt64(Int64.max)) else { return nil }
            left = value
            fields += 1
        }
        guard UInt64(fields) + 1 == top.argument, key("upTo"), let upTo = unsigned(max: UInt64(Int64.max)),
            (try? reader.expectEnd()) != nil, let name
        else { return nil }
        return .batch(subscription: name, documents: documents, upTo: upTo, generation: UInt32(generation), left: left)
    }

    /// The message with the state of every document of a batch decoded
    /// (``WireDocument/decoded``), so that the merge finds them ready: called on a link's reader
    /// thread, it takes that work off the sync engine's queue.
    ///
    /// - Complexity: O(size of the message).
    public func decodingStates() -> WireMessage {
        guard case .batch(let subscription, var documents, let upTo, let generation, let left) = self else {
            return self
        }
        for k in documents.indices {
            documents[k].decoded = DecodedState(documents[k].state, id: documents[k].id)
        }
        return .batch(subscription: subscription, documents: documents, upTo: upTo, generation: generation, left: left)
    }

    /// Decodes one message from its CBOR value. See ``init(serialized:)``.
    public init(_ value: Value) throws(WireError) {
        guard case .map = value else { throw WireError("message is not a map") }
        guard case .string(let type)? = value["t"] else { throw WireError("message has no type") }
        let m = Fields(message: type, value: value)
        switch type {
        case "hello":
            // `key` may be left out for a peer that said `x: 1`: it is then the channel's.
            let key = value["key"] == nil ? [] : try m.bytes("key")
            let epoch = try m.bytes("epoch")
            guard key.isEmpty || key.count == 32 else {
                throw WireError("hello: 'key' must be 32 bytes, not \(key.count)")
            }
            guard epoch.count == 16 else { throw WireError("hello: 'epoch' must be 16 bytes, not \(epoch.count)") }
            // Feature bits: a bit this build does not know is ignored (a later build's).
            let features = try m.optionalInt("f", in: 0...Int64.max) ?? 0
            self = .hello(
                Hello(
                    version: Int(try m.int("v", in: 0...Int64(UInt16.max))), peerKey: key,
                    site: SiteID(bitPattern: try m.int("site")), epoch: epoch,
                    nonce: UInt64(bitPattern: try m.optionalInt("n") ?? 0),
                    earlySubscriptions: try m.optionalInt("es", in: 0...1) == 1,
                    compactNames: try m.optionalInt("x", in: 0...1) == 1,
                    caughtUpBatches: features & 1 == 1, resumesSubscriptions: features & 2 == 2,
                    resumesSessions: features & 4 == 4))
        case "subs" where value["subs"] == nil && value["h"] != nil:
            self = .subscriptionsDigest(try m.digest("h"), version: UInt64(bitPattern: try m.optionalInt("v") ?? 0))
        case "subsreq":
            self = .subscriptionsRequest(version: UInt64(bitPattern: try m.optionalInt("v") ?? 0))
        case "r":
            self = .resume(try m.digest("h"))
        case "helloreq":
            self = .helloRequest
        case "subs":
            guard case .array(let list)? = value["subs"] else { throw WireError("subs: missing 'subs' array") }
            var subs: [WireSubscription] = []
            subs.reserveCapacity(list.count)
            for item in list {
                guard case .map = item else { throw WireError("subs: entry is not a map") }
                let s = Fields(message: "subs", value: item)
                let args: UTF8Map<Value>
                switch item["a"] {
                case nil: args = [:]
                case .map(let a)?: args = a
                case let other?: throw WireError("subs: 'a' is \(other.typeName), not a map")
                }
                let collection = try s.string("c")
                try SubscriptionSpec.validateCollectionName(collection)
                var epoch: [UInt8]?
                if item["e"] != nil {
                    epoch = try s.bytes("e")
                    guard epoch?.count == 16 else { throw WireError("subs: 'e' must be 16 bytes, not \(epoch!.count)") }
                }
                subs.append(
                    WireSubscription(
                        spec: SubscriptionSpec(
                            collection: collection, query: item["q"] == nil ? "true" : try s.string("q"), args: args),
                        since: try s.int("since", in: 0...Int64.max),
                        hops: Int(try s.optionalInt("hops", in: 0...Int64(Self.maxHops)) ?? 0),
                        generation: UInt32(try s.optionalInt("gen", in: 0...Int64(UInt32.max)) ?? 0),
                        epoch: epoch, deltas: try s.optionalInt("d", in: 0...1) == 1,
                        number: try s.optionalInt("i", in: 0...Int64(UInt32.max)).map { UInt32($0) },
                        holds: try s.optionalInt("h", in: 0...1) == 1))
            }
            self = .subscriptions(subs, version: UInt64(bitPattern: try m.optionalInt("v") ?? 0))
        case "batch":
            // Neither `docs` nor `upTo`: a caught-up batch (its `left` would be 0, and is left out).
            if value["docs"] == nil, value["upTo"] == nil, value["left"] == nil {
                self = .caughtUp(
                    subscription: try m.subscriptionName(),
                    generation: UInt32(try m.optionalInt("gen", in: 0...Int64(UInt32.max)) ?? 0))
                return
            }
            guard case .array(let list)? = value["docs"] else { throw WireError("batch: missing 'docs' array") }
            var docs: [WireDocument] = []
            docs.reserveCapacity(list.count)
            for item in list {
                guard case .map = item, let id = item["id"] else { throw WireError("batch: document without 'id'") }
                let d = Fields(message: "batch", value: item)
                // No `c`: the subscription's collection (filled in by the replicator).
                let collection = item["c"] == nil ? "" : try d.string("c")
                docs.append(WireDocument(collection: collection, id: id, state: try d.bytes("s")))
            }
            self = .batch(
                subscription: try m.subscriptionName(), documents: docs, upTo: try m.int("upTo", in: 0...Int64.max),
                generation: UInt32(try m.optionalInt("gen", in: 0...Int64(UInt32.max)) ?? 0),
                left: try m.optionalInt("left", in: 0...Int64.max))
        case "ack":
            self = .ack(
                subscription: try m.subscriptionName(), upTo: try m.int("upTo", in: 0...Int64.max),
                deferred: try m.optionalInt("deferred", in: 0...1) == 1)
        case "suberr":
            self = .subscriptionError(
                subscription: try m.subscriptionName(), code: try m.string("code"), message: try m.string("msg"))
        case "ping":
            self = .ping(UInt64(bitPattern: try m.int("n")))
        case "pong":
            self = .pong(UInt64(bitPattern: try m.int("n")))
        case "error":
            self = .error(code: try m.string("code"), message: try m.string("msg"))
        case "presence":
            guard case .array(let list)? = value["nodes"] else { throw WireError("presence: missing 'nodes' array") }
            guard list.count <= PresenceRecord.maxPerMessage else {
                throw WireError("presence: \(list.count) records, more than \(PresenceRecord.maxPerMessage)")
            }
            var records: [PresenceRecord] = []
            for item in list {
                guard case .map = item else { throw WireError("presence: record is not a map") }
                let r = Fields(message: "presence", value: item)
                let key = try r.bytes("key")
                guard key.count == 32 else { throw WireError("presence: 'key' must be 32 bytes, not \(key.count)") }
                guard case .array(let peers)? = item["peers"] else {
                    throw WireError("presence: missing 'peers' array")
                }
                guard peers.count <= PresenceRecord.maxNeighbors else {
                    throw WireError("presence: \(peers.count) peers, more than \(PresenceRecord.maxNeighbors)")
                }
                var neighbors: [[UInt8]] = []
                for peer in peers {
                    guard case .bytes(let k) = peer, k.count == 32 else {
                        throw WireError("presence: a peer is not a 32-byte key")
                    }
                    neighbors.append(k)
                }
                records.append(
                    PresenceRecord(
                        peerKey: key, version: Int(try r.int("v", in: 0...Int64(UInt16.max))),
                        seq: UInt64(try r.int("seq", in: 0...Int64.max)), neighbors: neighbors))
            }
            self = .presence(records)
        default:
            throw WireError("unknown message type '\(type)'")
        }
    }
}

/// A message that does not decode.
public struct WireError: Error, Equatable, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { "malformed message: \(message)" }
}

/// Typed, range-checked access to the fields of one decoded message map.
private struct Fields {
    let message: String
    let value: Value

    func int(_ key: String, in range: ClosedRange<Int64> = Int64.min...Int64.max) throws(WireError) -> Int64 {
        guard let i = try optionalInt(key, in: range) else {
            throw WireError("\(message): '\(key)' is missing or not an integer")
        }
        return i
    }

    func optionalInt(_ key: String, in range: ClosedRange<Int64> = Int64.min...Int64.max) throws(WireError) -> Int64? {
        switch value[key] {
        case nil: return nil
        case .int(let i)?:
            guard range.contains(i) else {
                throw WireError("\(message): '\(key)' = \(i) is outside \(range.lowerBound)...\(range.upperBound)")
            }
            return i
        case let other?: throw WireError("\(message): '\(key)' is \(other.typeName), not an integer")
        }
    }

    func string(_ key: String) throws(WireError) -> String {
        guard case .string(let s)? = value[key] else {
            throw WireError("\(message): '\(key)' is missing or not a string")
        }
        return s
    }

    /// The subscription a `batch`, `ack` or `suberr` names: its number `i`, else its key `sub`.
    func subscriptionName() throws(WireError) -> SubscriptionName {
        if let number = try optionalInt("i", in: 0...Int64(UInt32.max)) { return .number(UInt32(number)) }
        return .key(try string("sub"))
    }

    func bytes(_ key: String) throws(WireError) -> [UInt8] {
        guard case .bytes(let b)? = value[key] else { throw WireError("\(message): '\(key)' is missing or not bytes") }
        return b
    }

    /// A 128-bit ``StateDigest``: 16 bytes (a `subs` digest's or an `r`'s `h`).
    func digest(_ key: String) throws(WireError) -> StateDigest {
        let b = try bytes(key)
        guard b.count == 16 else { throw WireError("\(message): '\(key)' must be 16 bytes, not \(b.count)") }
        return StateDigest(bytes: b[...])
    }
}
