import ContactProvider
import Foundation
import Testing
import TrellisContacts
import TrellisCore
import TrellisStore
import TrellisTestKit

@Suite struct ContactsRobustnessTests {
    let dir = TemporaryDirectory("trellis-contacts-robust")

    /// A read-only store (the mirror's) sees what another connection commits, so its anchors are
    /// never "beyond the log" and no full enumeration repeats.
    @Test func aReadOnlyStoreSeesOtherWriters() throws {
        let path = dir.path("store.sqlite")
        let writer = try DocumentStore(path: path)
        try writer.upsert(["_id": "a"], in: "contacts")
        var options = StoreOptions()
        options.readOnly = true
        let reader = try DocumentStore(path: path, options: options)
        #expect(reader.lastSeq == writer.lastSeq)
        try writer.upsert([["_id": "b"], ["_id": "c"]], in: "contacts")
        #expect(reader.lastSeq == writer.lastSeq && reader.lastSeq > 2)
    }

    /// Identifiers of any length name one file of at most 255 bytes, always the same one.
    @Test func longIdentifiersGetBoundedStableFileNames() {
        let long = String(repeating: "x", count: 300)
        let other = long + "y"
        let cjk = String(repeating: "名", count: 80)
        for id in [long, other, cjk] {
            let name = VdirMirror.fileName(for: ContactItem.Identifier(id))
            #expect(name.utf8.count <= 255 && name.hasSuffix(".vcf"))
            #expect(name == VdirMirror.fileName(for: ContactItem.Identifier(id)))
        }
        #expect(
            VdirMirror.fileName(for: ContactItem.Identifier(long))
                != VdirMirror.fileName(for: ContactItem.Identifier(other)))
        #expect(VdirMirror.fileName(for: ContactItem.Identifier("ada")) == "ada.vcf")
    }

    /// One card the store refuses (too large) is reported with its line; the others are imported.
    @Test func anOversizedCardIsSkippedAndTheRestImported() throws {
        var options = StoreOptions()
        options.maxDocumentBytes = 4096
        let store = try DocumentStore(path: dir.path("small.sqlite"), options: options)
        let photo = Data(repeating: 7, count: 6000).base64EncodedString()
        let text = """
            BEGIN:VCARD
            VERSION:4.0
            UID:one
            FN:One
            END:VCARD
            BEGIN:VCARD
            VERSION:4.0
            UID:big
            FN:Big
            PHOTO:data:image/jpeg;base64,\(photo)
            END:VCARD
            BEGIN:VCARD
            VERSION:4.0
            UID:two
            FN:Two
            END:VCARD
            """
        let (imported, errors) = try ContactImport.importVCards(text, into: store)
        #expect(imported == ["one", "two"])
        #expect(errors.count == 1 && errors[0].line == 6 && errors[0].skipsCard)
        #expect(errors.first?.message.contains("above the limit") == true)
        #expect(try store.count(in: "contacts") == 2)
    }
}
