import Foundation
import Testing
import TrellisTestKit

@testable import TrellisCore

/// Deltas of local writes (`StateDelta`, docs/DELTAS.md) on the random runs of
/// `DocumentStatePropertyTests`: whenever a replica's local operation (set, upsert, unset,
/// increment, remove, default data, a twin's write; not a merge or an eviction) turns `old` into
/// `new`, the replica makes the delta, on top of its pending delta when its state changed only by
/// local writes since that delta's base, and every state the run has held (every replica's, after
/// every step, eviction stubs and clones included) that covers the delta's base must join the delta
/// to exactly the state it joins `new` to. Each delta also reads back from its bytes.
///
/// Runs `TRELLIS_PROPERTY_CASES` cases (4,000 by default: each delta is checked against every
/// state the run held, so a case costs more than the model test's) with the same steps as the
/// model test (a seed replays the same runs in both); prints its seed, and `TRELLIS_SEED=<seed>`
/// replays a run, `TRELLIS_TRACE=<round>` prints its steps and deltas. Each applicable delta is also
/// checked as a store that reaps removed fields' contexts as it writes would make and join it
/// (`reapedLaw`).
extension DocumentStatePropertyTests {
    @Test func deltasOfLocalWritesJoinLikeTheWholeState() async throws {
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        let cases = ProcessInfo.processInfo.environment["TRELLIS_PROPERTY_CASES"] == nil ? 4_000 : Self.cases
        print("StateDeltaPropertyTests seed=\(seed) cases=\(cases) (replay: TRELLIS_SEED=\(seed))")
        var random = rng
        var stats = Stats()
        var firstMismatch: [String: String] = [:]
        for round in 0..<cases {
            var run = Run(round: round, seed: seed, checksDeltas: true)
            try run.play(&random)
            stats.add(run.stats)
            for (kind, message) in run.deltas?.mismatches ?? [:] where firstMismatch[kind] == nil {
                firstMismatch[kind] = message
            }
            if run.failed { break }
            if round % 32 == 31 { await Task.yield() }
        }
        print("StateDeltaPropertyTests: \(stats)")
        for (kind, message) in firstMismatch.sorted(by: { $0.key < $1.key }) {
            Issue.record(Comment(rawValue: "first mismatch, \(kind): \(message)"))
        }
        #expect(stats.deltas.mismatches == 0, "\(stats.deltas)")
        #expect(stats.deltas.made > cases / 2, "deltas were made: \(stats.deltas)")
        #expect(stats.deltas.composed > 0 && stats.deltas.covering > stats.deltas.made, "\(stats.deltas)")
        #expect(stats.deltas.reapedChecks > cases, "\(stats.deltas)")
    }

    /// What the delta checks counted.
    struct DeltaStats: CustomStringConvertible {
        /// Local operations that changed the state.
        var localWrites = 0
        /// Deltas made (the others: `make` returned `nil`).
        var made = 0
        /// Deltas made on top of a pending one.
        var composed = 0
        /// (delta, state) pairs where the state covers the base: the claim checked.
        var covering = 0
        /// Of those, the state is an eviction stub (it holds withheld entries).
        var coveringStubs = 0
        /// Of those, the delta is composed.
        var coveringComposed = 0
        /// (delta, state) pairs where the state does not cover the base (not applicable).
        var notCovering = 0
        /// Pairs left out: the state holds an entry with the stamp of a different entry of the
        /// sender (a twin's write: one stamp issued twice, which deltas, like the dot-store rule,
        /// assume never happens; DELTAS.md, "What a delta assumes").
        var equalStamps = 0
        /// Pairs checked as a store that reaps removed fields' contexts as it writes
        /// (`reapedLaw`).
        var reapedChecks = 0
        /// Pairs where the delta's join differs from the whole state's.
        var mismatches = 0
        var mismatchesOnStubs = 0
        /// Mismatches by kind: stub or full receiver, single or composed delta, and what the two
        /// states hold that no causal context accounts for (an entry with the stamp of a different
        /// entry: a twin's write; default data, at time zero, that the receiver lacks).
        var mismatchKinds: [String: Int] = [:]

