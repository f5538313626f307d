import ContactProvider
import Testing
import TrellisContacts
import TrellisCore

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
}
