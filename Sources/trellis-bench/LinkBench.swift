import CSodium
import Foundation
import Synchronization
import TrellisCrypto
import TrellisNet

// Link figures: the encrypted link (SecureLink) against plain loopback TCP, and against
// libsodium's ChaCha20-Poly1305 alone on the link's frame size, in the same run.

/// Plaintext megabytes per second of libsodium's `crypto_aead_chacha20poly1305_ietf` (the
/// link's cipher, Noise's ChaChaPoly) on `bytes` bytes in frames of `frame` bytes, into buffers
/// allocated once, on one thread: sealing every frame, or opening every frame.
func rawAEADMegabytesPerSecond(bytes: Int, frame: Int) -> (seal: Double, open: Double) {
    Sodium.initialize()
    let key = [UInt8](repeating: 7, count: Int(crypto_aead_chacha20poly1305_ietf_KEYBYTES))
    let plaintext = [UInt8](repeating: 0x5A, count: frame)
    let frames = bytes / frame
    var sealed = [UInt8](repeating: 0, count: frame + Int(crypto_aead_chacha20poly1305_ietf_ABYTES))
    var opened = [UInt8](repeating: 0, count: frame)
    let nonce = [UInt8](repeating: 0, count: Int(crypto_aead_chacha20poly1305_ietf_NPUBBYTES))
    var sealedLength: UInt64 = 0
    let sealStart = nowNanos()
    for _ in 0..<frames {
        _ = crypto_aead_chacha20poly1305_ietf_encrypt(
            &sealed, &sealedLength, plaintext, UInt64(frame), nil, 0, nil, nonce, key)
    }
    let sealSeconds = Double(nowNanos() - sealStart) / 1e9
    let openStart = nowNanos()
    for _ in 0..<frames {
        var openedLength: UInt64 = 0
        let status = crypto_aead_chacha20poly1305_ietf_decrypt(
            &opened, &openedLength, nil, sealed, sealedLength, nil, 0, nonce, key)
        precondition(status == 0 && openedLength == UInt64(frame), "a sealed frame did not open")
    }
    let openSeconds = Double(nowNanos() - openStart) / 1e9
    let megabytes = Double(frames * frame) / 1e6
    return (megabytes / sealSeconds, megabytes / openSeconds)
}

/// The CPU time (user and system, every thread of this process) `body` takes, in milliseconds
/// per megabyte of `megabytes`.
func cpuMillisecondsPerMegabyte(_ megabytes: Double, _ body: () throws -> Void) rethrows -> Double {
    let before = processCPUSeconds()
    try body()
    return (processCPUSeconds() - before) * 1000 / megabytes
}

/// Two handshaken ``SecureLink``s over loopback, not started.
func secureLinkPair() throws -> (client: SecureLink, server: SecureLink) {
    Sodium.initialize()
    let meshKey = SecretBytes.random(count: 32)
    let listener = try TCPListener(endpoint: Endpoint(host: "127.0.0.1", port: 0))
    defer { listener.close() }
    let accepted = Mutex<SecureLink?>(nil)
    let done = DispatchSemaphore(value: 0)
    let identity = KeyPair.generate()
    Thread {
        if let socket = try? listener.accept() {
            let link = try? SecureLink.handshake(
                socket: socket, initiator: false, identity: identity, meshKey: meshKey, address: "client")
            accepted.withLock { $0 = link }
        }
        done.signal()
    }.start()
    let socket = try TCPSocket.connect(to: Endpoint(host: "127.0.0.1", port: listener.port))
    let client = try SecureLink.handshake(
        socket: socket, initiator: true, identity: .generate(), meshKey: meshKey, address: "server")
    done.wait()
    guard let server = accepted.withLock({ $0 }) else { throw CocoaError(.fileReadUnknown) }
    return (client, server)
}

/// Seconds to move `messages` messages of `size` bytes one way over a SecureLink, from the first
/// send until the receiver has the last one.
///
/// - Parameter rekeyEvery: transport messages between the sender's rekeys (default: the link's
///   own schedule, 2^20, which a run this size never reaches).
func secureLinkBulkSeconds(messages: Int, size: Int, rekeyEvery: Int = SecureLink.rekeyInterval) throws -> Double {
    let (client, server) = try secureLinkPair()
    client.rekeySooner(messages: rekeyEvery)
    let received = Atomic<Int>(0)
    let finished = DispatchSemaphore(value: 0)
    server.start(
        onMessage: { _ in
            if received.add(1, ordering: .relaxed).newValue == messages { finished.signal() }
        }, onClose: { _ in })
    client.start(onMessage: { _ in }, onClose: { _ in })
    let payload = [UInt8](repeating: 0x5A, count: size)
    let start = nowNanos()
    for _ in 0..<messages { _ = try client.send(payload) }
    guard finished.wait(timeout: .now() + 120) == .success else { throw CocoaError(.fileReadUnknown) }
    let elapsed = Double(nowNanos() - start) / 1e9
    client.close()
    server.close()
    return elapsed
}

/// Seconds to move `bytes` bytes one way over a plain loopback TCP connection in this process, in
/// writes of `chunk` bytes.
func rawLoopbackBulkSeconds(bytes: Int, chunk: Int) throws -> Double {
    let listener = try TCPListener(endpoint: Endpoint(host: "127.0.0.1", port: 0))
    defer { listener.close() }
    let accepted = Mutex<TCPSocket?>(nil)
    let ready = DispatchSemaphore(value: 0)
    Thread {
        accepted.withLock { $0 = try? listener.accept() }
        ready.signal()
    }.start()
    let client = try TCPSocket.connect(to: Endpoint(host: "127.0.0.1", port: listener.port))
    ready.wait()
    guard let server = accepted.withLock({ $0 }) else { throw CocoaError(.fileReadUnknown) }
    let finished = DispatchSemaphore(value: 0)
    Thread {
        var got = 0
        while got < bytes, let data = try? server.read(exactly: min(chunk, bytes - got)) { got += data.count }
        finished.signal()
    }.start()
    let payload = [UInt8](repeating: 0x5A, count: chunk)
    let start = nowNanos()
    var sent = 0
    while sent < bytes {
        try client.write(sent + chunk <= bytes ? payload : Array(payload[0..<(bytes - sent)]))
        sent += chunk
    }
    finished.wait()
    let elapsed = Double(nowNanos() - start) / 1e9
    client.close()
    server.close()
    return elapsed
}

