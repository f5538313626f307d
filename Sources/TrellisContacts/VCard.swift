public import ContactProvider
import Foundation

/// A card that could not be read, with the line where it starts or where the problem is.
public struct VCardError: Error, Sendable, Hashable, CustomStringConvertible {
    /// 1-based line number in the input (of the physical line, before unfolding).
    public var line: Int
    public var message: String
    /// `false` for a warning about one field, which was left out while the card was imported.
    public var skipsCard: Bool

    public init(line: Int, message: String, skipsCard: Bool = true) {
        self.line = line
        self.message = message
        self.skipsCard = skipsCard
    }

    public var description: String { "line \(line): \(message)" + (skipsCard ? "; card skipped" : "") }
}

/// A contact read from a vCard, with its UID.
public struct VCardContact: Sendable, Hashable {
    /// The card's `UID` (RFC 6350 §6.7.6), or a new UUID when the card has none.
    public var uid: String
    public var contact: CNContact
    /// The line where the card's `BEGIN:VCARD` is.
    public var line: Int

    public init(uid: String, contact: CNContact, line: Int = 0) {
        self.uid = uid
        self.contact = contact
        self.line = line
    }
}

/// vCard 3.0 (RFC 2426) and 4.0 (RFC 6350) reading, vCard 4.0 writing.
public enum VCard {
    /// One content line after unfolding (RFC 6350 §3.2, §3.3).
    struct ContentLine {
        var name: String
        var params: [String: [String]]
        var value: String
        var line: Int
    }

    // MARK: Reading

    /// Reads every card of a vCard stream (3.0 or 4.0; CRLF or LF line ends; folded lines).
    ///
    /// A card that cannot be read is reported in `errors` with its line and skipped; the others are
    /// returned.
    /// - Complexity: O(size of the input).
    public static func parse(_ text: String) -> (contacts: [VCardContact], errors: [VCardError]) {
        var contacts: [VCardContact] = []
        var errors: [VCardError] = []
        var card: [ContentLine]?
        var cardLine = 0
        var cardError: VCardError?
        for (logical, number) in unfold(text) {
            if logical.trimmingCharacters(in: .whitespaces).isEmpty { continue }
            guard let line = parseLine(logical, number) else {
                if card != nil {
                    if cardError == nil {
                        cardError = VCardError(
                            line: number, message: "not a content line (no ':'): \(logical.prefix(40))")
                    }
                } else {
                    errors.append(VCardError(line: number, message: "text outside BEGIN:VCARD … END:VCARD"))
                }
                continue
            }
            if line.name == "BEGIN", line.value.uppercased() == "VCARD" {
                if card != nil {
                    errors.append(cardError ?? VCardError(line: cardLine, message: "card has no END:VCARD"))
                }
                card = []
                cardLine = number
                cardError = nil
                continue
            }
            if line.name == "END", line.value.uppercased() == "VCARD" {
                guard let lines = card else {
                    errors.append(VCardError(line: number, message: "END:VCARD without BEGIN:VCARD"))
                    continue
                }
                if let cardError {
                    errors.append(cardError)
                } else {
                    do {
                        contacts.append(try makeContact(lines, line: cardLine, warnings: &errors))
                    } catch let error as VCardError {
                        errors.append(error)
                    } catch {
                        errors.append(VCardError(line: cardLine, message: "\(error)"))
                    }
                }
                card = nil
                continue
            }
            if card != nil {
                card?.append(line)
            } else {
                errors.append(VCardError(line: number, message: "\(line.name) outside BEGIN:VCARD … END:VCARD"))
            }
        }
        if card != nil { errors.append(cardError ?? VCardError(line: cardLine, message: "card has no END:VCARD")) }
        return (contacts, errors)
    }

