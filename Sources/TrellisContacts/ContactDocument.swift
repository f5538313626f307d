public import ContactProvider
import Foundation
public import TrellisCore
import TrellisStore

/// How a contact is stored as a Trellis document: one document per contact, fields named after
/// `CNContact`'s properties (see docs/CONTACTS.md, "Document shape").
///
/// Empty strings and empty lists are left out. Labelled values are maps `{"label", "value"}`
/// (postal addresses `{"label", "street", "city", …}`); `birthday` is `{"year"?, "month", "day"}`;
/// `imageData` is base64 text; `vCardProperties` is a list of strings, the vCard lines no other
/// field holds (``ContactProvider/CNContact/vCardProperties``).
public enum ContactDocument {
    // Key paths are immutable values; the tables are constants.
    nonisolated(unsafe) static let stringFields: [(String, WritableKeyPath<ContactFields, String>)] = [
        ("namePrefix", \.namePrefix), ("givenName", \.givenName), ("middleName", \.middleName),
        ("familyName", \.familyName), ("nameSuffix", \.nameSuffix), ("nickname", \.nickname),
        ("organizationName", \.organizationName), ("departmentName", \.departmentName),
        ("jobTitle", \.jobTitle), ("note", \.note),
    ]
    nonisolated(unsafe) static let addressFields: [(String, WritableKeyPath<CNPostalAddress, String>)] = [
        ("street", \.street), ("city", \.city), ("state", \.state), ("postalCode", \.postalCode),
        ("country", \.country), ("isoCountryCode", \.isoCountryCode),
    ]

    /// The identifier of a document's `_id`, one to one: a string itself, or written `\` + the
    /// string when it begins with `{` or `\`; a map, its canonical JSON (which begins with `{`).
    /// So a string `_id` that spells a map's JSON names another contact than the map (before,
    /// both were one contact, and removing either removed the other's file).
    public static func identifier(for id: Value) -> ContactItem.Identifier {
        if case .string(let s) = id { return identifier(forString: s) }
        return ContactItem.Identifier(JSON.string(id))
    }

    /// ``identifier(for:)`` of a change-log row's `_id` as the store hands it over: a string
    /// `_id` given as its bytes is made into the identifier's string once, without a ``Value``.
    static func identifier(for id: LogRowID) -> ContactItem.Identifier {
        switch id {
        case .string(let bytes): return identifier(forString: String(decoding: bytes, as: UTF8.self))
        case .parsed(let value): return identifier(for: value)
        }
    }

    /// ``identifier(for:)`` of the string `_id` `s`.
    private static func identifier(forString s: String) -> ContactItem.Identifier {
        // A string whose first byte is neither `{` nor `\` has neither prefix: most, at once.
        guard let first = s.utf8.first, first == UInt8(ascii: "{") || first == UInt8(ascii: "\\") else {
            return ContactItem.Identifier(s)
        }
        return ContactItem.Identifier(s.hasPrefix("{") || s.hasPrefix("\\") ? "\\" + s : s)
    }

    /// The `_id` an identifier names (``identifier(for:)`` read back): after `\`, the string
    /// that follows; the JSON of a map, that map; anything else, the string itself.
    public static func id(for identifier: ContactItem.Identifier) -> Value {
        let text = identifier.value
        if text.hasPrefix("\\") { return .string(String(text.dropFirst())) }
        if text.hasPrefix("{"), case .map(let map)? = try? JSON.parse(text), !map.isEmpty { return .map(map) }
        return .string(text)
    }

