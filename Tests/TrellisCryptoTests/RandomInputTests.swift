import Testing
import TrellisCrypto

/// Random and mutated bytes fed to `readMessage` at every handshake stage and to
/// `NoiseTransport.decrypt`: the only acceptable outcome is a thrown `NoiseError` (or, where Noise
/// authenticates nothing yet, a normal return), never a crash. The seed is printed; replay a run
/// with `TRELLIS_SEED=<seed> swift test --filter RandomInputTests`.
@Suite("Random input to the Noise state machines")
struct RandomInputTests {
    static let iterations = 400

    /// Produces an input: random bytes of a random length, or a mutation of a valid message.
    static func input(near valid: [UInt8], using generator: inout SeededGenerator) -> [UInt8] {
        switch Int.random(in: 0..<6, using: &generator) {
        case 0:
            return generator.bytes(count: Int.random(in: 0...16, using: &generator))
        case 1:
            return generator.bytes(count: Int.random(in: 0...(valid.count + 64), using: &generator))
        case 2:  // flip one to four bits
            var bytes = valid
            for _ in 0..<Int.random(in: 1...4, using: &generator) where !bytes.isEmpty {
                bytes[Int.random(in: 0..<bytes.count, using: &generator)] ^=
                    1 << UInt8.random(in: 0...7, using: &generator)
            }
            return bytes == valid ? bytes + [0] : bytes
        case 3:  // truncate
            return Array(valid.prefix(Int.random(in: 0..<max(valid.count, 1), using: &generator)))
        case 4:  // append junk
            return valid + generator.bytes(count: Int.random(in: 1...32, using: &generator))
        default:  // a valid prefix followed by junk of the same total length
            let keep = Int.random(in: 0..<max(valid.count, 1), using: &generator)
            return Array(valid.prefix(keep)) + generator.bytes(count: valid.count - keep)
        }
    }

    @Test("readMessage at every stage and NoiseTransport.decrypt only throw", arguments: NoisePattern.allCases)
    func randomInputs(pattern: NoisePattern) throws {
        var (generator, seed) = SeededGenerator.fromEnvironment(test: "RandomInputTests.\(pattern)")
        let psk: SecretBytes? = pattern.usesPSK ? SecretBytes(generator.bytes(count: 32)) : nil
        var pair = try HandshakePair(pattern: pattern, initiatorPSK: psk, responderPSK: psk)

        // Snapshots of the reading side at each stage, with the genuine message for that stage.
        var stages: [(reader: HandshakeState, valid: [UInt8], authenticated: Bool)] = []
        let m1 = try pair.message1(generator.bytes(count: 8))
        // XX's message 1 is plain (e + payload); with psk3 the e token keys the payload, so a tag exists.
        stages.append((pair.responder, m1, pattern.usesPSK))
        _ = try pair.responder.readMessage(m1)
        let m2 = try pair.message2(generator.bytes(count: 8))
        stages.append((pair.initiator, m2, true))
        _ = try pair.initiator.readMessage(m2)
        let m3 = try pair.message3(generator.bytes(count: 8))
        stages.append((pair.responder, m3, true))
        _ = try pair.responder.readMessage(m3)

        var thrown = 0
        var accepted = 0
        for (index, stage) in stages.enumerated() {
            for _ in 0..<Self.iterations {
                let bytes = Self.input(near: stage.valid, using: &generator)
                if bytes == stage.valid { continue }
                var reader = stage.reader
                do {
                    _ = try reader.readMessage(bytes)
                    accepted += 1
                    #expect(
                        !stage.authenticated,
                        "seed \(seed): message \(index + 1) accepted forged bytes \(Hex.encode(bytes))")
                    // An accepted forgery of XX message 1 must still fail safely later, if at all.
                    do { _ = try reader.writeMessage(payload: []) } catch { thrown += 1 }
                } catch {
                    thrown += 1
                    // A failed handshake refuses everything afterwards.
                    #expect(throws: NoiseError.self) { _ = try reader.readMessage(stage.valid) }
                }
            }
            // The untouched snapshot still takes the genuine message.
            var reader = stage.reader
            _ = try reader.readMessage(stage.valid)
        }

        var alice = try pair.initiator.split()
        var bob = try pair.responder.split()
        for round in 0..<Self.iterations {
            let plaintext = generator.bytes(count: Int.random(in: 0...64, using: &generator))
            let valid = try alice.encrypt(plaintext)
            var bytes = Self.input(near: valid, using: &generator)
            if round % 50 == 0 {
                bytes = generator.bytes(
                    count: NoiseTransport.maxMessageLength + Int.random(in: 1...100, using: &generator))
            }
            if bytes != valid {
                #expect(throws: NoiseError.self, "seed \(seed): transport accepted \(Hex.encode(bytes))") {
                    _ = try bob.decrypt(bytes)
                }
                thrown += 1
            }
            #expect(try bob.decrypt(valid) == plaintext, "seed \(seed): genuine message \(round) after garbage")
        }
        print("RandomInputTests.\(pattern): seed \(seed): \(thrown) rejected, \(accepted) accepted (XX message 1)")
        #expect(thrown > 0)
    }
}
