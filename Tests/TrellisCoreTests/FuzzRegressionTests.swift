import Foundation
import Testing
import TrellisCore
import TrellisTestKit

/// Every input saved for a fuzz target (its seed corpus, `Fuzz/<Target>/Corpus`, and the inputs
/// that once broke it, `Fuzz/<Target>/Regressions`) still passes the target's check.
@Suite struct FuzzRegressionTests {
    static let fuzzDirectory = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Fuzz")

    @Test(arguments: FuzzChecks.targets.map(\.name))
    func savedInputsPassTheirCheck(target: String) throws {
        let check = try #require(FuzzChecks.targets.first { $0.name == target }?.check)
        var replayed = 0
        for folder in ["Corpus", "Regressions"] {
            let directory = Self.fuzzDirectory.appendingPathComponent(target).appendingPathComponent(folder)
            let names = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
            for name in names.sorted() where !name.hasPrefix(".") {
                let path = directory.appendingPathComponent(name).path
                let input = try #require(FileManager.default.contents(atPath: path), "cannot read \(path)")
                do {
                    try check(Array(input))
                } catch {
                    Issue.record("\(target)/\(folder)/\(name): \(error)")
                }
                replayed += 1
            }
        }
        #expect(replayed > 0, "no saved inputs for \(target) in \(Self.fuzzDirectory.path)")
    }

    /// The seed input for resumed sessions reaches what it is for: a node that cannot take the
    /// peer's `r` asks for its `hello`, keeps the batch, refusal and presence the peer sends before
    /// it, and takes them once the peer's `hello` and `subs` are here (the batch is acknowledged).
    @Test func theResumeSeedIsAskedForItsHelloAndItsEarlyBatchIsTaken() throws {
        let path = Self.fuzzDirectory.appendingPathComponent("FuzzSession/Corpus/resume-asked-for-its-hello").path
        let input = try #require(FileManager.default.contents(atPath: path))
        let replies = try FuzzChecks.sessionReplies(Array(input)).map { try WireMessage(serialized: $0) }
        #expect(replies.contains(.helloRequest), "\(replies)")
        #expect(replies.contains { if case .ack(_, 5, _) = $0 { true } else { false } }, "\(replies)")
        // The second `r`, after the hello, closes the session as a protocol error.
        #expect(replies.contains { if case .error("protocol", _) = $0 { true } else { false } }, "\(replies)")
    }

    /// The fuzzed session reuses one store across inputs: each input still gets the same replies
    /// whatever ran before it, so a crash found in a long run replays from its input alone.
    @Test func aSessionInputsRepliesDoNotDependOnTheInputsBeforeIt() throws {
        var inputs: [(name: String, bytes: [UInt8])] = []
        for folder in ["Corpus", "Regressions"] {
            let directory = Self.fuzzDirectory.appendingPathComponent("FuzzSession").appendingPathComponent(folder)
            let names = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
            for name in names.sorted() where !name.hasPrefix(".") {
                let path = directory.appendingPathComponent(name).path
                inputs.append(("\(folder)/\(name)", Array(try #require(FileManager.default.contents(atPath: path)))))
            }
        }
        try #require(inputs.count >= 2)
        // Each input in turn, then in the opposite order, then each twice in a row.
        let forward = try inputs.map { try FuzzChecks.sessionReplies($0.bytes) }
        let backward = Array(try inputs.reversed().map { try FuzzChecks.sessionReplies($0.bytes) }.reversed())
        for (i, input) in inputs.enumerated() {
            let again = try FuzzChecks.sessionReplies(input.bytes)
            let same = forward[i] == backward[i] && again == forward[i]
            #expect(
                same,
                "\(input.name): \(forward[i].count), \(backward[i].count) and \(again.count) replies in the three runs")
        }
    }

    /// Each directory `Fuzz/Fuzz*` is a target with a check, and each check has its directory.
    @Test func everyTargetHasItsDirectoryAndCheck() throws {
        let directories = try FileManager.default.contentsOfDirectory(atPath: Self.fuzzDirectory.path)
            .filter { $0.hasPrefix("Fuzz") }
        #expect(Set(directories) == Set(FuzzChecks.targets.map(\.name)))
    }
}
