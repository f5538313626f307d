import ContactProvider
import Foundation
import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisContacts
@testable import TrellisStore

/// Review of d957826 and 7bc27b7: the enumerator reads rows with `readLogRows` and makes each item
/// straight from its row. Whatever the `_id`s (escapes, unicode, combining marks after `{` or
/// `\`, numbers, maps, arrays), removed, evicted and damaged rows, and page or batch size, it
/// lists what the entries it read before listed, page by page.
@Suite struct SpeedReviewEnumeratorTests {
    static let ids: [Value] = [
        "plain", "{", "{x", "{}", "{\"a\":1}", "\\", "\\x", "\\\\", "{\u{301}x", "\\\u{301}x", "\u{301}",
        "e\u{301}", "\u{E9}", "a\"b", "a\\b", "tab\t", "nl\n", "nul\u{0}nul", "\u{7F}", "\u{1F600}", "\u{FEFF}x",
        "\u{2028}", "\u{FFFD}", " lead", "[1]", "null", "1", "-0", "\u{1}",
        .map(["a": 1]), .map(["z": "\u{301}", "a": .array([1, "x"])]), .map(["{": "\\"]),
    ]

    /// A store with a contact for each `_id` above, some removed and evicted, and rows damaged
    /// behind its back (an `_id` key that is not JSON, a value that is not JSON, ill-formed UTF-8).
    func fixture() throws -> ContactsFixture {
        let fixture = try ContactsFixture()
        let store = fixture.store
        for (n, id) in Self.ids.enumerated() {
            try store.upsert(.map(["_id": id, "givenName": .string("g\(n)")]), in: fixture.collection)
        }
        for n in 0..<20 { try fixture.put("x\(n)", "x\(n)") }
        for (n, id) in Self.ids.enumerated() where n % 5 == 2 { _ = try store.remove(id: id, in: fixture.collection) }
        for (n, id) in Self.ids.enumerated() where n % 7 == 3 { _ = try store.evict(id: id, in: fixture.collection) }
        let damage: [(String, String?, String?)] = [
            ("x1", "CAST(X'22626164FF22' AS TEXT)", nil),  // ill-formed UTF-8 in a string key
            ("x3", "'not json'", nil),
            ("x5", nil, "'{not json'"),
            ("x7", "'  \"spaced\"'", nil),
            ("x9", "CAST(X'22E28222' AS TEXT)", nil),  // cut short
            ("x11", nil, "CAST(X'7B225F6964223A2278313122FF7D' AS TEXT)"),
            ("x13", "CAST(X'2261006222' AS TEXT)", nil),  // a raw NUL
            // Keys the store never writes but which parse: the `_id` a number, an array, a bool,
            // an empty string, a string with an escape, a map not in key order.
            ("x2", "'1'", nil), ("x4", "'-7.5'", nil), ("x6", "'[\"x\",1]'", nil), ("x8", "'true'", nil),
            ("x10", "'\"\"'", nil), ("x12", "'\"a\\u00e9\"'", nil), ("x14", "'{\"b\":1,\"a\":2}'", nil),
            ("x15", "'\"\\\\{\"'", nil), ("x16", "'\"\\u007b\"'", nil),
        ]
        for (id, key, value) in damage {
            try store.withState { s in
                if let key {
                    try s.db.execute(
                        "UPDATE documents SET k = trellis_key(collection, \(key)) "
                            + "WHERE k = trellis_key('contacts', '\"\(id)\"')")
                }
                if let value {
                    try s.db.execute(
                        "UPDATE documents SET value = \(value) WHERE k = trellis_key('contacts', '\"\(id)\"')")
                }
            }
        }
        return fixture
    }

    /// The identifiers the enumerator listed before these changes, for `after < seq <= through`,
    /// `limit` at a time: the entries decoded as it decoded them, each named by
    /// `identifier(for: Value)`.
    static func before(
        _ store: DocumentStore, after: Int64, through: Int64?, limit: Int, includeDeleted: Bool
    ) throws -> (items: [String], deletes: [String], more: Bool, last: Int64) {
        var entries = try store.entries(
            in: "contacts", after: after, through: through, limit: limit + 1, includeDeleted: includeDeleted,
            decodingJSON: { ContactDocument.contact(deferringJSON: $0) })
        let more = entries.count > limit
        if more { entries.removeLast() }
        let items = entries.compactMap { e in e.document.map { _ in ContactDocument.identifier(for: e.id).value } }
        let deletes = entries.filter { $0.document == nil }.map { ContactDocument.identifier(for: $0.id).value }
        return (items, deletes, more, entries.last?.seq ?? after)
    }

