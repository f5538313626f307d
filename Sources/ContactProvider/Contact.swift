public import Foundation

/// A value with a label, as in a contact's phone numbers or email addresses (Contacts'
/// `CNLabeledValue`). Labels are free text; the Contacts framework's well-known labels are given
/// as constants.
///
/// Apple's is a class whose value must be an Objective-C object (`CNPhoneNumber`, `NSString`,
/// `CNPostalAddress`); here a value type over any hashable value, created and read the same way:
/// `CNLabeledValue(label: CNLabelHome, value: "ada@example.com" as NSString)`.
public struct CNLabeledValue<ValueType: Hashable>: Hashable {
    /// The label, e.g. ``CNLabelHome``, or `nil`.
    public var label: String?
    /// The value.
    public var value: ValueType

    public init(label: String?, value: ValueType) {
        self.label = label
        self.value = value
    }

    /// The same label with the value transformed (Trellis only).
    package func map<T>(_ transform: (ValueType) -> T) -> CNLabeledValue<T> {
        CNLabeledValue<T>(label: label, value: transform(value))
    }
}

extension CNLabeledValue: Sendable where ValueType: Sendable {}

/// The label of home values (Contacts' `CNLabelHome`).
public let CNLabelHome = "_$!<Home>!$_"
/// The label of work values (Contacts' `CNLabelWork`).
public let CNLabelWork = "_$!<Work>!$_"
/// The label of other values (Contacts' `CNLabelOther`).
public let CNLabelOther = "_$!<Other>!$_"
/// The label of mobile phone numbers (Contacts' `CNLabelPhoneNumberMobile`).
public let CNLabelPhoneNumberMobile = "_$!<Mobile>!$_"
/// The label of main phone numbers (Contacts' `CNLabelPhoneNumberMain`).
public let CNLabelPhoneNumberMain = "_$!<Main>!$_"
/// The label of iPhone numbers (Contacts' `CNLabelPhoneNumberiPhone`).
public let CNLabelPhoneNumberiPhone = "iPhone"

/// A phone number (Contacts' `CNPhoneNumber`): the digits and punctuation as given, not
/// normalised. Immutable, as Apple's.
public final class CNPhoneNumber: NSObject, NSCopying, @unchecked Sendable {
    /// The number as given.
    public let stringValue: String

    /// A phone number holding `stringValue` as given.
    public init(stringValue: String) { self.stringValue = stringValue }

    public override func isEqual(_ object: Any?) -> Bool {
        (object as? CNPhoneNumber)?.stringValue == stringValue
    }
    public override var hash: Int { stringValue.hashValue }
    public override var description: String { stringValue }
    /// An immutable object is its own copy.
    public func copy(with zone: NSZone? = nil) -> Any { self }
}

/// A postal address (Contacts' `CNPostalAddress`).
public struct CNPostalAddress: Sendable, Hashable {
    public var street = ""
    public var city = ""
    public var state = ""
    public var postalCode = ""
    public var country = ""
    public var isoCountryCode = ""

    public init(
        street: String = "", city: String = "", state: String = "", postalCode: String = "", country: String = "",
        isoCountryCode: String = ""
    ) {
        self.street = street
        self.city = city
        self.state = state
        self.postalCode = postalCode
        self.country = country
        self.isoCountryCode = isoCountryCode
    }
}

/// Every property of a contact, as one value (Trellis only: what ``CNContact`` holds and
/// compares).
package struct ContactFields: Hashable, @unchecked Sendable {
    package init() {}

    package var namePrefix = ""
    package var givenName = ""
    package var middleName = ""
    package var familyName = ""
    package var nameSuffix = ""
    package var nickname = ""
    package var organizationName = ""
    package var departmentName = ""
    package var jobTitle = ""
    package var phoneNumbers: [CNLabeledValue<CNPhoneNumber>] = []
    package var emailAddresses: [CNLabeledValue<NSString>] = []
    package var postalAddresses: [CNLabeledValue<CNPostalAddress>] = []
    package var urlAddresses: [CNLabeledValue<NSString>] = []
    package var birthday: DateComponents?
    package var note = ""
    package var imageData: Data?
    package var vCardProperties: [String] = []
}

/// A contact (Contacts' `CNContact`): immutable, the properties a contact provider supplies,
/// with Apple's names and types. ``CNMutableContact`` is the one to build and change.
///
/// Compared and hashed by value (every property), so two contacts read from the same card are
/// equal. Apple's contacts are thread-safe to read; so is this one. A ``CNMutableContact``, as
/// Apple's, must not be changed while another thread reads it: a contact handed to an observer
/// belongs to the host from then on (the host copies it).
open class CNContact: NSObject, NSCopying, NSMutableCopying, @unchecked Sendable {
    package var fields: ContactFields

