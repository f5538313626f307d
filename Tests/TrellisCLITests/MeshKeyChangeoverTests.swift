import Foundation
import Testing
import TrellisTestKit

/// A mesh-key changeover with real `trellis` processes on loopback: `--next-mesh-key` and the
/// shell's `promote-key` (docs/SECURITY.md, "Changing the mesh key").
@Suite(.serialized) struct MeshKeyChangeoverTests {
    let dir = TemporaryDirectory("trellis-changeover")

    func count(_ data: String) -> Int? { findCount(data, "c") }

    /// A holds K1 and next K2; B holds only K2 and C only K1: both get A's document. After
    /// `promote-key` on A, a node holding only K1 is refused and told why.
    @Test func bothKeysAreAcceptedUntilPromotion() throws {
        let k1 = dir.path("k1")
        let k2 = dir.path("k2")
        #expect(try TrellisProcess.run(["keygen", k1]).status == 0)
        #expect(try TrellisProcess.run(["keygen", k2]).status == 0)
        let a = try TrellisProcess([
            "shell", "--data", dir.path("A"), "--listen", "127.0.0.1:0", "--mesh-key", k1, "--next-mesh-key", k2,
            "--keep-going",
        ])
        let port = try #require(a.listeningPort(), "A did not report its port: \(a.stderr)")
        a.send(#"upsert c {"_id": "x"}"#)
        var peers: [TrellisProcess] = []
        for (name, key) in [("B", k2), ("C", k1)] {
            peers.append(
                try TrellisProcess([
                    "node", "--data", dir.path(name), "--peer", "127.0.0.1:\(port)", "--mesh-key", key, "--subscribe",
                    "c",
                ]))
        }
        #expect(eventually(timeout: 30) { peers.allSatisfy { $0.stderr.contains("session established") } })
        // The document follows the session: wait for it (`find` reads beside a running node).
        #expect(eventually(timeout: 30) { count(dir.path("B")) == 1 && count(dir.path("C")) == 1 })
        for peer in peers { #expect(peer.terminate() == 0) }
        #expect(a.stderr.contains("proved the next mesh key"))

        a.send("promote-key")
        #expect(eventually { a.stdout.contains("the next mesh key is now the current one") })
        let late = try TrellisProcess([
            "node", "--data", dir.path("D"), "--peer", "127.0.0.1:\(port)", "--mesh-key", k1,
        ])
        #expect(eventually(timeout: 30) { late.stderr.contains("it holds another mesh key") }, "D: \(late.stderr)")
        #expect(late.terminate() == 0)
        a.send("status")
        #expect(eventually { a.stdout.contains("1 under another mesh key or protocol") }, "A: \(a.stdout)")
        a.send("promote-key")
        #expect(eventually { a.stderr.contains("error: no next mesh key to promote") })
        a.closeInput()
        #expect(a.wait() == 0)
    }
}
