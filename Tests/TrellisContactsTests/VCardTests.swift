import ContactProvider
import Foundation
import Testing
import TrellisContacts
import TrellisCore
import TrellisStore
import TrellisTestKit

/// A 1×1 PNG.
let tinyPNG = Data(
    base64Encoded: "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")!

/// A contact using every supported property.
func richContact() -> CNMutableContact {
    let c = CNMutableContact()
    c.namePrefix = "Dr."
    c.givenName = "Ada"
    c.middleName = "King"
    c.familyName = "Lovelace"
    c.nameSuffix = "FRS"
    c.nickname = "Countess"
    c.organizationName = "Analytical Engines; Ltd"
    c.departmentName = "Notes, Appendix"
    c.jobTitle = "Mathematician"
    c.phoneNumbers = [
        CNLabeledValue(label: CNLabelPhoneNumberMobile, value: CNPhoneNumber(stringValue: "+44 20 7946 0000")),
        CNLabeledValue(label: CNLabelWork, value: CNPhoneNumber(stringValue: "+44 20 7946 0001")),
    ]
    c.emailAddresses = [CNLabeledValue(label: CNLabelHome, value: "ada@example.org")]
    c.postalAddresses = [
        CNLabeledValue(
            label: CNLabelHome,
            value: CNPostalAddress(
                street: "12 St James's Square", city: "London", state: "", postalCode: "SW1Y 4JH", country: "UK"))
    ]
    c.urlAddresses = [CNLabeledValue(label: nil, value: "https://example.org/ada")]
    c.birthday = DateComponents(year: 1815, month: 12, day: 10)
    c.note =
        "Wrote the first program.\nBackslash \\ comma, semicolon; and a line long enough to need folding twice over"
    c.imageData = tinyPNG
    return c
}

