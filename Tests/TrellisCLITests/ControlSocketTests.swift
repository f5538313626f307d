import Foundation
import Synchronization
import Testing
import TrellisTestKit

/// `trellis attach`, `trellis status` and `trellis import` reach a running node through its
/// control socket (docs/PROTOCOL.md, "Control socket").
@Suite(.serialized) struct ControlSocketTests {
    let dir = TemporaryDirectory("trellis-ctl")

    func meshKey() throws -> String {
        let key = dir.path("mesh.key")
        if !FileManager.default.fileExists(atPath: key) {
            #expect(try TrellisProcess.run(["keygen", key]).status == 0)
        }
        return key
    }

    /// Starts `trellis node` on `data` and waits until it answers on its control socket.
    func startNode(_ data: String, _ flags: [String] = []) throws -> TrellisProcess {
        let node = try TrellisProcess(["node", "--data", data, "--mesh-key", try meshKey()] + flags)
        let ready = eventually {
            (try? TrellisProcess.run(["status", "--data", data]).status) == 0 || !node.isRunning
        }
        guard ready, node.isRunning else { throw ProcessError("the node did not start: \(node.stderr)") }
        return node
    }

    func attach(_ data: String, _ script: [String], flags: [String] = []) throws -> (
        status: Int32, stdout: String, stderr: String
    ) {
        try TrellisProcess.run(["attach", "--data", data] + flags, input: script.joined(separator: "\n"))
    }

    /// Commands piped to `trellis attach` run in the node: a second client, `trellis status` and
    /// `trellis find` see their effects, and the output and exit status are the piped shell's.
    @Test func attachRunsShellCommandsInTheRunningNode() throws {
        let a = dir.path("A")
        let node = try startNode(a)
        let script = [
            "observe cars hp > 50", #"upsert cars {"_id": "c1", "Name": "alpha", "hp": 100}"#, "get cars c1",
            "count cars", "bogus",
            "update cars c1 set hp 120", "find cars hp > 50",
        ]
        let attached = try attach(a, script)
        let shell = try TrellisProcess.run(
            ["shell", "--data", dir.path("S"), "--mesh-key", try meshKey(), "--quiet"],
            input: script.joined(separator: "\n"))
        #expect(attached.status == 1, "a failed command makes the status 1, as the piped shell's")
        #expect(attached.stdout == shell.stdout)
        #expect(attached.stderr == shell.stderr)
        #expect(attached.stderr == "error: unknown command 'bogus'; type `help`\n")
        #expect(attached.stdout.contains(#"{"Name":"alpha","_id":"c1","hp":120}"#))
        #expect(attached.stdout.contains("observe cars hp > 50: update 1"), "events come as the shell's")

        // The node holds the write: another client sees it, and so does a read of the store.
        let second = try attach(a, ["get cars c1", "subscribe cars hp > 10"])
        #expect(second.status == 0)
        #expect(second.stdout == #"{"Name":"alpha","_id":"c1","hp":120}"# + "\nsubscribed: cars hp > 10\n")
        let found = try TrellisProcess.run(["find", "--data", a, "cars", "--count"])
        #expect(found.stdout == "1\n")
        // The subscription outlives the attach that made it.
        let status = try TrellisProcess.run(["status", "--data", a])
        #expect(status.status == 0)
        #expect(status.stdout.contains("subscriptions: 1\n  cars: hp > 10\n"), "\(status.stdout)")
        #expect(try attach(a, ["subscriptions"]).stdout == "cars hp > 10\n")

        // --keep-going and --bail as the shell's.
        #expect(
            try attach(a, ["bogus", "count cars"], flags: ["--keep-going"]) == (
                0, "1\n", "error: unknown command 'bogus'; type `help`\n"
            ))
        let bail = try attach(a, ["bogus", "count cars"], flags: ["--bail"])
        #expect(bail.status == 1 && bail.stdout.isEmpty)

