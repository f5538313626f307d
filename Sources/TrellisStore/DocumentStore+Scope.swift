internal import CSQLite
import Foundation
public import TrellisCore

// Scope tracking: which documents a query subscription may hold although they no longer match it.
//
// A subscriber to `status == 'open'` holds X; X is closed (or removed). Matching alone would never
// send X's new state again, and the subscriber would keep showing a stale X as open (F20), or keep
// a document that was removed (F09). So the store remembers, per subscription it serves to peers,
// the documents that left its scope: at every commit of a document (local write, merge, retry), for
// each served query subscription of its collection, a document whose previous value matched and
// whose new value does not (a removal included) is recorded in `scopes`; one that matches again is
// taken out. A change-log page for that subscription returns the matching documents *and* the
// recorded ones — so a tombstone reaches exactly the query subscribers that may hold the document,
// and nobody else learns that the removed document existed. A whole-collection subscription matches
// every document, so it gets every tombstone and needs no record. And a peer holds what it sent:
// a document merged from a peer is recorded in the scope of that peer's query subscriptions too,
// so a change made elsewhere to a document it wrote outside its own query reaches it as well.
// A peer served no query subscription in the collection when it sent documents (it writes there
// before it subscribes, or subscribes to the whole collection, or only writes) has none to record
// them under: the store notes only that it sent some, and after which `seq` of its log (the table
// `unrecorded`, one row per peer and collection, nothing per document). When query subscriptions
// of the peer's are served there and no whole-collection one, the node asks it for the collection
// again from that point (`servedQueries`), so what it sent comes again and is recorded then. A
// row per document instead would cost a one-way replication a third of its speed. And the store
// remembers which query subscriptions of each peer's hold its records (`held_through`): when the
// peer is served others instead (on this connection or a later one), what those recorded is
// copied to the new ones.
//
// A peer this node served a whole collection holds what it was sent, every document of it, and
// records nothing of it: no query subscription was served. When the peer later asks only query
// subscriptions there (its app narrowed, a neighbour whose whole-collection subscription it
// relayed went away, or its subscriptions stopped collapsing into the whole collection), the
// documents outside its queries must still reach it when they change. Recording each of them
// would cost a row per document and peer, and scope records are shared by every subscriber of
// a query. Instead each row knows when the document was born in this log (`age`: its `seq` less
// the first `seq` it had), and the store remembers per peer and collection how far it served
// the whole collection (`whole_held`): up to which `seq` the peer may hold documents (every page
// read for it) and after which `seq` their states may have moved on there (the peer's
// acknowledged position). Every query subscription of the peer's in that collection, while no
// whole-collection one is served, then also sends the documents born up to the first whose `seq`
// is after the second: all the peer may hold an older state of. One row per peer and
// collection, and nothing per document.

/// A peer and a collection (the `unrecorded` and `held_through` tables, ``DocumentStore/servedQueries(peer:subscriptions:askAgain:)``).
struct PeerCollection: Hashable, Sendable {
    var peer: [UInt8]
    var collection: UTF8Key
}

/// How far this node served a peer a whole collection (a `whole_held` row): the peer may hold
/// every document born in this log up to `bornUpTo`, with a state older than this node's for
/// those whose `seq` is after `changedAfter`.
public struct WholeHeld: Equatable, Sendable {
    /// The highest `seq` read for the peer's whole-collection subscription: documents born after
    /// it never went to the peer that way.
    public var bornUpTo: Int64
    /// Where the peer stands: the position it last acknowledged in its whole-collection
    /// subscription, or later in a query subscription that carried the changes to these documents
    /// from no later than the position before. Every document whose `seq` is at most this went
    /// to it in the state this node holds.
    public var changedAfter: Int64

    public init(bornUpTo: Int64, changedAfter: Int64) {
        self.bornUpTo = bornUpTo
        self.changedAfter = changedAfter
    }
}

/// The `whole_held` records by collection, then peer: a commit looks at its collection's only.
struct WholeHeldRecords: Sendable {
    private var byCollection: [UTF8Key: [[UInt8]: WholeHeld]] = [:]

    var isEmpty: Bool { byCollection.isEmpty }

