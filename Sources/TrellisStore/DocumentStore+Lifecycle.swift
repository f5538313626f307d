import Foundation
import TrellisCore

// Opening and closing a store, and the identity of its log (epoch, site ID, seq, clock).
//
// Nothing is reissued: no `seq` and no HLC stamp is issued twice by one site and epoch, also across
// crashes, power loss and backup restores.
// - A rolled-back transaction restores the next `seq` (``DocumentStore/write(durable:_:)``).
// - The saved clock is a ceiling: at or above every stamp issued or adopted, up to a second ahead
//   of the system time (``DocumentStore/saveClock(_:)``); a clean close saves the clock itself.
// - At open the next `seq` is above the highest issued and above physical time (ms) × 1024, so a
//   store restored from a backup continues above anything it issued after the backup was taken
//   (as long as it issued fewer than 1024 seqs per millisecond on average, which SQLite cannot).
// - Commits use `synchronous=NORMAL` by default, which a power loss can take back after peers
//   received them. The store records "open" with the boot ID at open and clears it at a clean
//   close; finding it at the next open after a restart of the system (or with an unknown boot ID)
//   means commits may have been lost, and the log is rotated: a new epoch (peers resync) and a new
//   site ID (whose stamps cannot repeat old ones).

/// The identity and position of a log as read (or set up) at open.
struct OpenedLog {
    var site: SiteID
    var epoch: [UInt8]
    var clock: HLCTimestamp
    var nextSeq: Int64
    /// What the open did that the log should say (rotations).
    var messages: [String] = []
}

extension DocumentStore {
    /// Reads the log's identity without writing (a read-only open).
    static func readLog(_ db: Connection) throws -> OpenedLog {
        guard let site = try meta(db, "site"), site.count == 8 else { throw StoreError.corrupt("no valid site ID") }
        return OpenedLog(
            site: uint64(site), epoch: try meta(db, "epoch") ?? [],
            clock: HLCTimestamp(rawValue: try meta(db, "hlc").map(uint64) ?? 0), nextSeq: try highestSeq(db) + 1)
    }

    /// Sets up the log's identity at a writable open (inside a transaction): creates a new store's
    /// site ID and epoch, rotates them after an unclean shutdown across a restart of the system,
    /// starts a new site ID with the clock at now when the saved clock is more than
    /// ``StoreOptions/maxClockDrift`` ahead of physical time, places the next `seq`, and records
    /// that the store is open.
    static func openLog(_ db: Connection, path: String, options: StoreOptions) throws -> OpenedLog {
        let now = options.now()
        let boot = bootID(at: options.bootIDPath)
        var log = OpenedLog(
            site: randomSite(options.random), epoch: randomEpoch(options.random),
            clock: HLCTimestamp(rawValue: try meta(db, "hlc").map(uint64) ?? 0),
            nextSeq: 1)
        if let site = try meta(db, "site"), let epoch = try meta(db, "epoch") {
            guard site.count == 8 else {
                throw StoreError.corrupt("\(path): the site ID is \(site.count) bytes, not 8")
            }
            log.site = uint64(site)
            log.epoch = epoch
            if let marker = try meta(db, "open") {
                let previous = String(decoding: marker, as: UTF8.self)
                if previous.isEmpty || boot == nil || previous != boot {
                    log.site = randomSite(options.random)
                    log.epoch = randomEpoch(options.random)
                    log.messages.append(
                        "\(path) was not closed cleanly and the system has restarted since (boot ID "
                            + "\(previous.isEmpty ? "unknown" : previous) -> \(boot ?? "unknown")): its last commits may "
                            + "have been lost after peers received them, so its log starts a new epoch "
                            + "\(hex(log.epoch)) and site ID \(String(log.site, radix: 16)); peers resync from it")
                }
            }
        }
        // A clock that was once far ahead (set a day forward, an RTC reset to 2040) left the HLC
        // there; every peer would defer this node's writes until real time caught up. A fresh site
        // ID has no history, so its clock can restart at now without ever repeating a stamp.
        if log.clock.millis > now, log.clock.millis - now > options.maxClockDrift {
            let ahead = log.clock.millis - now
            log.site = randomSite(options.random)
            log.clock = HLCTimestamp(millis: now, logical: 0)
            try setMeta(db, "hlc", bytes(log.clock.rawValue))
            log.messages.append(
                "the clock of \(path) had been \(ahead) ms ahead of the system clock (more than the allowed "
                    + "\(options.maxClockDrift) ms): it restarts at the system time with a new site ID "
                    + "\(String(log.site, radix: 16)); documents written while the clock was ahead keep their "
                    + "stamps and win against later writes until that time")
        }
        // Above everything issued, and above physical time × 1024 so that a restored backup (whose
        // highest issued seq is old) continues above what it issued after the backup.
        let (scaled, overflow) = Int64(clamping: now).multipliedReportingOverflow(by: 1024)
        log.nextSeq = max(try highestSeq(db) + 1, overflow ? Int64.max / 2 : scaled)
        try setMeta(db, "site", bytes(log.site))
        try setMeta(db, "epoch", log.epoch)
        try setMetaInt64(db, "seq", log.nextSeq - 1)
        try setMeta(db, "open", Array((boot ?? "").utf8))
        return log
    }

