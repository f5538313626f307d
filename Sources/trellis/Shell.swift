import Foundation
import Synchronization
import Trellis
import TrellisStore

/// `trellis shell`: an interactive peer. One command per line; documents in and out as JSON.
final class Shell {
    static let help = """
        Commands (documents are JSON; QUERY uses Ditto's predicate syntax, e.g. Origin == 'Japan';
        PATH is a field path like Name, specs.hp, tags[0] or `odd key`.x; ID is one word, or JSON
        for a map _id or an _id with spaces, operators or quotes ("a b"); a query given where an ID
        goes is an error. SELECT is QUERY [sort PATH [asc|desc]]... [limit N] [offset N]
        [args {JSON}]: the modifiers follow the query (fields named like them still work in the
        query: `find c limit > 3 limit 2`); args gives the values of $args.NAME in the query):
          upsert COLLECTION {JSON} [--strategy S]
                                          insert or update a document; prints its _id. S is merge (the
                                          default), insertIfAbsent, insertDefaultIfAbsent or
                                          updateDifferentValues; with S, then `written` or
                                          `not written: WHY`
          get COLLECTION ID               print one document (null when absent)
          update COLLECTION ID M[; M]...  change one document in one transaction; M is one of
                                            set PATH JSON          set a field (tags[1] sets an element)
                                            set-default PATH JSON  set default data (loses to any write)
                                            unset PATH             remove a field
                                            increment PATH NUMBER  add to a counter
                                          prints one line per change
          update COLLECTION where SELECT M[; M]...
                                          change every selected document in one transaction; prints
                                          their changes (`no changes to ID`), then `N documents changed`
          find COLLECTION [SELECT]        print matching documents, one JSON per line, or
                                          `0 documents` when none matches
          count COLLECTION [SELECT]       print the number of matching documents
          remove COLLECTION ID            remove a document (a tombstone, replicated); prints true/false
          remove COLLECTION where SELECT  remove the selected documents in one transaction; prints
                                          their _ids, then `N documents removed`
          evict COLLECTION ID             drop the local copy only (no tombstone; a matching
                                          subscription brings it back); prints true/false
          evict COLLECTION where SELECT   evict the selected documents; prints their _ids, then
                                          `N documents evicted`
          collections                     list the collections with their number of documents
          index COLLECTION PATH           create an index on a field (served to find/count)
          subscribe COLLECTION [QUERY] [args {JSON}]
                                          replicate matching documents from peers to this node
          unsubscribe COLLECTION [QUERY] [args {JSON}]
                                          stop that subscription
          subscribe-id COLLECTION ID      replicate one document from peers (unsubscribe-id stops it)
          subscriptions                   list this node's subscriptions (by ID: `KEY (by ID)`)
          observe COLLECTION [SELECT]     print each live query event as it arrives, until `unobserve`
                                          or the end of input:
                                            observe KEY: initial N       then `  at I DOC` per result
                                            observe KEY: update N        (N results) then one line per
                                              inserted I DOC | updated I DOC | deleted I OLD-DOC |
                                              moved FROM TO DOC         (I: index; deleted: old index)
                                          KEY is the command's arguments, as typed; an event covering
                                          several commits ends its first line with `(C commits)`
          observe-next COLLECTION [SELECT]
                                          the same with next-signal: after each event, changes wait
                                          (merged into one event) until `next` with the same arguments
          next COLLECTION [SELECT]        let that observer deliver its next event
          unobserve COLLECTION [SELECT]   stop observing (the same arguments as `observe`)
          observe-id COLLECTION ID        print the document's events: `observe-id KEY: initial DOC`,
                                          then `observe-id KEY: update DOC was OLD-DOC` (null: absent)
          observe-next-id COLLECTION ID   the same with next-signal: after each event, changes wait
                                          (merged into one event) until `next-id COLLECTION ID`
          unobserve-id COLLECTION ID      stop observing it
          peers                           list connected peers
          peers --pending                 list connections waiting for a decision (a peer the
                                          admission mode refused, or one the connection-request
                                          handler has not answered): key, name, address, seconds
                                          left before it is denied
          trust KEY|NAME                  admit a peer: a waiting connection of it gets its session;
                                          under --admission allowlist its key is added; under tofu
                                          its name is pinned to this key (re-pinning a name whose
                                          device was reset)
          distrust KEY|NAME               withdraw trust: deny its waiting connections, remove it
                                          from the allowlist or forget its pin (tofu pins the name
                                          again to the next key presenting it), close its sessions
          presence                        the mesh as this node knows it: direct peers, peers
                                          several hops away, incompatible peers
          sync stop | sync start          stop sync (close sessions, stop listening and dialing) or
                                          start it again; `sync` alone prints sync status
          discovered                      list the peers LAN discovery hears (key, address, version)
          status                          this node: identity, clocks, peers, subscriptions, sync
                                          status, links closed by reason (authenticated close,
                                          bare FIN/RST, tampered traffic), inbound handshake
                                          counts, and every document held back (deferred,
                                          damaged) with why
          rules                           print who may read and write which collection (the
                                          --rules file as in force), and what was refused
          rules FILE                      replace the rules with a rules file's, at once: sessions
                                          stay, a revoked read stops being served, a revoked write
                                          stops being asked for
          promote-key                     end a mesh-key changeover: the --next-mesh-key key
                                          becomes current, peers with only the old key are refused
          clear                           clear the screen (at a terminal; Ctrl-L too)
          help                            this text
          quit                            leave (also end of input)
        Errors print one line starting with `error: ` on standard error, and the shell goes on. From a
        pipe or a file, the exit status is then 1 once input ends (as sqlite3's); `trellis shell
        --bail` ends at the first error instead (with status 1, after the events already due), and
        `trellis shell --keep-going` exits 0 whatever failed. At the end of input the events already
        due are printed before the shell exits.
        """

