/// Who may read and write which collection: per-collection rules per peer key, per named group of
/// peer keys, or for any admitted peer (docs/SECURITY.md, "Authorization").
///
/// The rule that applies to a peer is the most specific one that names it, taken whole: the rule
/// of its peer key if there is one; else the union of the rules of the groups it belongs to (a
/// group without a rule adds nothing); else the rule for any admitted peer; else no access at
/// all. Within a rule, a collection's own entry, else the rule's default. ``open`` (the default of
/// a node) lets every admitted peer read and write everything.
///
/// "Read" means the peer's subscriptions to the collection are served; "write" means what the
/// peer sends of the collection is merged. Both are about the direct peer only: a relay's own
/// rules decide what it takes from the peers it hears from.
public struct Authorization: Sendable, Equatable, CustomStringConvertible {
    /// Read, write, both or neither.
    public struct Access: OptionSet, Sendable, Hashable, CustomStringConvertible {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue & 3 }

        /// The peer's subscriptions to the collection are served.
        public static let read = Access(rawValue: 1)
        /// What the peer sends of the collection is merged.
        public static let write = Access(rawValue: 2)
        public static let none: Access = []
        public static let readWrite: Access = [.read, .write]

        /// `none`, `read`, `write` or `read-write`: how a rules file writes it.
        public var description: String {
            switch rawValue {
            case 1: return "read"
            case 2: return "write"
            case 3: return "read-write"
            default: return "none"
            }
        }