    subscript(entry: PeerCollection) -> WholeHeld? {
        get { byCollection[entry.collection]?[entry.peer] }
        set { byCollection[entry.collection, default: [:]][entry.peer] = newValue }
    }

    /// The records of one collection, by peer.
    func records(in collection: UTF8Key) -> [[UInt8]: WholeHeld] { byCollection[collection] ?? [:] }
}

/// A query subscription this store serves (to any peer), kept to record documents leaving its
/// scope.
struct ServedScope: Sendable {
    /// ``SubscriptionSpec/scopeHash`` of the subscription: its name in the `scopes` and `served` tables.
    var hash: Int64
    /// The query with its arguments bound.
    var query: Query

    /// For a query that is exactly `path == scalar` (or `scalar == path`): the path and the
    /// bucket of the scalar (``equalityBucket(_:)``), so that a commit evaluates only the scopes
    /// whose scalar a document's field can equal.
    var equality: (path: FieldPath, bucket: EqualityBucket)? {
        guard case .compare(let left, .equal, let right) = query.predicate else { return nil }
        switch (left, right) {
        case (.field(let path), .literal(let value)), (.literal(let value), .field(let path)):
            return Self.equalityBucket(value).map { (path, $0) }
        default: return nil
        }
    }

    /// A key two scalars share whenever they are equal in a query (numbers by numeric value,
    /// `-0.0` as `0.0`; strings, which compare byte-wise, by their text: a superset), or `nil` for
    /// values that are not scalars.
    static func equalityBucket(_ value: Value) -> EqualityBucket? {
        switch value {
        case .null: return .null
        case .bool(let b): return .bool(b)
        case .int(let i): return .number(Double(i) + 0.0)
        case .double(let d): return .number(d + 0.0)
        case .string(let s): return .string(s)
        case .bytes, .array, .map: return nil
        }
    }

    /// See ``equalityBucket(_:)``.
    enum EqualityBucket: Hashable, Sendable {
        case null
        case bool(Bool)
        case number(Double)
        case string(String)
    }
}

extension DocumentStore.State {
    /// The index of a collection's served scopes (`scopes`, its ``servedScopes`` entry), cached
    /// until they change.
    mutating func servedScopeIndex(_ collection: UTF8Key, _ scopes: [ServedScope]) -> ServedScopeIndex {
        if let index = servedScopeIndexes[collection] { return index }
        let index = ServedScopeIndex(scopes)
        servedScopeIndexes[collection] = index
        return index
    }
}

/// The served query subscriptions of one collection, with those of the form `path == scalar`
/// indexed by path and scalar, so that a commit evaluates the few a document can match.
struct ServedScopeIndex: Sendable {
    /// Subscriptions evaluated for every document.
    var general: [ServedScope] = []
    /// `path == scalar` subscriptions: by path, then by ``ServedScope/equalityBucket(_:)``.
    var equalities: [FieldPath: [ServedScope.EqualityBucket: [ServedScope]]] = [:]
    /// Every subscription, by hash.
    var byHash: [Int64: ServedScope] = [:]

    /// Every subscription's hash (the keys of ``byHash``, kept: every commit reads them).
    let hashes: Set<Int64>

    init(_ scopes: [ServedScope]) {
        for scope in scopes {
            byHash[scope.hash] = scope
            if let (path, bucket) = scope.equality {
                equalities[path, default: [:]][bucket, default: []].append(scope)
            } else {
                general.append(scope)
            }
        }
        hashes = Set(byHash.keys)
    }

    /// The subscriptions a document could match: every general one, and the equality ones whose
    /// scalar its field at their path can equal.
    func candidates(for document: Value?) -> [ServedScope] {
        guard let document else { return general }
        var found = general
        for (path, buckets) in equalities {
            guard let field = document.value(at: path), let bucket = ServedScope.equalityBucket(field),
                let scopes = buckets[bucket]
            else { continue }
            found += scopes
        }
        return found
    }
}

extension DocumentStore {
    /// Served query subscriptions remembered at most; beyond it the least recently used are
    /// forgotten with their records.
    static let maxServedScopes = 4096

