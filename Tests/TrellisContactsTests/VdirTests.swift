import ContactProvider
import Foundation
import Testing
import TrellisContacts
import TrellisCore
import TrellisStore
import TrellisTestKit

/// Runs a Python snippet with the test environment's interpreter; fails with a hint when a
/// module is missing.
func runPython(_ script: String, arguments: [String] = [], environment: [String: String] = [:]) throws -> String {
    let process = Process()
    let python = Repository.python.split(separator: " ").map(String.init)
    process.executableURL = URL(fileURLWithPath: python[0])
    process.arguments = Array(python.dropFirst()) + ["-c", script] + arguments
    process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
    let out = Pipe()
    let err = Pipe()
    process.standardOutput = out
    process.standardError = err
    try process.run()
    let output = out.fileHandleForReading.readDataToEndOfFile()
    let errors = err.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    let errorText = String(decoding: errors, as: UTF8.self)
    if errorText.contains("ModuleNotFoundError") || errorText.contains("No module named") {
        throw ProcessError(
            "a Python module is missing (\(errorText.split(separator: "\n").last ?? "")); run scripts/test.sh, which installs khard and vobject into .venv"
        )
    }
    guard process.terminationStatus == 0 else {
        throw ProcessError("python exited with \(process.terminationStatus): \(errorText)")
    }
    return String(decoding: output, as: UTF8.self)
}

/// Runs khard on one address book (a vdir), listing by formatted name; `config` is where its
/// configuration file is written.
func runKhard(_ arguments: [String], addressBook: URL, config: URL) throws -> String {
    try Data(
        """
        [addressbooks]
        [[book]]
        path = \(addressBook.path)

        [general]
        default_action = list
        editor = /bin/true
        merge_editor = /bin/true

        [contact table]
        display = formatted_name
        """.utf8
    ).write(to: config)
    return try runPython(
        "import sys; from khard.khard import main; sys.exit(main(sys.argv[1:]))",
        arguments: ["-c", config.path] + arguments)
}

@Suite("vdir mirror")
struct VdirTests {
    @Test("one UID.vcf per contact, written atomically, removed on delete")
    func mirrorFiles() async throws {
        let f = try ContactsFixture()
        let vdir = f.dir.url.appendingPathComponent("vdir")
        for i in 0..<12 { try f.put("c\(i)", "g\(i)") }
        try f.store.upsert(.map(["_id": .string("odd/ü:1"), "givenName": .string("Odd")]), in: "contacts")
        let mirror = try VdirMirror(directory: vdir)
        let host = ContactProviderHost(provider: TrellisContactProvider(store: f.store), sink: mirror)
        await host.setPageSize(5)
        try await host.enable()
        #expect(try mirror.files().count == 13)
        #expect(try mirror.files().contains("odd%2F%C3%BC%3A1.vcf"))
        let text = try String(contentsOf: vdir.appendingPathComponent("c3.vcf"), encoding: .utf8)
        #expect(VCard.parse(text).contacts.first?.uid == "c3")
        try f.remove("c3")
        try f.put("c4", "renamed")
        try await host.signalEnumerator()
        #expect(!FileManager.default.fileExists(atPath: vdir.appendingPathComponent("c3.vcf").path))
        let c4 = try String(contentsOf: vdir.appendingPathComponent("c4.vcf"), encoding: .utf8)
        #expect(VCard.parse(c4).contacts.first?.contact.givenName == "renamed")
        // No temporary files are left behind.
        let all = try FileManager.default.contentsOfDirectory(atPath: vdir.path)
        #expect(all.filter { $0.hasSuffix(".tmp") }.isEmpty)
        // A full re-enumeration removes files of contacts that are gone.
        try Data("BEGIN:VCARD\r\nVERSION:4.0\r\nUID:stray\r\nFN:Stray\r\nEND:VCARD\r\n".utf8)
            .write(to: vdir.appendingPathComponent("stray.vcf"))
        try await host.reset()
        #expect(try mirror.files().sorted() == (try f.live()).keys.map { VdirMirror.fileName(for: .init($0)) }.sorted())
        try await host.disable()
        #expect(try mirror.files().isEmpty)
    }