    let node: TrellisNode
    let interactive: Bool
    /// The subscriptions `subscribe` makes: this shell's own, or shared by every client attached
    /// to the node (they outlive the attach that made them).
    let subscriptions: SubscriptionBook
    /// Whether the end of ``run()`` cancels ``subscriptions`` (`trellis shell`: the node ends too).
    let ownsSubscriptions: Bool
    /// Where live query callbacks run (a queue of its own for each attached client, so one that
    /// reads slowly holds up no one else's events).
    let deliveryQueue: DispatchQueue
    /// The first line at a terminal.
    let banner: String
    // Keyed by collection name and query or ID, compared byte-wise: collections "é" and
    // "e" + U+0301 are two collections here as everywhere else.
    var observers = UTF8Map<LiveQuery>()
    /// The pending `signalNext` of each `observe-next` observer (also in `observers`).
    var nextSignals = UTF8Map<NextSignal>()
    var idObservers = UTF8Map<LiveQuery>()
    /// The pending `signalNext` of each `observe-next-id` observer (also in `idObservers`).
    var idNextSignals = UTF8Map<NextSignal>()

    /// The one writer of output (command output, events, errors, the prompt).
    let output: ShellOutput
    /// Whether an error ends the shell (`--bail`, input not a terminal).
    let stopsOnError: Bool
    /// Whether an error makes the exit status 1 (input not a terminal, no `--keep-going`).
    let errorsFail: Bool

    /// - Parameters:
    ///   - interactive: standard input is a terminal: show a prompt; an error never ends the shell
    ///     nor changes its status.
    ///   - keepGoing: from a pipe, exit 0 whatever failed (`--keep-going`).
    ///   - bail: from a pipe, end at the first error (`--bail`).
    ///   - input: where command lines come from (standard input, or an attached client's socket).
    ///   - output: where everything printed goes (standard output and error, or the client).
    ///   - subscriptions: the book `subscribe` keeps subscriptions in (the node's, shared with
    ///     its other shells, or this shell's own).
    ///   - ownsSubscriptions: whether the end of ``run()`` cancels them (`trellis shell`).
    ///   - deliveryQueue: where this shell's live query callbacks run.
    ///   - banner: the first line printed at a terminal (default: `trellis shell`'s).
    ///   - lineEditing: edit lines with ``LineEditor`` (standard input and output are a terminal).
    ///   - historyFile: the line editor's history file (`nil`: none).
    ///   - log: the node's log, whose lines for standard error the line editor shows above the
    ///     line being typed.
    init(
        node: TrellisNode, interactive: Bool, keepGoing: Bool = false, bail: Bool = false,
        input: LineReader = LineReader(fd: 0), output: ShellOutput = ShellOutput(),
        subscriptions: SubscriptionBook = SubscriptionBook(), ownsSubscriptions: Bool = true,
        deliveryQueue: DispatchQueue = LiveQuery.defaultDeliveryQueue,
        banner: String? = nil, lineEditing: Bool = false, historyFile: String? = nil, log: Log? = nil
    ) {
        self.node = node
        self.interactive = interactive
        self.stopsOnError = !interactive && bail
        self.errorsFail = !interactive && !keepGoing
        self.input = input
        self.output = output
        self.subscriptions = subscriptions
        self.ownsSubscriptions = ownsSubscriptions
        self.deliveryQueue = deliveryQueue
        self.banner = banner ?? "trellis shell — peer key \(node.peerKeyHex.prefix(16))…; type `help`"
        self.lineEditing = interactive && lineEditing
        self.historyFile = historyFile
        self.log = log
    }