    static let scopeSchema = """
        CREATE TABLE IF NOT EXISTS served(
            sub INTEGER PRIMARY KEY,
            collection TEXT NOT NULL,
            query TEXT NOT NULL,
            args TEXT NOT NULL,
            used INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS scopes(
            collection TEXT NOT NULL,
            id TEXT NOT NULL,
            sub INTEGER NOT NULL,
            PRIMARY KEY(collection, id, sub)
        ) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS unrecorded(
            peer BLOB NOT NULL,
            collection TEXT NOT NULL,
            since INTEGER NOT NULL,
            PRIMARY KEY(peer, collection)
        ) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS held_through(
            peer BLOB NOT NULL,
            collection TEXT NOT NULL,
            sub INTEGER NOT NULL,
            PRIMARY KEY(peer, collection, sub)
        ) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS whole_held(
            peer BLOB NOT NULL,
            collection TEXT NOT NULL,
            born_upto INTEGER NOT NULL,
            changed_after INTEGER NOT NULL,
            PRIMARY KEY(peer, collection)
        ) WITHOUT ROWID;
        """

    /// How far this node served each peer whole collections (``State/wholeHeld``).
    static func loadWholeHeld(_ db: Connection) throws -> WholeHeldRecords {
        var out = WholeHeldRecords()
        guard try hasTable(db, "whole_held") else { return out }
        let st = try db.prepare("SELECT peer, collection, born_upto, changed_after FROM whole_held")
        defer { st.reset() }
        while try st.step() {
            out[PeerCollection(peer: st.bytes(0) ?? [], collection: UTF8Key(st.string(1) ?? ""))] = WholeHeld(
                bornUpTo: st.int64(2), changedAfter: st.int64(3))
        }
        return out
    }

    /// How far this node served `peer` the whole of `collection` (``WholeHeld``), if it ever did.
    public func wholeHeld(by peer: [UInt8], in collection: String) -> WholeHeld? {
        state.withLock { $0.wholeHeld[PeerCollection(peer: peer, collection: UTF8Key(collection))] }
    }

    /// Records that `page` of `collection`, read from `after`, goes to `reader` for a
    /// whole-collection subscription: the peer may hold what was born up to the page's end, and
    /// holds the current state of what did not change after its acknowledged position. Only once
    /// the peer may hold something of it: a peer asking from 0 is recorded once a page sends it a
    /// document, so a subscription to a collection that holds nothing here leaves no record. One
    /// indexed write when either moves; nothing otherwise.
    func noteWholeServed(_ s: inout State, _ collection: String, page: ChangePage, after: Int64, for reader: PageReader)
        throws
    {
        guard !options.readOnly else { return }
        let entry = PeerCollection(peer: reader.peer, collection: UTF8Key(collection))
        let old = s.wholeHeld[entry]
        guard old != nil || after > 0 || !page.records.isEmpty else { return }
        let upTo = page.scannedUpTo
        // A page read from the acknowledged position (the first of a session, or after the peer
        // asked again from an earlier point, its store lost, say) sets where the peer stands, even
        // lower than before. Any other was asked for before later acknowledgements were recorded
        // (``heldAcknowledged(peer:collection:upTo:carriedFrom:)``), and moves it only on.
        let acknowledged = reader.acknowledgedUpTo
        let note = WholeHeld(
            bornUpTo: max(old?.bornUpTo ?? 0, after, upTo),
            changedAfter: after == acknowledged ? acknowledged : max(old?.changedAfter ?? acknowledged, acknowledged))
        guard note != old else { return }
        try saveWholeHeld(&s, entry, note)
    }

    /// Records where what `peer` holds of `collection` from a whole-collection service here
    /// stands, after it acknowledged `upTo`: of its whole-collection subscription (`carriedFrom`
    /// `nil`: the peer holds the current state of every document whose `seq` is at most `upTo`),
    /// or of a query subscription whose every batch from `carriedFrom` on carried the changes to
    /// what it holds (the same follows when `carriedFrom` is not after ``WholeHeld/changedAfter``:
    /// batches covered what came after it; otherwise nothing changes). One indexed write when it
    /// moves; nothing when this node never read the collection for that peer.
    ///
    /// - Throws: ``StoreError`` for SQLite errors; nothing changes then.
    public func heldAcknowledged(peer: [UInt8], collection: String, upTo: Int64, carriedFrom: Int64?)
        throws(StoreError)
    {
        let entry = PeerCollection(peer: peer, collection: UTF8Key(collection))
        func moved(_ held: WholeHeld) -> WholeHeld? {
            if let carriedFrom {
                guard carriedFrom <= held.changedAfter, upTo > held.changedAfter else { return nil }
            } else {
                guard upTo != held.changedAfter else { return nil }
            }
            return WholeHeld(
                bornUpTo: carriedFrom == nil ? max(held.bornUpTo, upTo) : held.bornUpTo, changedAfter: upTo)
        }
        guard !options.readOnly, let held = wholeHeld(by: peer, in: collection), moved(held) != nil else { return }
        try write { s in
            guard let held = s.wholeHeld[entry], let note = moved(held) else { return }
            try saveWholeHeld(&s, entry, note)
        }
    }