        #expect(node.terminate() == 0)
        #expect(!FileManager.default.fileExists(atPath: a + "/control.sock"), "a clean exit removes the socket")
    }

    /// At a terminal, `trellis attach` is the interactive shell: a banner, a prompt per line,
    /// live query events shown while it waits at the prompt (and the prompt again after them),
    /// errors that neither end it nor change its status.
    @Test func attachAtATerminalShowsPromptsAndEvents() throws {
        let a = dir.path("A")
        let node = try startNode(a)
        let terminal = try PseudoTerminal(["attach", "--data", a])
        #expect(terminal.waitFor("trellis> ", count: 1), "\(terminal.text)")
        #expect(terminal.text.hasPrefix("trellis attach — node "))
        terminal.type("observe cars\n")
        #expect(terminal.waitFor("trellis> ", count: 2), "\(terminal.text)")
        // Another client writes while this one waits at its prompt.
        #expect(try attach(a, [#"upsert cars {"_id": "e"}"#]).status == 0)
        // Shown above the line being typed (the line editor draws the prompt again after it).
        #expect(terminal.waitFor("observe cars true: update 1"), "\(terminal.text)")
        #expect(terminal.waitFor("  inserted 0 {\"_id\":\"e\"}"), "\(terminal.text)")
        #expect(terminal.waitFor("trellis> ", count: 3), "\(terminal.text)")
        #expect(!terminal.text.contains("trellis> trellis> "), "one prompt after the event: \(terminal.text)")
        terminal.type("bogus\n")
        #expect(terminal.waitFor("error: unknown command 'bogus'; type `help`"), "\(terminal.text)")
        #expect(terminal.waitFor("trellis> ", count: 4), "\(terminal.text)")
        terminal.type("\u{04}")  // Ctrl-D: the end of input
        #expect(terminal.wait() == 0, "at a terminal an error does not change the status")
        #expect(node.isRunning)
        #expect(node.terminate() == 0)
    }

    /// `trellis shell` serves the control socket too: an attached client's write is the shell's.
    @Test func aShellServesAttachToo() throws {
        let s = dir.path("S")
        let shell = try TrellisProcess(["shell", "--data", s, "--mesh-key", try meshKey(), "--quiet"])
        #expect(eventually { (try? TrellisProcess.run(["status", "--data", s]).status) == 0 }, "\(shell.stderr)")
        #expect(try attach(s, [#"upsert cars {"_id": "from-attach"}"#]) == (0, "\"from-attach\"\n", ""))
        shell.send("get cars from-attach")
        #expect(eventually { shell.stdout.contains(#"{"_id":"from-attach"}"#) }, "\(shell.stdout)")
        shell.closeInput()
        #expect(shell.wait() == 0)
        #expect(!FileManager.default.fileExists(atPath: s + "/control.sock"))
    }

    /// `trellis status` of one node of a loopback pair lists the other as a connected peer.
    @Test func statusListsAConnectedPeer() throws {
        let a = dir.path("A")
        let b = dir.path("B")
        let nodeA = try startNode(a, ["--listen", "127.0.0.1:0"])
        let port = try #require(nodeA.listeningPort(), "\(nodeA.stderr)")
        let keyA = try #require(Self.peerKey(nodeA.stderr))
        let nodeB = try startNode(b, ["--peer", "127.0.0.1:\(port)", "--subscribe", "cars"])
        var text = ""
        let connected = eventually(timeout: 30) {
            text = (try? TrellisProcess.run(["status", "--data", b]).stdout) ?? ""
            return text.contains("peers: 1 connected")
        }
        #expect(connected, "\(text)\n\(nodeB.stderr)")
        #expect(text.contains("  \(keyA.prefix(16)) 127.0.0.1:\(port) outbound"), "\(text)")
        #expect(text.contains("subscriptions: 1\n  cars: true"), "\(text)")
        // A serves B's subscription.
        #expect(
            eventually {
                (try? TrellisProcess.run(["status", "--data", a]).stdout)?.contains("serving 1 subscription(s)") == true
            })
        #expect(text.contains("peer times: 1 connected, 0 gone\n  \(keyA.prefix(16)) connected since 20"), "\(text)")

        // --json: one object with the same facts.
        let json = try TrellisProcess.run(["status", "--data", b, "--json"])
        #expect(json.status == 0)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        let peers = try #require(object["peers"] as? [[String: Any]])
        #expect(peers.count == 1)
        #expect(peers.first?["peerKey"] as? String == keyA)
        #expect(peers.first?["direction"] as? String == "outbound")
        #expect(peers.first?["connectedSince"] is String)
        #expect((object["subscriptions"] as? [[String: Any]])?.first?["collection"] as? String == "cars")
        #expect((object["inboundBuffer"] as? [String: Any])?["limitBytes"] as? Int == 256 << 20)

        let keyB = try #require((object["node"] as? [String: Any])?["peerKey"] as? String)

        // A peer that left is listed as last seen.
        #expect(nodeB.terminate() == 0)
        #expect(
            eventually {
                text = (try? TrellisProcess.run(["status", "--data", a]).stdout) ?? ""
                return text.contains("peer times: 0 connected, 1 gone\n  \(keyB.prefix(16)) last seen 20")
            }, "\(text)")
        #expect(nodeA.terminate() == 0)
    }

    /// `trellis import` into a running node goes through it, with a direct import's messages
    /// and exit statuses; the file is read by the client, relative to its working directory.
    @Test func importGoesThroughARunningNode() throws {
        let a = dir.path("A")
        let node = try startNode(a)
        let work = dir.path("work")
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        let lines = [#"{"_id":"x"}"#, "{bad", #"{"_id":"y"}"#]
        try lines.joined(separator: "\n").write(toFile: work + "/cars.jsonl", atomically: true, encoding: .utf8)

        let all = try TrellisProcess.run(
            ["import", "--data", a, "cars", "cars.jsonl", "--all-or-nothing"], directory: work)
        #expect(all.status == 1)
        #expect(all.stdout.isEmpty)
        #expect(all.stderr.contains("trellis: error: cars.jsonl line 2: invalid JSON"), "\(all.stderr)")
        #expect(all.stderr.hasSuffix("; nothing was imported\n"))
        #expect(try attach(a, ["count cars"]).stdout == "0\n")

        let skipping = try TrellisProcess.run(["import", "--data", a, "cars", "cars.jsonl"], directory: work)
        #expect(skipping.status == 1)
        #expect(skipping.stdout == "imported 2 documents into cars\n")
        #expect(skipping.stderr.hasPrefix("trellis: skipped cars.jsonl line 2: invalid JSON"), "\(skipping.stderr)")
        #expect(
            skipping.stderr.hasSuffix(
                "trellis: error: skipped 1 bad record of cars.jsonl (each named above); the others were imported\n"))
        #expect(try attach(a, ["count cars"]).stdout == "2\n")

        try [#"{"_id":"z"}"#].joined().write(toFile: work + "/one.jsonl", atomically: true, encoding: .utf8)
        let good = try TrellisProcess.run(["import", "--data", a, "cars", "one.jsonl"], directory: work)
        #expect(good.status == 0 && good.stdout == "imported 1 document into cars\n", "\(good.stderr)")
        let missing = try TrellisProcess.run(["import", "--data", a, "cars", "nope.jsonl"], directory: work)
        #expect(missing.status == 1 && missing.stderr.contains("cannot read nope.jsonl"), "\(missing.stderr)")
        #expect(try attach(a, ["count cars"]).stdout == "3\n")
        #expect(node.isRunning)
        #expect(node.terminate() == 0)
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: a).filter { $0.hasSuffix(".spool") }
        #expect(leftovers.isEmpty)
    }

    /// Without a node: attach and status say so with exit status 1; import writes the store.
    @Test func withoutANodeAttachAndStatusSaySoAndImportIsDirect() throws {
        let a = dir.path("none")
        for command in ["attach", "status"] {
            let r = try TrellisProcess.run([command, "--data", a], input: "count cars")
            #expect(r.status == 1)
            #expect(r.stderr == "trellis: error: no node is running on \(a) (no control socket)\n")
        }
        try #"{"_id":"x"}"#.write(toFile: dir.path("x.jsonl"), atomically: true, encoding: .utf8)
        let imported = try TrellisProcess.run(["import", "--data", a, "cars", dir.path("x.jsonl")])
        #expect(imported.status == 0 && imported.stdout == "imported 1 document into cars\n")
    }

    /// A node killed with SIGKILL leaves its socket: clients say no node runs, and the next node
    /// replaces it (mode 0600).
    @Test func aStaleSocketNeverBlocksAStart() throws {
        let a = dir.path("A")
        let socket = a + "/control.sock"
        let first = try startNode(a)
        #expect(Self.mode(socket) == 0o600)
        first.kill()
        #expect(FileManager.default.fileExists(atPath: socket))
        let status = try TrellisProcess.run(["status", "--data", a])
        #expect(status.status == 1)
        #expect(status.stderr.contains("no node is running on \(a) (its control socket \(socket) is stale"))

        let second = try startNode(a)
        #expect(Self.mode(socket) == 0o600)
        #expect(try attach(a, ["count cars"]) == (0, "0\n", ""))
        #expect(second.terminate() == 0)
    }

    /// A client that never sends, one that sends a 20 MB hello line, and an attach that sends a
    /// 20 MB command line hold up no one: the node answers the next client and keeps running.
    @Test func hostileClientsDoNotStopTheNode() throws {
        let a = dir.path("A")
        let node = try startNode(a)
        let socket = a + "/control.sock"

        let silent = try Self.connect(socket)
        defer { close(silent) }

        // A hello line longer than the node takes: a clear error, then the connection closes.
        let garbage = try Self.connect(socket)
        defer { close(garbage) }
        let sender = Thread {
            let chunk = [UInt8](repeating: 0x61, count: 1 << 20)
            for _ in 0..<20
            where chunk.withUnsafeBytes({ send(garbage, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) > 0 {}
        }
        sender.start()
        let reply = Self.readAll(garbage)
        #expect(reply.contains("the control hello is longer than 4096 bytes"), "\(reply)")

        // A 20 MB command line through attach: refused as the shell refuses it, the next runs.
        let long = "count cars " + String(repeating: "x", count: 20 << 20)
        let r = try attach(a, [long, "count cars"])
        #expect(r.status == 1)
        #expect(r.stdout == "0\n")
        #expect(r.stderr == "error: line 1 is longer than 16777216 bytes, the longest line the shell takes; ignored\n")

        #expect(try attach(a, [#"upsert cars {"_id": "k"}"#, "count cars"]) == (0, "\"k\"\n1\n", ""))
        #expect(node.isRunning)
        #expect(node.terminate() == 0)
    }

    /// A hello dripped one byte at a time is cut when the whole line is late (not each byte),
    /// and idle attach sessions, however many, leave room for `trellis status`.
    @Test func slowHellosAndIdleAttachesLeaveRoomForStatus() throws {
        let a = dir.path("A")
        let node = try startNode(a)
        let socket = a + "/control.sock"
        let drip = try Self.connect(socket)
        defer { close(drip) }
        let dripped = Thread {
            for byte in Array(#"{"trellis-control": 1, "operation": "status"}"#.utf8) {
                var b = byte
                guard send(drip, &b, 1, Int32(MSG_NOSIGNAL)) == 1 else { return }
                sleep(1)
            }
        }
        dripped.start()
        let started = Date()
        _ = Self.readAll(drip)  // the node closes it
        #expect(Date().timeIntervalSince(started) < 20, "cut after the hello timeout, not after its last byte")

        // 60 attach sessions that sit at their prompt: the node takes 56, status still answers.
        var held: [Int32] = []
        defer { for fd in held { close(fd) } }
        for _ in 0..<60 {
            let fd = try Self.connect(socket)
            let hello = Array(#"{"trellis-control": 1, "operation": "attach", "interactive": true}"#.utf8) + [0x0A]
            _ = hello.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            held.append(fd)
        }
        let status = try TrellisProcess.run(["status", "--data", a])
        #expect(status.status == 0, "\(status.stderr)")
        let refused = try attach(a, ["count cars"])
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("attach and import sessions at once"), "\(refused.stderr)")
        #expect(node.terminate() == 0)
    }

    // MARK: helpers

    /// `trellis ARGS…` with a pseudo-terminal as its standard input, output and error.
    final class PseudoTerminal: Sendable {
        let process = Process()
        let master: Int32
        private let output = Mutex<[UInt8]>([])

        init(_ arguments: [String]) throws {
            // posix_openpt/unlockpt/ptsname by hand (Glibc's module does not import them).
            master = open("/dev/ptmx", O_RDWR | O_NOCTTY)
            var unlock: Int32 = 0
            var number: UInt32 = 0
            guard master >= 0, ioctl(master, UInt(0x4004_5431), &unlock) == 0,  // TIOCSPTLCK
                ioctl(master, UInt(0x8004_5430), &number) == 0  // TIOCGPTN
            else { throw ProcessError("no pseudo-terminal: errno \(errno)") }
            let name = "/dev/pts/\(number)"
            let slave = open(name, O_RDWR | O_NOCTTY)
            guard slave >= 0 else { throw ProcessError("cannot open the pseudo-terminal: errno \(errno)") }
            let handle = FileHandle(fileDescriptor: slave, closeOnDealloc: true)
            process.executableURL = Repository.trellisBinary
            process.arguments = arguments
            (process.standardInput, process.standardOutput, process.standardError) = (handle, handle, handle)
            try process.run()
            try handle.close()
            Thread.detachNewThread { [self] in
                var chunk = [UInt8](repeating: 0, count: 4_096)
                while true {
                    let n = chunk.withUnsafeMutableBytes { read(master, $0.baseAddress, $0.count) }
                    if n < 0 && errno == EINTR { continue }
                    if n <= 0 { return }  // EIO once the child has exited
                    output.withLock { $0 += chunk[..<n] }
                }
            }
        }

        var text: String { String(decoding: output.withLock { $0 }, as: UTF8.self) }

        func type(_ text: String) { _ = Array(text.utf8).withUnsafeBytes { write(master, $0.baseAddress, $0.count) } }

        /// Waits until `text` appears `count` times in the output.
        func waitFor(_ text: String, count: Int = 1) -> Bool {
            eventually { self.text.components(separatedBy: text).count - 1 >= count }
        }

        func wait() -> Int32 {
            let deadline = Date().addingTimeInterval(30)
            while process.isRunning && Date() < deadline { usleep(10_000) }
            if process.isRunning { process.terminate() }
            process.waitUntilExit()
            return process.terminationStatus
        }

        deinit {
            if process.isRunning { process.terminate() }
            close(master)
        }
    }

    /// The peer key a node logs at start (`…, peer key HEX`).
    static func peerKey(_ log: String) -> String? {
        guard let range = log.range(of: "peer key ") else { return nil }
        return String(log[range.upperBound...].prefix(64))
    }

    static func mode(_ path: String) -> Int? {
        (try? FileManager.default.attributesOfItem(atPath: path)[.posixPermissions]) as? Int
    }

    /// A raw connection to a control socket.
    static func connect(_ path: String) throws -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: Array(path.utf8) + [0])
        }
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard result == 0 else { throw ProcessError("cannot connect to \(path): errno \(errno)") }
        return fd
    }

    /// Everything the node sends until it closes (frames undecoded, as text).
    static func readAll(_ fd: Int32) -> String {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4_096)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            bytes += chunk[..<n]
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
