import Foundation
import Testing
import TrellisTestKit

/// Admission with real `trellis` processes on loopback: `--admission tofu`, `--name`, and the
/// shell's `peers --pending`, `trust` and `distrust` (docs/SECURITY.md, "Admission").
@Suite(.serialized) struct AdmissionProcessTests {
    let dir = TemporaryDirectory("trellis-admission-cli")

    func count(_ data: String) -> Int? { findCount(data, "c") }

    /// The 64-hex-digit key that follows `prefix` in `text`, if any.
    func key(after prefix: String, in text: String) -> String? {
        guard let range = text.range(of: prefix) else { return nil }
        let digits = text[range.upperBound...].prefix(64)
        return digits.count == 64 && digits.allSatisfy(\.isHexDigit) ? String(digits) : nil
    }

    /// A pins "laptop" to B's key; C presenting "laptop" is refused and waits as pending; `trust`
    /// re-pins the name to C, and `distrust` forgets it and closes C's session.
    @Test func trustOnFirstUseWithTheShellsTrustAndDistrust() throws {
        let meshKey = dir.path("mesh.key")
        #expect(try TrellisProcess.run(["keygen", meshKey]).status == 0)
        let a = try TrellisProcess([
            "shell", "--data", dir.path("A"), "--listen", "127.0.0.1:0", "--mesh-key", meshKey, "--admission", "tofu",
            "--name", "hub", "--keep-going",
        ])
        let port = try #require(a.listeningPort(), "A did not report its port: \(a.stderr)")
        a.send(#"upsert c {"_id": "x"}"#)
        func peer(_ data: String) throws -> TrellisProcess {
            try TrellisProcess([
                "node", "--data", dir.path(data), "--peer", "127.0.0.1:\(port)", "--mesh-key", meshKey, "--name",
                "laptop", "--subscribe", "c",
            ])
        }
        let b = try peer("B")
        #expect(
            eventually(timeout: 30) { a.stderr.contains("pinned device name \"laptop\" to peer key") }, "\(a.stderr)")
        let bKey = try #require(key(after: "pinned device name \"laptop\" to peer key ", in: a.stderr))
        #expect(eventually(timeout: 30) { b.stderr.contains("session established") })
        #expect(b.terminate() == 0)
        let pins = try String(contentsOfFile: dir.path("A/known-peers"), encoding: .utf8)
        #expect(pins.contains("\(bKey) laptop\n"))

        // C presents "laptop" with another key: refused, with both keys, and parked as pending.
        let c = try peer("C")
        #expect(eventually(timeout: 30) { a.stderr.contains("pinned to key \(bKey)") }, "\(a.stderr)")
        let cKey = try #require(key(after: "refused peer ", in: a.stderr))
        #expect(cKey != bKey)
        #expect(a.stderr.contains("`trust \(cKey)`") && a.stderr.contains("distrust laptop"))
        #expect(
            eventually(timeout: 30) {
                a.send("peers --pending")
                a.waitForOutput(timeout: 1)
                return a.stdout.contains("\(cKey) \"laptop\" 127.0.0.1:") && a.stdout.contains("waiting for `trust`")
            }, "\(a.stdout)")

        // `trust KEY` re-pins "laptop" to C; C gets the document.
        a.send("trust \(cKey)")
        #expect(eventually { a.stdout.contains("pinned \"laptop\" to \(cKey)") }, "\(a.stdout)")
        #expect(eventually(timeout: 60) { count(dir.path("C")) == 1 }, "\(c.stderr)")
        #expect(try String(contentsOfFile: dir.path("A/known-peers"), encoding: .utf8).contains("\(cKey) laptop\n"))

        // `distrust laptop` forgets the pin and closes C's session.
        a.send("distrust laptop")
        #expect(eventually { a.stdout.contains("forgot the pins of \(cKey)") && a.stdout.contains("closed 1 session") })
        #expect(!(try String(contentsOfFile: dir.path("A/known-peers"), encoding: .utf8).contains(cKey)))
        #expect(c.terminate() == 0)
        a.send("trust nobody")
        #expect(eventually { a.stderr.contains("error: no pinned, waiting or recently seen peer is named \"nobody\"") })
        a.closeInput()
        #expect(a.wait() == 0)
    }

    @Test func admissionFlagsAreChecked() throws {
        let meshKey = dir.path("mesh.key")
        #expect(try TrellisProcess.run(["keygen", meshKey]).status == 0)
        for (flags, message) in [
            (["--admission", "open"], "--admission takes any, allowlist or tofu, not 'open'"),
            (["--admission", "tofu", "--allow-peer", String(repeating: "ab", count: 32)], "cannot be combined"),
            (["--name", String(repeating: "n", count: 65)], "--name: a device name is at most 64 bytes"),
        ] {
            let r = try TrellisProcess.run(["node", "--data", dir.path("X"), "--mesh-key", meshKey] + flags)
            #expect(r.status != 0 && r.stderr.contains(message), "\(flags): \(r.stderr)")
        }
    }
}