    private var input: LineReader
    private let lineEditing: Bool
    private let historyFile: String?
    private let log: Log?
    /// Field paths seen in a sample of each collection's documents, for Tab, with when.
    var pathCache: [String: (paths: [String], at: ContinuousClock.Instant)] = [:]
    /// The collections' names, for Tab, with when.
    var collectionCache: (names: [String], at: ContinuousClock.Instant)?

    /// Writes one line of command output.
    func out(_ value: Any) { output.line("\(value)") }

    /// Reads and runs commands until the end of input, `quit`, or (see ``stopsOnError``) the
    /// first error.
    ///
    /// - Returns: the exit status: 1 when a command failed (unless ``errorsFail`` is off), else 0.
    func run() -> Int32 {
        if interactive { out(banner) }
        var editor: LineEditor?
        if lineEditing {
            do {
                editor = try LineEditor(prompt: "trellis> ", historyFile: historyFile, output: output) {
                    [unowned self] in completion(before: $0)
                }
                if isatty(STDERR_FILENO) != 0 { log?.divert { [output] in output.log($0) } }
            } catch {
                report("\(error); reading lines without editing")
            }
        }
        defer { log?.divert(to: nil) }
        var status: Int32 = 0
        reading: while true {
            let line: String
            let next: LineReader.Line?
            if let editor {
                next = editor.readLine().map { .line($0) }
            } else {
                if interactive { output.prompt("trellis> ") }
                next = input.next()
            }
            switch next {
            case nil: break reading
            case .invalid(let number), .tooLong(let number):
                output.beginCommand()  // the line is read: the prompt is no longer on screen
                output.endCommand()
                let problem =
                    if case .invalid = next { "is not valid UTF-8" } else {
                        "is longer than \(LineReader.maxLineBytes) bytes, the longest line the shell takes"
                    }
                report("line \(number) \(problem)" + (stopsOnError ? "" : "; ignored"))
                if errorsFail { status = 1 }
                if stopsOnError { break reading }
                continue
            case .line(let text): line = text
            }
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if trimmed.isEmpty || trimmed.hasPrefix("#") { continue }
            if trimmed == "quit" || trimmed == "exit" { break }
            output.beginCommand()
            var failure: (any Error)?
            do { try execute(trimmed) } catch { failure = error }
            output.endCommand()
            if let failure {
                report("\(failure)")
                if errorsFail { status = 1 }
                if stopsOnError { break reading }
            }
            settleEvents()
        }
        // Events already due are printed before the shell exits.
        settleEvents()
        for live in observers.values { live.stop() }
        for live in idObservers.values { live.stop() }
        if ownsSubscriptions { subscriptions.cancelAll() }
        return status
    }

    /// Waits until the events the commands so far caused are written (when anything is
    /// observed): the next command's output, or the end of the shell, comes after them.
    func settleEvents() {
        guard !observers.isEmpty || !idObservers.isEmpty else { return }
        node.store.flushLiveQueries()
    }

    /// Writes `error: TEXT` on standard error, on one line whatever the text holds.
    func report(_ text: String) {
        output.error(text.split(whereSeparator: \.isNewline).joined(separator: " "))
    }

