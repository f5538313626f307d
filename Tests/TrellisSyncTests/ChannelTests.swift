import Foundation
import Testing
import TrellisCrypto
import TrellisTestKit

@testable import Trellis
@testable import TrellisNet

/// The secure channel's own guarantees: rekeying in step (by count and by time), the
/// authenticated close told apart from a bare TCP close, and every tampered, cut, replayed or
/// reordered frame closing the link under its own reason and counter.
@Suite struct ChannelTests {
    /// What a forger on the path does to the frames of a link before they reach the receiver.
    enum Interference: String, CaseIterable, Sendable, CustomStringConvertible {
        case flippedBit, cutFrame, replayedFrame, swappedFrames, authenticatedClose, plainClose, reset
        var description: String { rawValue }

        /// The reason the receiving link must give.
        var expected: LinkCloseReason {
            switch self {
            case .flippedBit: return .tampered
            case .cutFrame: return .truncated
            case .replayedFrame: return .replayed
            case .swappedFrames: return .reordered
            case .authenticatedClose: return .peerClosed
            case .plainClose, .reset: return .unauthenticatedClose
            }
        }

        /// Writes the interfered-with traffic of `sender` on `socket`: the start of a message
        /// (never delivered, so the receiver's session sees nothing), then the interference.
        func apply(_ sender: inout TransportSender, _ socket: TCPSocket) throws {
            // Two transport messages, each a piece of one 100-byte message.
            let first = try sender.seal([0, 0, 0, 100] + [UInt8](repeating: 1, count: 10))
            let second = try sender.seal([UInt8](repeating: 2, count: 10))
            switch self {
            case .flippedBit:
                var bad = second
                bad[7] ^= 0x10
                try socket.write(first + bad)
            case .cutFrame:
                try socket.write(first + second.prefix(second.count / 2))
                socket.close()
            case .replayedFrame:
                try socket.write(first + second + second)
            case .swappedFrames:
                try socket.write(second + first)
            case .authenticatedClose:
                try socket.write(first + second + sender.seal([]))
            case .plainClose:
                try socket.write(first)
                socket.close()
            case .reset:
                try socket.write(first)
                socket.reset()
            }
        }
    }

