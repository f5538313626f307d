/// A document value: the types Trellis stores and replicates.
///
/// Types survive every round trip bit-exactly: `.int` stays `Int64`, `.double` stays `Double`
/// (including the sign of `-0.0`), strings are kept as given (never Unicode-normalised).
/// Doubles are finite: ``Value/validate()`` rejects NaN and ±Infinity.
///
/// Equality is structural; doubles compare by bit pattern so `-0.0 != 0.0` here, which is what
/// replication needs (a change of sign is a change). Query comparisons use numeric order instead,
/// see ``Value/compare(_:_:)``.
public enum Value: Sendable {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case bytes([UInt8])
    case array([Value])
    /// A map; keys are byte strings, kept in UTF-8 byte order (see ``UTF8Map``).
    case map(UTF8Map<Value>)
}

extension Value: Hashable {
    public static func == (lhs: Value, rhs: Value) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): return true
        case (.bool(let a), .bool(let b)): return a == b
        case (.int(let a), .int(let b)): return a == b
        case (.double(let a), .double(let b)): return a.bitPattern == b.bitPattern
        case (.string(let a), .string(let b)): return a.utf8.elementsEqual(b.utf8)
        case (.bytes(let a), .bytes(let b)): return a == b
        case (.array(let a), .array(let b)): return a == b
        case (.map(let a), .map(let b)): return a == b
        default: return false
        }
    }

    public func hash(into hasher: inout Hasher) {
        switch self {
        case .null: hasher.combine(0)
        case .bool(let b):
            hasher.combine(1)
            hasher.combine(b)
        case .int(let i):
            hasher.combine(2)
            hasher.combine(i)
        case .double(let d):
            hasher.combine(3)
            hasher.combine(d.bitPattern)
        case .string(let s):
            hasher.combine(4)
            UTF8Key.hash(s, into: &hasher)
        case .bytes(let b):
            hasher.combine(5)
            hasher.combine(b)
        case .array(let a):
            hasher.combine(6)
            hasher.combine(a)
        case .map(let m):
            hasher.combine(7)
            hasher.combine(m)
        }
    }
}

extension Value {
    /// The map entries, or `nil` when this is not a map.
    public var mapValue: UTF8Map<Value>? {
        if case .map(let m) = self { return m }
        return nil
    }

    /// The string, or `nil` when this is not a string.
    public var stringValue: String? {
        if case .string(let s) = self { return s }
        return nil
    }

    /// The integer, or `nil` when this is not an `.int`.
    public var intValue: Int64? {
        if case .int(let i) = self { return i }
        return nil
    }

    /// The number as a `Double` for `.int` and `.double`, otherwise `nil`.
    public var numberValue: Double? {
        switch self {
        case .int(let i): return Double(i)
        case .double(let d): return d
        default: return nil
        }
    }

    /// Member of a map by key, compared byte-wise; `nil` when absent or when this is not a map.
    ///
    /// - Complexity: O(log n) in the number of keys.
    public subscript(key: String) -> Value? {
        mapValue?[key]
    }

    /// The value at a field path, `nil` when any step is missing. Keys match byte-wise: the
    /// path `é` (U+00E9) does not reach the key `e` + U+0301.
    ///
    /// - Complexity: O(path length × log of the map sizes on the way).
    public func value(at path: FieldPath) -> Value? {
        var current = self
        for component in path.components {
            switch (component, current) {
            case (.key(let k), .map(let m)):
                guard let next = m[k] else { return nil }
                current = next
            case (.index(let i), .array(let a)):
                guard i >= 0, i < a.count else { return nil }
                current = a[i]
            default:
                return nil
            }
        }
        return current
    }

    /// A short name of the type, used in error messages.
    public var typeName: String {
        switch self {
        case .null: return "null"
        case .bool: return "bool"
        case .int: return "int"
        case .double: return "double"
        case .string: return "string"
        case .bytes: return "bytes"
        case .array: return "array"
        case .map: return "map"
        }
    }

    /// Maps and arrays nested deeper than this cannot be stored (every peer must be able to decode
    /// what a node stores; the wire decoder's limits leave room for this depth).
    public static let maximumDepth = 64

    /// The document key this value names as an `_id`: its canonical JSON when it is a non-empty
    /// string or map (the values an `_id` may be, docs/DATA-MODEL.md rule 10), else `nil`.
    ///
    /// - Complexity: O(size of the value).
    public var documentKey: String? {
        switch self {
        case .string(let s) where !s.isEmpty: return JSON.string(self)
        case .map(let m) where !m.isEmpty: return JSON.string(self)
        default: return nil
        }
    }

