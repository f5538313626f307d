import Foundation
import Testing
import Trellis
import TrellisCore
import TrellisNet
import TrellisTestKit

/// The wire protocol against a peer written from docs/PROTOCOL.md alone (scripts/sync_peer.py, on
/// PyPI's `noiseprotocol` and `cbor2`, which scripts/test.sh installs): if the document is not
/// enough to write such a peer, this test is where it shows.
@Suite struct IndependentPeerTests {
    let dir = TemporaryDirectory("trellis-independent-peer")

    /// A real node holding three documents (two in the single-write form, one in the whole-state
    /// form) and subscribed to their collection: the Python peer completes the handshake, sends
    /// `hello` and `subs`, decodes the three, acknowledges them, writes one document back, and
    /// sees the node's `ack`; the node holds that document afterwards.
    @Test func aPeerWrittenFromTheProtocolDocumentSyncsBothWays() throws {
        let meshKey = MeshKey.generate()
        let keyFile = dir.url.appendingPathComponent("mesh.key")
        try meshKey.write(to: keyFile)
        let node = try TrellisNode(directory: dir.url.appendingPathComponent("node"), meshKey: meshKey)
        defer { node.close() }
        let items = node.store.collection("items")
        _ = try items.upsert(["_id": "a", "v": 1])
        _ = try items.upsert(["_id": "b", "tags": ["x", 2], "m": ["k": true]])
        _ = try items.upsert(["_id": "c", "n": 2.5])
        // A second write to "c" makes its state more than one write: it travels as a whole state.
        _ = try items.upsert(["_id": "c", "w": "second", "m": ["k": false]])
        let subscription = try items.findAll().subscribe()
        defer { subscription.cancel() }
        let port = try node.listen(on: Endpoint(host: "127.0.0.1", port: 0))

        let process = Process()
        let python = Repository.python.split(separator: " ").map(String.init)
        process.executableURL = URL(fileURLWithPath: python[0])
        process.arguments =
            Array(python.dropFirst()) + [
                Repository.root.appendingPathComponent("scripts/sync_peer.py").path,
                "--port", String(port), "--mesh-key", keyFile.path, "--collection", "items",
                "--write-id", "from-python", "--timeout", "60",
            ]
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        defer { if process.isRunning { process.terminate() } }
        let stdout = output.fileHandleForReading.readDataToEndOfFile()
        let stderr = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        let lines = String(decoding: stdout, as: UTF8.self).split(separator: "\n")
        print("sync_peer.py:\n\(lines.joined(separator: "\n"))\n\(stderr)")
        #expect(
            process.terminationStatus == 0,
            "sync_peer.py exited \(process.terminationStatus) (3: run scripts/setup.sh noiseprotocol cbor2): \(stderr)")

        let events = try lines.map {
            try #require(JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])
        }
        var received: [String: [String: Any]] = [:]
        for event in events where event["event"] as? String == "document" {
            let id = try #require(event["id"] as? String)
            received[id] = event
        }
        #expect(Set(received.keys) == ["a", "b", "c"])
        #expect(received["a"]?["form"] as? String == "single")
        #expect(received["c"]?["form"] as? String == "state")
        let c = try #require(received["c"]?["doc"] as? [String: Any])
        #expect(c["_id"] as? String == "c")
        #expect(c["n"] as? Double == 2.5)
        #expect(c["w"] as? String == "second")
        #expect((c["m"] as? [String: Any])?["k"] as? Bool == false)
        let b = try #require(received["b"]?["doc"] as? [String: Any])
        #expect(b["tags"] as? [AnyHashable] == ["x", 2])
        #expect(events.contains { $0["event"] as? String == "ack" })

        // The document the peer wrote is merged in the node's store.
        let written = try #require(try items.findByID("from-python").exec())
        #expect(written["from"] == "sync_peer")
    }
}
