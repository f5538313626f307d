import Foundation
import Testing
import TrellisCore
import TrellisStore
import TrellisTestKit

/// The `trellis shell` commands for write strategies, update, find with sort / limit / offset,
/// count, index and evict, driven through a real process from a pipe.
@Suite(.serialized) struct ShellCommandTests {
    let dir = TemporaryDirectory("trellis-shell")

    /// Runs a shell on a fresh data directory with `script` on standard input.
    ///
    /// - Parameter flags: added to the shell's arguments (`--keep-going`).
    func shell(_ script: [String], data: String = "S", flags: [String] = []) throws -> (
        status: Int32, stdout: [String], stderr: [String]
    ) {
        let key = dir.path("mesh.key")
        if !FileManager.default.fileExists(atPath: key) {
            #expect(try TrellisProcess.run(["keygen", key]).status == 0)
        }
        let r = try TrellisProcess.run(
            ["shell", "--data", dir.path(data), "--mesh-key", key, "--quiet"] + flags,
            input: script.joined(separator: "\n"))
        func lines(_ text: String) -> [String] {
            text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init).filter { !$0.isEmpty }
        }
        return (r.status, lines(r.stdout), lines(r.stderr))
    }

    @Test func documentCommandsFollowTheAPI() throws {
        let r = try shell([
            #"upsert cars {"_id": "a", "Name": "alpha", "hp": 100, "Origin": "Japan", "tags": ["x", "y"]}"#,
            #"upsert cars {"_id": "b", "Name": "beta", "hp": 90.5, "Origin": "USA"}"#,
            #"upsert cars {"_id": "c", "Name": "gamma", "Origin": "Japan"}"#,
            #"upsert cars {"_id": "a", "Name": "ignored"} --strategy insertIfAbsent"#,
            #"upsert cars --strategy=updateDifferentValues {"_id": "b", "Name": "beta", "hp": 91}"#,
            #"upsert cars {"_id": "d", "Name": "default", "Origin": "Europe"} --strategy insertDefaultIfAbsent"#,
            "# sorted, windowed and counted queries",
            "find cars Origin == 'Japan' sort hp desc",
            "find cars sort hp limit 2 offset 1",
            "find cars sort Origin desc sort Name limit 3",
            "count cars Origin == 'Japan'",
            "count cars limit 2",
            "# updates: several mutations in one transaction",
            #"update cars a set tags[1] "z"; increment sold 2; unset Origin; set specs.turbo true"#,
            "update cars a unset nothing",
            #"update cars a set-default Name "x""#,
            "get cars a",
            "index cars Origin",
            "find cars Origin == 'Japan'",
            "evict cars c",
            "evict cars c",
            "remove cars d",
            "count cars",
        ])
        #expect(r.status == 0)
        #expect(r.stderr.isEmpty, "\(r.stderr)")
        let expected = [
            #""a""#, #""b""#, #""c""#, #""a" not written: a document with this _id exists"#, #""b" written"#,
            #""d" written"#,
            // find cars Origin == 'Japan' sort hp desc: c has no hp and sorts last
            #"{"Name":"alpha","Origin":"Japan","_id":"a","hp":100,"tags":["x","y"]}"#,
            #"{"Name":"gamma","Origin":"Japan","_id":"c"}"#,
            // find cars sort hp limit 2 offset 1: missing hp (c, d) first, then 91, 100
            #"{"Name":"default","Origin":"Europe","_id":"d"}"#,
            #"{"Name":"beta","Origin":"USA","_id":"b","hp":91}"#,
            // find cars sort Origin desc sort Name limit 3
            #"{"Name":"beta","Origin":"USA","_id":"b","hp":91}"#,
            #"{"Name":"alpha","Origin":"Japan","_id":"a","hp":100,"tags":["x","y"]}"#,
            #"{"Name":"gamma","Origin":"Japan","_id":"c"}"#,
            "2", "2",
            #"set "a" tags[1] = "z""#, #"incremented "a" sold by 2"#, #"removed "a" Origin"#,
            #"set "a" specs.turbo = true"#,
            "no changes", "no changes",
            #"{"Name":"alpha","_id":"a","hp":100,"sold":2,"specs":{"turbo":true},"tags":["x","z"]}"#,
            "index idx_63617273_242e4f726967696e on cars (Origin)",
            #"{"Name":"gamma","Origin":"Japan","_id":"c"}"#,
            "true", "false", "true", "2",
        ]
        #expect(r.stdout == expected)
    }

    @Test func queriesMayNameFieldsLikeTheModifiers() throws {
        let r = try shell([
            #"upsert c {"_id": "1", "limit": 5, "sort": "b", "offset": 1}"#,
            #"upsert c {"_id": "2", "limit": 1, "sort": "a", "offset": 2}"#,
            #"upsert c {"_id": "3", "limit": 9, "sort": "c"}"#,
            "find c limit > 3 sort sort desc limit 1",
            "count c sort == 'a' || offset == 1",
            "find c `limit` >= 1 sort offset",
            "find c Origin == 'sort limit 1'",
        ])
        #expect(r.status == 0 && r.stderr.isEmpty, "\(r.stderr)")
        #expect(
            r.stdout == [
                #""1""#, #""2""#, #""3""#,
                #"{"_id":"3","limit":9,"sort":"c"}"#,
                "2",
                #"{"_id":"3","limit":9,"sort":"c"}"#,
                #"{"_id":"1","limit":5,"offset":1,"sort":"b"}"#,
                #"{"_id":"2","limit":1,"offset":2,"sort":"a"}"#,
                "0 documents",
            ])
    }

    @Test func compositeIDsInShellCommands() throws {
        let r = try shell([
            #"upsert cars {"_id": {"vin": "A 1", "plant": 3}, "n": 1}"#,
            #"update cars {"plant": 3, "vin": "A 1"} increment n 2; set note "a; b""#,
            #"get cars {"vin": "A 1", "plant": 3}"#,
            #"evict cars {"vin": "A 1", "plant": 3}"#,
            "count cars",
        ])
        #expect(r.status == 0 && r.stderr.isEmpty, "\(r.stderr)")
        #expect(
            r.stdout == [
                #"{"plant":3,"vin":"A 1"}"#,
                #"incremented {"plant":3,"vin":"A 1"} n by 2"#,
                #"set {"plant":3,"vin":"A 1"} note = "a; b""#,
                #"{"_id":{"plant":3,"vin":"A 1"},"n":3,"note":"a; b"}"#,
                "true", "0",
            ])
    }

    /// Collection names, field names and `_id`s are byte strings in the shell as in the store:
    /// precomposed "é" and "e" + U+0301 are two collections, two fields, two subscriptions and two
    /// observers; a name starting with a combining mark is still split from the command.
    @Test func unicodeSpellingsStayApart() throws {
        let (nfc, nfd, mark) = ("\u{E9}", "e\u{301}", "\u{301}")
        let r = try shell([
            #"upsert \#(nfc) {"_id": "a", "\#(nfc)": 1}"#,
            #"upsert \#(nfd) {"_id": "b", "\#(nfd)": 2}"#,
            #"upsert \#(mark)x {"_id": "c"}"#,
            "find \(nfc)",
            "find \(nfd)",
            "count \(nfc)",
            "find \(nfc) `\(nfc)` == 1",
            "find \(nfc) `\(nfd)` == 1",
            "count \(mark)x",
            "subscribe \(nfc)",
            "subscribe \(nfd)",
            "subscriptions",
            "update \(nfc) a set `\(mark) x` 1",
            "get \(nfc) a",
            "observe \(nfc)",
            "observe \(nfd)",
            "unobserve \(nfd)",
            "unobserve \(nfc)",
        ])
        #expect(r.status == 0 && r.stderr.isEmpty, "\(r.stderr)")
        // `String ==` would equate the spellings: compare the bytes.
        let printed = r.stdout.filter { !$0.hasPrefix("observe ") && !$0.hasPrefix("  at ") }
        let expected = [
            #""a""#, #""b""#, #""c""#,
            #"{"_id":"a","\#(nfc)":1}"#,
            #"{"_id":"b","\#(nfd)":2}"#,
            "1",
            #"{"_id":"a","\#(nfc)":1}"#,
            "0 documents",
            "1",
            "subscribed: \(nfc) true",
            "subscribed: \(nfd) true",
            "\(nfd) true", "\(nfc) true",  // in byte order: 65 cc 81 < c3 a9
            #"set "a" \#(mark) x = 1"#,
            #"{"_id":"a","\#(nfc)":1,"\#(mark) x":1}"#,
            "unobserved: \(nfd) true", "unobserved: \(nfc) true",
        ]
        #expect(printed.map { Array($0.utf8) } == expected.map { Array($0.utf8) }, "\(printed)")
    }

    @Test func everyBadArgumentGetsOneErrorLine() throws {
        let bad: [(command: String, message: String)] = [
            (#"upsert cars {"_id": "a"} --strategy bogus"#, "unknown write strategy 'bogus'"),
            (#"upsert cars {"_id": "a"} --strategy"#, "--strategy needs a value"),
            (#"upsert cars --color red {"_id": "a"}"#, "unknown flag '--color'"),
            ("upsert cars", "upsert needs a JSON document"),
            ("upsert cars [1]", "a document must be a JSON object"),
            (#"upsert cars {"x": 1"#, "invalid JSON"),
            ("update cars", "update needs an ID and a mutation"),
            ("update cars a", "update needs a mutation"),
            ("update cars a frob x", "unknown mutation 'frob'"),
            ("update cars a set", "set needs a PATH"),
            ("update cars a set x", "set x needs a JSON value"),
            ("update cars a set x nope", "set x needs a JSON value"),
            ("update cars a set a..b 1", "bad field path 'a..b'"),
            (#"update cars a set _id "b""#, "_id cannot change"),
            ("update cars a set tags[7] 1", "index 7 is out of range"),
            ("update cars a increment Name 1", "cannot increment 'Name'"),
            ("update cars a increment n many", "increment n needs one finite NUMBER"),
            ("update cars a increment n 1e999", "increment n needs one finite NUMBER"),
            ("update cars a unset x y", "unexpected 'y' after unset x"),
            ("update cars nobody set x 1", #"no document "nobody" in cars"#),
            ("find cars limit -1", "limit needs a whole number >= 0, got '-1'"),
            ("find cars limit 2 limit 3", "limit given twice"),
            ("find cars offset", "offset needs a whole number >= 0, got nothing"),
            ("find cars sort", "sort needs a PATH"),
            ("find cars sort a b", "unexpected 'b'"),
            ("find cars sort a..b", "bad field path 'a..b'"),
            ("find cars Name == ", "expected a value, a field or an $args reference"),
            ("find cars Name == 'open", "unclosed '"),
            ("count cars Name ==", "expected a value"),
            ("index cars", "index needs a PATH"),
            ("index cars ``", "cannot index"),
            ("index cars a == 1", "bad field path 'a == 1'"),
            ("evict cars", "missing ID"),
            ("evict cars {bad json}", "invalid JSON"),
            ("find", "find needs a COLLECTION"),
        ]
        let r = try shell(
            [#"upsert cars {"_id": "a", "Name": "x", "tags": [1], "n": 1}"#] + bad.map(\.command) + ["count cars"],
            flags: ["--keep-going"])
        #expect(r.status == 0)
        #expect(r.stdout == [#""a""#, "1"], "the good commands around the bad ones still ran")
        #expect(r.stderr.count == bad.count, "\(r.stderr)")
        for (line, (command, message)) in zip(r.stderr, bad) {
            #expect(line.hasPrefix("error: ") && line.contains(message), "\(command) → \(line)")
        }
    }

    @Test func helpDocumentsTheNewCommands() throws {
        let r = try shell(["help"])
        let text = r.stdout.joined(separator: "\n")
        for fragment in [
            "upsert COLLECTION {JSON} [--strategy S]", "update COLLECTION ID M[; M]...", "set-default PATH JSON",
            "increment PATH NUMBER", "SELECT is QUERY [sort PATH [asc|desc]]... [limit N] [offset N]",
            "find COLLECTION [SELECT]", "count COLLECTION [SELECT]", "evict COLLECTION ID", "index COLLECTION PATH",
            "update COLLECTION where SELECT M[; M]...", "remove COLLECTION where SELECT",
            "evict COLLECTION where SELECT", "subscribe-id COLLECTION ID", "observe-next COLLECTION [SELECT]",
            "next COLLECTION [SELECT]", "observe-next-id COLLECTION ID", "collections", "[args {JSON}]",
            "exit status is then 1", "--bail", "--keep-going",
        ] {
            #expect(text.contains(fragment), "help lacks \(fragment)")
        }
    }
}

extension ShellCommandTests {
    /// A peer's write stamped a day ahead of this node's clock is kept, not dropped, and `status`
    /// says so with the reason (issue 8 item 1: refusals are visible, not only a log line).
    @Test func syncAndPresenceCommands() throws {
        let r = try shell(
            ["sync", "presence", "sync stop", "sync stop", "sync", "sync start", "sync start", "sync go"],
            flags: ["--keep-going"])
        #expect(r.status == 0)
        #expect(r.stdout.count == 7, "\(r.stdout)")
        #expect(r.stdout.first == "no peer connected")
        #expect(r.stdout.dropFirst().first?.hasSuffix("(this node), 0 connection(s)") == true)
        #expect(
            Array(r.stdout.dropFirst(2)) == [
                "sync stopped", "sync stopped", "no peer connected", "sync started", "sync started",
            ])
        #expect(r.stderr == ["error: sync takes `stop`, `start` or nothing, not 'go'"])
    }

    @Test func statusListsDeferredDocumentsWithTheirReason() throws {
        let data = dir.path("D")
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        do {
            var ahead = StoreOptions()
            ahead.now = { UInt64(Date().timeIntervalSince1970 * 1000) + 86_400_000 }
            let writer = try DocumentStore(path: dir.path("writer.sqlite"), options: ahead)
            try writer.upsert(["_id": "d1", "x": 1], in: "items")
            let page = try writer.changes(in: "items", after: 0, limit: 10, maxBytes: .max)
            let documents = page.records.map { RemoteDocument(collection: "items", id: $0.id, state: $0.state) }
            let store = try DocumentStore(path: data + "/store.sqlite")
            let outcome = try store.merge(documents, from: [UInt8](repeating: 0xAB, count: 32), checkpoint: nil)
            #expect(outcome.deferred.count == 1)
            store.close()
            writer.close()
        }
        let r = try shell(["status", "count items"], data: "D")
        #expect(r.status == 0, "\(r.stderr)")
        #expect(r.stdout.contains("deferred: 1 document(s) kept to retry"), "\(r.stdout)")
        #expect(
            r.stdout.contains {
                $0.contains("items \"d1\" from abababababababab") && $0.contains("ahead of this node's clock")
            },
            "\(r.stdout)")
        #expect(r.stdout.contains("damaged: 0 document(s)"))
        #expect(r.stdout.last == "0")  // not applied: the document is not there yet
    }
}
