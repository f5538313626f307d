import Foundation
import Trellis
import TrellisNet
import TrellisStore
import TrellisSync

enum NodeCommand {
    static let help = """
        trellis node  — run a headless node in the foreground, until Ctrl-C (SIGINT) or SIGTERM
                        (then it closes its sessions and store and exits 0)
        trellis shell — run an interactive node; one command per line (from a terminal or a pipe)
        While either runs, `trellis attach`, `trellis status` and `trellis import` reach it through
        its control socket DIR/control.sock (mode 0600, this user only; removed at exit).

        Flags:
          --data DIR            the node's data directory (created if missing)
          --listen HOST:PORT    accept peers here (default with discovery: port 4040 on every
                                address, or a free port when 4040 is taken; without discovery:
                                not listening)
          --peer HOST:PORT      keep a connection to this peer (repeatable)
          --no-discovery        do not find peers on the LAN (only --peer and inbound connections)
          --discovery-port PORT the UDP port for discovery beacons (default 4041)
          --discovery-loopback  send and receive beacons on loopback only (127.255.255.255):
                                nodes on this host find each other, nothing reaches the LAN;
                                listens on 127.0.0.1 by default
          --max-peers N         at most N sessions at once (default 64); beyond, new peers are
                                refused as busy, --peer ones excepted, and discovered peers
                                subscribing to the same collections are dialed first
          --inbound-buffer MIB  the MiB of inbound messages all sessions may hold at once
                                (default 256); beyond, the session holding the most is closed
          --priority CLASS      the scheduling class of replication work (merges, scans, links):
                                `background` (the default: nice 10, so other work on the
                                machine goes first and a busy machine slows replication down),
                                `utility` (nice 2) or `default` (nice 0, as the node's commands)
          --mesh-key FILE       the mesh key file (`trellis keygen FILE`)
          --next-mesh-key FILE  during a mesh-key changeover, the next key: peers holding either
                                key are accepted, and a peer refusing the current key is tried
                                with this one (shell: `promote-key` makes it current)
          --admission MODE      which peers holding the mesh key get a session: `any` (the
                                default), `allowlist` (only --allow-peer keys and those `trust`ed
                                in the shell) or `tofu` (trust on first use: a peer's key is pinned
                                to its device name the first time it is seen, in DIR/known-peers;
                                the same name with another key is refused)
          --allow-peer KEY      admit this peer key (64 hex digits, repeatable; the key a node
                                prints at start); implies --admission allowlist
          --name NAME           the device name advertised to peers inside the encrypted
                                handshake, which --admission tofu pins (1 to 64 bytes; default:
                                the host name)
          --rules FILE          who may read and write which collection: a JSON file of groups of
                                peer keys and per-collection rules (docs/SECURITY.md,
                                "Authorization"); default: every admitted peer reads and writes
                                everything. The shell's `rules` prints them, `rules FILE` replaces
                                them
          --subscribe 'COLLECTION [QUERY]'
                                subscribe at start (repeatable; node only, the shell has `subscribe`)
          --log-level LEVEL     error, warn, info (the default) or debug: what is logged. Each
                                line is `TIME LEVEL [NAME] MESSAGE`, TIME in ISO 8601 UTC
          --log-file FILE       append log lines to FILE instead of standard error
          --quiet               --log-level error: log no session events
          --keep-going          shell only: when standard input is not a terminal, exit 0 whatever
                                failed (by default a failed command makes the exit status 1)
          --bail                shell only: when standard input is not a terminal, end at the
                                first error (with exit status 1)
          --no-history          shell only: keep no history file (also TRELLIS_HISTORY=''). At a
                                terminal the shell edits lines (arrows, Ctrl-R searches the
                                history, Tab completes commands, collections and field paths)
                                and keeps their history in $TRELLIS_HISTORY, else
                                $XDG_STATE_HOME/trellis/history, else
                                ~/.local/state/trellis/history (1000 lines)
        """

