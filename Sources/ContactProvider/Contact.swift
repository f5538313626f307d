public import Foundation

/// A value with a label, as in a contact's phone numbers or email addresses (Contacts'
/// `CNLabeledValue`). Labels are free text; the Contacts framework's well-known labels are given
/// as constants.
public struct CNLabeledValue<ValueType: Sendable & Hashable>: Sendable, Hashable {
    /// The label, e.g. ``CNLabelHome``, or `nil`.
    public var label: String?
    /// The value.
    public var value: ValueType

    public init(label: String?, value: ValueType) {
        self.label = label
        self.value = value
    }
}

/// The label of home values (Contacts' `CNLabelHome`).
public let CNLabelHome = "_$!<Home>!$_"
/// The label of work values (Contacts' `CNLabelWork`).
public let CNLabelWork = "_$!<Work>!$_"
/// The label of other values (Contacts' `CNLabelOther`).
public let CNLabelOther = "_$!<Other>!$_"
/// The label of mobile phone numbers (Contacts' `CNLabelPhoneNumberMobile`).
public let CNLabelPhoneNumberMobile = "_$!<Mobile>!$_"

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

/// A contact: the subset of Contacts' `CNContact` properties that a provider supplies, with the
/// same names. A value type here (Linux has no Contacts framework); ``CNMutableContact`` names it
/// as Apple's `ContactItem.contact(_:_:)` does.
public struct CNContact: Sendable, Hashable {
    public var namePrefix = ""
    public var givenName = ""
    public var middleName = ""
    public var familyName = ""
    public var nameSuffix = ""
    public var nickname = ""
    public var organizationName = ""
    public var departmentName = ""
    public var jobTitle = ""
    public var phoneNumbers: [CNLabeledValue<String>] = []
    public var emailAddresses: [CNLabeledValue<String>] = []
    public var postalAddresses: [CNLabeledValue<CNPostalAddress>] = []
    public var urlAddresses: [CNLabeledValue<String>] = []
    /// The birthday's calendar components (year may be absent).
    public var birthday: DateComponents?
    public var note = ""
    /// The contact's picture, as encoded image bytes (JPEG or PNG).
    public var imageData: Data?
    /// vCard content lines that no other property holds, as read (unfolded, group and parameters
    /// included): written again on export while they still apply. Trellis only: Apple's
    /// `CNContact` has no such property (see docs/CONTACTS.md, "What a card keeps").
    public var vCardProperties: [String] = []

    public init() {}
}

/// The contact type `ContactItem.contact(_:_:)` carries, as in Apple's signature.
public typealias CNMutableContact = CNContact
