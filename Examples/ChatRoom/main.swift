// ChatRoom: a chat room over the Trellis mesh.
//
//   swift run ChatRoom --demo                                   three members in one process
//   swift run ChatRoom --name alice --listen 127.0.0.1:4100     one member per terminal…
//   swift run ChatRoom --name bob --join 127.0.0.1:4100         …joining the first
//
// Every member is a TrellisNode. A message is a document in the `messages` collection; members
// subscribe to the whole collection, so every message reaches every member, also one that was
// offline when it was written. A live query (observeLocal) shows messages as they arrive.
import Foundation
import Synchronization
import Trellis

/// One member of the room: a node, its subscription to the room, and a live query showing it.
final class Member: Sendable {
    let name: String
    let node: TrellisNode
    let messages: TrellisCollection
    private let subscription: Subscription
    private let live: Mutex<LiveQuery?> = Mutex(nil)
    /// The highest `at` this member has seen: its next message gets a later one.
    private let latest = Latest()

    /// The room in conversation order. `at` alone could tie (two members writing in the same
    /// millisecond); `author` and then `_id` (which `sort` always adds last) make the order total,
    /// so every member sorts the same documents the same way.
    var room: PendingCursorOperation { messages.findAll().sort("at").sort("author") }

    init(name: String, directory: URL, meshKey: MeshKey) throws {
        self.name = name
        var options = NodeOptions()
        options.deviceName = name  // shown to peers inside the encrypted handshake
        // options.discovery stays nil: a library node sends no LAN beacons; members find each
        // other through --listen and --join (docs/MESH.md describes discovery).
        node = try TrellisNode(directory: directory, meshKey: meshKey, options: options)
        messages = node.store.collection("messages")
        // Without a subscription a node receives nothing: ask peers for every message.
        subscription = try messages.findAll().subscribe()
    }

    /// Starts showing the room: `show` gets the history, then each message as it arrives (local
    /// or merged from a peer), on the live query's own serial queue.
    func watch(_ show: @escaping @Sendable (Document, _ late: Bool) -> Void) throws {
        let query = try room.observeLocal { [latest] docs, event in
            latest.max(docs.last?["at"]?.intValue ?? 0)  // the results are sorted by `at`
            switch event {
            case .initial:
                for doc in docs { show(doc, false) }
            case .update(let update):
                // `insertions` index the new results. A new message sorting before one shown
                // already was written earlier somewhere and arrived late (its author was offline).
                let inserted = Set(update.insertions)
                for index in update.insertions {
                    show(docs[index], docs.indices[(index + 1)...].contains { !inserted.contains($0) })
                }
            }
        }
        live.withLock { $0 = query }
    }

    /// Sends a message: writes it locally; the mesh delivers it to every member, now or later.
    ///
    /// - Returns: the message's `_id`.
    @discardableResult
    func say(_ text: String) throws -> Value {
        // A hybrid-logical-clock stamp in miniature: the wall clock, but always after every
        // message seen, so a reply sorts after what it answers even when clocks disagree.
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let at = max(now, latest.max(0) + 1)
        latest.max(at)
        // No `_id`: the store gives each message a new UUID, unique across the mesh.
        return try messages.upsert(["author": name, "text": text, "at": at])
    }

    /// The conversation as `author: text` lines, in room order.
    func transcript() throws -> [String] {
        try room.exec().map(Member.line)
    }

    static func line(_ doc: Document) -> String {
        "\(doc["author"]?.stringValue ?? "?"): \(doc["text"]?.stringValue ?? "")"
    }

    func close() {
        live.withLock { $0?.stop() }
        subscription.cancel()
        node.close()
    }
}

/// A number that only goes up, shared by the live query's queue and the sending thread.
final class Latest: Sendable {
    private let value = Mutex<Int64>(0)
    /// Raises the value to at least `candidate`; returns the result.
    @discardableResult
    func max(_ candidate: Int64) -> Int64 {
        value.withLock { value in
            value = Swift.max(value, candidate)
            return value
        }
    }
}

/// Polls `condition` every 10 ms until it holds; throws after `seconds`.
func waitUntil(_ what: String, seconds: Double = 30, _ condition: () throws -> Bool) throws {
    let deadline = Date().addingTimeInterval(seconds)
    while try !condition() {
        guard Date() < deadline else { throw ChatError("timed out waiting until \(what)") }
        usleep(10_000)
    }
}

/// Prints a line at once, also when standard output is a pipe (print would buffer it). A reader
/// that went away (`| head`) is not an error here.
func output(_ line: String) {
    try? FileHandle.standardOutput.write(contentsOf: Data((line + "\n").utf8))
}

struct ChatError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

// MARK: - The demo: three members, one of them offline for a while

