import Foundation
import Testing
import TrellisTestKit

@testable import TrellisCore

/// Review 35: the state encoding without hashing or copies (`SiteSet`, `StateLayout`'s binary
/// search, map fields written from their byte-ordered positions sorted by UTF-8 length, the
/// one-entry version vector) and `StateDelta.make` reading the fields in place (`admitsDelta`,
/// the walk of the old root map beside the new one, the fields gone told by counting old keys).
///
/// Differential: `make` is checked against the implementation before those commits (copied below
/// as `review35OldMake`, with the `holdsTimeZero` and `withheldEntryCount` checks it used), and
/// `cbor()` and `encoded()` against encoders built from `Value` trees (the repository's
/// `referenceEncoding`, and `Review35Reference` below for the compact delta form), on states made
/// by the public operations (sets, upserts, unsets, increments and restarts, removes, default data,
/// merges, eviction stubs, reaping) and on states built field by field. Keys include byte strings
/// whose Swift `String` order differs from their byte order; sites include 0 and `UInt64.max`.
///
/// Prints its seed; `TRELLIS_SEED=<seed>` replays a run, `TRELLIS_REVIEW35_CASES=<n>` sets the
/// number of random cases of each kind.
@Suite struct ReviewThirtyFiveEncodingTests {
    // MARK: Pools

    static let nfc = "\u{E9}"
    static let nfd = "e\u{301}"

    /// Keys whose byte order, length order and `String` order disagree: canonically equivalent
    /// spellings, one to four byte scalars, equal lengths differing in high bytes, the empty key,
    /// NUL, and lengths around the CBOR header steps (23, 24, 255, 256 bytes).
    static let keyPool: [String] = [
        "", "a", "b", "f", "z", "A", "aa", "ab", "\u{0}", "\u{7F}", "\u{80}", nfc, nfd, "\u{FF}", "\u{100}",
        "\u{7FF}", "\u{800}", "\u{FFFD}", "\u{FFFF}", "\u{E000}", "\u{10000}", "\u{1F600}", "\u{10FFFF}",
        "\u{1F44D}\u{1F3FD}", "\u{1F1EB}\u{1F1F7}", "\u{FB01}", "\u{212B}", "\u{C5}", "A\u{30A}", "e\u{301}\u{301}",
        "\u{E9}\u{301}", "x\u{0}y", String(repeating: "k", count: 22), String(repeating: "k", count: 23),
        String(repeating: "k", count: 24), String(repeating: nfc, count: 12), String(repeating: nfd, count: 8),
        String(repeating: "k", count: 255), String(repeating: "k", count: 256),
        String(repeating: "\u{1F600}", count: 64),
    ]

    static let edgeSites: [SiteID] = [
        0, 1, 2, 3, 0x7F, 0xFF, 0x1_0000, UInt64(Int64.max) - 1, UInt64(Int64.max), UInt64(Int64.max) + 1,
        UInt64.max - 1, UInt64.max,
    ]

    static let leafValues: [Value] = [
        1, 2, -7, 0, 2.5, -0.0, 0.1, "x", .string(nfc), .string(nfd), "\u{1F600}", true, false, nil, [1, 2],
        .bytes([0, 255]), .int(Int64.min), .int(Int64.max),
    ]
    static let amounts: [Value] = [1, 2, 5, -3, 0, 0.5, -0.25, .int(1 << 40)]

    static var cases: Int {
        ProcessInfo.processInfo.environment["TRELLIS_REVIEW35_CASES"].flatMap { Int($0) } ?? 500
    }

    static func hex(_ bytes: [UInt8]) -> String {
        bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    }

    /// `count` different sites, each an edge value of `UInt64` or a random one.
    static func distinctSites(_ count: Int, using random: inout SeededRandom) -> [SiteID] {
        var sites: [SiteID] = []
        while sites.count < count {
            let site =
                Bool.random(using: &random)
                ? edgeSites.randomElement(using: &random)! : UInt64.random(in: 0...UInt64.max, using: &random)
            if !sites.contains(site) { sites.append(site) }
        }
        return sites
    }

    // MARK: Checks shared by every test

    /// What the checks met and found, for the summary and the first failures.
    struct Tally {
        var encoded = 0
        var decoded = 0
        var deltaCalls = 0
        var deltasMade = 0
        var deltasCarried = 0
        var compact = 0
        var oldForm = 0
        var failures: [String] = []

        mutating func fail(_ message: @autoclosure () -> String) {
            if failures.count < 8 { failures.append(message()) }
            if failures.count == 8 { failures.append("(more failures left out)") }
        }
    }

    /// `cbor()` is the reference encoding, and (for `decodes`) reads back to the state.
    static func checkEncoding(_ state: DocumentState, decodes: Bool, _ tally: inout Tally, _ context: String) {
        let bytes = state.cbor()
        let reference = CBOR.encode(state.referenceEncoding)
        tally.encoded += 1
        if bytes != reference {
            tally.fail("\(context): cbor() \(hex(bytes)) != reference \(hex(reference))")
            return
        }
        let mine = CBOR.encode(Review35Reference.state(state, compactBelow: nil).value)
        if mine != reference {
            tally.fail("\(context): the review's reference \(hex(mine)) != the repository's \(hex(reference))")
        }
        guard decodes else { return }
        tally.decoded += 1
        do {
            let back = try DocumentState(encoded: CBOR.decode(bytes, options: .init(requireDeterministic: true)))
            if back != state { tally.fail("\(context): \(hex(bytes)) decodes to another state") }
        } catch {
            tally.fail("\(context): \(hex(bytes)) does not decode: \(error)")
        }
    }

