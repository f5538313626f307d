import ContactProvider
import Foundation
import TrellisContacts
import TrellisCore
import TrellisCrypto

/// An input on which a decoder broke one of its promises (it never traps, by contrast, so a trap
/// is found by the fuzzer or the test process itself).
public struct FuzzCheckFailure: Error, Sendable, CustomStringConvertible {
    /// The check that failed: the fuzz target's name, such as `FuzzJSON`.
    public var target: String
    /// What went wrong, naming the values involved.
    public var message: String
    /// The input, as hex (at most the first 512 bytes).
    public var input: String

    public init(target: String, message: String, input: [UInt8]) {
        self.target = target
        self.message = message
        self.input =
            input.prefix(512).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
            + (input.count > 512 ? "… (\(input.count) bytes)" : "")
    }

    public var description: String { "\(target): \(message); input \(input)" }
}

/// The checks behind the libFuzzer targets in `Fuzz/` (one per decoder of untrusted input).
///
/// Each check feeds one input to a decoder and tests what the decoder promises: never trap, and
/// whatever decodes re-encodes to something that decodes back the same. A fuzz target's file is
/// only the entry point calling ``run(_:_:_:)`` with its check; the test suite replays every saved
/// input in `Fuzz/<Target>/Corpus` and `Fuzz/<Target>/Regressions` through the same check.
/// docs/TESTING.md ("Fuzzing") says how to run the targets and add one.
public enum FuzzChecks {
    /// A check: returns when the input is handled as promised, throws when a promise is broken.
    public typealias Check = @Sendable ([UInt8]) throws(FuzzCheckFailure) -> Void

    /// Every fuzz target by name (the directory under `Fuzz/` and the executable target), with its
    /// check.
    public static let targets: [(name: String, check: Check)] = [
        ("FuzzCBOR", cbor), ("FuzzJSON", json), ("FuzzQuery", query), ("FuzzDocumentState", documentState),
        ("FuzzWireMessage", wireMessage), ("FuzzHandshake", handshake), ("FuzzVCard", vCard),
        ("FuzzFrames", frames), ("FuzzSession", session), ("FuzzBeacon", beacon),
    ]

    /// libFuzzer's `LLVMFuzzerTestOneInput`: runs `check` on the `count` bytes at `data` and traps
    /// with the failure's description when it throws, so libFuzzer saves the input.
    ///
    /// - Returns: 0, as libFuzzer requires.
    public static func run(_ check: Check, _ data: UnsafeRawPointer?, _ count: Int) -> CInt {
        let input = data.map { [UInt8](UnsafeRawBufferPointer(start: $0, count: count)) } ?? []
        do {
            try check(input)
        } catch {
            fatalError(error.description)
        }
        return 0
    }

    // MARK: CBOR

    /// `CBOR.decode` and `CBOR.decodeItem` (RFC 8949): whatever decodes re-encodes to bytes that
    /// decode to the same thing; `Value` encodings pass the strict deterministic decoder and encode
    /// again to the same bytes.
    public static func cbor(_ input: [UInt8]) throws(FuzzCheckFailure) {
        let fail = failing("FuzzCBOR", input)
        if let value = try? CBOR.decode(input) {
            let encoded = CBOR.encode(value)
            let strict = CBOR.DecodingOptions(requireDeterministic: true)
            guard let again = try? CBOR.decode(encoded, options: strict), again == value else {
                throw fail("Value \(value) encoded as \(hex(encoded)) does not decode back")
            }
            guard CBOR.encode(again) == encoded else { throw fail("Value encoding of \(value) is not deterministic") }
        }
        if let item = try? CBOR.decodeItem(input) {
            let encoded = CBOR.encodeItem(item)
            guard let again = try? CBOR.decodeItem(encoded), CBOR.encodeItem(again) == encoded else {
                throw fail("CBORItem \(item) encoded as \(hex(encoded)) does not decode back")
            }
        }
    }

    // MARK: JSON