    private func saveWholeHeld(_ s: inout State, _ entry: PeerCollection, _ note: WholeHeld) throws {
        let st = try s.db.prepare(
            "INSERT OR REPLACE INTO whole_held(peer, collection, born_upto, changed_after) VALUES (?, ?, ?, ?)")
        st.bind(1, entry.peer)
        st.bind(2, entry.collection.string)
        st.bind(3, note.bornUpTo)
        st.bind(4, note.changedAfter)
        try st.run()
        s.wholeHeld[entry] = note
    }

    /// The SQL term that is 1 when the current row may be held by the peer of `held` in an older
    /// state (born up to ``WholeHeld/bornUpTo``, changed after ``WholeHeld/changedAfter``). Both
    /// are integer literals, never text.
    static func heldFromWholeSQL(_ held: WholeHeld) -> String {
        "(seq > \(held.changedAfter) AND (age IS NULL OR seq - age <= \(held.bornUpTo)))"
    }

    /// The notes of documents peers hold that no scope records, with the `seq` of the peer's log
    /// they begin after (``State/unrecorded``).
    static func loadUnrecorded(_ db: Connection) throws -> [PeerCollection: Int64] {
        guard try hasTable(db, "unrecorded") else { return [:] }
        let st = try db.prepare("SELECT peer, collection, since FROM unrecorded")
        defer { st.reset() }
        var out: [PeerCollection: Int64] = [:]
        while try st.step() {
            out[PeerCollection(peer: st.bytes(0) ?? [], collection: UTF8Key(st.string(1) ?? ""))] = st.int64(2)
        }
        return out
    }

    /// The query subscriptions, per peer and collection, whose scopes record what the peer holds
    /// (``State/heldThrough``).
    static func loadHeldThrough(_ db: Connection) throws -> [PeerCollection: Set<Int64>] {
        guard try hasTable(db, "held_through") else { return [:] }
        let st = try db.prepare("SELECT peer, collection, sub FROM held_through")
        defer { st.reset() }
        var out: [PeerCollection: Set<Int64>] = [:]
        while try st.step() {
            out[PeerCollection(peer: st.bytes(0) ?? [], collection: UTF8Key(st.string(1) ?? "")), default: []]
                .insert(st.int64(2))
        }
        return out
    }

    /// Notes that `peer` holds documents of `collection` that no scope records, sent after `seq`
    /// `since` of its log (an earlier note keeps the lower `since`). One indexed write when the
    /// note is new or moves back; nothing otherwise.
    func noteUnrecorded(_ s: inout State, _ peer: [UInt8], _ collection: String, since: Int64) throws {
        let entry = PeerCollection(peer: peer, collection: UTF8Key(collection))
        if let noted = s.unrecorded[entry], noted <= since { return }
        let st = try s.db.prepare("INSERT OR REPLACE INTO unrecorded(peer, collection, since) VALUES (?, ?, ?)")
        st.bind(1, peer)
        st.bind(2, collection)
        st.bind(3, since)
        try st.run()
        s.unrecorded[entry] = since
    }

