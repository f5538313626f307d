import Foundation
import Testing
import TrellisTestKit

/// `trellis shell` at a terminal edits lines with libedit: keys, history kept in a file, Ctrl-R,
/// Tab completion, and events shown above the line being typed without disturbing it. Driven in a
/// pseudo-terminal (tmux); every step waits for the screen to show what it expects.
@Suite(.serialized, .enabled(if: Terminal.isAvailable, "needs tmux (scripts/setup.sh installs it)"))
struct ShellLineEditingTests {
    let dir = TemporaryDirectory("trellis-line-editing")

    /// The lines a command printed: those after its `n`-th prompt line (from 1) up to the next
    /// prompt.
    static func output(of command: String, _ n: Int = 1, on screen: [String]) -> [String]? {
        let prompts = screen.indices.filter { screen[$0] == "trellis> \(command)" }
        guard prompts.count >= n else { return nil }
        let rest = screen[(prompts[n - 1] + 1)...]
        return Array(rest.prefix { !$0.hasPrefix("trellis>") })
    }

    func shell(data: String, key: String, history: String, peer: UInt16? = nil) throws -> Terminal {
        var arguments = [Repository.trellisBinary.path, "shell", "--no-discovery", "--data", data, "--mesh-key", key]
        if let peer { arguments += ["--peer", "127.0.0.1:\(peer)"] }
        return try Terminal(
            arguments,
            environment: ["TRELLIS_HISTORY": history, "LANG": "C.UTF-8", "EDITRC": dir.path("no-editrc")], in: dir)
    }

