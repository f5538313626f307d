/// A string that compares, orders and hashes by its UTF-8 bytes: the key type for `Set`s and
/// `Dictionary` keys that hold names from users (collection names, `_id` keys, subscription keys).
///
/// Swift's `String` compares by Unicode canonical equivalence, so a precomposed "é" (U+00E9) and
/// "e" + U+0301 are one `Set` element or one `Dictionary` key, while SQLite, JSON text, CBOR and
/// the wire treat them as two. Trellis keeps keys as byte strings in every layer and never
/// normalises them (docs/DATA-MODEL.md, "Keys are byte strings"); wrap a `String` in `UTF8Key`
/// wherever a hashed collection holds keys. For an ordered map of values use ``UTF8Map``.
///
/// Ordering is byte-wise lexicographic over UTF-8 (a shorter prefix first), which is also Unicode
/// scalar order; it is the order ``UTF8Map`` keeps and ``JSON/string(_:)`` writes.
public struct UTF8Key: Hashable, Comparable, Sendable, CustomStringConvertible, CustomDebugStringConvertible,
    ExpressibleByStringLiteral
{
    /// The key as a string, exactly as given.
    public let string: String

    /// Wraps a string; nothing is normalised.
    public init(_ string: String) {
        self.string = string
    }

    public init(stringLiteral value: String) {
        self.string = value
    }

    /// - Complexity: O(length).
    public static func == (lhs: UTF8Key, rhs: UTF8Key) -> Bool {
        UTF8Key.equal(lhs.string, rhs.string)
    }

    /// - Complexity: O(length of the common prefix).
    public static func < (lhs: UTF8Key, rhs: UTF8Key) -> Bool {
        UTF8Key.compare(lhs.string, rhs.string) < 0
    }

    /// Hashes the UTF-8 bytes and their count.
    ///
    /// - Complexity: O(length).
    public func hash(into hasher: inout Hasher) {
        UTF8Key.hash(string, into: &hasher)
    }

    /// The string itself.
    public var description: String { string }

    /// The string quoted, as `String` prints it.
    public var debugDescription: String { string.debugDescription }
}

// MARK: - Byte-wise operations on strings

extension UTF8Key {
    /// Three-way byte-wise comparison of two strings' UTF-8: negative when `a` sorts first, zero
    /// when the bytes are identical, positive when `b` sorts first.
    ///
    /// Unlike `<` and `==` on `String`, canonically equivalent spellings ("é" and "e" + U+0301)
    /// are different here.
    ///
    /// - Complexity: O(length of the common prefix).
    @inlinable
    public static func compare(_ a: String, _ b: String) -> Int {
        let fast = a.utf8.withContiguousStorageIfAvailable { x in
            b.utf8.withContiguousStorageIfAvailable { y in compare(x, y) }
        }
        if let fast, let result = fast { return result }
        var left = a.utf8.makeIterator()
        var right = b.utf8.makeIterator()
        while true {
            switch (left.next(), right.next()) {
            case (nil, nil): return 0
            case (nil, _): return -1
            case (_, nil): return 1
            case (let p?, let q?): if p != q { return p < q ? -1 : 1 }
            }
        }
    }

    @inlinable
    static func compare(_ x: UnsafeBufferPointer<UInt8>, _ y: UnsafeBufferPointer<UInt8>) -> Int {
        let common = Swift.min(x.count, y.count)
        var i = 0
        while i < common {
            let p = x[i]
            let q = y[i]
            if p != q { return p < q ? -1 : 1 }
            i += 1
        }
        return x.count == y.count ? 0 : (x.count < y.count ? -1 : 1)
    }

    /// Whether two strings have the same UTF-8 bytes (not merely canonically equivalent text).
    ///
    /// - Complexity: O(length).
    @inlinable
    public static func equal(_ a: String, _ b: String) -> Bool {
        a.utf8.count == b.utf8.count && compare(a, b) == 0
    }

    /// Feeds a string's UTF-8 bytes and their count to `hasher`, consistently with
    /// ``equal(_:_:)``.
    ///
    /// - Complexity: O(length).
    @inlinable
    public static func hash(_ s: String, into hasher: inout Hasher) {
        var s = s
        s.withUTF8 { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
        hasher.combine(s.utf8.count)
    }
}
