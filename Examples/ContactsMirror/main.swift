// ContactsMirror: contacts replicated across the mesh, mirrored into a vdir that khard reads.
//
//   swift run ContactsMirror [--out DIR] [--vcf FILE]
//
// Two nodes in one process over encrypted loopback: "phone" imports the vCards of contacts.vcf;
// "laptop" subscribes to the contacts and mirrors them into DIR/vdir, one vCard 4.0 file per
// contact, through the same pieces `trellis contacts mirror` uses: a TrellisContactProvider (the
// ContactProvider-shaped enumerator over the store's change log), a ContactProviderHost (the
// system side, as iOS drives an extension) and a VdirMirror (the sink writing the files). Changes
// made on the phone afterwards reach the files. DIR is kept, with a khard.conf pointing at it.
import Foundation
import Trellis
import TrellisContacts

struct MirrorError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// The vdir's files and the FN line of each (what khard lists), sorted by file name.
func mirrored(_ vdir: URL) throws -> [(file: String, name: String)] {
    try FileManager.default.contentsOfDirectory(atPath: vdir.path).filter { $0.hasSuffix(".vcf") }.sorted().map {
        let text = try String(contentsOf: vdir.appendingPathComponent($0), encoding: .utf8)
        let fn = text.split(whereSeparator: \.isNewline).first { $0.hasPrefix("FN:") }?.dropFirst(3) ?? ""
        return ($0, String(fn))
    }
}

/// Waits (every 20 ms, up to 60 s, for a machine busy with other work) until the mirror shows
/// what `condition` looks for.
func waitForMirror(_ what: String, _ condition: () throws -> Bool) async throws {
    let deadline = Date().addingTimeInterval(60)
    while (try? condition()) != true {
        guard Date() < deadline else { throw MirrorError("timed out waiting until \(what)") }
        try await Task.sleep(for: .milliseconds(20))
    }
    print("laptop: \(what)")
}

// MARK: - The two nodes