func demo() throws -> Bool {
    let base = FileManager.default.temporaryDirectory.appendingPathComponent("trellis-chatroom-\(UUID().uuidString)")
    defer { try? FileManager.default.removeItem(at: base) }
    let key = MeshKey.generate()  // in one process the members share the key in memory
    let members = try ["alice", "bob", "carol"].map {
        try Member(name: $0, directory: base.appendingPathComponent($0), meshKey: key)
    }
    let (alice, bob, carol) = (members[0], members[1], members[2])
    for member in members {
        try member.watch { doc, late in
            output("[\(member.name) sees] \(Member.line(doc))\(late ? "   (written earlier, arrived late)" : "")")
        }
    }
    // A full mesh on loopback: each member listens on a free port; bob dials alice, carol both.
    let loopback = Endpoint(host: "127.0.0.1", port: 0)
    let ports = try members.map { try $0.node.listen(on: loopback) }
    bob.node.connect(to: Endpoint(host: "127.0.0.1", port: ports[0]))
    carol.node.connect(to: Endpoint(host: "127.0.0.1", port: ports[0]))
    carol.node.connect(to: Endpoint(host: "127.0.0.1", port: ports[1]))

    /// `member` says `text`, then the script waits until every member of `audience` has it.
    var sent = 0
    func say(_ member: Member, _ text: String, reaching audience: [Member] = members) throws {
        let id = try member.say(text)
        sent += 1
        for other in audience {
            try waitUntil("\(other.name) has \"\(text)\"") { try other.messages.findByID(id).exec() != nil }
        }
    }
    try say(alice, "hi all, the mesh is up")
    try say(bob, "hello alice")
    try say(carol, "hi both, I'm going into a tunnel")

    func flush() { for member in members { member.node.store.flushLiveQueries() } }  // show what arrived
    flush()
    output("-- carol goes offline (stopSync: no sessions, no listener)")
    carol.node.stopSync()
    try say(alice, "carol went quiet", reaching: [alice, bob])
    try say(bob, "she will catch up: the mesh keeps what she missed", reaching: [alice, bob])
    try say(carol, "writing this in the tunnel", reaching: [carol])

    flush()
    output("-- carol comes back (startSync: listens and dials again)")
    try carol.node.startSync()
    try waitUntil("everyone has \(sent) messages") {
        try members.allSatisfy { try $0.messages.findAll().count() == sent }
    }
    try say(carol, "back: I see what you said while I was away")

    flush()
    var transcripts: [[String]] = []
    for member in members {
        let lines = try member.transcript()
        transcripts.append(lines)
        output("-- \(member.name)'s room (\(lines.count) messages):")
        for line in lines { output("   \(line)") }
    }
    members.forEach { $0.close() }
    let agree = transcripts.allSatisfy { $0 == transcripts[0] } && transcripts[0].count == sent
    output(
        agree
            ? "all \(members.count) members show the same \(sent) messages in the same order"
            : "the members disagree")
    return agree
}

// MARK: - One member per process

/// Reads the room's mesh key, or creates it: every member of a room needs the same key file.
func roomKey(_ file: URL) throws -> MeshKey {
    if FileManager.default.fileExists(atPath: file.path) { return try MeshKey(contentsOf: file) }
    let key = MeshKey.generate()
    try key.write(to: file)  // mode 0600
    output("created the room's mesh key in \(file.path); members on other machines need a copy")
    return key
}

func chat(_ options: [String: [String]]) throws {
    guard let name = options["name"]?.last else { throw ChatError("give a name: --name alice") }
    let tmp = FileManager.default.temporaryDirectory
    let keyFile = URL(fileURLWithPath: options["key"]?.last ?? tmp.appendingPathComponent("trellis-chatroom.key").path)
    // A data directory per member that outlives the process: restart and the history is there,
    // plus whatever was said meanwhile.
    let data =
        options["data"]?.last.map { URL(fileURLWithPath: $0) }
        ?? tmp.appendingPathComponent("trellis-chatroom").appendingPathComponent(name)
    let member = try Member(name: name, directory: data, meshKey: try roomKey(keyFile))
    for address in options["listen"] ?? [] {
        let endpoint = try Endpoint(parsing: address)
        let port = try member.node.listen(on: endpoint)
        output("listening on \(endpoint.host):\(port)")
    }
    for address in options["join"] ?? [] { member.node.connect(to: try Endpoint(parsing: address)) }
    try member.watch { doc, late in
        let time = Date(timeIntervalSince1970: Double(doc["at"]?.intValue ?? 0) / 1000)
        let clock = time.formatted(date: .omitted, time: .standard)
        output("\(clock) \(Member.line(doc))\(late ? "   (written earlier, arrived late)" : "")")
    }
    output("\(name) in the room: type a message and Return; /quit or Ctrl-D leaves")
    while let line = readLine() {
        if line == "/quit" { break }
        if !line.trimmingCharacters(in: .whitespaces).isEmpty { try member.say(line) }
    }
    member.close()
}

/// `--flag value` pairs (repeatable) and bare `--switch`es.
func parse(_ arguments: [String]) throws -> [String: [String]] {
    var options: [String: [String]] = [:]
    var rest = arguments[...]
    while let flag = rest.popFirst() {
        guard flag.hasPrefix("--") else { throw ChatError("unexpected argument '\(flag)'") }
        let name = String(flag.dropFirst(2))
        if name == "demo" || name == "help" {
            options[name, default: []].append("")
        } else if let value = rest.popFirst() {
            options[name, default: []].append(value)
        } else {
            throw ChatError("\(flag) needs a value")
        }
    }
    return options
}

do {
    let options = try parse(Array(CommandLine.arguments.dropFirst()))
    if options["demo"] != nil {
        exit(try demo() ? 0 : 1)
    } else if options["help"] != nil || options["name"] == nil {
        output(
            """
            usage: ChatRoom --demo
                   ChatRoom --name NAME [--listen HOST:PORT]... [--join HOST:PORT]... [--key FILE] [--data DIR]
            """)
    } else {
        try chat(options)
    }
} catch {
    FileHandle.standardError.write(Data("ChatRoom: \(error)\n".utf8))
    exit(1)
}
