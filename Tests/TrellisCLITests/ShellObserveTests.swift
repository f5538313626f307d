import Foundation
import Testing
import TrellisTestKit

/// `observe` and `observe-id` in `trellis shell` print live query events as they arrive.
@Suite(.serialized) struct ShellObserveTests {
    let dir = TemporaryDirectory("trellis-observe")

    @Test func observePrintsEachEvent() throws {
        let key = dir.path("mesh.key")
        #expect(try TrellisProcess.run(["keygen", key]).status == 0)
        let shell = try TrellisProcess(["shell", "--data", dir.path("S"), "--mesh-key", key, "--quiet"])
        func lines() -> [String] { shell.stdout.split(separator: "\n").map(String.init) }
        func waitFor(_ line: String) -> Bool { eventually(timeout: 20) { lines().contains(line) } }

        shell.send(#"upsert cars {"_id": "a", "hp": 1}"#)
        shell.send("observe cars true sort hp desc limit 1")
        #expect(waitFor("observe cars true sort hp desc limit 1: initial 1"))
        shell.send("unobserve cars true sort hp desc limit 1")
        #expect(waitFor("unobserved: cars true sort hp desc limit 1"))
        shell.send("observe cars hp > 0")
        #expect(waitFor("observe cars hp > 0: initial 1"))
        #expect(waitFor(#"  at 0 {"_id":"a","hp":1}"#))
        shell.send("observe-id cars b")
        #expect(waitFor("observe-id cars \"b\": initial null"))
        shell.send(#"upsert cars {"_id": "b", "hp": 2}"#)
        #expect(waitFor("observe cars hp > 0: update 2"))
        #expect(waitFor(#"  inserted 1 {"_id":"b","hp":2}"#))
        #expect(waitFor(#"observe-id cars "b": update {"_id":"b","hp":2} was null"#))
        shell.send(#"update cars a set hp 5"#)
        #expect(waitFor(#"  updated 0 {"_id":"a","hp":5}"#))
        shell.send("remove cars b")
        #expect(waitFor(#"  deleted 1 {"_id":"b","hp":2}"#))
        #expect(waitFor(#"observe-id cars "b": update null was {"_id":"b","hp":2}"#))
        shell.send("unobserve cars hp > 0")
        shell.send("unobserve-id cars b")
        #expect(waitFor("unobserved: cars hp > 0"))
        #expect(waitFor(#"unobserved: cars "b""#))
        shell.send("help")
        #expect(eventually { shell.stdout.contains("observe-id COLLECTION ID        print the document's events") })
        shell.closeInput()
        #expect(shell.wait() == 0)
        #expect(shell.stderr.isEmpty, "\(shell.stderr)")
    }
}