    /// `peer` is served the query subscriptions `subscriptions` (of one collection) on a new
    /// connection, or its set of them there changed. Keeps what it holds recorded in their
    /// scopes, in one transaction: what the scopes of the query subscriptions it was served there
    /// before hold (the `held_through` table, kept across restarts and connections) is recorded
    /// in theirs, and theirs are remembered in its place. With `askAgain` (the caller serves the
    /// peer no whole-collection subscription there and asks it for something there), and when
    /// the peer sent documents while no query subscription of its was served (``noteUnrecorded``),
    /// that note goes, and this node's checkpoints on the peer's log for the collection go back to
    /// where it began: the returned `seq`, from which the node asks the peer for the collection
    /// again, so what it sent since comes again and is recorded in these scopes (a stop before
    /// that answer resumes from there as well).
    ///
    /// - Returns: the `seq` of the peer's log to ask from, or `nil` when nothing needs asking.
    /// - Throws: ``StoreError`` for SQLite errors; nothing changes then.
    /// - Complexity: O(s) in memory when the set is the one remembered and nothing is noted; else
    ///   O(r log n) for the r scope records and checkpoints of the collection.
    public func servedQueries(peer: [UInt8], subscriptions: [SubscriptionSpec], askAgain: Bool)
        throws(StoreError) -> Int64?
    {
        let queries = subscriptions.filter { !$0.isWholeCollection }
        guard !options.readOnly, let collection = queries.first?.collection else { return nil }
        let entry = PeerCollection(peer: peer, collection: UTF8Key(collection))
        let current = Set(queries.map(\.scopeHash))
        let unchanged = try withState { s in
            s.heldThrough[entry] == current && (!askAgain || s.unrecorded[entry] == nil)
        }
        if unchanged { return nil }
        return try write { s -> Int64? in
            if s.heldThrough[entry] != current {
                // What it held through subscriptions it is no longer served, it still holds.
                let dropped = (s.heldThrough[entry] ?? []).subtracting(current)
                try copyScopes(&s, from: dropped.sorted().map { (collection, $0) }, to: queries)
                let forget = try s.db.prepare("DELETE FROM held_through WHERE peer = ? AND collection = ?")
                forget.bind(1, peer)
                forget.bind(2, collection)
                try forget.run()
                let remember = try s.db.prepare("INSERT INTO held_through(peer, collection, sub) VALUES (?, ?, ?)")
                for hash in current.sorted() {
                    remember.reset()
                    remember.bind(1, peer)
                    remember.bind(2, collection)
                    remember.bind(3, hash)
                    try remember.run()
                }
                s.heldThrough[entry] = current
            }
            guard askAgain, let since = s.unrecorded[entry] else { return nil }
            let forget = try s.db.prepare("DELETE FROM unrecorded WHERE peer = ? AND collection = ?")
            forget.bind(1, peer)
            forget.bind(2, collection)
            try forget.run()
            let rewind = try s.db.prepare(
                "UPDATE checkpoints SET seq = min(seq, ?) WHERE peer = ? AND collection = ?")
            rewind.bind(1, since)
            rewind.bind(2, peer)
            rewind.bind(3, collection)
            try rewind.run()
            s.unrecorded[entry] = nil
            return since
        }
    }

    private func copyScopes(_ s: inout State, from: [(collection: String, hash: Int64)], to: [SubscriptionSpec]) throws
    {
        let copy = try s.db.prepare(
            "INSERT OR IGNORE INTO scopes(collection, id, sub) "
                + "SELECT collection, id, ? FROM scopes WHERE collection = ? AND sub = ?")
        for source in from {
            for target in to
            where UTF8Key.equal(source.collection, target.collection) && target.scopeHash != source.hash {
                copy.reset()
                copy.bind(1, target.scopeHash)
                copy.bind(2, source.collection)
                copy.bind(3, source.hash)
                try copy.run()
            }
        }
    }

    /// The served query subscriptions recorded in the store, by collection.
    static func loadServedScopes(_ db: Connection) throws -> [UTF8Key: [ServedScope]] {
        guard try hasTable(db, "served") else { return [:] }
        let st = try db.prepare("SELECT sub, collection, query, args FROM served ORDER BY sub")
        defer { st.reset() }
        var out: [UTF8Key: [ServedScope]] = [:]
        while try st.step() {
            guard let collection = st.string(1), let text = st.string(2),
                case .map(let args)? = try? JSON.parse(st.string(3) ?? "{}"),
                let query = try? Query(text).bind(args: args)
            else { continue }
            out[UTF8Key(collection), default: []].append(ServedScope(hash: st.int64(0), query: query))
        }
        return out
    }