    /// The `_id` a document key names (the inverse of ``documentKey``): read without the JSON
    /// parser when the key is a string with nothing escaped, the common case; else parsed.
    ///
    /// - Throws: ``JSONError`` when the key is not JSON.
    /// - Complexity: O(length of the key).
    public static func id(ofDocumentKey key: String) throws(JSONError) -> Value {
        var key = key
        let plain = key.withUTF8 { bytes -> String? in
            // `"…"` with no escape inside: canonical JSON escapes `"`, `\` and control characters.
            guard bytes.count >= 2, bytes.first == UInt8(ascii: "\""), bytes.last == UInt8(ascii: "\"") else {
                return nil
            }
            let inner = UnsafeBufferPointer(rebasing: bytes[1..<(bytes.count - 1)])
            guard !inner.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") })
            else { return nil }
            return String(decoding: inner, as: UTF8.self)
        }
        if let plain { return .string(plain) }
        return try JSON.parse(key)
    }

    /// Checks that the value can be stored: every double is finite, nesting is at most
    /// ``maximumDepth`` levels, and no map uses the key `$bytes`, which is how JSON spells a byte
    /// string (`{"$bytes": "<base64>"}`).
    ///
    /// - Throws: ``ValueError`` naming the first offending path.
    /// - Complexity: O(size of the value).
    public func validate(path: String = "") throws(ValueError) {
        // The common case, a storable value, is checked without spelling any path.
        guard !isStorable(depth: 0) else { return }
        try validate(path: path, depth: 0)
    }

    /// What ``validate(path:)`` checks, without naming where it fails.
    private func isStorable(depth: Int) -> Bool {
        switch self {
        case .double(let d): return d.isFinite
        case .array(let a):
            guard depth < Value.maximumDepth else { return false }
            for element in a where !element.isStorable(depth: depth + 1) { return false }
            return true
        case .map(let m):
            guard depth < Value.maximumDepth else { return false }
            for (k, v) in m where k == "$bytes" || !v.isStorable(depth: depth + 1) { return false }
            return true
        default:
            return true
        }
    }

    private func validate(path: String, depth: Int) throws(ValueError) {
        switch self {
        case .double(let d) where !d.isFinite:
            throw .nonFiniteNumber(path: path.isEmpty ? "<root>" : path)
        case .array(let a):
            guard depth < Value.maximumDepth else { throw .tooDeep(path: path, limit: Value.maximumDepth) }
            for (i, element) in a.enumerated() { try element.validate(path: "\(path)[\(i)]", depth: depth + 1) }
        case .map(let m):
            guard depth < Value.maximumDepth else { throw .tooDeep(path: path, limit: Value.maximumDepth) }
            for (k, v) in m {
                let child = path.isEmpty ? k : "\(path).\(k)"
                if k == "$bytes" { throw .reservedKey(path: child) }
                try v.validate(path: child, depth: depth + 1)
            }
        default:
            break
        }
    }
}

/// Errors about values themselves.
public enum ValueError: Error, Equatable, Sendable, CustomStringConvertible {
    /// A double that is NaN or ±Infinity; Trellis stores finite numbers only.
    case nonFiniteNumber(path: String)
    /// A map key `$bytes`: JSON spells byte strings `{"$bytes": "<base64>"}`, so the key is reserved.
    case reservedKey(path: String)
    /// Maps and arrays nested deeper than ``Value/maximumDepth``.
    case tooDeep(path: String, limit: Int)

    public var description: String {
        switch self {
        case .nonFiniteNumber(let path):
            return "field '\(path)' is NaN or infinite; only finite numbers can be stored"
        case .tooDeep(let path, let limit):
            return "field '\(path)' nests maps and arrays more than \(limit) levels deep, which peers cannot decode"
        case .reservedKey(let path):
            return "field '\(path)': '$bytes' spells a byte string in JSON and must be the only key, holding "
                + "padded base64 text ({\"$bytes\": \"AAE=\"}); as a field name it is reserved"
        }
    }
}

extension Value: ExpressibleByNilLiteral, ExpressibleByBooleanLiteral, ExpressibleByIntegerLiteral,
    ExpressibleByFloatLiteral, ExpressibleByStringLiteral, ExpressibleByArrayLiteral,
    ExpressibleByDictionaryLiteral
{
    public init(nilLiteral: ()) { self = .null }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(integerLiteral value: Int64) { self = .int(value) }
    public init(floatLiteral value: Double) { self = .double(value) }
    public init(stringLiteral value: String) { self = .string(value) }
    public init(arrayLiteral elements: Value...) { self = .array(elements) }
    /// A map; a key written twice (byte-wise) keeps its last value.
    public init(dictionaryLiteral elements: (String, Value)...) {
        self = .map(UTF8Map(elements, uniquingKeysWith: { _, last in last }))
    }
}

extension Value: CustomStringConvertible {
    /// The value as compact JSON with sorted keys.
    public var description: String { JSON.string(self) }
}