    /// The strict JSON parser: whatever parses writes to text that parses back equal, writing is
    /// deterministic, and the `String`, `Data` and byte overloads agree.
    public static func json(_ input: [UInt8]) throws(FuzzCheckFailure) {
        let fail = failing("FuzzJSON", input)
        try storedJSON(String(decoding: input, as: UTF8.self), fail)
        try storedJSONBytes(input, fail)
        try contactFromJSON(input, fail)
        guard let value = try? JSON.parse(input) else { return }
        let written = JSON.bytes(value)
        guard let again = try? JSON.parse(written), again == value else {
            throw fail("\(value) written as \(String(decoding: written, as: UTF8.self)) does not parse back equal")
        }
        guard JSON.bytes(again) == written else { throw fail("writing \(value) is not deterministic") }
        // Accepted text is UTF-8, so the String overload sees exactly the same text.
        guard (try? JSON.parse(String(decoding: input, as: UTF8.self))) == value else {
            throw fail("parsing the text as a String gives another value")
        }
        guard (try? JSON.parse(Data(input))) == value else {
            throw fail("parsing the text as Data gives another value")
        }
        // What the canonical check accepts is stored as it came: it must be exactly what the
        // full path would store.
        let text = String(decoding: input, as: UTF8.self)
        if let id = CanonicalJSON.documentID(of: text) {
            guard (try? value.validate()) != nil else { throw fail("accepted as canonical but does not validate") }
            guard JSON.bytes(value) == input else { throw fail("accepted as canonical but writes back differently") }
            guard case .map(let fields) = value, let stored = fields["_id"], JSON.string(stored) == id else {
                throw fail("accepted as canonical with _id \(id), which is not the document's")
            }
        }
    }

    /// The one-pass scans a query's results rely on (``JSONScan``): text `certainlyParses`
    /// accepts parses, and a member found by scanning is the parsed map's member.
    static func storedJSON(_ text: String, _ fail: (String) -> FuzzCheckFailure) throws(FuzzCheckFailure) {
        let vouched = JSONScan.certainlyParses(text)
        let parsed = try? JSON.parse(text)
        if vouched && parsed == nil { throw fail("certainlyParses accepted text that does not parse") }
        guard case .map(let fields)? = parsed else { return }
        for key in Array(fields.keys.prefix(8)) + ["_id", "absent key"] {
            switch JSONScan.member(key, in: text) {
            case .found(let value):
                if value != fields[key] {
                    throw fail("member '\(key)' scanned as \(value), parsed as \(fields[key] ?? .null)")
                }
            case .absent:
                if fields[key] != nil { throw fail("member '\(key)' scanned as absent but it parses") }
            case .unsure: break
            }
        }
    }

    /// The one-pass check of SQLite's bytes (``StoredJSON/init(checking:)-(UnsafeBufferPointer<UInt8>)``)
    /// vouches only for well-formed UTF-8 that parses, and its bytes then are the stored text.
    static func storedJSONBytes(_ input: [UInt8], _ fail: (String) -> FuzzCheckFailure) throws(FuzzCheckFailure) {
        let vouched = input.withUnsafeBufferPointer { JSONScan.certainlyParsesAsWellFormedUTF8($0) }
        guard vouched else { return }
        guard input.withUnsafeBytes({ UTF8Check.firstInvalid($0) }) == nil else {
            throw fail("certainlyParsesAsWellFormedUTF8 accepted ill-formed UTF-8")
        }
        guard (try? JSON.parse(input)) != nil else {
            throw fail("certainlyParsesAsWellFormedUTF8 accepted text that does not parse")
        }
        let stored = input.withUnsafeBufferPointer { StoredJSON(checking: $0) }
        guard let stored, stored.withUTF8({ Array($0) }) == input else {
            throw fail("a vouched text is not stored as it came")
        }
    }

    /// The contacts enumerator's one-pass decoder (`ContactDocument.contact(fromJSON:)`)
    /// reads every text as the parser path does: the same contact, and `nil` exactly when the
    /// text (read with ill-formed UTF-8 as U+FFFD, as the store reads it) does not parse.
    static func contactFromJSON(_ input: [UInt8], _ fail: (String) -> FuzzCheckFailure) throws(FuzzCheckFailure) {
        let direct = input.withUnsafeBufferPointer { ContactDocument.contact(fromJSON: $0) }
        let parsed = try? JSON.parse(String(decoding: input, as: UTF8.self))
        switch (direct, parsed) {
        case (nil, nil): return
        case (let direct?, let parsed?):
            let expected = ContactDocument.contact(from: parsed)
            guard direct.fields == expected.fields else {
                throw fail("the contact decoder reads \(direct.fields), the parser path \(expected.fields)")
            }
        case (nil, _?): throw fail("the contact decoder declines text that parses")
        case (_?, nil): throw fail("the contact decoder reads a contact from text that does not parse")
        }
    }

    // MARK: Query

