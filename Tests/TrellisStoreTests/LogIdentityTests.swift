import Foundation
import Synchronization
import Testing
import TrellisCore
import TrellisTestKit

@testable import TrellisStore

/// Nothing is reissued: no `seq` and no stamp is issued twice by one site and epoch, across
/// rolled-back transactions, restarts, restored backups and power loss (issue 8 item 6).
@Suite struct LogIdentityTests {
    let dir = TemporaryDirectory()
    let clock = ManualClock()
    let log = LogLines()

    /// Opens a store as if on the system boot `boot` (`nil`: no boot ID can be read).
    func open(_ name: String, boot: String? = "boot-a", _ configure: (inout StoreOptions) -> Void = { _ in }) throws
        -> DocumentStore
    {
        let bootFile = dir.path(boot.map { "boot_id-\($0)" } ?? "no-such-boot-id")
        if let boot { try Data("\(boot)\n".utf8).write(to: URL(fileURLWithPath: bootFile)) }
        return try openStore(dir, name, clock: clock, log: log) { options in
            options.bootIDPath = bootFile
            configure(&options)
        }
    }

    /// What a power loss or a crash of the system leaves: the files of a store that is still open.
    func crashImage(_ name: String, as copy: String) throws {
        for suffix in ["", "-wal"] where FileManager.default.fileExists(atPath: dir.path(name + suffix)) {
            try FileManager.default.copyItem(atPath: dir.path(name + suffix), toPath: dir.path(copy + suffix))
        }
    }

