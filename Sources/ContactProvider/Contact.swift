public import Foundation
import Synchronization

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

/// Where a contact's properties are: held, or still in the text they will be read from.
///
/// A contact an enumerator reads from a stored document keeps the document's JSON text and reads
/// its properties the first time one is asked for (docs/CONTACTS.md, "How the enumerator reads
/// contacts"), as a query's results parse their JSON when first read. Either way the contact
/// object stays small: held properties are boxed, so an unread contact costs its text and a few
/// words.
package enum ContactStorage: @unchecked Sendable {
    /// The properties, in a box no other contact shares.
    case held(ContactFieldsBox)
    /// The text the properties are still to be read from, and the reader.
    case unread(ContactText, @Sendable (UnsafeBufferPointer<UInt8>) -> ContactFields)

    /// The box of properties, read from the text first if they are still there.
    mutating func box() -> ContactFieldsBox {
        switch self {
        case .held(let box): return box
        case .unread(let text, let read):
            let box = ContactFieldsBox(text.withBytes(read))
            self = .held(box)
            return box
        }
    }

    /// The same contact in storage of its own: held properties in a new box (so that changing
    /// one contact never changes another), unread text shared (it never changes).
    var copy: ContactStorage {
        switch self {
        case .held(let box): return .held(ContactFieldsBox(box.fields))
        case .unread: return self
        }
    }
}

/// One contact's text in a ``ContactTextBlock``: bytes written once, before any contact reads
/// them, and never changed (Trellis only).
package struct ContactText: @unchecked Sendable {
    /// The block holding the text; kept alive while the text is.
    let block: ContactTextBlock
    /// Where the text starts in the block, in bytes.
    let start: Int
    /// The text's length, in bytes.
    let count: Int

    /// `body` of the text's bytes, valid only during the call.
    func withBytes<T>(_ body: (UnsafeBufferPointer<UInt8>) -> T) -> T {
        body(UnsafeBufferPointer(start: block.base + start, count: count))
    }
}

/// Memory that the texts of several contacts are copied into, one after another (Trellis only):
/// an enumerator copies the texts of a page's contacts into a few blocks rather than one
/// allocation each (``ContactTexts``).
///
/// Only the part after ``count`` is ever written, and only by the one ``ContactTexts`` filling
/// the block, before the contacts reading the written part are handed over; so contacts on any
/// thread may read their texts while later ones are still being copied in.
package final class ContactTextBlock: @unchecked Sendable {
    fileprivate let base: UnsafeMutablePointer<UInt8>
    /// The block's size, in bytes.
    let capacity: Int
    /// How many bytes are written.
    fileprivate var count = 0

    init(capacity: Int) {
        self.capacity = capacity
        base = .allocate(capacity: capacity)
    }

    deinit { base.deallocate() }
}

/// Copies contacts' texts into shared blocks of memory, for contacts made together (a page of an
/// enumeration): one allocation for many texts, and one release once the contacts are read or
/// released (Trellis only; docs/CONTACTS.md, "How the enumerator reads contacts").
///
/// A contact keeps its whole block alive until its properties are read or it is released: at
/// most its block's size (``blockSize`` by default), or its own text's size when that is larger.
package struct ContactTexts {
    /// The size of a new block by default, in bytes: a text larger than a block gets a block of
    /// its own size.
    package static let blockSize = 32_768

    private var block: ContactTextBlock?
    private let blockSize: Int

    /// Blocks of `blockSize` bytes (for a contact made alone, its text's size).
    package init(blockSize: Int = ContactTexts.blockSize) { self.blockSize = max(1, blockSize) }

    /// A copy of `bytes`, in the current block when it has room, else in a new one.
    ///
    /// - Complexity: O(n) in the length of `bytes`; an allocation only when a block is full.
    package mutating func copy(_ bytes: UnsafeBufferPointer<UInt8>) -> ContactText {
        let block: ContactTextBlock
        if let current = self.block, current.capacity - current.count >= bytes.count {
            block = current
        } else {
            block = ContactTextBlock(capacity: max(blockSize, bytes.count))
            if bytes.count < blockSize { self.block = block }
        }
        let start = block.count
        if let source = bytes.baseAddress { (block.base + start).initialize(from: source, count: bytes.count) }
        block.count += bytes.count
        return ContactText(block: block, start: start, count: bytes.count)
    }
}