    /// The document for a contact, with `_id` the one `identifier` names (``id(for:)``).
    public static func value(for contact: CNContact, identifier: ContactItem.Identifier) -> Value {
        let fields = contact.fields
        var map: UTF8Map<Value> = ["_id": id(for: identifier)]
        for (name, path) in stringFields where !fields[keyPath: path].isEmpty {
            map[name] = .string(fields[keyPath: path])
        }
        let lists = [
            ("phoneNumbers", fields.phoneNumbers.map { $0.map(\.stringValue) }),
            ("emailAddresses", fields.emailAddresses.map { $0.map { $0 as String } }),
            ("urlAddresses", fields.urlAddresses.map { $0.map { $0 as String } }),
        ]
        for (name, list) in lists where !list.isEmpty {
            map[name] = .array(list.map { labelled($0.label, ["value": .string($0.value)]) })
        }
        if !contact.postalAddresses.isEmpty {
            map["postalAddresses"] = .array(
                contact.postalAddresses.map { item in
                    var fields: UTF8Map<Value> = [:]
                    for (name, path) in addressFields where !item.value[keyPath: path].isEmpty {
                        fields[name] = .string(item.value[keyPath: path])
                    }
                    return labelled(item.label, fields)
                })
        }
        if let b = contact.birthday, let month = b.month, let day = b.day {
            var fields: UTF8Map<Value> = ["month": .int(Int64(month)), "day": .int(Int64(day))]
            if let year = b.year { fields["year"] = .int(Int64(year)) }
            map["birthday"] = .map(fields)
        }
        if let image = contact.imageData, !image.isEmpty {
            map["imageData"] = .string(image.base64EncodedString())
        }
        if !contact.vCardProperties.isEmpty {
            map["vCardProperties"] = .array(contact.vCardProperties.map { .string($0) })
        }
        return .map(map)
    }

    private static func labelled(_ label: String?, _ fields: UTF8Map<Value>) -> Value {
        var fields = fields
        if let label { fields["label"] = .string(label) }
        return .map(fields)
    }

    /// The contact a document holds. Unknown fields are ignored; fields of the wrong type are
    /// left empty.
    public static func contact(from value: Value) -> CNMutableContact {
        var c = ContactFields()
        for (name, path) in stringFields {
            if let s = value[name]?.stringValue { c[keyPath: path] = s }
        }
        func list(_ name: String) -> [CNLabeledValue<String>] {
            items(value[name]).compactMap { item in
                item["value"]?.stringValue.map { CNLabeledValue(label: item["label"]?.stringValue, value: $0) }
            }
        }
        c.phoneNumbers = list("phoneNumbers").map { $0.map(CNPhoneNumber.init(stringValue:)) }
        c.emailAddresses = list("emailAddresses").map { $0.map { $0 as NSString } }
        c.urlAddresses = list("urlAddresses").map { $0.map { $0 as NSString } }
        c.postalAddresses = items(value["postalAddresses"]).map { item in
            var address = CNPostalAddress()
            for (name, path) in addressFields {
                if let s = item[name]?.stringValue { address[keyPath: path] = s }
            }
            return CNLabeledValue(label: item["label"]?.stringValue, value: address)
        }
        if let b = value["birthday"], let month = b["month"]?.intValue, let day = b["day"]?.intValue {
            c.birthday = DateComponents(year: b["year"]?.intValue.map { Int($0) }, month: Int(month), day: Int(day))
        }
        if let text = value["imageData"]?.stringValue { c.imageData = Data(base64Encoded: text) }
        // Export writes only the lines that are one safe property line each (VCard.keptLine).
        c.vCardProperties = items(value["vCardProperties"]).compactMap(\.stringValue)
        return CNMutableContact(fields: c)
    }

    /// The contact a document's JSON text holds: `contact(from: try JSON.parse(text))`, read
    /// without building the ``Value`` tree when the text has the compact shape the store writes.
    ///
    /// The text is read in one pass straight into the contact's fields; text that one pass
    /// cannot vouch for (whitespace, a key with an escape, an exponent or `\u` escape in a member
    /// the contact does not hold, malformed JSON) is parsed and read as ``contact(from:)`` reads
    /// it. The result is the same either way, for every text.
    ///
    /// - Returns: the contact, or `nil` when `text` is not JSON (``JSON/parse(_:)-(String)``
    ///   throws). Text that is JSON but not a map gives an empty contact, as ``contact(from:)``.
    /// - Complexity: O(n) in the length of the text.
    public static func contact(fromJSON text: String) -> CNMutableContact? {
        var text = text
        return text.withUTF8 { contact(fromJSON: $0) }
    }

