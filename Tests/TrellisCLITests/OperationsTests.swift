import Foundation
import Testing
import TrellisTestKit

/// Running `trellis` as an operator does: overlong shell lines, read-only and missing stores,
/// imports with bad records, what a node says at start, logging and exit codes. Real processes.
@Suite(.serialized) struct OperationsTests {
    let dir = TemporaryDirectory("trellis-ops")

    /// A mesh key in the test's directory, made once.
    func meshKey() throws -> String {
        let key = dir.path("mesh.key")
        if !FileManager.default.fileExists(atPath: key) {
            #expect(try TrellisProcess.run(["keygen", key]).status == 0)
        }
        return key
    }

    /// A 64 MiB line is refused once 16 MiB of it are read, with the limit in words; the rest of
    /// it is discarded and the lines after it run.
    @Test func aShellLineAboveTheLimitIsRefusedAndTheShellGoesOn() throws {
        let shell = try TrellisProcess(["shell", "--data", dir.path("L"), "--mesh-key", try meshKey(), "--quiet"])
        shell.sendBytes(Array(#"upsert c {"_id": "big", "x": ""#.utf8) + [UInt8](repeating: 0x78, count: 64 << 20))
        shell.sendBytes(Array(#""}"#.utf8) + [0x0D, 0x0A])
        shell.send(#"upsert c {"_id": "a"}"#)
        // Exactly at the limit is taken (and fails as a command: an unknown one).
        shell.sendBytes([UInt8](repeating: 0x7A, count: 16 << 20) + [0x0A])
        shell.send("count c")
        shell.closeInput()
        #expect(shell.wait(timeout: 120) == 1)
        let errors = shell.stderr.split(separator: "\n").map { String($0.prefix(80)) }
        #expect(
            errors
                == [
                    "error: line 1 is longer than 16777216 bytes, the longest line the shell takes; ignored",
                    "error: unknown command 'zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz",
                ].map { String($0.prefix(80)) })
        #expect(shell.stdout == "\"a\"\n1\n")
    }

    /// Runs `trellis ARGS…` as a user who may not write `directory`: as `nobody` (through
    /// `setpriv`) when the tests run as root, who may write anywhere; else with the directory
    /// made read-only for the run.
    func runWithoutWriteAccess(to directory: String, _ arguments: [String]) throws -> (
        status: Int32, stdout: String, stderr: String
    ) {
        guard getuid() == 0 else {
            try FileManager.default.setAttributes([.posixPermissions: 0o555], ofItemAtPath: directory)
            defer { try? FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: directory) }
            return try TrellisProcess.run(arguments)
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        process.arguments =
            ["--reuid=65534", "--regid=65534", "--clear-groups", Repository.trellisBinary.path] + arguments
        let (out, err) = (Pipe(), Pipe())
        process.standardOutput = out
        process.standardError = err
        try process.run()
        let stdout = out.fileHandleForReading.readDataToEndOfFile()
        let stderr = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (
            process.terminationStatus, String(decoding: stdout, as: UTF8.self), String(decoding: stderr, as: UTF8.self)
        )
    }

    /// `find` and `get` read a store this user may not write (a stopped node's, someone else's).
    @Test func findAndGetReadAStoreThisUserMayNotWrite() throws {
        let data = dir.path("R")
        let shell = try TrellisProcess.run(
            ["shell", "--data", data, "--mesh-key", try meshKey(), "--quiet"],
            input: #"upsert cars {"_id": "a", "Origin": "Japan"}"#)
        #expect(shell.status == 0, "\(shell.stderr)")
        // Others may enter and read, not write (what a data directory made by root or by another
        // user gives).
        try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: dir.url.path)
        try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: data)
        let find = try runWithoutWriteAccess(to: data, ["find", "--data", data, "cars", "Origin == 'Japan'"])
        #expect(find.status == 0, "\(find.stderr)")
        #expect(find.stdout == #"{"Origin":"Japan","_id":"a"}"# + "\n")
        let get = try runWithoutWriteAccess(to: data, ["get", "--data", data, "cars", "a"])
        #expect(get.status == 0, "\(get.stderr)")
        #expect(get.stdout == #"{"Origin":"Japan","_id":"a"}"# + "\n")
        #expect(!find.stderr.contains("SQLite error") && !get.stderr.contains("SQLite error"))
    }

    /// Every command that reads a store says the same words when there is none, naming the
    /// directory, with exit status 1 (the command line was right).
    @Test func aMissingStoreIsReportedInTheSameWordsByEveryCommand() throws {
        let empty = dir.path("empty")
        try FileManager.default.createDirectory(atPath: empty, withIntermediateDirectories: true)
        for (data, why) in [(dir.path("nope"), "no such directory"), (empty, "it holds no store.sqlite")] {
            for command in [
                ["find", "--data", data, "cars"], ["find", "--data", data, "cars", "--count"],
                ["get", "--data", data, "cars", "a"], ["contacts", "list", "--data", data],
                ["contacts", "export", "--data", data],
            ] {
                let r = try TrellisProcess.run(command)
                #expect(r.status == 1, "\(command)")
                #expect(r.stderr == "trellis: error: no Trellis store in \(data) (\(why))\n", "\(command)")
                #expect(r.stdout.isEmpty)
            }
        }
    }

    /// A bad record is named by line (and element) on standard error and skipped; the others are
    /// imported, the count skipped ends the run and the exit status is 1. `--all-or-nothing`
    /// imports nothing and names the first.
    @Test func importSkipsBadRecordsAndNamesEachByLineAndElement() throws {
        let lines = dir.path("bad.jsonl")
        try Data(
            [
                #"{"_id": "a"}"#, #"{"_id": 5}"#, "", #"{"_id": "b"}"#, "{oops}", "[1]", #"{"_id": "c"}"#,
            ].joined(separator: "\n").utf8
        ).write(to: URL(fileURLWithPath: lines))
        let array = dir.path("bad.json")
        try Data("[\n  {\"_id\": \"d\"},\n  {\"_id\": true},\n  7,\n  {\"_id\": \"e\"}\n]\n".utf8)
            .write(to: URL(fileURLWithPath: array))

        let data = dir.path("I")
        let r = try TrellisProcess.run(["import", "--data", data, "c", lines])
        #expect(r.status == 1)
        #expect(r.stdout == "imported 3 documents into c\n")
        let errors = r.stderr.split(separator: "\n").map(String.init)
        #expect(errors.count == 4, "\(errors)")
        #expect(errors.first?.hasPrefix("trellis: skipped \(lines) line 2: invalid _id") == true, "\(errors)")
        #expect(errors.dropFirst().first?.hasPrefix("trellis: skipped \(lines) line 5: invalid JSON") == true)
        #expect(errors.dropFirst(2).first == "trellis: skipped \(lines) line 6: array, not a JSON object")
        #expect(
            errors.last
                == "trellis: error: skipped 3 bad records of \(lines) (each named above); the others were imported")
        #expect(try TrellisProcess.run(["find", "--data", data, "c", "--count"]).stdout == "3\n")

        let a = try TrellisProcess.run(["import", "--data", data, "d", array])
        #expect(a.status == 1)
        #expect(a.stdout == "imported 2 documents into d\n")
        let arrayErrors = a.stderr.split(separator: "\n").map(String.init)
        #expect(arrayErrors.first?.hasPrefix("trellis: skipped \(array) element 2 (line 3): invalid _id") == true)
        #expect(
            arrayErrors.dropFirst().first == "trellis: skipped \(array) element 3 (line 4) is int, not a JSON object")

        let strict = try TrellisProcess.run(["import", "--data", data, "e", lines, "--all-or-nothing"])
        #expect(strict.status == 1)
        #expect(strict.stdout.isEmpty)
        #expect(
            strict.stderr.hasPrefix("trellis: error: \(lines) line 2: invalid _id")
                && strict.stderr.hasSuffix("; nothing was imported (--all-or-nothing)\n"), "\(strict.stderr)")
        #expect(try TrellisProcess.run(["find", "--data", data, "e", "--count"]).stdout == "0\n")
    }

