public import Foundation

/// Conversion between JSON text and ``Value``.
///
/// Parsing uses Foundation's `JSONSerialization` and keeps the spelling of numbers: an integer
/// literal (no fraction, no exponent) that fits in `Int64` becomes `.int`, every other number
/// `.double` (so `1.0` stays a double). Writing emits doubles so that they read back as doubles
/// (`1.0`, `-0.0`, `1e+100`). Bytes are written as `{"$bytes": "<base64>"}`, the same shape
/// parsing turns back into `.bytes`.
public enum JSON {
    /// Parses one JSON text (any top-level value).
    ///
    /// - Throws: ``JSONError`` with Foundation's reason when the text is not JSON, or when it
    ///   holds a number that is not finite.
    public static func parse(_ text: String) throws(JSONError) -> Value {
        try parse(Data(text.utf8))
    }

    /// Parses one JSON text from UTF-8 bytes.
    public static func parse(_ data: Data) throws(JSONError) -> Value {
        let object: Any
        do {
            object = try JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed])
        } catch {
            throw JSONError(message: reason(error))
        }
        return try value(fromFoundation: object)
    }

    private static func reason(_ error: any Error) -> String {
        let ns = error as NSError
        if let debug = ns.userInfo[NSDebugDescriptionErrorKey] as? String { return debug }
        return ns.localizedDescription
    }

    static func value(fromFoundation object: Any) throws(JSONError) -> Value {
        switch object {
        case is NSNull:
            return .null
        case let s as String:
            return .string(s)
        case let n as NSNumber:
            let type = String(cString: n.objCType)
            switch type {
            case "c", "B":
                return .bool(n.boolValue)
            case "d", "f":
                let d = n.doubleValue
                guard d.isFinite else { throw JSONError(message: "number out of range: \(n)") }
                return .double(d)
            case "Q":
                // An integer literal that does not fit in Int64 keeps its magnitude as a double.
                return .double(n.doubleValue)
            default:
                return .int(n.int64Value)
            }
        case let a as [Any]:
            var out: [Value] = []
            out.reserveCapacity(a.count)
            for element in a { out.append(try value(fromFoundation: element)) }
            return .array(out)
        case let m as [String: Any]:
            if m.count == 1, let b64 = m["$bytes"] as? String, let data = Data(base64Encoded: b64) {
                return .bytes([UInt8](data))
            }
            var out: [String: Value] = [:]
            out.reserveCapacity(m.count)
            for (k, v) in m { out[k] = try value(fromFoundation: v) }
            return .map(out)
        default:
            throw JSONError(message: "unsupported JSON value \(type(of: object))")
        }
    }

    /// Writes a value as compact JSON with map keys sorted byte-wise (deterministic output).
    ///
    /// - Complexity: O(n log n) in the size of the value (key sorting).
    public static func string(_ value: Value, sortedKeys: Bool = true) -> String {
        var out = ""
        write(value, into: &out, sortedKeys: sortedKeys)
        return out
    }

    static func write(_ value: Value, into out: inout String, sortedKeys: Bool) {
        switch value {
        case .null: out += "null"
        case .bool(let b): out += b ? "true" : "false"
        case .int(let i): out += String(i)
        case .double(let d): out += formatDouble(d)
        case .string(let s): writeString(s, into: &out)
        case .bytes(let b):
            out += "{\"$bytes\":\""
            out += Data(b).base64EncodedString()
            out += "\"}"
        case .array(let a):
            out += "["
            for (i, element) in a.enumerated() {
                if i > 0 { out += "," }
                write(element, into: &out, sortedKeys: sortedKeys)
            }
            out += "]"
        case .map(let m):
            out += "{"
            let keys = sortedKeys ? m.keys.sorted(by: { $0.utf8.lexicographicallyPrecedes($1.utf8) }) : Array(m.keys)
            for (i, key) in keys.enumerated() {
                if i > 0 { out += "," }
                writeString(key, into: &out)
                out += ":"
                write(m[key]!, into: &out, sortedKeys: sortedKeys)
            }
            out += "}"
        }
    }

    /// The shortest text that reads back as the same double and is never mistaken for an int.
    static func formatDouble(_ d: Double) -> String {
        guard d.isFinite else { return "null" }
        var s = "\(d)"  // Swift prints the shortest round-tripping form: 1.0, -0.0, 1e-07, 1e+100
        if !s.contains(".") && !s.contains("e") && !s.contains("E") { s += ".0" }
        return s
    }

    static func writeString(_ s: String, into out: inout String) {
        out += "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case let c where c.value < 0x20:
                let hex = String(c.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default:
                out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }
}

/// JSON text that could not be parsed.
public struct JSONError: Error, Equatable, Sendable, CustomStringConvertible {
    public var message: String
    public init(message: String) { self.message = message }
    public var description: String { "invalid JSON: \(message)" }
}