    /// `make` gives what the implementation before review 35's commits gave, and a delta it makes
    /// encodes as the reference and (for `decodes`) reads back.
    static func checkMake(
        _ old: DocumentState, _ new: DocumentState, _ previous: StateDelta?, decodes: Bool, _ tally: inout Tally,
        _ context: @autoclosure () -> String
    ) -> StateDelta? {
        let digest = StateDigest(high: UInt64(new.root.entries.count), low: UInt64(old.writes.count))
        let made = StateDelta.make(from: old, to: new, previous: previous, digest: digest)
        let expected = StateDelta.review35OldMake(from: old, to: new, previous: previous, digest: digest)
        tally.deltaCalls += 1
        if made != expected {
            tally.fail(
                "\(context()): make gave \(made.map { describe($0) } ?? "nil"), before \(expected.map { describe($0) } ?? "nil"); "
                    + "old \(hex(old.cbor())) new \(hex(new.cbor())) previous \(previous.map { describe($0) } ?? "nil")"
            )
            return made
        }
        guard let made else { return nil }
        tally.deltasMade += 1
        if previous != nil { tally.deltasCarried += 1 }
        checkDeltaEncoding(made, decodes: decodes, &tally, context())
        return made
    }

    /// `encoded()` is the reference compact (or old) form, and (for `decodes`) reads back.
    static func checkDeltaEncoding(_ delta: StateDelta, decodes: Bool, _ tally: inout Tally, _ context: String) {
        let bytes = delta.encoded()
        let (reference, compact) = Review35Reference.delta(delta)
        if compact { tally.compact += 1 } else { tally.oldForm += 1 }
        if bytes != reference {
            tally.fail("\(context): encoded() \(hex(bytes)) != reference \(hex(reference)) of \(describe(delta))")
            return
        }
        let oldForm = delta.encodedInOldForm()
        let (oldReference, _) = Review35Reference.delta(delta, compact: false)
        if oldForm != oldReference {
            tally.fail("\(context): encodedInOldForm() \(hex(oldForm)) != reference \(hex(oldReference))")
        }
        guard decodes else { return }
        do {
            let back = try StateDelta(bytes: bytes)
            if back != delta { tally.fail("\(context): delta \(hex(bytes)) decodes to another delta") }
        } catch {
            tally.fail("\(context): delta \(hex(bytes)) does not decode: \(error)")
        }
    }