/// Runs the example: nodes in `out`/phone and `out`/laptop, the mirror in `out`/vdir.
func run(out: URL, vcf: URL) async throws {
    let vdir = out.appendingPathComponent("vdir")
    // Start afresh: this example's own directories only.
    for name in ["phone", "laptop", "vdir", "khard.conf"] {
        try? FileManager.default.removeItem(at: out.appendingPathComponent(name))
    }
    let key = MeshKey.generate()
    // A library node sends no LAN discovery beacons (NodeOptions.discovery is nil): the two
    // nodes meet only through listen and connect, on loopback.
    let phone = try TrellisNode(directory: out.appendingPathComponent("phone"), meshKey: key)
    let laptop = try TrellisNode(directory: out.appendingPathComponent("laptop"), meshKey: key)

    // The phone imports the vCards: one document per card in `contacts`, its UID as `_id`.
    let (imported, problems) = try ContactImport.importVCards(
        try String(contentsOf: vcf, encoding: .utf8), into: phone.store.documents)
    for problem in problems { print("phone: \(vcf.lastPathComponent): \(problem)") }
    print(
        "phone: imported \(imported.count) contacts from \(vcf.lastPathComponent): \(imported.joined(separator: ", "))")

    // The laptop asks for every contact and connects to the phone.
    let subscription = try laptop.store.collection("contacts").findAll().subscribe()
    let port = try phone.listen(on: Endpoint(host: "127.0.0.1", port: 0))
    laptop.connect(to: Endpoint(host: "127.0.0.1", port: port))

    // The system side on the laptop: a host enumerates the provider into the vdir.
    let store = laptop.store.documents
    let host = ContactProviderHost(
        provider: TrellisContactProvider(store: store, collection: "contacts"), sink: try VdirMirror(directory: vdir))
    try await host.enable()  // the first full enumeration (maybe empty: the contacts are on their way)

    // Follow: every commit touching `contacts` (here: merges from the phone) signals the host,
    // which enumerates the changes since its last anchor and applies them to the files.
    let (commits, signal) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    let observer = store.addObserver { event in
        if event.collections.contains(UTF8Key("contacts")) { signal.yield() }
    }
    let follower = Task {
        for await _ in commits {
            do { try await host.signalEnumerator() } catch { print("laptop: the mirror failed: \(error)") }
        }
    }

    try await waitForMirror("mirrored \(imported.count) contacts into \(vdir.path)") {
        try mirrored(vdir).count == imported.count
    }
    for (file, name) in try mirrored(vdir) { print("   \(file)  \(name)") }

    // Changes on the phone reach the files. An edited card, imported again, updates Ada (a
    // re-import merges: fields the card gives replace the document's, others stay).
    print("phone: Ada has a new mobile number (an edited card imported again)")
    let edited = "BEGIN:VCARD\r\nVERSION:4.0\r\nUID:ada\r\nTEL;TYPE=cell:+44 20 7946 0999\r\nEND:VCARD\r\n"
    _ = try ContactImport.importVCards(edited, into: phone.store.documents)
    try await waitForMirror("ada.vcf holds the new number") {
        try String(contentsOf: vdir.appendingPathComponent("ada.vcf"), encoding: .utf8).contains("+44 20 7946 0999")
    }

    print("phone: removed Alan")
    try phone.store.collection("contacts").findByID("alan").remove()
    try await waitForMirror("alan.vcf is gone") {
        !FileManager.default.fileExists(atPath: vdir.appendingPathComponent("alan.vcf").path)
    }

    print("phone: a new contact, Katherine Johnson")
    let katherine =
        "BEGIN:VCARD\r\nVERSION:4.0\r\nUID:katherine\r\nFN:Katherine Johnson\r\nN:Johnson;Katherine;;;\r\n"
        + "EMAIL:katherine@example.org\r\nEND:VCARD\r\n"
    _ = try ContactImport.importVCards(katherine, into: phone.store.documents)
    try await waitForMirror("katherine.vcf appeared") {
        try mirrored(vdir).contains { $0.file == "katherine.vcf" }
    }

    // Stop following (the last enumeration finishes first), then close both nodes.
    store.removeObserver(observer)
    signal.finish()
    await follower.value
    subscription.cancel()
    phone.close()
    laptop.close()

    print("the vdir now holds:")
    for (file, name) in try mirrored(vdir) { print("   \(file)  \(name)") }

    // khard reads a vdir as an address book: write a configuration naming this one.
    let khardConf = out.appendingPathComponent("khard.conf")
    try Data(
        """
        [addressbooks]
        [[trellis]]
        path = \(vdir.path)

        [general]
        default_action = list

        [contact table]
        display = formatted_name

        """.utf8
    ).write(to: khardConf)
    print(
        """
        khard: point it at the mirror in ~/.config/khard/khard.conf ([addressbooks] [[trellis]] path = \(vdir.path)),
        or use the one written here:  khard -c \(khardConf.path) list
        """)
}

// MARK: - Arguments

var out = FileManager.default.temporaryDirectory.appendingPathComponent("trellis-contacts-mirror")
// contacts.vcf sits beside this file in the package.
var vcf = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("contacts.vcf")
var arguments = CommandLine.arguments.dropFirst()
while let flag = arguments.popFirst() {
    guard flag == "--out" || flag == "--vcf", let value = arguments.popFirst() else {
        FileHandle.standardError.write(Data("usage: ContactsMirror [--out DIR] [--vcf FILE]\n".utf8))
        exit(2)
    }
    if flag == "--out" { out = URL(fileURLWithPath: value) } else { vcf = URL(fileURLWithPath: value) }
}
do {
    try await run(out: out, vcf: vcf)
} catch {
    FileHandle.standardError.write(Data("ContactsMirror: \(error)\n".utf8))
    exit(1)
}
