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
    /// - Returns: the imported UIDs and the cards skipped, each with its line. A card the store
    ///   refuses (above the size limit, say) is skipped and reported like an unreadable one; the
    ///   others are imported.
    /// - Throws: ``StoreError`` when the store cannot be written at all.
    public static func importVCards(
        _ text: String, into store: DocumentStore, collection: String = "contacts"
    ) throws(StoreError) -> (imported: [String], errors: [VCardError]) {
        let parsed = VCard.parse(text)
        let cards = parsed.0
        var errors = parsed.1
        let documents = cards.map { ContactDocument.value(for: $0.contact, identifier: ContactItem.Identifier($0.uid)) }
        guard !documents.isEmpty else { return ([], errors) }
        do {
            try store.upsert(documents, in: collection)  // one transaction in the usual case
            return (cards.map(\.uid), errors)
        } catch {
            // Some card is refused: write them one by one and report the refused ones.
            var imported: [String] = []
            for (card, document) in zip(cards, documents) {
                do {
                    try store.upsert(document, in: collection)
                    imported.append(card.uid)
                } catch let error {
                    if case .sqlite = error { throw error }
                    errors.append(VCardError(line: card.line, message: "\(error)"))
                }
            }
            return (imported, errors.sorted { $0.line < $1.line })
        }
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
