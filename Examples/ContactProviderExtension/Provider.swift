// A contact provider extension written as Apple's ContactProvider template and documentation
// write one, for iOS 18. Ported to Trellis by one change: `import Contacts` became
// `import TrellisContacts`. See README.md beside this file.

import ContactProvider
import TrellisContacts

class RootContainerEnumerator: ContactItemEnumerator {
    struct Person {
        let identifier: String
        let givenName: String
        let familyName: String
        let phone: String
        let email: String
    }

    // The app's own contacts. A real extension reads them from its app group's database.
    let people = [
        Person(
            identifier: "1", givenName: "Ada", familyName: "Lovelace", phone: "+44 20 7946 0001",
            email: "ada@example.com"),
        Person(
            identifier: "2", givenName: "Alan", familyName: "Turing", phone: "+44 20 7946 0002",
            email: "alan@example.com"),
        Person(
            identifier: "3", givenName: "Grace", familyName: "Hopper", phone: "+1 202 555 0103",
            email: "grace@example.com"),
        Person(
            identifier: "4", givenName: "Edsger", familyName: "Dijkstra", phone: "+31 20 555 0104",
            email: "edsger@example.com"),
    ]

    let generationMarker = "generation-1".data(using: .utf8)!

    func enumerateContent(in page: ContactItemPage, for observer: ContactItemContentObserver) async {
        let start = page.offset
        let end = min(start + observer.suggestedPageSize, people.count)
        var items: [ContactItem] = []
        for person in people[start..<end] {
            let contact = CNMutableContact()
            contact.givenName = person.givenName
            contact.familyName = person.familyName
            contact.phoneNumbers = [
                CNLabeledValue(label: CNLabelPhoneNumberMobile, value: CNPhoneNumber(stringValue: person.phone))
            ]
            contact.emailAddresses = [CNLabeledValue(label: CNLabelHome, value: person.email as NSString)]
            items.append(.contact(contact, ContactItem.Identifier(person.identifier)))
        }
        observer.didEnumerate(items)
        if end < people.count {
            observer.didFinishEnumeratingPage(upTo: ContactItemPage(generationMarker: generationMarker, offset: end))
        } else {
            observer.didFinishEnumeratingContent(upTo: generationMarker)
        }
    }

    func enumerateChanges(startingAt syncAnchor: ContactItemSyncAnchor, for observer: ContactItemChangeObserver) async {
        // The sample's contacts never change.
        observer.didFinishEnumeratingChanges(upTo: syncAnchor, moreComing: false)
    }

    func invalidate() async {
        // Stop any enumeration in progress.
    }
}

@main
class Provider: ContactProviderExtension {
    required init() {
        // Set up the extension.
    }

    func configure(for domain: ContactProviderDomain) {
        // Configure the extension for the domain before any enumeration.
    }

    func enumerator(for collection: ContactItem.Identifier) -> ContactItemEnumerator {
        return RootContainerEnumerator()
    }

    func invalidate() async throws {
        // Stop the extension's work; the system is about to end it.
    }
}
