/// A path into a document: `a.b[2].c`.
///
/// Grammar: `segment ('.' segment | '[' digits ']')*`, where a segment is an identifier
/// (`[A-Za-z_$][A-Za-z0-9_$]*`). Keys that are not identifiers are reachable through the
/// ``components`` initialiser.
public struct FieldPath: Hashable, Sendable, CustomStringConvertible {
    /// One step of a path. Keys compare and hash by their UTF-8 bytes (``UTF8Key``): the key
    /// "é" (U+00E9) and the key "e" + U+0301 are different steps.
    public enum Component: Hashable, Sendable {
        case key(String)
        case index(Int)

        public static func == (lhs: Component, rhs: Component) -> Bool {
            switch (lhs, rhs) {
            case (.key(let a), .key(let b)): return UTF8Key.equal(a, b)
            case (.index(let a), .index(let b)): return a == b
            default: return false
            }
        }

        public func hash(into hasher: inout Hasher) {
            switch self {
            case .key(let k):
                hasher.combine(0)
                UTF8Key.hash(k, into: &hasher)
            case .index(let i):
                hasher.combine(1)
                hasher.combine(i)
            }
        }
    }

    public var components: [Component]

    public init(components: [Component]) {
        self.components = components
    }

    /// The path of one top-level field (any key, including ones that are not identifiers).
    public static func key(_ name: String) -> FieldPath { FieldPath(components: [.key(name)]) }

    /// Parses `a.b[2].c`.
    ///
    /// - Throws: ``FieldPathError`` naming the offset of the first bad character.
    public init(parsing text: String) throws(FieldPathError) {
        var result: [Component] = []
        let chars = Array(text.utf8)
        var i = 0
        func isStart(_ c: UInt8) -> Bool {
            (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c == 95 || c == 36
        }
        func isPart(_ c: UInt8) -> Bool { isStart(c) || (c >= 48 && c <= 57) }
        var expectSegment = true
        while i < chars.count {
            let c = chars[i]
            if expectSegment {
                guard isStart(c) else { throw FieldPathError(text: text, offset: i, expected: "a field name") }
                let start = i
                while i < chars.count, isPart(chars[i]) { i += 1 }
                result.append(.key(String(decoding: chars[start..<i], as: UTF8.self)))
                expectSegment = false
            } else if c == 46 {  // .
                i += 1
                expectSegment = true
            } else if c == 91 {  // [
                i += 1
                let start = i
                while i < chars.count, chars[i] >= 48, chars[i] <= 57 { i += 1 }
                guard i > start, i < chars.count, chars[i] == 93,
                    let index = Int(String(decoding: chars[start..<i], as: UTF8.self))
                else { throw FieldPathError(text: text, offset: i, expected: "an array index like [0]") }
                result.append(.index(index))
                i += 1
            } else {
                throw FieldPathError(text: text, offset: i, expected: "'.', '[' or the end of the path")
            }
        }
        if expectSegment {
            throw FieldPathError(text: text, offset: chars.count, expected: "a field name")
        }
        self.components = result
    }

    public var description: String {
        var out = ""
        for component in components {
            switch component {
            case .key(let k): out += out.isEmpty ? k : ".\(k)"
            case .index(let i): out += "[\(i)]"
            }
        }
        return out
    }
}

/// A field path that does not parse.
public struct FieldPathError: Error, Equatable, Sendable, CustomStringConvertible {
    public var text: String
    /// Byte offset of the problem in `text`.
    public var offset: Int
    public var expected: String

    public var description: String {
        "bad field path '\(text)' at offset \(offset): expected \(expected)"
    }
}
