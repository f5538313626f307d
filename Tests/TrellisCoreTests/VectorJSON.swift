/// A minimal JSON reader for test vector files that keeps numbers as their literal text, so
/// integers beyond 64 bits and exact float spellings can be compared without loss.
enum VectorJSON: Equatable {
    case null
    case bool(Bool)
    /// The number exactly as written.
    case number(String)
    case string(String)
    case array([VectorJSON])
    case object([(String, VectorJSON)])

    static func == (lhs: VectorJSON, rhs: VectorJSON) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): return true
        case (.bool(let a), .bool(let b)): return a == b
        case (.number(let a), .number(let b)): return a == b
        case (.string(let a), .string(let b)): return a.utf8.elementsEqual(b.utf8)
        case (.array(let a), .array(let b)): return a == b
        case (.object(let a), .object(let b)):
            return a.count == b.count && zip(a, b).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        default: return false
        }
    }

    subscript(key: String) -> VectorJSON? {
        guard case .object(let members) = self else { return nil }
        return members.first { $0.0 == key }?.1
    }

    struct ParseError: Error, CustomStringConvertible {
        var offset: Int
        var message: String
        var description: String { "JSON error at byte \(offset): \(message)" }
    }

    static func parse(_ bytes: [UInt8]) throws -> VectorJSON {
        var parser = Parser(bytes: bytes)
        let value = try parser.value()
        parser.skipWhitespace()
        guard parser.index == bytes.count else { throw ParseError(offset: parser.index, message: "trailing data") }
        return value
    }

    private struct Parser {
        let bytes: [UInt8]
        var index = 0

        mutating func skipWhitespace() {
            while index < bytes.count, [0x20, 0x0a, 0x0d, 0x09].contains(bytes[index]) { index += 1 }
        }

        func fail(_ message: String) -> ParseError { ParseError(offset: index, message: message) }

        mutating func expect(_ literal: String) throws {
            for byte in literal.utf8 {
                guard index < bytes.count, bytes[index] == byte else { throw fail("expected \(literal)") }
                index += 1
            }
        }

        mutating func value() throws -> VectorJSON {
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end") }
            switch bytes[index] {
            case UInt8(ascii: "n"):
                try expect("null")
                return .null
            case UInt8(ascii: "t"):
                try expect("true")
                return .bool(true)
            case UInt8(ascii: "f"):
                try expect("false")
                return .bool(false)
            case UInt8(ascii: "\""): return .string(try string())
            case UInt8(ascii: "["):
                index += 1
                var items: [VectorJSON] = []
                skipWhitespace()
                if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
                    index += 1
                    return .array(items)
                }
                while true {
                    items.append(try value())
                    skipWhitespace()
                    guard index < bytes.count else { throw fail("unterminated array") }
                    index += 1
                    if bytes[index - 1] == UInt8(ascii: "]") { return .array(items) }
                    guard bytes[index - 1] == UInt8(ascii: ",") else { throw fail("expected , or ]") }
                }
            case UInt8(ascii: "{"):
                index += 1
                var members: [(String, VectorJSON)] = []
                skipWhitespace()
                if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
                    index += 1
                    return .object(members)
                }
                while true {
                    skipWhitespace()
                    let key = try string()
                    skipWhitespace()
                    try expect(":")
                    members.append((key, try value()))
                    skipWhitespace()
                    guard index < bytes.count else { throw fail("unterminated object") }
                    index += 1
                    if bytes[index - 1] == UInt8(ascii: "}") { return .object(members) }
                    guard bytes[index - 1] == UInt8(ascii: ",") else { throw fail("expected , or }") }
                }
            default:
                let start = index
                let numberBytes = Array("+-0123456789.eE".utf8)
                while index < bytes.count, numberBytes.contains(bytes[index]) { index += 1 }
                guard index > start else { throw fail("unexpected character") }
                return .number(String(decoding: bytes[start..<index], as: UTF8.self))
            }
        }

        mutating func hex4() throws -> UInt32 {
            guard index + 4 <= bytes.count,
                let value = UInt32(String(decoding: bytes[index..<index + 4], as: UTF8.self), radix: 16)
            else { throw fail("bad \\u escape") }
            index += 4
            return value
        }

        mutating func string() throws -> String {
            try expect("\"")
            var scalars = String.UnicodeScalarView()
            var raw: [UInt8] = []
            func flush() throws {
                guard let text = String(validating: raw, as: UTF8.self) else { throw fail("bad UTF-8") }
                scalars.append(contentsOf: text.unicodeScalars)
                raw.removeAll()
            }
            while true {
                guard index < bytes.count else { throw fail("unterminated string") }
                let byte = bytes[index]
                index += 1
                switch byte {
                case UInt8(ascii: "\""):
                    try flush()
                    return String(scalars)
                case UInt8(ascii: "\\"):
                    try flush()
                    guard index < bytes.count else { throw fail("unterminated escape") }
                    let escape = bytes[index]
                    index += 1
                    let simple: [UInt8: Unicode.Scalar] = [
                        UInt8(ascii: "\""): "\"", UInt8(ascii: "\\"): "\\", UInt8(ascii: "/"): "/",
                        UInt8(ascii: "b"): "\u{8}", UInt8(ascii: "f"): "\u{c}", UInt8(ascii: "n"): "\n",
                        UInt8(ascii: "r"): "\r", UInt8(ascii: "t"): "\t",
                    ]
                    if let scalar = simple[escape] {
                        scalars.append(scalar)
                    } else if escape == UInt8(ascii: "u") {
                        var code = try hex4()
                        if (0xd800..<0xdc00).contains(code) {
                            try expect("\\u")
                            let low = try hex4()
                            guard (0xdc00..<0xe000).contains(low) else { throw fail("unpaired surrogate") }
                            code = 0x10000 + (code - 0xd800) << 10 + (low - 0xdc00)
                        }
                        guard let scalar = Unicode.Scalar(code) else { throw fail("bad scalar") }
                        scalars.append(scalar)
                    } else {
                        throw fail("bad escape")
                    }
                default:
                    raw.append(byte)
                }
            }
        }
    }
}