    @Test func aRolledBackTransactionIssuesNoSeqAndReportsNoChange() throws {
        let store = try open("s.sqlite") { $0.maxDocumentBytes = 2_000 }
        let start = store.lastSeq
        let heard = Mutex<[[UTF8Key: Set<UTF8Key>]]>([])
        store.addObserver { event in heard.withLock { $0.append(event.changedKeys) } }
        try store.upsert(["_id": "a"], in: "c")
        #expect(throws: StoreError.self) {
            try store.upsert(
                [["_id": "ok"], ["_id": "big", "s": .string(String(repeating: "x", count: 5_000))]], in: "c")
        }
        #expect(store.lastSeq == start + 1)
        try store.upsert(["_id": "b"], in: "c")
        #expect(store.lastSeq == start + 2)
        let log = try store.changes(in: "c", after: 0, limit: 10, maxBytes: .max).records
        #expect(log.map(\.seq) == [start + 1, start + 2] && log.map(\.id) == ["a", "b"])
        store.waitForObservers()
        #expect(heard.withLock { $0 } == [["c": ["\"a\""]], ["c": ["\"b\""]]])
    }

    @Test func aStoreRestoredFromABackupContinuesAboveEverySeqItIssued() throws {
        var issued: Int64
        do {
            let store = try open("s.sqlite")
            try store.upsert(["_id": "a"], in: "c")
            try store.checkpointWAL()
            try FileManager.default.copyItem(atPath: dir.path("s.sqlite"), toPath: dir.path("backup.sqlite"))
            clock.advance(by: 1_000)
            try store.upsert((0..<100).map { ["_id": .string("n\($0)")] }, in: "c")
            issued = store.lastSeq
        }
        // Restore the backup, a millisecond later.
        clock.advance(by: 1)
        for suffix in ["", "-wal", "-shm"] {
            try? FileManager.default.removeItem(atPath: dir.path("s.sqlite" + suffix))
        }
        try FileManager.default.copyItem(atPath: dir.path("backup.sqlite"), toPath: dir.path("s.sqlite"))
        let restored = try open("s.sqlite")
        #expect(restored.lastSeq > issued)
        try restored.upsert(["_id": "after"], in: "c")
        let seqs = try restored.changes(in: "c", after: 0, limit: 10, maxBytes: .max).records.map(\.seq)
        #expect(seqs.count == 2 && seqs[1] > issued)
    }

    @Test func anUncleanShutdownAcrossARestartOfTheSystemRotatesTheLog() throws {
        let store = try open("s.sqlite", boot: "boot-a")
        try store.upsert(["_id": "a", "v": 1], in: "c")
        let (epoch, site) = (store.epoch, store.siteID)
        try crashImage("s.sqlite", as: "same-boot.sqlite")
        try crashImage("s.sqlite", as: "new-boot.sqlite")
        try crashImage("s.sqlite", as: "unknown-boot.sqlite")
        // The process died, the system did not: the last commits are on disk.
        let sameBoot = try open("same-boot.sqlite", boot: "boot-a")
        #expect(sameBoot.epoch == epoch && sameBoot.siteID == site)
        #expect(log.lines.isEmpty)
        // The system restarted: commits may have been lost after peers received them.
        let newBoot = try open("new-boot.sqlite", boot: "boot-b")
        #expect(newBoot.epoch != epoch && newBoot.siteID != site)
        #expect(log.lines.count == 1 && log.lines[0].contains("not closed cleanly"))
        #expect(try newBoot.document(id: "a", in: "c") == ["_id": "a", "v": 1])  // the data stays
        clock.advance(by: 1)
        try newBoot.upsert(["_id": "a", "v": 2], in: "c")
        #expect(try newBoot.state(id: "a", in: "c")?.stamp(at: .key("v"))?.site == newBoot.siteID)
        // No boot ID to compare: treated as a restart of the system.
        let unknown = try open("unknown-boot.sqlite", boot: nil)
        #expect(unknown.epoch != epoch && unknown.siteID != site)
        // A clean close records it: the next open keeps the log, whatever the boot.
        store.close()
        #expect(throws: StoreError.closed) { try store.upsert(["_id": "b"], in: "c") }
        let reopened = try open("s.sqlite", boot: "boot-c")
        #expect(reopened.epoch == epoch && reopened.siteID == site)
    }

    /// A clock once set a day ahead does not keep this node's writes in the future: at open, a
    /// saved clock beyond now + the drift restarts at now with a new site ID (issue 8 item 2).
    @Test func aForwardClockJumpIsNotPermanent() throws {
        let day: UInt64 = 86_400_000
        let oldSite: SiteID
        do {
            let jumped = ManualClock(startingAt: clock.now + day)
            let store = try open("s.sqlite") { $0.now = jumped.source }
            try store.upsert(["_id": "early", "v": 1], in: "c")
            oldSite = store.siteID
        }
        let store = try open("s.sqlite")  // the clock is right again
        #expect(store.siteID != oldSite)
        #expect(log.lines.count == 1 && log.lines[0].contains("ms ahead of the system clock"))
        try store.upsert(["_id": "late", "v": 1], in: "c")
        let stamp = try #require(try store.state(id: "late", in: "c")?.stamp(at: .key("v")))
        #expect(stamp.site == store.siteID && stamp.time.millis == clock.now)
        // A peer with a right clock applies the new writes at once.
        let peer = try open("peer.sqlite")
        let docs = try store.changes(in: "c", after: 0, limit: 10, maxBytes: .max).records.map {
            RemoteDocument(collection: $0.collection, id: $0.id, state: $0.state)
        }
        let outcome = try peer.merge(docs, from: [1], checkpoint: nil)
        // The caveat: what was written while the clock was ahead keeps its stamp (peers keep it
        // deferred until their clocks reach it).
        #expect(outcome.applied == 1 && outcome.deferred.map(\.key) == ["\"early\""])
        // Reopening does not rotate again.
        let again = try open("s.sqlite")
        #expect(again.siteID == store.siteID)
    }

    /// The stamp of document `id`'s field `v` in `store`.
    func stamp(_ store: DocumentStore, _ id: Value) throws -> Stamp {
        try #require(try store.state(id: id, in: "c")?.stamp(at: .key("v")))
    }

    /// Commits save the clock only when it passes the saved ceiling (the system time plus a
    /// second): a crash after commits that saved nothing still leaves a clock above every stamp
    /// they issued, also when the system clock went back across the restart.
    @Test func aCrashAfterCommitsThatSavedNoClockStillIssuesLaterStamps() throws {
        let store = try open("s.sqlite")
        let start = clock.now
        try store.upsert(["_id": "a", "v": 0], in: "c")
        let ceiling = try store.withState { s in try DocumentStore.meta(s.db, "hlc").map(DocumentStore.uint64) }
        #expect(ceiling == HLCTimestamp(millis: start + DocumentStore.clockLeaseMillis, logical: 0).rawValue)
        for n in 1...20 {
            clock.advance(by: 10)
            try store.upsert(["_id": "a", "v": .int(Int64(n))], in: "c")
        }
        // Within the lease: the ceiling stayed, nothing more was saved.
        #expect(try store.withState { s in try DocumentStore.meta(s.db, "hlc").map(DocumentStore.uint64) } == ceiling)
        let last = try stamp(store, "a")
        try crashImage("s.sqlite", as: "crashed.sqlite")
        clock.set(start - 5_000)  // the system clock went back across the restart
        let crashed = try open("crashed.sqlite")
        #expect(crashed.siteID == store.siteID)
        try crashed.upsert(["_id": "a", "v": 99], in: "c")
        #expect(try stamp(crashed, "a") > last)
        #expect(try crashed.document(id: "a", in: "c")?["v"] == 99)
    }

    /// A restart that finds a ceiling ahead of the system time saves the clock as it is, so
    /// ceilings do not add up: however many crashes follow each other within the second, the
    /// clock leads the system time by at most the lease.
    @Test func ceilingsDoNotAddUpAcrossCrashes() throws {
        let start = clock.now
        var name = "s.sqlite"
        var stamps: [Stamp] = []
        for round in 0..<5 {
            let store = try open(name)
            try store.upsert(["_id": "a", "v": .int(Int64(round))], in: "c")
            stamps.append(try stamp(store, "a"))
            try crashImage(name, as: "crash-\(round).sqlite")
            name = "crash-\(round).sqlite"
        }
        #expect(stamps == stamps.sorted() && Set(stamps).count == stamps.count)
        #expect(stamps.allSatisfy { $0.time.millis <= start + DocumentStore.clockLeaseMillis })
    }

    /// A clean close saves the clock itself: the next open continues right after the last stamp,
    /// not after the ceiling.
    @Test func aCleanCloseSavesTheClockItself() throws {
        let start = clock.now
        do {
            let store = try open("s.sqlite")
            try store.upsert(["_id": "a", "v": 1], in: "c")
            store.close()
        }
        let store = try open("s.sqlite")
        try store.upsert(["_id": "a", "v": 2], in: "c")
        #expect(try stamp(store, "a").time == HLCTimestamp(millis: start, logical: 1))
    }

    /// A rolled-back transaction moved the clock past the saved ceiling (its stamps never
    /// committed, nor did the ceiling): a clean close saves the clock, so the reopened store
    /// starts above them also when the system clock went back.
    @Test func aCleanCloseAfterARolledBackTransactionKeepsTheClock() throws {
        let start = clock.now
        let issued: HLCTimestamp
        do {
            let store = try open("s.sqlite") { $0.maxDocumentBytes = 2_000 }
            try store.upsert(["_id": "a", "v": 0], in: "c")
            clock.advance(by: 5_000)
            #expect(throws: StoreError.self) {
                try store.upsert(
                    [["_id": "ok"], ["_id": "big", "s": .string(String(repeating: "x", count: 5_000))]], in: "c")
            }
            issued = store.lastTimestamp
            #expect(issued.millis == start + 5_000)
            store.close()
        }
        clock.set(start)
        #expect(try open("s.sqlite").lastTimestamp >= issued)
    }

    /// A merge adopts a peer's stamp ahead of the system time: the clock is saved as it is, and a
    /// crash right after keeps it.
    @Test func aStampAdoptedAheadOfTheSystemTimeSurvivesACrash() throws {
        let writer = try open("w.sqlite")
        clock.advance(by: 30_000)
        try writer.upsert(["_id": "r", "v": 1], in: "c")
        clock.set(clock.now - 30_000)
        let store = try open("s.sqlite")
        try store.upsert(["_id": "a", "v": 0], in: "c")
        _ = try store.merge(try batch(of: writer), from: [1], checkpoint: nil)
        let adopted = store.lastTimestamp
        #expect(adopted.millis == clock.now + 30_000)
        try crashImage("s.sqlite", as: "crashed.sqlite")
        #expect(try open("crashed.sqlite").lastTimestamp >= adopted)
    }

    /// Writers on three threads while the store closes: the reopened store's next stamp is above
    /// every committed one, with the system clock set back.
    @Test func aCloseRacingWritersLeavesTheClockAboveEveryCommittedStamp() throws {
        for round in 0..<10 {
            let name = "r\(round).sqlite"
            let store = try open(name)
            let stop = Atomic<Bool>(false)
            let done = DispatchGroup()
            for t in 0..<3 {
                done.enter()
                Thread {
                    defer { done.leave() }
                    var n = 0
                    while !stop.load(ordering: .relaxed) {
                        _ = try? store.upsert(["_id": .string("t\(t)-\(n)"), "v": .int(Int64(n))], in: "c")
                        n += 1
                        if n % 7 == 0 { clock.advance(by: 3) }
                    }
                }.start()
            }
            Thread.sleep(forTimeInterval: 0.02)
            store.close()
            stop.store(true, ordering: .relaxed)
            done.wait()
            clock.set(clock.now - 2_000)
            let again = try open(name)
            var highest = HLCTimestamp.zero
            for record in try again.changes(in: "c", after: 0, limit: 1_000_000, maxBytes: .max).records {
                highest = max(highest, try DocumentState(bytes: record.state).maxTime)
            }
            try again.upsert(["_id": "after"], in: "c")
            #expect(try #require(try again.state(id: "after", in: "c")).maxTime > highest)
        }
    }

    /// A system time past what a stamp holds (2^48 ms) does not wrap the clock round to a small
    /// time: it counts as the largest.
    @Test func anAbsurdSystemTimeDoesNotWrapTheClock() throws {
        let store = try open("s.sqlite")
        try store.upsert(["_id": "a", "v": 0], in: "c")
        let before = store.lastTimestamp
        clock.set((1 << 48) + 10)
        try? store.upsert(["_id": "a", "v": 1], in: "c")
        #expect(store.lastTimestamp > before)
    }

    /// With `maxClockDrift` below the lease, the ceiling is at most half of it: a crash and a
    /// restart at once do not find the clock "far ahead" and rotate the site ID.
    @Test func aDriftBelowTheLeaseDoesNotRotateTheLogAfterACrash() throws {
        let store = try open("s.sqlite") { $0.maxClockDrift = 500 }
        try store.upsert(["_id": "a", "v": 0], in: "c")
        try crashImage("s.sqlite", as: "crashed.sqlite")
        let crashed = try open("crashed.sqlite") { $0.maxClockDrift = 500 }
        #expect(crashed.siteID == store.siteID)
        #expect(log.lines.isEmpty)
    }

    @Test func droppingTheStoreIsACleanClose() throws {
        let epoch: [UInt8]
        do {
            let store = try open("s.sqlite", boot: "boot-a")
            try store.upsert(["_id": "a"], in: "c")
            epoch = store.epoch
        }
        #expect(try open("s.sqlite", boot: "boot-b").epoch == epoch)
    }

    @Test func durabilityChoosesSQLitesSynchronousSetting() throws {
        func synchronous(_ store: DocumentStore) throws -> Int64 {
            try store.withState { s -> Int64 in
                let st = try s.db.prepare("PRAGMA synchronous")
                defer { st.reset() }
                _ = try st.step()
                return st.int64(0)
            }
        }
        let normal = try open("normal.sqlite")
        let full = try open("full.sqlite") { $0.durability = .full }
        #expect(try synchronous(normal) == 1 && synchronous(full) == 2)
        // A rotation commits durably whatever the setting, and the setting stays.
        try normal.rotateLog(reason: "test")
        #expect(try synchronous(normal) == 1)
    }
}
