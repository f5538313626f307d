import ContactProvider
import Dispatch
import Foundation
import Synchronization
import Testing
import TrellisContacts
import TrellisCore
import TrellisStore
import TrellisTestKit

/// A reviewer's scenarios against the contacts' shared text blocks (`ContactTexts`): unread
/// contacts whose texts sit in 32 KiB blocks shared by a page. Each asserts what the change
/// promises, so a failing one is a finding.
@Suite struct TextBlockBreakTests {
    static let block = ContactTexts.blockSize

    /// A stored-shape contact document `_id` `id` whose compact JSON text is exactly `length`
    /// bytes (its note padded), when `length` is large enough.
    static func document(_ id: String, length: Int, given: String = "G") -> Value {
        let base = JSON.string(.map(["_id": .string(id), "givenName": .string(given), "note": .string("")])).utf8.count
        let doc: Value = .map([
            "_id": .string(id), "givenName": .string(given),
            "note": .string(String(repeating: "n", count: max(0, length - base))),
        ])
        return doc
    }

    static func deferred(_ document: Value, into texts: inout ContactTexts) throws -> CNMutableContact {
        let bytes = Array(JSON.string(document).utf8)
        return try #require(bytes.withUnsafeBufferPointer { ContactDocument.contact(deferringJSON: $0, into: &texts) })
    }

    /// Texts that fill a block exactly, one exactly a block long, one a byte shorter and one a
    /// byte longer, tiny ones between: each contact reads its own, before and after the others
    /// and their writer are gone.
    @Test func textsExactlyAtBlockBoundariesReadTheirOwn() throws {
        let lengths = [
            Self.block - 200, 200,  // fill the first block exactly
            40, Self.block, 41, Self.block - 1, 42, Self.block + 1, 43, Self.block - 41, 41, 44,
            Self.block - 44,  // ends the block of the 44 exactly
            45,
        ]
        let documents = lengths.enumerated().map { n, length in Self.document("b\(n)", length: length, given: "g\(n)") }
        for (document, length) in zip(documents, lengths) { #expect(JSON.string(document).utf8.count == length) }
        var kept: [CNMutableContact] = []
        do {
            var texts = ContactTexts()
            var contacts: [CNMutableContact] = []
            for document in documents { contacts.append(try Self.deferred(document, into: &texts)) }
            #expect(contacts.allSatisfy { $0.isDeferred })
            for (n, contact) in contacts.enumerated().reversed() where n % 3 == 0 {
                #expect(contact == ContactDocument.contact(from: documents[n]), "contact \(n)")
            }
            kept = contacts
        }
        for (n, contact) in kept.enumerated() {
            #expect(contact.givenName == "g\(n)", "contact \(n)")
            #expect(contact.note.utf8.count == (documents[n]["note"]?.stringValue?.utf8.count ?? -1), "contact \(n)")
            #expect(contact == ContactDocument.contact(from: documents[n]), "contact \(n)")
        }
    }

    /// An empty text is not JSON (nil, as before); the smallest JSON texts read as empty contacts;
    /// an empty buffer without a base address too.
    @Test func emptyAndTinyTexts() throws {
        var texts = ContactTexts()
        let empty: [UInt8] = []
        #expect(empty.withUnsafeBufferPointer { ContactDocument.contact(deferringJSON: $0, into: &texts) } == nil)
        let none = UnsafeBufferPointer<UInt8>(start: nil, count: 0)
        #expect(ContactDocument.contact(deferringJSON: none, into: &texts) == nil)
        let braces = Array("{}".utf8)
        let contact = try #require(
            braces.withUnsafeBufferPointer { ContactDocument.contact(deferringJSON: $0, into: &texts) })
        #expect(contact == CNMutableContact())
        #expect(contact.hash == CNMutableContact().hash)
        // Copying empty bytes into the blocks gives an empty text next to full ones.
        for n in 0..<5 {
            let document = Self.document("e\(n)", length: 60, given: "")
            let other = try Self.deferred(document, into: &texts)
            #expect(other.isDeferred)
            #expect(other == ContactDocument.contact(from: document))
        }
        #expect(contact.isDeferred || contact.givenName.isEmpty)
    }