    /// The query lexer, parser and binder: whatever parses prints canonical text that parses to an
    /// equal query (also once bound to arguments), evaluates against documents made from its own
    /// paths and literals, and translates to SQL (or declines) without trapping, with one binding
    /// per `?`.
    public static func query(_ input: [UInt8]) throws(FuzzCheckFailure) {
        let fail = failing("FuzzQuery", input)
        guard let query = try? Query(String(decoding: input, as: UTF8.self)) else { return }
        try checkCanonicalText(query.predicate, fail)
        var literals: [Value] = []
        query.predicate.forEach { node in
            for case .literal(let value) in node.operands { literals.append(value) }
        }
        if literals.isEmpty { literals = [.int(1), .string("a")] }
        let paths = query.predicate.fieldPaths.sorted {
            $0.description.utf8.lexicographicallyPrecedes($1.description.utf8)
        }
        let argumentPaths = query.predicate.argumentPaths.sorted {
            $0.description.utf8.lexicographicallyPrecedes($1.description.utf8)
        }
        let documents: [Value] = [
            .map([:]), document(paths, literals, offset: 0), document(paths, literals, offset: 1),
        ]
        for offset in 0..<2 {
            let args = document(argumentPaths, literals, offset: offset).mapValue ?? [:]
            guard let bound = try? query.bind(args: args) else { continue }
            try checkCanonicalText(bound.predicate, fail)
            for document in documents {
                let direct = try? query.matches(document, args: args)
                guard direct == bound.predicate.matches(document) else {
                    throw fail("matching \(document) with and without binding first disagree")
                }
            }
            try checkSQL(bound, fail)
        }
        _ = try? query.bind(args: [:])
        try checkSQL(query, fail)
    }

    private static func checkCanonicalText(
        _ predicate: Query.Predicate, _ fail: (String) -> FuzzCheckFailure
    ) throws(FuzzCheckFailure) {
        let text = predicate.description
        guard let reparsed = try? Query(text) else { throw fail("canonical text «\(text)» does not parse") }
        guard reparsed.predicate == predicate else {
            throw fail("canonical text «\(text)» parses to another query, «\(reparsed)»")
        }
    }

    private static func checkSQL(_ query: Query, _ fail: (String) -> FuzzCheckFailure) throws(FuzzCheckFailure) {
        guard let (sql, bindings) = query.sqlWhere(column: "documents.body") else { return }
        // Count `?` outside SQL string literals (where paths are inlined; `''` escapes a quote).
        var placeholders = 0
        var inLiteral = false
        for byte in sql.utf8 {
            if byte == UInt8(ascii: "'") { inLiteral.toggle() }
            if byte == UInt8(ascii: "?"), !inLiteral { placeholders += 1 }
        }
        guard !inLiteral, placeholders == bindings.count else {
            throw fail("SQL for «\(query)» has \(placeholders) placeholders for \(bindings.count) bindings: \(sql)")
        }
    }

    /// A map with `literals[(i + offset) % count]` at the i-th path, creating maps and arrays on
    /// the way (array indexes beyond 64 are left out).
    private static func document(_ paths: [FieldPath], _ literals: [Value], offset: Int) -> Value {
        var result = Value.map([:])
        for (i, path) in paths.enumerated() {
            result = setting(literals[(i + offset) % literals.count], at: path.components[...], in: result)
        }
        return result
    }

    private static func setting(_ value: Value, at path: ArraySlice<FieldPath.Component>, in base: Value) -> Value {
        guard let first = path.first else { return value }
        switch first {
        case .key(let key):
            var map = base.mapValue ?? [:]
            map[key] = setting(value, at: path.dropFirst(), in: map[key] ?? .null)
            return .map(map)
        case .index(let index):
            guard index <= 64 else { return base }
            var array: [Value] = []
            if case .array(let existing) = base { array = existing }
            while array.count <= index { array.append(.null) }
            array[index] = setting(value, at: path.dropFirst(), in: array[index])
            return .array(array)
        }
    }

    // MARK: Document state

