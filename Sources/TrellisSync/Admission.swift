import Dispatch
import Foundation
import Synchronization
import TrellisCore
public import TrellisNet

/// Which authenticated peers may have a session with a node (docs/SECURITY.md, "Admission").
/// Every mode admits only holders of the mesh key (the handshake sees to that); the mode decides
/// among them, and a ``ConnectionRequestHandler`` may then refuse more.
public enum AdmissionMode: Sendable, Equatable, CustomStringConvertible {
    /// Any holder of the mesh key (the default).
    case meshKey
    /// Only these peer keys (32 bytes each).
    case allowlist(Set<[UInt8]>)
    /// Trust on first use: the first key seen with a device name is pinned to that name, as SSH's
    /// `known_hosts` pins a host's key; a later peer presenting the name with another key is
    /// refused. A peer advertising no name is admitted only when its key was trusted by key.
    case trustOnFirstUse

    /// `any`, `allowlist` or `tofu`, as `--admission` spells them.
    public var description: String {
        switch self {
        case .meshKey: return "any"
        case .allowlist: return "allowlist"
        case .trustOnFirstUse: return "tofu"
        }
    }
}

/// A peer key pinned to a device name under trust on first use, or trusted by key alone
/// (``name`` `nil`: `trust KEY` for a peer whose name was not known).
public struct PeerPin: Sendable, Hashable {
    /// The device name, or `nil` for a key trusted whatever name it advertises.
    public var name: String?
    /// The 32-byte peer key.
    public var peerKey: [UInt8]

    public init(name: String?, peerKey: [UInt8]) {
        self.name = name
        self.peerKey = peerKey
    }
}

/// The lines of a pins file that hold something, with their 0-based index: LF or CRLF line ends;
/// blank lines and lines starting with `#` are left out (``PinFile``, ``SitePinFile``).
func contentLines(of text: String) -> [(index: Int, line: Substring)] {
    text.split(separator: "\n", omittingEmptySubsequences: false).enumerated().compactMap { index, raw in
        let line = raw.hasSuffix("\r") ? raw.dropLast() : raw
        return line.allSatisfy({ $0 == " " || $0 == "\t" }) || line.hasPrefix("#") ? nil : (index, line)
    }
}

/// The pins file (`DIR/known-peers`): one pin a line, `KEY NAME` (64 hex digits, one space, the
/// device name) or `KEY` alone for a key trusted by key; blank lines and lines starting with `#`
/// are ignored.
public enum PinFile {
    /// Largest pins file read, bytes.
    public static let maxBytes = 1 << 20

    /// Reads a pins file's text.
    ///
    /// - Parameters:
    ///   - text: the file's content.
    ///   - path: the file, for messages.
    /// - Returns: the pins in file order.
    /// - Throws: ``DeviceNameError`` naming the path and line of a bad key, a bad name, or a name
    ///   pinned twice.
    /// - Complexity: O(n) in the text's length.
    public static func parse(_ text: String, path: String) throws(DeviceNameError) -> [PeerPin] {
        var pins: [PeerPin] = []
        var names = Set<String>()
        for (index, line) in contentLines(of: text) {
            let keyText = line.prefix { $0 != " " }
            func bad(_ problem: String) -> DeviceNameError {
                DeviceNameError(
                    "\(path) line \(index + 1): \(problem) (each line is `KEY NAME`: 64 hex digits, a space, the device name)"
                )
            }
            guard let key = peerKey(hex: String(keyText)) else { throw bad("'\(keyText)' is not a peer key") }
            var name: String?
            if keyText.endIndex < line.endIndex {
                let text = String(line[line.index(after: keyText.endIndex)...])
                do { try DeviceName.check(text) } catch { throw bad("\(error)") }
                guard names.insert(text).inserted else { throw bad("'\(text)' is pinned twice") }
                name = text
            }
            pins.append(PeerPin(name: name, peerKey: key))
        }
        return pins
    }

