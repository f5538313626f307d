// A contact read straight from its stored JSON text, for the enumerator: parsing each row into a
// `Value` tree and then looking its fields up was most of a content enumeration's time
// (docs/BENCHMARKS.md, "Parsing stored JSON; where a contact's enumeration time goes").

package import ContactProvider
import Foundation
import TrellisCore

/// Reads a contact document's JSON text into ``ContactFields`` in one pass: no ``Value`` tree,
/// each key recognised by a switch on its bytes.
///
/// The answer is exactly ``ContactDocument/contact(from:)`` of the parsed text, or `nil` when the
/// decoder is not sure, and the caller parses instead. It reads the compact JSON the store writes:
/// a top-level object, keys without escapes, string values with any escape (`\uXXXX` and
/// surrogate pairs included), integer literals for the birthday's parts; it steps over every other
/// member with ``JSONScan/skipValue(in:at:depth:)``. Whitespace, a key with an escape, a member
/// it steps over that holds a `\u` escape or an exponent, and anything malformed answer `nil`.
/// A key given twice counts with its last value, as the parser keeps it.
///
/// Given bytes rather than a `String`, it reads them as `String(decoding:as:)` would: an
/// ill-formed UTF-8 sequence inside a string is read as U+FFFD (strings are made that way, and
/// such a sequence never holds an ASCII byte, so the text's structure is the same), one outside
/// strings declines.
package enum ContactJSONDecoder {
    /// The fields of the contact in the JSON text `bytes`, or `nil` when the decoder declines it
    /// (then parse `String(decoding: bytes, as: UTF8.self)`: it may still be JSON).
    ///
    /// - Complexity: O(n) in the length of the text.
    package static func fields(_ bytes: UnsafeBufferPointer<UInt8>) -> ContactFields? {
        var fields = ContactFields()
        var reader = Reader(bytes: bytes)
        return reader.document(into: &fields) ? fields : nil
    }

    /// The fields of the contact in `text`, or `nil` when the decoder declines it.
    ///
    /// - Complexity: O(n) in the length of the text.
    package static func fields(_ text: String) -> ContactFields? {
        var text = text
        return text.withUTF8 { fields($0) }
    }
}

/// The keys of a contact document (``ContactDocument``).
private enum Field {
    case namePrefix, givenName, middleName, familyName, nameSuffix, nickname, organizationName
    case departmentName, jobTitle, note, phoneNumbers, emailAddresses, urlAddresses, postalAddresses
    case birthday, imageData, vCardProperties

    var name: StaticString {
        switch self {
        case .namePrefix: "namePrefix"
        case .givenName: "givenName"
        case .middleName: "middleName"
        case .familyName: "familyName"
        case .nameSuffix: "nameSuffix"
        case .nickname: "nickname"
        case .organizationName: "organizationName"
        case .departmentName: "departmentName"
        case .jobTitle: "jobTitle"
        case .note: "note"
        case .phoneNumbers: "phoneNumbers"
        case .emailAddresses: "emailAddresses"
        case .urlAddresses: "urlAddresses"
        case .postalAddresses: "postalAddresses"
        case .birthday: "birthday"
        case .imageData: "imageData"
        case .vCardProperties: "vCardProperties"
        }
    }

    /// The field named by `key`'s bytes: a candidate by length and first byte, then all bytes.
    init?(_ key: UnsafeBufferPointer<UInt8>) {
        guard let first = key.first else { return nil }
        let candidate: Field
        switch (key.count, first) {
        case (4, UInt8(ascii: "n")): candidate = .note
        case (8, UInt8(ascii: "n")): candidate = .nickname
        case (8, UInt8(ascii: "j")): candidate = .jobTitle
        case (8, UInt8(ascii: "b")): candidate = .birthday
        case (9, UInt8(ascii: "g")): candidate = .givenName
        case (9, UInt8(ascii: "i")): candidate = .imageData
        case (10, UInt8(ascii: "n")): candidate = key[4] == UInt8(ascii: "P") ? .namePrefix : .nameSuffix
        case (10, UInt8(ascii: "m")): candidate = .middleName
        case (10, UInt8(ascii: "f")): candidate = .familyName
        case (12, UInt8(ascii: "p")): candidate = .phoneNumbers
        case (12, UInt8(ascii: "u")): candidate = .urlAddresses
        case (14, UInt8(ascii: "d")): candidate = .departmentName
        case (14, UInt8(ascii: "e")): candidate = .emailAddresses
        case (15, UInt8(ascii: "p")): candidate = .postalAddresses
        case (15, UInt8(ascii: "v")): candidate = .vCardProperties
        case (16, UInt8(ascii: "o")): candidate = .organizationName
        default: return nil
        }
        guard equal(key, candidate.name) else { return nil }
        self = candidate
    }
}

