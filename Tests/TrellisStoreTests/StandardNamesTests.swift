import Foundation
import Testing
import Trellis
import TrellisTestKit

// This file compiles only while no public type of Trellis (or of a module it re-exports) shadows
// a standard-library or Foundation name that users write in generic code: a file that imports
// Trellis must still mean Swift's `Collection` and Foundation's `Predicate` when it says so.

/// A generic over Swift's `Collection` protocol, as any file that imports Trellis may declare.
func countOf<C: Collection>(_ c: C) -> Int { c.count }

/// Swift's `Sequence`, spelled plainly next to Trellis.
func firstOf<S: Sequence>(_ s: S) -> S.Element? { s.first { _ in true } }

@Suite struct StandardNamesTests {
    @Test func swiftCollectionIsNotShadowedByTrellis() {
        #expect(countOf([1, 2, 3]) == 3)
        #expect(countOf("abcd") == 4)
        #expect(firstOf([7, 8]) == 7)
    }

    @Test func foundationPredicateIsNotShadowedByTrellis() throws {
        let positive: Predicate<Int> = #Predicate<Int> { $0 > 0 }
        #expect(try positive.evaluate(3))
        #expect(try !positive.evaluate(-3))
    }

    @Test func trellisCollectionAndQueryPredicateKeepTheirJobs() throws {
        let dir = TemporaryDirectory("trellis-names")
        let node = try TrellisNode(directory: dir.url.appendingPathComponent("node"), meshKey: .generate())
        let cars: TrellisCollection = node.store.collection("cars")
        try cars.upsert(["_id": "a", "n": 1])
        #expect(try cars.findAll().count() == 1)
        let query = try Query("n > 0")
        let predicate: QueryPredicate = query.predicate
        #expect(predicate == Query.Predicate.compare(.field(try FieldPath(parsing: "n")), .greater, .literal(0)))
    }
}
