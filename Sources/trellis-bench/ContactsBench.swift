// Contacts figures for trellis-bench (docs/BENCHMARKS.md, "Contacts"), each with a baseline
// measured in the same run:
//   1. a full content enumeration of 100,000 contacts in pages of 500, against a raw SQLite scan
//      of the same rows (reading each row's JSON text); the same enumeration with each contact's
//      given name read, and with every property read (contacts are read when first asked for);
//      and, to show where the difference goes, the same scan parsing each row's JSON into a `Value`;
//   2. a change enumeration of 1,000 changes on a 100,000-contact store, against the same on a
//      1,000-contact store.
import CSQLite
import ContactProvider
import Foundation
import Synchronization
import TrellisContacts
import TrellisCore
import TrellisStore

/// Counts what an enumeration delivers.
final class CountingObserver: ContactItemContentObserver, ContactItemChangeObserver {
    struct State {
        var items = 0
        /// Kept so the reads are not optimised away.
        var read = 0
        var nextPage: ContactItemPage?
        var marker: Data?
        var anchor: ContactItemSyncAnchor?
        var moreComing = false
        var error: (any Error)?
    }
    let state = Mutex(State())
    let suggestedPageSize: Int
    var suggestedBatchSize: Int { suggestedPageSize }
    /// What the observer reads of each contact it is given.
    let reading: ContactReading

    init(size: Int, reading: ContactReading = .nothing) {
        suggestedPageSize = size
        self.reading = reading
    }

    func didEnumerate(_ items: [ContactItem]) {
        var read = 0
        switch reading {
        case .nothing: break
        case .name: for item in items { read &+= item.contact.givenName.utf8.count }
        // All properties at once, as the vdir mirror reads a contact to write its vCard.
        case .everything: for item in items { read &+= item.contact.fields.phoneNumbers.count }
        }
        state.withLock {
            $0.items += items.count
            $0.read &+= read
        }
    }
    func didFinishEnumeratingPage(upTo nextPage: ContactItemPage) { state.withLock { $0.nextPage = nextPage } }
    func didFinishEnumeratingContent(upTo generationMarker: Data) { state.withLock { $0.marker = generationMarker } }
    func didFinishEnumeratingContentWithError(_ error: any Error) { state.withLock { $0.error = error } }
    func didUpdate(_ items: [ContactItem]) { state.withLock { $0.items += items.count } }
    func didDelete(_ identifiers: [ContactItem.Identifier]) { state.withLock { $0.items += identifiers.count } }
    func didFinishEnumeratingChanges(upTo syncAnchor: ContactItemSyncAnchor, moreComing: Bool) {
        state.withLock {
            $0.anchor = syncAnchor
            $0.moreComing = moreComing
        }
    }
    func didFinishEnumeratingChangesWithError(_ error: any Error) { state.withLock { $0.error = error } }
}

/// What a content enumeration's observer reads of each contact: nothing (the enumeration alone),
/// its given name, or every property (what a host mirroring the contacts does).
enum ContactReading {
    case nothing, name, everything
}

/// Runs an async body to completion from synchronous code.
func blocking<T: Sendable>(_ body: @escaping @Sendable () async -> T) -> T {
    let done = DispatchSemaphore(value: 0)
    let result = Mutex<T?>(nil)
    Task {
        let value = await body()
        result.withLock { $0 = value }
        done.signal()
    }
    done.wait()
    return result.withLock { $0! }
}

/// A store at `file` with `count` contacts in the `contacts` collection.
func contactsStore(_ file: String, count: Int) throws -> DocumentStore {
    let store = try DocumentStore(path: file)
    var batch: [Value] = []
    for n in 0..<count {
        batch.append(
            .map([
                "_id": .string(String(format: "contact-%08d", n)), "givenName": .string("Given\(n % 997)"),
                "familyName": .string("Family\(n % 1009)"), "organizationName": .string("Org \(n % 101)"),
                "phoneNumbers": .array([
                    .map(["label": .string(CNLabelPhoneNumberMobile), "value": .string("+47 \(n)")])
                ]),
                "emailAddresses": .array([.map(["label": .string(CNLabelWork), "value": .string("c\(n)@example.org")])]
                ),
            ]))
        if batch.count == 10_000 || n == count - 1 {
            try store.upsert(batch, in: "contacts")
            batch = []
        }
    }
    try store.checkpointWAL()
    return store
}

/// Pages through the whole content; returns (items, marker).
func enumerateAllContent(_ store: DocumentStore, pageSize: Int, reading: ContactReading = .nothing) -> (Int, Data) {
    let enumerator = ContactsEnumerator(store: store, collection: "contacts")
    var page = ContactItemPage.initialPage
    var items = 0
    while true {
        let observer = CountingObserver(size: pageSize, reading: reading)
        let p = page
        blocking { await enumerator.enumerateContent(in: p, for: observer) }
        let s = observer.state.withLock { $0 }
        precondition(s.error == nil, "content enumeration failed: \(s.error!)")
        items += s.items
        guard let next = s.nextPage else { return (items, s.marker ?? Data()) }
        page = next
    }
}

