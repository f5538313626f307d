import Foundation
import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// The change log's rows as `readLogRows` hands them to a reader: each `_id` key as the bytes
/// SQLite holds, and the `_id` they name exactly as parsing `String(decoding: key, as: UTF8.self)`
/// names it (what the log's readers did before), a plain string `_id` as its bytes.
@Suite struct LogRowTests {
    let dir = TemporaryDirectory("trellis-log-rows")

    /// `_id` keys as SQLite may hold them, written behind the store's back, and whether each is a
    /// plain string (no escapes or control characters, well-formed UTF-8).
    static let keys: [(bytes: [UInt8], plain: Bool)] = [
        (Array("\"plain\"".utf8), true),
        (Array("\"\u{E9}t\u{E9} \u{1F600}\"".utf8), true),
        (Array("\"{x\"".utf8), true),
        (Array("\"\"".utf8), true),
        (Array("\"a\\\"b\"".utf8), false),  // an escape
        (Array("\"\\u00e9\"".utf8), false),
        (Array("\"bad".utf8) + [0xFF] + Array("\"".utf8), false),  // ill-formed: read as U+FFFD
        (Array("\"".utf8) + [0xE2, 0x82] + Array("\"".utf8), false),  // cut short before the quote
        (Array("\"".utf8) + [0xED, 0xA0, 0x80] + Array("\"".utf8), false),  // an encoded surrogate
        (Array("{\"a\":1}".utf8), false),  // a map `_id`
        (Array(" \"spaced\"".utf8), false),  // whitespace the parser steps over
    ]

    /// Keys that are not JSON: the row is damaged, skipped and named.
    static let damagedKeys: [[UInt8]] = [
        Array("\"tab\t\"".utf8),  // a raw control character
        Array("not json".utf8),
        Array("\"open".utf8),
    ]

    static func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02X", $0) }.joined() }

    /// A store whose `c` rows have the keys above, in this order in the log, after 3 ordinary rows.
    func store() throws -> DocumentStore {
        let store = try DocumentStore(path: dir.path("rows.sqlite"))
        let all = Self.keys.map(\.bytes) + Self.damagedKeys
        try store.upsert((0..<(all.count + 3)).map { ["_id": .string("d\($0)"), "n": .int(Int64($0))] }, in: "c")
        for (n, key) in all.enumerated() {
            try store.withState { s in
                try s.db.execute(
                    "UPDATE documents SET k = trellis_key(collection, CAST(X'\(Self.hex(key))' AS TEXT)) "
                        + "WHERE k = trellis_key('c', '\"d\(n + 3)\"')")
            }
        }
        return store
    }

    @Test func eachIDIsItsKeyParsedAsTheLogsReadersParsedIt() throws {
        let store = try store()
        var rows: [(key: [UInt8], id: Value, plain: Bool, json: String?)] = []
        try store.readLogRows(in: "c", after: 0, limit: 100, includeDeleted: true) { _, key, id, json in
            let plain: Bool
            if case .string = id { plain = true } else { plain = false }
            rows.append((Array(key), id.value, plain, json.map { String(decoding: $0, as: UTF8.self) }))
            return true
        }
        let expected =
            (0..<3).map { (bytes: Array("\"d\($0)\"".utf8), plain: true) } + Self.keys
        try #require(rows.count == expected.count)
        for (row, want) in zip(rows, expected) {
            let text = String(decoding: want.bytes, as: UTF8.self)
            #expect(row.key == want.bytes, "\(text)")
            #expect(row.id == (try JSON.parse(text)), "\(text)")
            #expect(row.plain == want.plain, "\(text)")
            #expect(row.json?.contains("\"n\":") == true, "\(text)")
        }
        // The entries built on the rows list the same keys and `_id`s.
        let entries = try store.entries(in: "c", after: 0, limit: 100, includeDeleted: true)
        #expect(entries.map(\.key) == rows.map { String(decoding: $0.key, as: UTF8.self) })
        #expect(entries.map(\.id) == rows.map(\.id))
        // The damaged keys are skipped and named.
        let named = Set(store.damagedDocuments().map(\.key))
        #expect(named == Set(Self.damagedKeys.map { String(decoding: $0, as: UTF8.self) }))
    }

    @Test func aPageIsFilledPastRowsWithDamagedKeys() throws {
        let store = try store()
        // The damaged rows are the last in the log; a page of 4 from the last good row's
        // predecessor still ends there, and a reader asking for one more sees none.
        var seqs: [Int64] = []
        try store.readLogRows(in: "c", after: 0, limit: 1_000, includeDeleted: false) { seq, _, _, _ in
            seqs.append(seq)
            return true
        }
        try #require(seqs.count == Self.keys.count + 3)
        var tail: [Int64] = []
        try store.readLogRows(in: "c", after: seqs[seqs.count - 2], limit: 4, includeDeleted: false) { seq, _, _, _ in
            tail.append(seq)
            return true
        }
        #expect(tail == [seqs[seqs.count - 1]])
    }
}
