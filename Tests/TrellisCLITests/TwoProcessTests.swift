import Foundation
import Testing
import Trellis
import TrellisTestKit

/// Runs real `trellis` processes on loopback.
@Suite(.serialized) struct TwoProcessTests {
    let dir = TemporaryDirectory("trellis-cli")

    func writeCars(_ n: Int) throws -> String {
        let origins = ["USA", "Europe", "Japan"]
        let lines = (0..<n).map { i in
            #"{"Name":"car \#(i)","Origin":"\#(origins[i % 3])","Cylinders":\#(4 + i % 3),"Miles_per_Gallon":\#(Double(i) + 0.5)}"#
        }
        let path = dir.path("cars.jsonl")
        try lines.joined(separator: "\n").write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    func count(_ data: String, _ query: String = "true") -> Int? {
        guard let r = try? TrellisProcess.run(["find", "--data", data, "cars", query, "--count"]), r.status == 0 else {
            return nil
        }
        return Int(r.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    @Test func twoNodesReplicateOverEncryptedLoopback() throws {
        let key = dir.path("mesh.key")
        #expect(try TrellisProcess.run(["keygen", key]).status == 0)
        let mode = try FileManager.default.attributesOfItem(atPath: key)[.posixPermissions] as? Int
        #expect(mode == 0o600)
        let a = dir.path("A")
        let b = dir.path("B")
        let imported = try TrellisProcess.run(["import", "--data", a, "cars", try writeCars(90)])
        #expect(imported.status == 0 && imported.stdout.contains("imported 90"))

        let nodeA = try TrellisProcess(["node", "--data", a, "--listen", "127.0.0.1:0", "--mesh-key", key])
        let port = try #require(nodeA.listeningPort(), "node A did not report its port: \(nodeA.stderr)")
        let nodeB = try TrellisProcess([
            "node", "--data", b, "--peer", "127.0.0.1:\(port)", "--mesh-key", key, "--subscribe",
            "cars Origin == 'Japan'",
        ])
        #expect(eventually(timeout: 30) { count(b) == 30 }, "B: \(nodeB.stderr)")
        #expect(count(b, "Origin != 'Japan'") == 0)

        // One process owns a data directory: a second node is refused; reading is fine, and an
        // import goes through the running node (its control socket).
        let second = try TrellisProcess.run(["node", "--data", a, "--mesh-key", key])
        #expect(second.status != 0 && second.stderr.contains("is in use by another trellis process"))
        #expect(count(a) == 90)
        let importing = try TrellisProcess.run(["import", "--data", a, "cars", try writeCars(3)])
        #expect(importing.status == 0 && importing.stdout == "imported 3 documents into cars\n")
        #expect(count(a) == 93)

        // A node with another mesh key cannot connect and gets nothing.
        let otherKey = dir.path("other.key")
        #expect(try TrellisProcess.run(["keygen", otherKey]).status == 0)
        let c = dir.path("C")
        let nodeC = try TrellisProcess([
            "node", "--data", c, "--peer", "127.0.0.1:\(port)", "--mesh-key", otherKey, "--subscribe", "cars",
        ])
        #expect(eventually { nodeA.stderr.contains("refused an inbound connection") })
        #expect(count(c) == 0)
        #expect(eventually { nodeC.stderr.contains("check that both nodes use the same mesh key") })
        #expect(nodeC.terminate() == 0)
        #expect(nodeB.terminate() == 0)
        #expect(nodeA.terminate() == 0)
    }

    /// The nice value of each of a process's threads, by thread name (Linux keeps one per
    /// thread: /proc/PID/task/TID/comm, and field 19 of its stat).
    func threadNices(_ pid: Int32) -> [(name: String, nice: Int32)] {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.compactMap { tid -> (String, Int32)? in
            let base = "/proc/\(pid)/task/\(tid)"
            guard let comm = try? String(contentsOfFile: base + "/comm", encoding: .utf8),
                let stat = try? String(contentsOfFile: base + "/stat", encoding: .utf8),
                let fields = stat.split(separator: ")").last?.split(separator: " "), fields.count > 16,
                let nice = Int32(fields[16])  // after "pid (comm)": state is field 3, nice field 19
            else { return nil }
            return (comm.trimmingCharacters(in: .newlines), nice)
        }
    }

    /// Replication runs at nice 10 by default (`background`), other work on the machine first;
    /// `--priority default` runs it at nice 0. The threads carry their names for `top -H`.
    @Test func replicationRunsAtTheChosenPriority() throws {
        let key = dir.path("priority.key")
        #expect(try TrellisProcess.run(["keygen", key]).status == 0)
        let a = dir.path("PA")
        let imported = try TrellisProcess.run(["import", "--data", a, "cars", try writeCars(30)])
        #expect(imported.status == 0)
        let nodeA = try TrellisProcess(["node", "--data", a, "--listen", "127.0.0.1:0", "--mesh-key", key])
        let port = try #require(nodeA.listeningPort(), "node A did not report its port: \(nodeA.stderr)")
        let nodeB = try TrellisProcess([
            "node", "--data", dir.path("PB"), "--peer", "127.0.0.1:\(port)", "--mesh-key", key, "--subscribe", "cars",
            "--priority", "default",
        ])
        #expect(eventually(timeout: 30) { count(dir.path("PB")) == 30 }, "B: \(nodeB.stderr)")
        let replication: Set<String> = ["trellis.listen", "trellis.read", "trellis.write"]
        func named(_ node: TrellisProcess) -> [String: Set<Int32>] {
            threadNices(node.process.processIdentifier).filter { replication.contains($0.name) }.reduce(into: [:]) {
                $0[$1.name, default: []].insert($1.nice)
            }
        }
        #expect(eventually { named(nodeA).count == 3 && named(nodeB).count == 2 }, "\(named(nodeA)) \(named(nodeB))")
        #expect(named(nodeA) == ["trellis.listen": [10], "trellis.read": [10], "trellis.write": [10]])
        #expect(named(nodeB) == ["trellis.read": [0], "trellis.write": [0]])
        #expect(nodeB.terminate() == 0)
        #expect(nodeA.terminate() == 0)
    }

    @Test func aShellPeerReplicatesAndIsDrivenFromAPipe() throws {
        let key = dir.path("mesh.key")
        _ = try TrellisProcess.run(["keygen", key])
        let a = dir.path("A")
        _ = try TrellisProcess.run(["import", "--data", a, "cars", try writeCars(12)])
        let nodeA = try TrellisProcess([
            "node", "--data", a, "--listen", "127.0.0.1:0", "--mesh-key", key, "--subscribe", "cars",
        ])
        let port = try #require(nodeA.listeningPort())
        let shell = try TrellisProcess([
            "shell", "--data", dir.path("S"), "--peer", "127.0.0.1:\(port)", "--mesh-key", key, "--keep-going",
        ])
        shell.send("subscribe cars Cylinders == 4")
        shell.send("upsert cars {\"_id\": \"mine\", \"Cylinders\": 4, \"Origin\": \"Mars\"}")
        shell.send("upsert cars {not json")
        shell.send("frobnicate")
        #expect(eventually(timeout: 30) { count(a, "Origin == 'Mars'") == 1 })
        // A answers the shell's subscription at background priority, so on a loaded machine its
        // cars may come after the shell's write has reached A: the shell asks once they are in.
        #expect(
            eventually(timeout: 30) { count(dir.path("S"), "Cylinders == 4") == 5 }, "shell: \(shell.stderr)")
        shell.send("count cars Cylinders == 4")
        #expect(eventually { shell.stdout.contains("\n5\n") }, "shell: \(shell.stdout)")  // 4 imported + mine
        #expect(shell.stderr.contains("error: invalid JSON"))
        #expect(shell.stderr.contains("error: unknown command 'frobnicate'"))
        shell.closeInput()
        #expect(shell.wait() == 0)
        nodeA.terminate()
    }

    @Test func importReadsCRLFLinesAndAByteOrderMarkAndNamesBadElements() throws {
        let crlf = dir.path("crlf.jsonl")
        try Data("{\"_id\":\"a\"}\r\n{\"_id\":\"b\"}\r\n".utf8).write(to: URL(fileURLWithPath: crlf))
        let bom = dir.path("bom.json")
        try Data([0xEF, 0xBB, 0xBF] + Array("[{\"_id\":\"c\"}]".utf8)).write(to: URL(fileURLWithPath: bom))
        let bad = dir.path("bad.json")
        try Data("[{\"_id\":\"d\"}, 5]".utf8).write(to: URL(fileURLWithPath: bad))
        let data = dir.path("D")
        #expect(try TrellisProcess.run(["import", "--data", data, "c", crlf]).stdout.contains("imported 2 documents"))
        #expect(try TrellisProcess.run(["import", "--data", data, "c", bom]).stdout.contains("imported 1 document "))
        let r = try TrellisProcess.run(["import", "--data", data, "c", bad, "--all-or-nothing"])
        #expect(r.status == 1 && r.stderr.contains("bad.json element 2 (line 1) is int, not a JSON object"))
        let listed = try TrellisProcess.run(["find", "--data", data, "c", "--count"])
        #expect(listed.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "3")  // the bad file wrote nothing
    }

    @Test func theShellReportsInvalidUTF8InsteadOfRepairingIt() throws {
        let key = dir.path("k2")
        _ = try TrellisProcess.run(["keygen", key])
        let shell = try TrellisProcess([
            "shell", "--data", dir.path("S2"), "--mesh-key", key, "--quiet", "--keep-going",
        ])
        shell.sendBytes([0x67, 0x65, 0x74, 0x20, 0x63, 0x20, 0xFF, 0xFE, 0x0A])  // "get c \xff\xfe\n"
        shell.send("count c")
        shell.closeInput()
        #expect(shell.wait() == 0)
        #expect(shell.stderr.contains("error: line 1 is not valid UTF-8"))
        #expect(shell.stdout.contains("0"))
    }

    /// `--version` prints the version and the protocol; a flag that takes one value given twice
    /// is refused, naming both values, instead of the last one silently winning.
    @Test func versionAndARepeatedDataFlag() throws {
        let version = try TrellisProcess.run(["--version"])
        #expect(version.status == 0)
        #expect(version.stdout == "trellis \(TrellisVersion.current) (protocol \(TrellisVersion.protocolVersion))\n")
        let twice = try TrellisProcess.run(["find", "--data", dir.path("a"), "--data", dir.path("b"), "cars"])
        #expect(twice.status == 2)
        #expect(twice.stderr.hasPrefix("trellis: error: --data is given 2 times"), "\(twice.stderr)")
        #expect(
            !FileManager.default.fileExists(atPath: dir.path("a"))
                && !FileManager.default.fileExists(atPath: dir.path("b")))
    }

    @Test func badCommandLinesGetOneLineErrors() throws {
        let cases: [[String]] = [
            ["frob"], ["node", "--bogus"], ["node", "--data"],
            ["node", "--data", dir.path("x"), "--mesh-key", "/nonexistent"],
            ["import", "--data", dir.path("x"), "cars"], ["find", "--data", dir.path("empty"), "cars"],
        ]
        for args in cases {
            let r = try TrellisProcess.run(args)
            #expect(r.status != 0, "\(args)")
            let lines = r.stderr.split(separator: "\n")
            #expect(lines.count == 1 && lines[0].hasPrefix("trellis: error: "), "\(args): \(r.stderr)")
        }
        // Files that are not what they should be: one line naming the path and the problem.
        let key = dir.path("k")
        _ = try TrellisProcess.run(["keygen", key])
        let file = dir.path("afile")
        #expect(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
        let corrupt = dir.path("corrupt")
        try FileManager.default.createDirectory(atPath: corrupt, withIntermediateDirectories: true)
        #expect(
            FileManager.default.createFile(
                atPath: corrupt + "/store.sqlite", contents: Data((0..<4096).map { UInt8($0 % 251) })))
        let named: [([String], String)] = [
            (["node", "--data", file, "--mesh-key", key], "\(file) exists and is not a directory"),
            (["node", "--data", dir.path("n"), "--mesh-key", dir.url.path], "it is a directory"),
            (["find", "--data", corrupt, "cars"], "is not a Trellis store"),
            (
                ["node", "--data", dir.path("m"), "--mesh-key", key, "--max-peers", "0"],
                "--max-peers needs a number from 1 to 100000, not '0'"
            ),
            (
                ["node", "--data", dir.path("p"), "--mesh-key", key, "--priority", "high"],
                "--priority takes background, utility or default, not 'high'"
            ),
            (["keygen", dir.url.path], "is a directory"),
            (["node", "--data", dir.path("q"), "--mesh-key", key, "--subscribe", "c a =="], "--subscribe query"),
        ]
        for (args, text) in named {
            let r = try TrellisProcess.run(args)
            let lines = r.stderr.split(separator: "\n")
            #expect(r.status != 0 && lines.count == 1 && r.stderr.contains(text), "\(args): \(r.stderr)")
        }
        #expect(!FileManager.default.fileExists(atPath: dir.path("q")))  // nothing created before the error

        let help = try TrellisProcess.run(["node", "--help"])
        #expect(help.status == 0 && help.stdout.contains("--mesh-key FILE"))
    }
}

