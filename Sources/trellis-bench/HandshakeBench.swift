import Foundation
import TrellisCrypto

// Handshake figures: what a listener spends on a stranger's first message under the older
// Noise_XXpsk3 (it answers with message 2: an ephemeral key, two DH, its static key) against
// Noise_XXpsk0 (it checks message 1's psk-keyed tag and stops), and the CPU time of a whole XXpsk0
// handshake per side. In process, no I/O. Every figure is CPU time of the calling thread
// (`CLOCK_THREAD_CPUTIME_ID`), not wall time: on a shared machine wall time also counts the time
// the thread waited for a core, which was up to twice the work itself.

/// Nanoseconds of CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`).
func threadCPUNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// Microseconds of this thread's CPU time per call of `body`, over `count` calls after 50 warm-up
/// calls.
func microsecondsPerCall(_ count: Int, _ body: () throws -> Void) rethrows -> Double {
    for _ in 0..<50 { try body() }
    let start = threadCPUNanoseconds()
    for _ in 0..<count { try body() }
    return Double(threadCPUNanoseconds() - start) / 1e3 / Double(count)
}

func handshakeFigures(count: Int = 2_000) throws -> [Figure] {
    Sodium.initialize()
    let meshKey = SecretBytes.random(count: 32)
    let strangerKey = SecretBytes.random(count: 32)
    let responderStatic = KeyPair.generate()
    let prologue = Array("trellis/bench".utf8)
    func start(_ pattern: NoisePattern, _ role: NoiseRole, _ psk: SecretBytes, _ keys: KeyPair = .generate()) throws
        -> HandshakeState
    {
        try HandshakeState(pattern: pattern, role: role, prologue: prologue, staticKeyPair: keys, psk: psk)
    }
    // A stranger's message 1 under each pattern (a fresh one per call would only add the
    // stranger's own cost; the listener's work is the same for any message 1).
    var stranger3 = try start(.xxpsk3, .initiator, strangerKey)
    let message1Old = try stranger3.writeMessage()
    var stranger0 = try start(.xxpsk0, .initiator, strangerKey)
    let message1New = try stranger0.writeMessage()

    let xxpsk3Stranger = try microsecondsPerCall(count) {
        var responder = try start(.xxpsk3, .responder, meshKey, responderStatic)
        _ = try responder.readMessage(message1Old)
        _ = try responder.writeMessage()
    }
    let xxpsk0Stranger = try microsecondsPerCall(count) {
        var responder = try start(.xxpsk0, .responder, meshKey, responderStatic)
        _ = try? responder.readMessage(message1New)
    }
    // A whole XXpsk0 handshake: each side's share measured separately.
    var initiatorMicros = 0.0
    var responderMicros = 0.0
    for round in 0..<(count + 50) {
        var initiator = try start(.xxpsk0, .initiator, meshKey)
        var responder = try start(.xxpsk0, .responder, meshKey, responderStatic)
        var t = threadCPUNanoseconds()
        let m1 = try initiator.writeMessage()
        let i1 = threadCPUNanoseconds() - t
        t = threadCPUNanoseconds()
        _ = try responder.readMessage(m1)
        let m2 = try responder.writeMessage()
        let r1 = threadCPUNanoseconds() - t
        t = threadCPUNanoseconds()
        _ = try initiator.readMessage(m2)
        let m3 = try initiator.writeMessage()
        _ = try initiator.split()
        let i2 = threadCPUNanoseconds() - t
        t = threadCPUNanoseconds()
        _ = try responder.readMessage(m3)
        _ = try responder.split()
        let r2 = threadCPUNanoseconds() - t
        if round >= 50 {
            initiatorMicros += Double(i1 + i2) / 1e3
            responderMicros += Double(r1 + r2) / 1e3
        }
    }
    initiatorMicros /= Double(count)
    responderMicros /= Double(count)
    return [
        Figure(name: "listener_on_stranger_message1_xxpsk3_us", value: xxpsk3Stranger, unit: "µs"),
        Figure(
            name: "listener_on_stranger_message1_xxpsk0_us", value: xxpsk0Stranger, unit: "µs",
            baseline: xxpsk3Stranger, baselineName: "listener_on_stranger_message1_xxpsk3_us"),
        Figure(name: "handshake_xxpsk0_initiator_cpu_us", value: initiatorMicros, unit: "µs"),
        Figure(name: "handshake_xxpsk0_responder_cpu_us", value: responderMicros, unit: "µs"),
        Figure(
            name: "handshakes_xxpsk0_per_s_per_core_one_side", value: 1e6 / ((initiatorMicros + responderMicros) / 2),
            unit: "handshakes/s"),
    ]
}