    /// The pins file's text for `pins`, with a comment saying what it is.
    public static func render(_ pins: [PeerPin]) -> String {
        var text =
            "# Trellis trust on first use: peer keys pinned to device names (KEY NAME), or trusted by key (KEY).\n"
        for pin in pins { text += PeerInfo.hex(pin.peerKey) + (pin.name.map { " " + $0 } ?? "") + "\n" }
        return text
    }

    /// A peer key from 64 hex digits (either case), or `nil`.
    public static func peerKey(hex text: String) -> [UInt8]? { Authorization.peerKey(hex: text) }
}

/// An authenticated peer asking for a session, as a ``ConnectionRequestHandler`` sees it (Ditto's
/// `DittoConnectionRequest`).
public struct ConnectionRequest: Sendable, Equatable {
    /// Who dialed.
    public enum Direction: String, Sendable {
        /// The peer dialed this node.
        case inbound
        /// This node dialed the peer.
        case outbound
    }

    /// The peer's key (32 bytes), authenticated by the handshake.
    public var peerKey: [UInt8]
    /// The peer's address as this node sees it (`host:port`).
    public var address: String
    /// The device name the peer advertised inside the handshake (encrypted, bounded, checked:
    /// ``DeviceName``), or `nil`.
    public var deviceName: String?
    /// Who dialed.
    public var direction: Direction

    public init(peerKey: [UInt8], address: String, deviceName: String?, direction: Direction) {
        self.peerKey = peerKey
        self.address = address
        self.deviceName = deviceName
        self.direction = direction
    }

    /// ``peerKey`` as 64 lowercase hex digits.
    public var peerKeyHex: String { PeerInfo.hex(peerKey) }

    /// `KEY16 "NAME" at ADDRESS`, for logs.
    var summary: String {
        "peer \(peerKeyHex)\(deviceName.map { " (\"\($0)\")" } ?? "") at \(address)"
    }
}

/// What a ``ConnectionRequestHandler`` answers.
public enum ConnectionDecision: Sendable, Equatable {
    /// The peer gets a session.
    case allow
    /// The connection is closed before any message.
    case deny
}

/// Decides whether an authenticated peer that the ``AdmissionMode`` admitted gets a session
/// (Ditto's `presence.connectionRequestHandler`). Called once per connection after the handshake
/// and before any message is read or sent; it must answer within the node's decision timeout
/// (``AdmissionPolicy/decisionTimeout``), or the connection is denied. It runs as a task of its
/// own: a handler that never answers costs one pending place until the timeout, never the
/// node's I/O or other peers' handshakes.
public typealias ConnectionRequestHandler = @Sendable (ConnectionRequest) async -> ConnectionDecision

/// A connection waiting for a decision (`peers --pending`).
public struct PendingConnection: Sendable, Equatable {
    /// Who is to answer.
    public enum Awaiting: String, Sendable {
        /// The connection-request handler.
        case handler
        /// The user's ``TrellisNode``'s `trust` (a peer the mode refused, parked).
        case user
    }

    /// The peer asking.
    public var request: ConnectionRequest
    /// Who is to answer.
    public var awaiting: Awaiting
    /// Seconds left before the connection is denied.
    public var secondsLeft: Double
}

/// Limits and timing of admission decisions.
public struct AdmissionPolicy: Sendable, Equatable {
    /// How long a connection may wait for a decision before it is denied (the handler's answer, or
    /// the user's `trust`): 5 s by default, at most 60 s. A peer that dialed gives up on a silent
    /// session after 15 s (the liveness timeout), so longer waits gain nothing.
    public var decisionTimeout: Duration = .seconds(5)
    /// Connections waiting for a decision at once (each holds one thread and one socket); more are
    /// denied at once.
    public var maxPending = 16
    /// Whether a peer the mode refuses (not on the allowlist; a changed key under trust on first
    /// use) waits as pending for ``decisionTimeout`` so a user can `trust` it, instead of being
    /// refused at once (`trellis shell` sets it).
    public var parkRefused = false

    public init() {}
}