@Suite("vCard")
struct VCardTests {
    @Test("vCard 3.0: folded lines, escaping, parameters, non-Latin text, base64 photo")
    func readVersion3() throws {
        let photo = tinyPNG.base64EncodedString()
        let text =
            "BEGIN:VCARD\r\nVERSION:3.0\r\nUID:u-3\r\nFN:Пётр Ильич Чайковский\r\n"
            + "N:Чайковский;Пётр;Ильич;;\r\nitem1.TEL;TYPE=CELL,VOICE:+7 495 000\r\n"
            + "EMAIL;TYPE=INTERNET;TYPE=WORK:p@example.ru\r\nADR;TYPE=HOME:;;Тверская\\, 1;Москва;;125009;Россия\r\n"
            + "NOTE:first\\nsecond\\; third\\, fourth \\\\ fifth and a folded\r\n  continuation\r\n"
            + "PHOTO;ENCODING=b;TYPE=PNG:\(photo.prefix(40))\r\n \(photo.dropFirst(40))\r\n"
            + "BDAY:1840-05-07\r\nEND:VCARD\r\n"
        let (cards, errors) = VCard.parse(text)
        #expect(errors.isEmpty)
        let card = try #require(cards.first)
        #expect(card.uid == "u-3")
        let c = card.contact
        #expect(c.givenName == "Пётр")
        #expect(c.familyName == "Чайковский")
        #expect(c.middleName == "Ильич")
        #expect(
            c.phoneNumbers == [
                CNLabeledValue(label: CNLabelPhoneNumberMobile, value: CNPhoneNumber(stringValue: "+7 495 000"))
            ])
        #expect(c.emailAddresses == [CNLabeledValue(label: CNLabelWork, value: "p@example.ru")])
        #expect(c.postalAddresses.first?.value.street == "Тверская, 1")
        #expect(c.postalAddresses.first?.value.city == "Москва")
        #expect(c.note == "first\nsecond; third, fourth \\ fifth and a folded continuation")
        #expect(c.imageData == tinyPNG)
        #expect(c.birthday == DateComponents(year: 1840, month: 5, day: 7))
    }

    @Test("vCard 4.0: data URI photo, date without year, LF line ends, quoted parameters")
    func readVersion4() throws {
        let text = """
            BEGIN:VCARD
            VERSION:4.0
            UID:urn:uuid:4fbe8971-0bc3-424c-9c26-36c3e1eff6b1
            FN:李小龙
            N:李;小龙;;;
            TEL;VALUE=uri;TYPE="voice,home":tel:+1-555-555-5555
            EMAIL;PREF=1:bruce@example.com
            BDAY:--1127
            PHOTO:data:image/png;base64,\(tinyPNG.base64EncodedString())
            END:VCARD
            """
        let (cards, errors) = VCard.parse(text)
        #expect(errors.isEmpty)
        let c = try #require(cards.first)
        #expect(c.uid == "urn:uuid:4fbe8971-0bc3-424c-9c26-36c3e1eff6b1")
        #expect(c.contact.givenName == "小龙")
        #expect(c.contact.phoneNumbers.map(\.value.stringValue) == ["+1-555-555-5555"])
        #expect(c.contact.phoneNumbers.map(\.label) == [CNLabelHome])
        #expect(c.contact.emailAddresses.first?.value == "bruce@example.com")
        #expect(c.contact.birthday == DateComponents(month: 11, day: 27))
        #expect(c.contact.imageData == tinyPNG)
    }

    /// vobject and khard escape the comma of a `data:` URI as vCard text (`base64\,`): the photo
    /// is read, not dropped.
    @Test("a data: URI photo with an escaped comma is read")
    func photoWithEscapedComma() throws {
        let text = """
            BEGIN:VCARD
            VERSION:3.0
            UID:photo-1
            FN:Photo
            N:;Photo;;;
            PHOTO:data:image/png;base64\\,\(tinyPNG.base64EncodedString())
            END:VCARD
            """
        let (cards, errors) = VCard.parse(text)
        #expect(errors.isEmpty)
        #expect(try #require(cards.first).contact.imageData == tinyPNG)
    }

    /// A person's FN with an organisation and no N is kept (khard lists the card by it), and an
    /// organisation's own card (FN equal to ORG) stays an organisation's.
    @Test("FN with ORG and no N keeps its name")
    func formattedNameWithOrganization() throws {
        let person = VCard.parse("BEGIN:VCARD\nVERSION:3.0\nUID:p\nFN:labeled guy\nORG:Test Inc\nEND:VCARD\n")
        let c = try #require(person.contacts.first).contact
        #expect(c.givenName == "labeled guy")
        #expect(c.organizationName == "Test Inc")
        #expect(VCard.formattedName(c, uid: "p") == "labeled guy")
        let company = VCard.parse("BEGIN:VCARD\nVERSION:3.0\nUID:o\nFN:Test Inc\nORG:Test Inc\nEND:VCARD\n")
        let o = try #require(company.contacts.first).contact
        #expect(o.givenName.isEmpty)
        #expect(VCard.formattedName(o, uid: "o") == "Test Inc")
    }

    @Test("a bad card is reported with its line and skipped; the rest are read")
    func badCardSkipped() {
        let text = """
            BEGIN:VCARD
            VERSION:4.0
            UID:good-1
            FN:Good One
            END:VCARD
            BEGIN:VCARD
            VERSION:4.0
            UID:bad
            FN:Bad
            BDAY:yesterday
            END:VCARD
            BEGIN:VCARD
            VERSION:4.0
            UID:bad-2
            this line has no colon
            END:VCARD
            BEGIN:VCARD
            UID:no-version
            END:VCARD
            BEGIN:VCARD
            VERSION:3.0
            UID:good-2
            FN:Good Two
            END:VCARD
            BEGIN:VCARD
            VERSION:4.0
            UID:unterminated
            """
        let (cards, errors) = VCard.parse(text)
        // A BDAY that is not a date leaves that field out with a warning; the card is kept.
        #expect(cards.map(\.uid) == ["good-1", "bad", "good-2"])
        #expect(cards[1].contact.birthday == nil)
        #expect(errors.map(\.line) == [10, 15, 17, 25])
        #expect(errors[0].message.contains("BDAY") && !errors[0].skipsCard)
        #expect(errors.dropFirst().allSatisfy { $0.skipsCard })
    }

    @Test("vCard 4.0 export round-trips every property, folded at 75 octets")
    func roundTrip() throws {
        let c = richContact()
        let text = VCard.serialize(c, uid: "ada/1:x")
        #expect(text.hasPrefix("BEGIN:VCARD\r\nVERSION:4.0\r\n"))
        for line in text.components(separatedBy: "\r\n") { #expect(line.utf8.count <= 75) }
        let (cards, errors) = VCard.parse(text)
        #expect(errors.isEmpty)
        let back = try #require(cards.first)
        #expect(back.uid == "ada/1:x")
        #expect(back.contact == c)
        // Multi-byte text folds between characters, never inside one.
        let wide = CNMutableContact()
        wide.givenName = String(repeating: "日本語", count: 40)
        let folded = VCard.serialize(wide, uid: "w")
        #expect(VCard.parse(folded).contacts.first?.contact.givenName == wide.givenName)
    }

    @Test("values the writer and reader could once disagree on come back as written")
    func awkwardValuesRoundTrip() throws {
        let c = CNMutableContact()
        c.givenName = "Smith, Jr"  // a comma inside one name part
        c.familyName = "O;Brien\\"
        // An ignored TYPE; a tel: value.
        c.phoneNumbers = [CNLabeledValue(label: "voice", value: CNPhoneNumber(stringValue: "tel:123"))]
        c.emailAddresses = [CNLabeledValue(label: "Private \"Box\"", value: "MAILTO:x@example.org")]
        let text = VCard.serialize(c, uid: "awkward")
        let back = try #require(VCard.parse(text).contacts.first)
        #expect(back.contact.givenName == "Smith, Jr")
        #expect(back.contact.familyName == "O;Brien\\")
        #expect(back.contact.phoneNumbers == [CNLabeledValue(label: nil, value: CNPhoneNumber(stringValue: "tel:123"))])
        #expect(back.contact.emailAddresses == [CNLabeledValue(label: "private box", value: "MAILTO:x@example.org")])
        #expect(VCard.serialize(back.contact, uid: back.uid) == text)
    }

    /// A combining mark after a quote, a semicolon or a comma joins it into one `Character`; the
    /// reader and the writer work scalar by scalar (as RFC 6350's grammar reads octets), so the
    /// quote still closes, the semicolon is still escaped and the label still reads back.
    @Test("combining marks after quotes and separators round-trip")
    func combiningMarksAfterSeparatorsRoundTrip() throws {
        let c = CNMutableContact()
        c.givenName = "A;\u{301}b"
        c.familyName = "C,\u{301}d"
        c.organizationName = "\u{301}Org"
        c.emailAddresses = [CNLabeledValue(label: "\u{369}\u{451}", value: "x@example.org")]
        let text = VCard.serialize(c, uid: "marks")
        let (cards, errors) = VCard.parse(text)
        #expect(errors.isEmpty, "\(errors)")
        let back = try #require(cards.first).contact
        #expect(back.givenName == "A;\u{301}b")
        #expect(back.familyName == "C,\u{301}d")
        #expect(back.organizationName == "\u{301}Org")
        #expect(back.emailAddresses.map(\.value) == ["x@example.org"])
        #expect(VCard.serialize(back, uid: "marks") == text)
        let quoted = VCard.parse("BEGIN:VCARD\nVERSION:4.0\nUID:q\nEMAIL;TYPE=\"\u{369}x\":y@example.org\nEND:VCARD\n")
        #expect(
            quoted.errors.isEmpty && quoted.contacts.first?.contact.emailAddresses.map(\.value) == ["y@example.org"])
    }

    @Test("a lone CR ends a line, as LF and CRLF do")
    func loneCarriageReturn() throws {
        let (cards, errors) = VCard.parse("BEGIN:VCARD\rVERSION:3.0\rUID:mac\rN:Doe;Jo;;;\rEND:VCARD\r")
        #expect(errors.isEmpty)
        #expect(cards.map(\.uid) == ["mac"])
        #expect(cards.first?.contact.givenName == "Jo")
    }

    @Test("FN becomes the given name only when it says more than export would")
    func formattedNameAsGivenName() throws {
        let named = VCard.parse("BEGIN:VCARD\nVERSION:4.0\nUID:u1\nFN:Ada\nEND:VCARD\n").contacts
        #expect(named.first?.contact.givenName == "Ada")
        // Export writes the UID (or nickname, email) as FN when there is no name: not a name.
        let unnamed = VCard.serialize(CNContact(), uid: "u2")
        #expect(unnamed.contains("FN:u2\r\n"))
        let back = try #require(VCard.parse(unnamed).contacts.first)
        #expect(back.contact.givenName.isEmpty)
        #expect(VCard.serialize(back.contact, uid: back.uid) == unnamed)
    }

    @Test("import then export through the store keeps the contacts")
    func importExport() throws {
        let f = try ContactsFixture()
        let text = VCard.serialize(richContact(), uid: "ada") + VCard.serialize(CNContact(), uid: "empty")
        let (ids, errors) = try ContactImport.importVCards(text, into: f.store)
        #expect(ids == ["ada", "empty"])
        #expect(errors.isEmpty)
        let exported = try ContactImport.exportVCards(from: f.store)
        let back = VCard.parse(exported).contacts
        #expect(back.map(\.uid) == ["ada", "empty"])
        #expect(back.first?.contact == richContact())
    }
}