    /// CBOR → `DocumentState` (either form, ``SingleWriteState`` included): whatever decodes re-encodes deterministically to bytes that decode
    /// to an equal state and encode to the same bytes; it merges with itself without change; its
    /// eviction stub merged with it gives it back; it materialises. When the input is an array of
    /// two or three states, merge is also checked to be a join: commutative (to the same bytes),
    /// associative, absorbing what it merged, and reporting a change exactly when there is one.
    public static func documentState(_ input: [UInt8]) throws(FuzzCheckFailure) {
        let fail = failing("FuzzDocumentState", input)
        if StateDelta.isEncoded(input) {
            // The delta form (compact or old): what decodes reads back from its own bytes and from
            // its old-form bytes, its state passes the state checks, and joining it into the state
            // it carries changes nothing.
            guard let delta = try? StateDelta(bytes: input) else { return }
            try checkState(delta.state, fail)
            guard (try? StateDelta(bytes: delta.encoded())) == delta else {
                throw fail("a delta does not read back from its own encoding")
            }
            guard (try? StateDelta(bytes: delta.encodedInOldForm())) == delta else {
                throw fail("a delta does not read back from its old-form encoding")
            }
            var joined = delta.state
            if joined.covers(base: delta.base), joined.merge(delta) || joined != delta.state {
                throw fail("joining a delta into the state it carries changed it")
            }
            return
        }
        if let single = try? SingleWriteState.decode(input) {
            // The single-write form: its state passes the same checks, and the canonical JSON the
            // receiver stores stands for the same state.
            guard let document = try? single.document(), let state = try? single.state() else { return }
            try checkState(state, fail)
            guard (try? SingleWriteState(stamp: single.stamp, json: document.json).state()) == state else {
                throw fail("the canonical JSON of a single-write state stands for another state")
            }
            return
        }
        guard let value = try? CBOR.decode(input) else { return }
        var states: [DocumentState] = []
        if case .array(let items) = value, (2...3).contains(items.count) {
            for item in items {
                guard let state = try? DocumentState(encoded: item) else { return }
                states.append(state)
            }
        } else {
            guard let state = try? DocumentState(encoded: value) else { return }
            states = [state]
        }
        for state in states { try checkState(state, fail) }
        guard states.count >= 2 else { return }
        let a = states[0]
        let b = states[1]
        let ab = try merged(a, b, fail)
        let ba = try merged(b, a, fail)
        guard ab == ba, ab.cbor() == ba.cbor() else {
            throw fail("merge is not commutative: \(hex(ab.cbor())) against \(hex(ba.cbor()))")
        }
        try checkState(ab, fail)
        var absorbed = ab
        guard !absorbed.merge(a), !absorbed.merge(b), absorbed == ab else {
            throw fail("merging a state into a join that holds it changed the join")
        }
        if states.count == 3 {
            let c = states[2]
            let left = try merged(ab, c, fail)
            let right = try merged(a, try merged(b, c, fail), fail)
            guard left == right, left.cbor() == right.cbor() else {
                throw fail("merge is not associative: \(hex(left.cbor())) against \(hex(right.cbor()))")
            }
        }
    }

    /// `a` merged with `b`, checking that `merge` reports a change exactly when there is one.
    private static func merged(
        _ a: DocumentState, _ b: DocumentState, _ fail: (String) -> FuzzCheckFailure
    ) throws(FuzzCheckFailure) -> DocumentState {
        var result = a
        let changed = result.merge(b)
        guard changed == (result != a) else {
            throw fail("merge reported \(changed ? "a change" : "no change") wrongly")
        }
        return result
    }

    private static func checkState(
        _ state: DocumentState, _ fail: (String) -> FuzzCheckFailure
    ) throws(FuzzCheckFailure) {
        let bytes = state.cbor()
        guard state.cbor() == bytes else { throw fail("encoding is not deterministic") }
        let strict = CBOR.DecodingOptions(requireDeterministic: true)
        let again: DocumentState
        do {
            again = try DocumentState(encoded: try CBOR.decode(bytes, options: strict))
        } catch {
            throw fail("re-encoded state \(hex(bytes)) does not decode: \(error)")
        }
        guard again == state else { throw fail("re-encoded state \(hex(bytes)) decodes to another state") }
        guard again.cbor() == bytes else { throw fail("re-decoded state encodes to other bytes than \(hex(bytes))") }
        var merged = state
        guard !merged.merge(again), merged == state else { throw fail("merging the state with itself changed it") }
        var stub = state.evictionStub()
        stub.merge(state)
        guard stub == state else { throw fail("merging the state into its eviction stub does not restore it") }
        _ = state.materialize(id: .string("d"))
        _ = state.maxTime
        for key in state.root.entries.keys { _ = state.value(at: .key(key)) }
    }

    // MARK: Wire messages