/// The admission state of a node: the mode, the pins, the handler, the connections waiting.
/// Thread-safe; ``decide(_:)`` blocks its caller (a handshake thread) while a decision is pending.
final class Admission: Sendable {
    private struct State {
        var mode: AdmissionMode = .meshKey
        var pins: [PeerPin] = []
        var handler: ConnectionRequestHandler?
        var policy = AdmissionPolicy()
        var pending: [UInt64: Pending] = [:]
        var nextID: UInt64 = 0
        /// Names last seen with keys (admitted or refused), newest last, at most ``rememberedNames``.
        var seen: [(key: [UInt8], name: String?, address: String)] = []
    }

    /// One connection waiting. Its handshake thread waits on `wakeup` and runs the handler's jobs
    /// itself (``HandlerExecutor``), so a handler needs no thread of the cooperative pool and one
    /// that never answers holds only this connection's thread until the deadline.
    final class Pending: Sendable {
        let request: ConnectionRequest
        let awaiting: PendingConnection.Awaiting
        let deadline: ContinuousClock.Instant
        let decision = Mutex<ConnectionDecision?>(nil)
        let executor: HandlerExecutor
        /// The handler's task, owned here: cancelled when the wait ends.
        let task = Mutex<Task<Void, Never>?>(nil)

        init(request: ConnectionRequest, awaiting: PendingConnection.Awaiting, deadline: ContinuousClock.Instant) {
            self.request = request
            self.awaiting = awaiting
            self.deadline = deadline
            self.executor = HandlerExecutor()
        }

        /// Why a denial was given, for the log.
        let denial = Mutex<String?>(nil)

        /// Answers once; later answers are ignored.
        ///
        /// - Parameters:
        ///   - answer: the decision.
        ///   - reason: for a denial, who denied it, for the log.
        func resolve(_ answer: ConnectionDecision, _ reason: String) {
            let first = decision.withLock { current in
                guard current == nil else { return false }
                current = answer
                return true
            }
            guard first else { return }
            denial.withLock { $0 = reason }
            executor.wakeup.signal()
        }

        /// Runs the handler's jobs on the calling thread until an answer or the deadline.
        ///
        /// - Returns: whether an answer came in time.
        func waitForAnswer() -> Bool {
            while decision.withLock({ $0 == nil }) {
                let left = deadline - .now
                guard left > .zero else { break }
                let nanoseconds = left.components.seconds * 1_000_000_000 + left.components.attoseconds / 1_000_000_000
                if executor.wakeup.wait(timeout: .now() + .nanoseconds(Int(min(nanoseconds, Int64(Int.max)))))
                    == .timedOut
                {
                    break
                }
                executor.runQueued()
            }
            executor.detach()
            return decision.withLock { $0 != nil } && ContinuousClock.now <= deadline
        }
    }

    /// Peers remembered by name for `trust NAME` and `distrust NAME`.
    static let rememberedNames = 256

    private let state = Mutex(State())
    /// Where the pins are written (``PinFile``); `nil` keeps them in memory only.
    let savePins: (@Sendable ([PeerPin]) throws -> Void)?
    /// The pins file's path, for messages.
    let pinsPath: String
    let log: @Sendable (String) -> Void

    init(
        pins: [PeerPin], pinsPath: String, savePins: (@Sendable ([PeerPin]) throws -> Void)?,
        log: @escaping @Sendable (String) -> Void
    ) {
        self.pinsPath = pinsPath
        self.savePins = savePins
        self.log = log
        state.withLock { $0.pins = pins }
    }

    var mode: AdmissionMode {
        get { state.withLock { $0.mode } }
        set { state.withLock { $0.mode = newValue } }
    }

    var policy: AdmissionPolicy {
        get { state.withLock { $0.policy } }
        set {
            var policy = newValue
            policy.decisionTimeout = max(.zero, min(policy.decisionTimeout, .seconds(60)))
            policy.maxPending = max(0, policy.maxPending)
            state.withLock { $0.policy = policy }
        }
    }

    var pins: [PeerPin] { state.withLock { $0.pins } }

    func setHandler(_ handler: ConnectionRequestHandler?) { state.withLock { $0.handler = handler } }

    var handler: ConnectionRequestHandler? { state.withLock { $0.handler } }