        /// The access a rules file names (``description``), or `nil`.
        public init?(name: String) {
            switch name {
            case "none": self = .none
            case "read": self = .read
            case "write": self = .write
            case "read-write": self = .readWrite
            default: return nil
            }
        }
    }

    /// One principal's access: per collection (names compared byte-wise), and a default for the
    /// collections not named.
    public struct CollectionAccess: Sendable, Equatable {
        /// The access to every collection not in ``collections``.
        public var `default`: Access
        /// The access to these collections.
        public var collections: [UTF8Key: Access]

        public init(default: Access, collections: [UTF8Key: Access] = [:]) {
            self.default = `default`
            self.collections = collections
        }

        /// The access to one collection.
        ///
        /// - Complexity: O(length of the name).
        public func access(to collection: String) -> Access { collections[UTF8Key(collection)] ?? self.default }
    }

    /// Whom a rule is for.
    public enum Principal: Hashable, Sendable, CustomStringConvertible {
        /// One peer key (32 bytes).
        case peer([UInt8])
        /// The peer keys of a group in ``Authorization/groups``.
        case group(String)
        /// Every admitted peer (written `*` in a rules file).
        case anyPeer

        public var description: String {
            switch self {
            case .peer(let key): return Authorization.hex(key)
            case .group(let name): return name
            case .anyPeer: return "*"
            }
        }
    }

    /// Named groups of 32-byte peer keys.
    public var groups: [String: Set<[UInt8]>]
    /// The rules.
    public var rules: [Principal: CollectionAccess]

    /// - Parameters:
    ///   - groups: named groups of 32-byte peer keys.
    ///   - rules: per principal, its access.
    public init(groups: [String: Set<[UInt8]>] = [:], rules: [Principal: CollectionAccess]) {
        self.groups = groups
        self.rules = rules
    }

    /// Every admitted peer may read and write every collection: a node's default.
    public static let open = Authorization(rules: [.anyPeer: CollectionAccess(default: .readWrite)])

    /// Whether every admitted peer may read and write every collection under these rules.
    public var isOpen: Bool {
        guard rules.count == 1, let any = rules[.anyPeer] else { return false }
        return any.default == .readWrite && any.collections.values.allSatisfy { $0 == .readWrite }
    }

    /// What `peerKey` may do with `collection` (the rule that applies is described on the type).
    ///
    /// - Complexity: O(groups × their sizes' hashing) for a peer without a rule of its own.
    public func access(of peerKey: [UInt8], to collection: String) -> Access {
        if let own = rules[.peer(peerKey)] { return own.access(to: collection) }
        var union: Access = []
        var grouped = false
        for (name, members) in groups where members.contains(peerKey) {
            guard let rule = rules[.group(name)] else { continue }
            grouped = true
            union.formUnion(rule.access(to: collection))
        }
        if grouped { return union }
        return rules[.anyPeer]?.access(to: collection) ?? .none
    }

    /// Whether `peerKey`'s subscriptions to `collection` are served.
    public func mayRead(_ peerKey: [UInt8], _ collection: String) -> Bool {
        access(of: peerKey, to: collection).contains(.read)
    }

    /// Whether what `peerKey` sends of `collection` is merged.
    public func mayWrite(_ peerKey: [UInt8], _ collection: String) -> Bool {
        access(of: peerKey, to: collection).contains(.write)
    }

    /// The rules in a rules file's JSON (``init(json:)``), keys sorted: groups first, then rules.
    public var json: String {
        var groupMap = UTF8Map<Value>()
        for (name, keys) in groups {
            groupMap[name] = .array(keys.map { .string(Self.hex($0)) }.sorted { JSON.string($0) < JSON.string($1) })
        }
        var ruleMap = UTF8Map<Value>()
        for (principal, access) in rules {
            var rule: UTF8Map<Value> = ["default": .string(access.default.description)]
            if !access.collections.isEmpty {
                var collections = UTF8Map<Value>()
                for (name, value) in access.collections { collections[name.string] = .string(value.description) }
                rule["collections"] = .map(collections)
            }
            ruleMap[principal.description] = .map(rule)
        }
        return JSON.string(.map(["groups": .map(groupMap), "rules": .map(ruleMap)]))
    }

    /// One line per group and rule, for people (`trellis shell`'s `rules`).
    public var description: String {
        var lines: [String] = []
        for name in groups.keys.sorted(by: { UTF8Key($0) < UTF8Key($1) }) {
            let keys = groups[name]!.map(Self.hex).sorted()
            lines.append("group \(name): \(keys.isEmpty ? "(no keys)" : keys.joined(separator: " "))")
        }
        for principal in rules.keys.sorted(by: { Self.order($0) < Self.order($1) }) {
            let rule = rules[principal]!
            var line = "\(principal == .anyPeer ? "any peer" : "\(principal)"): \(rule.default) by default"
            for name in rule.collections.keys.sorted() { line += ", '\(name.string)' \(rule.collections[name]!)" }
            lines.append(line)
        }
        return lines.joined(separator: "\n")
    }

    private static func order(_ p: Principal) -> (Int, String) {
        switch p {
        case .anyPeer: return (0, "")
        case .group(let name): return (1, name)
        case .peer(let key): return (2, hex(key))
        }
    }

    static func hex(_ key: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        text.reserveCapacity(key.count * 2)
        for byte in key {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 15)])
        }
        return String(decoding: text, as: UTF8.self)
    }

    /// A 32-byte peer key from 64 hex digits (either case), as rules and pins files write keys;
    /// `nil` for anything else.
    public static func peerKey(hex text: String) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard digits.count == 64 else { return nil }
        func value(_ c: UInt8) -> UInt8? {
            switch c {
            case 0x30...0x39: return c - 0x30
            case 0x61...0x66: return c - 0x61 + 10
            case 0x41...0x46: return c - 0x41 + 10
            default: return nil
            }
        }
        var key: [UInt8] = []
        key.reserveCapacity(32)
        for index in stride(from: 0, to: 64, by: 2) {
            guard let high = value(digits[index]), let low = value(digits[index + 1]) else { return nil }
            key.append(high << 4 | low)
        }
        return key
    }
}

// MARK: - Rules file

extension Authorization {
    /// Largest rules file read, bytes.
    public static let maxFileBytes = 1 << 20