    /// Brings a store written by an earlier version up to the current schema.
    ///
    /// - Checkpoints gain the collection of their subscription (filled from the subscription key),
    ///   so evicting in a collection finds its checkpoints without parsing keys in SQL, and
    ///   whether their peer's reaped tombstones reached this node (`reaped`, ``ReapedKeys``; 0,
    ///   received, for those written before).
    /// - Tombstones gain `removed_at`, the time of their newest stamp (for the reaper), and a
    ///   partial index on it that leaves out tombstones holding a write of this node no peer has
    ///   acknowledged (the reaper keeps those).
    /// - Documents gain `unacked`: while no peer has acknowledged a batch holding this node's
    ///   latest write of the row, how far the row's `seq` is past that write's `seq` (0 when it is
    ///   the write's own; NULL otherwise; ``DocumentStore/acknowledge(_:)``), so an eviction
    ///   keeps such a write's values (an acknowledgement clears it when the document is evicted).
    ///   Live rows written before count as unacknowledged: nothing says a peer holds them (one
    ///   write of each row, once).
    /// - Documents gain `delta`: the encoded ``StateDelta`` of the local writes since the row's
    ///   base, sent to peers that hold that base instead of the whole state (docs/DELTAS.md), and
    ///   `delta_seq`, the row's `seq` when its state was that base; NULL in rows written before.
    /// - Documents gain `age`: how far the row's `seq` is past the first `seq` the document had in
    ///   this log, so a peer that was served the whole collection up to some `seq` is sent later
    ///   changes to every document it may hold (DocumentStore+Scope.swift); NULL in rows written
    ///   before, which count as written before every `seq`.
    /// - The `source` column of `documents` (the peer a row's state came from, once used to
    ///   suppress echoes) is no longer written or read; old stores keep it, NULL from then on
    ///   until the rebuild below leaves it behind.
    /// - Documents are keyed by the row key `k` instead of `(collection, id)`, with `id` computed
    ///   from it (``rebuildWithRowKey(_:)``, docs/ARCHITECTURE.md, "The row key").
    /// The names of a table's columns.
    private static func columnNames(_ db: Connection, _ table: String) throws -> Set<String> {
        let columns = try db.prepare("SELECT name FROM pragma_table_info(?)")
        columns.bind(1, table)
        defer { columns.reset() }
        var names: Set<String> = []
        while try columns.step() { names.insert(columns.string(0) ?? "") }
        return names
    }