    /// Joins folded lines: a line break followed by a space or tab continues the line.
    ///
    /// Lines end at LF, CRLF or a lone CR (as in old Mac files), so no value holds a raw CR or LF;
    /// the writer escapes newlines as `\n` and writes no other CR.
    static func unfold(_ text: String) -> [(String, Int)] {
        var lines: [String.UnicodeScalarView] = []
        var current = String.UnicodeScalarView()
        var afterCR = false
        for scalar in text.unicodeScalars {
            if scalar == "\n" && afterCR {
                afterCR = false
                continue
            }
            afterCR = scalar == "\r"
            if scalar == "\n" || scalar == "\r" {
                lines.append(current)
                current = String.UnicodeScalarView()
            } else {
                current.append(scalar)
            }
        }
        lines.append(current)
        var result: [(String, Int)] = []
        for (index, scalars) in lines.enumerated() {
            let line = String(scalars)
            if let first = line.unicodeScalars.first, first == " " || first == "\t", !result.isEmpty {
                result[result.count - 1].0 += String(line.unicodeScalars.dropFirst())
            } else {
                result.append((line, index + 1))
            }
        }
        return result
    }

    /// Splits `[group.]NAME *(;PARAM) : VALUE`; `nil` when there is no unquoted `:`.
    ///
    /// The line is read scalar by scalar, as RFC 6350's grammar reads octets: a combining mark
    /// after a quote, a colon or a semicolon does not hide it (as a `Character` it would join it).
    static func parseLine(_ text: String, _ number: Int) -> ContentLine? {
        var inQuotes = false
        var colon: String.Index?
        let scalars = text.unicodeScalars
        var index = scalars.startIndex
        while index < scalars.endIndex {
            let c = scalars[index]
            if c == "\"" {
                inQuotes.toggle()
            } else if c == ":" && !inQuotes {
                colon = index
                break
            }
            index = scalars.index(after: index)
        }
        guard let colon else { return nil }
        let head = String(scalars[..<colon])
        let value = String(scalars[scalars.index(after: colon)...])
        var parts = splitUnquoted(head, ";")
        guard !parts.isEmpty else { return nil }
        var name = parts.removeFirst().uppercased()
        if let dot = name.unicodeScalars.lastIndex(of: ".") {
            name = String(name.unicodeScalars[name.unicodeScalars.index(after: dot)...])
        }
        guard !name.isEmpty else { return nil }
        var params: [String: [String]] = [:]
        for p in parts {
            if let eq = p.unicodeScalars.firstIndex(of: "=") {
                let key = String(p.unicodeScalars[..<eq]).uppercased()
                let values = splitUnquoted(String(p.unicodeScalars[p.unicodeScalars.index(after: eq)...]), ",").map {
                    value -> String in
                    let v = value.unicodeScalars
                    guard v.count >= 2, v.first == "\"", v.last == "\"" else { return value }
                    return String(v.dropFirst().dropLast())
                }
                params[key, default: []] += values
            } else {
                // vCard 2.1 / 3.0 bare types: TEL;CELL:…
                params["TYPE", default: []].append(p)
            }
        }
        return ContentLine(name: name, params: params, value: value, line: number)
    }

    /// Splits on `separator` outside double quotes, scalar by scalar.
    static func splitUnquoted(_ text: String, _ separator: Unicode.Scalar) -> [String] {
        var parts: [String] = []
        var current = String.UnicodeScalarView()
        var inQuotes = false
        for c in text.unicodeScalars {
            if c == "\"" { inQuotes.toggle() }
            if c == separator && !inQuotes {
                parts.append(String(current))
                current = String.UnicodeScalarView()
            } else {
                current.append(c)
            }
        }
        parts.append(String(current))
        return parts
    }

    /// Splits on an unescaped separator, then unescapes each part (RFC 6350 §3.4).
    static func components(_ value: String, _ separator: Unicode.Scalar = ";") -> [String] {
        split(value, at: separator).map(unescape)
    }

    /// Splits on every `separator` that is not escaped by a backslash, keeping the escapes as they
    /// are (so a structured value can be split again: `N` parts hold comma-separated lists).
    /// Scalar by scalar, as ``parseLine(_:_:)``.
    static func split(_ value: String, at separator: Unicode.Scalar) -> [String] {
        var parts: [String] = []
        var current = String.UnicodeScalarView()
        var escaped = false
        for c in value.unicodeScalars {
            if escaped {
                escaped = false
            } else if c == "\\" {
                escaped = true
            } else if c == separator {
                parts.append(String(current))
                current = String.UnicodeScalarView()
                continue
            }
            current.append(c)
        }
        parts.append(String(current))
        return parts
    }

