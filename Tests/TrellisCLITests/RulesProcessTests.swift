import Foundation
import Testing
import TrellisTestKit

/// Authorization rules with real `trellis` processes on loopback: `--rules FILE`, the shell's
/// `rules` and `rules FILE`, and malformed rules files (docs/SECURITY.md, "Authorization").
@Suite(.serialized) struct RulesProcessTests {
    let dir = TemporaryDirectory("trellis-rules-cli")

    func write(_ text: String, to name: String, mode: mode_t = 0o600) throws -> String {
        let path = dir.path(name)
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        chmod(path, mode)
        return path
    }

    /// A serves `notes` but not `secrets` under its rules file; B subscribes to both and gets
    /// only `notes` (and the error); `rules FILE` in A's shell lifts the rule at run time and B
    /// gets `secrets` over the same session.
    @Test func aRulesFileForbidsACollectionAndTheShellReplacesItAtRunTime() throws {
        let meshKey = dir.path("mesh.key")
        #expect(try TrellisProcess.run(["keygen", meshKey]).status == 0)
        let closed = try write(
            #"{"rules": {"*": {"default": "read-write", "collections": {"secrets": "none"}}}}"#, to: "closed.json")
        let open = try write(#"{"rules": {"*": {"default": "read-write"}}}"#, to: "open.json", mode: 0o644)
        let a = try TrellisProcess([
            "shell", "--data", dir.path("A"), "--listen", "127.0.0.1:0", "--no-discovery", "--mesh-key", meshKey,
            "--rules", closed, "--keep-going",
        ])
        let port = try #require(a.listeningPort(), "A did not report its port: \(a.stderr)")
        a.send(#"upsert notes {"_id": "n1"}"#)
        a.send(#"upsert secrets {"_id": "s1", "pin": 1234}"#)
        let b = try TrellisProcess([
            "node", "--data", dir.path("B"), "--peer", "127.0.0.1:\(port)", "--no-discovery", "--mesh-key", meshKey,
            "--subscribe", "notes", "--subscribe", "secrets",
        ])
        #expect(eventually(timeout: 60) { findCount(dir.path("B"), "notes") == 1 }, "\(b.stderr)")
        #expect(
            eventually(timeout: 30) { b.stderr.contains("cannot serve subscription 'secrets: true': forbidden") },
            "\(b.stderr)")
        #expect(findCount(dir.path("B"), "secrets") == 0)
        a.send("rules")
        #expect(
            eventually {
                a.stdout.contains("any peer: read-write by default, 'secrets' none")
                    && a.stdout.contains("refused: 1 subscription(s)")
            }, "\(a.stdout)")
        #expect(a.stderr.contains("refused subscription 'secrets: true'"))

        a.send("rules \(open)")
        #expect(eventually { a.stdout.contains("rules replaced from \(open)") }, "\(a.stdout)")
        #expect(eventually { a.stdout.contains("every admitted peer may read and write every collection") })
        #expect(eventually(timeout: 60) { findCount(dir.path("B"), "secrets") == 1 }, "\(b.stderr)")
        #expect(!b.stderr.contains("session with"))  // the session never ended

        a.send("rules \(dir.path("missing.json"))")
        #expect(eventually { a.stderr.contains("error: rules file \(dir.path("missing.json")): No such file") })
        #expect(b.terminate() == 0)
        a.closeInput()
        #expect(a.wait() == 0)
    }

    /// A malformed or unsafe rules file stops the node at start with one line naming the file and
    /// the problem.
    @Test func aMalformedRulesFileIsRefusedWithItsProblemNamed() throws {
        let meshKey = dir.path("mesh.key")
        #expect(try TrellisProcess.run(["keygen", meshKey]).status == 0)
        let cases: [(String, mode_t, String)] = [
            (#"{"rules": {"*": {"default": "rw"}}}"#, 0o600, #"rules."*".default is "rw"; expected"#),
            (#"{"rules": {"family": {"default": "read"}}}"#, 0o600, #"rules."family" names no group"#),
            (#"{"rules": "#, 0o600, "not JSON"),
            (#"{"rules": {"*": {"default": "read"}}}"#, 0o666, "group or others may change it"),
        ]
        for (index, (text, mode, message)) in cases.enumerated() {
            let file = try write(text, to: "bad\(index).json", mode: mode)
            let r = try TrellisProcess.run([
                "node", "--data", dir.path("X"), "--no-discovery", "--mesh-key", meshKey, "--rules", file,
            ])
            #expect(r.status != 0 && r.stderr.contains("--rules: rules file \(file)"), "\(text): \(r.stderr)")
            #expect(r.stderr.contains(message), "\(text): \(r.stderr)")
        }
    }
}