    static func migrate(_ db: Connection) throws {
        if try !columnNames(db, "checkpoints").contains("collection") {
            try db.transaction {
                try db.execute("ALTER TABLE checkpoints ADD COLUMN collection TEXT NOT NULL DEFAULT ''")
                let keys = try db.prepare("SELECT DISTINCT subscription FROM checkpoints")
                var subscriptions: [String] = []
                while try keys.step() { subscriptions.append(keys.string(0) ?? "") }
                keys.reset()
                let fill = try db.prepare("UPDATE checkpoints SET collection = ? WHERE subscription = ?")
                for key in subscriptions {
                    fill.reset()
                    fill.bind(1, SubscriptionSpec.collection(ofKey: key))
                    fill.bind(2, key)
                    try fill.run()
                }
            }
        }
        try db.execute("CREATE INDEX IF NOT EXISTS checkpoints_by_collection ON checkpoints(collection)")
        if try !columnNames(db, "checkpoints").contains("reaped") {
            // Every checkpoint written before counts its peer's reaped tombstones as received,
            // as that version did.
            try db.execute("ALTER TABLE checkpoints ADD COLUMN reaped INTEGER NOT NULL DEFAULT 0")
        }
        // Tombstones gain the time of their newest stamp, for the reaper; NULL in rows written
        // before, filled in by the reaper as it meets them.
        let documentNames = try columnNames(db, "documents")
        if !documentNames.contains("removed_at") {
            try db.execute("ALTER TABLE documents ADD COLUMN removed_at INTEGER")
        }
        if !documentNames.contains("delta") {
            // The delta of a row's local writes since its base (StateDelta): NULL in rows written
            // before, which are sent whole until written again.
            try db.execute("ALTER TABLE documents ADD COLUMN delta BLOB")
        }
        if !documentNames.contains("delta_seq") {
            try db.execute("ALTER TABLE documents ADD COLUMN delta_seq INTEGER")
        }
        if !documentNames.contains("age") {
            // How far the row's `seq` is past the `seq` it was first written with (its birth in
            // this log, DocumentStore+Scope.swift): NULL in rows written before, which count as
            // born before every `seq`.
            try db.execute("ALTER TABLE documents ADD COLUMN age INTEGER")
        }
        if !documentNames.contains("unacked") {
            // Nothing says which live rows a peer holds: they count as unacknowledged (an eviction
            // keeps their values and offers the stub until a peer acknowledges it).
            try db.transaction {
                try db.execute("ALTER TABLE documents ADD COLUMN unacked INTEGER")
                try db.execute("UPDATE documents SET unacked = 0 WHERE deleted = 0")
            }
        }
        // Reaped keys gain their tombstone's state; NULL in keys reaped before, whose time alone
        // decides what a later state for them is (DocumentStore+Tombstones.swift).
        let reapedNames = try columnNames(db, "reaped")
        if !reapedNames.contains("state") {
            try db.execute("ALTER TABLE reaped ADD COLUMN state BLOB")
        }
        if !reapedNames.contains("seq") {
            // Reaped keys gain the `seq` their tombstone had, so a peer found below the floor is
            // sent the tombstones reaped after its checkpoint (DocumentStore+ChangeLog.swift). Keys
            // reaped before get their collection's floor, which is at least the `seq` they had:
            // such a peer is sent them whatever its checkpoint, never fewer than it missed.
            try db.transaction {
                try db.execute("ALTER TABLE reaped ADD COLUMN seq INTEGER")
                let names = try db.prepare("SELECT DISTINCT collection FROM reaped")
                var collections: [String] = []
                while try names.step() { collections.append(names.string(0) ?? "") }
                names.reset()
                let fill = try db.prepare("UPDATE reaped SET seq = ? WHERE collection = ?")
                for collection in collections {
                    fill.reset()
                    fill.bind(1, try metaInt64(db, "floor:" + collection) ?? 0)
                    fill.bind(2, collection)
                    try fill.run()
                }
            }
        }
        if !reapedNames.contains("age") {
            // Reaped keys gain the `age` their tombstone's row had, so a row written for the key
            // again keeps the document's birth (`whole_held`, DocumentStore+Scope.swift). NULL in
            // keys reaped before: born before every `seq`, so a peer served the whole collection
            // counts as holding them.
            try db.execute("ALTER TABLE reaped ADD COLUMN age INTEGER")
        }
        try db.execute("CREATE INDEX IF NOT EXISTS reaped_by_seq ON reaped(collection, seq) WHERE state IS NOT NULL")
        if try !hasRowKey(db) { try rebuildWithRowKey(db) }
        // The tombstones the reaper may take, by time: those holding no write of this node that
        // no peer has acknowledged (`unacked` NULL). An earlier version indexed every tombstone
        // (`documents_tombstones`); the reaper would then walk past the kept ones on every run.
        let earlier = try db.prepare(
            "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'documents_tombstones'")
        let upgraded = try earlier.step()
        earlier.reset()
        if upgraded {
            // That version kept the acknowledgements of tombstones in memory only, and its peers'
            // checkpoints are past them: nothing would mark them acknowledged now. They are reaped
            // at their TTL, as that version reaped them.
            try db.transaction {
                try db.execute("UPDATE documents SET unacked = NULL WHERE deleted = 1 AND unacked IS NOT NULL")
                try db.execute("DROP INDEX documents_tombstones")
            }
        }
        try db.execute(
            "CREATE INDEX IF NOT EXISTS documents_reapable ON documents(removed_at) WHERE deleted = 1 AND unacked IS NULL"
        )
        // The tombstones the reaper keeps, by position (a peer whose whole-collection checkpoint
        // is past one holds it: `acknowledgeTombstones(in:through:)`) and by time (kept no longer
        // than the TTL and `reapedKeyRetention` together).
        try db.execute(
            "CREATE INDEX IF NOT EXISTS documents_kept ON documents(collection, seq) "
                + "WHERE deleted = 1 AND unacked IS NOT NULL")
        try db.execute(
            "CREATE INDEX IF NOT EXISTS documents_kept_by_time ON documents(removed_at) "
                + "WHERE deleted = 1 AND unacked IS NOT NULL")
        // Tombstones written before `removed_at` existed, which the reaper dates: none in a store
        // written by this version, so the index costs nothing.
        try db.execute(
            "CREATE INDEX IF NOT EXISTS documents_undated ON documents(collection) WHERE deleted = 1 AND removed_at IS NULL"
        )
        // The eviction stubs, by collection: what a node asks peers for again, at start too.
        try db.execute(
            "CREATE INDEX IF NOT EXISTS documents_stubs ON documents(collection, seq) WHERE deleted = 2")
    }

