import Testing
import TrellisCrypto

/// Two in-process handshake states talking to each other: success, wrong psk, tampering, malformed
/// input and state-machine misuse.
@Suite("Noise handshake and transport")
struct HandshakeTests {
    static let psk = SecretBytes(Array(0..<32))
    static let otherPSK = SecretBytes(Array((0..<32).map { 255 - $0 }))

    @Test("handshake with matching psks, then encrypted traffic and rekey both ways", arguments: NoisePattern.allCases)
    func roundTrip(pattern: NoisePattern) throws {
        let initiatorStatic = KeyPair.generate()
        let responderStatic = KeyPair.generate()
        let psk = pattern.usesPSK ? Self.psk : nil
        var pair = try HandshakePair(
            pattern: pattern, initiatorPSK: psk, responderPSK: psk,
            initiatorStatic: initiatorStatic, responderStatic: responderStatic)

        #expect(pair.initiator.isWriteTurn && !pair.responder.isWriteTurn)
        let m1 = try pair.message1(Array("hello".utf8))
        #expect(try pair.responder.readMessage(m1) == Array("hello".utf8))
        #expect(pair.responder.remoteStaticPublicKey == nil)
        let m2 = try pair.message2(Array("from responder".utf8))
        #expect(try pair.initiator.readMessage(m2) == Array("from responder".utf8))
        #expect(pair.initiator.remoteStaticPublicKey == responderStatic.publicKey)
        let m3 = try pair.message3(Array("from initiator".utf8))
        #expect(try pair.responder.readMessage(m3) == Array("from initiator".utf8))
        #expect(pair.responder.remoteStaticPublicKey == initiatorStatic.publicKey)
        #expect(pair.initiator.isComplete && pair.responder.isComplete)
        #expect(!pair.initiator.isWriteTurn && !pair.responder.isWriteTurn)
        #expect(pair.initiator.handshakeHash == pair.responder.handshakeHash)
        #expect(pair.initiator.handshakeHash.count == SymmetricState.hashLength)

        var alice = try pair.initiator.split()
        var bob = try pair.responder.split()
        #expect(alice.handshakeHash == bob.handshakeHash)
        #expect(alice.remoteStaticPublicKey == responderStatic.publicKey)
        #expect(bob.remoteStaticPublicKey == initiatorStatic.publicKey)

        for round in 0..<5 {
            let up = Array("message \(round) up".utf8)
            let sealed = try alice.encrypt(up)
            #expect(sealed.count == up.count + CipherState.tagLength)
            #expect(try bob.decrypt(sealed) == up)
            let down = Array(repeating: UInt8(round), count: round * 100)
            #expect(try alice.decrypt(try bob.encrypt(down)) == down)
        }
        // Rekey (§11.3): both ends of one direction rekey at the same point.
        alice.rekeySend()
        bob.rekeyReceive()
        #expect(try bob.decrypt(try alice.encrypt([1, 2, 3])) == [1, 2, 3])
        bob.rekeySend()
        let afterRekey = try bob.encrypt([4, 5, 6])
        #expect(throws: NoiseError.self) {
            var copy = alice
            _ = try copy.decrypt(afterRekey)
        }
        alice.rekeyReceive()
        #expect(try alice.decrypt(afterRekey) == [4, 5, 6])
        // Largest plaintext fits exactly in 65535 bytes.
        let largest = [UInt8](repeating: 0xAB, count: NoiseTransport.maxPlaintextLength)
        let largestSealed = try alice.encrypt(largest)
        #expect(largestSealed.count == NoiseTransport.maxMessageLength)
        #expect(try bob.decrypt(largestSealed) == largest)
    }

    @Test("different psks: the responder cannot decrypt message 3 and gets no transport")
    func differentPSKs() throws {
        var pair = try HandshakePair(initiatorPSK: Self.psk, responderPSK: Self.otherPSK)
        _ = try pair.responder.readMessage(try pair.message1())
        _ = try pair.initiator.readMessage(try pair.message2())
        let m3 = try pair.message3(Array("secret".utf8))
        let error = #expect(throws: NoiseError.self) { _ = try pair.responder.readMessage(m3) }
        #expect(error?.code == .decryptionFailed)
        #expect(!pair.responder.isComplete)
        let splitError = #expect(throws: NoiseError.self) { _ = try pair.responder.split() }
        #expect(splitError?.code == .wrongState)
        // The failed handshake stays failed, even when handed the same message again.
        let again = #expect(throws: NoiseError.self) { _ = try pair.responder.readMessage(m3) }
        #expect(again?.code == .wrongState)
    }

    @Test("XXpsk0, different psks: message 1 is refused before the responder writes anything")
    func differentPSKsAtMessage1() throws {
        var pair = try HandshakePair(pattern: .xxpsk0, initiatorPSK: Self.psk, responderPSK: Self.otherPSK)
        let m1 = try pair.message1()
        #expect(m1.count == 32 + CipherState.tagLength, "e and the empty payload's tag")
        let error = #expect(throws: NoiseError.self) { _ = try pair.responder.readMessage(m1) }
        #expect(error?.code == .decryptionFailed)
        // Nothing written: no ephemeral, no DH with the static key, the static key never sent.
        #expect(!pair.responder.isWriteTurn)
        let write = #expect(throws: NoiseError.self) { _ = try pair.responder.writeMessage() }
        #expect(write?.code == .wrongState)
        // The same keys and the right psk complete: the refusal was the psk alone.
        var good = try HandshakePair(pattern: .xxpsk0, initiatorPSK: Self.psk, responderPSK: Self.psk)
        _ = try good.complete()
    }

    @Test("a psk mismatch is caught in message 3 even when only one byte differs")
    func oneBytePSKDifference() throws {
        var other = Self.psk.copyBytes()
        other[31] ^= 1
        var pair = try HandshakePair(initiatorPSK: Self.psk, responderPSK: SecretBytes(other))
        _ = try pair.responder.readMessage(try pair.message1())
        _ = try pair.initiator.readMessage(try pair.message2())
        let error = #expect(throws: NoiseError.self) { _ = try pair.responder.readMessage(try pair.message3()) }
        #expect(error?.code == .decryptionFailed)
    }

    @Test("a different prologue fails the handshake")
    func differentPrologue() throws {
        var initiator = try HandshakeState(
            pattern: .xxpsk3, role: .initiator, prologue: Array("trellis/1".utf8), staticKeyPair: .generate(),
            psk: Self.psk)
        var responder = try HandshakeState(
            pattern: .xxpsk3, role: .responder, prologue: Array("trellis/2".utf8), staticKeyPair: .generate(),
            psk: Self.psk)
        let error = #expect(throws: NoiseError.self) {
            _ = try responder.readMessage(try initiator.writeMessage(payload: []))
        }
        #expect(error?.code == .decryptionFailed)
    }

    @Test("tampered handshake messages fail at every byte", arguments: [1, 2, 3])
    func tamperedHandshake(message: Int) throws {
        var pair = try HandshakePair()
        var stages: [HandshakePair] = []
        var messages: [[UInt8]] = []
        messages.append(try pair.message1(Array("payload one".utf8)))
        stages.append(pair)
        _ = try pair.responder.readMessage(messages[0])
        messages.append(try pair.message2(Array("payload two".utf8)))
        stages.append(pair)
        _ = try pair.initiator.readMessage(messages[1])
        messages.append(try pair.message3(Array("payload three".utf8)))
        stages.append(pair)

        let original = messages[message - 1]
        for index in original.indices {
            var tampered = original
            tampered[index] ^= 0x01
            var stage = stages[message - 1]
            let error = #expect(throws: NoiseError.self, "byte \(index) of message \(message)") {
                if message == 2 {
                    _ = try stage.initiator.readMessage(tampered)
                } else {
                    _ = try stage.responder.readMessage(tampered)
                }
            }
            #expect(error?.code == .decryptionFailed || error?.code == .invalidKey)
        }
    }

    @Test("tampered, replayed and reordered transport messages fail; the nonce survives a failure")
    func tamperedTransport() throws {
        var pair = try HandshakePair()
        var (alice, bob) = try pair.complete()
        let first = try alice.encrypt(Array("first".utf8))
        let second = try alice.encrypt(Array("second".utf8))

        var tampered = first
        tampered[tampered.count - 1] ^= 0x80
        #expect(throws: NoiseError.self) { _ = try bob.decrypt(tampered) }
        var flippedBody = first
        flippedBody[0] ^= 0x01
        #expect(throws: NoiseError.self) { _ = try bob.decrypt(flippedBody) }
        let reordered = #expect(throws: NoiseError.self) { _ = try bob.decrypt(second) }
        #expect(reordered?.code == .decryptionFailed)
        #expect(bob.receiver.nonce == 0)

        #expect(try bob.decrypt(first) == Array("first".utf8))
        let replay = #expect(throws: NoiseError.self) { _ = try bob.decrypt(first) }
        #expect(replay?.code == .decryptionFailed)
        #expect(try bob.decrypt(second) == Array("second".utf8))
        // A message from the wrong direction does not decrypt either.
        let own = try bob.encrypt([9])
        #expect(throws: NoiseError.self) { _ = try bob.decrypt(own) }
    }

    @Test("empty, truncated and random handshake messages throw at every stage", arguments: [1, 2, 3])
    func malformedHandshake(message: Int) throws {
        var pair = try HandshakePair()
        var valid: [UInt8] = []
        var stage = pair
        if message >= 1 {
            valid = try pair.message1(Array("p".utf8))
            stage = pair
        }
        if message >= 2 {
            _ = try pair.responder.readMessage(valid)
            valid = try pair.message2(Array("p".utf8))
            stage = pair
        }
        if message >= 3 {
            _ = try pair.initiator.readMessage(valid)
            valid = try pair.message3(Array("p".utf8))
            stage = pair
        }
        func read(_ bytes: [UInt8]) throws(NoiseError) {
            var copy = stage
            if message == 2 {
                _ = try copy.initiator.readMessage(bytes)
            } else {
                _ = try copy.responder.readMessage(bytes)
            }
        }
        let empty = #expect(throws: NoiseError.self) { try read([]) }
        #expect(empty?.code == .badMessageLength)
        for length in 0..<valid.count {
            #expect(throws: NoiseError.self, "truncated to \(length) of \(valid.count) bytes") {
                try read(Array(valid.prefix(length)))
            }
        }
        #expect(throws: NoiseError.self) { try read(valid + [0]) }
        var generator = SeededGenerator(seed: UInt64(message))
        for length in [1, 31, 32, 48, 64, 96, 200, valid.count] {
            #expect(throws: NoiseError.self, "random \(length) bytes") { try read(generator.bytes(count: length)) }
        }
        let tooLong = #expect(throws: NoiseError.self) {
            try read([UInt8](repeating: 0, count: NoiseTransport.maxMessageLength + 1))
        }
        #expect(tooLong?.code == .messageTooLong)
        // The untouched stage still accepts the real message.
        try read(valid)
    }

    @Test("XX (no psk) accepts any 32+ bytes as message 1 but rejects a low-order ephemeral key")
    func lowOrderEphemeral() throws {
        var responder = try HandshakeState(pattern: .xx, role: .responder, staticKeyPair: .generate())
        _ = try responder.readMessage([UInt8](repeating: 0, count: 32))
        let error = #expect(throws: NoiseError.self) { _ = try responder.writeMessage(payload: []) }
        #expect(error?.code == .invalidKey)
        let after = #expect(throws: NoiseError.self) { _ = try responder.writeMessage(payload: []) }
        #expect(after?.code == .wrongState)
    }

    @Test("calls out of turn throw wrongState and leave the state usable")
    func wrongState() throws {
        var pair = try HandshakePair()
        let readFirst = #expect(throws: NoiseError.self) { _ = try pair.initiator.readMessage([]) }
        #expect(readFirst?.code == .wrongState)
        let writeFirst = #expect(throws: NoiseError.self) { _ = try pair.responder.writeMessage(payload: []) }
        #expect(writeFirst?.code == .wrongState)
        let early = #expect(throws: NoiseError.self) { _ = try pair.initiator.split() }
        #expect(early?.code == .wrongState)

        let (alice, bob) = try pair.complete()
        #expect(alice.handshakeHash == bob.handshakeHash)
        let twice = #expect(throws: NoiseError.self) { _ = try pair.initiator.split() }
        #expect(twice?.code == .wrongState)
        let afterWrite = #expect(throws: NoiseError.self) { _ = try pair.initiator.writeMessage(payload: []) }
        #expect(afterWrite?.code == .wrongState)
        let afterRead = #expect(throws: NoiseError.self) { _ = try pair.responder.readMessage([]) }
        #expect(afterRead?.code == .wrongState)
        #expect(pair.initiator.handshakeHash == alice.handshakeHash)
    }

    @Test("psk validation: missing, wrong length, or given to XX")
    func pskValidation() throws {
        let keys = KeyPair.generate()
        let missing = #expect(throws: NoiseError.self) {
            _ = try HandshakeState(pattern: .xxpsk3, role: .initiator, staticKeyPair: keys)
        }
        #expect(missing?.code == .invalidPSK)
        for length in [0, 16, 31, 33, 64] {
            let wrong = #expect(throws: NoiseError.self, "psk of \(length) bytes") {
                _ = try HandshakeState(
                    pattern: .xxpsk3, role: .responder, staticKeyPair: keys,
                    psk: SecretBytes(Array(repeating: 1, count: length)))
            }
            #expect(wrong?.code == .invalidPSK)
        }
        let unwanted = #expect(throws: NoiseError.self) {
            _ = try HandshakeState(pattern: .xx, role: .initiator, staticKeyPair: keys, psk: Self.psk)
        }
        #expect(unwanted?.code == .invalidPSK)
    }

    @Test("messages over 65535 bytes are refused; a refused handshake write changes nothing")
    func messageLimits() throws {
        var pair = try HandshakePair()
        let huge = [UInt8](repeating: 1, count: NoiseTransport.maxMessageLength)
        let refused = #expect(throws: NoiseError.self) { _ = try pair.message1(huge) }
        #expect(refused?.code == .messageTooLong)
        #expect(pair.initiator.isWriteTurn)
        // e (32) + payload + tag (16) must fit: the largest payload for message 1 is 65535 - 48.
        let fitting = [UInt8](repeating: 1, count: NoiseTransport.maxMessageLength - 48)
        let m1 = try pair.message1(fitting)
        #expect(m1.count == NoiseTransport.maxMessageLength)
        #expect(try pair.responder.readMessage(m1) == fitting)
        _ = try pair.initiator.readMessage(try pair.message2())
        _ = try pair.responder.readMessage(try pair.message3())
        var alice = try pair.initiator.split()
        var bob = try pair.responder.split()

        let tooBig = #expect(throws: NoiseError.self) {
            _ = try alice.encrypt([UInt8](repeating: 0, count: NoiseTransport.maxPlaintextLength + 1))
        }
        #expect(tooBig?.code == .messageTooLong)
        #expect(alice.sender.nonce == 0)
        let tooBigIn = #expect(throws: NoiseError.self) {
            _ = try bob.decrypt([UInt8](repeating: 0, count: NoiseTransport.maxMessageLength + 1))
        }
        #expect(tooBigIn?.code == .messageTooLong)
        let tooShort = #expect(throws: NoiseError.self) {
            _ = try bob.decrypt([UInt8](repeating: 0, count: CipherState.tagLength - 1))
        }
        #expect(tooShort?.code == .badMessageLength)
        #expect(try bob.decrypt(try alice.encrypt([])) == [])
    }
}

