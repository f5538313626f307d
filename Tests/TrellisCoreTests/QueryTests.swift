import Foundation
import Testing
import TrellisCore

// MARK: - Helpers

private func parse(_ text: String) throws -> QueryPredicate {
    try Query(text).predicate
}

private func field(_ path: String) -> QueryPredicate.Operand {
    // Test paths are plain identifiers with indexes, which FieldPath parses.
    .field(try! FieldPath(parsing: path))
}

private func fieldAt(_ components: FieldPath.Component...) -> QueryPredicate.Operand {
    .field(FieldPath(components: components))
}

private func compare(_ path: String, _ op: QueryPredicate.ComparisonOperator, _ value: Value) -> QueryPredicate {
    .compare(field(path), op, .literal(value))
}

/// The message of the parse error `text` raises, or a note that it parsed.
private func parseErrorMessage(_ text: String) -> String {
    do {
        let query = try Query(text)
        return "parsed as \(query)"
    } catch {
        return error.description
    }
}

private func matches(_ query: String, _ document: Value, args: UTF8Map<Value> = [:]) throws -> Bool {
    try Query(query).matches(document, args: args)
}

private typealias SplitMix64 = QueryTests.SplitMix64

private let car: Value = [
    "_id": "c1", "Name": "toyota corolla", "Origin": "Japan", "Cylinders": 4, "Horsepower": nil,
    "Miles_per_Gallon": 33.5,
]

@Suite("Query language")
struct QueryTests {
    // MARK: Parsing

    @Test(arguments: QueryPredicate.ComparisonOperator.allCases)
    func parsesEveryComparisonOperator(op: QueryPredicate.ComparisonOperator) throws {
        #expect(try parse("a \(op.rawValue) 1") == compare("a", op, 1))
        #expect(try parse("a\(op.rawValue)1") == compare("a", op, 1))
        #expect(try parse("1 \(op.rawValue) a") == .compare(.literal(1), op, field("a")))
    }

    @Test func parsesLogicalOperatorsWithPrecedence() throws {
        let a = compare("a", .equal, 1)
        let b = compare("b", .equal, 2)
        let c = compare("c", .equal, 3)
        #expect(try parse("a == 1 && b == 2") == .and([a, b]))
        #expect(try parse("a == 1 || b == 2") == .or([a, b]))
        #expect(try parse("a == 1 || b == 2 && c == 3") == .or([a, .and([b, c])]))
        #expect(try parse("a == 1 && b == 2 || c == 3") == .or([.and([a, b]), c]))
        #expect(try parse("(a == 1 || b == 2) && c == 3") == .and([.or([a, b]), c]))
        #expect(try parse("a == 1 && b == 2 && c == 3") == .and([a, b, c]))
        #expect(try parse("!(a == 1) && b == 2") == .and([.not(a), b]))
        #expect(try parse("!(a == 1 || b == 2)") == .not(.or([a, b])))
        #expect(try parse("!!(a == 1)") == .not(.not(a)))
        #expect(try parse("!true") == .not(.constant(true)))
        #expect(try parse("!contains(t, 1)") == .not(.contains(field("t"), .literal(1))))
        #expect(try parse("((a == 1))") == a)
        #expect(try parse("  a  ==\n1\t") == a)
    }

    @Test func parsesMatchAllAndConstants() throws {
        #expect(try parse("") == .constant(true))
        #expect(try parse("   \n") == .constant(true))
        #expect(try parse("true") == .constant(true))
        #expect(try parse("false") == .constant(false))
        #expect(try parse("true && false") == .and([.constant(true), .constant(false)]))
        #expect(try parse("true == a") == .compare(.literal(true), .equal, field("a")))
        #expect(Query.all.isMatchAll)
        #expect(try Query("").isMatchAll)
        #expect(try Query("") == Query.all)
        #expect(try !Query("false").isMatchAll)
    }