    /// Whether the `documents` table is keyed by the row key `k` (stores written before it are
    /// keyed by `(collection, id)` until ``rebuildWithRowKey(_:)`` runs).
    static func hasRowKey(_ db: Connection) throws -> Bool { try columnNames(db, "documents").contains("k") }

    /// Rebuilds a `documents` table keyed by `(collection, id)` as one keyed by the row key `k`
    /// (`trellis_key(collection, id)`, docs/ARCHITECTURE.md, "The row key"), in one transaction: the
    /// same rows and columns (the unused `source` column left behind), then every index the old
    /// table had, from its own SQL. A collection or `_id` stored as a blob (a damaged row) counts
    /// as its bytes' text: the row is kept, and read as any other.
    ///
    /// - Complexity: O(n log n) in the rows; once per store.
    private static func rebuildWithRowKey(_ db: Connection) throws {
        let columns = "seq, deleted, state, value, removed_at, delta, delta_seq, age, unacked"
        try db.transaction {
            let indexes = try db.prepare(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'documents' "
                    + "AND sql IS NOT NULL")
            var definitions: [String] = []
            while try indexes.step() {
                let name = indexes.string(0) ?? ""
                let sql = indexes.string(1) ?? ""
                definitions.append(expressionIndexSQL(name) ?? sql)
            }
            indexes.reset()
            try db.execute(
                """
                CREATE TABLE documents_keyed(
                    k TEXT NOT NULL PRIMARY KEY, collection TEXT NOT NULL,
                    id TEXT GENERATED ALWAYS AS (\(idFromKeySQL)) VIRTUAL, seq INTEGER NOT NULL,
                    deleted INTEGER NOT NULL, state BLOB NOT NULL, value TEXT, removed_at INTEGER, delta BLOB,
                    delta_seq INTEGER, age INTEGER, unacked INTEGER
                ) WITHOUT ROWID;
                INSERT INTO documents_keyed(k, collection, \(columns))
                    SELECT trellis_key(collection, id), CAST(collection AS TEXT), \(columns) FROM documents;
                DROP TABLE documents;
                ALTER TABLE documents_keyed RENAME TO documents;
                """)
            for definition in definitions { try db.execute(definition) }
        }
    }

    /// The statement that makes the expression index named `name` as this version makes it
    /// (``indexSQL(collection:jsonPath:)``), when `name` is one ``createIndex(path:in:)`` gives
    /// (``expressionIndex(named:)``).
    static func expressionIndexSQL(_ name: String) -> String? {
        expressionIndex(named: name).map { indexSQL(collection: $0.collection, jsonPath: $0.jsonPath).sql }
    }

    /// The highest `seq` issued so far: in the log, or remembered in meta (rows that left the log).
    static func highestSeq(_ db: Connection) throws -> Int64 {
        let st = try db.prepare("SELECT coalesce(max(seq), 0) FROM documents")
        defer { st.reset() }
        _ = try st.step()
        return max(st.int64(0), try metaInt64(db, "seq") ?? 0)
    }

