import Foundation
import Testing
import TrellisTestKit

/// The programs under Examples/ (built by `swift build`) run as their READMEs say, in their
/// non-interactive modes, on loopback only (none of them runs LAN discovery).
extension ExampleTests {
    /// The lines printed after `-- NAME's room (N messages):`, up to the next `--` line.
    static func room(_ name: String, in text: String) -> [String] {
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        guard let start = lines.firstIndex(where: { $0.hasPrefix("-- \(name)'s room") }) else { return [] }
        return Array(lines[(start + 1)...].prefix { $0.hasPrefix("   ") }).map { String($0.dropFirst(3)) }
    }

    @Test("ChatRoom --demo: three members, one offline for a while, end with the same conversation")
    func chatRoomDemo() throws {
        let run = try TrellisProcess.run(["--demo"], timeout: 120, binary: Repository.example("ChatRoom"))
        #expect(run.status == 0, "\(run.stdout)\n\(run.stderr)")
        let expected = [
            "alice: hi all, the mesh is up", "bob: hello alice", "carol: hi both, I'm going into a tunnel",
            "alice: carol went quiet", "bob: she will catch up: the mesh keeps what she missed",
            "carol: writing this in the tunnel", "carol: back: I see what you said while I was away",
        ]
        for name in ["alice", "bob", "carol"] {
            #expect(Self.room(name, in: run.stdout) == expected, "\(name): \(run.stdout)")
        }
        // Carol's live query showed what she missed when she came back, sorted before her own
        // message from the tunnel.
        #expect(run.stdout.contains("[carol sees] alice: carol went quiet   (written earlier, arrived late)"))
        #expect(!run.stdout.contains("[alice sees] alice: carol went quiet   (written earlier"))
        #expect(run.stdout.contains("all 3 members show the same 7 messages in the same order"))
    }