    /// Unescapes a text value (`\n`, `\,`, `\;`, `\\`; any other escaped character stands for
    /// itself, and a trailing backslash is kept).
    static func unescape(_ value: String) -> String {
        var out = String.UnicodeScalarView()
        var escaped = false
        for c in value.unicodeScalars {
            if escaped {
                switch c {
                case "n", "N": out.append("\n")
                default: out.append(c)
                }
                escaped = false
            } else if c == "\\" {
                escaped = true
            } else {
                out.append(c)
            }
        }
        if escaped { out.append("\\") }
        return String(out)
    }

    static func label(_ params: [String: [String]]) -> String? {
        let types = (params["TYPE"] ?? []).flatMap { splitUnquoted($0, ",").map { $0.lowercased() } }
        if types.contains("cell") || types.contains("mobile") { return CNLabelPhoneNumberMobile }
        if types.contains("home") { return CNLabelHome }
        if types.contains("work") { return CNLabelWork }
        let ignored: Set<String> = [
            "pref", "voice", "internet", "x400", "text", "uri", "intl", "postal", "parcel", "dom",
        ]
        if let custom = types.first(where: { !ignored.contains($0) }) {
            return custom == "other" ? CNLabelOther : custom
        }
        return nil
    }

    /// Builds one contact. A field Trellis cannot represent (a PHOTO given as a URL, a BDAY that is
    /// not a full or month-day date) is left out with a warning in `warnings`; the card is kept.
    static func makeContact(_ lines: [ContentLine], line: Int, warnings: inout [VCardError]) throws -> VCardContact {
        var c = CNContact()
        var uid: String?
        var formatted = ""
        var version: String?
        for l in lines {
            switch l.name {
            case "VERSION":
                version = l.value.trimmingCharacters(in: .whitespaces)
                guard version == "3.0" || version == "4.0" || version == "2.1" else {
                    throw VCardError(line: l.line, message: "unsupported vCard version \(l.value)")
                }
            case "UID":
                let v = unescape(l.value).trimmingCharacters(in: .whitespaces)
                uid = v.isEmpty ? nil : v
            case "FN": formatted = unescape(l.value)
            case "N":
                let n = split(l.value, at: ";")
                func part(_ i: Int) -> String {
                    i < n.count ? components(n[i], ",").filter { !$0.isEmpty }.joined(separator: " ") : ""
                }
                c.familyName = part(0)
                c.givenName = part(1)
                c.middleName = part(2)
                c.namePrefix = part(3)
                c.nameSuffix = part(4)
            case "NICKNAME": c.nickname = components(l.value, ",").joined(separator: ", ")
            case "ORG":
                let o = components(l.value)
                c.organizationName = o.first ?? ""
                c.departmentName = o.dropFirst().filter { !$0.isEmpty }.joined(separator: ", ")
            case "TITLE": c.jobTitle = unescape(l.value)
            case "NOTE": c.note = c.note.isEmpty ? unescape(l.value) : c.note + "\n" + unescape(l.value)
            case "TEL":
                var v = unescape(l.value)
                if v.lowercased().hasPrefix("tel:") { v = String(v.dropFirst(4)) }
                c.phoneNumbers.append(CNLabeledValue(label: label(l.params), value: v))
            case "EMAIL":
                var v = unescape(l.value)
                if v.lowercased().hasPrefix("mailto:") { v = String(v.dropFirst(7)) }
                c.emailAddresses.append(CNLabeledValue(label: label(l.params), value: v))
            case "URL": c.urlAddresses.append(CNLabeledValue(label: label(l.params), value: unescape(l.value)))
            case "ADR":
                let a = components(l.value)
                func part(_ i: Int) -> String { i < a.count ? a[i] : "" }
                let street = [part(0), part(1), part(2)].filter { !$0.isEmpty }.joined(separator: "\n")
                let address = CNPostalAddress(
                    street: street, city: part(3), state: part(4), postalCode: part(5), country: part(6))
                c.postalAddresses.append(CNLabeledValue(label: label(l.params), value: address))
            case "BDAY":
                guard let b = birthday(l.value) else {
                    warnings.append(
                        VCardError(
                            line: l.line,
                            message: "BDAY '\(l.value)' is not a date (YYYYMMDD, YYYY-MM-DD or --MMDD); field left out",
                            skipsCard: false))
                    continue
                }
                c.birthday = b
            case "PHOTO":
                guard let data = photo(l) else {
                    warnings.append(
                        VCardError(
                            line: l.line, message: "PHOTO is neither base64 data nor a data: URI; field left out",
                            skipsCard: false))
                    continue
                }
                c.imageData = data
            default: continue
            }
        }
        guard version != nil else { throw VCardError(line: line, message: "card has no VERSION") }
        let id = uid ?? UUID().uuidString.lowercased()
        // A card whose name is only its FN keeps that name as the given name, unless FN is what
        // export would write anyway (name parts, organisation, nickname, email or UID), so exporting
        // and importing again is stable. An organisation does not stand in for a person's FN
        // (`FN:labeled guy` with `ORG:Test Inc` and no `N` stays "labeled guy").
        if c.givenName.isEmpty && c.familyName.isEmpty && !formatted.isEmpty && formatted != formattedName(c, uid: id) {
            c.givenName = formatted
        }
        return VCardContact(uid: id, contact: c, line: line)
    }