    /// `WireMessage(serialized:)`: whatever decodes re-encodes to bytes that decode to an equal
    /// message and encode to the same bytes.
    public static func wireMessage(_ input: [UInt8]) throws(FuzzCheckFailure) {
        let fail = failing("FuzzWireMessage", input)
        guard let message = try? WireMessage(serialized: input) else { return }
        let bytes = message.serialized()
        guard let again = try? WireMessage(serialized: bytes), again == message else {
            throw fail("\(message) serialised as \(hex(bytes)) does not decode back equal")
        }
        guard again.serialized() == bytes else { throw fail("serialising \(message) is not deterministic") }
        if case .subscriptions(let subscriptions, _) = message {
            for subscription in subscriptions {
                _ = subscription.spec.key
                _ = subscription.spec.description
                _ = try? Query(subscription.spec.query).bind(args: subscription.spec.args)
            }
        }
    }

    // MARK: Noise handshake

    /// The Noise XXpsk0 handshake (the one on the wire), both roles: the first input byte picks a step, the rest is
    /// what the peer sent there. Steps 0–2: the responder reads message 1, the initiator message 2,
    /// the responder message 3; steps 3 and 4: the initiator and responder decrypt a transport
    /// message after a genuine handshake. Nothing traps; a message other than the genuine one is
    /// refused; the genuine one lets the handshake finish and carry a transport message.
    public static func handshake(_ input: [UInt8]) throws(FuzzCheckFailure) {
        let fail = failing("FuzzHandshake", input)
        guard let step = input.first else { return }
        let message = Array(input.dropFirst())
        guard let fixture = HandshakeFixture.shared else { throw fail("the fixed handshake does not run") }
        switch step % 5 {
        case 0, 1, 2:
            let index = Int(step % 5)
            var reader = fixture.readers[index]
            let accepted = (try? reader.readMessage(message)) != nil
            guard accepted == (message == fixture.messages[index]) else {
                throw fail(
                    "handshake message \(index + 1) \(accepted ? "accepted" : "refused") though it is "
                        + "\(accepted ? "not " : "")the genuine one")
            }
            guard accepted else { return }
            do {
                try fixture.finish(from: index, reader: reader)
            } catch {
                throw fail("the handshake does not finish after the genuine message \(index + 1): \(error)")
            }
        default:
            var transport = step % 5 == 3 ? fixture.initiator : fixture.responder
            let plaintext = try? transport.decrypt(message)
            let genuine = step % 5 == 3 ? fixture.toInitiator : fixture.toResponder
            guard (plaintext != nil) == (message == genuine) else {
                throw fail("transport message \(plaintext == nil ? "refused" : "accepted") wrongly")
            }
        }
    }

    // MARK: vCard

    /// The vCard 3.0/4.0 importer: never traps; every card it reads exports (through the contact
    /// document, as `ContactImport.exportVCards` does) to vCard 4.0 text that imports as exactly
    /// one card with the same UID and holds every line kept alongside the fields
    /// (`CNContact.vCardProperties`), and exporting that again gives the same text.
    public static func vCard(_ input: [UInt8]) throws(FuzzCheckFailure) {
        let fail = failing("FuzzVCard", input)
        for card in VCard.parse(String(decoding: input, as: UTF8.self)).contacts {
            let exported = export(card.contact, uid: card.uid)
            let reread = VCard.parse(exported)
            guard reread.errors.isEmpty, reread.contacts.count == 1, let again = reread.contacts.first else {
                throw fail("exported card does not import as one card (\(reread.errors)): \(exported)")
            }
            guard again.uid == card.uid else {
                throw fail("UID \(card.uid.debugDescription) comes back as \(again.uid.debugDescription)")
            }
            // Lines kept alongside the fields (properties a CNContact has no field for) are
            // written again, as they were read.
            let written = Set(unfoldedLines(exported))
            if let lost = card.contact.vCardProperties.first(where: { !written.contains($0) }) {
                throw fail("kept line \(lost.debugDescription) is not written again: \(exported)")
            }
            let second = export(again.contact, uid: again.uid)
            guard second == exported else {
                throw fail("export is not stable:\n\(exported)\nthen\n\(second)")
            }
        }
    }

    /// The lines of exported vCard text (CRLF ends, folds of CRLF and a space), scalar by scalar.
    private static func unfoldedLines(_ text: String) -> [String] {
        var lines: [String] = []
        var current = String.UnicodeScalarView()
        let scalars = Array(text.unicodeScalars)
        var i = 0
        while i < scalars.count {
            if scalars[i] == "\r", i + 1 < scalars.count, scalars[i + 1] == "\n" {
                if i + 2 < scalars.count, scalars[i + 2] == " " {
                    i += 3
                    continue
                }
                lines.append(String(current))
                current = String.UnicodeScalarView()
                i += 2
                continue
            }
            current.append(scalars[i])
            i += 1
        }
        if !current.isEmpty { lines.append(String(current)) }
        return lines
    }