    static func describe(_ delta: StateDelta) -> String {
        "{base \(delta.base.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value.rawValue)" }) state \(hex(delta.state.cbor()))}"
    }

    static func report(_ tally: Tally, _ name: String, seed: UInt64) {
        print(
            "ReviewThirtyFive \(name) seed=\(seed) (replay: TRELLIS_SEED=\(seed)): \(tally.encoded) encodings, "
                + "\(tally.decoded) decoded, \(tally.deltaCalls) make calls, \(tally.deltasMade) deltas "
                + "(\(tally.deltasCarried) carrying a previous one; \(tally.compact) compact, \(tally.oldForm) old form)"
        )
        for failure in tally.failures { Issue.record(Comment(rawValue: "seed \(seed): \(failure)")) }
    }

    // MARK: Random states from the operations

    /// One run: replicas writing with sites from a pool, merging, evicting and reaping; every local
    /// operation's `make` is checked (with the replica's pending delta, without it, and with a stale
    /// delta of another replica), and every state's encoding.
    struct Run {
        var replicas: [DocumentState]
        var pending: [StateDelta?]
        var sites: [SiteID]
        var keys: [String]
        var millis: UInt64
        var logical: UInt16 = 0
        var deltas: [StateDelta] = []
        var tally = Tally()
        let label: String

        init(_ random: inout SeededRandom, label: String) {
            self.label = label
            let siteCount = [1, 1, 2, 2, 3, 3, 4, 16, 17, 18, 40].randomElement(using: &random)!
            self.sites = ReviewThirtyFiveEncodingTests.distinctSites(siteCount, using: &random)
            var keys = [ReviewThirtyFiveEncodingTests.nfc, ReviewThirtyFiveEncodingTests.nfd]
            for _ in 0..<Int.random(in: 2...6, using: &random) {
                keys.append(ReviewThirtyFiveEncodingTests.keyPool.randomElement(using: &random)!)
            }
            self.keys = keys
            // Times of today, times at or above 2⁶² (no compact delta), or small ones.
            millis = [1_764_590_000_000, 1 << 46, 1 << 47 - 1000, 1].randomElement(using: &random)!
            replicas = Array(repeating: DocumentState(), count: Int.random(in: 2...4, using: &random))
            pending = Array(repeating: nil, count: replicas.count)
        }

        /// A stamp above every stamp of the run (a clock never goes back): a whole millisecond on,
        /// or a logical tick. (A site writing again with the stamp of its own remove leaves `adds`
        /// naming a covered write, which decoding drops: a state no clock makes, and no part of
        /// this review.)
        mutating func stamp(_ random: inout SeededRandom) -> Stamp {
            if Bool.random(using: &random) {
                millis += UInt64.random(in: 1...2, using: &random)
                logical = 0
            } else {
                logical += 1
            }
            return Stamp(
                time: HLCTimestamp(millis: millis, logical: logical), site: sites.randomElement(using: &random)!)
        }

        func path(_ random: inout SeededRandom) -> FieldPath {
            let depth = [1, 1, 1, 2, 2, 3, 4].randomElement(using: &random)!
            return FieldPath(components: (0..<depth).map { _ in .key(keys.randomElement(using: &random)!) })
        }

        func value(_ random: inout SeededRandom, depth: Int = 0) -> Value {
            if depth < 2, Int.random(in: 0..<4, using: &random) == 0 {
                var map = UTF8Map<Value>()
                for _ in 0..<Int.random(in: 0...3, using: &random) {
                    map[keys.randomElement(using: &random)!] = value(&random, depth: depth + 1)
                }
                return .map(map)
            }
            return ReviewThirtyFiveEncodingTests.leafValues.randomElement(using: &random)!
        }

        mutating func play(_ random: inout SeededRandom, steps: Int) {
            for step in 0..<steps {
                let r = Int.random(in: 0..<replicas.count, using: &random)
                let old = replicas[r]
                var local = true
                var what = ""
                let roll = Int.random(in: 0..<100, using: &random)
                switch roll {
                case 0..<30:
                    let (p, v, s) = (path(&random), value(&random), stamp(&random))
                    what = "set \(p) = \(v) at \(s)"
                    try? replicas[r].set(p, to: v, stamp: s)
                case 30..<38:
                    var fields = UTF8Map<Value>()
                    for _ in 0..<Int.random(in: 1...3, using: &random) {
                        fields[keys.randomElement(using: &random)!] = value(&random)
                    }
                    let s = stamp(&random)
                    what = "upsert \(fields) at \(s)"
                    replicas[r].merge(fields: fields, stamp: s)
                case 38..<50:
                    let (p, s) = (path(&random), stamp(&random))
                    what = "unset \(p) at \(s)"
                    _ = try? replicas[r].unset(p, stamp: s)
                case 50..<64:
                    let (p, s) = (path(&random), stamp(&random))
                    let amount = ReviewThirtyFiveEncodingTests.amounts.randomElement(using: &random)!
                    what = "increment \(p) by \(amount) at \(s)"
                    try? replicas[r].increment(p, by: amount, stamp: s)
                case 64..<68:
                    let p = path(&random)
                    let site = sites.randomElement(using: &random)!
                    let v = ReviewThirtyFiveEncodingTests.leafValues.randomElement(using: &random)!
                    what = "default \(p) = \(v) by \(site)"
                    if replicas[r].admitsDefaultData(at: p, site: site) {
                        try? replicas[r].set(p, to: v, stamp: Stamp(time: .zero, site: site))
                    }
                case 68..<70:
                    let s = stamp(&random)
                    what = "remove at \(s)"
                    replicas[r].remove(stamp: s)
                case 70..<72:
                    let s = stamp(&random)
                    what = "note write at \(s)"
                    replicas[r].noteWrite(s)
                case 72..<86:
                    let o = Int.random(in: 0..<replicas.count, using: &random)
                    let stub = Int.random(in: 0..<4, using: &random) == 0
                    what = "merge replica \(o)\(stub ? "'s stub" : "")"
                    replicas[r].merge(stub ? replicas[o].evictionStub() : replicas[o])
                    local = false
                case 86..<90:
                    what = "evict"
                    replicas[r] = replicas[r].evictionStub()
                    local = false
                default:
                    let horizon = HLCTimestamp(
                        millis: millis - min(millis, UInt64.random(in: 0...6, using: &random)),
                        logical: UInt16.random(in: 0...3, using: &random))
                    what = "reap before \(horizon.rawValue)"
                    replicas[r].reapRemovedFields(before: horizon)
                }
                let new = replicas[r]
                let context = "\(label) step \(step) replica \(r): \(what)"
                ReviewThirtyFiveEncodingTests.checkEncoding(new, decodes: true, &tally, context)
                // The delta of the step whatever it was (make's contract covers every input), with
                // the replica's pending delta, none, and a stale one.
                let made = ReviewThirtyFiveEncodingTests.checkMake(
                    old, new, pending[r], decodes: true, &tally, "\(context), pending")
                _ = ReviewThirtyFiveEncodingTests.checkMake(old, new, nil, decodes: true, &tally, "\(context), none")
                if let stale = deltas.randomElement(using: &random) {
                    _ = ReviewThirtyFiveEncodingTests.checkMake(
                        old, new, stale, decodes: true, &tally, "\(context), stale")
                }
                // Reaped on either side, as a store that reaps as it writes holds them.
                if Int.random(in: 0..<4, using: &random) == 0 {
                    var reaped = new
                    reaped.reapRemovedFields(before: HLCTimestamp(millis: millis + 1, logical: 0))
                    _ = ReviewThirtyFiveEncodingTests.checkMake(
                        old, reaped, pending[r], decodes: true, &tally, "\(context), new reaped")
                    var oldReaped = old
                    oldReaped.reapRemovedFields(before: HLCTimestamp(millis: millis + 1, logical: 0))
                    _ = ReviewThirtyFiveEncodingTests.checkMake(
                        oldReaped, new, pending[r], decodes: true, &tally, "\(context), old reaped")
                }
                if let made {
                    deltas.append(made)
                    if deltas.count > 6 { deltas.removeFirst() }
                }
                pending[r] = local && new != old ? made : (new == old ? pending[r] : nil)
            }
        }
    }

    @Test func operationsGiveTheOldDeltasAndTheReferenceEncoding() async {
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        var random = rng
        var tally = Tally()
        for round in 0..<Self.cases {
            var run = Run(&random, label: "round \(round)")
            run.play(&random, steps: Int.random(in: 8...30, using: &random))
            tally.encoded += run.tally.encoded
            tally.decoded += run.tally.decoded
            tally.deltaCalls += run.tally.deltaCalls
            tally.deltasMade += run.tally.deltasMade
            tally.deltasCarried += run.tally.deltasCarried
            tally.compact += run.tally.compact
            tally.oldForm += run.tally.oldForm
            for failure in run.tally.failures { tally.fail(failure) }
            if round % 16 == 15 { await Task.yield() }
        }
        Self.report(tally, "operations", seed: seed)
        #expect(tally.deltasMade > Self.cases, "deltas were made: \(tally.deltasMade)")
        #expect(tally.deltasCarried > 0 && tally.compact > 0 && tally.oldForm > 0)
    }

    // MARK: Random states built field by field

    /// States built directly (not in normal form, but every site they name in the site table):
    /// entries of every kind, restarts whose `seen` names other sites, totals, removed totals,
    /// contexts (at time zero too), removed defaults, maps four deep.
    struct Raw {
        var sites: [SiteID]
        var keys: [String]
        var times: [HLCTimestamp]
        /// Whether time zero and withheld entries may appear (`make` refuses them).
        var zeroAndWithheld: Bool

        init(_ random: inout SeededRandom) {
            let siteCount = [1, 2, 3, 5, 16, 17, 33, 100].randomElement(using: &random)!
            self.sites = ReviewThirtyFiveEncodingTests.distinctSites(siteCount, using: &random)
            keys = [ReviewThirtyFiveEncodingTests.nfc, ReviewThirtyFiveEncodingTests.nfd]
            for _ in 0..<Int.random(in: 3...10, using: &random) {
                keys.append(ReviewThirtyFiveEncodingTests.keyPool.randomElement(using: &random)!)
            }
            let top: UInt64 = [1_764_590_000_000, 1 << 46, 1 << 47].randomElement(using: &random)!
            times = (0..<6).map { HLCTimestamp(millis: top - UInt64($0) * 3, logical: UInt16($0 % 3)) }
            times.append(HLCTimestamp(rawValue: times[0].rawValue - 1))
            zeroAndWithheld = Int.random(in: 0..<3, using: &random) == 0
        }

        func time(_ random: inout SeededRandom) -> HLCTimestamp {
            zeroAndWithheld && Int.random(in: 0..<6, using: &random) == 0 ? .zero : times.randomElement(using: &random)!
        }

        func site(_ random: inout SeededRandom) -> SiteID { sites.randomElement(using: &random)! }

        func totals(_ random: inout SeededRandom, most: Int) -> [SiteID: CounterTotal] {
            var out: [SiteID: CounterTotal] = [:]
            for _ in 0..<Int.random(in: 0...most, using: &random) {
                let s = site(&random)
                let total: Value = Bool.random(using: &random) ? .int(Int64.random(in: -9...9, using: &random)) : 1.5
                out[s] = CounterTotal(total: total, stamp: Stamp(time: time(&random), site: s))
            }
            return out
        }

        func vector(_ random: inout SeededRandom, most: Int) -> VersionVector {
            var out = VersionVector()
            for _ in 0..<Int.random(in: 0...most, using: &random) { out[site(&random)] = time(&random) }
            return out
        }

        func node(_ random: inout SeededRandom, depth: Int) -> FieldNode {
            var node = FieldNode()
            for _ in 0..<Int.random(in: 0...3, using: &random) {
                let stamp = Stamp(time: time(&random), site: site(&random))
                let content: FieldEntry.Content
                switch Int.random(in: 0..<(zeroAndWithheld ? 7 : 5), using: &random) {
                case 0, 1: content = .value(ReviewThirtyFiveEncodingTests.leafValues.randomElement(using: &random)!)
                case 2: content = .map
                case 3, 4:
                    // The seen totals name sites of the pool, most often others than the writer's.
                    content = .restart(Restart(value: 3, seen: totals(&random, most: 4)))
                case 5: content = .withheldValue
                default: content = .withheldMap
                }
                node.note(FieldEntry(stamp: stamp, content: content))
            }
            if Int.random(in: 0..<3, using: &random) == 0 { node.totals = totals(&random, most: 3) }
            if Int.random(in: 0..<5, using: &random) == 0 { node.removedTotals = totals(&random, most: 2) }
            if Int.random(in: 0..<4, using: &random) == 0 { node.removed = vector(&random, most: 2) }
            if zeroAndWithheld, Int.random(in: 0..<6, using: &random) == 0 { node.removedDefaults = [site(&random)] }
            if depth < 4, Int.random(in: 0..<3, using: &random) == 0 {
                node.map = root(&random, depth: depth + 1, most: 3)
            }
            return node
        }

        func root(_ random: inout SeededRandom, depth: Int, most: Int) -> MapNode {
            var map = MapNode()
            for _ in 0..<Int.random(in: 0...most, using: &random) {
                map[keys.randomElement(using: &random)!] = node(&random, depth: depth)
            }
            return map
        }

        /// A state of `root`; its vectors name random sites, and every site of a removed default
        /// (which no encoder gathers from the field itself).
        func state(_ random: inout SeededRandom, root: MapNode) -> DocumentState {
            // Sometimes a vector naming every site of the pool, each once in the whole state.
            var writes = vector(&random, most: Int.random(in: 0..<4, using: &random) == 0 ? sites.count : 4)
            if writes.isEmpty, Int.random(in: 0..<4, using: &random) != 0 { writes[site(&random)] = times[0] }
            Self.defaultSites(root) { if writes[$0] == nil { writes[$0] = times[0] } }
            let adds = Bool.random(using: &random) ? writes : vector(&random, most: 2)
            return DocumentState(root: root, writes: writes, removed: vector(&random, most: 2), adds: adds)
        }

        static func defaultSites(_ map: MapNode, _ body: (SiteID) -> Void) {
            for node in map.entries.values {
                for s in node.removedDefaults { body(s) }
                defaultSites(node.map, body)
            }
        }

        /// `old` changed: fields kept, dropped, replaced, added.
        func changed(_ old: MapNode, _ random: inout SeededRandom) -> MapNode {
            var map = MapNode()
            for (key, node) in old.entries {
                switch Int.random(in: 0..<10, using: &random) {
                case 0: continue
                case 1, 2: map[key] = self.node(&random, depth: 1)
                default: map[key] = node
                }
            }
            for _ in 0..<Int.random(in: 0...2, using: &random) {
                map[keys.randomElement(using: &random)!] = node(&random, depth: 1)
            }
            return map
        }
    }

    @Test func statesBuiltFieldByFieldGiveTheOldDeltasAndTheReferenceEncoding() {
        let (rng, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: 1...UInt64.max))
        var random = rng
        var tally = Tally()
        for round in 0..<(Self.cases * 4) {
            let raw = Raw(&random)
            let oldRoot = raw.root(&random, depth: 1, most: 6)
            let old = raw.state(&random, root: oldRoot)
            let new = raw.state(&random, root: raw.changed(oldRoot, &random))
            Self.checkEncoding(old, decodes: false, &tally, "raw round \(round) old")
            Self.checkEncoding(new, decodes: false, &tally, "raw round \(round) new")
            // A previous delta whose fields are some of `new`'s (and sometimes one it lacks).
            var previous: StateDelta?
            if Int.random(in: 0..<3, using: &random) != 0 {
                var carried = MapNode()
                for (key, node) in new.root.entries where Int.random(in: 0..<3, using: &random) == 0 {
                    carried[key] = Bool.random(using: &random) ? node : raw.node(&random, depth: 1)
                }
                if Int.random(in: 0..<4, using: &random) == 0 {
                    carried[raw.keys.randomElement(using: &random)!] = raw.node(&random, depth: 1)
                }
                let state = raw.state(&random, root: carried)
                // A base the compact form can hold (within the carried state's context), or any.
                var base = VersionVector()
                if Bool.random(using: &random) {
                    for (site, time) in state.writes where Bool.random(using: &random) { base[site] = time }
                } else {
                    base = raw.vector(&random, most: 3)
                }
                if base.isEmpty, Bool.random(using: &random) { base[raw.site(&random)] = raw.times[3] }
                previous = StateDelta(base: base, state: state, digest: StateDigest(high: 1, low: 2))
            }
            _ = Self.checkMake(old, new, previous, decodes: false, &tally, "raw round \(round)")
            _ = Self.checkMake(old, old, previous, decodes: false, &tally, "raw round \(round), unchanged")
            _ = Self.checkMake(new, old, nil, decodes: false, &tally, "raw round \(round), reversed")
        }
        Self.report(tally, "field by field", seed: seed)
        #expect(tally.deltasMade > Self.cases / 2, "deltas were made: \(tally.deltasMade)")
    }

    // MARK: Chosen cases

    func at(_ millis: UInt64, _ site: SiteID) -> Stamp {
        Stamp(time: HLCTimestamp(millis: millis, logical: 0), site: site)
    }

    func key(_ keys: String...) -> FieldPath { FieldPath(components: keys.map { .key($0) }) }

    /// Every key of the pool at the top, and again four levels down, each holding a value: the
    /// fields are written shortest UTF-8 first, then by bytes, whatever `String` order says.
    @Test func everyKeyOfThePoolAtTheTopAndFourDeepEncodesAsTheReference() throws {
        var state = DocumentState()
        var tally = Tally()
        for (n, key) in Self.keyPool.enumerated() {
            try state.set(self.key(key), to: .int(Int64(n)), stamp: at(1000 + UInt64(n), 1))
            try state.set(self.key("deep", Self.nfd, "", key), to: .string(key), stamp: at(2000 + UInt64(n), 2))
        }
        #expect(state.root.entries.count == Self.keyPool.count + 1)
        Self.checkEncoding(state, decodes: true, &tally, "every key")
        // Keys of every length from 0 to 300 bytes, one to four bytes a scalar.
        var long = DocumentState()
        for length in 0...300 {
            let scalar = ["k", "\u{E9}", "\u{20AC}", "\u{1F600}"][length % 4]
            let text = String(repeating: scalar, count: length / scalar.utf8.count)
            try long.set(self.key("m", text + "\(length % 4)"), to: .int(Int64(length)), stamp: at(3000, 3))
        }
        Self.checkEncoding(long, decodes: true, &tally, "every length")
        for failure in tally.failures { Issue.record(Comment(rawValue: failure)) }
    }

    /// Site tables of 0, 1, 16, 17, 18 and 100 sites, ascending as unsigned integers (0 first,
    /// `UInt64.max` last), looked up for each member and for sites they lack.
    @Test func siteSetsAndTheLayoutsBinarySearch() {
        var random = SeededRandom(seed: 35)
        for count in [0, 1, 2, 15, 16, 17, 18, 33, 100] {
            var set = SiteSet()
            var expected = Set<SiteID>()
            var pool = Self.edgeSites
            while pool.count < count { pool.append(UInt64.random(in: 0...UInt64.max, using: &random)) }
            pool = Array(pool.shuffled(using: &random).prefix(count))
            // Each site once (so a site lost where the list turns into a set is not put back), then
            // all again.
            for site in pool { set.insert(site) }
            #expect(set.sorted() == Set(pool).sorted(), "\(count) sites, each inserted once")
            for site in pool.shuffled(using: &random) + pool {
                set.insert(site)
                expected.insert(site)
            }
            let table = set.sorted()
            #expect(table == expected.sorted(), "\(count) sites")
            let layout = StateLayout(table: table, reference: nil)
            for (i, site) in table.enumerated() { #expect(layout[site] == Int64(i)) }
            for site in Self.edgeSites + [UInt64.max / 2, 12345] where !expected.contains(site) {
                #expect(layout[site] == nil, "\(site) among \(count) sites")
            }
        }
    }

    /// A restart whose `seen` names 17 and 100 sites, the writer's site 0 or `UInt64.max`, totals
    /// of every site, and one-entry vectors: encodings and deltas as before.
    @Test func manySitesAtTheEdgesInCountersAndRestarts() throws {
        var tally = Tally()
        for (sites, writer) in [(17, SiteID(0)), (100, UInt64.max), (16, UInt64(Int64.max) + 1), (1, 0)] {
            var state = DocumentState()
            try state.set(key("n"), to: 1, stamp: at(1000, writer))
            let base = state
            for i in 0..<sites {
                var other = base
                let site = UInt64.max &- UInt64(i) &* 0x0101_0101_0101_0101
                try other.increment(key("n"), by: .int(Int64(i)), stamp: at(1001 + UInt64(i), site))
                try other.increment(key("m", "\u{1F600}"), by: 1, stamp: at(1001 + UInt64(i), site))
                state.merge(other)
            }
            Self.checkEncoding(state, decodes: true, &tally, "\(sites) sites before the restart")
            let old = state
            try state.set(key("n"), to: 7, stamp: at(5000, writer))  // a restart that saw every total
            Self.checkEncoding(state, decodes: true, &tally, "\(sites) sites, restarted")
            let d = Self.checkMake(old, state, nil, decodes: true, &tally, "\(sites) sites, the restart")
            #expect(d != nil)
            let older = state
            _ = try state.unset(key("m", "\u{1F600}"), stamp: at(5001, writer))
            _ = Self.checkMake(older, state, d, decodes: true, &tally, "\(sites) sites, an unset after it")
            var reaped = state
            reaped.reapRemovedFields(before: HLCTimestamp(millis: 6000, logical: 0))
            Self.checkEncoding(reaped, decodes: true, &tally, "\(sites) sites, reaped")
            _ = Self.checkMake(older, reaped, d, decodes: true, &tally, "\(sites) sites, reaped")
            Self.checkEncoding(state.evictionStub(), decodes: true, &tally, "\(sites) sites, stub")
        }
        for failure in tally.failures { Issue.record(Comment(rawValue: failure)) }
    }

    /// Deltas where keys are canonically equivalent but not byte-equal: a previous delta carrying
    /// "é" (U+00E9) while `new` holds only "e" + U+0301, and the other way round; a field gone by
    /// reaping; a stub nested below the root; default data. `make` answers as before each time.
    @Test func deltasOverCanonicallyEquivalentKeysStubsAndDefaults() throws {
        var tally = Tally()
        let (nfc, nfd) = (Self.nfc, Self.nfd)
        for (carriedKey, heldKey) in [(nfc, nfd), (nfd, nfc), (nfc, nfc), ("", nfd), ("\u{212B}", "\u{C5}")] {
            var old = DocumentState()
            try old.set(key(heldKey), to: 1, stamp: at(1000, 1))
            try old.set(key(carriedKey), to: 2, stamp: at(1001, 1))
            var mid = old
            try mid.set(key(carriedKey), to: 3, stamp: at(1002, 1))
            let first = Self.checkMake(old, mid, nil, decodes: true, &tally, "carried \(carriedKey.unicodeScalars)")
            #expect(first != nil)
            // The carried field is gone from `new`: both say no delta.
            var new = mid
            _ = try new.unset(key(carriedKey), stamp: at(1003, 1))
            new.reapRemovedFields(before: HLCTimestamp(millis: 2000, logical: 0))
            _ = Self.checkMake(mid, new, first, decodes: true, &tally, "carried \(carriedKey.unicodeScalars) gone")
            // Or kept, and another field changed.
            var kept = mid
            try kept.set(key(heldKey), to: 4, stamp: at(1004, 1))
            _ = Self.checkMake(mid, kept, first, decodes: true, &tally, "carried \(carriedKey.unicodeScalars) kept")
        }
        // A stub nested below the root, on either side; default data.
        var doc = DocumentState()
        try doc.set(key("a", "b", "c"), to: ["d": 1], stamp: at(1000, 1))
        var other = DocumentState()
        try other.set(key("z"), to: 1, stamp: at(1001, 2))
        var withStub = other
        withStub.merge(doc.evictionStub())
        var after = withStub
        try after.set(key("z"), to: 2, stamp: at(1002, 2))
        _ = Self.checkMake(withStub, after, nil, decodes: true, &tally, "a stub below the root")
        var restored = after
        restored.merge(doc)
        _ = Self.checkMake(after, restored, nil, decodes: true, &tally, "a stub restored")
        var defaults = DocumentState()
        try defaults.set(key("x"), to: 1, stamp: at(1000, 1))
        var withDefault = defaults
        #expect(withDefault.admitsDefaultData(at: key("y"), site: 1))
        try withDefault.set(key("y"), to: 5, stamp: Stamp(time: .zero, site: 1))
        _ = Self.checkMake(defaults, withDefault, nil, decodes: true, &tally, "default data")
        var removedDefault = withDefault
        _ = try removedDefault.unset(key("y"), stamp: at(1001, 1))
        Self.checkEncoding(removedDefault, decodes: true, &tally, "a removed default")
        _ = Self.checkMake(withDefault, removedDefault, nil, decodes: true, &tally, "a removed default")
        removedDefault.reapRemovedFields(before: HLCTimestamp(millis: 2000, logical: 0))
        Self.checkEncoding(removedDefault, decodes: true, &tally, "a removed default, reaped")
        for failure in tally.failures { Issue.record(Comment(rawValue: failure)) }
        #expect(tally.deltasMade >= 8)
    }
}

