/// A subscription: the documents of one collection matching a query with arguments.
///
/// Its ``key`` names it on the wire and in checkpoints: the same (collection, query, args) from
/// any node has the same key. Equality and hashing compare the collection name and query text
/// byte-wise (collections "é" and "e" + U+0301 are two subscriptions).
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

    /// `collection \u{1F} query \u{1F} JSON(args)`: deterministic.
    public var key: String {
        "\(collection)\u{1F}\(query)\u{1F}\(JSON.string(.map(args)))"
    }

    /// The collection named by a subscription ``key`` (the text before the first U+001F).
    public static func collection(ofKey key: String) -> String {
        String(key.unicodeScalars.prefix { $0 != "\u{1F}" })
    }

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
}

/// One subscription as sent to a peer: what the receiver wants and from where in the sender's log.
public struct WireSubscription: Hashable, Sendable {
    public var spec: SubscriptionSpec
    /// The sender's `seq` after which to stream (the receiver's checkpoint; 0 for everything).
    public var since: Int64
    /// Hops this subscription has travelled (0 = the peer's own); forwarded ones are bounded.
    public var hops: Int

    public init(spec: SubscriptionSpec, since: Int64, hops: Int) {
        self.spec = spec
        self.since = since
        self.hops = hops
    }
}

/// A document state on the wire.
public struct WireDocument: Sendable, Equatable {
    public var collection: String
    public var id: Value
    /// The document's CRDT state: ``DocumentState/cbor()``.
    public var state: [UInt8]

    public init(collection: String, id: Value, state: [UInt8]) {
        self.collection = collection
        self.id = id
        self.state = state
    }
}

/// The `hello` that opens a session.
public struct Hello: Sendable, Equatable {
    public var version: Int
    public var peerKey: [UInt8]
    public var site: SiteID
    public var epoch: [UInt8]

    public init(version: Int, peerKey: [UInt8], site: SiteID, epoch: [UInt8]) {
        self.version = version
        self.peerKey = peerKey
        self.site = site
        self.epoch = epoch
    }
}

/// A message of the Trellis sync protocol (docs/PROTOCOL.md). Each travels as one CBOR map with
/// a `"t"` (type) key.
public enum WireMessage: Sendable, Equatable {
    /// `{t:"hello", v, key, site, epoch}`.
    case hello(Hello)
    /// `{t:"subs", subs:[{c, q, a, since, hops}]}`: the sender's complete subscription set,
    /// replacing any earlier one.
    case subscriptions([WireSubscription])
    /// `{t:"batch", sub, docs:[{c, id, s}], upTo}`: changes for one subscription, in the sender's
    /// `seq` order, covering the sender's log up to `upTo`.
    case batch(subscription: String, documents: [WireDocument], upTo: Int64)
    /// `{t:"ack", sub, upTo}`: the receiver durably applied the batch up to `upTo`.
    case ack(subscription: String, upTo: Int64)
    /// `{t:"error", code, msg}`: the sender is closing the session for this reason.
    case error(code: String, message: String)

    /// The protocol version this build speaks.
    public static let protocolVersion = 1

    /// The message as a CBOR-ready value.
    public var encoded: Value {
        switch self {
        case .hello(let h):
            return [
                "t": "hello", "v": .int(Int64(h.version)), "key": .bytes(h.peerKey),
                "site": .int(Int64(bitPattern: h.site)), "epoch": .bytes(h.epoch),
            ]
        case .subscriptions(let subs):
            return [
                "t": "subs",
                "subs": .array(
                    subs.map {
                        [
                            "c": .string($0.spec.collection), "q": .string($0.spec.query), "a": .map($0.spec.args),
                            "since": .int($0.since), "hops": .int(Int64($0.hops)),
                        ]
                    }),
            ]
        case .batch(let sub, let docs, let upTo):
            return [
                "t": "batch", "sub": .string(sub),
                "docs": .array(docs.map { ["c": .string($0.collection), "id": $0.id, "s": .bytes($0.state)] }),
                "upTo": .int(upTo),
            ]
        case .ack(let sub, let upTo):
            return ["t": "ack", "sub": .string(sub), "upTo": .int(upTo)]
        case .error(let code, let message):
            return ["t": "error", "code": .string(code), "msg": .string(message)]
        }
    }

