public import Foundation

/// The content of a generation marker: which life of which store's log (`epoch`), which
/// collection, and the snapshot `seq` the content enumeration paged.
///
/// Encoded in 29 bytes: version 1, the 16-byte epoch, the snapshot seq (8 bytes, big-endian),
/// and the FNV-1a hash of the collection name (4 bytes, big-endian). Hosts treat it as opaque.
public struct GenerationMarker: Sendable, Hashable {
    public var epoch: [UInt8]
    public var snapshot: Int64
    public var collectionHash: UInt32

    static let version: UInt8 = 1
    /// The size of an encoded marker, bytes.
    public static let encodedSize = 29

    public init(epoch: [UInt8], snapshot: Int64, collection: String) {
        self.epoch = epoch
        self.snapshot = snapshot
        self.collectionHash = Self.hash(collection)
    }

    /// FNV-1a, 32 bits, of the UTF-8 bytes.
    static func hash(_ text: String) -> UInt32 {
        var h: UInt32 = 0x811c_9dc5
        for b in text.utf8 {
            h ^= UInt32(b)
            h &*= 0x0100_0193
        }
        return h
    }

    /// The opaque bytes.
    public var data: Data {
        var bytes: [UInt8] = [Self.version]
        bytes += epoch.count == 16 ? epoch : Array((epoch + [UInt8](repeating: 0, count: 16)).prefix(16))
        bytes += (0..<8).map { UInt8(truncatingIfNeeded: UInt64(bitPattern: snapshot) >> (56 - 8 * $0)) }
        bytes += (0..<4).map { UInt8(truncatingIfNeeded: collectionHash >> (24 - 8 * $0)) }
        return Data(bytes)
    }

    /// Decodes a marker; `nil` for anything that is not one (wrong size or version).
    public init?(data: Data) {
        let bytes = [UInt8](data)
        guard bytes.count == Self.encodedSize, bytes[0] == Self.version else { return nil }
        epoch = Array(bytes[1..<17])
        var seq: UInt64 = 0
        for b in bytes[17..<25] { seq = seq << 8 | UInt64(b) }
        snapshot = Int64(bitPattern: seq)
        var h: UInt32 = 0
        for b in bytes[25..<29] { h = h << 8 | UInt32(b) }
        collectionHash = h
    }
}