    /// Splits `word rest` once at a space or tab. Works on UTF-8 bytes, not `Character`s, so a
    /// word ending before a space followed by a combining mark is still split there and kept
    /// byte for byte.
    static func head(_ text: Substring) -> (String, Substring) {
        func blank(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x09 }
        let bytes = text.utf8
        guard let first = bytes.firstIndex(where: { !blank($0) }) else { return ("", "") }
        guard let space = bytes[first...].firstIndex(where: blank) else { return (String(text[first...]), "") }
        let restStart = bytes[space...].firstIndex(where: { !blank($0) }) ?? text.endIndex
        return (String(text[first..<space]), text[restStart...])
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
            out(Self.help)
        case "clear":
            // Home, erase the screen and the scrollback; nothing when output is not a terminal.
            if isatty(STDOUT_FILENO) != 0 { output.raw(Array("\u{1B}[H\u{1B}[2J\u{1B}[3J".utf8)) }
        case "upsert":
            try needCollection()
            let (document, strategy) = try ShellSyntax.upsert(argument)
            let (id, written) = try node.store.documents.upsertReportingWrites(
                [document], in: collection, writeStrategy: strategy)[0]
            out(JSON.string(id) + Self.outcome(of: strategy, written: written))
        case "get":
            try needCollection()
            let id = try ShellSyntax.id(argument, query: "find \(collection) QUERY")
            if let doc = try node.store.collection(collection).findByID(id).exec() {
                out(doc.json)
            } else {
                out("null")
            }
        case "update":
            try needCollection()
            if let selection = Self.whereClause(argument) {
                try updateWhere(collection, selection)
            } else {
                try update(collection, argument)
            }
        case "find", "count":
            try needCollection()
            let operation = try ShellSyntax.find(argument).operation(on: node.store.collection(collection))
            if command == "count" {
                out(try operation.count())
            } else {
                let documents = try operation.exec()
                for doc in documents { out(doc.json) }
                if documents.isEmpty { out("0 documents") }
            }
        case "remove", "evict":
            try needCollection()
            let target = node.store.collection(collection)
            if let selection = Self.whereClause(argument) {
                let operation = try ShellSyntax.find(selection).operation(on: target)
                let ids = command == "remove" ? try operation.remove() : try operation.evict()
                for id in ids { out(JSON.string(id)) }
                out("\(Self.documents(ids.count)) \(command == "remove" ? "removed" : "evicted")")
            } else {
                let id = try ShellSyntax.id(argument, query: "\(command) \(collection) where QUERY")
                out(command == "remove" ? try target.findByID(id).remove() : try target.findByID(id).evict())
            }
        case "collections":
            let collections = try node.store.documents.collectionCounts()
            if collections.isEmpty { out("no collections") }
            for (name, count) in collections { out("\(name): \(Self.documents(count))") }
        case "index":
            try needCollection()
            guard !argument.isEmpty else { throw UsageError("index needs a PATH") }
            let path = String(argument)
            _ = try ShellSyntax.path(argument)
            let name = try node.store.collection(collection).createIndex(path)
            out("index \(name) on \(collection) (\(path))")
        case "subscribe", "unsubscribe":
            try needCollection()
            let find = try ShellSyntax.find(argument)
            guard find.sort.isEmpty, find.limit == nil, find.offset == nil else {
                throw UsageError(
                    "\(command) takes a QUERY and args {JSON}, not sort, limit or offset: a subscription "
                        + "replicates every matching document")
            }
            // Keyed by the query's canonical text: spacing does not make another subscription.
            let args = find.args.isEmpty ? "" : " args \(JSON.string(.map(find.args)))"
            let key = "\(collection) \(try Query(find.query).description)\(args)"
            try subscription(command == "subscribe", key, .query) {
                try find.operation(on: node.store.collection(collection)).subscribe()
            }
        case "subscribe-id", "unsubscribe-id":
            try needCollection()
            let id = try ShellSyntax.id(argument, query: "subscribe \(collection) QUERY")
            let key = "\(collection) \(JSON.string(id))"
            try subscription(command == "subscribe-id", key, .id, suffix: " (by ID)") {
                try node.store.collection(collection).findByID(id).subscribe()
            }
        case "subscriptions":
            // In byte order, those by query first.
            let (byQuery, byID) = subscriptions.keys()
            for key in byQuery { out(key) }
            for key in byID { out("\(key) (by ID)") }
            if byQuery.isEmpty && byID.isEmpty { out("no subscriptions") }
        case "observe", "observe-next":
            try needCollection()
            let key = "\(collection) \(query)"
            guard observers[key] == nil else { throw UsageError("already observing '\(key)'") }
            let operation = try ShellSyntax.find(argument).operation(on: node.store.collection(collection))
            if command == "observe" {
                observers[key] = try operation.observeLocal(deliverOn: deliveryQueue) { [output] docs, event in
                    output.event(Self.describe(command, key: key, docs, event))
                }
            } else {
                let signal = NextSignal()
                observers[key] = try operation.observeLocalWithNextSignal(deliverOn: deliveryQueue) {
                    [output] docs, event, next in
                    signal.hold(next)  // before the event is written: `next` after it finds the signal
                    output.event(Self.describe(command, key: key, docs, event))
                }
                nextSignals[key] = signal
            }
        case "next":
            try needCollection()
            try signalNext("\(collection) \(query)", in: nextSignals, observer: "observe-next")
        case "unobserve":
            try needCollection()
            let key = "\(collection) \(query)"
            guard let live = observers.removeValue(forKey: key) else { throw UsageError("not observing '\(key)'") }
            nextSignals.removeValue(forKey: key)
            live.stop()
            out("unobserved: \(key)")
        case "observe-id", "observe-next-id":
            try needCollection()
            let id = try ShellSyntax.id(argument, query: "observe \(collection) QUERY")
            let key = "\(collection) \(JSON.string(id))"
            guard idObservers[key] == nil else { throw UsageError("already observing '\(key)'") }
            let operation = node.store.collection(collection).findByID(id)
            if command == "observe-id" {
                idObservers[key] = try operation.observeLocal(deliverOn: deliveryQueue) { [output] doc, event in
                    output.event(Self.describe(command, key: key, doc, event))
                }
            } else {
                let signal = NextSignal()
                idObservers[key] = try operation.observeLocalWithNextSignal(deliverOn: deliveryQueue) {
                    [output] doc, event, next in
                    signal.hold(next)
                    output.event(Self.describe(command, key: key, doc, event))
                }
                idNextSignals[key] = signal
            }
        case "next-id":
            try needCollection()
            let key = "\(collection) \(JSON.string(try ShellSyntax.id(argument)))"
            try signalNext(key, in: idNextSignals, observer: "observe-next-id")
        case "unobserve-id":
            try needCollection()
            let id = try ShellSyntax.id(argument)
            let key = "\(collection) \(JSON.string(id))"
            guard let live = idObservers.removeValue(forKey: key) else {
                throw UsageError("not observing '\(key)'")
            }
            idNextSignals.removeValue(forKey: key)
            live.stop()
            out("unobserved: \(key)")
        case "peers" where collection == "--pending":
            let pending = node.pendingConnections
            if pending.isEmpty { out("no connections waiting for a decision") }
            for entry in pending {
                let request = entry.request
                let name = request.deviceName.map { "\"\($0)\"" } ?? "(no name)"
                let who = entry.awaiting == .user ? "waiting for `trust`" : "waiting for the handler"
                out(
                    "\(request.peerKeyHex) \(name) \(request.address) \(request.direction.rawValue), \(who), "
                        + "\(Int(entry.secondsLeft.rounded(.up))) s left")
            }
        case "trust", "distrust":
            let target = String(rest).trimmingCharacters(in: .whitespaces)
            guard !target.isEmpty else { throw UsageError("\(command) needs a peer KEY (64 hex digits) or NAME") }
            let key = TrellisNode.peerKey(hex: target)
            switch (command, key) {
            case ("trust", let key?): out(try node.trust(peerKey: key))
            case ("trust", nil): out(try node.trust(name: target))
            case (_, let key?): out(try node.distrust(peerKey: key))
            case (_, nil): out(try node.distrust(name: target))
            }
        case "peers":
            guard collection.isEmpty else {
                throw UsageError("peers takes `--pending` or nothing, not '\(collection)'")
            }
            let peers = node.peers
            if peers.isEmpty { out("no peers connected") }
            for peer in peers { out(peer.description) }
        case "presence":
            out(node.presence.graph.description)
        case "sync":
            switch collection {
            case "": out(node.sync.status.description)
            case "stop":
                node.stopSync()
                out("sync stopped")
            case "start":
                try node.startSync()
                out("sync started")
            default: throw UsageError("sync takes `stop`, `start` or nothing, not '\(collection)'")
            }
        case "discovered":
            let found = node.discoveredPeers
            if node.discoveryStatistics == nil {
                out("discovery is off")
            } else if found.isEmpty {
                out("no peers discovered")
            }
            for peer in found {
                let place = peer.endpoint ?? "\(peer.addresses.joined(separator: ", ")) (not listening)"
                let version = peer.isCompatible ? "" : ", incompatible: protocol version \(peer.protocolVersion)"
                out("\(peer.keyHex.prefix(16)) \(place)\(version)")
            }
        case "status":
            out(try node.status().description)
        case "rules":
            let file = String(rest).trimmingCharacters(in: .whitespaces)
            if !file.isEmpty {
                node.setAuthorization(try Authorization(contentsOf: URL(fileURLWithPath: file)))
                out("rules replaced from \(file)")
            }
            let rules = node.authorization
            out(rules.isOpen ? "every admitted peer may read and write every collection" : rules.description)
            let refused = node.authorizationRefusals
            out(
                "refused: \(refused.subscriptions) subscription(s), \(refused.batches) batch(es) "
                    + "(\(refused.documents) document(s)), \(refused.sites) session(s) presenting another key's site ID"
            )
        case "promote-key":
            guard node.promoteNextMeshKey() else {
                throw UsageError("no next mesh key to promote: start the node with --next-mesh-key FILE")
            }
            out("the next mesh key is now the current one; peers holding only the old key are refused")
        default:
            throw UsageError("unknown command '\(command)'; type `help`")
        }
    }
}