/// The primitives below the handshake.
@Suite("Noise primitives")
struct PrimitiveTests {
    @Test("X25519 matches RFC 7748 §6.1 and rejects bad keys")
    func x25519() throws {
        let alicePrivate = try #require(Hex.decode("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"))
        let bobPrivate = try #require(Hex.decode("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb"))
        let alice = try KeyPair(privateKey: alicePrivate)
        let bob = try KeyPair(privateKey: bobPrivate)
        #expect(Hex.encode(alice.publicKey) == "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
        #expect(Hex.encode(bob.publicKey) == "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
        let shared = try alice.dh(with: bob.publicKey)
        #expect(Hex.encode(shared.copyBytes()) == "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")
        #expect(try bob.dh(with: alice.publicKey) == shared)

        let zero = #expect(throws: NoiseError.self) { _ = try alice.dh(with: [UInt8](repeating: 0, count: 32)) }
        #expect(zero?.code == .invalidKey)
        let short = #expect(throws: NoiseError.self) { _ = try alice.dh(with: [1, 2, 3]) }
        #expect(short?.code == .invalidKey)
        let badPrivate = #expect(throws: NoiseError.self) {
            _ = try KeyPair(privateKey: [UInt8](repeating: 1, count: 31))
        }
        #expect(badPrivate?.code == .invalidKey)
        #expect(KeyPair.generate().publicKey != KeyPair.generate().publicKey)
        #expect(KeyPair.publicKeyLength == 32 && KeyPair.privateKeyLength == 32)
    }

    @Test("SecretBytes compares in constant time and never prints its bytes")
    func secretBytes() {
        let a = SecretBytes([1, 2, 3])
        #expect(a == SecretBytes([1, 2, 3]))
        #expect(a != SecretBytes([1, 2, 4]))
        #expect(a != SecretBytes([1, 2]))
        #expect(SecretBytes([]) == SecretBytes([]))
        #expect(a.copyBytes() == [1, 2, 3])
        #expect("\(a)" == "SecretBytes(3 bytes)")
        #expect(SecretBytes.random(count: 32).count == 32)
        #expect(SecretBytes.random(count: 32) != SecretBytes.random(count: 32))
    }

    @Test("CipherState: pass-through without a key, nonce exhaustion, rekey")
    func cipherState() throws {
        var empty = CipherState()
        #expect(!empty.hasKey)
        #expect(try empty.encryptWithAd([1], [5, 6]) == [5, 6])
        let noKey = #expect(throws: NoiseError.self) { try empty.rekey() }
        #expect(noKey?.code == .wrongState)
        let badKey = #expect(throws: NoiseError.self) { _ = try CipherState(key: SecretBytes([1, 2])) }
        #expect(badKey?.code == .invalidKey)

        let key = SecretBytes.random(count: CipherState.keyLength)
        var sender = try CipherState(key: key)
        var receiver = try CipherState(key: key)
        let sealed = try sender.encryptWithAd([7], [1, 2, 3])
        #expect(sender.nonce == 1)
        let wrongAd = #expect(throws: NoiseError.self) { _ = try receiver.decryptWithAd([8], sealed) }
        #expect(wrongAd?.code == .decryptionFailed)
        #expect(receiver.nonce == 0)
        #expect(try receiver.decryptWithAd([7], sealed) == [1, 2, 3])

        sender.setNonce(UInt64.max - 1)
        receiver.setNonce(UInt64.max - 1)
        #expect(try receiver.decryptWithAd([], try sender.encryptWithAd([], [42])) == [42])
        #expect(sender.nonce == UInt64.max)
        let exhausted = #expect(throws: NoiseError.self) { _ = try sender.encryptWithAd([], [1]) }
        #expect(exhausted?.code == .nonceExhausted)
        let exhaustedIn = #expect(throws: NoiseError.self) { _ = try receiver.decryptWithAd([], sealed) }
        #expect(exhaustedIn?.code == .nonceExhausted)

        // Rekey keeps the nonce, changes the key, and both sides agree.
        var a = try CipherState(key: key)
        var b = try CipherState(key: key)
        let before = try a.encryptWithAd([], [0])
        try a.rekey()
        try b.rekey()
        #expect(a.nonce == 1 && b.nonce == 0)
        b.setNonce(1)
        let after = try a.encryptWithAd([], [0])
        #expect(try b.decryptWithAd([], after) == [0])
        var stale = try CipherState(key: key)
        stale.setNonce(1)
        #expect(throws: NoiseError.self) { _ = try stale.decryptWithAd([], after) }
        #expect(before != after)
    }

    @Test("protocol names and the 32-byte padding rule")
    func protocolNames() {
        #expect(NoisePattern.xx.protocolName == "Noise_XX_25519_ChaChaPoly_SHA256")
        #expect(NoisePattern.xxpsk3.protocolName == "Noise_XXpsk3_25519_ChaChaPoly_SHA256")
        // 32 bytes exactly: h is the name itself (§5.2).
        let xx = SymmetricState(protocolName: NoisePattern.xx.protocolName)
        #expect(xx.handshakeHash == Array(NoisePattern.xx.protocolName.utf8))
        let short = SymmetricState(protocolName: "Noise")
        #expect(short.handshakeHash == Array("Noise".utf8) + [UInt8](repeating: 0, count: 27))
        let long = SymmetricState(protocolName: NoisePattern.xxpsk3.protocolName)
        #expect(
            long.handshakeHash.count == 32
                && long.handshakeHash != Array(NoisePattern.xxpsk3.protocolName.utf8.prefix(32)))
    }
}