    private static func export(_ contact: CNContact, uid: String) -> String {
        let identifier = ContactItem.Identifier(uid)
        let document = ContactDocument.value(for: contact, identifier: identifier)
        return VCard.serialize(ContactDocument.contact(from: document), uid: uid)
    }

    // MARK: Helpers

    static func failing(_ target: String, _ input: [UInt8]) -> (String) -> FuzzCheckFailure {
        { message in FuzzCheckFailure(target: target, message: message, input: input) }
    }

    static func hex(_ bytes: [UInt8]) -> String {
        bytes.prefix(256).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    }
}

/// One genuine Noise XXpsk0 handshake with fixed keys, kept at every step so that a fuzz input
/// can replace the message of any step without redoing the ones before.
struct HandshakeFixture: Sendable {
    /// The side about to read message 1, 2 and 3 (responder, initiator, responder).
    let readers: [HandshakeState]
    /// The genuine messages 1, 2 and 3.
    let messages: [[UInt8]]
    /// The transports after the genuine handshake, and one genuine message to each side.
    let initiator: NoiseTransport
    let responder: NoiseTransport
    let toInitiator: [UInt8]
    let toResponder: [UInt8]

    static let shared: HandshakeFixture? = try? HandshakeFixture()

    static let prologue = Array("trellis/3".utf8)

    private static func keyPair(_ byte: UInt8) throws(NoiseError) -> KeyPair {
        try KeyPair(privateKey: [UInt8](repeating: byte, count: KeyPair.privateKeyLength))
    }

    static func start(_ role: NoiseRole) throws(NoiseError) -> HandshakeState {
        let initiator = role == .initiator
        return try HandshakeState(
            pattern: .xxpsk0, role: role, prologue: prologue, staticKeyPair: try keyPair(initiator ? 1 : 2),
            psk: SecretBytes([UInt8](repeating: 7, count: HandshakeState.pskLength)),
            fixedEphemeralKeyPair: try keyPair(initiator ? 3 : 4))
    }

    init() throws(NoiseError) {
        var initiator = try Self.start(.initiator)
        var responder = try Self.start(.responder)
        var readers: [HandshakeState] = []
        var messages: [[UInt8]] = []
        messages.append(try initiator.writeMessage(payload: Array("one".utf8)))
        readers.append(responder)
        _ = try responder.readMessage(messages[0])
        messages.append(try responder.writeMessage(payload: Array("two".utf8)))
        readers.append(initiator)
        _ = try initiator.readMessage(messages[1])
        messages.append(try initiator.writeMessage(payload: Array("three".utf8)))
        readers.append(responder)
        _ = try responder.readMessage(messages[2])
        var initiatorTransport = try initiator.split()
        var responderTransport = try responder.split()
        toResponder = try initiatorTransport.encrypt(Array("ping".utf8))
        toInitiator = try responderTransport.encrypt(Array("pong".utf8))
        self.readers = readers
        self.messages = messages
        self.initiator = initiatorTransport
        self.responder = responderTransport
    }

    /// Runs the rest of the genuine handshake after `reader` read message `index + 1`, splits, and
    /// checks that a transport message gets through.
    func finish(from index: Int, reader: HandshakeState) throws {
        var me = reader
        var peer: HandshakeState
        switch index {
        case 0:
            peer = readers[1]  // the initiator, having written message 1
        case 1:
            peer = readers[2]  // the responder, having written message 2
        default:
            peer = readers[1]  // the initiator, brought to having written message 3
            _ = try peer.readMessage(messages[1])
            _ = try peer.writeMessage(payload: Array("three".utf8))
        }
        while !me.isComplete || !peer.isComplete {
            if me.isWriteTurn {
                _ = try peer.readMessage(try me.writeMessage())
            } else if peer.isWriteTurn {
                _ = try me.readMessage(try peer.writeMessage())
            } else {
                throw NoiseError(.wrongState, "neither side can write")
            }
        }
        var mine = try me.split()
        var theirs = try peer.split()
        guard try theirs.decrypt(try mine.encrypt([1, 2, 3])) == [1, 2, 3] else {
            throw NoiseError(.decryptionFailed, "transport message changed on the way")
        }
    }
}