    /// Contacts with images far larger than a block (through the store and the enumerator): each
    /// reads its own, also kept alone after the page, the enumerator and the store are gone.
    @Test func hugeTextsThroughTheEnumeratorOutliveTheStore() async throws {
        var kept: [(CNMutableContact, Value)] = []
        do {
            let fixture = try ContactsFixture()
            var documents: [Value] = []
            for n in 0..<40 {
                let contact = CNMutableContact()
                contact.givenName = "Huge \(n)"
                contact.imageData =
                    n % 4 == 0 ? Data((0..<(40_000 + n * 997)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ n) }) : nil
                contact.note = String(repeating: "x", count: (n * 1_231) % 5_000)
                let value = ContactDocument.value(for: contact, identifier: ContactItem.Identifier("h\(n)"))
                documents.append(value)
            }
            try fixture.store.upsert(documents, in: fixture.collection)
            let observer = RecordingContentObserver(pageSize: 1_000)
            await fixture.enumerator.enumerateContent(in: .initialPage, for: observer)
            let items = observer.items
            #expect(items.count == 40)
            #expect(items.allSatisfy { $0.contact.isDeferred })
            // The others of the page are read (and so let go of their blocks) before the page goes.
            for (n, (item, document)) in zip(items, documents).enumerated() where n % 3 != 0 {
                #expect(item.contact == ContactDocument.contact(from: document))
            }
            kept = zip(items, documents).enumerated().filter { $0.offset % 3 == 0 }.map {
                ($0.element.0.contact, $0.element.1)
            }
            fixture.store.close()
        }
        for (contact, document) in kept {
            #expect(contact.isDeferred)
            let expected = ContactDocument.contact(from: document)
            #expect(contact.imageData == expected.imageData)
            #expect(contact == expected)
        }
    }

    /// Contacts of one page read from many threads while the enumerator reads the next pages
    /// (and copies their texts into new blocks): every contact reads its document.
    @Test func contactsReadFromManyThreadsWhileTheNextPageIsRead() async throws {
        let fixture = try ContactsFixture()
        var documents: [String: Value] = [:]
        var batch: [Value] = []
        for n in 0..<3_000 {
            let length = n % 500 == 7 ? Self.block + n % 3 - 1 : 60 + (n * 53) % 900
            let document = Self.document("m\(n)", length: length, given: "given \(n)")
            documents["m\(n)"] = document
            batch.append(document)
        }
        try fixture.store.upsert(batch, in: fixture.collection)
        var page = ContactItemPage.initialPage
        var readers: [Task<Int, Never>] = []
        var pages = 0
        while true {
            let observer = RecordingContentObserver(pageSize: 400)
            await fixture.enumerator.enumerateContent(in: page, for: observer)
            let items = observer.items
            pages += 1
            for slice in 0..<3 {
                let mine = items.enumerated().filter { $0.offset % 3 == slice }.map(\.element)
                readers.append(
                    Task.detached {
                        var bad = 0
                        for item in mine.reversed() {
                            guard let document = documents[item.identifier.value] else {
                                bad += 1
                                continue
                            }
                            if item.contact.givenName != document["givenName"]?.stringValue { bad += 1 }
                            if item.contact != ContactDocument.contact(from: document) { bad += 1 }
                        }
                        return bad
                    })
            }
            guard case .page(let next)? = observer.terminals.last else { break }
            page = next
        }
        var bad = 0
        for reader in readers { bad += await reader.value }
        #expect(bad == 0)
        #expect(pages >= 8)
    }

    /// Contacts handed to other threads one by one while the same `ContactTexts` keeps copying
    /// later texts into the same block: every reader reads its own text.
    @Test func readersOfABlockWhileItsWriterStillFillsIt() async throws {
        let documents = (0..<4_000).map { n in Self.document("w\(n)", length: 50 + (n * 7) % 300, given: "w\(n)") }
        let queue = Mutex<[(Int, CNMutableContact)]>([])
        let producing = Mutex(true)
        let bad = Mutex(0)
        let group = DispatchGroup()
        for _ in 0..<2 {
            DispatchQueue.global().async(group: group) {
                while true {
                    let taken: (Int, CNMutableContact)? = queue.withLock { $0.popLast() }
                    guard let (n, contact) = taken else {
                        if !producing.withLock({ $0 }) && queue.withLock({ $0.isEmpty }) { return }
                        continue
                    }
                    if contact.givenName != "w\(n)" || contact != ContactDocument.contact(from: documents[n]) {
                        bad.withLock { $0 += 1 }
                    }
                }
            }
        }
        var texts = ContactTexts()
        for (n, document) in documents.enumerated() {
            let contact = try Self.deferred(document, into: &texts)
            queue.withLock { $0.append((n, contact)) }
        }
        producing.withLock { $0 = false }
        group.wait()
        #expect(bad.withLock { $0 } == 0)
    }

    /// `copy()` and `mutableCopy()` before the first read stay unread and share the text; after
    /// it they are independent; a change to one never shows in another; all read alike from
    /// many threads at once.
    @Test func copiesBeforeAndAfterTheFirstRead() async throws {
        var texts = ContactTexts()
        let documents = (0..<50).map { n in Self.document("c\(n)", length: 100 + n * 11, given: "c\(n)") }
        let originals = try documents.map { try Self.deferred($0, into: &texts) }
        for (n, original) in originals.enumerated() {
            let expected = ContactDocument.contact(from: documents[n])
            let before = try #require(original.copy() as? CNContact)
            let mutableBefore = try #require(original.mutableCopy() as? CNMutableContact)
            let copyOfCopy = try #require(before.mutableCopy() as? CNMutableContact)
            #expect(before.isDeferred && mutableBefore.isDeferred && copyOfCopy.isDeferred && original.isDeferred)
            mutableBefore.givenName = "changed"
            #expect(original.isDeferred && before.isDeferred && copyOfCopy.isDeferred)
            let all: [CNContact] = [original, before, copyOfCopy]
            let agree = await withTaskGroup(of: Bool.self) { group in
                for k in 0..<6 {
                    group.addTask { all[k % 3] == expected && all[k % 3].givenName == "c\(n)" }
                }
                return await group.reduce(true) { $0 && $1 }
            }
            #expect(agree)
            #expect(mutableBefore.givenName == "changed" && mutableBefore.note == expected.note)
            let after = try #require(original.mutableCopy() as? CNMutableContact)
            #expect(!after.isDeferred)
            after.familyName = "after"
            #expect(original.familyName == "" && before.familyName == "" && copyOfCopy.familyName == "")
            original.note = "original changed"
            #expect(before.note == expected.note && after.note == expected.note && copyOfCopy.note == expected.note)
        }
    }

    /// Unread contacts of the same document from different blocks (and pages) are equal and hash
    /// alike, read or not, and dedupe in a set; different documents are not equal.
    @Test func equalityAndHashOfUnreadContactsFromDifferentBlocks() throws {
        let documents = (0..<20).map { n in Self.document("q\(n)", length: 2_000 + n * 1_500, given: "q\(n)") }
        var first = ContactTexts()
        var second = ContactTexts()
        let a = try documents.map { try Self.deferred($0, into: &first) }
        let filler = try Self.deferred(Self.document("f", length: 700), into: &second)
        let b = try documents.reversed().map { try Self.deferred($0, into: &second) }.reversed().map { $0 }
        #expect(filler.isDeferred)
        for n in documents.indices {
            #expect(a[n].isDeferred && b[n].isDeferred)
            #expect(a[n].hash == b[n].hash, "\(n)")
            #expect(a[n] == b[n], "\(n)")
            #expect(a[n].hash == ContactDocument.contact(from: documents[n]).hash, "\(n)")
            if n > 0 { #expect(a[n] != b[n - 1]) }
        }
        let set = Set<CNContact>(a + b)
        #expect(set.count == documents.count)
        let items = Set(b.enumerated().map { ContactItem.contact($0.element, ContactItem.Identifier("q\($0.offset)")) })
        #expect(items.count == documents.count)
    }
}