    /// Remembers a query subscription served to a peer (from now on, documents leaving its scope
    /// are recorded). Whole-collection subscriptions need nothing.
    func registerServed(_ s: inout State, _ spec: SubscriptionSpec, bound: Query, now: UInt64) throws {
        guard !spec.isWholeCollection, !options.readOnly else { return }
        let hash = spec.scopeHash
        let collection = UTF8Key(spec.collection)
        if s.servedScopes[collection]?.contains(where: { $0.hash == hash }) == true {
            // Seen this hour already: nothing to write.
            if let used = s.servedUsed[hash], now &- used < 3_600_000 { return }
            let touch = try s.db.prepare("UPDATE served SET used = ? WHERE sub = ?")
            touch.bind(1, Int64(bitPattern: now))
            touch.bind(2, hash)
            try touch.run()
            s.servedUsed[hash] = now
            return
        }
        let insert = try s.db.prepare(
            "INSERT OR REPLACE INTO served(sub, collection, query, args, used) VALUES (?, ?, ?, ?, ?)")
        insert.bind(1, hash)
        insert.bind(2, spec.collection)
        insert.bind(3, spec.query)
        insert.bind(4, JSON.string(.map(spec.args)))
        insert.bind(5, Int64(bitPattern: now))
        try insert.run()
        s.servedScopes[collection, default: []].append(ServedScope(hash: hash, query: bound))
        s.servedUsed[hash] = now
        s.servedCount += 1
        if s.servedCount > Self.maxServedScopes { try forgetLeastUsedScope(&s) }
    }

    private func forgetLeastUsedScope(_ s: inout State) throws {
        let oldest = try s.db.prepare("SELECT sub FROM served ORDER BY used LIMIT 1")
        guard try oldest.step() else {
            oldest.reset()
            return
        }
        let hash = oldest.int64(0)
        oldest.reset()
        for sql in ["DELETE FROM served WHERE sub = ?", "DELETE FROM scopes WHERE sub = ?"] {
            let st = try s.db.prepare(sql)
            st.bind(1, hash)
            try st.run()
        }
        for (collection, scopes) in s.servedScopes {
            s.servedScopes[collection] = scopes.filter { $0.hash != hash }
        }
        s.servedUsed[hash] = nil
        s.servedCount -= 1
    }

    /// Records the documents leaving (or re-entering) the scope of the served query subscriptions
    /// of `collection` as a document goes from its current row to `new` (`nil`: removed). Runs
    /// inside the writing transaction, before the row is replaced.
    ///
    /// - Complexity: one indexed read of the current value and two query evaluations per served
    ///   query subscription of the collection; nothing when it has none.
    func trackScope(_ s: inout State, _ collection: String, _ key: String, new document: () throws -> Value?) throws {
        guard let scopes = s.servedScopes[UTF8Key(collection)], !scopes.isEmpty else { return }
        let new = try document()
        let current = try s.db.prepare(
            "SELECT value, deleted, seq - coalesce(age, seq) FROM documents WHERE k = trellis_key(?, ?)")
        current.bind(1, collection)
        current.bind(2, key)
        var old: Value?
        // The query subscriptions of peers that may hold this document from a whole-collection
        // service: the change goes to them whatever it matches.
        var holders: Set<Int64> = []
        if try current.step() {
            if !s.wholeHeld.isEmpty {
                let born = current.int64(2)
                let name = UTF8Key(collection)
                for (peer, held) in s.wholeHeld.records(in: name) where held.bornUpTo >= born {
                    holders.formUnion(s.heldThrough[PeerCollection(peer: peer, collection: name)] ?? [])
                }
            }
            // A stub's value is gone: what it matched is unknown, so nothing changes for it.
            guard current.int64(1) != RowKind.stub.rawValue else {
                current.reset()
                return
            }
            old = current.string(0).flatMap { try? JSON.parse($0) }
        }
        current.reset()
        // The subscriptions that hold this document whatever they match (recorded before).
        var recorded: Set<Int64> = []
        let held = try s.db.prepare("SELECT sub FROM scopes WHERE collection = ? AND id = ?")
        held.bind(1, collection)
        held.bind(2, key)
        while try held.step() { recorded.insert(held.int64(0)) }
        held.reset()
        var concerned = holders.intersection(scopes.lazy.map(\.hash))
        // Only the scopes the old or the new value could match, and those holding the document.
        let index = s.servedScopeIndex(UTF8Key(collection), scopes)
        var evaluate: [Int64: ServedScope] = [:]
        for scope in index.candidates(for: old) + index.candidates(for: new) { evaluate[scope.hash] = scope }
        for hash in recorded { if let scope = index.byHash[hash] { evaluate[hash] = scope } }
        for scope in evaluate.values.sorted(by: { $0.hash < $1.hash }) {
            let matchedBefore = old.map { (try? scope.query.matches($0)) ?? false } ?? false
            let matchesNow = new.map { (try? scope.query.matches($0)) ?? false } ?? false
            if matchedBefore || matchesNow || recorded.contains(scope.hash) { concerned.insert(scope.hash) }
            guard matchedBefore != matchesNow else { continue }
            let st = try s.db.prepare(
                matchedBefore
                    ? "INSERT OR IGNORE INTO scopes(collection, id, sub) VALUES (?, ?, ?)"
                    : "DELETE FROM scopes WHERE collection = ? AND id = ? AND sub = ?")
            st.bind(1, collection)
            st.bind(2, key)
            st.bind(3, scope.hash)
            try st.run()
        }
        // For the commit's event: this key is checked against these subscriptions.
        let name = UTF8Key(collection)
        let hashes = index.hashes
        if var entry = s.scopeChecked[name] {
            entry.keys.insert(UTF8Key(key))
            entry.check.checked.formIntersection(hashes)
            entry.check.concerned.formUnion(concerned)
            s.scopeChecked[name] = entry
        } else {
            s.scopeChecked[name] = ([UTF8Key(key)], ScopeCheck(checked: hashes, concerned: concerned))
        }
    }