    @Test func parsesFieldPaths() throws {
        #expect(
            try parse("a.b[2].c == 1")
                == .compare(fieldAt(.key("a"), .key("b"), .index(2), .key("c")), .equal, .literal(1)))
        #expect(
            try parse("m[0][1] == 1")
                == .compare(fieldAt(.key("m"), .index(0), .index(1)), .equal, .literal(1)))
        #expect(try parse("_id == 'x'") == compare("_id", .equal, "x"))
        #expect(try parse("_id.part == 1") == compare("_id.part", .equal, 1))
        #expect(try parse("$price == 1") == compare("$price", .equal, 1))
        #expect(try parse("`a.b` == 1") == .compare(fieldAt(.key("a.b")), .equal, .literal(1)))
        #expect(
            try parse("x.`odd key`[1].`` == 1")
                == .compare(fieldAt(.key("x"), .key("odd key"), .index(1), .key("")), .equal, .literal(1)))
        #expect(try parse("`a\\`b` == 1") == .compare(fieldAt(.key("a`b")), .equal, .literal(1)))
        // Keywords are fields when quoted or when part of a longer path.
        #expect(try parse("`true` == 1") == .compare(fieldAt(.key("true")), .equal, .literal(1)))
        #expect(try parse("null.x == 1") == compare("null.x", .equal, 1))
        #expect(try parse("contains == 1") == compare("contains", .equal, 1))
        #expect(
            try parse("`$args`.x == 1")
                == .compare(fieldAt(.key("$args"), .key("x")), .equal, .literal(1)))
    }

    @Test func parsesArguments() throws {
        #expect(
            try parse("mileage > $args.min")
                == .compare(field("mileage"), .greater, .argument(FieldPath(components: [.key("min")]))))
        #expect(
            try parse("$args.a.b[1] == x")
                == .compare(.argument(FieldPath(components: [.key("a"), .key("b"), .index(1)])), .equal, field("x")))
        #expect(
            try Query("a == $args.x && b IN $args.ys && c > $args.x").predicate.argumentPaths
                == [FieldPath(components: [.key("x")]), FieldPath(components: [.key("ys")])])
    }

    @Test func parsesInAndContains() throws {
        #expect(try parse("color IN ['red', 'blue']") == .isIn(field("color"), .literal(["red", "blue"])))
        #expect(try parse("color in []") == .isIn(field("color"), .literal([])))
        #expect(try parse("color IN[1]") == .isIn(field("color"), .literal([1])))
        #expect(
            try parse("color IN $args.colors")
                == .isIn(field("color"), .argument(FieldPath(components: [.key("colors")]))))
        #expect(try parse("contains(tags, 'x')") == .contains(field("tags"), .literal("x")))
        #expect(
            try parse("contains ( a.b , $args.t )")
                == .contains(field("a.b"), .argument(FieldPath(components: [.key("t")]))))
        #expect(
            try parse("contains(a, 1) && IN IN [1]")
                == .and([.contains(field("a"), .literal(1)), .isIn(field("IN"), .literal([1]))]))
    }

    @Test func parsesLiterals() throws {
        let cases: [(String, Value)] = [
            ("null", nil), ("true", true), ("false", false),
            ("0", 0), ("42", 42), ("-7", -7), ("007", 7),
            ("9223372036854775807", .int(.max)), ("-9223372036854775808", .int(.min)),
            ("9223372036854775808", .double(9_223_372_036_854_775_808.0)),
            ("1.5", 1.5), ("-0.0", .double(-0.0)), ("1e3", .double(1000)), ("2.5E-3", 0.0025),
            ("1e+2", .double(100)), ("4.0", .double(4)),
            ("'red'", "red"), ("\"red\"", "red"), ("''", ""),
            ("'it\\'s'", "it's"), ("\"say \\\"hi\\\"\"", "say \"hi\""), ("'a\\\\b'", "a\\b"),
            ("'\\n\\t\\r\\/\\`'", "\n\t\r/`"), ("'\\u00e9'", "\u{E9}"), ("'\\u00E9'", "\u{E9}"),
            ("'\\ud83d\\ude00'", "\u{1F600}"), ("'\\u0000'", "\u{0}"), ("'é ü 😀'", "é ü 😀"),
            ("'\"'", "\""), ("\"'\"", "'"),
            ("x'00ff7F'", .bytes([0, 255, 127])), ("X''", .bytes([])),
            ("[1, 'a', [null], {}]", [1, "a", [nil], [:]]),
            ("{'a': 1, b: [true], \"c d\": {}}", ["a": 1, "b": [true], "c d": [:]]),
        ]
        for (text, value) in cases {
            #expect(try parse("v == \(text)") == compare("v", .equal, value), "literal \(text)")
        }
        // Bit-exact: -0.0 keeps its sign, 4.0 stays a double.
        guard case .compare(_, _, .literal(.double(let d))) = try parse("v == -0.0") else {
            Issue.record("-0.0 did not parse as a double")
            return
        }
        #expect(d.sign == .minus)
    }

    @Test func descriptionIsCanonicalAndRoundTrips() throws {
        let texts = [
            "color == 'red' && mileage > $args.min",
            "a == 1 || b == 2 && c == 3",
            "(a == 1 || b == 2) && !(c == 3)",
            "((a == 1 && b == 2) && c == 3)",
            "(a == 1 || b == 2) || c == 3",
            "!!true", "!contains(tags, 'x')", "false", "",
            "x IN [1, 2.0, 'three', null, [true], {'k': x'00ff'}]",
            "`true` == 1 && `a.b`.c[3] != `$args`.d && `` == ''",
            "s == 'it\\'s \\\\ \\n \\u0001 é' && IN in $args.`odd name`[2]",
            "d == -0.0 && e == 1e-07 && f == 1e+100 && g == 4.0 && h == -9223372036854775808",
            "a<=b&&c>=d||e!=f",
        ]
        for text in texts {
            let query = try Query(text)
            let canonical = query.description
            let reparsed = try Query(canonical)
            #expect(reparsed.predicate == query.predicate, "\(text) -> \(canonical)")
            #expect(reparsed.description == canonical)
            #expect(reparsed == query)
            #expect(reparsed.hashValue == query.hashValue)
        }
        #expect(try Query("a==1&&(b=='x'||!(c<2.5))").description == "a == 1 && (b == 'x' || !(c < 2.5))")
        #expect(try Query("a == 1").text == "a == 1")
        #expect(try Query("a  ==  1").text == "a  ==  1")
        #expect(Query(predicate: .and([compare("a", .equal, 1), .constant(false)])).text == "a == 1 && false")
    }

    @Test func walksTheTree() throws {
        let predicate = try parse("a == 1 && (contains(b.c, $args.x) || !(d IN [1]))")
        var kinds: [String] = []
        predicate.forEach { node in
            switch node {
            case .and: kinds.append("and")
            case .or: kinds.append("or")
            case .not: kinds.append("not")
            case .compare: kinds.append("compare")
            case .contains: kinds.append("contains")
            case .isIn: kinds.append("in")
            case .constant: kinds.append("constant")
            }
        }
        #expect(kinds == ["and", "compare", "or", "contains", "not", "in"])
        #expect(
            predicate.fieldPaths == [
                FieldPath(components: [.key("a")]), FieldPath(components: [.key("b"), .key("c")]),
                FieldPath(components: [.key("d")]),
            ])
        #expect(predicate.children.count == 2)
        #expect(predicate.hasArguments)
        #expect(try !predicate.bound(to: ["x": 1]).hasArguments)
    }

    // MARK: Evaluation

    @Test func evaluatesTheDittoExample() throws {
        let query = try Query("color == 'red' && mileage > $args.min")
        let redCar: Value = ["color": "red", "mileage": 12_000]
        #expect(try query.matches(redCar, args: ["min": 10_000]))
        #expect(try !query.matches(redCar, args: ["min": 12_000]))
        #expect(try query.matches(redCar, args: ["min": 11_999.5]))
        #expect(try !query.matches(["color": "blue", "mileage": 12_000], args: ["min": 10_000]))
        let bound = try query.bind(args: ["min": 10_000])
        #expect(bound.text == "color == 'red' && mileage > 10000")
        #expect(try bound.matches(redCar))
    }

    @Test func evaluatesCarsDocuments() throws {
        #expect(try matches("Origin == 'Japan'", car))
        #expect(try !matches("Origin == 'japan'", car))
        #expect(try matches("Cylinders >= 4 && Miles_per_Gallon > 30.0", car))
        #expect(try !matches("Cylinders > 4 || Miles_per_Gallon < 30", car))
        #expect(try matches("Name == \"toyota corolla\" && _id == 'c1'", car))
        #expect(try matches("Origin IN ['USA', 'Japan']", car))
        #expect(try !matches("Origin IN ['USA', 'Europe']", car))
        #expect(try matches("contains(Name, 'corolla')", car))
        #expect(try matches("Origin IN $args.origins", car, args: ["origins": ["Japan"]]))
        #expect(try matches("true", car) && !matches("false", car) && matches("", car))
    }

    @Test func nullIsNotMissing() throws {
        #expect(try matches("Horsepower == null", car))
        #expect(try !matches("Horsepower != null", car))
        #expect(try !matches("Acceleration == null", car))
        // `!=` is exactly `!(==)`: a missing field is "not equal" to everything.
        #expect(try matches("Acceleration != null", car))
        #expect(try matches("Acceleration != 5", car))
        #expect(try matches("!(Acceleration == 5)", car))
        #expect(try !matches("Acceleration < 5 || Acceleration >= 5", car))
        #expect(try !matches("Acceleration == Acceleration2", car))
        #expect(try !matches("Horsepower < 1 || Horsepower >= 1 || Horsepower <= null", car))
        #expect(try !matches("contains(Acceleration, 1) || Acceleration IN [null]", car))
        #expect(try matches("Horsepower IN [1, null]", car))
        #expect(try !matches("Name[0] == 't'", car))
        #expect(try !matches("Name.first == 't'", car))
    }

    @Test func comparesIntAndDoubleNumerically() throws {
        #expect(try matches("Cylinders == 4.0", car))
        #expect(try matches("Cylinders != 4.5 && Cylinders < 4.5 && Cylinders > 3.999", car))
        #expect(try matches("Miles_per_Gallon > 33 && Miles_per_Gallon < 34", car))
        #expect(try matches("Cylinders IN [4.0]", car))
        #expect(try matches("9007199254740993 > 9007199254740992.0", nil))
        #expect(try matches("9007199254740993 != 9007199254740992.0", nil))
        #expect(try matches("9007199254740992.0 < 9007199254740993", nil))
        #expect(try matches("9007199254740992 == 9007199254740992.0", nil))
        #expect(try matches("big > 9007199254740992.0", ["big": .int(9_007_199_254_740_993)]))
        #expect(try matches("9223372036854775807 < 9223372036854775808.0", nil))
        #expect(try matches("-9223372036854775808 == -9223372036854775808.0", nil))
        #expect(try matches("-9223372036854775808 > -9223372036854777856.0", nil))
        #expect(try matches("-1 < -0.5 && 0 > -0.5 && 0 == -0.0 && -0.0 <= 0", nil))
        #expect(try matches("z == 0 && z == 0.0", ["z": .double(-0.0)]))
    }

    @Test func exactIntDoubleComparisonAgreesWithFloat80() throws {
        #if arch(x86_64) && os(Linux)
            var rng = SplitMix64(state: QueryTests.seed("exactIntDoubleComparisonAgreesWithFloat80"))
            for _ in 0..<20_000 {
                let i: Int64
                switch rng.next() % 3 {
                case 0: i = Int64(bitPattern: rng.next())
                case 1: i = Int64.random(in: -(1 << 54)...(1 << 54), using: &rng)
                default: i = [Int64.min, .max, 1 << 53, (1 << 53) + 1, -(1 << 53) - 1, 0].randomElement(using: &rng)!
                }
                let d: Double
                switch rng.next() % 4 {
                case 0: d = Double(i)  // rounded neighbour
                case 1: d = Double(i).nextUp
                case 2: d = Double(bitPattern: rng.next())
                default: d = Double(i) + Double.random(in: -2...2, using: &rng)
                }
                let (x, y) = (Float80(i), Float80(d))
                let expected: Value.Ordering? = d.isNaN ? nil : x < y ? .less : x > y ? .greater : .equal
                #expect(Value.compare(.int(i), .double(d)) == expected, "\(i) vs \(d)")
                #expect(Value.compare(.double(d), .int(i)) == expected?.reversed, "\(d) vs \(i)")
            }
        #else
            #expect(Value.compare(.int(9_007_199_254_740_993), .double(9_007_199_254_740_992)) == .greater)
        #endif
    }

    @Test func comparesStringsByteWise() throws {
        let precomposed: Value = ["name": "\u{E9}"]  // é
        #expect(try matches("name == '\\u00e9'", precomposed))
        #expect(try matches("name == 'é'", precomposed))
        #expect(try !matches("name == 'e\\u0301'", precomposed))  // e + combining acute
        #expect(try matches("name != 'e\\u0301'", precomposed))
        #expect(try matches("name > 'e\\u0301'", precomposed))  // C3 A9 > 65 CC 81
        #expect(try matches("'Z' < 'a' && 'a' < 'b' && 'ab' > 'a' && '' < 'a'", nil))
        #expect(try matches("'z' < 'é' && 'é' < '😀'", nil))
        #expect(try !matches("contains(name, 'e')", precomposed))
        #expect(try matches("contains(name, '\\u00e9') && contains(name, '')", precomposed))
        #expect(try matches("name >= 'é' && name <= 'é'", precomposed))
    }

    @Test func comparesAcrossTypes() throws {
        let doc: Value = [
            "n": 4, "s": "4", "b": true, "z": nil, "a": [1, 2], "m": ["k": 1], "bytes": .bytes([1, 2]),
        ]
        let fields = ["n", "s", "b", "z", "a", "m", "bytes"]
        for x in fields {
            for y in fields {
                let same = x == y
                #expect(try matches("\(x) == \(y)", doc) == same, "\(x) == \(y)")
                #expect(try matches("\(x) != \(y)", doc) == !same, "\(x) != \(y)")
                if !same {
                    for op in ["<", "<=", ">", ">="] {
                        #expect(try !matches("\(x) \(op) \(y)", doc), "\(x) \(op) \(y)")
                    }
                }
            }
        }
        #expect(try matches("false < true && b > false && b >= true && !(b < true)", doc))
        #expect(try matches("bytes == x'0102' && bytes < x'0103' && bytes > x'01'", doc))
        #expect(try !matches("z < null || z <= null || z >= null", doc))
    }

    @Test func comparesArraysAndMapsStructurally() throws {
        let doc: Value = ["a": [1, 2.5, "x"], "m": ["w": 1, "h": ["d": 2.0]], "e": []]
        #expect(try matches("a == [1.0, 2.5, 'x']", doc))
        #expect(try !matches("a == [1, 2.5]", doc))
        #expect(try !matches("a == ['x', 2.5, 1]", doc))
        #expect(try matches("m == {h: {d: 2}, w: 1.0}", doc))
        #expect(try !matches("m == {w: 1}", doc))
        #expect(try matches("m != {w: 1}", doc))
        #expect(try !matches("a <= [1, 2.5, 'x'] || a >= [1, 2.5, 'x'] || m <= m", doc))
        #expect(try matches("e == [] && e != {}", doc))
        #expect(try matches("contains(a, 2.5) && contains(a, 1.0) && !contains(a, '1')", doc))
        #expect(try matches("m.h.d IN [1, 2]", doc))
        #expect(try matches("a IN [[1, 2.5, 'x']]", doc))
        #expect(try matches("a[1] == 2.5 && a[2] == 'x' && !(a[3] == null)", doc))
        #expect(try !matches("contains(m, 1) || contains(5, 5) || contains('abc', 1)", doc))
    }

    // MARK: Arguments

    @Test func missingArgumentsAreClearErrors() throws {
        let query = try Query("color == 'red' && mileage > $args.min")
        #expect(throws: QueryEvaluationError.missingArgument(name: "min")) {
            try query.matches(["color": "red"], args: [:])
        }
        do {
            _ = try query.bind(args: ["max": 1])
            Issue.record("binding without min succeeded")
        } catch {
            #expect(error.description == "missing query argument $args.min: pass a value for it in args")
        }
        // Short-circuiting never hides a missing argument.
        #expect(throws: QueryEvaluationError.missingArgument(name: "x")) {
            try Query("false && a == $args.x").matches(["a": 1])
        }
        #expect(throws: QueryEvaluationError.missingArgument(name: "r.low")) {
            try Query("a > $args.r.low").bind(args: ["r": ["high": 1]])
        }
        #expect(throws: QueryEvaluationError.self) {
            try Query("a > $args.x").bind(args: ["x": .double(.nan)])
        }
        // A query without arguments ignores them.
        #expect(try Query("a == 1").matches(["a": 1], args: ["unused": 2]))
        #expect(try Query("a > $args.r.low").matches(["a": 2], args: ["r": ["low": 1]]))
    }

    // MARK: Errors

    @Test(arguments: [
        ("(color == 'red'", "expected ')' at column 16, found end of query"),
        ("color == ", "expected a value, a field or an $args reference at column 10, found end of query"),
        ("color = 'red'", "expected '==' at column 7, found '='"),
        ("a == 1 & b == 2", "expected '&&' at column 8, found '&'"),
        ("a == 1 | b == 2", "expected '||' at column 8, found '|'"),
        ("a == 'red", "expected a closing ' (the string opened at column 6) at column 10, found end of query"),
        ("`a == 1", "expected a closing ` (the quoted name opened at column 1) at column 8, found end of query"),
        (
            "!a == 1",
            "expected '(', 'contains(', 'true', 'false' or '!' after '!' at column 2, found field 'a'; "
                + "to negate a comparison write !(a == 1)"
        ),
        (
            "isDeleted && a == 1",
            "expected a comparison operator (==, !=, <, <=, >, >=) or IN after field 'isDeleted' at column 11, "
                + "found '&&'; compare booleans explicitly, e.g. isDeleted == true"
        ),
        ("a == 1 b == 2", "expected '&&', '||' or the end of the query at column 8, found field 'b'"),
        ("a < b < c", "expected '&&', '||' or the end of the query at column 7, found '<'"),
        ("a == 1)", "expected '&&', '||' or the end of the query at column 7, found ')'"),
        ("a IN 5", "expected a list like [1, 2] or an $args reference after IN at column 6, found number 5"),
        ("a IN b", "expected a list like [1, 2] or an $args reference after IN at column 6, found field 'b'"),
        ("a == $args", "expected '.' and an argument name after '$args' at column 11, found end of query"),
        (
            "a. == 1",
            "expected a field name after '.' at column 3, found ' '; quote names that are not identifiers "
                + "in backticks: a.`odd name`"
        ),
        ("a[x] == 1", "expected an array index like [0] at column 3, found 'x'"),
        ("a[-1] == 1", "expected an array index like [0] at column 3, found '-'"),
        ("a[99999999999] == 1", "expected an array index of at most 2147483647 at column 3, found '[99999999999]'"),
        (
            "a == 'x\\q'",
            "expected an escape \\\\, \\', \\\", \\`, \\/, \\n, \\r, \\t or \\uXXXX at column 8, found '\\q'"
        ),
        ("a == '\\u12'", "expected four hex digits after \\u at column 11, found '''"),
        ("a == '\\ud800'", "expected a low surrogate \\uDC00-\\uDFFF after a high surrogate at column 13, found '''"),
        ("a == '\\udc00'", "expected a high surrogate before a low surrogate at column 7, found '\\'"),
        ("a == 1.", "expected a digit after '.' at column 8, found end of query"),
        ("a == 1e", "expected a digit in the exponent at column 8, found end of query"),
        ("a == -x", "expected a digit after '-' at column 7, found 'x'"),
        ("a == 12abc", "expected an operator or a space after the number at column 8, found 'a'"),
        ("a == 1e999", "expected a finite number (at most about 1.8e308) at column 6, found number 1e999"),
        ("a == x'abc'", "expected pairs of hex digits in a bytes literal like x'00ff' at column 11, found '''"),
        ("contains(tags 'x')", "expected ',' between the arguments of contains at column 15, found string 'x'"),
        ("contains(tags, 'x'", "expected ')' after the second argument of contains at column 19, found end of query"),
        (
            "a == [1, b]",
            "expected a constant value in the list at column 10, found field 'b'; list and map literals hold "
                + "constants only; pass a whole list as one argument: x IN $args.list"
        ),
        ("a == [1 2]", "expected ',' or ']' in the list at column 9, found number 2"),
        ("a == {'k' 1}", "expected ':' after the key at column 11, found number 1"),
        ("a == {k: 1, k: 2}", "expected each key once in a map literal at column 13, found field 'k'"),
        ("a == #", "expected a value, a field or an $args reference at column 6, found '#'"),
        ("a == 1 && ", "expected a condition at column 11, found end of query"),
        ("()", "expected a condition at column 2, found ')'"),
        ("a == 1 && \u{7}", "expected a condition at column 11, found control character U+0007"),
        ("'ééé' == x )", "expected '&&', '||' or the end of the query at column 12, found ')'"),
        (
            "a == 1 &&\n  b ==",
            "expected a value, a field or an $args reference at line 2, column 7, found end of query"
        ),
    ])
    func parseErrorsNameColumnAndExpectation(text: String, message: String) {
        #expect(parseErrorMessage(text) == message)
    }

    @Test func parseErrorCarriesOffsetsAndParts() throws {
        do {
            _ = try Query("'ééé' == x )")
            Issue.record("parsed")
        } catch {
            #expect(error.offset == 14)  // bytes: each é is two
            #expect(error.line == 1)
            #expect(error.column == 12)
            #expect(error.found == "')'")
            #expect(error.expected == "'&&', '||' or the end of the query")
            #expect(error.text == "'ééé' == x )")
        }
    }

    @Test func nestingIsLimited() throws {
        let depth = Query.maximumDepth
        let ok = String(repeating: "(", count: depth) + "a == 1" + String(repeating: ")", count: depth)
        #expect(try Query(ok).matches(["a": 1]))
        let tooDeep = String(repeating: "(", count: depth + 1) + "a == 1" + String(repeating: ")", count: depth + 1)
        #expect(
            parseErrorMessage(tooDeep)
                == "expected at most 200 levels of nesting at column 201, found '('; "
                + "split the query or flatten its parentheses")
        #expect(try Query(String(repeating: "!", count: depth) + "true").matches(nil))
        #expect(throws: QueryParseError.self) { try Query(String(repeating: "!", count: depth + 1) + "true") }
        let deepList = "a == " + String(repeating: "[", count: depth + 1) + String(repeating: "]", count: depth + 1)
        #expect(throws: QueryParseError.self) { try Query(deepList) }
        #expect(throws: QueryParseError.self) { try Query(String(repeating: "(", count: 100_000)) }
    }

    @Test func longFlatQueriesDoNotRecurse() throws {
        let count = 50_000
        let text = (0..<count).map { "a != \($0)" }.joined(separator: " && ")
        let query = try Query(text)
        guard case .and(let terms) = query.predicate else {
            Issue.record("expected a flat conjunction")
            return
        }
        #expect(terms.count == count)
        #expect(try query.matches(["a": -1]))
        #expect(try !query.matches(["a": 49_999]))
        #expect(try Query(query.description) == query)
    }

    // MARK: Fuzzing

    /// Random token soup and random bytes: the parser answers with a predicate or an error, never
    /// a trap; whatever parses prints canonical text that parses back to the same predicate, and
    /// evaluates on a document without trapping.
    @Test func fuzzedInputNeverTraps() throws {
        var rng = SplitMix64(state: QueryTests.seed("fuzzedInputNeverTraps"))
        let pieces = [
            "a", "b.c", "a[0]", "x[12].y", "_id", "`q.k`", "$args.v", "$args", "$args.", "true", "false", "null",
            "IN", "in", "contains", "contains(", "(", ")", "[", "]", "{", "}", ",", ":", "!", "==", "!=", "<",
            "<=", ">", ">=", "=", "&&", "||", "&", "|", "1", "-2", "3.5", "1e5", "1e999", "-", ".", "'s'", "\"t\"",
            "'", "\"", "`", "\\", "'\\u00e9'", "'\\ud800'", "x'0f'", "x'", "é", "😀", "\u{0}", "\n", " ", " ",
            "#", "@", "9223372036854775808", "[1, 2]", "{k: 1}",
        ]
        let document: Value = [
            "a": 1, "b": ["c": "s"], "x": [["y": 2.5]], "_id": "id", "q.k": [1, "s"], "contains": true,
        ]
        var parsed = 0
        for round in 0..<20_000 {
            var text = ""
            if round % 4 == 0 {
                let length = Int.random(in: 0...24, using: &rng)
                var bytes: [UInt8] = []
                for _ in 0..<length { bytes.append(UInt8.random(in: 0...255, using: &rng)) }
                text = String(decoding: bytes, as: UTF8.self)
            } else {
                for _ in 0..<Int.random(in: 0...12, using: &rng) {
                    text += pieces.randomElement(using: &rng)!
                    if Bool.random(using: &rng) { text += " " }
                }
            }
            let query: Query
            do {
                query = try Query(text)
            } catch {
                #expect(error.offset >= 0 && error.offset <= text.utf8.count, "\(text.debugDescription)")
                #expect(error.column >= 1)
                continue
            }
            parsed += 1
            let reparsed = try #require(try? Query(query.description), "\(text.debugDescription)")
            #expect(reparsed.predicate == query.predicate, "\(text.debugDescription)")
            _ = try? query.matches(document, args: ["v": 1])
        }
        print("fuzzedInputNeverTraps: \(parsed) of 20000 inputs parsed")
        #expect(parsed > 0)
    }

    /// Random predicate trees print canonical text that parses back to the same tree.
    @Test func randomPredicatesRoundTripThroughText() throws {
        var rng = SplitMix64(state: QueryTests.seed("randomPredicatesRoundTripThroughText"))
        for _ in 0..<2_000 {
            let predicate = randomPredicate(depth: 4, using: &rng)
            let text = predicate.description
            let parsed = try #require(try? Query(text), "\(text)")
            #expect(parsed.predicate == predicate, "\(text)")
        }
    }
}

