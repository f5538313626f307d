import ContactProvider
import Foundation
import Testing
import TrellisContacts
import TrellisCore
import TrellisStore

/// A document's `_id` and its contact identifier map one to one (docs/CONTACTS.md, "Document
/// shape"): a string that spells a map's JSON, or begins with the escape `\`, is not taken for
/// another document's identifier, and every identifier reads back to its `_id`.
@Suite struct ContactIdentifierTests {
    static let ids: [Value] = [
        "plain", "", "{", "{\"k\":\"x\"}", "\\", "\\{\"k\":\"x\"}", "\\\\", " {", "x{",
        .map(["k": "x"]), .map(["a": .int(1), "b": .array(["c"])]),
    ]

    @Test func everyIDHasItsOwnIdentifierAndReadsBack() {
        let identifiers = Self.ids.map { ContactDocument.identifier(for: $0).value }
        #expect(Set(identifiers).count == Self.ids.count, "\(identifiers)")
        for id in Self.ids {
            #expect(ContactDocument.id(for: ContactDocument.identifier(for: id)) == id, "\(id)")
        }
    }

    @Test func ordinaryStringsAreTheirOwnIdentifiers() {
        for text in ["plain", "a{b", "urn:uuid:1234", "x\\y"] {
            #expect(ContactDocument.identifier(for: .string(text)).value == text)
        }
        #expect(ContactDocument.identifier(for: "{x").value == "\\{x")
        #expect(ContactDocument.identifier(for: .map(["k": "x"])).value == "{\"k\":\"x\"}")
    }

    /// A vCard UID that no `_id` maps to (JSON that is no map) names the string itself.
    @Test func anIdentifierNoIDMapsToNamesTheString() {
        #expect(ContactDocument.id(for: ContactItem.Identifier("{not json")) == "{not json")
        #expect(ContactDocument.id(for: ContactItem.Identifier("{}")) == "{}")
    }

    /// The enumerator names each contact as ``ContactDocument/identifier(for:)`` names its `_id`,
    /// in content and in changes, whether the store hands the `_id` over as a string's bytes or
    /// parsed (a key with escapes, a map).
    @Test func theEnumeratorNamesContactsAsTheirIDs() async throws {
        let fixture = try ContactsFixture()
        let ids: [Value] =
            Self.ids.filter { $0 != "" } + [
                "a\"b", "tab\t", "\u{E9}t\u{E9}", "{\u{301}x", "\\\u{301}", "contact-00000042",
            ]
        for (n, id) in ids.enumerated() {
            try fixture.store.upsert(.map(["_id": id, "givenName": .string("g\(n)")]), in: fixture.collection)
        }
        let named = ids.map { ContactDocument.identifier(for: $0) }
        let run = try await enumerateContent(fixture.enumerator, pageSize: 4)
        #expect(run.items.map(\.identifier) == named)
        #expect(run.items.map(\.contact.givenName) == ids.indices.map { "g\($0)" })
        // Each even one changed, each odd one removed: updates and deletions name them alike.
        for (n, id) in ids.enumerated() {
            if n % 2 == 0 {
                try fixture.store.upsert(.map(["_id": id, "givenName": .string("h\(n)")]), in: fixture.collection)
            } else {
                _ = try fixture.store.remove(id: id, in: fixture.collection)
            }
        }
        var updated: [ContactItem.Identifier] = []
        var deleted: [ContactItem.Identifier] = []
        var anchor = ContactItemSyncAnchor(generationMarker: run.marker, offset: 0)
        while true {
            let observer = RecordingChangeObserver(batchSize: 3)
            await fixture.enumerator.enumerateChanges(startingAt: anchor, for: observer)
            updated += observer.updates.map(\.identifier)
            deleted += observer.deletes
            let (next, more) = try #require(observer.anchor)
            anchor = next
            if !more { break }
        }
        #expect(updated == named.enumerated().filter { $0.offset % 2 == 0 }.map(\.element))
        #expect(deleted == named.enumerated().filter { $0.offset % 2 == 1 }.map(\.element))
    }
}