extension Shell {
    /// `update COLLECTION ID M[; M]...`: the ID is the first chunk (JSON for a map or a string
    /// with spaces), then mutations separated by `;`.
    func update(_ collection: String, _ argument: Substring) throws {
        let chunks = try ShellSyntax.chunks(argument)
        guard let idChunk = chunks.first else { throw UsageError("update needs an ID and a mutation") }
        let selectByQuery = "update \(collection) where QUERY set PATH JSON"
        if chunks.count > 1, ShellSyntax.looksLikeOperator(chunks[1].text) {
            // `update c o == 'J' set x 1`: a query where the ID goes; refuse it as an ID.
            let end =
                chunks.first { ShellSyntax.mutationVerbs.contains($0.text) }?.range.lowerBound ?? argument.endIndex
            _ = try ShellSyntax.id(argument[..<end], query: selectByQuery)
        }
        let id = try ShellSyntax.id(idChunk.text, query: selectByQuery)
        let rest = argument[idChunk.range.upperBound...]
        let statements = try ShellSyntax.splitStatements(rest)
            .filter { !$0.allSatisfy(\.isWhitespace) }
        guard !statements.isEmpty else {
            throw UsageError(
                "update needs a mutation: set PATH JSON, set-default PATH JSON, unset PATH or increment PATH NUMBER")
        }
        let mutations = try statements.map(ShellSyntax.mutation)
        let operation = node.store.collection(collection).findByID(id)
        var found = false
        let results = try operation.update { doc in
            guard let doc else { return }
            found = true
            doc.apply(mutations)
        }
        if !found { throw UsageError("no document \(JSON.string(id)) in \(collection)") }
        if results.isEmpty { out("no changes") }
        for result in results { out(result) }
    }