/// Applies `changes` updates, then times the change enumeration from `marker`; returns seconds.
func timeChanges(_ store: DocumentStore, marker: Data, changes: Int, count: Int) throws -> Double {
    var updates: [Value] = []
    for k in 0..<changes {
        let n = (k * 7919) % count
        updates.append(.map(["_id": .string(String(format: "contact-%08d", n)), "jobTitle": .string("Title \(k)")]))
    }
    try store.upsert(updates, in: "contacts")
    let enumerator = ContactsEnumerator(store: store, collection: "contacts")
    var anchor = ContactItemSyncAnchor(generationMarker: marker, offset: 0)
    var delivered = 0
    let t = seconds {
        while true {
            let observer = CountingObserver(size: 500)
            let a = anchor
            blocking { await enumerator.enumerateChanges(startingAt: a, for: observer) }
            let s = observer.state.withLock { $0 }
            precondition(s.error == nil, "change enumeration failed: \(s.error!)")
            delivered += s.items
            anchor = s.anchor!
            if !s.moreComing { break }
        }
    }
    precondition(delivered == Set(updates.map { $0["_id"]! }).count, "changes delivered: \(delivered)")
    return t
}

func contactsFigures(scratch: URL) throws -> [Figure] {
    let big = 100_000
    let file = scratch.appendingPathComponent("contacts.sqlite").path
    let store = try contactsStore(file, count: big)

    // Baseline: a raw scan of the same rows, as an application reading the table would: the
    // stored row key (`k`, whose end is the `_id` key) and the JSON, in `seq` order.
    var db: OpaquePointer?
    sqlite3_open_v2(file, &db, rawOpenFlags, nil)
    var stmt: OpaquePointer?
    sqlite3_prepare_v2(
        db, "SELECT k, value FROM documents WHERE collection = 'contacts' AND deleted = 0 ORDER BY seq", -1, &stmt, nil
    )
    var scanned = 0
    var bytes = 0
    var parsed = 0
    var marker = Data()
    func rawScan() {
        scanned = 0
        while sqlite3_step(stmt) == SQLITE_ROW {
            _ = sqlite3_column_text(stmt, 0)
            _ = sqlite3_column_text(stmt, 1)
            bytes &+= Int(sqlite3_column_bytes(stmt, 1))
            scanned += 1
        }
        sqlite3_reset(stmt)
    }
    // Where the difference goes: the same scan, parsing each row's JSON into a `Value`.
    func parsingScan() throws {
        parsed = 0
        while sqlite3_step(stmt) == SQLITE_ROW {
            let text = UnsafeRawBufferPointer(
                start: sqlite3_column_text(stmt, 1), count: Int(sqlite3_column_bytes(stmt, 1)))
            if case .map = try JSON.parse(text) { parsed += 1 }
        }
        sqlite3_reset(stmt)
    }
    func enumeration(_ reading: ContactReading) -> () -> Void {
        {
            let (items, m) = enumerateAllContent(store, pageSize: 500, reading: reading)
            precondition(items == big, "enumerated \(items)")
            marker = m
        }
    }
    // The five take turns, seven rounds each; each rate is from its median round (as `--find`).
    let rates = try interleavedRates(
        rounds: 7, [rawScan, enumeration(.nothing), enumeration(.name), enumeration(.everything), parsingScan]
    ).map { $0 * Double(big) }
    precondition(scanned == big && parsed == big, "scanned \(scanned), parsed \(parsed)")
    sqlite3_finalize(stmt)
    sqlite3_close(db)
    let (rawRate, enumRate, nameRate, wholeRate, parseRate) = (rates[0], rates[1], rates[2], rates[3], rates[4])

    // Change enumeration: 1,000 changes on the big store against 1,000 on a small one.
    let small = try contactsStore(scratch.appendingPathComponent("contacts-small.sqlite").path, count: 1_000)
    let (_, smallMarker) = enumerateAllContent(small, pageSize: 500)
    var smallTimes: [Double] = []
    var bigTimes: [Double] = []
    var smallMark = smallMarker
    var bigMark = marker
    for _ in 0..<5 {
        smallTimes.append(try timeChanges(small, marker: smallMark, changes: 1_000, count: 1_000))
        bigTimes.append(try timeChanges(store, marker: bigMark, changes: 1_000, count: big))
        // The next round starts after these changes.
        smallMark = GenerationMarker(epoch: small.epoch, snapshot: small.lastSeq, collection: "contacts").data
        bigMark = GenerationMarker(epoch: store.epoch, snapshot: store.lastSeq, collection: "contacts").data
    }
    let smallRate = 1_000 / smallTimes.min()!
    let bigRate = 1_000 / bigTimes.min()!
    let againstRawScan = [
        ("sqlite_scan_json_parse_per_s", parseRate, "rows/s"), ("contacts_content_enum_per_s", enumRate, "items/s"),
        ("contacts_content_enum_name_read_per_s", nameRate, "items/s"),
        ("contacts_content_enum_all_read_per_s", wholeRate, "items/s"),
    ].map { name, value, unit in
        Figure(
            name: name, value: value, unit: unit, baseline: rawRate, baselineName: "sqlite_raw_contact_scan_per_s")
    }
    return [Figure(name: "sqlite_raw_contact_scan_per_s", value: rawRate, unit: "rows/s")] + againstRawScan + [
        Figure(name: "contacts_changes_1k_store_per_s", value: smallRate, unit: "changes/s"),
        Figure(
            name: "contacts_changes_100k_store_per_s", value: bigRate, unit: "changes/s", baseline: smallRate,
            baselineName: "contacts_changes_1k_store_per_s"),
    ]
}
