import Testing
import TrellisCrypto
import TrellisTestKit

@testable import TrellisNet

/// The two decoders of a link's byte streams: 2-byte Noise frames on TCP, 4-byte application
/// messages in the plaintext stream. Each is fed one byte at a time, many messages per read, and
/// random splits.
@Suite struct FramingTests {
    static func frame(_ message: [UInt8]) -> [UInt8] {
        [UInt8(message.count >> 8), UInt8(message.count & 0xFF)] + message
    }

    static func prefixed(_ message: [UInt8]) -> [UInt8] {
        let n = UInt32(message.count)
        return [UInt8(n >> 24), UInt8((n >> 16) & 0xFF), UInt8((n >> 8) & 0xFF), UInt8(n & 0xFF)] + message
    }

    static let frames: [[UInt8]] =
        [[], [1], Array(repeating: 2, count: 255), Array(repeating: 3, count: 256)]
        + [testMessage(1, count: 65535), testMessage(2, count: 3)]

    static func decodeFrames(_ stream: [UInt8], cuts: [Int]) -> [[UInt8]] {
        var decoder = FrameDecoder()
        var out: [[UInt8]] = []
        var start = 0
        for cut in cuts + [stream.count] where cut >= start {
            decoder.feed(stream[start..<cut]) { out.append($0) }
            start = cut
        }
        #expect(decoder.bufferedBytes == 0)
        return out
    }

    @Test func framesDecodeOneByteAtATime() {
        let stream = Self.frames.flatMap(Self.frame)
        #expect(Self.decodeFrames(stream, cuts: Array(0..<stream.count)) == Self.frames)
    }

    @Test func manyFramesDecodeFromOneRead() {
        let many = (0..<500).map { testMessage($0, count: $0 % 37) }
        #expect(Self.decodeFrames(many.flatMap(Self.frame), cuts: []) == many)
    }

    @Test func framesDecodeWhateverTheReadsSplitThem() {
        let (generator, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        print("framesDecodeWhateverTheReadsSplitThem seed: \(seed) (replay with TRELLIS_SEED=\(seed))")
        var random = generator
        let stream = Self.frames.flatMap(Self.frame)
        for _ in 0..<50 {
            let cuts = (0..<Int(random.next() % 20)).map { _ in Int(random.next() % UInt64(stream.count)) }.sorted()
            #expect(Self.decodeFrames(stream, cuts: cuts) == Self.frames, "cuts \(cuts)")
        }
    }

    /// An unfinished frame is held, never delivered.
    @Test func aPartialFrameWaitsForItsEnd() {
        var decoder = FrameDecoder()
        var out: [[UInt8]] = []
        decoder.feed([0x00, 0x05, 1, 2][...]) { out.append($0) }
        #expect(out.isEmpty)
        #expect(decoder.bufferedBytes == 4)
        decoder.feed([3, 4, 5, 0x00][...]) { out.append($0) }
        #expect(out == [[1, 2, 3, 4, 5]])
        #expect(decoder.bufferedBytes == 1)
    }

    static func assemble(_ chunks: [[UInt8]], limit: Int = LinkLimits.maxMessageBytes) throws -> [[UInt8]] {
        var assembler = MessageAssembler(limit: limit)
        var out: [[UInt8]] = []
        for chunk in chunks { try assembler.append(chunk) { out.append($0) } }
        #expect(assembler.bufferedBytes == 0)
        return out
    }

    static let messages: [[UInt8]] = [[], [9], testMessage(3, count: 70_000), [], testMessage(4, count: 65_519)]

    @Test func messagesAssembleOneByteAtATime() throws {
        let stream = Self.messages.flatMap(Self.prefixed)
        #expect(try Self.assemble(stream.map { [$0] }) == Self.messages)
    }

    @Test func manyMessagesAssembleFromOnePlaintext() throws {
        let many = (0..<1000).map { testMessage($0, count: $0 % 50) }
        #expect(try Self.assemble([many.flatMap(Self.prefixed)]) == many)
    }

    @Test func messagesAssembleWhateverTheTransportSplits() throws {
        let (generator, seed) = SeededRandom.fromEnvironment(default: UInt64.random(in: .min ... .max))
        print("messagesAssembleWhateverTheTransportSplits seed: \(seed) (replay with TRELLIS_SEED=\(seed))")
        var random = generator
        let stream = Self.messages.flatMap(Self.prefixed)
        for _ in 0..<50 {
            var chunks: [[UInt8]] = []
            var index = 0
            while index < stream.count {
                let take = min(stream.count - index, Int(random.next() % 70_000) + 1)
                chunks.append(Array(stream[index..<(index + take)]))
                index += take
            }
            #expect(try Self.assemble(chunks) == Self.messages)
        }
    }

    /// A length above the limit stops the stream with an error naming both numbers; what came
    /// before it was delivered.
    @Test func anAnnouncedLengthAboveTheLimitIsRefused() {
        var assembler = MessageAssembler(limit: 100)
        var out: [[UInt8]] = []
        let stream = Self.prefixed([1, 2]) + [0, 0, 0, 101]
        #expect(throws: FramingError(announced: 101, limit: 100)) {
            try assembler.append(stream) { out.append($0) }
        }
        #expect(out == [[1, 2]])
        #expect("\(FramingError(announced: 101, limit: 100))".contains("101-byte message, above the 100-byte limit"))
        var huge = MessageAssembler()
        #expect(throws: FramingError(announced: Int(UInt32.max), limit: LinkLimits.maxMessageBytes)) {
            try huge.append([0xFF, 0xFF, 0xFF, 0xFF]) { _ in }
        }
    }

    /// The writer cuts the outbound stream into transport plaintexts of at most 65519 bytes,
    /// packing small messages together and splitting large ones, with nothing lost or reordered.
    @Test func theOutboundStreamPacksAndSplitsMessages() throws {
        let messages: [[UInt8]] =
            [[1, 2, 3], [], testMessage(5, count: 100_000)] + (0..<300).map { [UInt8($0 % 256)] }
        var pending = [messages]
        var stream = OutboundStream()
        var chunks: [[UInt8]] = []
        while true {
            let chunk = stream.nextChunk { pending.isEmpty ? [] : pending.removeFirst() }
            if chunk.isEmpty { break }
            chunks.append(chunk)
        }
        #expect(chunks.allSatisfy { $0.count <= NoiseTransport.maxPlaintextLength })
        #expect(chunks.dropLast().allSatisfy { $0.count == NoiseTransport.maxPlaintextLength })
        #expect(chunks.count == 2)
        #expect(try Self.assemble(chunks) == messages)
    }
}
