import ContactProvider
import Foundation
import Testing
import TrellisContacts
import TrellisCore
import TrellisStore
import TrellisTestKit

/// The enumerator delivers contacts that keep their document's text and read it when a property
/// is first asked for (`ContactDocument.contact(deferringJSON:)`). Whatever is asked first, and
/// whoever asks, they read as the contact read at once; the property test in
/// ``ContactJSONDecoderTests`` checks the same on random texts.
@Suite struct DeferredContactTests {
    static let document: Value = .map([
        "_id": .string("ada"), "givenName": .string("Ada"), "familyName": .string("Lovelace"),
        "phoneNumbers": .array([.map(["label": .string(CNLabelPhoneNumberMobile), "value": .string("+44 1")])]),
        "emailAddresses": .array([.map(["label": .string(CNLabelWork), "value": .string("ada@example.org")])]),
        "postalAddresses": .array([.map(["city": .string("London"), "street": .string("12 St James's Sq")])]),
        "birthday": .map(["year": .int(1815), "month": .int(12), "day": .int(10)]),
        "note": .string("first programmer\nand poet"),
    ])

    static func deferred() throws -> CNMutableContact {
        let bytes = Array(JSON.string(document).utf8)
        return try #require(bytes.withUnsafeBufferPointer { ContactDocument.contact(deferringJSON: $0) })
    }

    @Test func theEnumeratorDeliversStoredContactsUnreadAndTheyReadAsStored() async throws {
        let fixture = try ContactsFixture()
        try fixture.store.upsert(Self.document, in: fixture.collection)
        let observer = RecordingContentObserver(pageSize: 10)
        await fixture.enumerator.enumerateContent(in: .initialPage, for: observer)
        let contact = try #require(observer.items.first?.contact)
        #expect(contact.isDeferred)
        #expect(contact.givenName == "Ada")
        #expect(!contact.isDeferred)
        #expect(contact == ContactDocument.contact(from: Self.document))
        #expect(contact.birthday == DateComponents(year: 1815, month: 12, day: 10))
        #expect(contact.postalAddresses.first?.value.city == "London")
    }

    @Test func aPropertyChangedBeforeAnyIsReadKeepsTheOthers() throws {
        let contact = try Self.deferred()
        contact.familyName = "King"
        #expect(!contact.isDeferred)
        #expect(contact.familyName == "King")
        #expect(contact.givenName == "Ada")
        #expect(contact.phoneNumbers.map(\.value.stringValue) == ["+44 1"])
    }

    @Test func copiesStayUnreadAndReadAlike() throws {
        let contact = try Self.deferred()
        let copy = try #require(contact.copy() as? CNContact)
        let mutable = try #require(contact.mutableCopy() as? CNMutableContact)
        let other = contact.mutableContact()
        #expect(copy.isDeferred && mutable.isDeferred && other.isDeferred && contact.isDeferred)
        mutable.note = ""
        #expect(copy == contact && other == contact)
        #expect(mutable != contact && mutable.emailAddresses == contact.emailAddresses)
        #expect(copy.hash == ContactDocument.contact(from: Self.document).hash)
    }

    /// Threads that ask for properties of one unread contact at once all read the same.
    @Test func firstReadsFromManyThreadsAgree() async throws {
        for _ in 0..<50 {
            let contact = try Self.deferred()
            let expected = ContactDocument.contact(from: Self.document)
            let seen = await withTaskGroup(of: Bool.self) { group in
                for k in 0..<8 {
                    group.addTask {
                        switch k % 4 {
                        case 0: return contact.givenName == expected.givenName
                        case 1: return contact.phoneNumbers == expected.phoneNumbers
                        case 2: return contact.birthday == expected.birthday
                        default: return contact == expected
                        }
                    }
                }
                return await group.reduce(into: [Bool]()) { $0.append($1) }
            }
            #expect(seen.allSatisfy { $0 })
        }
    }

    /// Text the one pass does not vouch for is read at once (so text that is not JSON is still
    /// refused at once), and reads alike.
    @Test func textTheOnePassDoesNotVouchForIsReadAtOnce() throws {
        let spaced = Array(#"{ "givenName" : "Ada" }"#.utf8)
        let contact = try #require(spaced.withUnsafeBufferPointer { ContactDocument.contact(deferringJSON: $0) })
        #expect(!contact.isDeferred && contact.givenName == "Ada")
        let broken = Array(#"{"givenName":"Ada""#.utf8)
        #expect(broken.withUnsafeBufferPointer { ContactDocument.contact(deferringJSON: $0) } == nil)
    }

    /// Contacts made together share blocks of text (`ContactTexts`): each reads its own text,
    /// whether it fills a block, ends one, is larger than a block or comes after one that was;
    /// and a contact outlives the others of its block and its block's writer.
    @Test func contactsSharingBlocksOfTextEachReadTheirOwn() throws {
        var documents: [Value] = []
        for n in 0..<600 {
            // Notes of many lengths, so that texts end blocks at many offsets; two larger than a block.
            let length = n == 100 || n == 101 ? ContactTexts.blockSize + 17 : (n * 37) % 700
            documents.append(
                .map([
                    "_id": .string("c\(n)"), "givenName": .string("Given \(n)"),
                    "note": .string(String(repeating: "n", count: length)),
                ]))
        }
        var kept: [CNMutableContact] = []
        do {
            var texts = ContactTexts()
            var contacts: [CNMutableContact] = []
            for document in documents {
                let bytes = Array(JSON.string(document).utf8)
                let contact = bytes.withUnsafeBufferPointer { ContactDocument.contact(deferringJSON: $0, into: &texts) }
                contacts.append(try #require(contact))
            }
            #expect(contacts.allSatisfy { $0.isDeferred })
            for (n, contact) in contacts.enumerated() where n % 2 == 0 {
                #expect(contact == ContactDocument.contact(from: documents[n]), "contact \(n)")
            }
            kept = [contacts[1], contacts[101], contacts[599]]
        }
        // The writer and every other contact of their blocks are released: the kept read theirs.
        #expect(kept.allSatisfy { $0.isDeferred })
        #expect(kept[0] == ContactDocument.contact(from: documents[1]))
        #expect(kept[1].note.utf8.count == ContactTexts.blockSize + 17)
        #expect(kept[2] == ContactDocument.contact(from: documents[599]))
    }
}