    var pending: [PendingConnection] {
        let now = ContinuousClock.now
        return state.withLock { state in
            state.pending.keys.sorted().compactMap { id in
                let entry = state.pending[id]!
                let left = entry.deadline - now
                return PendingConnection(
                    request: entry.request, awaiting: entry.awaiting,
                    secondsLeft: max(0, Double(left.components.seconds) + Double(left.components.attoseconds) / 1e18))
            }
        }
    }

    /// What the mode says about a request: admitted, or refused with the log line.
    private enum Verdict {
        case allow
        /// Refused; `parkable` when the user may still `trust` the peer.
        case refuse(String, parkable: Bool)
    }

    /// Decides whether `request` gets a session: the mode first, then the handler (waiting at most
    /// the decision timeout), and for a refusal the user when ``AdmissionPolicy/parkRefused``.
    /// Blocks the calling thread while the decision is pending.
    ///
    /// - Returns: the decision; a refusal has been logged through `logRefusal`.
    func decide(_ request: ConnectionRequest, logRefusal: (String) -> Void) -> ConnectionDecision {
        let (verdict, handler, policy) = state.withLock {
            state -> (Verdict, ConnectionRequestHandler?, AdmissionPolicy) in
            remember(request, in: &state)
            return (self.verdict(request, &state, pinning: false), state.handler, state.policy)
        }
        var answer = ConnectionDecision.allow
        if case .refuse(let line, let parkable) = verdict {
            guard parkable, policy.parkRefused else {
                logRefusal(line)
                return .deny
            }
            log("\(line); waiting \(policy.decisionTimeout) for `trust \(request.peerKeyHex)`")
            answer = wait(request, awaiting: .user, policy: policy, handler: nil, logRefusal: logRefusal)
        }
        if answer == .allow, let handler {
            answer = wait(request, awaiting: .handler, policy: policy, handler: handler, logRefusal: logRefusal)
        }
        guard answer == .allow else { return .deny }
        // Admitted: now pin a new name (unless another key took it meanwhile, or the mode changed).
        let final = state.withLock { state in self.verdict(request, &state, pinning: true) }
        guard case .refuse(let line, _) = final else { return .allow }
        logRefusal(line)
        return .deny
    }

    /// Lists `request` as pending and waits for its answer (the handler's when given, else
    /// ``trust(peerKey:)``/``distrust(peerKey:)``) until the decision timeout.
    private func wait(
        _ request: ConnectionRequest, awaiting: PendingConnection.Awaiting, policy: AdmissionPolicy,
        handler: ConnectionRequestHandler?,
        logRefusal: (String) -> Void
    ) -> ConnectionDecision {
        let entry = Pending(request: request, awaiting: awaiting, deadline: .now + policy.decisionTimeout)
        let id = state.withLock { state -> UInt64? in
            guard state.pending.count < policy.maxPending else { return nil }
            state.nextID += 1
            state.pending[state.nextID] = entry
            return state.nextID
        }
        guard let id else {
            logRefusal("refused \(request.summary): \(policy.maxPending) connections already wait for a decision")
            return .deny
        }
        if let handler {
            entry.task.withLock {
                $0 = Task(executorPreference: entry.executor) {
                    let answer = await handler(request)
                    entry.resolve(answer, "denied by the connection-request handler")
                }
            }
        }
        let answered = entry.waitForAnswer()
        if !answered {
            // Too late, or no answer: denied, whatever the handler says later.
            entry.decision.withLock { $0 = .deny }
        }
        entry.task.withLock { $0?.cancel() }
        state.withLock { _ = $0.pending.removeValue(forKey: id) }
        let answer = entry.decision.withLock { $0 } ?? .deny
        if !answered {
            let who = awaiting == .user ? "nobody trusted it" : "the connection-request handler did not answer"
            logRefusal("refused \(request.summary): \(who) within \(policy.decisionTimeout)")
        } else if answer == .deny {
            logRefusal("refused \(request.summary): \(entry.denial.withLock { $0 } ?? "denied")")
        }
        return answer
    }

    private func remember(_ request: ConnectionRequest, in state: inout State) {
        state.seen.removeAll { $0.key == request.peerKey }
        state.seen.append((request.peerKey, request.deviceName, request.address))
        if state.seen.count > Self.rememberedNames { state.seen.removeFirst(state.seen.count - Self.rememberedNames) }
    }