    /// The system's boot ID read from `path`, or `nil` when it cannot be read.
    static func bootID(at path: String) -> String? {
        // procfs files report size 0: read to the end rather than by size.
        guard let handle = FileHandle(forReadingAtPath: path) else { return nil }
        defer { try? handle.close() }
        guard let data = try? handle.readToEnd(), let text = String(data: data, encoding: .utf8) else { return nil }
        let id = text.trimmingCharacters(in: .whitespacesAndNewlines)
        return id.isEmpty ? nil : id
    }

    static func synchronousPragma(_ durability: Durability) -> String {
        durability == .full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL"
    }

    /// Closes the store cleanly: records that it was closed (so the next open knows no commit can
    /// have been lost) and refuses every later call with ``StoreError/closed``. Called by `deinit`;
    /// call it earlier when a process may exit while other references to the store still exist.
    /// Calling it again does nothing.
    public func close() {
        // The reader goes first: the writer's connection, closing last, checkpoints the WAL.
        reader.withLock { $0 = nil }
        state.withLock { s in
            guard !s.closed else { return }
            s.closed = true
            guard !options.readOnly else { return }
            // The clock itself instead of its ceiling: the next open continues right after it.
            // Also a clock past the ceiling: a rolled-back transaction's stamps (and the clock
            // they moved) were never saved.
            if s.savedClock != s.clock.last, (try? Self.setMeta(s.db, "hlc", Self.bytes(s.clock.last.rawValue))) != nil
            {
                s.savedClock = s.clock.last
            }
            try? s.db.execute("DELETE FROM meta WHERE key = 'open'")
            // Before the connection closes, so that its close checkpoints and removes the WAL.
            checkpointer?.stop(db: s.db)
        }
    }

    // MARK: Log identity

    /// Starts a new life of the log: a new epoch and a new site ID, in one durable transaction,
    /// logged with `reason`.
    ///
    /// Peers holding checkpoints on this store's log see the new epoch and start over from 0 (the
    /// merges that follow change nothing they already have); contacts anchors expire. The new
    /// site ID has no history, so no stamp it issues can repeat one issued before. `seq`s keep
    /// growing. Called when the log may have regressed (a restored backup, a power loss after
    /// peers received commits, a peer holding a checkpoint beyond the end of the log), by the
    /// store itself at open after an unclean shutdown across a restart of the system, and on demand.
    ///
    /// - Throws: ``StoreError`` when the store is read-only or SQLite fails (nothing changes then).
    public func rotateLog(reason: String) throws(StoreError) {
        let (old, new, site) = try write(durable: true) { s -> ([UInt8], [UInt8], SiteID) in
            let old = s.epoch
            s.epoch = Self.randomEpoch(options.random)
            s.siteID = Self.randomSite(options.random)
            try Self.setMeta(s.db, "epoch", s.epoch)
            try Self.setMeta(s.db, "site", Self.bytes(s.siteID))
            return (old, s.epoch, s.siteID)
        }
        options.log(
            "rotated the log of \(path): epoch \(Self.hex(old)) -> \(Self.hex(new)), site ID "
                + "\(String(site, radix: 16)): \(reason)")
    }

    /// A new epoch: 16 bytes from the store's random source (``StoreOptions/random``).
    static func randomEpoch(_ random: () -> UInt64) -> [UInt8] {
        withUnsafeBytes(of: (random(), random())) { Array($0) }
    }

    /// A new site ID (never 0) from the store's random source.
    static func randomSite(_ random: () -> UInt64) -> SiteID { max(1, random()) }

    /// A new `_id` for a document given without one: a version 4 UUID string (RFC 9562 §5.4),
    /// from the store's random source.
    static func newID(_ random: () -> UInt64) -> Value {
        var bytes = withUnsafeBytes(of: (random(), random())) { Array($0) }
        bytes[6] = bytes[6] & 0x0F | 0x40
        bytes[8] = bytes[8] & 0x3F | 0x80
        let digits = Array("0123456789ABCDEF")
        var text = ""
        for (i, byte) in bytes.enumerated() {
            if [4, 6, 8, 10].contains(i) { text.append("-") }
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 15)])
        }
        return .string(text)
    }

    static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef")
        return String(bytes.flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 15)]] })
    }
}