    @Test("an evicted contact is reported deleted: hosts drop it and the mirror removes its file")
    func evictedContactsAreDeleted() async throws {
        let f = try ContactsFixture()
        let vdir = f.dir.url.appendingPathComponent("vdir")
        for i in 0..<3 { try f.put("c\(i)", "g\(i)") }
        let mirror = try VdirMirror(directory: vdir)
        let host = ContactProviderHost(provider: TrellisContactProvider(store: f.store), sink: mirror)
        try await host.enable()
        #expect(try mirror.files() == ["c0.vcf", "c1.vcf", "c2.vcf"])
        // What the enumerator reports after the content's snapshot.
        let run = try await enumerateContent(f.enumerator, pageSize: 10)
        #expect(try f.store.evict(id: "c1", in: "contacts"))
        var contacts = Dictionary(uniqueKeysWithValues: run.items.map { ($0.identifier.value, $0.contact.givenName) })
        var batches: [RecordingChangeObserver] = []
        try await applyChanges(
            f.enumerator, from: ContactItemSyncAnchor(generationMarker: run.marker, offset: 0), batchSize: 10,
            to: &contacts, batches: &batches)
        #expect(contacts == ["c0": "g0", "c2": "g2"])
        #expect(batches.flatMap(\.deletes).map(\.value) == ["c1"] && batches.flatMap(\.updates).isEmpty)
        try await host.signalEnumerator()
        #expect(try mirror.files() == ["c0.vcf", "c2.vcf"])
        // A fresh content enumeration does not list it either.
        let fresh = try await enumerateContent(f.enumerator, pageSize: 10)
        #expect(fresh.items.map(\.identifier.value).sorted() == ["c0", "c2"])
    }

    @Test("khard lists the mirrored contacts and vobject parses every file")
    func khardAndVobject() async throws {
        let f = try ContactsFixture()
        let vdir = f.dir.url.appendingPathComponent("vdir")
        var expected: [String: String] = [:]
        let rich = richContact()
        rich.givenName = "Ada"
        try f.store.upsert(ContactDocument.value(for: rich, identifier: .init("ada-1")), in: "contacts")
        expected["ada-1"] = VCard.formattedName(rich, uid: "ada-1")
        for (i, name) in ["Пётр", "李小龙", "Zoë", "O'Brien; Jr"].enumerated() {
            let c = CNMutableContact()
            c.givenName = name
            c.familyName = "Family\(i)"
            c.emailAddresses = [CNLabeledValue(label: CNLabelWork, value: "p\(i)@example.org" as NSString)]
            try f.store.upsert(ContactDocument.value(for: c, identifier: .init("p-\(i)")), in: "contacts")
            expected["p-\(i)"] = VCard.formattedName(c, uid: "p-\(i)")
        }
        let host = ContactProviderHost(
            provider: TrellisContactProvider(store: f.store), sink: try VdirMirror(directory: vdir))
        try await host.enable()

        // vobject: every file parses, with the UID and FN written.
        let parsed = try runPython(
            """
            import sys, os, vobject
            d = sys.argv[1]
            for name in sorted(os.listdir(d)):
                if not name.endswith('.vcf'): continue
                with open(os.path.join(d, name), encoding='utf-8') as fh:
                    card = vobject.readOne(fh.read())
                print(card.uid.value + '\\t' + card.fn.value)
            """, arguments: [vdir.path])
        var seen: [String: String] = [:]
        for line in parsed.split(separator: "\n") {
            let parts = line.split(separator: "\t", maxSplits: 1).map(String.init)
            if parts.count == 2 { seen[parts[0]] = parts[1] }
        }
        #expect(seen == expected)

        // khard: the same contacts, by UID and name.
        let listed = try runKhard(
            ["list", "--parsable"], addressBook: vdir, config: f.dir.url.appendingPathComponent("khard.conf"))
        var khard: [String: String] = [:]
        for line in listed.split(separator: "\n") {
            let parts = line.split(separator: "\t").map(String.init)
            if parts.count >= 2 { khard[parts[0]] = parts[1] }
        }
        #expect(khard == expected)
    }
}