    @Test("ChatRoom: two processes, one listening and one joining, see each other's lines")
    func chatRoomTwoProcesses() throws {
        let dir = TemporaryDirectory("trellis-chatroom")
        let binary = Repository.example("ChatRoom")
        let key = dir.path("room.key")
        let alice = try TrellisProcess(
            ["--name", "alice", "--listen", "127.0.0.1:0", "--key", key, "--data", dir.path("alice")], binary: binary)
        #expect(eventually { alice.stdout.contains("listening on 127.0.0.1:") }, "alice: \(alice.stderr)")
        let port = try #require(
            alice.stdout.split(separator: "\n").first { $0.hasPrefix("listening on") }?.split(separator: ":").last)
        // alice created the key file; bob reads the same one.
        #expect(alice.stdout.contains("created the room's mesh key in \(key)"))
        let bob = try TrellisProcess(
            ["--name", "bob", "--join", "127.0.0.1:\(port)", "--key", key, "--data", dir.path("bob")], binary: binary)
        #expect(eventually { bob.stdout.contains("bob in the room") }, "bob: \(bob.stderr)")
        bob.send("hi alice, bob here")
        #expect(eventually { alice.stdout.contains(" bob: hi alice, bob here") }, "alice: \(alice.stdout)")
        alice.send("hello bob")
        #expect(eventually { bob.stdout.contains(" alice: hello bob") }, "bob: \(bob.stdout)")
        alice.send("/quit")
        bob.closeInput()
        #expect(alice.wait() == 0, "alice: \(alice.stderr)")
        #expect(bob.wait() == 0, "bob: \(bob.stderr)")
    }

    /// The plain frames of an Inventory run (`--- frame N` blocks), in order.
    static func frames(_ text: String) -> [String] {
        text.components(separatedBy: "--- frame ").dropFirst().map { String($0) }
    }

    @Test("Inventory --script: the table follows the other node's changes and the filter")
    func inventoryScript() throws {
        let run = try TrellisProcess.run(["--script"], timeout: 120, binary: Repository.example("Inventory"))
        #expect(run.status == 0, "\(run.stdout)\n\(run.stderr)")
        #expect(!run.stdout.contains("\u{1B}"), "plain text without escapes when not on a terminal")
        let frames = Self.frames(run.stdout)
        try #require(frames.count >= 6, "\(run.stdout)")
        #expect(frames[0].contains("20 cars where true") && frames[0].contains("Europe 6   Japan 6   USA 8"))
        #expect(frames[0].contains("  4425   225     8    14  USA     pontiac catalina"))
        // Each change shows in the frame drawn before the next change is made.
        func frame(after action: String) -> String {
            guard let range = run.stdout.range(of: action) else { return "" }
            return Self.frames(String(run.stdout[range.upperBound...])).first ?? ""
        }
        let arrival = frame(after: "lot: a new arrival, heavier than all: gmc suburban, 4725 lbs")
        #expect(arrival.contains(" *   4725   210     8     -  USA     gmc suburban"), "\(arrival)")
        #expect(arrival.contains("21 cars where true") && arrival.contains("USA 9"))
        let sale = frame(after: "lot: sold the pontiac catalina")
        #expect(!sale.contains("pontiac catalina") && sale.contains("20 cars where true"), "\(sale)")
        let weighed = frame(after: "lot: weighed the datsun 1200 again with its trailer: 4525 lbs")
        #expect(weighed.contains(" *   4525    69     4    35  Japan   datsun 1200"), "\(weighed)")
        #expect(weighed.contains("0 in, 0 out, 1 updated, 1 moved"))
        let filtered = frame(after: "office: / Origin == 'Japan'")
        #expect(filtered.contains("6 cars where Origin == 'Japan'") && !filtered.contains("USA"), "\(filtered)")
        let last = try #require(frames.last)
        #expect(last.contains("7 cars where Origin == 'Japan'"))
        #expect(last.contains(" *   4500   125     6     -  Japan   toyota land cruiser"), "\(last)")
    }

    @Test("Inventory --cars FILE reads vega_datasets' cars.json shape (no _id, nulls)")
    func inventoryCarsFile() throws {
        let dir = TemporaryDirectory("trellis-inventory")
        let file = dir.path("cars.json")
        try #"""
        [{"Name":"chevrolet chevelle malibu","Miles_per_Gallon":18,"Cylinders":8,"Displacement":307,"Horsepower":130,"Weight_in_lbs":3504,"Acceleration":12,"Year":"1970-01-01","Origin":"USA"},
         {"Name":"ford pinto","Miles_per_Gallon":25,"Cylinders":4,"Displacement":98,"Horsepower":null,"Weight_in_lbs":2046,"Acceleration":19,"Year":"1971-01-01","Origin":"USA"},
         {"Name":"datsun pl510","Miles_per_Gallon":27,"Cylinders":4,"Displacement":97,"Horsepower":88,"Weight_in_lbs":2130,"Acceleration":14.5,"Year":"1970-01-01","Origin":"Japan"},
         {"Name":"peugeot 504","Miles_per_Gallon":25,"Cylinders":4,"Displacement":110,"Horsepower":87,"Weight_in_lbs":2672,"Acceleration":17.5,"Year":"1970-01-01","Origin":"Europe"}]
        """#.write(toFile: file, atomically: true, encoding: .utf8)
        let run = try TrellisProcess.run(
            ["--script", "--cars", file], timeout: 120, binary: Repository.example("Inventory"))
        #expect(run.status == 0, "\(run.stdout)\n\(run.stderr)")
        let frames = Self.frames(run.stdout)
        #expect(frames.first?.contains("4 cars where true") == true, "\(run.stdout)")
        #expect(frames.first?.contains("     2046     -     4    25  USA     ford pinto") == true)
        #expect(run.stdout.contains("lot: sold the chevrolet chevelle malibu"))
        #expect(frames.last?.contains("2 cars where Origin == 'Japan'") == true, "\(run.stdout)")

        let bad = try TrellisProcess.run(
            ["--script", "--cars", dir.path("missing.json")], binary: Repository.example("Inventory"))
        #expect(bad.status == 1 && bad.stderr.contains("missing.json"), "\(bad.stderr)")
    }

    @Test("ContactsMirror: imported vCards reach the laptop's vdir, and so do later changes; khard lists them")
    func contactsMirror() throws {
        let dir = TemporaryDirectory("trellis-contacts-mirror")
        let run = try TrellisProcess.run(
            ["--out", dir.path("out")], timeout: 120, binary: Repository.example("ContactsMirror"))
        #expect(run.status == 0, "\(run.stdout)\n\(run.stderr)")
        #expect(run.stdout.contains("phone: imported 4 contacts from contacts.vcf: ada, grace, alan, edsger"))
        #expect(run.stdout.contains("laptop: mirrored 4 contacts into"))
        let vdir = URL(fileURLWithPath: dir.path("out/vdir"))
        let files = try FileManager.default.contentsOfDirectory(atPath: vdir.path).filter { $0.hasSuffix(".vcf") }
        #expect(files.sorted() == ["ada.vcf", "edsger.vcf", "grace.vcf", "katherine.vcf"])
        let ada = try String(contentsOf: vdir.appendingPathComponent("ada.vcf"), encoding: .utf8)
        #expect(ada.contains("TEL;TYPE=cell:+44 20 7946 0999") && !ada.contains("7946 0000"), "\(ada)")
        #expect(ada.contains("NOTE:Wrote the first program"), "fields the edited card lacks are kept")
        #expect(run.stdout.contains("khard -c \(dir.path("out/khard.conf")) list"))

        // khard, with the configuration the example wrote, lists the mirror by UID and name.
        let python = Repository.python.split(separator: " ").map(String.init)  // maybe "/usr/bin/env python3"
        let khard = try TrellisProcess.run(
            python.dropFirst() + [
                "-c", "import sys; from khard.khard import main; sys.exit(main(sys.argv[1:]))",
                "-c", dir.path("out/khard.conf"), "list", "--parsable",
            ],
            binary: URL(fileURLWithPath: python[0]))
        if khard.stderr.contains("No module named") {
            Issue.record("khard is not installed for \(Repository.python); scripts/test.sh installs it into .venv")
        } else {
            #expect(khard.status == 0, "\(khard.stderr)")
            let listed = khard.stdout.split(separator: "\n").map {
                $0.split(separator: "\t").prefix(2).joined(separator: " ")
            }
            #expect(
                listed == [
                    "ada Ada Lovelace", "edsger Edsger Dijkstra", "grace Grace Hopper", "katherine Katherine Johnson",
                ],
                "\(khard.stdout)")
        }
    }
}
