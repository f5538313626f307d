import ContactProvider
import Foundation
import TrellisCore
public import TrellisStore

/// Reading vCards into a contacts collection and writing them out.
public enum ContactImport {
    /// Upserts every readable card of `text` into `collection`, one document per card with the
    /// card's UID as `_id` (a card without UID gets a new UUID), in one transaction.
    ///
    /// Fields a card gives replace the document's; fields it lacks are kept (Trellis upserts merge).
    /// - Returns: the imported UIDs and the cards skipped, each with its line.
    /// - Throws: ``StoreError`` when the write fails (nothing is imported then).
    public static func importVCards(
        _ text: String, into store: DocumentStore, collection: String = "contacts"
    ) throws(StoreError) -> (imported: [String], errors: [VCardError]) {
        let (cards, errors) = VCard.parse(text)
        let documents = cards.map { ContactDocument.value(for: $0.contact, identifier: ContactItem.Identifier($0.uid)) }
        if !documents.isEmpty { try store.upsert(documents, in: collection) }
        return (cards.map(\.uid), errors)
    }

    /// The vCard 4.0 text of every live contact of `collection`, ordered by `_id`.
    public static func exportVCards(from store: DocumentStore, collection: String = "contacts") throws(StoreError)
        -> String
    {
        try store.documents(in: collection).compactMap { doc -> String? in
            guard let id = doc["_id"] else { return nil }
            let identifier = ContactDocument.identifier(for: id)
            return VCard.serialize(ContactDocument.contact(from: doc), uid: identifier.value)
        }.joined()
    }
}
