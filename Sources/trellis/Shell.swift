import Foundation
import Trellis
import TrellisStore

/// `trellis shell`: an interactive peer. One command per line; documents in and out as JSON.
final class Shell {
    static let help = """
        Commands (documents are JSON; QUERY uses Ditto's predicate syntax, e.g. Origin == 'Japan'):
          upsert COLLECTION {JSON}        insert or merge a document; prints its _id
          get COLLECTION ID               print one document (ID: a string, or JSON for a map _id)
          find COLLECTION [QUERY]         print matching documents, one JSON per line
          count COLLECTION [QUERY]        print the number of matching documents
          remove COLLECTION ID            remove a document (replicated)
          subscribe COLLECTION [QUERY]    replicate matching documents from peers to this node
          unsubscribe COLLECTION [QUERY]  stop that subscription
          subscriptions                   list this node's subscriptions
          observe COLLECTION [QUERY]      print the result count and changed documents after each change
          unobserve COLLECTION [QUERY]    stop observing
          peers                           list connected peers
          help                            this text
          quit                            leave (also end of input)
        """

    let node: TrellisNode
    let interactive: Bool
    var subscriptions: [String: Subscription] = [:]
    var observers: [String: LiveQuery] = [:]

    init(node: TrellisNode, interactive: Bool) {
        self.node = node
        self.interactive = interactive
    }

    func run() {
        if interactive { print("trellis shell — peer key \(node.peerKeyHex.prefix(16))…; type `help`") }
        while true {
            if interactive {
                print("trellis> ", terminator: "")
                fflush(nil)
            }
            guard let line = readLine() else { break }
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if trimmed.isEmpty || trimmed.hasPrefix("#") { continue }
            if trimmed == "quit" || trimmed == "exit" { break }
            do {
                try execute(trimmed)
            } catch {
                FileHandle.standardError.write(Data("error: \(error)\n".utf8))
            }
            fflush(nil)
        }
        for live in observers.values { live.stop() }
        for subscription in subscriptions.values { subscription.cancel() }
    }

    /// Splits `word rest` once.
    static func head(_ text: Substring) -> (String, Substring) {
        let t = text.drop(while: { $0 == " " })
        guard let space = t.firstIndex(of: " ") else { return (String(t), "") }
        return (String(t[..<space]), t[t.index(after: space)...].drop(while: { $0 == " " }))
    }

    /// An ID argument: JSON when it starts with `{` or `"`, otherwise the text as a string.
    static func parseID(_ text: String) throws -> Value {
        let t = text.trimmingCharacters(in: .whitespaces)
        guard !t.isEmpty else { throw UsageError("missing ID") }
        if t.hasPrefix("{") || t.hasPrefix("\"") { return try JSON.parse(t) }
        return .string(t)
    }

    func execute(_ line: String) throws {
        let (command, rest) = Self.head(Substring(line))
        let (collection, argument) = Self.head(rest)
        func needCollection() throws {
            if collection.isEmpty { throw UsageError("\(command) needs a COLLECTION; type `help`") }
        }
        let query = argument.isEmpty ? "true" : String(argument)
        switch command {
        case "help":
            print(Self.help)
        case "upsert":
            try needCollection()
            guard !argument.isEmpty else { throw UsageError("upsert needs a JSON document") }
            let value = try JSON.parse(String(argument))
            let id = try node.store.collection(collection).upsert(value)
            print(JSON.string(id))
        case "get":
            try needCollection()
            let id = try Self.parseID(String(argument))
            if let doc = try node.store.collection(collection).findByID(id).exec() {
                print(doc.json)
            } else {
                print("null")
            }
        case "find":
            try needCollection()
            for doc in try node.store.collection(collection).find(query).exec() { print(doc.json) }
        case "count":
            try needCollection()
            print(try node.store.collection(collection).find(query).exec().count)
        case "remove":
            try needCollection()
            let id = try Self.parseID(String(argument))
            print(try node.store.collection(collection).findByID(id).remove())
        case "subscribe":
            try needCollection()
            let key = "\(collection) \(query)"
            if subscriptions[key] == nil {
                subscriptions[key] = try node.store.collection(collection).find(query).subscribe()
            }
            print("subscribed: \(key)")
        case "unsubscribe":
            try needCollection()
            let key = "\(collection) \(query)"
            guard let subscription = subscriptions.removeValue(forKey: key) else {
                throw UsageError("no subscription '\(key)'; `subscriptions` lists them")
            }
            subscription.cancel()
            print("unsubscribed: \(key)")
        case "subscriptions":
            for key in subscriptions.keys.sorted() { print(key) }
        case "observe":
            try needCollection()
            let key = "\(collection) \(query)"
            guard observers[key] == nil else { throw UsageError("already observing '\(key)'") }
            let state = ObserveState()
            observers[key] = try node.store.collection(collection).find(query).observeLocal { docs in
                print(state.describe(key: key, docs))
                fflush(nil)
            }
        case "unobserve":
            try needCollection()
            let key = "\(collection) \(query)"
            guard let live = observers.removeValue(forKey: key) else { throw UsageError("not observing '\(key)'") }
            live.stop()
        case "peers":
            let peers = node.peers
            if peers.isEmpty { print("no peers connected") }
            for peer in peers { print(peer.description) }
        default:
            throw UsageError("unknown command '\(command)'; type `help`")
        }
    }
}

/// Remembers the last results of an `observe` to print what changed.
final class ObserveState: @unchecked Sendable {
    // Invariant: used only on the live query's serial delivery queue.
    private var last: [Value: Document]?

    func describe(key: String, _ docs: [Document]) -> String {
        let current = Dictionary(docs.map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
        defer { last = current }
        guard let last else { return "observe \(key): initial, \(docs.count) documents" }
        var lines = ["observe \(key): \(docs.count) documents"]
        for doc in docs where last[doc.id] == nil { lines.append("  inserted \(doc.json)") }
        for doc in docs where last[doc.id] != nil && last[doc.id] != doc { lines.append("  updated \(doc.json)") }
        for (id, _) in last where current[id] == nil { lines.append("  deleted \(JSON.string(id))") }
        return lines.joined(separator: "\n")
    }
}