// MARK: - The implementation before review 35's commits (64c39a9^)

extension StateDelta {
    /// `StateDelta.make` as of 64c39a9^, verbatim but for the names of the checks it calls.
    static func review35OldMake(
        from old: DocumentState, to new: DocumentState, previous: StateDelta?, digest: StateDigest
    )
        -> StateDelta?
    {
        guard !old.writes.isEmpty, !new.isDeleted, !old.review35OldHoldsTimeZero, !new.review35OldHoldsTimeZero,
            old.review35OldWithheldEntryCount == 0, new.review35OldWithheldEntryCount == 0
        else { return nil }
        let base = previous?.base ?? old.writes.joined(old.removed)
        guard !base.isEmpty, !base.values.contains(.zero) else { return nil }
        for key in old.root.entries.keys where new.root[key] == nil { return nil }
        if let previous { for key in previous.state.root.entries.keys where new.root[key] == nil { return nil } }
        var root = MapNode()
        for (key, node) in new.root.entries where old.root[key] != node || previous?.state.root[key] != nil {
            root[key] = node
        }
        var state = DocumentState(root: root, writes: new.writes, removed: new.removed, adds: new.adds)
        if let previous { state.merge(previous.state) }
        return StateDelta(base: base, state: state, digest: digest)
    }
}