    /// `update COLLECTION where QUERY [modifiers] M[; M]...`: the mutations applied to every
    /// selected document in one transaction. Prints each document's results (`no changes to ID`
    /// when it has none), then how many documents changed.
    func updateWhere(_ collection: String, _ selection: Substring) throws {
        let (find, mutations) = try ShellSyntax.updateWhere(selection)
        var order: [Value] = []
        let results = try find.operation(on: node.store.collection(collection)).update { docs in
            for doc in docs {
                order.append(doc.id)
                doc.apply(mutations)
            }
        }
        for id in order {
            guard let changes = results[id] else { continue }
            if changes.isEmpty { out("no changes to \(JSON.string(id))") }
            for change in changes { out(change) }
        }
        out("\(Self.documents(results.values.filter { !$0.isEmpty }.count)) changed")
    }

    /// `subscribe` (when `subscribe`) or `unsubscribe` of `key` in the book's table `kind` (by
    /// query or by ID; `suffix` follows the key in what is printed). Subscribing twice keeps the
    /// first.
    func subscription(
        _ subscribe: Bool, _ key: String, _ kind: SubscriptionBook.Kind, suffix: String = "",
        make: () throws -> Subscription
    ) throws {
        if subscribe {
            try subscriptions.add(key, kind, make: make)
            out("subscribed: \(key)\(suffix)")
        } else {
            guard let subscription = subscriptions.remove(key, kind) else {
                throw UsageError("no subscription '\(key)'\(suffix); `subscriptions` lists them")
            }
            subscription.cancel()
            out("unsubscribed: \(key)\(suffix)")
        }
    }

    /// `next` / `next-id`: lets the next-signal observer of `key` in `table` (started by the
    /// command `observer`) deliver its next event.
    func signalNext(_ key: String, in table: UTF8Map<NextSignal>, observer: String) throws {
        guard let signal = table[key] else { throw UsageError("not observing '\(key)' with \(observer)") }
        if !signal.fire() { out("\(observer) \(key): already waiting for the next change") }
    }

