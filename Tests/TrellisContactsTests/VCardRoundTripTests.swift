import ContactProvider
import Foundation
import Testing
import TrellisContacts
import TrellisCore
import TrellisStore
import TrellisTestKit

/// Small cards after khard's test fixtures, each of which once came back changed.
enum RoundTripCards {
    static let photo = card("UID:photov4", "FN:with photo v4", "PHOTO:data:image/png;base64\\,iVBORw0KGgo=")
    static let labels = card("UID:labels", "FN:labeled guy", "item1.ORG:Test Inc", "item1.X-ABLabel:Work")
    static let altid = card(
        "UID:altid", "FN:altid", "N;ALTID=1:representation;one;;;", "N;ALTID=1:representation;two;;;")
    static let post = card(
        "FN:With post address",
        "ADR;TYPE=home:PostBox;Ext;Main Street 1;The City;SomeState;00000;HomeCountry", "UID:postcontact")
    static let kept = card(
        "UID:kept", "KIND:org", "FN:ACME Inc.", "ORG:ACME Inc.;", "EMAIL;TYPE=pref:info@acme.example",
        "CATEGORIES:testcategory,suppliers", "REV:20261201T120000Z")
    static let textBirthday = card("UID:text-bday", "FN:text birthday", "BDAY;VALUE=text:circa 1800")
    static let all = [photo, labels, altid, post, kept, textBirthday]

    static func card(_ lines: String...) -> String {
        (["BEGIN:VCARD", "VERSION:4.0"] + lines + ["END:VCARD"]).joined(separator: "\n") + "\n"
    }
}

@Suite("vCard round trips")
struct VCardRoundTripTests {
    /// Imports `text` into a fresh store and exports it again, as `trellis contacts` does.
    func throughStore(_ text: String) throws -> (exported: String, fixture: ContactsFixture) {
        let f = try ContactsFixture()
        let (_, errors) = try ContactImport.importVCards(text, into: f.store)
        #expect(errors.isEmpty, "\(errors)")
        return (try ContactImport.exportVCards(from: f.store), f)
    }

    /// `document` with `fields` replaced.
    func setting(_ document: Value, _ fields: [String: Value]) -> Value {
        var map = document.mapValue ?? [:]
        for (key, value) in fields { map[key] = value }
        return .map(map)
    }

    func lines(_ text: String) -> [String] {
        text.replacingOccurrences(of: "\r\n ", with: "").components(separatedBy: "\r\n").filter { !$0.isEmpty }
    }

    /// vobject and khard read a `data:` URI as text, so its comma must be escaped for them to see
    /// the data after it (unescaped, they read `data:image/png;base64` and nothing more).
    @Test("an exported PHOTO escapes the data: URI's comma, and reads back")
    func exportedPhotoEscapesComma() throws {
        let c = CNMutableContact()
        c.givenName = "Photo"
        c.imageData = tinyPNG
        let text = VCard.serialize(c, uid: "p")
        #expect(lines(text).contains("PHOTO:data:image/png;base64\\," + tinyPNG.base64EncodedString()))
        #expect(VCard.parse(text).contacts.first?.contact.imageData == tinyPNG)
        // The card khard writes comes back as written.
        let (exported, _) = try throughStore(RoundTripCards.photo)
        #expect(lines(exported).contains("PHOTO:data:image/png;base64\\,iVBORw0KGgo="))
    }