    /// The mode's verdict. Under trust on first use a name not pinned yet is admitted, and pinned
    /// (and saved) only when `pinning`: once the whole decision admitted the peer, so a peer the
    /// handler denies claims no name.
    private func verdict(_ request: ConnectionRequest, _ state: inout State, pinning: Bool) -> Verdict {
        let key = request.peerKey
        let hex = request.peerKeyHex
        switch state.mode {
        case .meshKey:
            return .allow
        case .allowlist(let keys):
            if keys.contains(key) { return .allow }
            return .refuse(
                "refused \(request.summary): not on the allowlist (admit it with `trust \(hex)` in the shell or "
                    + "--allow-peer \(hex))", parkable: true)
        case .trustOnFirstUse:
            if state.pins.contains(where: { $0.name == nil && $0.peerKey == key }) { return .allow }
            guard let name = request.deviceName else {
                return .refuse(
                    "refused \(request.summary): it advertises no device name, and trust on first use pins keys to "
                        + "names (give it one with --name, or trust its key with `trust \(hex)`)", parkable: true)
            }
            if let pin = state.pins.first(where: { $0.name == name }) {
                if pin.peerKey == key { return .allow }
                return .refuse(
                    "refused \(request.summary): device name \"\(name)\" is pinned to key \(PeerInfo.hex(pin.peerKey)), "
                        + "and this peer presents key \(hex); if \"\(name)\" was reset or reinstalled, re-pin it with "
                        + "`trust \(hex)` (or `distrust \(name)`) in the shell, or edit \(pinsPath); otherwise someone "
                        + "holding the mesh key is posing as \"\(name)\"", parkable: true)
            }
            guard pinning else { return .allow }
            var pins = state.pins
            pins.append(PeerPin(name: name, peerKey: key))
            do { try savePins?(pins) } catch {
                return .refuse(
                    "refused \(request.summary): cannot pin it to \"\(name)\": \(error)", parkable: false)
            }
            state.pins = pins
            log("pinned device name \"\(name)\" to peer key \(hex) (trust on first use; \(pinsPath))")
            return .allow
        }
    }

    /// Admits `key`: answers its pending requests with allow; under the allowlist adds it; under
    /// trust on first use pins it to the name it was last seen with (replacing that name's pin),
    /// or trusts it by key when no name is known.
    ///
    /// - Returns: what was done, in words.
    /// - Throws: ``DeviceNameError`` when the pins cannot be saved.
    func trust(peerKey key: [UInt8]) throws -> String {
        var done: [String] = []
        let hex = PeerInfo.hex(key)
        let waiting = state.withLock { state in state.pending.values.filter { $0.request.peerKey == key } }
        try state.withLock { state in
            switch state.mode {
            case .meshKey:
                break
            case .allowlist(let keys):
                if !keys.contains(key) {
                    state.mode = .allowlist(keys.union([key]))
                    done.append("added \(hex) to the allowlist")
                }
            case .trustOnFirstUse:
                let name = state.seen.last { $0.key == key }?.name
                var pins = state.pins.filter { $0.peerKey != key && ($0.name == nil || $0.name != name) }
                pins.append(PeerPin(name: name, peerKey: key))
                if Set(pins) != Set(state.pins) {
                    do { try savePins?(pins) } catch { throw DeviceNameError("cannot save \(pinsPath): \(error)") }
                    state.pins = pins
                    done.append(name.map { "pinned \"\($0)\" to \(hex)" } ?? "trusted \(hex) by key")
                }
            }
        }
        // After the mode changed, so that a pending request allowed now passes the mode.
        for entry in waiting { entry.resolve(.allow, "") }
        if !waiting.isEmpty { done.append("admitted \(waiting.count) waiting connection(s)") }
        return done.isEmpty ? "nothing to do: \(hex) is admitted already" : done.joined(separator: "; ")
    }

