import Foundation
import Testing
import TrellisTestKit

/// The shell speaks every operation of the library: remove, evict and update by query as well
/// as by ID, subscribe by ID, next-signal observers, `$args` values, the list of collections,
/// and it says when nothing matched or when a write strategy wrote nothing. `trellis find` takes
/// the shell's modifiers.
extension ShellCommandTests {
    static let cars = [
        #"upsert t {"_id": "a", "o": "J", "n": 1}"#,
        #"upsert t {"_id": "b", "o": "J", "n": 2}"#,
        #"upsert t {"_id": "c", "o": "U", "n": 3}"#,
    ]

    @Test func removeEvictAndUpdateSelectByQueryAfterWhere() throws {
        let r = try shell(
            Self.cars + [
                "update t where o == 'J' sort n desc limit 1 set x 1; increment n 10",
                "update t where o == 'J' unset nothing",
                "update t where n > $args.min args {\"min\": 100} set x 2",
                "evict t where o == 'U'",
                "remove t where n > 5",
                "remove t where o == 'nobody'",
                "find t",
            ])
        #expect(r.status == 0 && r.stderr.isEmpty, "\(r.stderr)")
        #expect(
            r.stdout == [
                #""a""#, #""b""#, #""c""#,
                #"set "b" x = 1"#, #"incremented "b" n by 10"#, "1 document changed",
                #"no changes to "a""#, #"no changes to "b""#, "0 documents changed",
                "0 documents changed",
                #""c""#, "1 document evicted",
                #""b""#, "1 document removed",
                "0 documents removed",
                #"{"_id":"a","n":1,"o":"J"}"#,
            ])
    }

    /// `remove t o == 'J'` used to remove the document with `_id` "o == 'J'" (none) and print
    /// `false`; now it is refused, naming the problem and the query form.
    @Test func aQueryWhereAnIDGoesIsAnError() throws {
        let bad: [(command: String, message: String)] = [
            ("remove t o == 'J'", "'o == 'J'' is not an ID: it looks like a query"),
            ("evict t o == 'J'", "select by query with `evict t where QUERY`"),
            ("remove t n==1", "'n==1' is not an ID"),
            ("update t o == 'J' set x 1", "or select by query with `update t where QUERY set PATH JSON`"),
            ("get t a b", "'a b' is not an ID: an ID is one word; write an ID with spaces"),
            ("observe-id t a b", "'a b' is not an ID"),
            ("update t where o == set x 1", "expected a value"),
            ("update t where o == 'J'", "update … where QUERY needs mutations after the query"),
            ("find t n > $args.min", "missing query argument $args.min"),
            ("find t n > 1 args [1]", "args needs a JSON object"),
            // The reason comes with it: here an integer a double would round.
            (
                #"find t n > $args.x args {"x": 12345678901234567891}"#,
                "the integer 12345678901234567891 is outside int64"
            ),
            (
                #"upsert t {"_id": "big", "n": -9223372036854775809}"#,
                "the integer -9223372036854775809 is outside int64"
            ),
            ("subscribe t n > 1 limit 2", "subscribe takes a QUERY and args {JSON}, not sort, limit or offset"),
        ]
        let r = try shell(Self.cars + bad.map(\.command) + [#"get t "a b""#, "count t"], flags: ["--keep-going"])
        #expect(r.stdout == [#""a""#, #""b""#, #""c""#, "null", "3"], "nothing was removed, evicted or updated")
        #expect(r.stderr.count == bad.count, "\(r.stderr)")
        for (line, (command, message)) in zip(r.stderr, bad) {
            #expect(line.hasPrefix("error: ") && line.contains(message), "\(command) → \(line)")
        }
    }

    @Test func argsGiveTheValuesOfDollarArgs() throws {
        let r = try shell(
            Self.cars + [
                #"find t n >= $args.min && o == $args.origin args {"min": 2, "origin": "J"}"#,
                #"count t n > $args.min args {"min": 1} limit 5"#,
                #"observe t n > $args.min sort n desc args {"min": 2}"#,
                #"upsert t {"_id": "d", "n": 9}"#,
            ])
        #expect(r.status == 0 && r.stderr.isEmpty, "\(r.stderr)")
        #expect(
            r.stdout.dropFirst(3) == [
                #"{"_id":"b","n":2,"o":"J"}"#, "2",
                #"observe t n > $args.min sort n desc args {"min": 2}: initial 1"#,
                #"  at 0 {"_id":"c","n":3,"o":"U"}"#,
                #""d""#,
                #"observe t n > $args.min sort n desc args {"min": 2}: update 2"#,
                #"  inserted 0 {"_id":"d","n":9}"#,
            ])
    }

    @Test func subscribeByIDAndListCollections() throws {
        let r = try shell(
            ["collections"] + Self.cars + [
                #"upsert u {"_id": "x"}"#, "remove u x",
                "collections",
                "subscribe-id t a", "subscribe-id t a", #"subscribe t n > $args.m args {"m": 2}"#,
                "subscriptions",
                "unsubscribe-id t a", #"unsubscribe t n > $args.m args {"m":2}"#,
                "subscriptions",
            ])
        #expect(r.status == 0 && r.stderr.isEmpty, "\(r.stderr)")
        #expect(
            r.stdout == [
                "no collections", #""a""#, #""b""#, #""c""#, #""x""#, "true",
                "t: 3 documents", "u: 0 documents",
                #"subscribed: t "a" (by ID)"#, #"subscribed: t "a" (by ID)"#,
                #"subscribed: t n > $args.m args {"m":2}"#,
                #"t n > $args.m args {"m":2}"#, #"t "a" (by ID)"#,
                #"unsubscribed: t "a" (by ID)"#, #"unsubscribed: t n > $args.m args {"m":2}"#,
                "no subscriptions",
            ])
    }

    /// After each event, changes wait until `next`, and arrive merged into one event.
    @Test func observeNextWaitsForNext() throws {
        let r = try shell([
            "observe-next t true sort n",
            #"upsert t {"_id": "q1", "n": 1}"#,
            #"upsert t {"_id": "q2", "n": 2}"#,
            "next t true sort n",
            "next t true sort n",
            #"upsert t {"_id": "q3", "n": 3}"#,
            #"upsert t {"_id": "q4", "n": 4}"#,
            "unobserve t true sort n",
            "next t true sort n",
        ])
        #expect(r.status == 1)
        #expect(
            r.stdout == [
                "observe-next t true sort n: initial 0",
                #""q1""#, #""q2""#,
                "observe-next t true sort n: update 2 (2 commits)",
                #"  inserted 0 {"_id":"q1","n":1}"#, #"  inserted 1 {"_id":"q2","n":2}"#,
                // The second `next` lets the next change through: q3 alone; q4 waits.
                #""q3""#,
                "observe-next t true sort n: update 3",
                #"  inserted 2 {"_id":"q3","n":3}"#,
                #""q4""#,
                "unobserved: t true sort n",
            ])
        #expect(r.stderr == ["error: not observing 't true sort n' with observe-next"])

        let one = try shell(
            [
                "observe-next-id t d", #"upsert t {"_id": "d", "n": 1}"#, #"upsert t {"_id": "d", "n": 2}"#,
                "next-id t d", "next-id t d", "next-id t d", "unobserve-id t d",
            ], data: "N")
        #expect(one.status == 0 && one.stderr.isEmpty, "\(one.stderr)")
        #expect(
            one.stdout == [
                #"observe-next-id t "d": initial null"#, #""d""#, #""d""#,
                #"observe-next-id t "d": update {"_id":"d","n":2} was null (2 commits)"#,
                // The second `next-id` signals the observer again (no change came); the third finds
                // it already waiting.
                #"observe-next-id t "d": already waiting for the next change"#,
                #"unobserved: t "d""#,
            ])
    }

    @Test func findSaysWhenNothingMatchesAndUpsertWhetherItWrote() throws {
        let r = try shell([
            "find t",
            #"upsert t {"_id": "a", "n": 1} --strategy insertIfAbsent"#,
            #"upsert t {"_id": "a", "n": 2} --strategy insertIfAbsent"#,
            #"upsert t {"_id": "a", "n": 2} --strategy insertDefaultIfAbsent"#,
            #"upsert t {"_id": "a", "n": 1} --strategy updateDifferentValues"#,
            #"upsert t {"_id": "a", "n": 3} --strategy updateDifferentValues"#,
            "find t n > 5",
            "get t a",
        ])
        #expect(r.status == 0 && r.stderr.isEmpty, "\(r.stderr)")
        #expect(
            r.stdout == [
                "0 documents",
                #""a" written"#,
                #""a" not written: a document with this _id exists"#,
                #""a" not written: this _id is known here"#,
                #""a" not written: no value differs"#,
                #""a" written"#,
                "0 documents",
                #"{"_id":"a","n":3}"#,
            ])
    }

    @Test func cliFindTakesTheShellsModifiers() throws {
        _ = try shell(Self.cars, data: "F")
        func find(_ arguments: [String]) throws -> [String] {
            let r = try TrellisProcess.run(["find", "--data", dir.path("F"), "t"] + arguments)
            #expect(r.status == 0, "\(arguments): \(r.stderr)")
            return r.stdout.split(separator: "\n").map(String.init)
        }
        #expect(
            try find(["o == 'J' || n > 2 sort n desc limit 2 offset 1"]) == [
                #"{"_id":"b","n":2,"o":"J"}"#, #"{"_id":"a","n":1,"o":"J"}"#,
            ])
        #expect(try find(["sort", "o", "desc", "sort", "n", "desc", "limit", "1"]) == [#"{"_id":"c","n":3,"o":"U"}"#])
        #expect(try find([#"n < $args.max args {"max": 2}"#]) == [#"{"_id":"a","n":1,"o":"J"}"#])
        #expect(try find(["limit 2 offset 2", "--count"]) == ["1"])
        let bad = try TrellisProcess.run(["find", "--data", dir.path("F"), "t", "sort"])
        #expect(bad.status == 2 && bad.stderr.contains("sort needs a PATH"), "\(bad.stderr)")
    }
}