    static func run(_ args: [String], interactive: Bool) throws {
        let parsed = try Arguments(
            args,
            valueFlags: [
                "data", "listen", "peer", "mesh-key", "next-mesh-key", "subscribe", "discovery-port", "max-peers",
                "inbound-buffer", "allow-peer", "admission", "name", "rules", "log-level", "log-file", "priority",
            ],
            switchFlags: ["quiet", "no-discovery", "discovery-loopback", "keep-going", "bail", "no-history"])
        if parsed.switches.contains("help") {
            print(help)
            return
        }
        guard parsed.positional.isEmpty else {
            throw UsageError(
                "unexpected argument '\(parsed.positional[0])'; see `trellis \(interactive ? "shell" : "node") --help`")
        }
        for flag in ["keep-going", "bail", "no-history"] where !interactive && parsed.switches.contains(flag) {
            throw UsageError("--\(flag) is for `trellis shell`")
        }
        if parsed.switches.contains("keep-going"), parsed.switches.contains("bail") {
            throw UsageError("--keep-going and --bail contradict each other: give one")
        }
        let data = try parsed.require("data")
        let meshKey = try MeshKey(contentsOf: URL(fileURLWithPath: try parsed.require("mesh-key")))
        let listen = try parsed.value("listen").map { try Endpoint(parsing: $0) }
        let peers = try parsed.all("peer").map { try Endpoint(parsing: $0) }
        let subscriptions = try parsed.all("subscribe").map { try parseSubscription($0) }
        let discovery = try discoveryOptions(parsed)
        for (_, query) in subscriptions {
            do { _ = try Query(query) } catch { throw UsageError("--subscribe query: \(error)") }
        }

        var options = NodeOptions()
        options.nextMeshKey = try parsed.value("next-mesh-key").map {
            try MeshKey(contentsOf: URL(fileURLWithPath: $0))
        }
        let allowed = try parsed.all("allow-peer").map { text -> [UInt8] in
            guard let key = TrellisNode.peerKey(hex: text) else {
                throw UsageError("--allow-peer needs a peer key of 64 hex digits, not '\(text)'")
            }
            return key
        }
        options.admission = try admission(parsed.value("admission"), allowed: allowed)
        options.deviceName = try deviceName(parsed.value("name"))
        if let file = parsed.value("rules") {
            do { options.authorization = try Authorization(contentsOf: URL(fileURLWithPath: file)) } catch {
                throw UsageError("--rules: \(error)")
            }
        }
        // In the shell a refused peer waits as pending, so the user can `trust` it.
        options.admissionPolicy.parkRefused = interactive
        if interactive { options.admissionPolicy.decisionTimeout = .seconds(10) }
        if let text = parsed.value("max-peers") {
            guard let n = Int(text), n >= 1, n <= 100_000 else {
                throw UsageError("--max-peers needs a number from 1 to 100000, not '\(text)'")
            }
            options.maxSessions = n
        }
        if let text = parsed.value("priority") {
            let classes: [String: DispatchQoS] = ["background": .background, "utility": .utility, "default": .default]
            guard let qos = classes[text] else {
                throw UsageError("--priority takes background, utility or default, not '\(text)'")
            }
            options.replicationQoS = qos
        }
        if let text = parsed.value("inbound-buffer") {
            guard let n = Int(text), n >= 1, n <= 1_048_576 else {
                throw UsageError("--inbound-buffer needs a number of MiB from 1 to 1048576, not '\(text)'")
            }
            options.inboundBufferBytes = n << 20
        }
        if parsed.switches.contains("quiet"), parsed.value("log-level") != nil {
            throw UsageError("--quiet is --log-level error; give one of them")
        }
        let level =
            try parsed.switches.contains("quiet") ? .error : parsed.value("log-level").map(LogLevel.init) ?? .info
        let log = try Log(
            level: level, name: URL(fileURLWithPath: data).lastPathComponent, file: parsed.value("log-file"))
        options.log = { message in log(LogLevel.of(libraryMessage: message), message) }
        options.store.log = { message in log(.warn, message) }
        let node = try TrellisNode(directory: URL(fileURLWithPath: data), meshKey: meshKey, options: options)
        // One book of subscriptions for `--subscribe`, the shell and every attached client.
        let book = SubscriptionBook()
        for (collection, query) in subscriptions {
            try book.add("\(collection) \(try Query(query).description)", .query) {
                try node.store.collection(collection).find(query).subscribe()
            }
        }
        // Without its control socket the node still runs; only attach, status and import cannot reach it.
        let control: ControlServer?
        do {
            control = try ControlServer(directory: data, node: node, subscriptions: book)
        } catch {
            control = nil
            log(.warn, "no control socket, so `trellis attach`, `status` and `import` cannot reach this node: \(error)")
        }
        if let listen {
            let port = try node.listen(on: listen)
            log(.info, "listening on \(Endpoint(host: listen.host, port: port)), peer key \(node.peerKeyHex)")
        } else if let discovery {
            // Discovered peers must be able to dial this node: listen on the default port, or on
            // a free one when it is taken (beacons carry the real port).
            let host = discovery.scope == .loopback ? "127.0.0.1" : "::"
            var bound: (Endpoint, UInt16)?
            for candidate in [Endpoint(host: host, port: 4040), Endpoint(host: host, port: 0)]
                + (host == "::" ? [Endpoint(host: "0.0.0.0", port: 4040), Endpoint(host: "0.0.0.0", port: 0)] : [])
            {
                if let port = try? node.listen(on: candidate) {
                    bound = (candidate, port)
                    break
                }
            }
            guard let (endpoint, port) = bound else {
                throw UsageError("cannot listen on TCP port 4040 or any free port")
            }
            log(.info, "listening on \(Endpoint(host: endpoint.host, port: port)), peer key \(node.peerKeyHex)")
        }
        if let discovery { try node.startDiscovery(discovery) }
        for peer in peers { node.connect(to: peer) }

        // However the node or shell ends: the control socket is removed, then the node closed.
        let stop: @Sendable () -> Void = {
            control?.stop()
            node.close()
        }
        if interactive {
            // SIGTERM (`kill`, a supervisor) stops the shell as the end of its input does. The
            // status is 143, what a calling shell reports for a process ended by SIGTERM (128 + 15).
            Signals.onTermination(of: [SIGTERM]) {
                log(.info, "stopping (SIGTERM)")
                stop()
                exit(143)
            }
            let status = Shell(
                node: node, interactive: isatty(0) != 0, keepGoing: parsed.switches.contains("keep-going"),
                bail: parsed.switches.contains("bail"), subscriptions: book, lineEditing: isatty(1) != 0,
                historyFile: LineEditor.historyFile(
                    environment: ProcessInfo.processInfo.environment, disabled: parsed.switches.contains("no-history")),
                log: log
            ).run()
            stop()
            if status != 0 { exit(status) }
            return
        }
        // Headless: run until SIGINT or SIGTERM.
        if listen == nil && discovery == nil && peers.isEmpty {
            log(
                .warn,
                "running in the foreground with no listener and no peer: nothing can connect to this node "
                    + "and it dials no one (give --listen HOST:PORT or --peer HOST:PORT), so it only keeps "
                    + "\(data); stop it with Ctrl-C or SIGTERM")
        } else {
            let dialing = peers.isEmpty ? "" : ", dialing \(peers.count) peer\(peers.count == 1 ? "" : "s")"
            log(
                .info,
                "running in the foreground on \(data)\(dialing), discovery \(discovery == nil ? "off" : "on"); "
                    + "stop it with Ctrl-C or SIGTERM")
        }
        let done = DispatchSemaphore(value: 0)
        Signals.onTermination { done.signal() }
        done.wait()
        log(.info, "stopping")
        stop()
    }