    @Test("FN with two N;ALTID alternatives keeps its FN and both N lines")
    func alternativeNamesKeepFormattedName() throws {
        let (exported, f) = try throughStore(RoundTripCards.altid)
        let out = lines(exported)
        let doc = try #require(try f.store.document(id: .string("altid"), in: "contacts"))
        #expect(VCard.displayName(ContactDocument.contact(from: doc), uid: "altid") == "altid")
        #expect(out.contains("FN:altid"))
        #expect(out.filter { $0.hasPrefix("FN") } == ["FN:altid"])
        #expect(
            out.filter { $0.hasPrefix("N") && !$0.hasPrefix("NOTE") } == [
                "N;ALTID=1:representation;one;;;", "N;ALTID=1:representation;two;;;",
            ])
    }

    @Test("a renamed contact's kept FN gives way to the new name")
    func renamedContactGetsNewFormattedName() throws {
        let (_, f) = try throughStore(RoundTripCards.altid)
        let doc = try #require(try f.store.document(id: .string("altid"), in: "contacts"))
        try f.store.upsert(
            setting(doc, ["givenName": .string("Ada"), "familyName": .string("Lovelace")]), in: "contacts")
        let out = lines(try ContactImport.exportVCards(from: f.store))
        #expect(out.contains("FN:Ada Lovelace"))
        #expect(out.contains("N:Lovelace;Ada;;;"))
        #expect(!out.contains("FN:altid"))
        #expect(!out.contains { $0.hasPrefix("N;ALTID") })
        let renamed = try #require(try f.store.document(id: .string("altid"), in: "contacts"))
        #expect(VCard.displayName(ContactDocument.contact(from: renamed), uid: "altid") == "Ada Lovelace")
    }

    @Test("ADR keeps its PO box and extended address apart from the street")
    func postBoxAndExtendedAddress() throws {
        let (exported, f) = try throughStore(RoundTripCards.post)
        #expect(
            lines(exported).contains(
                "ADR;TYPE=home:PostBox;Ext;Main Street 1;The City;SomeState;00000;HomeCountry"))
        // CNPostalAddress has no PO box or extended address: its street holds all three lines.
        let contact = ContactDocument.contact(
            from: try #require(try f.store.document(id: .string("postcontact"), in: "contacts")))
        #expect(contact.postalAddresses.first?.value.street == "PostBox\nExt\nMain Street 1")
        #expect(contact.postalAddresses.first?.value.city == "The City")
    }

    @Test("properties CNContact has no field for are kept and written again")
    func unmappedPropertiesKept() throws {
        let (exported, _) = try throughStore(RoundTripCards.kept + RoundTripCards.labels)
        let out = lines(exported)
        for line in [
            "KIND:org", "ORG:ACME Inc.;", "EMAIL;TYPE=pref:info@acme.example", "CATEGORIES:testcategory,suppliers",
            "REV:20261201T120000Z", "FN:ACME Inc.", "FN:labeled guy", "item1.ORG:Test Inc", "item1.X-ABLabel:Work",
        ] {
            #expect(out.contains(line), "\(line) missing from\n\(exported)")
        }
        // Exporting what was exported gives the same text.
        let (again, _) = try throughStore(exported)
        #expect(again == exported)
    }

    /// RFC 6350 allows a birthday as text; CNContact's birthday is a date, so the line is kept
    /// alongside (no warning), while a BDAY that is neither is still left out with one.
    @Test("a text BDAY is kept alongside; a BDAY that is neither date nor text is left out with a warning")
    func textBirthdayKept() throws {
        let (exported, _) = try throughStore(RoundTripCards.textBirthday)
        #expect(lines(exported).contains("BDAY;VALUE=text:circa 1800"))
        #expect(VCard.parse(exported).contacts.first?.contact.birthday == nil)
        let bad = VCard.parse(RoundTripCards.card("UID:b", "BDAY:yesterday"))
        #expect(bad.errors.map(\.skipsCard) == [false])
        #expect(bad.contacts.first?.contact.vCardProperties == [])
    }

    @Test("a kept line is written only while the value it stands for is unchanged")
    func keptLineFollowsItsValue() throws {
        let (_, f) = try throughStore(RoundTripCards.kept)
        let doc = try #require(try f.store.document(id: .string("kept"), in: "contacts"))
        try f.store.upsert(
            setting(doc, ["emailAddresses": .array([.map(["value": .string("sales@acme.example")])])]),
            in: "contacts")
        let out = lines(try ContactImport.exportVCards(from: f.store))
        #expect(out.contains("EMAIL:sales@acme.example"))
        #expect(!out.contains { $0.contains("info@acme.example") })
        #expect(out.contains("CATEGORIES:testcategory,suppliers"))
        #expect(out.contains("KIND:org"))
    }

    /// Documents come from peers: a kept line that is not one property line (a line break, a
    /// second UID, BEGIN/END, a name the grammar does not allow) is never written.
    @Test("kept lines from a document that are not single safe property lines are not written")
    func keptLinesAreChecked() throws {
        let c = CNMutableContact()
        c.givenName = "Eve"
        c.vCardProperties = [
            "X-A:1\r\nUID:evil", "X-B:2\nEND:VCARD", "UID:evil", "END:VCARD", "BEGIN:VCARD", "VERSION:3.0",
            "PHOTO:data:image/png;base64\\,AAAA", "bad name:x", " X-LEADING:space", "X-NOCOLON", "X-OK;TYPE=a:fine",
            "grp.X-GROUPED:fine too",
        ]
        let text = VCard.serialize(c, uid: "eve")
        let (cards, errors) = VCard.parse(text)
        #expect(errors.isEmpty)
        #expect(cards.map(\.uid) == ["eve"])
        let out = lines(text)
        #expect(out.filter { !$0.hasPrefix("X-") && !$0.hasPrefix("grp.") }.count == 6)  // BEGIN VERSION UID FN N END
        #expect(out.contains("X-OK;TYPE=a:fine") && out.contains("grp.X-GROUPED:fine too"))
        #expect(!text.contains("evil") && !text.contains("bad name") && !text.contains("LEADING"))
        #expect(cards.first?.contact.vCardProperties == ["X-OK;TYPE=a:fine", "grp.X-GROUPED:fine too"])
    }

    @Test("a card read twice keeps the same lines, and the mirror writes them too")
    func mirrorWritesKeptLines() async throws {
        let f = try ContactsFixture()
        _ = try ContactImport.importVCards(RoundTripCards.all.joined(), into: f.store)
        let vdir = f.dir.url.appendingPathComponent("vdir")
        let host = ContactProviderHost(
            provider: TrellisContactProvider(store: f.store), sink: try VdirMirror(directory: vdir))
        try await host.enable()
        let mirrored = try String(contentsOf: vdir.appendingPathComponent("kept.vcf"), encoding: .utf8)
        #expect(lines(mirrored).contains("CATEGORIES:testcategory,suppliers"))
        #expect(lines(mirrored).contains("EMAIL;TYPE=pref:info@acme.example"))
    }

    /// What khard lists and what vobject reads of each card is the same before and after a round
    /// trip through a store and a vdir mirror.
    @Test("khard lists and vobject reads the cards as before the round trip")
    func khardAndVobjectSeeTheSameCards() async throws {
        let f = try ContactsFixture()
        let input = f.dir.url.appendingPathComponent("in")
        try FileManager.default.createDirectory(at: input, withIntermediateDirectories: true)
        for (i, card) in RoundTripCards.all.enumerated() {
            try Data(card.utf8).write(to: input.appendingPathComponent("card\(i).vcf"))
        }
        let (_, errors) = try ContactImport.importVCards(RoundTripCards.all.joined(), into: f.store)
        #expect(errors.isEmpty)
        let output = f.dir.url.appendingPathComponent("out")
        let host = ContactProviderHost(
            provider: TrellisContactProvider(store: f.store), sink: try VdirMirror(directory: output))
        try await host.enable()

        // vobject: every property of every input card is in the mirrored card (the mirror may add
        // an N line and nothing else).
        let script = """
            import sys, os, vobject
            d = sys.argv[1]
            for name in sorted(os.listdir(d)):
                if not name.endswith('.vcf'): continue
                with open(os.path.join(d, name), encoding='utf-8') as fh:
                    card = vobject.readOne(fh.read())
                for child in card.getChildren():
                    params = sorted((k, tuple(v)) for k, v in child.params.items())
                    print(card.uid.value + '\\t' + repr((child.group, child.name, params, str(child.value))))
            """
        func properties(_ dir: URL) throws -> [String: Set<String>] {
            var result: [String: Set<String>] = [:]
            for line in try runPython(script, arguments: [dir.path]).split(separator: "\n") {
                let parts = line.split(separator: "\t", maxSplits: 1).map(String.init)
                if parts.count == 2 { result[parts[0], default: []].insert(parts[1]) }
            }
            return result
        }
        let before = try properties(input)
        let after = try properties(output)
        #expect(before.keys.sorted() == after.keys.sorted())
        for (uid, lines) in before {
            let missing = lines.subtracting(after[uid] ?? [])
            #expect(missing.isEmpty, "\(uid): \(missing.sorted())")
            let added = (after[uid] ?? []).subtracting(lines)
            #expect(added.allSatisfy { $0.contains("'N',") }, "\(uid): \(added.sorted())")
        }

        // khard: the same list, emails and postal addresses.
        func khard(_ dir: URL, _ command: [String]) throws -> String {
            try runKhard(
                command, addressBook: dir,
                config: f.dir.url.appendingPathComponent("khard-\(dir.lastPathComponent).conf"))
        }
        for command in [
            ["list", "--parsable"], ["email", "--parsable"], ["postaddress", "--parsable"],
            ["birthdays", "--parsable"],
        ] {
            let was = try khard(input, command)
            #expect(!was.isEmpty)
            #expect(try khard(output, command) == was, "khard \(command.joined(separator: " "))")
        }
        // vobject reads the whole photo (not only `data:image/png;base64`).
        let photo = try runPython(
            """
            import sys, vobject
            card = vobject.readOne(open(sys.argv[1], encoding='utf-8').read())
            print(card.photo.value)
            """, arguments: [output.appendingPathComponent("photov4.vcf").path])
        #expect(photo.trimmingCharacters(in: .whitespacesAndNewlines) == "data:image/png;base64,iVBORw0KGgo=")
    }
}