    /// An empty contact.
    public override init() { fields = ContactFields() }

    package init(fields: ContactFields) { self.fields = fields }

    public var namePrefix: String { fields.namePrefix }
    public var givenName: String { fields.givenName }
    public var middleName: String { fields.middleName }
    public var familyName: String { fields.familyName }
    public var nameSuffix: String { fields.nameSuffix }
    public var nickname: String { fields.nickname }
    public var organizationName: String { fields.organizationName }
    public var departmentName: String { fields.departmentName }
    public var jobTitle: String { fields.jobTitle }
    public var phoneNumbers: [CNLabeledValue<CNPhoneNumber>] { fields.phoneNumbers }
    public var emailAddresses: [CNLabeledValue<NSString>] { fields.emailAddresses }
    public var postalAddresses: [CNLabeledValue<CNPostalAddress>] { fields.postalAddresses }
    public var urlAddresses: [CNLabeledValue<NSString>] { fields.urlAddresses }
    /// The birthday's calendar components (year may be absent).
    public var birthday: DateComponents? { fields.birthday }
    public var note: String { fields.note }
    /// The contact's picture, as encoded image bytes (JPEG or PNG).
    public var imageData: Data? { fields.imageData }
    /// vCard content lines that no other property holds, as read (unfolded, group and parameters
    /// included): written again on export while they still apply. Trellis only: Apple's
    /// `CNContact` has no such property (see docs/CONTACTS.md, "What a card keeps").
    public var vCardProperties: [String] { fields.vCardProperties }

    public override func isEqual(_ object: Any?) -> Bool {
        (object as? CNContact)?.fields == fields
    }
    public override var hash: Int { fields.hashValue }

    /// An immutable copy (Apple: `copy()` gives a `CNContact`).
    open func copy(with zone: NSZone? = nil) -> Any { CNContact(fields: fields) }
    /// A mutable copy (Apple: `mutableCopy()` gives a ``CNMutableContact``).
    open func mutableCopy(with zone: NSZone? = nil) -> Any { CNMutableContact(fields: fields) }
}

/// A contact to build or change (Contacts' `CNMutableContact`), the contact
/// `ContactItem.contact(_:_:)` carries.
open class CNMutableContact: CNContact, @unchecked Sendable {
    public override var namePrefix: String {
        get { fields.namePrefix }
        set { fields.namePrefix = newValue }
    }
    public override var givenName: String {
        get { fields.givenName }
        set { fields.givenName = newValue }
    }
    public override var middleName: String {
        get { fields.middleName }
        set { fields.middleName = newValue }
    }
    public override var familyName: String {
        get { fields.familyName }
        set { fields.familyName = newValue }
    }
    public override var nameSuffix: String {
        get { fields.nameSuffix }
        set { fields.nameSuffix = newValue }
    }
    public override var nickname: String {
        get { fields.nickname }
        set { fields.nickname = newValue }
    }
    public override var organizationName: String {
        get { fields.organizationName }
        set { fields.organizationName = newValue }
    }
    public override var departmentName: String {
        get { fields.departmentName }
        set { fields.departmentName = newValue }
    }
    public override var jobTitle: String {
        get { fields.jobTitle }
        set { fields.jobTitle = newValue }
    }
    public override var phoneNumbers: [CNLabeledValue<CNPhoneNumber>] {
        get { fields.phoneNumbers }
        set { fields.phoneNumbers = newValue }
    }
    public override var emailAddresses: [CNLabeledValue<NSString>] {
        get { fields.emailAddresses }
        set { fields.emailAddresses = newValue }
    }
    public override var postalAddresses: [CNLabeledValue<CNPostalAddress>] {
        get { fields.postalAddresses }
        set { fields.postalAddresses = newValue }
    }
    public override var urlAddresses: [CNLabeledValue<NSString>] {
        get { fields.urlAddresses }
        set { fields.urlAddresses = newValue }
    }
    public override var birthday: DateComponents? {
        get { fields.birthday }
        set { fields.birthday = newValue }
    }
    public override var note: String {
        get { fields.note }
        set { fields.note = newValue }
    }
    public override var imageData: Data? {
        get { fields.imageData }
        set { fields.imageData = newValue }
    }
    public override var vCardProperties: [String] {
        get { fields.vCardProperties }
        set { fields.vCardProperties = newValue }
    }
}

extension CNContact {
    /// A new mutable contact with the same properties (Trellis only: `mutableCopy() as!
    /// CNMutableContact` without the cast).
    public func mutableContact() -> CNMutableContact { CNMutableContact(fields: fields) }
}
