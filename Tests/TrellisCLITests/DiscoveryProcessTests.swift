import Foundation
import Testing
import TrellisTestKit

/// Real `trellis` processes that know no peer address: they find each other by LAN discovery
/// confined to loopback (`--discovery-loopback`, beacons to 127.255.255.255 only) and form a mesh.
@Suite(.serialized) struct DiscoveryProcessTests {
    let dir = TemporaryDirectory("trellis-discovery")

    func count(_ data: String) -> Int? { findCount(data, "cars") }

    @Test func threeNodesFindEachOtherAndReplicateWithoutPeerAddresses() throws {
        let key = dir.path("mesh.key")
        #expect(try TrellisProcess.run(["keygen", key]).status == 0)
        let port = try TrellisProcess.freePort()
        func start(_ name: String, _ command: String = "node") throws -> TrellisProcess {
            try TrellisProcess([
                command, "--data", dir.path(name), "--mesh-key", key, "--discovery-loopback", "--discovery-port",
                "\(port)", "--subscribe", "cars",
            ])
        }
        // A shell writes; two headless nodes receive. None is told where another listens (each
        // listens on 127.0.0.1:4040, or a free port when that is taken, and says so in its beacons).
        let a = try TrellisProcess([
            "shell", "--data", dir.path("A"), "--mesh-key", key, "--discovery-loopback", "--discovery-port", "\(port)",
        ])
        a.send("subscribe cars")
        let b = try start("B")
        let c = try start("C")
        let nodes = [("A", a), ("B", b), ("C", c)]
        for (name, node) in nodes {
            #expect(
                eventually(timeout: 30) { node.stderr.components(separatedBy: "discovered peer").count - 1 >= 2 },
                "\(name) did not discover both others: \(node.stderr)")
        }
        let listed = try #require(a.ask("discovered"), "A's shell did not answer: \(a.stderr)")
        #expect(listed.split(separator: "\n").filter { $0.contains("127.0.0.1:") }.count == 2, "\(listed)")
        // At most one got port 4040; the others fell back to free ports, and beacons carried them.
        let ports = nodes.compactMap { (_, node) in node.listeningPort() }
        #expect(Set(ports).count == 3 && ports.filter { $0 == 4040 }.count <= 1, "ports \(ports)")
        a.send(#"upsert cars {"_id": "c1", "Name": "found by beacon"}"#)
        #expect(eventually(timeout: 30) { count(dir.path("B")) == 1 }, "B: \(b.stderr)")
        #expect(eventually(timeout: 30) { count(dir.path("C")) == 1 }, "C: \(c.stderr)")
        // Full mesh: every node has a session with both others (not only through a hub).
        for (name, node) in nodes {
            let peers = Set(
                node.stderr.split(separator: "\n").compactMap { line -> String? in
                    guard let range = line.range(of: "session established with ") else { return nil }
                    return line[range.upperBound...].components(separatedBy: "(peer ").last
                })
            #expect(peers.count >= 2, "\(name) has sessions with \(peers): \(node.stderr)")
        }
        for (_, node) in nodes { node.closeInput() }
        #expect(b.terminate() == 0)
        #expect(c.terminate() == 0)
        #expect(a.wait() == 0)
    }

    @Test func noDiscoveryAndBadDiscoveryFlagsAreExplained() throws {
        let key = dir.path("mesh.key")
        _ = try TrellisProcess.run(["keygen", key])
        let both = try TrellisProcess.run([
            "node", "--data", dir.path("x"), "--mesh-key", key, "--no-discovery", "--discovery-loopback",
        ])
        #expect(both.status != 0 && both.stderr.contains("--no-discovery cannot be combined"))
        let badPort = try TrellisProcess.run([
            "node", "--data", dir.path("y"), "--mesh-key", key, "--discovery-loopback", "--discovery-port", "0",
        ])
        #expect(badPort.status != 0 && badPort.stderr.contains("--discovery-port needs a port from 1 to 65535"))
        let help = try TrellisProcess.run(["node", "--help"])
        #expect(help.stdout.contains("--discovery-loopback") && help.stdout.contains("--no-discovery"))
    }
}