// MARK: - Seeded randomness

extension QueryTests {
    /// SplitMix64 (Steele, Lea, Flood 2014): small, seedable, good enough for test inputs.
    struct SplitMix64: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    /// The seed from `TRELLIS_SEED`, or a fresh one; printed either way so a failure can be replayed.
    static func seed(_ name: String) -> UInt64 {
        let seed =
            ProcessInfo.processInfo.environment["TRELLIS_SEED"].flatMap { UInt64($0) }
            ?? UInt64.random(in: 0...UInt64.max)
        print("\(name): seed \(seed) (replay with TRELLIS_SEED=\(seed))")
        return seed
    }
}

// MARK: - Random predicates

private func randomValue(depth: Int, using rng: inout SplitMix64) -> Value {
    switch Int.random(in: 0..<(depth > 0 ? 9 : 7), using: &rng) {
    case 0: return .null
    case 1: return .bool(Bool.random(using: &rng))
    case 2: return .int(Int64(bitPattern: rng.next()) >> Int64.random(in: 0...63, using: &rng))
    case 3:
        let d = Double(bitPattern: rng.next())
        return .double(d.isFinite ? d : Double.random(in: -1e6...1e6, using: &rng))
    case 4: return .string(randomString(using: &rng))
    case 5: return .bytes((0..<Int.random(in: 0...4, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) })
    case 6: return .double(-0.0)
    case 7:
        let count = Int.random(in: 0...3, using: &rng)
        return .array((0..<count).map { _ in randomValue(depth: depth - 1, using: &rng) })
    default:
        var m: UTF8Map<Value> = [:]
        for _ in 0..<Int.random(in: 0...3, using: &rng) {
            m[randomString(using: &rng)] = randomValue(depth: depth - 1, using: &rng)
        }
        return .map(m)
    }
}