extension DocumentState {
    /// `holdsTimeZero` as of 64c39a9^.
    var review35OldHoldsTimeZero: Bool {
        writes.values.contains(.zero) || removed.values.contains(.zero) || adds.values.contains(.zero)
            || root.entries.values.contains { $0.review35OldHoldsTimeZero }
    }

    /// `withheldEntryCount` as of 64c39a9^.
    var review35OldWithheldEntryCount: Int {
        root.entries.values.reduce(0) { $0 + $1.review35OldWithheldEntryCount }
    }
}

extension FieldNode {
    var review35OldHoldsTimeZero: Bool {
        entries.contains { $0.stamp.time == .zero } || totals.values.contains { $0.stamp.time == .zero }
            || removedTotals.values.contains { $0.stamp.time == .zero } || removed.values.contains(.zero)
            || !removedDefaults.isEmpty
            || map.entries.values.contains { $0.review35OldHoldsTimeZero }
    }

    var review35OldWithheldEntryCount: Int {
        entries.reduce(0) { count, entry in entry.isWithheld ? count + 1 : count }
            + map.entries.values.reduce(0) { $0 + $1.review35OldWithheldEntryCount }
    }
}

// MARK: - A reference for the whole-state and the compact delta forms

/// Encodings built as `Value` trees (CBOR.encode sorts their keys), written from docs/PROTOCOL.md
/// §3 apart from the direct encoder: the whole state (version 2), and the compact delta, whose
/// times are differences below the reference time and whose state has no "v" and leaves "a" out
/// when it equals "w" (writing it even empty otherwise).
enum Review35Reference {
    /// The state's value and its site table; with `compactBelow`, the compact delta's state.
    static func state(_ s: DocumentState, compactBelow reference: HLCTimestamp?) -> (value: Value, table: [SiteID]) {
        var sites = Set<SiteID>()
        for site in s.writes.keys { sites.insert(site) }
        for site in s.removed.keys { sites.insert(site) }
        for site in s.adds.keys { sites.insert(site) }
        gather(s.root, into: &sites)
        let table = sites.sorted()
        var index: [SiteID: Int64] = [:]
        for (i, site) in table.enumerated() { index[site] = Int64(i) }
        let time: (HLCTimestamp) -> Value = { t in
            guard let reference else { return .int(Int64(bitPattern: t.rawValue)) }
            guard t <= reference else { return .int(-1) }
            let d = reference.rawValue - t.rawValue
            return .int(Int64(bitPattern: d % 65536 == 0 ? d / 65536 * 2 : d * 2 + 1))
        }
        let coder = Coder(index: index, time: time)
        var out: UTF8Map<Value> = [
            "s": .array(table.map { .int(Int64(bitPattern: $0)) }),
            "w": coder.vector(s.writes),
        ]
        if reference == nil {
            out["v"] = 2
            if !s.adds.isEmpty { out["a"] = coder.vector(s.adds) }
        } else if s.adds != s.writes {
            out["a"] = coder.vector(s.adds)
        }
        if !s.removed.isEmpty { out["r"] = coder.vector(s.removed) }
        if !s.root.entries.isEmpty { out["m"] = coder.map(s.root) }
        return (.map(out), table)
    }