    @Test(arguments: [1, 2, 3, 7, 64])
    func contentPagesListWhatTheEntriesListed(pageSize: Int) async throws {
        let fixture = try fixture()
        let store = fixture.store
        let run = try await enumerateContent(fixture.enumerator, pageSize: pageSize)
        let marker = try #require(GenerationMarker(data: run.marker))
        var after: Int64 = 0
        for (index, items) in run.pageItems.enumerated() {
            let want = try Self.before(
                store, after: after, through: marker.snapshot, limit: pageSize, includeDeleted: false)
            #expect(items.map(\.identifier.value) == want.items, "page \(index) after \(after)")
            #expect(index < run.pages.count ? want.more : !want.more, "page \(index)")
            if index < run.pages.count {
                #expect(Int64(run.pages[index].offset) == want.last, "page \(index)")
            }
            after = want.last
        }
        // Each identifier names its `_id` again, and none repeats.
        let names = run.items.map(\.identifier.value)
        let repeated = Dictionary(grouping: names.map { Array($0.utf8) }, by: { $0 }).filter { $0.value.count > 1 }
        // Two names repeat, both through keys written behind the store's back, as before these
        // changes: `"\u007b"` spells the `_id` "{" again, and the number 1 is named "1" as the
        // string "1" is (`identifier(for:)` writes a non-string, non-map `_id` as its JSON).
        #expect(
            Set(repeated.keys.map { String(decoding: $0, as: UTF8.self) }) == ["\\{", "1"],
            "\(repeated.keys.map { String(decoding: $0, as: UTF8.self).debugDescription })")
        for item in run.items {
            let id = ContactDocument.id(for: item.identifier)
            #expect(ContactDocument.identifier(for: id) == item.identifier, "\(item.identifier.value.debugDescription)")
        }
        #expect(!store.damagedDocuments().isEmpty)
    }

    @Test(arguments: [1, 2, 5, 1000])
    func changeBatchesListWhatTheEntriesListed(batchSize: Int) async throws {
        let fixture = try fixture()
        let store = fixture.store
        let run = try await enumerateContent(fixture.enumerator, pageSize: 1000)
        // Changes after the content: removals, new and rewritten contacts, evictions.
        for (n, id) in Self.ids.enumerated() where n % 3 == 0 { _ = try store.remove(id: id, in: "contacts") }
        for (n, id) in Self.ids.enumerated() where n % 4 == 1 {
            try store.upsert(.map(["_id": id, "givenName": .string("new\(n)")]), in: "contacts")
        }
        for (n, id) in Self.ids.enumerated() where n % 6 == 5 { _ = try store.evict(id: id, in: "contacts") }
        var anchor = ContactItemSyncAnchor(generationMarker: run.marker, offset: 0)
        var cursor = try #require(GenerationMarker(data: run.marker)).snapshot
        for index in 0..<10_000 {
            let observer = RecordingChangeObserver(batchSize: batchSize)
            await fixture.enumerator.enumerateChanges(startingAt: anchor, for: observer)
            let (next, more) = try #require(observer.anchor)
            let want = try Self.before(store, after: cursor, through: nil, limit: batchSize, includeDeleted: true)
            #expect(observer.updates.map(\.identifier.value) == want.items, "batch \(index)")
            #expect(observer.deletes.map(\.value) == want.deletes, "batch \(index)")
            #expect(more == want.more && Int64(next.offset) == want.last, "batch \(index)")
            anchor = next
            cursor = want.last
            if !more { break }
        }
    }

    /// `readLogRows` names each row's `_id` as parsing its key does, for the `_id`s above.
    @Test func logRowsNameTheIDsAsTheirKeysParse() throws {
        let store = try fixture().store
        var rows = 0
        try store.readLogRows(in: "contacts", after: 0, limit: 10_000, includeDeleted: true) { _, key, id, _ in
            let text = String(decoding: key, as: UTF8.self)
            #expect(id.value == (try? JSON.parse(text)), "\(text.debugDescription)")
            if case .string(let bytes) = id {
                #expect(
                    ContactDocument.identifier(for: id)
                        == ContactDocument.identifier(for: .string(String(decoding: bytes, as: UTF8.self))))
            }
            rows += 1
            return true
        }
        #expect(rows > Self.ids.count)
    }
}
