import Foundation
import Testing
import TrellisTestKit

/// A script driving `trellis shell` through a pipe can rely on it: the first error ends it with
/// exit status 1 (`--keep-going` runs on), the events already due are printed before it exits,
/// and command output and events come in order, in whole lines.
extension ShellCommandTests {
    /// As sqlite3's: a failed command is reported and the shell goes on; the status says so.
    @Test func aPipedShellGoesOnAfterAnErrorAndExitsWithStatusOne() throws {
        let r = try shell([#"upsert c {"_id": "a"}"#, "bogus", "get c a"])
        #expect(r.status == 1)
        #expect(r.stdout == [#""a""#, #"{"_id":"a"}"#], "the line after the error ran")
        #expect(r.stderr == ["error: unknown command 'bogus'; type `help`"])

        let key = dir.path("mesh.key")
        let invalid = try TrellisProcess(["shell", "--data", dir.path("U"), "--mesh-key", key, "--quiet"])
        invalid.sendBytes([0x67, 0x65, 0x74, 0x20, 0xFF, 0x0A])  // "get \xff\n"
        invalid.send("count c")
        invalid.closeInput()
        #expect(invalid.wait() == 1)
        #expect(invalid.stderr == "error: line 1 is not valid UTF-8; ignored\n")
        #expect(invalid.stdout == "0\n")
    }

    /// SIGTERM stops a shell as the end of its input does (its control socket goes, its store is
    /// closed), with status 143; what it wrote is kept.
    @Test func sigtermStopsAShellCleanlyWithStatus143() throws {
        let data = dir.path("T")
        _ = try shell(["count c"])  // makes the suite's mesh key
        let shell = try TrellisProcess(["shell", "--data", data, "--mesh-key", dir.path("mesh.key"), "--quiet"])
        shell.send(#"upsert c {"_id": "kept"}"#)
        #expect(eventually { shell.stdout.contains(#""kept""#) })
        #expect(FileManager.default.fileExists(atPath: data + "/control.sock"))
        #expect(shell.terminate() == 143)
        #expect(!FileManager.default.fileExists(atPath: data + "/control.sock"))
        let get = try TrellisProcess.run(["get", "--data", data, "c", "kept"])
        #expect(get.status == 0 && get.stdout == #"{"_id":"kept"}"# + "\n")
    }

    /// `--bail`, as `sh -e` and `sqlite3 -bail`: the first error ends the shell, status 1.
    @Test func bailStopsAtTheFirstErrorWithStatusOne() throws {
        let r = try shell([#"upsert c {"_id": "a"}"#, "bogus", "get c a"], flags: ["--bail"])
        #expect(r.status == 1)
        #expect(r.stdout == [#""a""#], "the line after the error did not run")
        #expect(r.stderr == ["error: unknown command 'bogus'; type `help`"])

        let key = dir.path("mesh.key")
        let invalid = try TrellisProcess(["shell", "--data", dir.path("V"), "--mesh-key", key, "--quiet", "--bail"])
        invalid.sendBytes([0x67, 0x65, 0x74, 0x20, 0xFF, 0x0A])  // "get \xff\n"
        invalid.send("count c")
        invalid.closeInput()
        #expect(invalid.wait() == 1)
        #expect(invalid.stderr == "error: line 1 is not valid UTF-8\n")
        #expect(invalid.stdout.isEmpty)
        let both = try TrellisProcess.run(
            ["shell", "--data", dir.path("W"), "--mesh-key", key, "--bail", "--keep-going"])
        #expect(both.status == 2 && both.stderr.contains("contradict"), "\(both.stderr)")
    }

    @Test func keepGoingRunsEveryLineAndExitsZero() throws {
        let r = try shell([#"upsert c {"_id": "a"}"#, "bogus", "get c a", "find c a =="], flags: ["--keep-going"])
        #expect(r.status == 0)
        #expect(r.stdout == [#""a""#, #"{"_id":"a"}"#])
        #expect(r.stderr.count == 2 && r.stderr.allSatisfy { $0.hasPrefix("error: ") }, "\(r.stderr)")
        let node = try TrellisProcess.run(["node", "--data", dir.path("N"), "--mesh-key", "k", "--keep-going"])
        #expect(node.status == 2 && node.stderr.contains("--keep-going is for `trellis shell`"), "\(node.stderr)")
    }

    @Test func eventsAlreadyDueArePrintedBeforeTheShellExits() throws {
        let initial = try shell(["observe c"], data: "E1")
        #expect(initial.status == 0)
        #expect(initial.stdout == ["observe c true: initial 0"])
        let update = try shell(["observe-id c z", #"upsert c {"_id": "z"}"#], data: "E2")
        #expect(
            update.stdout == [
                #"observe-id c "z": initial null"#, #""z""#, #"observe-id c "z": update {"_id":"z"} was null"#,
            ])
    }

    /// Each command's output comes whole, then the events it caused, then the next command's
    /// output: the same script prints the same lines every time.
    @Test func commandOutputAndEventsComeInOrder() throws {
        let count = 25
        var script = ["observe c true sort n"]
        var expected = ["observe c true sort n: initial 0"]
        for n in 0..<count {
            script.append(#"upsert c {"_id": "z\#(n)", "n": \#(n)}"#)
            script.append("count c")
            expected += [
                #""z\#(n)""#, "observe c true sort n: update \(n + 1)",
                #"  inserted \#(n) {"_id":"z\#(n)","n":\#(n)}"#, "\(n + 1)",
            ]
        }
        script.append("find c n < 2")
        expected += [#"{"_id":"z0","n":0}"#, #"{"_id":"z1","n":1}"#]
        let r = try shell(script, data: "O")
        #expect(r.status == 0 && r.stderr.isEmpty, "\(r.stderr)")
        #expect(r.stdout == expected, "\(r.stdout)")
    }
}