    @Test func editsRecallsCompletesAndKeepsTheTypedLineUnderEvents() throws {
        let key = try makeMeshKey(in: dir)
        let data = dir.path("A")
        let seed = try TrellisProcess.run(
            ["shell", "--data", data, "--mesh-key", key, "--quiet"],
            input: #"""
                upsert cars {"_id": "a", "hp": 1, "specs": {"wheels": 4}}
                upsert cars {"_id": "b", "hp": 2}
                upsert cXars {"_id": "x"}
                """#)
        #expect(seed.status == 0, "\(seed.stderr)")
        // A peer whose writes reach the terminal's shell as observe events.
        let peer = try TrellisProcess(["shell", "--data", dir.path("P"), "--mesh-key", key, "--listen", "127.0.0.1:0"])
        let port = try #require(peer.listeningPort())
        let history = dir.path("state/history")
        let term = try shell(data: data, key: key, history: history, peer: port)
        // The session's log line is shown above the prompt, which stays on the last line.
        #expect(term.waitForScreen { $0.contains { $0.contains("session established") } && $0.last == "trellis>" })

        // Editing: Left three times from the end of `count cars` puts X before `a`.
        term.type("count cars")
        term.press("Left", "Left", "Left")
        term.type("X")
        term.press("Enter")
        #expect(term.waitForScreen { Self.output(of: "count cXars", on: $0) == ["1"] && $0.last == "trellis>" })

        // Up recalls the line.
        term.press("Up")
        #expect(term.waitForScreen { $0.last == "trellis> count cXars" })
        term.press("Enter")
        #expect(term.waitForScreen { Self.output(of: "count cXars", 2, on: $0) == ["1"] && $0.last == "trellis>" })

        // Tab completes a unique command prefix, then a collection name, then a field path.
        term.type("cou")
        term.press("Tab")
        #expect(term.waitForScreen { $0.last == "trellis> count" })
        term.type("car")
        term.press("Tab")
        #expect(term.waitForScreen { $0.last == "trellis> count cars" })
        term.type("sp")
        term.press("Tab")
        #expect(term.waitForScreen { $0.last == "trellis> count cars specs" })
        term.type(".w")
        term.press("Tab")
        #expect(term.waitForScreen { $0.last == "trellis> count cars specs.wheels" })
        term.type(" == 4")
        term.press("Enter")
        #expect(term.waitForScreen { Self.output(of: "count cars specs.wheels == 4", on: $0) == ["1"] })

        // Ctrl-R finds the earlier line holding `cX`; Enter runs it.
        #expect(term.waitForScreen { $0.last == "trellis>" })
        term.press("C-r")
        term.type("cX")
        term.press("Enter")
        #expect(term.waitForScreen { Self.output(of: "count cXars", 3, on: $0) == ["1"] && $0.last == "trellis>" })

        // An event arriving while a line is half typed is shown above it; the line stays as typed.
        term.type("subscribe cars")
        term.press("Enter")
        #expect(term.waitForScreen { $0.contains("subscribed: cars true") && $0.last == "trellis>" })
        term.type("observe cars hp > 5")
        term.press("Enter")
        #expect(term.waitForScreen { $0.contains("observe cars hp > 5: initial 0") && $0.last == "trellis>" })
        term.type("find ca")
        #expect(term.waitForScreen { $0.last == "trellis> find ca" })
        peer.send(#"upsert cars {"_id": "late", "hp": 9}"#)
        #expect(
            term.waitForScreen {
                $0.contains(#"  inserted 0 {"_id":"late","hp":9}"#) && $0.last == "trellis> find ca"
            })
        term.type("rs hp > 5")
        term.press("Enter")
        #expect(
            term.waitForScreen { Self.output(of: "find cars hp > 5", on: $0) == [#"{"_id":"late","hp":9}"#] })

        // Ctrl-D on an empty line ends the shell; the history was written line by line.
        #expect(term.waitForScreen { $0.last == "trellis>" })
        term.press("C-d")
        #expect(eventually { !term.isRunning })
        let saved = try String(contentsOfFile: history, encoding: .utf8)
        #expect(saved.contains(#"find\040cars\040hp\040>\0405"#), "\(saved)")
        let mode = try FileManager.default.attributesOfItem(atPath: history)[.posixPermissions] as? Int
        #expect(mode == 0o600)

        // A second session recalls the first one's lines.
        let again = try shell(data: data, key: key, history: history)
        #expect(again.waitForScreen { $0.last == "trellis>" })
        again.press("Up")
        #expect(again.waitForScreen { $0.last == "trellis> find cars hp > 5" })
        again.press("Up")
        #expect(again.waitForScreen { $0.last == "trellis> observe cars hp > 5" })
        again.press("C-u", "C-d")
        #expect(eventually { !again.isRunning })
        peer.closeInput()
        #expect(peer.wait() == 0)
    }

    /// `trellis attach` at a terminal edits lines too: Tab completes a command, the line is sent
    /// to the running node, and an event the node sends while a line is typed is shown above it.
    @Test func attachEditsLinesAndShowsEventsAboveTheTypedLine() throws {
        let key = try makeMeshKey(in: dir)
        let data = dir.path("N")
        let node = try TrellisProcess(["node", "--data", data, "--mesh-key", key])
        defer { _ = node.terminate() }
        #expect(eventually { (try? TrellisProcess.run(["status", "--data", data]).status) == 0 })
        let term = try Terminal(
            [Repository.trellisBinary.path, "attach", "--data", data, "--no-history"],
            environment: ["LANG": "C.UTF-8", "EDITRC": dir.path("no-editrc")], in: dir)
        #expect(term.waitForScreen { $0.last == "trellis>" })
        term.type("collec")
        term.press("Tab")
        #expect(term.waitForScreen { $0.last == "trellis> collections" })
        term.press("Enter")
        #expect(term.waitForScreen { Self.output(of: "collections", on: $0) == ["no collections"] })
        term.type("observe cars")
        term.press("Enter")
        #expect(term.waitForScreen { $0.contains("observe cars true: initial 0") && $0.last == "trellis>" })
        term.type("coun")
        let write = try TrellisProcess.run(
            ["attach", "--data", data], input: #"upsert cars {"_id": "e"}"# + "\n")
        #expect(write.status == 0, "\(write.stderr)")
        #expect(
            term.waitForScreen { screen in
                screen.contains("observe cars true: update 1") && screen.last == "trellis> coun"
            })
        term.type("t cars")
        term.press("Enter")
        #expect(term.waitForScreen { Self.output(of: "count cars", on: $0) == ["1"] })
        term.press("C-d")
        #expect(eventually { !term.isRunning })
        #expect(node.isRunning, "the node runs on after the attach")
    }

    /// `--no-history` keeps no file; the session's own lines are still recalled.
    @Test func noHistoryWritesNoFile() throws {
        let key = try makeMeshKey(in: dir)
        let history = dir.path("unused/history")
        let term = try Terminal(
            [
                Repository.trellisBinary.path, "shell", "--no-discovery", "--no-history", "--data", dir.path("B"),
                "--mesh-key", key, "--quiet",
            ],
            environment: ["TRELLIS_HISTORY": history, "LANG": "C.UTF-8", "EDITRC": dir.path("no-editrc")], in: dir)
        #expect(term.waitForScreen { $0.last == "trellis>" })
        term.type("collections")
        term.press("Enter")
        #expect(term.waitForScreen { Self.output(of: "collections", on: $0) == ["no collections"] })
        term.press("Up")
        #expect(term.waitForScreen { $0.last == "trellis> collections" })
        term.press("C-u", "C-d")
        #expect(eventually { !term.isRunning })
        #expect(!FileManager.default.fileExists(atPath: history))
    }
}