    /// Encodes to CBOR bytes.
    public func serialized() -> [UInt8] { CBOR.encode(encoded) }

    /// Decodes one message from CBOR bytes.
    ///
    /// - Throws: ``WireError`` naming the missing or malformed field; peers are untrusted.
    public init(serialized bytes: [UInt8]) throws(WireError) {
        let value: Value
        do { value = try CBOR.decode(bytes) } catch { throw WireError("not CBOR: \(error)") }
        try self.init(value)
    }

    public init(_ value: Value) throws(WireError) {
        guard case .map(let m) = value else { throw WireError("message is not a map") }
        guard case .string(let type)? = m["t"] else { throw WireError("message has no type") }
        switch type {
        case "hello":
            let key = try m.bytes("key")
            let epoch = try m.bytes("epoch")
            guard key.count == 32 else { throw WireError("hello: 'key' must be 32 bytes, not \(key.count)") }
            guard epoch.count == 16 else { throw WireError("hello: 'epoch' must be 16 bytes, not \(epoch.count)") }
            self = .hello(
                Hello(
                    version: Int(try m.int("v")), peerKey: key, site: SiteID(bitPattern: try m.int("site")),
                    epoch: epoch))
        case "subs":
            guard case .array(let list)? = m["subs"] else { throw WireError("subs: missing 'subs' array") }
            var subs: [WireSubscription] = []
            for item in list {
                guard case .map(let s) = item else { throw WireError("subs: entry is not a map") }
                guard case .map(let args)? = s["a"] ?? .map([:]) else { throw WireError("subs: 'a' is not a map") }
                let hops = try s.int("hops")
                let since = try s.int("since")
                guard hops >= 0, since >= 0 else { throw WireError("subs: negative 'hops' or 'since'") }
                guard !(try s.string("c")).isEmpty else { throw WireError("subs: empty collection name") }
                subs.append(
                    WireSubscription(
                        spec: SubscriptionSpec(collection: try s.string("c"), query: try s.string("q"), args: args),
                        since: since, hops: Int(hops)))
            }
            self = .subscriptions(subs)
        case "batch":
            guard case .array(let list)? = m["docs"] else { throw WireError("batch: missing 'docs' array") }
            var docs: [WireDocument] = []
            docs.reserveCapacity(list.count)
            for item in list {
                guard case .map(let d) = item, let id = d["id"] else { throw WireError("batch: document without 'id'") }
                docs.append(WireDocument(collection: try d.string("c"), id: id, state: try d.bytes("s")))
            }
            self = .batch(subscription: try m.string("sub"), documents: docs, upTo: try m.int("upTo"))
        case "ack":
            self = .ack(subscription: try m.string("sub"), upTo: try m.int("upTo"))
        case "error":
            self = .error(code: try m.string("code"), message: try m.string("msg"))
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

extension UTF8Map where Mapped == TrellisCore.Value {
    fileprivate func int(_ key: String) throws(WireError) -> Int64 {
        guard case .int(let i)? = self[key] else { throw WireError("'\(key)' is missing or not an integer") }
        return i
    }
    fileprivate func string(_ key: String) throws(WireError) -> String {
        guard case .string(let s)? = self[key] else { throw WireError("'\(key)' is missing or not a string") }
        return s
    }
    fileprivate func bytes(_ key: String) throws(WireError) -> [UInt8] {
        guard case .bytes(let b)? = self[key] else { throw WireError("'\(key)' is missing or not bytes") }
        return b
    }
}