private func randomString(using rng: inout SplitMix64) -> String {
    let alphabet: [String] = [
        "a", "Z", "_", "$", "1", " ", ".", "'", "\"", "`", "\\", "\n", "\u{1}", "é", "😀", "e\u{301}",
    ]
    return (0..<Int.random(in: 0...5, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! }.joined()
}

private func randomPath(using rng: inout SplitMix64) -> FieldPath {
    var components: [FieldPath.Component] = [.key(randomString(using: &rng))]
    for _ in 0..<Int.random(in: 0...2, using: &rng) {
        components.append(
            Bool.random(using: &rng) ? .key(randomString(using: &rng)) : .index(Int.random(in: 0...99, using: &rng)))
    }
    return FieldPath(components: components)
}

private func randomOperand(using rng: inout SplitMix64) -> QueryPredicate.Operand {
    switch Int.random(in: 0..<3, using: &rng) {
    case 0: return .literal(randomValue(depth: 2, using: &rng))
    case 1: return .field(randomPath(using: &rng))
    default: return .argument(randomPath(using: &rng))
    }
}

private func randomPredicate(depth: Int, using rng: inout SplitMix64) -> QueryPredicate {
    let leaf = depth == 0 || Int.random(in: 0..<3, using: &rng) == 0
    if leaf {
        switch Int.random(in: 0..<4, using: &rng) {
        case 0: return .constant(Bool.random(using: &rng))
        case 1: return .contains(randomOperand(using: &rng), randomOperand(using: &rng))
        case 2:
            let list: QueryPredicate.Operand =
                Bool.random(using: &rng)
                ? .literal(.array([randomValue(depth: 1, using: &rng)])) : .argument(randomPath(using: &rng))
            return .isIn(randomOperand(using: &rng), list)
        default:
            let op = QueryPredicate.ComparisonOperator.allCases.randomElement(using: &rng)!
            return .compare(randomOperand(using: &rng), op, randomOperand(using: &rng))
        }
    }
    let count = Int.random(in: 2...3, using: &rng)
    switch Int.random(in: 0..<3, using: &rng) {
    case 0: return .not(randomPredicate(depth: depth - 1, using: &rng))
    case 1: return .and((0..<count).map { _ in randomPredicate(depth: depth - 1, using: &rng) })
    default: return .or((0..<count).map { _ in randomPredicate(depth: depth - 1, using: &rng) })
    }
}

extension QueryTests {
    /// `x IN $args.a` needs a list: another value is an error naming the argument (FuzzQuery found
    /// that it bound to a query matching nothing whose text did not parse).
    @Test func inWithAnArgumentThatIsNotAListIsAnError() throws {
        let query = try Query("mG IN $args.s.m")
        #expect(throws: QueryEvaluationError.invalidArgument(name: "s.m", reason: "IN needs a list, and it holds int"))
        {
            try query.bind(args: ["s": ["m": 1]])
        }
        let bound = try query.bind(args: ["s": ["m": [1, 2]]])
        #expect(bound.predicate.matches(["mG": 2]))
    }
}