    /// `--admission MODE` and the `--allow-peer` keys → the admission mode.
    static func admission(_ text: String?, allowed: [[UInt8]]) throws -> AdmissionMode {
        switch text {
        case nil: return allowed.isEmpty ? .meshKey : .allowlist(Set(allowed))
        case "allowlist": return .allowlist(Set(allowed))
        case "any", "tofu":
            guard allowed.isEmpty else {
                throw UsageError("--allow-peer makes an allowlist; it cannot be combined with --admission \(text!)")
            }
            return text == "any" ? .meshKey : .trustOnFirstUse
        case let other?:
            throw UsageError("--admission takes any, allowlist or tofu, not '\(other)'")
        }
    }

    /// `--name NAME`, or the host name when it is a valid device name.
    static func deviceName(_ text: String?) throws -> String? {
        guard let text else {
            let host = ProcessInfo.processInfo.hostName
            return (try? DeviceName.check(host)) != nil ? host : nil
        }
        do { try DeviceName.check(text) } catch { throw UsageError("--name: \(error)") }
        return text
    }

    /// `--no-discovery`, `--discovery-port`, `--discovery-loopback` → the node's discovery options.
    static func discoveryOptions(_ parsed: Arguments) throws -> DiscoveryOptions? {
        let port = try parsed.value("discovery-port").map { text in
            guard let port = UInt16(text), port > 0 else {
                throw UsageError("--discovery-port needs a port from 1 to 65535, not '\(text)'")
            }
            return port
        }
        if parsed.switches.contains("no-discovery") {
            if port != nil || parsed.switches.contains("discovery-loopback") {
                throw UsageError("--no-discovery cannot be combined with --discovery-port or --discovery-loopback")
            }
            return nil
        }
        var options = DiscoveryOptions()
        if let port { options.port = port }
        if parsed.switches.contains("discovery-loopback") { options.scope = .loopback }
        return options
    }