        mutating func add(_ o: DeltaStats) {
            localWrites += o.localWrites
            made += o.made
            composed += o.composed
            covering += o.covering
            coveringStubs += o.coveringStubs
            coveringComposed += o.coveringComposed
            notCovering += o.notCovering
            equalStamps += o.equalStamps
            reapedChecks += o.reapedChecks
            mismatches += o.mismatches
            mismatchesOnStubs += o.mismatchesOnStubs
            mismatchKinds.merge(o.mismatchKinds, uniquingKeysWith: +)
        }

        var description: String {
            "deltas: \(localWrites) local writes, \(made) deltas made (\(composed) composed), "
                + "\(covering + notCovering) receivers checked, \(covering) applicable (covering the base; "
                + "\(coveringStubs) stubs, \(coveringComposed) composed), \(notCovering) not covering, "
                + "\(equalStamps) left out for a stamp issued twice, \(reapedChecks) checked as a reaping store, "
                + "\(mismatches) mismatches (\(mismatchesOnStubs) on stubs)"
                + mismatchKinds.sorted { $0.key < $1.key }.map { "\n  \($0.value) with \($0.key)" }.joined()
        }
    }

    /// The states a run has held, and its first mismatch of each kind.
    struct DeltaCheck {
        var history: [DocumentState] = []
        var seen: Set<DocumentState> = []
        var mismatches: [String: String] = [:]

        mutating func remember(_ state: DocumentState) {
            if seen.insert(state).inserted { history.append(state) }
        }
    }
}

extension DocumentStatePropertyTests.Run {
    static func dump(_ state: DocumentState) -> String { JSON.string(state.referenceEncoding) }

    /// A store reaps removed fields' contexts as it writes (docs/DATA-MODEL.md, "Tombstones and
    /// reaping"), here at a horizon one millisecond before the run's time: it stores `new` reaped,
    /// and makes the delta from `new` as written (docs/DELTAS.md, "Removal records and
    /// reaping"), from its stored `old`, reaped too. A receiver covering the base joins that
    /// delta to what it joins the stored state to, both reaped at the same horizon. A delta made
    /// from the reaped state fails this: the receiver keeps entries below the base that the
    /// writes removed (`DeltaReapingTests`).
    mutating func reapedLaw(
        _ delta: StateDelta, from old: DocumentState, to new: DocumentState, previous: StateDelta?,
        receiver: DocumentState
    ) {
        let horizon = HLCTimestamp(millis: physical > 1 ? physical - 1 : 0, logical: 0)
        var storedOld = old
        storedOld.reapRemovedFields(before: horizon)
        var stored = new
        stored.reapRemovedFields(before: horizon)
        guard
            let made = StateDelta.make(
                from: storedOld, to: new, previous: previous, digest: StateDigest(stored.cbor())),
            receiver.covers(base: made.base)
        else { return }
        stats.deltas.reapedChecks += 1
        var viaDelta = receiver
        viaDelta.merge(made)
        viaDelta.reapRemovedFields(before: horizon)
        var viaWhole = receiver
        viaWhole.merge(stored)
        viaWhole.reapRemovedFields(before: horizon)
        law(
            viaDelta == viaWhole,
            "reaped as a store writes, a delta joins like the stored state: \(Self.dump(viaDelta)) against "
                + Self.dump(viaWhole))
    }

    struct EntryKey: Hashable {
        var path: [String]
        var site: SiteID
        var time: HLCTimestamp
    }

    /// Every value, map and restart entry of a state by field path and stamp (for naming what a
    /// mismatch comes from).
    static func entries(of state: DocumentState) -> [EntryKey: FieldEntry] {
        var out: [EntryKey: FieldEntry] = [:]
        func walk(_ map: MapNode, _ path: [String]) {
            for (key, node) in map.entries {
                for entry in node.entries {
                    out[EntryKey(path: path + [key], site: entry.stamp.site, time: entry.stamp.time)] = entry
                }
                walk(node.map, path + [key])
            }
        }
        walk(state.root, [])
        return out
    }

    /// Remembers every replica's state (after each step).
    mutating func rememberStates() {
        guard deltas != nil else { return }
        for replica in replicas { deltas!.remember(replica.state) }
    }

