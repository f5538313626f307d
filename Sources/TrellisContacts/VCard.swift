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
        /// The whole line as read (unfolded), group and parameters included.
        var raw: String
    }

    /// Properties read into a list of labelled values (``CNContact/phoneNumbers`` and the like):
    /// each line is one value.
    static let listProperties: Set<String> = ["TEL", "EMAIL", "URL", "ADR"]
    /// Properties read into one field each; several lines of one of them are one block.
    static let fieldProperties: Set<String> = ["NICKNAME", "ORG", "TITLE", "NOTE", "BDAY"]
    /// The formatted name and the name parts, kept or written together.
    static let nameProperties: Set<String> = ["FN", "N"]
    /// Never kept: the card's frame and identity, and the photo (its bytes are the field).
    static let neverKept: Set<String> = ["BEGIN", "END", "VERSION", "UID", "PHOTO"]

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
        return ContentLine(name: name, params: params, value: value, line: number, raw: text)
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
    /// Lines that no `CNContact` field holds as written go to ``ContactProvider/CNContact/vCardProperties``
    /// (see ``keptLines(_:contact:uid:warnings:)``).
    static func makeContact(_ lines: [ContentLine], line: Int, warnings: inout [VCardError]) throws -> VCardContact {
        var c = ContactFields()
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
            default: apply(l, to: &c, formatted: &formatted, warnings: &warnings)
            }
        }
        guard version != nil else { throw VCardError(line: line, message: "card has no VERSION") }
        let id = uid ?? UUID().uuidString.lowercased()
        takeFormattedName(formatted, into: &c, uid: id)
        readUnwritableAsExported(lines, into: &c)
        c.vCardProperties = keptLines(lines, contact: c, uid: id, warnings: &warnings)
        return VCardContact(uid: id, contact: CNContact(fields: c), line: line)
    }

    /// Reads one line into the contact's fields (`FN` into `formatted`); other names are ignored.
    static func apply(
        _ l: ContentLine, to c: inout ContactFields, formatted: inout String, warnings: inout [VCardError]
    ) {
        switch l.name {
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
        case "TEL": c.phoneNumbers.append(labeledText(l).map(CNPhoneNumber.init(stringValue:)))
        case "EMAIL": c.emailAddresses.append(labeledText(l).map { $0 as NSString })
        case "URL": c.urlAddresses.append(labeledText(l).map { $0 as NSString })
        case "ADR": c.postalAddresses.append(postalAddress(l))
        case "BDAY":
            if isTextBirthday(l) { return }  // no field holds it: kept alongside
            guard let b = birthday(l.value) else {
                warnings.append(
                    VCardError(
                        line: l.line,
                        message: "BDAY '\(l.value)' is not a date (YYYYMMDD, YYYY-MM-DD or --MMDD); field left out",
                        skipsCard: false))
                return
            }
            c.birthday = b
        case "PHOTO":
            guard let data = photo(l) else {
                warnings.append(
                    VCardError(
                        line: l.line, message: "PHOTO is neither base64 data nor a data: URI; field left out",
                        skipsCard: false))
                return
            }
            c.imageData = data
        default: return
        }
    }

    /// A `TEL`, `EMAIL`, `URL` or `ADR` line that cannot be kept (its group or name is not a vCard
    /// name) is read as the line export writes for it, so that its value is the one exported:
    /// otherwise a label export writes differently (`TYPE=CEL%L` becomes `cell`) could take the
    /// place of an equal kept line on the next import, and the order of the lines would change.
    static func readUnwritableAsExported(_ lines: [ContentLine], into c: inout ContactFields) {
        var counts: [String: Int] = [:]
        for l in lines where listProperties.contains(l.name) {
            let i = counts[l.name, default: 0]
            counts[l.name] = i + 1
            guard keptLine(l.raw) == nil, let again = parseLine(elementLine(l), l.line) else { continue }
            switch l.name {
            case "TEL": c.phoneNumbers[i] = labeledText(again).map(CNPhoneNumber.init(stringValue:))
            case "EMAIL": c.emailAddresses[i] = labeledText(again).map { $0 as NSString }
            case "URL": c.urlAddresses[i] = labeledText(again).map { $0 as NSString }
            default: c.postalAddresses[i] = postalAddress(again)
            }
        }
    }

    /// A card whose name is only its FN keeps that name as the given name, unless FN is what
    /// export would write anyway (name parts, organisation, nickname, email or UID), so exporting
    /// and importing again is stable. An organisation does not stand in for a person's FN
    /// (`FN:labeled guy` with `ORG:Test Inc` and no `N` stays "labeled guy").
    static func takeFormattedName(_ formatted: String, into c: inout ContactFields, uid: String) {
        if c.givenName.isEmpty && c.familyName.isEmpty && !formatted.isEmpty && formatted != formattedName(c, uid: uid)
        {
            c.givenName = formatted
        }
    }

    /// A `TEL`, `EMAIL` or `URL` line as a labelled value; one `tel:` or `mailto:` prefix is taken
    /// off.
    static func labeledText(_ l: ContentLine) -> CNLabeledValue<String> {
        var v = unescape(l.value)
        if l.name == "TEL", v.lowercased().hasPrefix("tel:") { v = String(v.dropFirst(4)) }
        if l.name == "EMAIL", v.lowercased().hasPrefix("mailto:") { v = String(v.dropFirst(7)) }
        return CNLabeledValue(label: label(l.params), value: v)
    }

    /// An `ADR` line: PO box, extended address and street are the street's lines (RFC 6350 §6.3.1).
    static func postalAddress(_ l: ContentLine) -> CNLabeledValue<CNPostalAddress> {
        let a = components(l.value)
        func part(_ i: Int) -> String { i < a.count ? a[i] : "" }
        let street = [part(0), part(1), part(2)].filter { !$0.isEmpty }.joined(separator: "\n")
        let address = CNPostalAddress(
            street: street, city: part(3), state: part(4), postalCode: part(5), country: part(6))
        return CNLabeledValue(label: label(l.params), value: address)
    }

    /// The lines of a card that export would not write back as they are, in the card's order:
    ///
    /// - a property no `CNContact` field holds (`CATEGORIES`, `KIND`, `REV`, `X-…`, grouped lines such
    ///   as `item1.X-ABLabel`), unless its name is not a vCard name (then a warning);
    /// - a `TEL`, `EMAIL`, `URL` or `ADR` line unlike the line export writes for its value
    ///   (`EMAIL;TYPE=pref:…`, a PO box in `ADR`, a group);
    /// - all lines of `NICKNAME`, `ORG`, `TITLE`, `NOTE` or `BDAY` when they are unlike export's;
    /// - all `FN` and `N` lines when they are unlike export's (an `FN` that is not the name parts
    ///   joined, `N;ALTID` alternatives).
    ///
    /// A text birthday (`BDAY;VALUE=text:circa 1800`) is a property no field holds. `VERSION`,
    /// `UID`, `PHOTO`, and a `BDAY` that is neither a date nor text are never kept.
    /// - Complexity: O(number of lines).
    static func keptLines(_ lines: [ContentLine], contact c: ContactFields, uid: String, warnings: inout [VCardError])
        -> [String]
    {
        // A line export could not write back as it is (its group or name is not a vCard name) is
        // not kept: its value is in the field, its spelling is lost. A block is kept whole or not.
        func writable(_ l: ContentLine) -> Bool { keptLine(l.raw) != nil }
        let names = lines.filter { nameProperties.contains($0.name) }
        let keepNames = names.map(\.raw).sorted() != nameLines(c, uid: uid).sorted() && names.allSatisfy(writable)
        var keepField: Set<String> = []
        for property in fieldProperties {
            let block = lines.filter { $0.name == property && readsAsField($0) }
            if !block.isEmpty && block.map(\.raw) != fieldLines(property, c) && block.allSatisfy(writable) {
                keepField.insert(property)
            }
        }
        var kept: [String] = []
        for l in lines where !neverKept.contains(l.name) {
            if nameProperties.contains(l.name) {
                if keepNames { kept.append(l.raw) }
            } else if fieldProperties.contains(l.name) && !isTextBirthday(l) {
                if keepField.contains(l.name) && readsAsField(l) { kept.append(l.raw) }
            } else if listProperties.contains(l.name) {
                if l.raw != elementLine(l) && writable(l) { kept.append(l.raw) }
            } else if keptLine(l.raw) != nil {
                kept.append(l.raw)
            } else {
                warnings.append(
                    VCardError(
                        line: l.line, message: "\(l.raw.prefix(40)) is not a property line that can be kept; left out",
                        skipsCard: false))
            }
        }
        return kept
    }

    /// Whether a line of one of ``fieldProperties`` sets its field: a `BDAY` must be a date.
    static func readsAsField(_ l: ContentLine) -> Bool {
        l.name != "BDAY" || (!isTextBirthday(l) && birthday(l.value) != nil)
    }

    /// Whether a line is a `BDAY` given as text (RFC 6350 §6.2.5, `VALUE=text`), not a date.
    static func isTextBirthday(_ l: ContentLine) -> Bool {
        l.name == "BDAY" && (l.params["VALUE"] ?? []).contains { $0.lowercased() == "text" }
    }

    /// A kept line as export may write it: one content line (no line break) whose group and name
    /// are vCard names (letters, digits, `-`, `_`), whose name is not one of ``neverKept``.
    /// `nil` otherwise; kept lines come from documents, which come from peers.
    static func keptLine(_ raw: String) -> ContentLine? {
        guard !raw.unicodeScalars.contains(where: { $0 == "\r" || $0 == "\n" }), let line = parseLine(raw, 0) else {
            return nil
        }
        let head = splitUnquoted(String(raw.unicodeScalars.prefix { $0 != ":" }), ";")[0]
        let parts = head.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count <= 2,
            parts.allSatisfy({ part in
                !part.isEmpty
                    && part.unicodeScalars.allSatisfy {
                        $0.isASCII && (CharacterSet.alphanumerics.contains($0) || $0 == "-" || $0 == "_")
                    }
            }),
            !neverKept.contains(line.name)
        else { return nil }
        return line
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
    public static func formattedName(_ c: CNContact, uid: String) -> String { formattedName(c.fields, uid: uid) }

    static func formattedName(_ c: ContactFields, uid: String) -> String {
        let name = [c.namePrefix, c.givenName, c.middleName, c.familyName, c.nameSuffix].filter { !$0.isEmpty }
            .joined(separator: " ")
        for candidate in [name, c.organizationName, c.nickname, (c.emailAddresses.first?.value as String?) ?? ""]
        where !candidate.isEmpty {
            return candidate
        }
        return uid
    }

    /// The formatted name export writes: a kept `FN` (``ContactProvider/CNContact/vCardProperties``)
    /// while the name parts are still those it came with, else ``formattedName(_:uid:)``. What khard
    /// and other vCard readers show for the contact.
    public static func displayName(_ c: CNContact, uid: String) -> String {
        let c = c.fields
        let names = c.vCardProperties.compactMap(keptLine).filter { nameProperties.contains($0.name) }
        if let fn = names.last(where: { $0.name == "FN" }), sameName(names, c, uid: uid) {
            return unescape(fn.value)
        }
        return formattedName(c, uid: uid)
    }

    /// The lines export writes for the formatted name and the name parts.
    static func nameLines(_ c: ContactFields, uid: String) -> [String] {
        [
            "FN:" + escape(formattedName(c, uid: uid)),
            "N:"
                + [c.familyName, c.givenName, c.middleName, c.namePrefix, c.nameSuffix].map(escape).joined(
                    separator: ";"),
        ]
    }

    /// The lines export writes for one of ``fieldProperties`` (none for an empty field).
    static func fieldLines(_ property: String, _ c: ContactFields) -> [String] {
        switch property {
        case "NICKNAME": return c.nickname.isEmpty ? [] : ["NICKNAME:" + escape(c.nickname)]
        case "ORG":
            guard !c.organizationName.isEmpty || !c.departmentName.isEmpty else { return [] }
            let dept = c.departmentName.isEmpty ? "" : ";" + escape(c.departmentName)
            return ["ORG:" + escape(c.organizationName) + dept]
        case "TITLE": return c.jobTitle.isEmpty ? [] : ["TITLE:" + escape(c.jobTitle)]
        case "NOTE": return c.note.isEmpty ? [] : ["NOTE:" + escape(c.note)]
        case "BDAY":
            guard let b = c.birthday, let m = b.month, let d = b.day else { return [] }
            let md = String(format: "%02d%02d", m, d)
            return ["BDAY:" + (b.year.map { String(format: "%04d", $0) + md } ?? "--" + md)]
        default: return []
        }
    }

    /// Whether `block` (lines of one of ``fieldProperties``) reads as the field `c` holds now.
    static func sameField(_ property: String, _ block: [ContentLine], _ c: ContactFields) -> Bool {
        var b = ContactFields()
        var formatted = ""
        var ignored: [VCardError] = []
        for l in block { apply(l, to: &b, formatted: &formatted, warnings: &ignored) }
        switch property {
        case "NICKNAME": return b.nickname == c.nickname
        case "ORG": return b.organizationName == c.organizationName && b.departmentName == c.departmentName
        case "TITLE": return b.jobTitle == c.jobTitle
        case "NOTE": return b.note == c.note
        case "BDAY": return b.birthday == c.birthday
        default: return false
        }
    }

    /// Whether kept `FN` and `N` lines read as the name parts `c` holds now.
    static func sameName(_ block: [ContentLine], _ c: ContactFields, uid: String) -> Bool {
        func parts(_ c: ContactFields) -> [String] {
            [c.namePrefix, c.givenName, c.middleName, c.familyName, c.nameSuffix]
        }
        var b = c
        (b.namePrefix, b.givenName, b.middleName, b.familyName, b.nameSuffix) = ("", "", "", "", "")
        var formatted = ""
        var ignored: [VCardError] = []
        for l in block { apply(l, to: &b, formatted: &formatted, warnings: &ignored) }
        takeFormattedName(formatted, into: &b, uid: uid)
        return parts(b) == parts(c)
    }

    /// The line export writes for the value a `TEL`, `EMAIL`, `URL` or `ADR` line reads as.
    static func elementLine(_ l: ContentLine) -> String {
        switch l.name {
        case "TEL": return telLine(labeledText(l))
        case "EMAIL": return emailLine(labeledText(l))
        case "URL": return urlLine(labeledText(l))
        default: return adrLine(postalAddress(l))
        }
    }

    // The reader takes a `tel:` or `mailto:` URI prefix off; a value that starts with one itself
    // is written with one more.
    private static func uri(_ scheme: String, _ value: String) -> String {
        value.lowercased().hasPrefix(scheme) ? scheme + value : value
    }
    static func telLine(_ p: CNLabeledValue<String>) -> String {
        "TEL" + typeParam(p.label) + ":" + escape(uri("tel:", p.value))
    }
    static func emailLine(_ e: CNLabeledValue<String>) -> String {
        "EMAIL" + typeParam(e.label) + ":" + escape(uri("mailto:", e.value))
    }
    static func urlLine(_ u: CNLabeledValue<String>) -> String { "URL" + typeParam(u.label) + ":" + escape(u.value) }
    static func adrLine(_ a: CNLabeledValue<CNPostalAddress>) -> String {
        let v = a.value
        let parts = ["", "", v.street, v.city, v.state, v.postalCode, v.country].map(escape)
        return "ADR" + typeParam(a.label) + ":" + parts.joined(separator: ";")
    }

    /// The vCard 4.0 text of a contact (RFC 6350), CRLF line ends, folded at 75 octets.
    ///
    /// ``ContactProvider/CNContact/vCardProperties`` are written as kept: a property no field
    /// holds always (after the others); a kept line of a field, or of a labelled value, instead of
    /// the line export would write, as long as it still reads as the value the contact holds (so
    /// an edited name, address or email is written as it is now, without its old line). A kept
    /// line that is not one property line, or names `BEGIN`, `END`, `VERSION`, `UID` or `PHOTO`,
    /// is not written (see ``keptLine(_:)``).
    /// - Complexity: O(size of the contact + kept lines × labelled values).
    public static func serialize(_ c: CNContact, uid: String) -> String {
        let c = c.fields
        let kept = c.vCardProperties.compactMap(keptLine)
        var lines = ["BEGIN:VCARD", "VERSION:4.0", "UID:" + escape(uid)]
        let keptNames = kept.filter { nameProperties.contains($0.name) }
        lines += !keptNames.isEmpty && sameName(keptNames, c, uid: uid) ? keptNames.map(\.raw) : nameLines(c, uid: uid)
        func field(_ property: String) {
            let block = kept.filter { $0.name == property && readsAsField($0) }
            lines += !block.isEmpty && sameField(property, block, c) ? block.map(\.raw) : fieldLines(property, c)
        }
        // Each kept list line stands for one value: the first unused one that reads as it.
        var unused = kept.filter { listProperties.contains($0.name) }
        func element<V>(
            _ name: String, _ value: CNLabeledValue<V>, _ read: (ContentLine) -> CNLabeledValue<V>, _ line: String
        ) {
            if let i = unused.firstIndex(where: { $0.name == name && read($0) == value }) {
                lines.append(unused.remove(at: i).raw)
            } else {
                lines.append(line)
            }
        }
        field("NICKNAME")
        field("ORG")
        field("TITLE")
        for p in c.phoneNumbers.map({ $0.map(\.stringValue) }) { element("TEL", p, labeledText, telLine(p)) }
        for e in c.emailAddresses.map({ $0.map { $0 as String } }) { element("EMAIL", e, labeledText, emailLine(e)) }
        for a in c.postalAddresses { element("ADR", a, postalAddress, adrLine(a)) }
        for u in c.urlAddresses.map({ $0.map { $0 as String } }) { element("URL", u, labeledText, urlLine(u)) }
        field("BDAY")
        field("NOTE")
        if let image = c.imageData, !image.isEmpty {
            // The comma is escaped, as in vCard text: vobject and khard read PHOTO as text and
            // would stop at a bare comma; this reader and RFC 6350 readers take both.
            let type = image.starts(with: [0x89, 0x50, 0x4E, 0x47]) ? "image/png" : "image/jpeg"
            lines.append("PHOTO:data:\(type);base64\\," + image.base64EncodedString())
        }
        let handled = listProperties.union(fieldProperties).union(nameProperties)
        lines += kept.filter { !handled.contains($0.name) || isTextBirthday($0) }.map(\.raw)
        lines.append("END:VCARD")
        return lines.map(fold).joined()
    }
}