    /// `COLLECTION [QUERY]` → (collection, query).
    static func parseSubscription(_ text: String) throws -> (String, String) {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        guard !trimmed.isEmpty else { throw UsageError("--subscribe needs 'COLLECTION [QUERY]'") }
        let parts = trimmed.split(separator: " ", maxSplits: 1)
        return (String(parts[0]), parts.count > 1 ? String(parts[1]) : "true")
    }
}

enum ImportCommand {
    static let help = """
        trellis import --data DIR COLLECTION FILE [--all-or-nothing]
          Upserts every document of FILE (a JSON array of objects, or JSON lines) into COLLECTION,
          in one transaction. A bad record (JSON that does not parse, not an object, a bad `_id`,
          a value the store cannot hold, too large) is skipped: each is named on standard error
          (`trellis: skipped FILE line 3: …`, or `element 2 (line 5)` in an array), the others are
          imported, and the command ends with the count skipped and exit status 1.
          --all-or-nothing imports nothing when any record is bad (the first is named; exit
          status 1). A file that cannot be read on (an array not closed, a record above 64 MiB)
          imports nothing either way. Documents without `_id` get a new UUID. The file is
          streamed: memory does not grow with its size. On a terminal, a progress line is shown
          on standard error.
          While a node runs on DIR (`trellis node` or `trellis shell`), the import goes through
          it (its control socket): this command reads FILE and sends it, the node imports it,
          with the same messages and exit status. Once FILE is sent, the node finishes the
          import even if this command is interrupted.
        """