    /// The contact in a document's JSON text given as bytes, read as
    /// `contact(fromJSON: String(decoding: bytes, as: UTF8.self))` reads it (an ill-formed UTF-8
    /// sequence counts as U+FFFD), without making that string when the text has the compact
    /// shape the store writes: what ``ContactsEnumerator`` reads rows with.
    ///
    /// - Parameter bytes: the text; read only during the call.
    /// - Returns: the contact, or `nil` when the text is not JSON.
    /// - Complexity: O(n) in the length of the text.
    public static func contact(fromJSON bytes: UnsafeBufferPointer<UInt8>) -> CNMutableContact? {
        fields(fromJSON: bytes).map(CNMutableContact.init(fields:))
    }

    /// The fields of the contact in `bytes`, read as ``contact(fromJSON:)-(UnsafeBufferPointer<UInt8>)``
    /// reads them; `nil` when the text is not JSON.
    package static func fields(fromJSON bytes: UnsafeBufferPointer<UInt8>) -> ContactFields? {
        if let fields = ContactJSONDecoder.fields(bytes) { return fields }
        guard let value = try? JSON.parse(String(decoding: bytes, as: UTF8.self)) else { return nil }
        return contact(from: value).fields
    }

    /// The contact in a document's JSON text given as bytes, as
    /// ``contact(fromJSON:)-(UnsafeBufferPointer<UInt8>)`` gives it, but read when one of its
    /// properties is first asked for: what ``ContactsEnumerator`` delivers.
    ///
    /// Text that the one-pass check vouches for as JSON
    /// (``JSONScan/certainlyParses(_:)-(UnsafeBufferPointer<UInt8>)``: compact, no `\u` escapes or
    /// exponents) is kept as a copy of its bytes in `texts`' shared blocks, and the contact reads it
    /// on first use. Any other text is read now, so that text which is not JSON still answers `nil`
    /// here.
    ///
    /// - Parameters:
    ///   - bytes: the text; read (and copied) only during the call.
    ///   - texts: the blocks the copy goes to, shared by the contacts made with them (a page's).
    /// - Returns: the contact, or `nil` when the text is not JSON.
    /// - Complexity: O(n) in the length of the text now, without allocation beyond the contact
    ///   (and a block of ``ContactTexts/blockSize`` bytes when the current one is full); O(n)
    ///   again on the first read of a property.
    package static func contact(
        deferringJSON bytes: UnsafeBufferPointer<UInt8>, into texts: inout ContactTexts
    ) -> CNMutableContact? {
        guard JSONScan.certainlyParses(bytes) else { return contact(fromJSON: bytes) }
        return CNMutableContact(source: texts.copy(bytes), read: fieldsOfVouchedText)
    }

    /// ``contact(deferringJSON:into:)`` with a block of its own, the text's size: for a contact
    /// made alone.
    package static func contact(deferringJSON bytes: UnsafeBufferPointer<UInt8>) -> CNMutableContact? {
        var texts = ContactTexts(blockSize: bytes.count)
        return contact(deferringJSON: bytes, into: &texts)
    }

    /// The fields of text the one-pass check vouched for (so it parses; were it ever not to, an
    /// empty contact rather than a trap).
    @Sendable private static func fieldsOfVouchedText(_ bytes: UnsafeBufferPointer<UInt8>) -> ContactFields {
        fields(fromJSON: bytes) ?? ContactFields()
    }

    private static func items(_ value: Value?) -> [Value] {
        if case .array(let a)? = value { return a }
        return []
    }

    /// The item for a live document.
    public static func item(id: Value, value: Value) -> ContactItem {
        .contact(contact(from: value), identifier(for: id))
    }
}