/// Round trips of a 64-byte message over a SecureLink (the peer echoes it), in milliseconds.
func secureLinkRoundTrips(_ count: Int) throws -> [Double] {
    let (client, server) = try secureLinkPair()
    server.start(onMessage: { message in _ = try? server.send(message) }, onClose: { _ in })
    let arrived = DispatchSemaphore(value: 0)
    client.start(onMessage: { _ in arrived.signal() }, onClose: { _ in })
    let payload = [UInt8](repeating: 7, count: 64)
    var samples: [Double] = []
    for round in 0..<(count + 50) {
        let start = nowNanos()
        _ = try client.send(payload)
        guard arrived.wait(timeout: .now() + 10) == .success else { throw CocoaError(.fileReadUnknown) }
        if round >= 50 { samples.append(Double(nowNanos() - start) / 1e6) }
    }
    client.close()
    server.close()
    return samples
}

func linkFigures() throws -> [Figure] {
    let messages = 512
    let size = 1 << 20
    let megabytes = Double(messages * size) / 1e6
    let raw = megabytes / (try rawLoopbackBulkSeconds(bytes: messages * size, chunk: 1 << 20))
    var link = 0.0
    let linkCPU = try cpuMillisecondsPerMegabyte(megabytes) {
        link = megabytes / (try secureLinkBulkSeconds(messages: messages, size: size))
    }
    // A rekey every 16 transport messages (1 MiB): 65,536 times the default rate, an upper bound
    // on what rekeying costs.
    let rekeying = megabytes / (try secureLinkBulkSeconds(messages: messages, size: size, rekeyEvery: 16))
    let frame = NoiseTransport.maxPlaintextLength
    // A link seals on the sender's thread and opens on the receiver's, so at best it runs at
    // the slower of the two.
    let aead = rawAEADMegabytesPerSecond(bytes: messages * size, frame: frame)
    let aeadBound = min(aead.seal, aead.open)
    let aeadBoundName = aead.seal < aead.open ? "aead_seal_mb_per_s" : "aead_open_mb_per_s"
    // The CPU the link cannot avoid on a megabyte: sealing it, opening it, and moving it through
    // loopback TCP in frames of the link's size (both ends' system calls and the kernel's copies).
    let wireFrame = frame + 16 + 2  // a full frame on the wire: its length, the sealed text, the tag
    // The least of three runs: the floor, not this machine's noise.
    let tcpCPU = try (0..<3).map { _ in
        try cpuMillisecondsPerMegabyte(megabytes) {
            _ = try rawLoopbackBulkSeconds(bytes: messages * size, chunk: wireFrame)
        }
    }.min()!
    let floorCPU = 1000 / aead.seal + 1000 / aead.open + tcpCPU
    // With every core busy on that work alone: the most a link could move on this machine.
    let cores = Double(ProcessInfo.processInfo.activeProcessorCount)
    let coreBound = cores * 1000 / floorCPU
    let rawRTT = quantile(try loopbackRoundTrips(2000), 0.5)
    let linkRTT = try secureLinkRoundTrips(2000)
    return [
        Figure(name: "raw_loopback_tcp_mb_per_s", value: raw, unit: "MB/s"),
        Figure(
            name: "link_bulk_mb_per_s", value: link, unit: "MB/s", baseline: raw,
            baselineName: "raw_loopback_tcp_mb_per_s"),
        Figure(name: "aead_seal_mb_per_s", value: aead.seal, unit: "MB/s"),
        Figure(name: "aead_open_mb_per_s", value: aead.open, unit: "MB/s"),
        Figure(
            name: "link_bulk_vs_aead_mb_per_s", value: link, unit: "MB/s", baseline: aeadBound,
            baselineName: aeadBoundName),
        Figure(name: "link_floor_cpu_ms_per_mb", value: floorCPU, unit: "ms/MB"),
        Figure(
            name: "link_bulk_cpu_ms_per_mb", value: linkCPU, unit: "ms/MB", baseline: floorCPU,
            baselineName: "link_floor_cpu_ms_per_mb"),
        Figure(
            name: "link_bulk_bound_on_these_cores_mb_per_s", value: min(coreBound, aeadBound), unit: "MB/s",
            baseline: aeadBound,
            baselineName: aeadBoundName),
        Figure(
            name: "link_bulk_rekey_every_16_mb_per_s", value: rekeying, unit: "MB/s", baseline: link,
            baselineName: "link_bulk_mb_per_s"),
        Figure(name: "raw_loopback_rtt_p50_ms", value: rawRTT, unit: "ms"),
        Figure(
            name: "link_round_trip_p50_ms", value: quantile(linkRTT, 0.5), unit: "ms", baseline: rawRTT,
            baselineName: "raw_loopback_rtt_p50_ms"),
        Figure(
            name: "link_round_trip_p99_ms", value: quantile(linkRTT, 0.99), unit: "ms",
            baseline: quantile(try loopbackRoundTrips(2000), 0.99), baselineName: "raw_loopback_rtt_p99_ms"),
    ]
}