/// A contact's properties, boxed (one contact's own; see ``ContactStorage``).
package final class ContactFieldsBox {
    package var fields: ContactFields
    package init(_ fields: ContactFields) { self.fields = fields }
}

/// A contact (Contacts' `CNContact`): immutable, the properties a contact provider supplies,
/// with Apple's names and types. ``CNMutableContact`` is the one to build and change.
///
/// Compared and hashed by value (every property), so two contacts read from the same card are
/// equal. Apple's contacts are thread-safe to read; so is this one. A ``CNMutableContact``, as
/// Apple's, must not be changed while another thread reads it: a contact handed to an observer
/// belongs to the host from then on (the host copies it).
///
/// A contact that an enumerator delivers may hold its document's text until a property is first
/// read; the first read then takes the time of reading the text (O(n) in its length), and every
/// property reads as it would have had the contact been read at once.
open class CNContact: NSObject, NSCopying, NSMutableCopying, @unchecked Sendable {
    private let storage: Mutex<ContactStorage>

    /// An empty contact.
    public override init() { storage = Mutex(.held(ContactFieldsBox(ContactFields()))) }

    package init(fields: ContactFields) { storage = Mutex(.held(ContactFieldsBox(fields))) }

    /// A contact whose properties `read` reads from `text` when one is first asked for (Trellis
    /// only). `read` must give the same fields every time for the same bytes.
    package init(source text: ContactText, read: @escaping @Sendable (UnsafeBufferPointer<UInt8>) -> ContactFields) {
        storage = Mutex(.unread(text, read))
    }

    /// A contact with the properties of `other`, in storage of its own (Trellis only): a source
    /// not yet read stays unread.
    package init(copying other: CNContact) { storage = Mutex(other.storage.withLock { $0.copy }) }

    /// Every property, read from the source first if it has not been.
    package var fields: ContactFields {
        get { read { $0 } }
        set { write { $0 = newValue } }
    }

    /// Whether the properties are still to be read from the contact's source (Trellis only).
    package var isDeferred: Bool {
        storage.withLock {
            if case .unread = $0 { return true }
            return false
        }
    }

    /// `body` of the properties, read from the source first if it has not been.
    package func read<T>(_ body: (borrowing ContactFields) -> T) -> T {
        storage.withLock { body($0.box().fields) }
    }

    /// Changes the properties in place, read from the source first if it has not been.
    package func write(_ body: (inout ContactFields) -> Void) {
        storage.withLock { body(&$0.box().fields) }
    }

    public var namePrefix: String { read { $0.namePrefix } }
    public var givenName: String { read { $0.givenName } }
    public var middleName: String { read { $0.middleName } }
    public var familyName: String { read { $0.familyName } }
    public var nameSuffix: String { read { $0.nameSuffix } }
    public var nickname: String { read { $0.nickname } }
    public var organizationName: String { read { $0.organizationName } }
    public var departmentName: String { read { $0.departmentName } }
    public var jobTitle: String { read { $0.jobTitle } }
    public var phoneNumbers: [CNLabeledValue<CNPhoneNumber>] { read { $0.phoneNumbers } }
    public var emailAddresses: [CNLabeledValue<NSString>] { read { $0.emailAddresses } }
    public var postalAddresses: [CNLabeledValue<CNPostalAddress>] { read { $0.postalAddresses } }
    public var urlAddresses: [CNLabeledValue<NSString>] { read { $0.urlAddresses } }
    /// The birthday's calendar components (year may be absent).
    public var birthday: DateComponents? { read { $0.birthday } }
    public var note: String { read { $0.note } }
    /// The contact's picture, as encoded image bytes (JPEG or PNG).
    public var imageData: Data? { read { $0.imageData } }
    /// vCard content lines that no other property holds, as read (unfolded, group and parameters
    /// included): written again on export while they still apply. Trellis only: Apple's
    /// `CNContact` has no such property (see docs/CONTACTS.md, "What a card keeps").
    public var vCardProperties: [String] { read { $0.vCardProperties } }