    static func run(_ args: [String]) throws {
        let parsed = try Arguments(args, valueFlags: ["data"], switchFlags: ["all-or-nothing"])
        if parsed.switches.contains("help") {
            print(help)
            return
        }
        guard parsed.positional.count == 2 else {
            throw UsageError("usage: trellis import --data DIR COLLECTION FILE [--all-or-nothing]")
        }
        let data = try parsed.require("data")
        let allOrNothing = parsed.switches.contains("all-or-nothing")
        let (collection, file) = (parsed.positional[0], parsed.positional[1])
        // A node running on DIR holds the store: the import goes through it.
        if let connection = try ControlClient.connect(data, ifRunning: true) {
            let status = try connection.importFile(file, into: collection, allOrNothing: allOrNothing)
            exit(status)
        }
        let reader = try DocumentFileReader(path: file)
        try Files.makeDirectory(data)
        let lock = try DataDirectoryLock(directory: data)
        defer { withExtendedLifetime(lock) {} }
        let store = try DocumentStore(path: URL(fileURLWithPath: data).appendingPathComponent("store.sqlite").path)
        let progress = ProgressLine(total: reader.size)
        let documents = DocumentReadAhead(reader, preparingUpserts: true)
        try perform(
            into: store, collection: collection, reader: documents, file: file, allOrNothing: allOrNothing,
            print: { print($0) },
            skipped: { text in
                progress.clear()
                FileHandle.standardError.write(Data("trellis: skipped \(text)\n".utf8))
            },
            progress: { progress.show("importing: \($0) documents", done: documents.bytesRead) },
            clearProgress: { progress.clear() })
    }

    /// Upserts every document `reader` yields into `collection` of `store` in one transaction,
    /// skipping bad records unless `allOrNothing` (the command's help says how).
    ///
    /// - Parameters:
    ///   - file: the file's name as the user gave it, in messages.
    ///   - print: takes the line saying how many documents were imported.
    ///   - skipped: takes the text naming each record skipped.
    ///   - progress: takes the count imported so far, every 5,000 documents.
    ///   - clearProgress: called before anything else is printed and at the end.
    /// - Throws: ``ImportError`` when nothing was imported (a file that cannot be read on; a bad
    ///   record with `allOrNothing`), or after `print` when records were skipped; a
    ///   ``StoreError`` when the store fails.
    static func perform(
        into store: DocumentStore, collection: String, reader: DocumentReadAhead, file: String,
        allOrNothing: Bool, print: (String) -> Void, skipped skipRecord: @escaping (String) -> Void,
        progress: @escaping (Int) -> Void, clearProgress: () -> Void
    ) throws {
        var skipped = 0
        func skip(_ text: String) {
            skipped += 1
            skipRecord(text)
        }
        let count: Int
        do {
            count = try store.upsert(
                in: collection,
                streamingPrepared: {
                    while true {
                        do { return try reader.nextPrepared() } catch let error as FileError
                            where error.recoverable && !allOrNothing
                        {
                            skip("\(error)")
                        }
                    }
                }, progressInterval: 5_000,
                progress: progress,
                refused: allOrNothing ? nil : { skip("\(file) \(reader.place): \($0)") })
        } catch let error as FileError {
            clearProgress()
            throw ImportError("\(error); nothing was imported")
        } catch let error as StoreError where error.refusesOneDocument {
            clearProgress()
            throw ImportError("\(file) \(reader.place): \(error); nothing was imported (--all-or-nothing)")
        } catch {
            clearProgress()
            throw error
        }
        clearProgress()
        print("imported \(count) document\(count == 1 ? "" : "s") into \(collection)")
        if skipped > 0 {
            throw ImportError(
                "skipped \(skipped) bad record\(skipped == 1 ? "" : "s") of \(file) (each named above); the others were imported"
            )
        }
    }

    /// An import that did not import every record (exit status 1; the command line was right).
    struct ImportError: Error, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }
}

/// A progress line on standard error, redrawn in place, shown only when standard error is a
/// terminal (nothing when it is piped or redirected) and at most five times a second.
final class ProgressLine {
    private let total: Int
    private let enabled = isatty(STDERR_FILENO) == 1
    private var last = ContinuousClock.now - .seconds(1)
    private var shown = false

    init(total: Int) { self.total = total }