    /// The selection after `where` in `remove`, `evict` and `update` (`nil`: no `where`, an ID).
    static func whereClause(_ argument: Substring) -> Substring? {
        let (word, rest) = head(argument)
        return word == "where" ? rest : nil
    }

    /// `1 document`, `N documents`.
    static func documents(_ count: Int) -> String { count == 1 ? "1 document" : "\(count) documents" }

    /// What `upsert` prints after the `_id`: nothing for `merge` (it always writes), else whether
    /// the strategy wrote and, when not, why.
    static func outcome(of strategy: WriteStrategy, written: Bool) -> String {
        if strategy == .merge { return "" }
        if written { return " written" }
        switch strategy {
        case .insertIfAbsent: return " not written: a document with this _id exists"
        case .insertDefaultIfAbsent: return " not written: this _id is known here"
        default: return " not written: no value differs"
        }
    }
}

/// The subscriptions shell commands made, by key (collection and canonical query, or collection
/// and JSON `_id`), compared byte-wise and listed in byte order. One book serves `trellis shell`;
/// in a running node one book is shared by `--subscribe` and every attached client, from their
/// threads.
final class SubscriptionBook: Sendable {
    enum Kind: Sendable {
        case query
        case id
    }

    private let tables = Mutex<(query: UTF8Map<Subscription>, id: UTF8Map<Subscription>)>((.init(), .init()))

    /// Keeps the subscription `make` returns under `key`, unless one is kept there already.
    func add(_ key: String, _ kind: Kind, make: () throws -> Subscription) throws {
        try tables.withLock { t in
            switch kind {
            case .query: if t.query[key] == nil { t.query[key] = try make() }
            case .id: if t.id[key] == nil { t.id[key] = try make() }
            }
        }
    }

    /// Takes the subscription under `key` out of the book (`nil`: none); the caller cancels it.
    func remove(_ key: String, _ kind: Kind) -> Subscription? {
        tables.withLock { t in
            kind == .query ? t.query.removeValue(forKey: key) : t.id.removeValue(forKey: key)
        }
    }

    /// The keys, by query and by ID, each in byte order.
    func keys() -> (query: [String], id: [String]) {
        tables.withLock { t in (Array(t.query.keys), Array(t.id.keys)) }
    }

    /// Cancels every subscription and empties the book.
    func cancelAll() {
        let all = tables.withLock { t in
            defer { t = (.init(), .init()) }
            return Array(t.query.values) + Array(t.id.values)
        }
        for subscription in all { subscription.cancel() }
    }
}

/// The `signalNext` an `observe-next` observer was handed with its last event, until `next`
/// calls it.
final class NextSignal: Sendable {
    private let pending = Mutex<(@Sendable () -> Void)?>(nil)

    func hold(_ signal: @escaping @Sendable () -> Void) { pending.withLock { $0 = signal } }

    /// Calls the held signal. - Returns: `false` when none was held (the observer already waits
    /// for the next change).
    func fire() -> Bool {
        guard
            let signal = pending.withLock({ s in
                defer { s = nil }
                return s
            })
        else { return false }
        signal()
        return true
    }
}

extension MutableDocument {
    /// Records the shell's mutations on this document.
    func apply(_ mutations: [DocumentMutation]) {
        for mutation in mutations {
            switch mutation {
            case .set(let path, let value, let isDefault): at(path).set(value, isDefault: isDefault)
            case .unset(let path): at(path).remove()
            case .increment(let path, let amount): at(path).increment(by: amount)
            }
        }
    }
}

extension MutableDocument {
    /// The path inside this document.
    func at(_ path: FieldPath) -> MutableDocumentPath {
        guard case .key(let first)? = path.components.first else { return self[""] }
        var target = self[first]
        for component in path.components.dropFirst() {
            switch component {
            case .key(let key): target = target[key]
            case .index(let index): target = target[index]
            }
        }
        return target
    }
}

extension Shell {
    /// The line `observe-id` (or `observe-next-id`: `command`) prints for one event (see `help`).
    static func describe(_ command: String, key: String, _ doc: Document?, _ event: SingleDocumentLiveQueryEvent)
        -> String
    {
        let text = doc?.json ?? "null"
        if event.isInitial { return "\(command) \(key): initial \(text)" }
        let commits = event.commitCount > 1 ? " (\(event.commitCount) commits)" : ""
        return "\(command) \(key): update \(text) was \(event.oldDocument?.json ?? "null")\(commits)"
    }

