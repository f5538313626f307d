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
        let (node, keyFile) = try makeNode()
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

        let (status, events, stderr) = try runPeer(port: port, keyFile: keyFile, writeID: "from-python")
        #expect(status == 0, "sync_peer.py exited \(status) (3: run scripts/setup.sh noiseprotocol cbor2): \(stderr)")
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

    /// Caught-up batches (docs/PROTOCOL.md §2 step 5) both ways, with a peer that says `f: 1`: the
    /// node holds nothing of the collection, so its answer to the peer's subscription is a
    /// caught-up batch; the peer's log is empty, so it answers the node's subscription with one.
    /// Neither is acknowledged, and the peer's write then flows and is.
    @Test func aPeerThatSaysItReadsCaughtUpBatchesGetsOneAndSendsOne() throws {
        let (node, keyFile) = try makeNode()
        defer { node.close() }
        let items = node.store.collection("items")
        let subscription = try items.findAll().subscribe()
        defer { subscription.cancel() }
        let port = try node.listen(on: Endpoint(host: "127.0.0.1", port: 0))

        let (status, events, stderr) = try runPeer(
            port: port, keyFile: keyFile, writeID: "after-caught-up", options: ["--caught-up"])
        #expect(status == 0, "sync_peer.py exited \(status) (3: run scripts/setup.sh noiseprotocol cbor2): \(stderr)")
        let caughtUp = events.filter { $0["event"] as? String == "caughtUp" }
        #expect(
            caughtUp.map { $0["sent"] as? Bool } == [true, false]
                || caughtUp.map { $0["sent"] as? Bool } == [false, true])
        #expect(!events.contains { $0["event"] as? String == "batch" })
        #expect(!events.contains { $0["event"] as? String == "other-ack" }, "the node acknowledged a caught-up batch")
        #expect(events.contains { $0["event"] as? String == "ack" })
        #expect(try items.findByID("after-caught-up").exec()?["from"] == "sync_peer")
    }

    /// States beyond single writes, decoded by the peer from the protocol document and
    /// docs/DATA-MODEL.md alone, show what the node shows: a removed field, counters (a restart
    /// under later increments, a double total), default data (time zero), a field removed inside
    /// a map, and a removed document (a tombstone, which does not exist).
    @Test func statesOfSeveralWritesDecodeAsTheNodeShowsThem() throws {
        let (node, keyFile) = try makeNode()
        defer { node.close() }
        let items = node.store.collection("items")
        _ = try items.upsert(["_id": "k", "keep": 1, "gone": "x", "o": ["a": 1, "b": 2]])
        let edits: [(MutableDocument) -> Void] = [
            { $0["n"].increment(by: 3) }, { $0["n"].increment(by: 4) }, { $0["gone"].remove() },
            { $0["c"].increment(by: 1) }, { $0["c"].set(5) }, { $0["c"].increment(by: 2) },
            { $0["d"].increment(by: 1) }, { $0["d"].increment(by: 0.5) },
            { $0["theme"].set("light", isDefault: true) }, { $0["o"]["b"].remove() },
        ]
        for edit in edits { _ = try items.findByID("k").update { if let doc = $0 { edit(doc) } } }
        _ = try items.upsert(["_id": "r", "v": 1])
        #expect(try items.findByID("r").remove())
        let subscription = try items.findAll().subscribe()
        defer { subscription.cancel() }
        let port = try node.listen(on: Endpoint(host: "127.0.0.1", port: 0))

        let (status, events, stderr) = try runPeer(port: port, keyFile: keyFile, writeID: "w")
        #expect(status == 0, "sync_peer.py exited \(status) (3: run scripts/setup.sh noiseprotocol cbor2): \(stderr)")
        let documents = events.filter { $0["event"] as? String == "document" }
        let k = try #require(documents.first { $0["id"] as? String == "k" })
        let shown = try #require(try items.findByID("k").exec())
        let expected = try JSONSerialization.jsonObject(with: Data(JSON.string(shown.value).utf8)) as? NSDictionary
        #expect(k["form"] as? String == "state")
        #expect(k["doc"] as? NSDictionary == expected, "the node shows \(JSON.string(shown.value))")
        #expect((k["doc"] as? [String: Any])?["c"] as? Int == 7)
        let r = try #require(documents.first { $0["id"] as? String == "r" })
        #expect(r["exists"] as? Bool == false)
        #expect(try items.findByID("w").exec() != nil)
    }

    /// A node (no discovery, not yet listening) and its mesh key written to a file as
    /// `trellis keygen` writes one.
    func makeNode() throws -> (TrellisNode, URL) {
        let meshKey = MeshKey.generate()
        let keyFile = dir.url.appendingPathComponent("mesh.key")
        try meshKey.write(to: keyFile)
        return (try TrellisNode(directory: dir.url.appendingPathComponent("node"), meshKey: meshKey), keyFile)
    }

    /// Runs scripts/sync_peer.py against the node on `port` until it exits.
    ///
    /// - Returns: its exit status, the JSON objects it printed (one a line), and its standard error.
    func runPeer(port: UInt16, keyFile: URL, writeID: String, options: [String] = []) throws
        -> (Int32, [[String: Any]], String)
    {
        let process = pythonScript(
            "sync_peer.py",
            [
                "--port", String(port), "--mesh-key", keyFile.path, "--collection", "items", "--write-id", writeID,
                "--timeout", "60",
            ] + options)
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

        let events = try lines.map {
            try #require(JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])
        }
        return (process.terminationStatus, events, stderr)
    }
}