    /// Records that the subscriber of `spec` holds a document (it sent it here), so that changes to
    /// it are sent to that subscriber whatever its query matches. A newly recorded document
    /// concerns `spec` in this commit's scope check: ``trackScope(_:_:_:new:)`` ran before it was
    /// recorded, and the merged state, if it is not the one the subscriber sent, must reach it.
    func recordHeld(_ s: inout State, _ collection: String, _ key: String, by spec: SubscriptionSpec) throws {
        let st = try s.db.prepare("INSERT OR IGNORE INTO scopes(collection, id, sub) VALUES (?, ?, ?)")
        st.bind(1, collection)
        st.bind(2, key)
        st.bind(3, spec.scopeHash)
        try st.run()
        guard s.db.changes > 0 else { return }
        s.scopeChecked[UTF8Key(collection)]?.check.concerned.insert(spec.scopeHash)
    }

    /// Records the tombstones and eviction stubs of `page`, a refetch's answer, in the scope of
    /// `base`, the subscription the refetch was derived from: its subscriber is about to hold
    /// them although its query matches no tombstone. Tracks `base` as served. Nothing for a
    /// whole-collection base (it gets every tombstone) or one whose query does not parse or bind.
    ///
    /// - Complexity: one indexed insert per tombstone or stub of the page.
    func recordRefetched(_ s: inout State, of page: ChangePage, base: SubscriptionSpec, now: UInt64) throws {
        guard !base.isWholeCollection, !options.readOnly,
            page.records.contains(where: { $0.isDeleted || $0.isEvictionStub }),
            let bound = try? Query(base.query).bind(args: base.args)
        else { return }
        try registerServed(&s, base, bound: bound, now: now)
        for record in page.records where record.isDeleted || record.isEvictionStub {
            try recordHeld(&s, record.collection, record.key, by: base)
        }
    }

    /// Records the eviction stubs of `page` (sent whole: each holds an unacknowledged write) in
    /// the scope of `holder`, whose subscriber is about to hold them. A stub's value is unknown
    /// to ``trackScope(_:_:_:new:)``, which records nothing when the next state replaces it, and
    /// the eviction recorded the document only under the subscriptions served then: without this,
    /// a subscription first served after the eviction would never get the document's next state.
    ///
    /// - Complexity: one indexed insert per stub of the page; nothing when it has none.
    func recordStubs(_ s: inout State, of page: ChangePage, heldBy holder: SubscriptionSpec) throws {
        guard !holder.isWholeCollection, !options.readOnly else { return }
        for record in page.records where record.isEvictionStub {
            try recordHeld(&s, record.collection, record.key, by: holder)
        }
    }

