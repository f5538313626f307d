/// Appends CBOR (RFC 8949) to one growing byte buffer, in preferred serialisation (§4.1):
/// shortest argument encodings and floats in the narrowest exact width.
///
/// Use it to encode wire messages field by field without building a ``Value`` first. Writing a
/// ``Value`` produces core deterministic encoding (§4.2.1); for hand-written maps the caller
/// writes keys in deterministic order (text keys: shorter first, then bytewise).
///
/// ```swift
/// var writer = CBORWriter()
/// writer.writeMapHeader(count: 2)
/// writer.writeText("id"); writer.writeInt(7)
/// writer.writeText("ok"); writer.writeBool(true)
/// let bytes = writer.bytes   // a2 62 69 64 07 62 6f 6b f5
/// ```
public struct CBORWriter: Sendable {
    /// Everything written so far.
    public var bytes: [UInt8]

    /// A writer with room for `capacity` bytes before the buffer has to grow.
    public init(capacity: Int = 256) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    /// A writer that appends to existing bytes.
    public init(appendingTo bytes: [UInt8]) {
        self.bytes = bytes
    }

    /// Writes an initial byte and argument in the shortest form (RFC 8949 §3, §4.2.1).
    ///
    /// - Parameters:
    ///   - major: major type 0–7.
    ///   - argument: the argument (value, length, count or tag number).
    public mutating func writeHead(major: UInt8, argument: UInt64) {
        let initial = major << 5
        if argument < 24 {
            bytes.append(initial | UInt8(truncatingIfNeeded: argument))
        } else if argument <= 0xff {
            bytes.append(initial | 24)
            bytes.append(UInt8(truncatingIfNeeded: argument))
        } else if argument <= 0xffff {
            bytes.append(initial | 25)
            appendBigEndian(argument, byteCount: 2)
        } else if argument <= 0xffff_ffff {
            bytes.append(initial | 26)
            appendBigEndian(argument, byteCount: 4)
        } else {
            bytes.append(initial | 27)
            appendBigEndian(argument, byteCount: 8)
        }
    }

    private mutating func appendBigEndian(_ value: UInt64, byteCount: Int) {
        var shift = (byteCount - 1) * 8
        while shift >= 0 {
            bytes.append(UInt8(truncatingIfNeeded: value >> UInt64(shift)))
            shift -= 8
        }
    }

    /// Writes an integer: major type 0 for values ≥ 0, major type 1 otherwise.
    public mutating func writeInt(_ value: Int64) {
        if value >= 0 {
            writeHead(major: 0, argument: UInt64(value))
        } else {
            writeHead(major: 1, argument: UInt64(bitPattern: ~value))
        }
    }

    /// Writes an unsigned integer (major type 0).
    public mutating func writeUnsigned(_ value: UInt64) {
        writeHead(major: 0, argument: value)
    }

    /// Writes a float in the narrowest of binary16/32/64 that keeps its bits exactly, so -0.0
    /// keeps its sign and NaN is `f97e00` (RFC 8949 §4.1, §4.2.1).
    public mutating func writeDouble(_ value: Double) {
        if let half = CBORFloat.half(exactly: value) {
            bytes.append(0xf9)
            appendBigEndian(UInt64(half), byteCount: 2)
        } else if let single = CBORFloat.single(exactly: value) {
            bytes.append(0xfa)
            appendBigEndian(UInt64(single), byteCount: 4)
        } else {
            bytes.append(0xfb)
            appendBigEndian(value.bitPattern, byteCount: 8)
        }
    }

    /// Writes `true` (`f5`) or `false` (`f4`).
    public mutating func writeBool(_ value: Bool) {
        bytes.append(value ? 0xf5 : 0xf4)
    }

    /// Writes `null` (`f6`).
    public mutating func writeNull() {
        bytes.append(0xf6)
    }

    /// Writes a text string (major type 3) with the string's UTF-8 bytes as they are.
    public mutating func writeText(_ text: String) {
        let utf8 = text.utf8
        writeHead(major: 3, argument: UInt64(utf8.count))
        bytes.append(contentsOf: utf8)
    }

    /// Writes a byte string (major type 2).
    public mutating func writeBytes(_ data: [UInt8]) {
        writeHead(major: 2, argument: UInt64(data.count))
        bytes.append(contentsOf: data)
    }