    /// The delta's bytes, and whether they are in the compact form; `compact: false` asks for the
    /// old form.
    static func delta(_ d: StateDelta, compact: Bool = true) -> ([UInt8], Bool) {
        var context = d.state.writes
        for (site, time) in d.state.removed where (context[site] ?? .zero) < time { context[site] = time }
        if compact, let reference = context.values.max(), reference.rawValue < 1 << 62, !d.base.isEmpty,
            d.base.allSatisfy({ $0.value != .zero && (context[$0.key] ?? .zero) >= $0.value })
        {
            let (value, table) = state(d.state, compactBelow: reference)
            let position = { (site: SiteID) in Int64(table.firstIndex(of: site)!) }
            let base: [Value] = d.base.map { (position($0.key), $0.value) }.sorted { $0.0 < $1.0 }.map {
                let t = reference.rawValue - $0.1.rawValue
                return .array([.int($0.0), .int(Int64(bitPattern: t % 65536 == 0 ? t / 65536 * 2 : t * 2 + 1))])
            }
            return (
                CBOR.encode(
                    .array([.int(Int64(bitPattern: reference.rawValue)), .array(base), value, .bytes(d.digest.bytes)])),
                true
            )
        }
        let base: [Value] = d.base.sorted { $0.key < $1.key }.map {
            .array([.int(Int64(bitPattern: $0.key)), .int(Int64(bitPattern: $0.value.rawValue))])
        }
        let whole: UTF8Map<Value> = [
            "b": .array(base), "d": state(d.state, compactBelow: nil).value, "h": .bytes(d.digest.bytes),
        ]
        return (CBOR.encode(.map(whole)), false)
    }