    /// Waits until `text` holds `needle` (a process's output or a file), up to 20 s.
    func eventually(_ needle: String, in text: () -> String) -> Bool {
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline {
            if text().contains(needle) { return true }
            usleep(20_000)
        }
        return false
    }

    /// A log line: `YYYY-MM-DDTHH:MM:SS.mmmZ LEVEL [NAME] MESSAGE`.
    func isLogLine(_ line: Substring, level: String, name: String) -> Bool {
        let parts = line.split(separator: " ", maxSplits: 3)
        guard parts.count == 4, parts[1] == level, parts[2] == "[\(name)]" else { return false }
        let time = Array(parts[0].utf8)
        let digits = [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, 20, 21, 22]
        return time.count == 24 && digits.allSatisfy { (0x30...0x39).contains(time[$0]) }
            && String(decoding: [time[4], time[7], time[10], time[13], time[16], time[19], time[23]], as: UTF8.self)
                == "--T::.Z"
    }

    /// A node with no listener and no peer says so in one line at start; it stops on SIGTERM
    /// with status 0.
    @Test func aNodeWithNoListenerAndNoPeerSaysWhatItIsDoing() throws {
        let node = try TrellisProcess(["node", "--data", dir.path("N"), "--mesh-key", try meshKey(), "--no-discovery"])
        #expect(eventually("no listener and no peer", in: { node.stderr }))
        #expect(node.terminate() == 0)
        let lines = node.stderr.split(separator: "\n")
        #expect(lines.count == 2, "\(node.stderr)")
        #expect(isLogLine(lines[0], level: "warn", name: "N"), "\(lines[0])")
        #expect(
            lines[0].hasSuffix(
                "running in the foreground with no listener and no peer: nothing can connect to this node and it "
                    + "dials no one (give --listen HOST:PORT or --peer HOST:PORT), so it only keeps \(dir.path("N")); "
                    + "stop it with Ctrl-C or SIGTERM"))
        #expect(lines.count == 2 && isLogLine(lines[1], level: "info", name: "N") && lines[1].hasSuffix(" stopping"))
    }

    /// `--log-level` chooses what is logged, `--log-file` where; every line has its time.
    @Test func logLevelAndLogFile() throws {
        let key = try meshKey()
        let file = dir.path("node.log")
        let node = try TrellisProcess([
            "node", "--data", dir.path("F"), "--mesh-key", key, "--listen", "127.0.0.1:0", "--log-file", file,
            "--log-level", "debug",
        ])
        #expect(eventually("stop it with Ctrl-C", in: { (try? String(contentsOfFile: file, encoding: .utf8)) ?? "" }))
        #expect(node.terminate() == 0)
        #expect(node.stderr.isEmpty, "\(node.stderr)")
        let logged = try String(contentsOfFile: file, encoding: .utf8).split(separator: "\n")
        #expect(logged.count == 3 && logged.allSatisfy { isLogLine($0, level: "info", name: "F") }, "\(logged)")
        #expect(logged.first?.contains("listening on 127.0.0.1:") == true)

        // warn: the start and stop news are not logged, a warning is.
        let quiet = try TrellisProcess([
            "node", "--data", dir.path("G"), "--mesh-key", key, "--no-discovery", "--log-level", "warn",
        ])
        #expect(eventually("no listener and no peer", in: { quiet.stderr }))
        #expect(quiet.terminate() == 0)
        #expect(quiet.stderr.split(separator: "\n").count == 1, "\(quiet.stderr)")

        for (flags, message) in [
            (["--log-level", "loud"], "--log-level takes error, warn, info or debug, not 'loud'"),
            (["--log-level", "info", "--quiet"], "--quiet is --log-level error; give one of them"),
            (["--log-file", dir.path("no/such/dir/log")], "--log-file: cannot open"),
        ] {
            let r = try TrellisProcess.run(["node", "--data", dir.path("H"), "--mesh-key", key] + flags)
            #expect(r.status == 2, "\(flags)")
            #expect(r.stderr.hasPrefix("trellis: error: \(message)"), "\(r.stderr)")
        }
    }

    /// The exit codes the README lists: 0 done, 1 failed, 2 a wrong command line.
    @Test func exitCodesFollowTheDocumentedMeaning() throws {
        let data = dir.path("X")
        let shell = try TrellisProcess.run(
            ["shell", "--data", data, "--mesh-key", try meshKey(), "--quiet"], input: #"upsert c {"_id": "a"}"#)
        #expect(shell.status == 0)
        #expect(try TrellisProcess.run(["get", "--data", data, "c", "a"]).status == 0)
        let missing = try TrellisProcess.run(["get", "--data", data, "c", "zz"])
        #expect(missing.status == 1 && missing.stderr == "trellis: error: no document \"zz\" in c\n")
        #expect(try TrellisProcess.run(["get", "--data", data, "c"]).status == 2)
        #expect(try TrellisProcess.run(["frob"]).status == 2)
        // Ctrl-C ends a shell by the signal: the calling shell reports 128 + 2.
        let interrupted = try TrellisProcess(["shell", "--data", data, "--mesh-key", try meshKey(), "--quiet"])
        interrupted.send("count c")
        #expect(eventually("1", in: { interrupted.stdout }))
        interrupted.signal(SIGINT)
        #expect(interrupted.wait() == SIGINT && interrupted.process.terminationReason == .uncaughtSignal)
    }

    /// The README's command-line walkthrough can be followed as written: it fetches `cars.json`
    /// (from the package `scripts/demo.sh` uses) before importing it, says that a node runs in
    /// the foreground and how to stop it, lists the exit codes; the default port it, `node
    /// --help` and docs/PROTOCOL.md name is one port.
    @Test func theReadmeWalkthroughSaysWhereCarsComeFromAndHowToStopANode() throws {
        func text(_ path: String) throws -> String {
            try String(contentsOf: Repository.root.appendingPathComponent(path), encoding: .utf8)
                .split(whereSeparator: \.isWhitespace).joined(separator: " ")
        }
        let readme = try text("README.md")
        let start = try #require(readme.range(of: "## Using the command line"))
        let rest = readme[start.upperBound...]
        let walkthrough = rest[..<(rest.range(of: "## ")?.lowerBound ?? rest.endIndex)]
        let fetched = walkthrough.range(of: "/_data/cars.json\" .")?.lowerBound
        let imported = walkthrough.range(of: "import --data nodeA cars cars.json")?.lowerBound
        #expect(fetched != nil && imported != nil && fetched! < imported!, "cars.json is fetched, then imported")
        #expect(walkthrough.contains("scripts/setup.sh vega_datasets"))
        #expect(try text("scripts/demo.sh").contains("vega_datasets.__file__), \"_data\", \"cars.json\""))
        #expect(walkthrough.contains("`trellis node` runs in the foreground"))
        #expect(walkthrough.contains("Ctrl-C (SIGINT) or SIGTERM"))
        let help = try TrellisProcess.run(["node", "--help"]).stdout.split(whereSeparator: \.isWhitespace)
            .joined(separator: " ")
        #expect(help.contains("in the foreground, until Ctrl-C (SIGINT) or SIGTERM"))
        for code in ["0", "1", "2", "130"] { #expect(readme.contains("| \(code) | "), "exit code \(code)") }

        let protocolDoc = try text("docs/PROTOCOL.md")
        let said = try #require(protocolDoc.range(of: "listens by default on port "))
        let port = String(protocolDoc[said.upperBound...].prefix { $0.isNumber })
        #expect(port == "4040")
        #expect(help.contains("default with discovery: port \(port) on every address"))
        #expect(readme.contains("such a node listens on port \(port)"))
    }
}