    static func birthday(_ text: String) -> DateComponents? {
        var t = text.trimmingCharacters(in: .whitespaces)
        if let tIndex = t.firstIndex(of: "T") { t = String(t[..<tIndex]) }
        let digits = t.filter { $0 != "-" }
        guard digits.allSatisfy(\.isASCII), digits.allSatisfy(\.isNumber) else { return nil }
        if t.hasPrefix("--") && digits.count == 4 {
            guard let m = Int(digits.prefix(2)), let d = Int(digits.suffix(2)), (1...12).contains(m),
                (1...31).contains(d)
            else { return nil }
            return DateComponents(month: m, day: d)
        }
        guard digits.count == 8, let y = Int(digits.prefix(4)), let m = Int(digits.dropFirst(4).prefix(2)),
            let d = Int(digits.suffix(2)), (1...12).contains(m), (1...31).contains(d)
        else { return nil }
        return DateComponents(year: y, month: m, day: d)
    }

    static func photo(_ line: ContentLine) -> Data? {
        // vobject and khard write the comma of a data: URI escaped (`base64\,`), as vCard text.
        let value = unescape(line.value).trimmingCharacters(in: .whitespaces)
        if value.lowercased().hasPrefix("data:") {
            guard let comma = value.firstIndex(of: ","), value[..<comma].lowercased().hasSuffix(";base64") else {
                return nil
            }
            return Data(base64Encoded: String(value[value.index(after: comma)...]), options: .ignoreUnknownCharacters)
        }
        let encoding = (line.params["ENCODING"] ?? []).map { $0.lowercased() }
        if encoding.contains("b") || encoding.contains("base64") {
            return Data(base64Encoded: value, options: .ignoreUnknownCharacters)
        }
        return nil
    }

    // MARK: Writing

    /// Escapes a text value (RFC 6350 §3.4): backslash, comma, semicolon and newline.
    static func escape(_ text: String) -> String {
        // Scalar by scalar: a `;` followed by a combining mark is one `Character` but still a `;`
        // to the reader.
        var out = String.UnicodeScalarView()
        for c in text.unicodeScalars {
            switch c {
            case "\\": out.append(contentsOf: "\\\\".unicodeScalars)
            case ",": out.append(contentsOf: "\\,".unicodeScalars)
            case ";": out.append(contentsOf: "\\;".unicodeScalars)
            case "\n": out.append(contentsOf: "\\n".unicodeScalars)
            case "\r": continue  // CRLF is one newline; a lone CR is dropped
            default: out.append(c)
            }
        }
        return String(out)
    }