    public override func isEqual(_ object: Any?) -> Bool {
        guard let other = object as? CNContact else { return false }
        return other === self || other.fields == fields
    }
    public override var hash: Int { fields.hashValue }

    /// An immutable copy (Apple: `copy()` gives a `CNContact`); a source not yet read is copied
    /// unread.
    open func copy(with zone: NSZone? = nil) -> Any { CNContact(copying: self) }
    /// A mutable copy (Apple: `mutableCopy()` gives a ``CNMutableContact``); a source not yet read
    /// is copied unread.
    open func mutableCopy(with zone: NSZone? = nil) -> Any { CNMutableContact(copying: self) }
}

/// A contact to build or change (Contacts' `CNMutableContact`), the contact
/// `ContactItem.contact(_:_:)` carries.
open class CNMutableContact: CNContact, @unchecked Sendable {
    public override var namePrefix: String {
        get { read { $0.namePrefix } }
        set { write { $0.namePrefix = newValue } }
    }
    public override var givenName: String {
        get { read { $0.givenName } }
        set { write { $0.givenName = newValue } }
    }
    public override var middleName: String {
        get { read { $0.middleName } }
        set { write { $0.middleName = newValue } }
    }
    public override var familyName: String {
        get { read { $0.familyName } }
        set { write { $0.familyName = newValue } }
    }
    public override var nameSuffix: String {
        get { read { $0.nameSuffix } }
        set { write { $0.nameSuffix = newValue } }
    }
    public override var nickname: String {
        get { read { $0.nickname } }
        set { write { $0.nickname = newValue } }
    }
    public override var organizationName: String {
        get { read { $0.organizationName } }
        set { write { $0.organizationName = newValue } }
    }
    public override var departmentName: String {
        get { read { $0.departmentName } }
        set { write { $0.departmentName = newValue } }
    }
    public override var jobTitle: String {
        get { read { $0.jobTitle } }
        set { write { $0.jobTitle = newValue } }
    }
    public override var phoneNumbers: [CNLabeledValue<CNPhoneNumber>] {
        get { read { $0.phoneNumbers } }
        set { write { $0.phoneNumbers = newValue } }
    }
    public override var emailAddresses: [CNLabeledValue<NSString>] {
        get { read { $0.emailAddresses } }
        set { write { $0.emailAddresses = newValue } }
    }
    public override var postalAddresses: [CNLabeledValue<CNPostalAddress>] {
        get { read { $0.postalAddresses } }
        set { write { $0.postalAddresses = newValue } }
    }
    public override var urlAddresses: [CNLabeledValue<NSString>] {
        get { read { $0.urlAddresses } }
        set { write { $0.urlAddresses = newValue } }
    }
    public override var birthday: DateComponents? {
        get { read { $0.birthday } }
        set { write { $0.birthday = newValue } }
    }
    public override var note: String {
        get { read { $0.note } }
        set { write { $0.note = newValue } }
    }
    public override var imageData: Data? {
        get { read { $0.imageData } }
        set { write { $0.imageData = newValue } }
    }
    public override var vCardProperties: [String] {
        get { read { $0.vCardProperties } }
        set { write { $0.vCardProperties = newValue } }
    }
}

extension CNContact {
    /// A new mutable contact with the same properties (Trellis only: `mutableCopy() as!
    /// CNMutableContact` without the cast).
    public func mutableContact() -> CNMutableContact { CNMutableContact(copying: self) }
}
