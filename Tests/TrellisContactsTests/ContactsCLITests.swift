import Foundation
import Testing
import TrellisContacts
import TrellisTestKit

@Suite("trellis contacts", .serialized)
struct ContactsCLITests {
    static let cards = """
        BEGIN:VCARD
        VERSION:3.0
        UID:ada
        FN:Ada Lovelace
        N:Lovelace;Ada;;;
        TEL;TYPE=CELL:+44 1
        END:VCARD
        BEGIN:VCARD
        VERSION:4.0
        UID:broken
        FN:Broken
        this line has no colon
        END:VCARD
        BEGIN:VCARD
        VERSION:4.0
        UID:petr
        FN:Пётр Чайковский
        N:Чайковский;Пётр;;;
        END:VCARD

        """

    @Test("import reports bad cards with their line; list shows the rest")
    func importAndList() throws {
        let dir = TemporaryDirectory("trellis-contacts-cli")
        let file = dir.path("cards.vcf")
        try Data(Self.cards.utf8).write(to: URL(fileURLWithPath: file))
        let imported = try runTrellis(["contacts", "import", "--data", dir.path("data"), file])
        #expect(imported.status == 0)
        #expect(imported.stdout.contains("imported 2 contacts into contacts, skipped 1"))
        #expect(imported.stderr.contains("line 12: not a content line"))
        let listed = try runTrellis(["contacts", "list", "--data", dir.path("data")])
        #expect(listed.status == 0)
        #expect(listed.stdout == "ada\tAda Lovelace\npetr\tПётр Чайковский\n")
        let exported = try runTrellis(["contacts", "export", "--data", dir.path("data")])
        #expect(VCard.parse(exported.stdout).contacts.map(\.uid) == ["ada", "petr"])
    }

    @Test("list shows the FN a card was imported with, as khard lists it, not one built from N")
    func listShowsTheImportedFormattedName() throws {
        let dir = TemporaryDirectory("trellis-contacts-cli")
        let file = dir.path("altid.vcf")
        try Data(RoundTripCards.altid.utf8).write(to: URL(fileURLWithPath: file))
        #expect(try runTrellis(["contacts", "import", "--data", dir.path("data"), file]).status == 0)
        let listed = try runTrellis(["contacts", "list", "--data", dir.path("data")])
        #expect(listed.stdout == "altid\taltid\n")
    }

    @Test("mirror writes the vdir, prints progress once, follows imports, stops on SIGTERM")
    func mirrorFollows() throws {
        let dir = TemporaryDirectory("trellis-contacts-cli")
        let file = dir.path("cards.vcf")
        try Data(Self.cards.utf8).write(to: URL(fileURLWithPath: file))
        _ = try runTrellis(["contacts", "import", "--data", dir.path("data"), file])
        let vdir = dir.path("vdir")
        let mirror = try TrellisProcess(["contacts", "mirror", "--data", dir.path("data"), "--to", vdir])
        #expect(eventually { mirror.stdout.contains("full enumeration done: 2 contacts in 1 pages") })
        #expect(FileManager.default.fileExists(atPath: vdir + "/ada.vcf"))
        let more = dir.path("more.vcf")
        try Data("BEGIN:VCARD\nVERSION:4.0\nUID:zoe\nFN:Zoë\nEND:VCARD\n".utf8).write(to: URL(fileURLWithPath: more))
        let second = try runTrellis(["contacts", "import", "--data", dir.path("data"), more])
        #expect(second.status == 0)
        #expect(eventually { FileManager.default.fileExists(atPath: vdir + "/zoe.vcf") })
        #expect(mirror.terminate() == 0)
        #expect(mirror.stdout.components(separatedBy: "full enumeration done").count == 2)
    }

    @Test("mirror --mesh-key --peer follows the contacts of another node")
    func mirrorFollowsMesh() throws {
        let dir = TemporaryDirectory("trellis-contacts-cli")
        let key = dir.path("mesh.key")
        #expect(try runTrellis(["keygen", key]).status == 0)
        let file = dir.path("cards.vcf")
        try Data(Self.cards.utf8).write(to: URL(fileURLWithPath: file))
        _ = try runTrellis(["contacts", "import", "--data", dir.path("a"), file])
        let a = try TrellisProcess(["node", "--data", dir.path("a"), "--listen", "127.0.0.1:0", "--mesh-key", key])
        let port = try #require(a.listeningPort())
        let vdir = dir.path("vdir")
        let mirror = try TrellisProcess([
            "contacts", "mirror", "--data", dir.path("b"), "--to", vdir, "--mesh-key", key, "--peer",
            "127.0.0.1:\(port)",
        ])
        #expect(
            eventually {
                FileManager.default.fileExists(atPath: vdir + "/ada.vcf")
                    && FileManager.default.fileExists(atPath: vdir + "/petr.vcf")
            }, "mirror stderr: \(mirror.stderr)")
        let status = mirror.terminate()
        #expect(status == 0, "mirror stderr: \(mirror.stderr)")
        a.terminate()
    }
}