    /// Withdraws trust from `key`: answers its pending requests with deny; under the allowlist
    /// removes it; under trust on first use forgets its pins (its name is pinned again, to
    /// whichever key presents it next).
    ///
    /// - Returns: what was done, in words.
    /// - Throws: ``DeviceNameError`` when the pins cannot be saved.
    func distrust(peerKey key: [UInt8]) throws -> String {
        var done: [String] = []
        let hex = PeerInfo.hex(key)
        let waiting = state.withLock { state in state.pending.values.filter { $0.request.peerKey == key } }
        for entry in waiting { entry.resolve(.deny, "distrusted") }
        if !waiting.isEmpty { done.append("denied \(waiting.count) waiting connection(s)") }
        try state.withLock { state in
            switch state.mode {
            case .meshKey:
                break
            case .allowlist(let keys):
                if keys.contains(key) {
                    state.mode = .allowlist(keys.subtracting([key]))
                    done.append("removed \(hex) from the allowlist")
                }
            case .trustOnFirstUse:
                let pins = state.pins.filter { $0.peerKey != key }
                if pins.count != state.pins.count {
                    do { try savePins?(pins) } catch { throw DeviceNameError("cannot save \(pinsPath): \(error)") }
                    state.pins = pins
                    done.append("forgot the pins of \(hex)")
                }
            }
        }
        return done.joined(separator: "; ")
    }

    /// Denies every connection waiting for a decision (the node stops).
    func denyWaiting() {
        let waiting = state.withLock { Array($0.pending.values) }
        for entry in waiting { entry.resolve(.deny, "the node stopped") }
    }

    /// The key `name` stands for. For trusting (`waitingFirst`): the newest waiting connection with
    /// that name, else the newest peer seen with it, else its pin (so `trust NAME` re-pins a name
    /// to the key now presenting it). For distrusting: its pin first, then waiting, then seen.
    func peerKey(named name: String, waitingFirst: Bool) -> [UInt8]? {
        state.withLock { state in
            let pinned = state.pins.first { $0.name == name }?.peerKey
            let waiting = state.pending.sorted { $0.key > $1.key }.first { $0.value.request.deviceName == name }?
                .value.request.peerKey
            let seen = state.seen.last { $0.name == name }?.key
            return waitingFirst ? waiting ?? seen ?? pinned : pinned ?? waiting ?? seen
        }
    }

    /// The device name `key` was last seen with.
    func deviceName(of key: [UInt8]) -> String? {
        state.withLock { state in state.seen.last { $0.key == key }?.name }
    }
}

/// Runs a connection-request handler's jobs on the handshake thread waiting for its answer, and
/// once that thread stops waiting (an answer, or the deadline) on a shared queue, so a handler
/// cancelled at the deadline still runs to its end instead of leaking.
final class HandlerExecutor: TaskExecutor, @unchecked Sendable {
    // Invariant: `jobs` and `detached` are touched only under `lock`.
    private let lock = Mutex<(jobs: [UnownedJob], detached: Bool)>(([], false))
    /// Signalled when a job arrives or the answer is given.
    let wakeup = DispatchSemaphore(value: 0)
    /// Where jobs run once the waiting thread has gone.
    private static let queue = DispatchQueue(label: "trellis.admission.handlers", attributes: .concurrent)

    func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        let queued = lock.withLock { state -> Bool in
            guard !state.detached else { return false }
            state.jobs.append(unowned)
            return true
        }
        if queued {
            wakeup.signal()
        } else {
            Self.queue.async { unowned.runSynchronously(on: self.asUnownedTaskExecutor()) }
        }
    }

    /// Runs the jobs queued so far on the calling thread.
    func runQueued() {
        while let job = lock.withLock({ $0.jobs.isEmpty ? nil : $0.jobs.removeFirst() }) {
            job.runSynchronously(on: asUnownedTaskExecutor())
        }
    }

    /// From now on jobs run on the shared queue; those waiting move there.
    func detach() {
        let left = lock.withLock { state in
            state.detached = true
            defer { state.jobs.removeAll() }
            return state.jobs
        }
        for job in left { Self.queue.async { job.runSynchronously(on: self.asUnownedTaskExecutor()) } }
    }
}