    /// Gives a document's row the next `seq`, unchanged otherwise, so that change-log pages after
    /// it return the row again. The commit's event lists the key as renumbered
    /// (``StoreEvent/renumberedKeys``) unless the commit also writes the row: its value did not
    /// change, and live queries pass over it.
    func relog(_ s: inout State, _ collection: String, _ key: String) throws {
        // `unacked` counts from the row's `seq` (DocumentStore.writeRowSQL): it moves on with it.
        let st = try s.db.prepare(
            "UPDATE documents SET seq = ?1, unacked = unacked + ?1 - seq, age = age + ?1 - seq "
                + "WHERE k = trellis_key(?2, ?3)")
        st.bind(1, s.nextSeq)
        st.bind(2, collection)
        st.bind(3, key)
        try st.run()
        guard s.db.changes > 0 else { return }
        s.nextSeq += 1
        let name = UTF8Key(collection)
        let written =
            s.changedKeys[name]?.contains(UTF8Key(key)) == true
            && s.renumberedKeys[name]?.contains(UTF8Key(key)) != true
        if Self.noteChanged(&s, collection, key), !written { s.renumberedKeys[name, default: []].insert(UTF8Key(key)) }
    }

    /// Whether this node's state of a document reaches the batch's sender, which holds an older
    /// one, through the scans of the sender's query subscriptions served here (`holders`, each
    /// with its query bound, and where its scan stands, ``HeldScan``), so that its row need not
    /// be logged again. It does only when every holder carries it, for the sender may cancel any
    /// of them before its scan gets to the row or its batch arrives (a holder whose scan passed
    /// the row without sending it would then never read it again): each holder's scan has yet
    /// to read the row (`unread`: the document is in the holder's scope now, so the page sends
    /// it; an eviction stub, sent only with an unacknowledged write, is not counted on), or read
    /// it in this session while the row was as it is now, and a live document's value matches
    /// the holder's query (the page sent it, or it is in flight: a session that ends before it
    /// arrives leaves the sender's checkpoint below the row, and the next session reads it
    /// again). A holder without a ``HeldScan`` carries nothing. The sender that cancels every
    /// holder keeps its copy as it is, as it keeps any document it holds only because a
    /// cancelled query matched it (docs/MESH.md).
    ///
    /// - Complexity: one indexed read of the row, and the value parsed once when a holder's
    ///   query must be evaluated.
    func heldRowReachesSender(
        _ s: inout State, _ collection: String, _ key: String, _ holders: [(SubscriptionSpec, Query)],
        _ scans: [String: HeldScan]
    ) throws -> (reaches: Bool, unread: Bool) {
        guard !scans.isEmpty else { return (false, false) }
        let st = try s.db.prepare("SELECT seq, deleted, value FROM documents WHERE k = trellis_key(?, ?)")
        st.bind(1, collection)
        st.bind(2, key)
        defer { st.reset() }
        guard try st.step() else { return (false, false) }
        let (seq, kind) = (st.int64(0), st.int64(1))
        var value: Value??
        var carried = false
        var unread = false
        for (spec, query) in holders where UTF8Key.equal(spec.collection, collection) {
            guard let scan = scans[spec.key] else { return (false, false) }
            if seq > scan.cursor, kind != RowKind.stub.rawValue {
                unread = true
            } else if seq > scan.since, seq <= scan.cursor, kind == RowKind.live.rawValue {
                if value == nil { value = .some(st.string(2).flatMap { try? JSON.parse($0) }) }
                guard let document = value!, (try? query.matches(document)) == true else { return (false, false) }
            } else {
                return (false, false)
            }
            carried = true
        }
        return (carried, unread)
    }

    /// The SQL term that is 1 when the current row left the scope of subscription `hash` (it is
    /// recorded in `scopes`), for a change-log page. The hash is an integer literal, never text.
    static func leftScopeSQL(_ hash: Int64) -> String {
        "EXISTS (SELECT 1 FROM scopes WHERE scopes.collection = documents.collection AND scopes.id = documents.id "
            + "AND scopes.sub = \(hash))"
    }
}