    /// Writes the head of a definite-length array; the caller then writes `count` items.
    public mutating func writeArrayHeader(count: Int) {
        writeHead(major: 4, argument: UInt64(count))
    }

    /// Writes the head of a definite-length map; the caller then writes `count` key/value pairs.
    public mutating func writeMapHeader(count: Int) {
        writeHead(major: 5, argument: UInt64(count))
    }

    /// Writes a tag head; the caller then writes the tag content.
    public mutating func writeTag(_ tag: UInt64) {
        writeHead(major: 6, argument: tag)
    }

    /// Writes a value in core deterministic encoding (RFC 8949 §4.2.1): map keys sorted by
    /// their encoded bytes, which for text keys is shorter first, then bytewise.
    ///
    /// Doubles are written as given; non-finite ones become `f97e00` / `f97c00` / `f9fc00`,
    /// which ``CBOR/decode(_:options:)`` rejects, so validate first (``Value/validate(path:)``).
    ///
    /// - Complexity: O(n + k log k) for n nodes, k the size of the largest map.
    public mutating func write(_ value: Value) {
        switch value {
        case .null: bytes.append(0xf6)
        case .bool(let b): bytes.append(b ? 0xf5 : 0xf4)
        case .int(let i): writeInt(i)
        case .double(let d): writeDouble(d)
        case .string(let s): writeText(s)
        case .bytes(let b): writeBytes(b)
        case .array(let items):
            writeHead(major: 4, argument: UInt64(items.count))
            for item in items { write(item) }
        case .map(let entries):
            writeHead(major: 5, argument: UInt64(entries.count))
            if entries.count == 1, let entry = entries.first {
                writeText(entry.key)
                write(entry.value)
                return
            }
            // The map is in byte order; deterministic CBOR wants shorter keys first. Sort positions,
            // not entries: no copies of keys or values, and small maps sort in a stack buffer.
            withUnsafeTemporaryAllocation(of: Int.self, capacity: entries.count) { order in
                var filled = 0
                for position in entries.indices where filled < order.count {
                    order.initializeElement(at: filled, to: position)
                    filled += 1
                }
                var sorted = UnsafeMutableBufferPointer(rebasing: order[..<filled])
                // Stable by length: equal lengths keep their byte order, which is the CBOR order.
                sorted.sort { a, b in
                    let (lengthA, lengthB) = (entries[a].key.utf8.count, entries[b].key.utf8.count)
                    return lengthA != lengthB ? lengthA < lengthB : a < b
                }
                for position in sorted {
                    let entry = entries[position]
                    writeText(entry.key)
                    write(entry.value)
                }
                _ = sorted.deinitialize()
            }
        }
    }

    /// Writes an item in preferred serialisation (RFC 8949 §4.1), map pairs in their given order.
    public mutating func write(_ item: CBORItem) {
        switch item {
        case .unsigned(let n): writeHead(major: 0, argument: n)
        case .negative(let n): writeHead(major: 1, argument: n)
        case .byteString(let b): writeBytes(b)
        case .textString(let s): writeText(s)
        case .array(let items):
            writeHead(major: 4, argument: UInt64(items.count))
            for element in items { write(element) }
        case .map(let pairs):
            writeHead(major: 5, argument: UInt64(pairs.count))
            for pair in pairs {
                write(pair.key)
                write(pair.value)
            }
        case .tagged(let tag, let content):
            writeHead(major: 6, argument: tag)
            write(content)
        case .simple(let n): writeHead(major: 7, argument: UInt64(n))
        case .bool(let b): writeBool(b)
        case .null: writeNull()
        case .undefined: bytes.append(0xf7)
        case .float(let d, _): writeDouble(d)
        }
    }

    /// Deterministic order of text keys: by encoded bytes, which is shorter UTF-8 first, then
    /// bytewise (RFC 8949 §4.2.1).
    static func keyPrecedes(_ a: String, _ b: String) -> Bool {
        let countA = a.utf8.count
        let countB = b.utf8.count
        if countA != countB { return countA < countB }
        let fast = a.utf8.withContiguousStorageIfAvailable { bufferA in
            b.utf8.withContiguousStorageIfAvailable { bufferB in
                for i in 0..<bufferA.count where bufferA[i] != bufferB[i] {
                    return bufferA[i] < bufferB[i]
                }
                return false
            }
        }
        if let result = fast ?? nil { return result }
        return a.utf8.lexicographicallyPrecedes(b.utf8)
    }
}