    /// Takes the sending half out of a handshaken, unstarted link, so a test can forge its traffic.
    func takeSender(_ link: SecureLink) throws -> TransportSender {
        try #require(
            link.halves.withLock { h in
                defer { h = nil }
                return h?.sender
            })
    }

    /// Each interference closes the receiving link with its own reason.
    @Test(arguments: Interference.allCases)
    func eachInterferenceClosesTheLinkWithItsReason(_ interference: Interference) throws {
        let (client, server) = try securePair()
        let recorder = LinkRecorder()
        recorder.start(server)
        var sender = try takeSender(client)
        try interference.apply(&sender, client.socket)
        #expect(recorder.waitForClose())
        #expect(server.closeReason == interference.expected, "\(recorder.closeReasons)")
        #expect(recorder.messages.isEmpty)
        client.socket.close()
    }

    /// The same through a node: the link is closed and counted under its reason, and `status`
    /// shows the count.
    @Test(arguments: Interference.allCases)
    func aNodeCountsEachKindOfClose(_ interference: Interference) throws {
        let dir = TemporaryDirectory()
        let key = MeshKey.generate()
        let node = try TrellisNode(directory: dir.url.appendingPathComponent("n"), meshKey: key)
        defer { node.stop() }
        let port = try node.listen(on: Endpoint(host: "127.0.0.1", port: 0))
        let socket = try TCPSocket.connect(to: Endpoint(host: "127.0.0.1", port: port))
        let link = try SecureLink.handshake(
            socket: socket, initiator: true, identity: .generate(), meshKey: key.secret, address: "node")
        var sender = try takeSender(link)
        try interference.apply(&sender, socket)
        let reason = interference.expected
        #expect(eventually { (try? node.status().linkCloses[reason]) == 1 })
        let status = try node.status()
        #expect(status.linkCloses.values.reduce(0, +) == 1, "\(status.linkCloses)")
        #expect(status.description.contains("links closed: \(reason) 1"), "\(status.description)")
        socket.close()
    }

    /// With the message bound set low, both directions rekey in step (every marker sent is
    /// received) many times while messages of every size keep flowing both ways.
    @Test func rekeyingAtTheMessageBoundKeepsDataFlowingBothWays() throws {
        let (client, server) = try securePair(rekeyInterval: 7)
        let serverSide = LinkRecorder { message in _ = try? server.send(Array(message.reversed())) }
        serverSide.start(server)
        let clientSide = LinkRecorder()
        clientSide.start(client)
        let messages = (0..<300).map { testMessage($0, count: $0 % 10 == 0 ? 150_000 : $0 * 7) }
        for message in messages { try client.send(message) }
        #expect(eventually { clientSide.messageCount == messages.count })
        #expect(serverSide.messages == messages)
        #expect(clientSide.messages == messages.map { Array($0.reversed()) })
        // About 4.8 MB each way, 75 or more transport messages. A rekey is due after 7 and goes at
        // the next message boundary: at most 7 + 3 (the rest of a 150,000-byte message begun in
        // the 7th) + the marker under one key.
        for link in [client, server] {
            #expect(link.sentRekeys.load(ordering: .relaxed) >= 5)
            #expect((8...11).contains(link.longestSendRun.load(ordering: .relaxed)))
        }
        client.close()
        #expect(clientSide.waitForClose())
        #expect(serverSide.waitForClose())
        #expect(server.receivedRekeys.load(ordering: .relaxed) == client.sentRekeys.load(ordering: .relaxed))
        #expect(client.receivedRekeys.load(ordering: .relaxed) == server.sentRekeys.load(ordering: .relaxed))
        #expect(server.closeReason == .peerClosed)
        #expect(client.closeReason == .closedHere)
    }

    /// With the time bound at zero (and the message bound out of reach), the sender rekeys before
    /// every message and the receiver follows.
    @Test func rekeyingAtTheTimeBoundKeepsDataFlowing() throws {
        let (client, server) = try securePair()
        client.rekeySooner(time: .zero)
        let serverSide = LinkRecorder { message in _ = try? server.send(message) }
        serverSide.start(server)
        let clientSide = LinkRecorder()
        clientSide.start(client)
        let messages = (0..<50).map { testMessage($0, count: 100 + $0) }
        for message in messages {
            try client.send(message)
            #expect(eventually { clientSide.messages.last == message })
        }
        #expect(client.sentRekeys.load(ordering: .relaxed) >= messages.count)
        #expect(server.sentRekeys.load(ordering: .relaxed) == 0)
        client.close()
        #expect(serverSide.waitForClose())
        #expect(server.receivedRekeys.load(ordering: .relaxed) == client.sentRekeys.load(ordering: .relaxed))
    }

    /// The sender's schedule: due after exactly `messages` transport messages, or once the
    /// interval has passed, and not before; a rekey starts the count again.
    @Test func aRekeyIsDueAtTheBoundAndNotBefore() throws {
        Sodium.initialize()
        let start = ContinuousClock.now
        var sender = TransportSender(
            try CipherState(key: .random(count: 32)), policy: RekeyPolicy(messages: 5, interval: .seconds(600)),
            now: start)
        for _ in 0..<4 { _ = try sender.seal([1]) }
        #expect(!sender.rekeyDue(now: start))
        _ = try sender.seal([1])
        #expect(sender.rekeyDue(now: start))
        _ = try sender.sealRekey(now: start)
        #expect(!sender.rekeyDue(now: start + .seconds(599)))
        #expect(sender.rekeyDue(now: start + .seconds(600)))
        #expect(sender.rekeys == 1)
    }

    /// A marker inside a message is data, and FF FF FF FF followed by more bytes at a boundary is
    /// a length above the limit: the link closes as malformed.
    @Test func aMarkerWithMoreBytesIsMalformed() throws {
        let (client, server) = try securePair()
        let recorder = LinkRecorder()
        recorder.start(server)
        var sender = try takeSender(client)
        try client.socket.write(
            sender.seal([0, 0, 0, 4]) + sender.seal(rekeyMarker) + sender.seal(rekeyMarker + [0]))
        #expect(recorder.waitForClose())
        #expect(recorder.messages == [rekeyMarker])
        #expect(server.closeReason == .malformed)
        client.socket.close()
    }
}