    /// The lines `observe` (or `observe-next`: `command`) prints for one event (see `help`).
    static func describe(_ command: String, key: String, _ docs: [Document], _ event: LiveQueryEvent) -> String {
        guard case .update(let update) = event else {
            return (["\(command) \(key): initial \(docs.count)"] + docs.enumerated().map { "  at \($0) \($1.json)" })
                .joined(separator: "\n")
        }
        let commits = update.commitCount > 1 ? " (\(update.commitCount) commits)" : ""
        var lines = ["\(command) \(key): update \(docs.count)\(commits)"]
        for index in update.insertions { lines.append("  inserted \(index) \(docs[index].json)") }
        for index in update.updates { lines.append("  updated \(index) \(docs[index].json)") }
        for index in update.deletions { lines.append("  deleted \(index) \(update.oldDocuments[index].json)") }
        for move in update.moves { lines.append("  moved \(move.from) \(move.to) \(docs[move.to].json)") }
        return lines.joined(separator: "\n")
    }
}

/// Reads lines from a file descriptor as bytes, so invalid UTF-8 is reported rather than
/// silently replaced (as `readLine()` does). Lines end with `\n`, optionally preceded by `\r`.
///
/// A line longer than ``maxLineBytes`` is refused as soon as that many bytes are read without a
/// newline: it is reported once (``Line/tooLong(number:)``) and the rest of it is read and
/// discarded without being held, so memory stays bounded whatever the input.
///
/// - Complexity: O(*n*) in the bytes read: each byte is scanned for a newline once, and the
///   unread rest of the buffer is moved to its front only when more must be read.
struct LineReader {
    enum Line {
        case line(String)
        case invalid(number: Int)
        /// The line is longer than ``LineReader/maxLineBytes``; it is skipped.
        case tooLong(number: Int)
    }

    /// The longest line the shell takes, in bytes without the line end: 16 MiB, three times the
    /// largest document a store holds (``StoreOptions/maxDocumentBytes``, 5 MiB), leaving room
    /// for JSON escapes and spacing.
    static let maxLineBytes = 16 << 20

    let fd: Int32
    private var chunk = [UInt8](repeating: 0, count: 65_536)
    private var buffer: [UInt8] = []
    /// The first byte of `buffer` not yet returned.
    private var start = 0
    /// Where the search for the next newline goes on: the bytes from `start` before it hold none.
    private var scanned = 0
    private var eof = false
    /// Whether the rest of a line too long is being discarded.
    private var skipping = false
    private var number = 0

    init(fd: Int32) { self.fd = fd }

    mutating func next() -> Line? {
        while true {
            if let newline = Self.newline(in: buffer, from: scanned) {
                let lineStart = start
                start = newline + 1
                scanned = start
                if skipping {
                    skipping = false
                    continue
                }
                number += 1
                var end = newline
                if end > lineStart && buffer[end - 1] == 0x0D { end -= 1 }
                guard end - lineStart <= Self.maxLineBytes else { return .tooLong(number: number) }
                return decode(buffer[lineStart..<end])
            }
            scanned = buffer.count
            if skipping || buffer.count - start > Self.maxLineBytes {
                // Nothing before the end of the buffer is kept: the line is refused.
                buffer.removeAll(keepingCapacity: true)
                (start, scanned) = (0, 0)
                if !skipping {
                    skipping = true
                    number += 1
                    return .tooLong(number: number)
                }
            }
            if eof {
                guard start < buffer.count, !skipping else { return nil }
                number += 1
                defer { (buffer, start, scanned) = ([], 0, 0) }
                return decode(buffer[start...])
            }
            if start > 0 {
                buffer.removeSubrange(..<start)
                (scanned, start) = (scanned - start, 0)
            }
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else {
                eof = true
                continue
            }
            chunk.withUnsafeBufferPointer { buffer.append(contentsOf: UnsafeBufferPointer(rebasing: $0[..<n])) }
        }
    }

    /// The index of the first `\n` in `bytes` at or after `from` (`memchr`: fast in any build).
    private static func newline(in bytes: [UInt8], from: Int) -> Int? {
        guard from < bytes.count else { return nil }
        return bytes.withUnsafeBufferPointer { all in
            memchr(all.baseAddress! + from, 0x0A, all.count - from).map {
                all.baseAddress!.distance(to: $0.assumingMemoryBound(to: UInt8.self))
            }
        }
    }

    private func decode(_ bytes: ArraySlice<UInt8>) -> Line {
        guard let text = String(validating: bytes, as: UTF8.self) else { return .invalid(number: number) }
        return .line(text)
    }
}