/// Whether `key`'s bytes are `name`'s.
@inline(__always)
private func equal(_ key: UnsafeBufferPointer<UInt8>, _ name: StaticString) -> Bool {
    key.count == name.utf8CodeUnitCount && memcmp(key.baseAddress!, name.utf8Start, key.count) == 0
}

private let quote = UInt8(ascii: "\"")
private let backslash = UInt8(ascii: "\\")
private let comma = UInt8(ascii: ",")
private let openBrace = UInt8(ascii: "{")
private let closeBrace = UInt8(ascii: "}")
private let openBracket = UInt8(ascii: "[")
private let closeBracket = UInt8(ascii: "]")

/// One pass over a document's bytes. Each reading method answers `false` (or `nil`) when the
/// text is not what the reader vouches for; the document is then declined as a whole.
private struct Reader {
    let bytes: UnsafeBufferPointer<UInt8>
    /// The next byte to read.
    var position = 0
    /// Bytes of the string being unescaped.
    var scratch: [UInt8] = []

    init(bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

    var next: UInt8? { position < bytes.count ? bytes[position] : nil }

    // MARK: The document

    /// Reads the document into `c`, which holds an empty contact; `false` when declined.
    mutating func document(into c: inout ContactFields) -> Bool {
        guard next == openBrace else { return false }
        var more = enter(close: closeBrace)
        while more {
            guard let key = key() else { return false }
            guard let field = Field(key) else {
                guard skip(depth: 1) else { return false }
                guard let m = separator(close: closeBrace) else { return false }
                more = m
                continue
            }
            var text: String?
            switch field {
            case .namePrefix, .givenName, .middleName, .familyName, .nameSuffix, .nickname, .organizationName,
                .departmentName, .jobTitle, .note, .imageData:
                guard string(into: &text, depth: 1) else { return false }
                switch field {
                case .namePrefix: c.namePrefix = text ?? ""
                case .givenName: c.givenName = text ?? ""
                case .middleName: c.middleName = text ?? ""
                case .familyName: c.familyName = text ?? ""
                case .nameSuffix: c.nameSuffix = text ?? ""
                case .nickname: c.nickname = text ?? ""
                case .organizationName: c.organizationName = text ?? ""
                case .departmentName: c.departmentName = text ?? ""
                case .jobTitle: c.jobTitle = text ?? ""
                case .note: c.note = text ?? ""
                default: c.imageData = text.flatMap { Data(base64Encoded: $0) }
                }
            case .phoneNumbers:
                guard labelled(into: &c.phoneNumbers, CNPhoneNumber.init(stringValue:)) else { return false }
            case .emailAddresses:
                guard labelled(into: &c.emailAddresses, { $0 as NSString }) else { return false }
            case .urlAddresses:
                guard labelled(into: &c.urlAddresses, { $0 as NSString }) else { return false }
            case .postalAddresses:
                guard postalAddresses(into: &c.postalAddresses) else { return false }
            case .birthday:
                guard birthday(into: &c.birthday) else { return false }
            case .vCardProperties:
                guard strings(into: &c.vCardProperties) else { return false }
            }
            guard let m = separator(close: closeBrace) else { return false }
            more = m
        }
        guard position == bytes.count else { return false }
        return true
    }

    /// `[{"label"?, "value"}, …]` (at depth 1): the items whose value is a string, as
    /// ``ContactDocument/contact(from:)`` keeps them.
    private mutating func labelled<T>(
        into list: inout [CNLabeledValue<T>], _ make: (String) -> T
    ) -> Bool {
        list = []
        guard next == openBracket else { return skip(depth: 1) }
        var more = enter(close: closeBracket)
        while more {
            if next == openBrace {
                var label: String?
                var value: String?
                var members = enter(close: closeBrace)
                while members {
                    guard let key = key() else { return false }
                    if equal(key, "value") {
                        guard string(into: &value, depth: 3) else { return false }
                    } else if equal(key, "label") {
                        guard string(into: &label, depth: 3) else { return false }
                    } else {
                        guard skip(depth: 3) else { return false }
                    }
                    guard let m = separator(close: closeBrace) else { return false }
                    members = m
                }
                if let value { list.append(CNLabeledValue(label: label, value: make(value))) }
            } else {
                guard skip(depth: 2) else { return false }
            }
            guard let m = separator(close: closeBracket) else { return false }
            more = m
        }
        return true
    }

    /// `[{"label"?, "street"?, …}, …]` (at depth 1): every item is an address, one that is not a
    /// map an empty one.
    private mutating func postalAddresses(into list: inout [CNLabeledValue<CNPostalAddress>]) -> Bool {
        list = []
        guard next == openBracket else { return skip(depth: 1) }
        var more = enter(close: closeBracket)
        while more {
            var label: String?
            var address = CNPostalAddress()
            if next == openBrace {
                var members = enter(close: closeBrace)
                while members {
                    guard let key = key() else { return false }
                    var text: String?
                    if equal(key, "label") {
                        guard string(into: &label, depth: 3) else { return false }
                    } else if equal(key, "street") {
                        guard string(into: &text, depth: 3) else { return false }
                        address.street = text ?? ""
                    } else if equal(key, "city") {
                        guard string(into: &text, depth: 3) else { return false }
                        address.city = text ?? ""
                    } else if equal(key, "state") {
                        guard string(into: &text, depth: 3) else { return false }
                        address.state = text ?? ""
                    } else if equal(key, "postalCode") {
                        guard string(into: &text, depth: 3) else { return false }
                        address.postalCode = text ?? ""
                    } else if equal(key, "country") {
                        guard string(into: &text, depth: 3) else { return false }
                        address.country = text ?? ""
                    } else if equal(key, "isoCountryCode") {
                        guard string(into: &text, depth: 3) else { return false }
                        address.isoCountryCode = text ?? ""
                    } else {
                        guard skip(depth: 3) else { return false }
                    }
                    guard let m = separator(close: closeBrace) else { return false }
                    members = m
                }
            } else {
                guard skip(depth: 2) else { return false }
            }
            list.append(CNLabeledValue(label: label, value: address))
            guard let m = separator(close: closeBracket) else { return false }
            more = m
        }
        return true
    }

    /// `{"year"?, "month", "day"}` (at depth 1) of integers; no birthday without month and day.
    private mutating func birthday(into birthday: inout DateComponents?) -> Bool {
        birthday = nil
        guard next == openBrace else { return skip(depth: 1) }
        var year: Int64?
        var month: Int64?
        var day: Int64?
        var members = enter(close: closeBrace)
        while members {
            guard let key = key() else { return false }
            if equal(key, "month") {
                guard integer(into: &month, depth: 2) else { return false }
            } else if equal(key, "day") {
                guard integer(into: &day, depth: 2) else { return false }
            } else if equal(key, "year") {
                guard integer(into: &year, depth: 2) else { return false }
            } else {
                guard skip(depth: 2) else { return false }
            }
            guard let m = separator(close: closeBrace) else { return false }
            members = m
        }
        if let month, let day {
            birthday = DateComponents(year: year.map { Int($0) }, month: Int(month), day: Int(day))
        }
        return true
    }

    /// `["…", …]` (at depth 1): the items that are strings.
    private mutating func strings(into list: inout [String]) -> Bool {
        list = []
        guard next == openBracket else { return skip(depth: 1) }
        var more = enter(close: closeBracket)
        while more {
            var text: String?
            guard string(into: &text, depth: 2) else { return false }
            if let text { list.append(text) }
            guard let m = separator(close: closeBracket) else { return false }
            more = m
        }
        return true
    }

    // MARK: Structure

    /// Steps into the array or object whose opening bracket is next; `false` when it is empty
    /// (and now closed by `close`).
    private mutating func enter(close: UInt8) -> Bool {
        position += 1
        if next == close {
            position += 1
            return false
        }
        return true
    }

    /// After a member or element: `true` past a comma, `false` past `close`, `nil` otherwise.
    private mutating func separator(close: UInt8) -> Bool? {
        switch next {
        case comma:
            position += 1
            return true
        case close:
            position += 1
            return false
        default: return nil
        }
    }

    /// The bytes of the key that is next, without escapes or control characters, and its colon.
    private mutating func key() -> UnsafeBufferPointer<UInt8>? {
        guard next == quote else { return nil }
        let start = position + 1
        var i = start
        while i < bytes.count {
            let b = bytes[i]
            if b == quote {
                guard i + 1 < bytes.count, bytes[i + 1] == UInt8(ascii: ":") else { return nil }
                position = i + 2
                return UnsafeBufferPointer(rebasing: bytes[start..<i])
            }
            if b == backslash || b < 0x20 { return nil }
            i += 1
        }
        return nil
    }

    /// Steps over the value that is next, inside `depth` open arrays and objects.
    private mutating func skip(depth: Int) -> Bool {
        JSONScan.skipValue(in: bytes, at: &position, depth: depth)
    }

    // MARK: Values

    /// Reads the value that is next (inside `depth` open arrays and objects) into `text` when it
    /// is a string, else steps over it and sets `text` to `nil`.
    private mutating func string(into text: inout String?, depth: Int) -> Bool {
        guard next == quote else {
            text = nil
            return skip(depth: depth)
        }
        let start = position + 1
        var i = start
        while i < bytes.count {
            let b = bytes[i]
            if b == quote {
                position = i + 1
                text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<i]), as: UTF8.self)
                return true
            }
            if b == backslash {
                position = i
                guard let unescaped = escapedString(from: start) else { return false }
                text = unescaped
                return true
            }
            if b < 0x20 { return false }
            i += 1
        }
        return false
    }

    /// The rest of a string that holds an escape at the position; `start` is its first byte.
    private mutating func escapedString(from start: Int) -> String? {
        scratch.removeAll(keepingCapacity: true)
        scratch.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start..<position]))
        while position < bytes.count {
            let b = bytes[position]
            if b == quote {
                position += 1
                return String(decoding: scratch, as: UTF8.self)
            }
            if b == backslash {
                guard escape() else { return nil }
            } else {
                guard b >= 0x20 else { return nil }
                scratch.append(b)
                position += 1
            }
        }
        return nil
    }

    /// Appends the UTF-8 of the escape at the position (a backslash) to ``scratch``: the
    /// parser's escapes, a `\u` surrogate only as a high-low pair.
    private mutating func escape() -> Bool {
        position += 1
        guard let b = next else { return false }
        position += 1
        if let escaped = UTF8Check.jsonEscape(b) {
            scratch.append(escaped)
            return true
        }
        switch b {
        case UInt8(ascii: "u"):
            guard var scalar = hex4() else { return false }
            if scalar >= 0xD800 && scalar < 0xDC00 {
                guard next == backslash, position + 1 < bytes.count, bytes[position + 1] == UInt8(ascii: "u")
                else { return false }
                position += 2
                guard let low = hex4(), low >= 0xDC00 && low < 0xE000 else { return false }
                scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
            } else if scalar >= 0xDC00 && scalar < 0xE000 {
                return false
            }
            UTF8Check.append(scalar, to: &scratch)
        default: return false
        }
        return true
    }

    private mutating func hex4() -> UInt32? {
        guard bytes.count - position >= 4 else { return nil }
        var unit: UInt32 = 0
        for _ in 0..<4 {
            guard let digit = UTF8Check.hexDigit(bytes[position]) else { return nil }
            unit = unit << 4 | UInt32(digit)
            position += 1
        }
        return unit
    }

    /// Reads the value that is next (inside `depth` open arrays and objects) into `integer`
    /// when the parser makes it an `.int` (an integer literal, no fraction or exponent, within
    /// `Int64`: what ``Value/intValue`` answers), else steps over it and sets `integer` to `nil`.
    private mutating func integer(into integer: inout Int64?, depth: Int) -> Bool {
        integer = nil
        var i = position
        let negative = next == UInt8(ascii: "-")
        if negative { i += 1 }
        let digitsStart = i
        var magnitude: UInt64 = 0
        while i < bytes.count, bytes[i] &- UInt8(ascii: "0") < 10 {
            if i - digitsStart < 19 { magnitude = magnitude &* 10 &+ UInt64(bytes[i] &- UInt8(ascii: "0")) }
            i += 1
        }
        let digits = i - digitsStart
        let plain =
            digits > 0 && digits <= 19 && !(digits > 1 && bytes[digitsStart] == UInt8(ascii: "0"))
            && !(i < bytes.count && (bytes[i] == UInt8(ascii: ".") || bytes[i] | 0x20 == UInt8(ascii: "e")))
        // Anything else (another type, a double, a malformed number) is stepped over, or declined.
        guard plain else { return skip(depth: depth) }
        if negative {
            guard magnitude <= UInt64(Int64.max) + 1 else { return skip(depth: depth) }
            integer = Int64(truncatingIfNeeded: 0 &- magnitude)
        } else {
            guard magnitude <= UInt64(Int64.max) else { return skip(depth: depth) }
            integer = Int64(magnitude)
        }
        position = i
        return true
    }
}