    static func gather(_ map: MapNode, into sites: inout Set<SiteID>) {
        for node in map.entries.values {
            for entry in node.entries {
                sites.insert(entry.stamp.site)
                if case .restart(let r) = entry.content { sites.formUnion(r.seen.keys) }
            }
            sites.formUnion(node.totals.keys)
            sites.formUnion(node.removedTotals.keys)
            sites.formUnion(node.removed.keys)
            gather(node.map, into: &sites)
        }
    }

    struct Coder {
        let index: [SiteID: Int64]
        let time: (HLCTimestamp) -> Value

        func vector(_ vv: VersionVector) -> Value {
            .array(
                vv.map { (index[$0.key]!, $0.value) }.sorted { $0.0 < $1.0 }.map { .array([.int($0.0), time($0.1)]) })
        }

        func totals(_ totals: [SiteID: CounterTotal]) -> Value {
            .array(
                totals.map { (index[$0.key]!, $0.value) }.sorted { $0.0 < $1.0 }.map {
                    .array([.int($0.0), time($0.1.stamp.time), $0.1.total])
                })
        }

        func map(_ map: MapNode) -> Value {
            var out = UTF8Map<Value>()
            for (key, node) in map.entries {
                var lists: [String: [(Int64, UInt64, Value)]] = [:]
                for entry in node.entries {
                    let i = index[entry.stamp.site]!
                    let head: [Value] = [.int(i), time(entry.stamp.time)]
                    let (name, row): (String, [Value])
                    switch entry.content {
                    case .value(let v): (name, row) = ("e", head + [v])
                    case .map: (name, row) = ("p", head)
                    case .withheldValue: (name, row) = ("h", head + [0])
                    case .withheldMap: (name, row) = ("h", head + [1])
                    case .restart(let r): (name, row) = ("b", head + [r.value, totals(r.seen)])
                    }
                    lists[name, default: []].append((i, entry.stamp.time.rawValue, .array(row)))
                }
                var field = UTF8Map<Value>()
                for (name, list) in lists {
                    field[name] = .array(list.sorted { $0.0 != $1.0 ? $0.0 < $1.0 : $0.1 < $1.1 }.map(\.2))
                }
                if !node.map.entries.isEmpty { field["m"] = self.map(node.map) }
                if !node.totals.isEmpty { field["t"] = totals(node.totals) }
                if !node.removedTotals.isEmpty { field["o"] = totals(node.removedTotals) }
                if !node.removed.isEmpty { field["x"] = vector(node.removed) }
                if !node.removedDefaults.isEmpty {
                    field["z"] = .array(node.removedDefaults.map { index[$0]! }.sorted().map { .int($0) })
                }
                out[key] = .map(field)
            }
            return .map(out)
        }
    }
}