    func show(_ text: String, done: Int) {
        guard enabled, ContinuousClock.now - last >= .milliseconds(200) else { return }
        last = .now
        let percent = total > 0 ? " (\(min(100, done * 100 / total)) %)" : ""
        FileHandle.standardError.write(Data("\r\u{1B}[K\(text)\(percent)".utf8))
        shown = true
    }

    func clear() {
        guard shown else { return }
        FileHandle.standardError.write(Data("\r\u{1B}[K".utf8))
        shown = false
    }
}

enum InspectCommand {
    static let help = """
        trellis find --data DIR COLLECTION [QUERY] [sort PATH [asc|desc]]... [limit N] [offset N]
                     [args {JSON}] [--count]
        trellis get  --data DIR COLLECTION ID
          Read a node's store (also while the node runs) and print documents as JSON lines. The
          query and its modifiers are the shell's `find` (quote them: bash removes the quotes of
          'Japan' in an unquoted Origin == 'Japan'); --count prints how many `find` would print.
        """

    static func run(_ command: String, _ args: [String]) throws {
        let parsed = try Arguments(args, valueFlags: ["data"], switchFlags: ["count"])
        if parsed.switches.contains("help") {
            print(help)
            return
        }
        let data = try parsed.require("data")
        let path = URL(fileURLWithPath: data).appendingPathComponent("store.sqlite").path
        var options = StoreOptions()
        options.readOnly = true
        let store = try DocumentStore(path: path, options: options)
        switch command {
        case "get":
            guard parsed.positional.count == 2 else { throw UsageError("usage: trellis get --data DIR COLLECTION ID") }
            let id = try ShellSyntax.id(Substring(parsed.positional[1]))
            if let doc = try store.document(id: id, in: parsed.positional[0]) {
                print(JSON.string(doc))
            } else {
                throw NotFound(description: "no document \(JSON.string(id)) in \(parsed.positional[0])")
            }
        default:
            guard let collection = parsed.positional.first else {
                throw UsageError("usage: trellis find --data DIR COLLECTION [QUERY]")
            }
            // The shell's syntax: QUERY, then sort / limit / offset / args.
            let find = try ShellSyntax.find(Substring(parsed.positional.dropFirst().joined(separator: " ")))
            let query = try Query(find.query)
            let sort = try find.sort.map { SortKey(try FieldPath(querySyntax: $0.path), $0.direction) }
            // Both run in SQLite where the query translates, served by `index` indexes.
            if parsed.switches.contains("count") {
                let total = try store.count(in: collection, matching: query, args: find.args)
                print(max(0, min(find.limit ?? .max, total - (find.offset ?? 0))))
            } else {
                for doc in try store.documents(
                    in: collection, matching: query, args: find.args, sort: sort, limit: find.limit,
                    offset: find.offset ?? 0)
                {
                    print(JSON.string(doc))
                }
            }
        }
    }
}

/// `trellis get` of a document the store does not hold: exit status 1 (the command line was
/// right).
struct NotFound: Error, CustomStringConvertible {
    var description: String
}

enum KeygenCommand {
    static func run(_ args: [String]) throws {
        let parsed = try Arguments(args, valueFlags: [], switchFlags: ["force"])
        if parsed.switches.contains("help") {
            print("trellis keygen FILE [--force]\n  Writes a new random 32-byte mesh key (hex) to FILE with mode 0600.")
            return
        }
        guard parsed.positional.count == 1 else { throw UsageError("usage: trellis keygen FILE") }
        let url = URL(fileURLWithPath: parsed.positional[0])
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: url.path, isDirectory: &isDirectory), isDirectory.boolValue {
            throw UsageError("\(url.path) is a directory; give a file name")
        }
        if FileManager.default.fileExists(atPath: url.path), !parsed.switches.contains("force") {
            throw UsageError("\(url.path) exists; pass --force to replace it")
        }
        try MeshKey.generate().write(to: url)
        print("wrote mesh key to \(url.path)")
    }
}