    /// Replica `r`'s state went from `old` to its state now by a local operation: makes the delta
    /// and checks it against every state of the run that covers its base.
    mutating func localWrite(_ r: Int, from old: DocumentState) {
        guard deltas != nil else { return }
        let new = replicas[r].state
        guard new != old else { return }
        stats.deltas.localWrites += 1
        let previous = replicas[r].pending
        guard let delta = StateDelta.make(from: old, to: new, previous: previous, digest: StateDigest(new.cbor()))
        else {
            trace("replica \(r): no delta")
            replicas[r].pending = nil
            return
        }
        replicas[r].pending = delta
        stats.deltas.made += 1
        if previous != nil { stats.deltas.composed += 1 }
        trace(
            "replica \(r): delta base \(delta.base.sorted { $0.key < $1.key }) fields "
                + "\(delta.state.root.entries.keys.map { $0 })\(previous != nil ? " (composed)" : "")")

        let bytes = delta.encoded()
        law(StateDelta.isEncoded(bytes), "a delta's bytes are in the delta form")
        law(bytes.first == 0x84, "a delta of local writes is written in the compact form")
        law((try? StateDelta(bytes: bytes)) == delta, "a delta reads back from its bytes")
        law(StateDelta.digest(in: bytes) == delta.digest, "the digest reads from an encoded delta")
        let oldForm = delta.encodedInOldForm()
        law((try? StateDelta(bytes: oldForm)) == delta, "a delta reads back from its old-form bytes")
        law(StateDelta.digest(in: oldForm) == delta.digest, "the digest reads from an old-form delta")
        law(bytes.count < oldForm.count, "the compact form is smaller than the old form")

        rememberStates()
        for (index, receiver) in deltas!.history.enumerated() {
            guard receiver.covers(base: delta.base) else {
                stats.deltas.notCovering += 1
                continue
            }
            let stub = receiver.withheldEntryCount > 0
            stats.deltas.covering += 1
            if stub { stats.deltas.coveringStubs += 1 }
            if previous != nil { stats.deltas.coveringComposed += 1 }
            // What the two states hold that a causal context does not account for.
            let theirs = Self.entries(of: new)
            let mine = Self.entries(of: receiver)
            let equalStamps = mine.contains { key, entry in
                guard let other = theirs[key] else { return false }
                // A withheld entry stands for the write it withholds.
                return entry.isWithheld || other.isWithheld ? entry.withheld != other.withheld : entry != other
            }
            if equalStamps {
                stats.deltas.equalStamps += 1
                continue
            }
            var viaDelta = receiver
            viaDelta.merge(delta)
            var viaWhole = receiver
            viaWhole.merge(new)
            if viaDelta == viaWhole { reapedLaw(delta, from: old, to: new, previous: previous, receiver: receiver) }
            guard viaDelta != viaWhole else { continue }
            stats.deltas.mismatches += 1
            if stub { stats.deltas.mismatchesOnStubs += 1 }
            let unseenDefault = theirs.contains { $0.key.time == .zero && mine[$0.key] == nil }
            let kind =
                "\(stub ? "stub" : "full") receiver, \(previous != nil ? "composed" : "single") delta"
                + (equalStamps ? ", an entry of the receiver has the stamp of another entry of the sender" : "")
                + (unseenDefault ? ", the sender holds default data the receiver lacks" : "")
            stats.deltas.mismatchKinds[kind, default: 0] += 1
            trace("MISMATCH (\(kind)) with state #\(index)")
            if deltas!.mismatches[kind] == nil {
                deltas!.mismatches[kind] =
                    "replica \(r) (site \(replicas[r].site)), state #\(index) of the run; \(where_)\n"
                    + "  base \(delta.base.sorted { $0.key < $1.key })\n"
                    + "  old       \(Self.dump(old))\n  new       \(Self.dump(new))\n"
                    + "  delta     \(Self.dump(delta.state))\n  receiver  \(Self.dump(receiver))\n"
                    + "  via delta \(Self.dump(viaDelta))\n  via whole \(Self.dump(viaWhole))"
            }
        }
    }
}
