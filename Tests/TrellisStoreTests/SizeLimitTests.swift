import Testing
import TrellisCore
import TrellisStore
import TrellisTestKit

/// The document size limit refuses what a node writes; what concurrent writes merge into is kept
/// by every node up to a larger ceiling, so that nodes converge (docs/DATA-MODEL.md, "Size
/// limits"). Found by a reviewer: two nodes each added a field to a document near the limit while
/// apart; each kept the other's state deferred for good, and they never converged.
@Suite struct SizeLimitTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()

    func open(_ name: String, _ configure: (inout StoreOptions) -> Void = { _ in }) throws -> DocumentStore {
        try openStore(dir, name, clock: clock) {
            $0.maxDocumentBytes = 4_000
            $0.warnDocumentBytes = 1_000
            configure(&$0)
        }
    }

    /// A document `d` of about 2,100 bytes with its state, held by both stores.
    func shared(_ a: DocumentStore, _ b: DocumentStore) throws {
        try a.upsert(["_id": "d", "s": .string(String(repeating: "s", count: 1_000))], in: "c")
        _ = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        #expect(try b.document(id: "d", in: "c") == a.document(id: "d", in: "c"))
    }

    func set(_ store: DocumentStore, _ field: String, _ value: String) throws {
        try store.update(
            id: "d", in: "c", operations: [.set(FieldPath(components: [.key(field)]), .string(value), isDefault: false)]
        )
    }

    @Test func concurrentWritesWithinTheLimitMergeAboveItAndEveryNodeKeepsTheMerge() throws {
        let a = try open("a.sqlite")
        let b = try open("b.sqlite")
        try shared(a, b)
        // Apart, each adds 700 bytes: each document is within the limit, both together are not.
        try set(a, "fa", String(repeating: "a", count: 700))
        clock.advance(by: 1)
        try set(b, "fb", String(repeating: "b", count: 700))
        let fromA = try batch(of: a)
        let fromB = try batch(of: b)
        let intoA = try a.merge(fromB, from: [2], checkpoint: nil)
        let intoB = try b.merge(fromA, from: [1], checkpoint: nil)
        #expect(intoA.deferred.isEmpty && intoB.deferred.isEmpty)
        #expect(intoA.applied == 1 && intoB.applied == 1)
        let merged = try #require(try a.document(id: "d", in: "c"))
        #expect(merged["fa"] != nil && merged["fb"] != nil)
        #expect(try b.document(id: "d", in: "c") == merged)
        #expect(try a.state(id: "d", in: "c") == b.state(id: "d", in: "c"))
        // Passed on: a third node gets it too.
        let c = try open("c.sqlite")
        let page = try a.changes(in: "c", after: 0, limit: 10, maxBytes: .max)
        #expect(page.skipped.isEmpty)
        _ = try c.merge(try batch(of: a), from: [1], checkpoint: nil)
        #expect(try c.document(id: "d", in: "c") == merged)
    }

    /// On a document merged above the limit, a local write that would make it larger is refused;
    /// one that does not is taken, so that the app can bring it back under the limit.
    @Test func aDocumentAboveTheLimitTakesLocalWritesThatDoNotGrowIt() throws {
        let a = try open("a.sqlite")
        let b = try open("b.sqlite")
        try shared(a, b)
        try set(a, "fa", String(repeating: "a", count: 700))
        try set(b, "fb", String(repeating: "b", count: 700))
        _ = try a.merge(try batch(of: b), from: [2], checkpoint: nil)
        let error = #expect(throws: StoreError.self) { try set(a, "fc", "more") }
        #expect(error?.description.contains("above the limit of 4000 bytes") == true)
        try set(a, "fa", "short")
        #expect(try a.document(id: "d", in: "c")?["fa"] == "short")
        try a.update(id: "d", in: "c", operations: [.unset(FieldPath(components: [.key("fb")]))])
        try set(a, "fc", "more")
        #expect(try a.document(id: "d", in: "c")?["fc"] == "more")
    }

    /// Above the ceiling (here set low), a merge is still deferred, kept and retried.
    @Test func aMergeAboveTheCeilingIsDeferred() throws {
        let a = try open("a.sqlite")
        let b = try open("b.sqlite") { $0.maxMergedDocumentBytes = 4_500 }
        try shared(a, b)
        try set(a, "fa", String(repeating: "a", count: 700))
        try set(b, "fb", String(repeating: "b", count: 700))
        let outcome = try b.merge(try batch(of: a), from: [1], checkpoint: nil)
        #expect(outcome.applied == 0 && outcome.deferred.map(\.key) == ["\"d\""])
        #expect(try b.deferredDocuments().first?.reason.contains("above the limit of 4500 bytes") == true)
        #expect(try b.document(id: "d", in: "c")?["fa"] == nil)
    }
}
