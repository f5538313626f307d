import Foundation
import Testing
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

    /// Each directory `Fuzz/Fuzz*` is a target with a check, and each check has its directory.
    @Test func everyTargetHasItsDirectoryAndCheck() throws {
        let directories = try FileManager.default.contentsOfDirectory(atPath: Self.fuzzDirectory.path)
            .filter { $0.hasPrefix("Fuzz") }
        #expect(Set(directories) == Set(FuzzChecks.targets.map(\.name)))
    }
}
