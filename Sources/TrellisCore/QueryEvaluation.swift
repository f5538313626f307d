// How queries compare values and evaluate on documents. The rules, with a table, are in
// docs/QUERIES.md ("Comparison semantics"); keep the two in step.

extension Value {
    /// The result of comparing two values in a query.
    public enum Ordering: Sendable, Hashable {
        case less, equal, greater
    }

    /// Query order of two values, or `nil` when a query does not order them.
    ///
    /// - Numbers (`.int` and `.double` together) compare by numeric value, exactly: an `Int64`
    ///   beyond 2^53 is not rounded to a `Double` first, so `9007199254740993 > 9007199254740992.0`.
    ///   `-0.0` equals `0.0`. NaN is unordered.
    /// - Strings compare byte-wise by UTF-8, never by Unicode canonical equivalence: a precomposed
    ///   "é" and "e" + U+0301 differ.
    /// - Bytes compare byte-wise (lexicographically); `false < true`.
    /// - Null, arrays, maps and values of different type classes are unordered (`nil`).
    ///
    /// Equality uses ``queryEquals(_:_:)``, which also covers null, arrays and maps.
    ///
    /// - Complexity: O(length of the shorter string or bytes value); O(1) otherwise.
    public static func compare(_ lhs: Value, _ rhs: Value) -> Ordering? {
        switch (lhs, rhs) {
        case (.bool(let a), .bool(let b)):
            return a == b ? .equal : (a ? .greater : .less)
        case (.int(let a), .int(let b)):
            return a < b ? .less : (a > b ? .greater : .equal)
        case (.double(let a), .double(let b)):
            if a < b { return .less }
            if a > b { return .greater }
            return a == b ? .equal : nil
        case (.int(let a), .double(let b)):
            return compareExactly(a, b)
        case (.double(let a), .int(let b)):
            return compareExactly(b, a).map(\.reversed)
        case (.string(let a), .string(let b)):
            return compareLexicographically(a.utf8, b.utf8)
        case (.bytes(let a), .bytes(let b)):
            return compareLexicographically(a, b)
        default:
            return nil
        }
    }

    /// Query equality: numbers by numeric value (`4 == 4.0`, `-0.0 == 0.0`), strings byte-wise,
    /// null equal to null, arrays element by element and maps key by key with these same rules.
    /// Values of different type classes are never equal.
    ///
    /// This differs from `==` on ``Value``, which is structural and bit-exact (`4 != 4.0` there).
    ///
    /// - Complexity: O(size of the smaller value).
    public static func queryEquals(_ lhs: Value, _ rhs: Value) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null):
            return true
        case (.array(let a), .array(let b)):
            guard a.count == b.count else { return false }
            for (x, y) in zip(a, b) where !queryEquals(x, y) { return false }
            return true
        case (.map(let a), .map(let b)):
            guard a.count == b.count else { return false }
            for (key, x) in a {
                guard let y = b[key], queryEquals(x, y) else { return false }
            }
            return true
        default:
            return compare(lhs, rhs) == .equal
        }
    }

    /// Compares an `Int64` and a `Double` without rounding either.
    ///
    /// Doubles outside [-2^63, 2^63) are beyond every `Int64`; inside, the integral part converts to
    /// `Int64` exactly and the fraction breaks a tie.
    static func compareExactly(_ i: Int64, _ d: Double) -> Ordering? {
        if d.isNaN { return nil }
        if d >= 9_223_372_036_854_775_808.0 { return .less }  // 2^63, also +infinity
        if d < -9_223_372_036_854_775_808.0 { return .greater }  // below -2^63, also -infinity
        let whole = d.rounded(.towardZero)
        let w = Int64(whole)
        if i < w { return .less }
        if i > w { return .greater }
        let fraction = d - whole
        if fraction > 0 { return .less }
        if fraction < 0 { return .greater }
        return .equal
    }

    static func compareLexicographically<A: Sequence<UInt8>, B: Sequence<UInt8>>(_ a: A, _ b: B) -> Ordering {
        var left = a.makeIterator()
        var right = b.makeIterator()
        while true {
            switch (left.next(), right.next()) {
            case (nil, nil): return .equal
            case (nil, _): return .less
            case (_, nil): return .greater
            case (let x?, let y?):
                if x != y { return x < y ? .less : .greater }
            }
        }
    }

    /// Whether `needle` occurs in `haystack` as a run of UTF-8 bytes (the empty string always does).
    ///
    /// - Complexity: O(n × m) in the worst case, O(n) typically.
    static func utf8Contains(_ haystack: String, _ needle: String) -> Bool {
        var haystack = haystack
        var needle = needle
        return haystack.withUTF8 { h in
            needle.withUTF8 { n in
                guard let first = n.first else { return true }
                guard n.count <= h.count else { return false }
                var start = 0
                let last = h.count - n.count
                while start <= last {
                    if h[start] == first {
                        var k = 1
                        while k < n.count, h[start + k] == n[k] { k += 1 }
                        if k == n.count { return true }
                    }
                    start += 1
                }
                return false
            }
        }
    }
}

extension Value.Ordering {
    /// The ordering seen from the other side.
    public var reversed: Value.Ordering {
        switch self {
        case .less: return .greater
        case .equal: return .equal
        case .greater: return .less
        }
    }
}

extension QueryPredicate {
    /// Whether a document matches this predicate.
    ///
    /// `$args` references still in the tree read as missing values; bind them first with
    /// ``bound(to:)`` (``Query/matches(_:args:)`` does).
    ///
    /// A missing field equals nothing (not even `null`): `==`, `<`, `<=`, `>`, `>=`, `contains` and
    /// `IN` on it are false, and `!=` is true, because `a != b` is exactly `!(a == b)`.
    ///
    /// - Complexity: O(number of nodes × size of the values compared); `&&` and `||` stop at the
    ///   first operand that decides them.
    public func matches(_ document: Value) -> Bool {
        switch self {
        case .constant(let b):
            return b
        case .not(let p):
            return !p.matches(document)
        case .and(let ps):
            return ps.allSatisfy { $0.matches(document) }
        case .or(let ps):
            return ps.contains { $0.matches(document) }
        case .compare(let l, let op, let r):
            guard let a = l.resolve(in: document), let b = r.resolve(in: document) else {
                return op == .notEqual
            }
            switch op {
            case .equal: return Value.queryEquals(a, b)
            case .notEqual: return !Value.queryEquals(a, b)
            case .less: return Value.compare(a, b) == .less
            case .lessOrEqual: return Value.compare(a, b).map { $0 != .greater } ?? false
            case .greater: return Value.compare(a, b) == .greater
            case .greaterOrEqual: return Value.compare(a, b).map { $0 != .less } ?? false
            }
        case .contains(let l, let r):
            guard let haystack = l.resolve(in: document), let needle = r.resolve(in: document) else { return false }
            switch (haystack, needle) {
            case (.array(let elements), _): return elements.contains { Value.queryEquals($0, needle) }
            case (.string(let s), .string(let sub)): return Value.utf8Contains(s, sub)
            default: return false
            }
        case .isIn(let l, let r):
            guard let value = l.resolve(in: document), case .array(let elements)? = r.resolve(in: document) else {
                return false
            }
            return elements.contains { Value.queryEquals(value, $0) }
        }
    }
}

extension QueryPredicate.Operand {
    /// The operand's value for `document`; `nil` for a missing field or an unbound argument.
    func resolve(in document: Value) -> Value? {
        switch self {
        case .literal(let v): return v
        case .field(let path): return document.value(at: path)
        case .argument: return nil
        }
    }
}