@Suite struct ExampleTests {
    /// Examples/QuickStart (the README's library example) builds and replicates.
    @Test func quickStartReplicatesBetweenTwoNodes() throws {
        let binary = Repository.trellisBinary.deletingLastPathComponent().appendingPathComponent("QuickStart")
        let process = Process()
        process.executableURL = binary
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        #expect(process.terminationStatus == 0)
        #expect(text.contains("north: 1 car(s) with 8 or more cylinders: [\"mustang\"]"))
        #expect(
            text.contains(
                "south: {\"Cylinders\":4,\"Name\":\"toyota corolla\",\"Origin\":\"Japan\",\"_id\":\"corolla\"}"))
        #expect(!text.contains("mustang\",\"Name\""))  // the American car was not replicated
        #expect(text.contains("south: civic now has 6 cylinders"))
        #expect(text.contains("south live query: 1 updated, 2 Japanese cars"))
    }

    /// Examples/ContactProviderExtension (Apple's template with one import changed) runs its
    /// `@main` provider on the host: its four contacts, in pages of the host's size, land in a
    /// vdir as vCards; a second run with the same state resumes with changes (none).
    @Test func contactProviderExtensionMirrorsItsContacts() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("cpx-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        let vdir = dir.appendingPathComponent("vdir")
        let state = dir.appendingPathComponent("state.json")
        func run(_ arguments: [String]) throws -> (Int32, String, String) {
            try TrellisProcess.run(arguments, binary: Repository.example("ContactProviderExtension"))
        }
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let first = try run(["--vdir", vdir.path, "--state", state.path])
        #expect(first.0 == 0, "\(first.2)")
        #expect(first.1 == "4 contacts in \(vdir.path)\n")
        let files = try FileManager.default.contentsOfDirectory(atPath: vdir.path).filter { $0.hasSuffix(".vcf") }
        #expect(files.sorted() == ["1.vcf", "2.vcf", "3.vcf", "4.vcf"])
        let ada = try String(contentsOf: vdir.appendingPathComponent("1.vcf"), encoding: .utf8)
        #expect(ada.contains("FN:Ada Lovelace\r\n"))
        #expect(ada.contains("TEL;TYPE=cell:+44 20 7946 0001\r\n"))
        #expect(ada.contains("EMAIL;TYPE=home:ada@example.com\r\n"))
        let saved = try JSONSerialization.jsonObject(with: Data(contentsOf: state)) as? [String: Any]
        #expect(saved?["enumeratingContent"] as? Bool == false)
        let second = try run(["--vdir", vdir.path, "--state", state.path])
        #expect(second.0 == 0 && second.1 == "4 contacts in \(vdir.path)\n", "\(second.2)")
        let bad = try run(["--watch", "soon"])
        #expect(bad.0 == 2)
        #expect(bad.2.contains("--watch takes a positive number of seconds, not 'soon'"))
    }
}