    /// Reads a rules file (docs/SECURITY.md, "Authorization"):
    ///
    /// ```json
    /// { "groups": { "family": ["<64 hex digits>", "..."] },
    ///   "rules": { "*":      { "default": "read" },
    ///              "family": { "default": "read-write", "collections": { "audit": "read" } },
    ///              "<64 hex digits>": { "default": "none", "collections": { "notes": "read-write" } } } }
    /// ```
    ///
    /// `groups` is optional; `rules` is required. A rule's key is `*` (any admitted peer), a peer
    /// key (64 hex digits) or a group name (1 to 64 bytes, not `*` and not 64 hex digits, defined
    /// in `groups`). An access is `none`, `read`, `write` or `read-write`; `default` is optional
    /// (`none`). Unknown keys are refused, so a misspelt rule is never silently ignored.
    ///
    /// - Parameter text: the file's content.
    /// - Throws: ``AuthorizationError`` naming where in the file the problem is and what it is.
    /// - Complexity: O(n) in the text's length.
    public init(json text: String) throws(AuthorizationError) {
        let value: Value
        do { value = try JSON.parse(text) } catch { throw AuthorizationError("not JSON: \(error)") }
        guard case .map(let top) = value else { throw AuthorizationError("the file must hold one JSON object") }
        for key in top.keys where key != "groups" && key != "rules" {
            throw AuthorizationError("unknown key \"\(key)\" at the top (expected \"groups\" and \"rules\")")
        }
        var groups: [String: Set<[UInt8]>] = [:]
        if let groupsValue = top["groups"] {
            guard case .map(let map) = groupsValue else {
                throw AuthorizationError("\"groups\" must be an object of group names to arrays of peer keys")
            }
            for (name, members) in map {
                try Self.checkGroupName(name, at: "groups")
                guard case .array(let list) = members else {
                    throw AuthorizationError("groups.\"\(name)\" must be an array of peer keys (64 hex digits each)")
                }
                var keys = Set<[UInt8]>()
                for (index, item) in list.enumerated() {
                    guard case .string(let hex) = item, let key = Self.peerKey(hex: hex) else {
                        throw AuthorizationError(
                            "groups.\"\(name)\"[\(index)] is not a peer key (64 hex digits): \(JSON.string(item))")
                    }
                    keys.insert(key)
                }
                groups[name] = keys
            }
        }
        guard let rulesValue = top["rules"] else {
            throw AuthorizationError(
                "no \"rules\": say who may read and write what (for example \"*\": {\"default\": \"read-write\"})")
        }
        guard case .map(let ruleMap) = rulesValue else {
            throw AuthorizationError("\"rules\" must be an object of principals (*, a peer key or a group) to rules")
        }
        var rules: [Principal: CollectionAccess] = [:]
        for (name, ruleValue) in ruleMap {
            let principal: Principal
            if name == "*" {
                principal = .anyPeer
            } else if let key = Self.peerKey(hex: name) {
                principal = .peer(key)
            } else {
                try Self.checkGroupName(name, at: "rules")
                guard groups[name] != nil else {
                    throw AuthorizationError(
                        "rules.\"\(name)\" names no group defined in \"groups\" (and is not * or a 64-hex-digit peer key)"
                    )
                }
                principal = .group(name)
            }
            guard rules[principal] == nil else {
                throw AuthorizationError("rules.\"\(name)\": the peer key is given twice (in upper and lower case)")
            }
            rules[principal] = try Self.rule(ruleValue, at: "rules.\"\(name)\"")
        }
        self.init(groups: groups, rules: rules)
    }

    private static func rule(_ value: Value, at path: String) throws(AuthorizationError) -> CollectionAccess {
        guard case .map(let map) = value else {
            throw AuthorizationError("\(path) must be an object with \"default\" and \"collections\"")
        }
        for key in map.keys where key != "default" && key != "collections" {
            throw AuthorizationError("unknown key \"\(key)\" in \(path) (expected \"default\" and \"collections\")")
        }
        var rule = CollectionAccess(default: .none)
        if let value = map["default"] { rule.default = try access(value, at: "\(path).default") }
        if let value = map["collections"] {
            guard case .map(let collections) = value else {
                throw AuthorizationError("\(path).collections must be an object of collection names to accesses")
            }
            for (name, access) in collections {
                do { try SubscriptionSpec.validateCollectionName(name) } catch {
                    throw AuthorizationError("\(path).collections: \"\(name)\" is not a collection name: \(error)")
                }
                rule.collections[UTF8Key(name)] = try Self.access(access, at: "\(path).collections.\"\(name)\"")
            }
        }
        return rule
    }

    private static func access(_ value: Value, at path: String) throws(AuthorizationError) -> Access {
        guard case .string(let text) = value, let access = Access(name: text) else {
            throw AuthorizationError(
                "\(path) is \(JSON.string(value)); expected \"none\", \"read\", \"write\" or \"read-write\"")
        }
        return access
    }

    private static func checkGroupName(_ name: String, at path: String) throws(AuthorizationError) {
        guard !name.isEmpty, name.utf8.count <= 64, name != "*", peerKey(hex: name) == nil,
            !name.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F })
        else {
            throw AuthorizationError(
                "\(path): \"\(name)\" cannot name a group (1 to 64 bytes without control characters, not * and not 64 hex digits)"
            )
        }
    }
}

/// A rules file (or rules value) that cannot be used: the message says where and what.
public struct AuthorizationError: Error, Sendable, Equatable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}