    static func typeParam(_ label: String?) -> String {
        guard let label else { return "" }
        switch label {
        case CNLabelHome: return ";TYPE=home"
        case CNLabelWork: return ";TYPE=work"
        case CNLabelPhoneNumberMobile: return ";TYPE=cell"
        case CNLabelOther: return ";TYPE=other"
        default:
            // Written as the reader will take it back: letters, digits, '-' and spaces, lower case;
            // a name the reader ignores (`pref`, `voice`, ...) or maps (`cell`, `home`, ...) is
            // written as what it reads as.
            let safe = String(label.lowercased().filter { $0.isLetter || $0.isNumber || $0 == "-" || $0 == " " })
            guard let reread = Self.label(["TYPE": [safe]]) else { return "" }
            switch reread {
            case CNLabelHome, CNLabelWork, CNLabelPhoneNumberMobile, CNLabelOther: return typeParam(reread)
            default: return ";TYPE=\"\(reread)\""
            }
        }
    }

    /// Folds a content line at 75 octets without splitting a UTF-8 sequence (RFC 6350 §3.2).
    static func fold(_ line: String) -> String {
        var out = ""
        var count = 0
        for scalar in line.unicodeScalars {
            let size = String(scalar).utf8.count
            if count + size > 75 {
                out += "\r\n "
                count = 1
            }
            out.unicodeScalars.append(scalar)
            count += size
        }
        return out + "\r\n"
    }

    /// The formatted name: name parts, else organisation, nickname, email, or the UID.
    public static func formattedName(_ c: CNContact, uid: String) -> String {
        let name = [c.namePrefix, c.givenName, c.middleName, c.familyName, c.nameSuffix].filter { !$0.isEmpty }
            .joined(separator: " ")
        for candidate in [name, c.organizationName, c.nickname, c.emailAddresses.first?.value ?? ""]
        where !candidate.isEmpty {
            return candidate
        }
        return uid
    }

    /// The vCard 4.0 text of a contact (RFC 6350), CRLF line ends, folded at 75 octets.
    public static func serialize(_ c: CNContact, uid: String) -> String {
        var lines = ["BEGIN:VCARD", "VERSION:4.0", "UID:" + escape(uid), "FN:" + escape(formattedName(c, uid: uid))]
        lines.append(
            "N:"
                + [c.familyName, c.givenName, c.middleName, c.namePrefix, c.nameSuffix].map(escape).joined(
                    separator: ";"))
        if !c.nickname.isEmpty { lines.append("NICKNAME:" + escape(c.nickname)) }
        if !c.organizationName.isEmpty || !c.departmentName.isEmpty {
            let dept = c.departmentName.isEmpty ? "" : ";" + escape(c.departmentName)
            lines.append("ORG:" + escape(c.organizationName) + dept)
        }
        if !c.jobTitle.isEmpty { lines.append("TITLE:" + escape(c.jobTitle)) }
        // The reader takes a `tel:` or `mailto:` URI prefix off; a value that starts with one itself
        // is written with one more.
        func uri(_ scheme: String, _ value: String) -> String {
            value.lowercased().hasPrefix(scheme) ? scheme + value : value
        }
        for p in c.phoneNumbers { lines.append("TEL" + typeParam(p.label) + ":" + escape(uri("tel:", p.value))) }
        for e in c.emailAddresses {
            lines.append("EMAIL" + typeParam(e.label) + ":" + escape(uri("mailto:", e.value)))
        }
        for a in c.postalAddresses {
            let v = a.value
            let parts = ["", "", v.street, v.city, v.state, v.postalCode, v.country].map(escape)
            lines.append("ADR" + typeParam(a.label) + ":" + parts.joined(separator: ";"))
        }
        for u in c.urlAddresses { lines.append("URL" + typeParam(u.label) + ":" + escape(u.value)) }
        if let b = c.birthday, let m = b.month, let d = b.day {
            let md = String(format: "%02d%02d", m, d)
            lines.append("BDAY:" + (b.year.map { String(format: "%04d", $0) + md } ?? "--" + md))
        }
        if !c.note.isEmpty { lines.append("NOTE:" + escape(c.note)) }
        if let image = c.imageData, !image.isEmpty {
            let type = image.starts(with: [0x89, 0x50, 0x4E, 0x47]) ? "image/png" : "image/jpeg"
            lines.append("PHOTO:data:\(type);base64," + image.base64EncodedString())
        }
        lines.append("END:VCARD")
        return lines.map(fold).joined()
    }
}
