/// Reads one CBOR data item from untrusted bytes into a ``CBORItem`` or a ``Value``.
///
/// Every read is bounds-checked before it happens; lengths and counts are checked against the
/// bytes remaining before anything is allocated for them (an array item needs at least one byte,
/// a map pair two), so hostile lengths fail fast instead of reserving memory.
struct CBORReader {
    /// The initial byte and argument of one data item (RFC 8949 §3).
    struct Head {
        var major: UInt8
        /// Additional information, the low 5 bits of the initial byte.
        var info: UInt8
        /// The argument; for floats the raw bits; 0 for indefinite lengths.
        var argument: UInt64
        /// Offset of the initial byte.
        var offset: Int
        var isIndefinite: Bool { info == 31 }
    }

    let bytes: [UInt8]
    let options: CBOR.DecodingOptions
    private(set) var position = 0

    /// A reader of `bytes` from `offset` (an offset past the end reads as unexpected end).
    init(_ bytes: [UInt8], options: CBOR.DecodingOptions, from offset: Int = 0) {
        self.bytes = bytes
        self.options = options
        position = min(max(offset, 0), bytes.count)
    }

    var remaining: Int { bytes.count - position }

    /// Throws unless every byte has been read.
    func expectEnd() throws(CBORError) {
        guard position == bytes.count else {
            throw CBORError(
                .trailingBytes, offset: position,
                "\(remaining) byte(s) follow the top-level data item; expected exactly one item")
        }
    }

    // MARK: Heads

    mutating func readHead() throws(CBORError) -> Head {
        let offset = position
        guard position < bytes.count else {
            throw CBORError(.unexpectedEnd, offset: offset, "input ended where a data item should start")
        }
        let initial = bytes[position]
        position += 1
        let major = initial >> 5
        let info = initial & 0x1f
        let argument: UInt64
        switch info {
        case 0..<24:
            argument = UInt64(info)
        case 24...27:
            let count = 1 << Int(info - 24)
            guard count <= remaining else {
                throw CBORError(
                    .unexpectedEnd, offset: offset,
                    "initial byte 0x\(hex(initial)) needs \(count) argument byte(s), only \(remaining) remain")
            }
            var value: UInt64 = 0
            for i in position..<position + count { value = value << 8 | UInt64(bytes[i]) }
            position += count
            argument = value
            if options.requireDeterministic && major != 7 {
                let shortest: Bool
                switch info {
                case 24: shortest = value >= 24
                case 25: shortest = value > 0xff
                case 26: shortest = value > 0xffff
                default: shortest = value > 0xffff_ffff
                }
                guard shortest else {
                    throw CBORError(
                        .notDeterministic, offset: offset,
                        "argument \(value) is not in its shortest form (RFC 8949 §4.2.1)")
                }
            }
        case 28...30:
            throw CBORError(
                .reservedAdditionalInfo, offset: offset,
                "initial byte 0x\(hex(initial)) uses additional information \(info), reserved by RFC 8949 §3")
        default:
            switch major {
            case 0, 1, 6:
                throw CBORError(
                    .invalidIndefiniteLength, offset: offset,
                    "initial byte 0x\(hex(initial)): major type \(major) cannot have indefinite length")
            case 7:
                throw CBORError(
                    .unexpectedBreak, offset: offset,
                    "break (0xff) outside an indefinite-length item, or where a map value was expected")
            default:
                guard !options.requireDeterministic else {
                    throw CBORError(
                        .notDeterministic, offset: offset,
                        "indefinite-length item; deterministic encoding uses definite lengths only")
                }
                argument = 0
            }
        }
        return Head(major: major, info: info, argument: argument, offset: offset)
    }

    /// Consumes a "break" stop code if one is next.
    mutating func consumeBreak() -> Bool {
        guard position < bytes.count, bytes[position] == 0xff else { return false }
        position += 1
        return true
    }

    /// Checks that `count` items of at least `minimumSize` bytes each can fit in what is left.
    func checkCount(_ head: Head, minimumSize: UInt64, what: String) throws(CBORError) -> Int {
        guard head.argument <= UInt64(remaining) / minimumSize else {
            throw CBORError(
                .lengthExceedsInput, offset: head.offset,
                "\(what) declares \(head.argument) entries but only \(remaining) byte(s) remain")
        }
        return Int(head.argument)
    }

    // MARK: Strings

    /// The content of a definite-length string, or the concatenated chunks of an indefinite one.
    /// Each text chunk is validated as UTF-8 on its own (RFC 8949 §3.2.3).
    private mutating func readStringContent(_ head: Head) throws(CBORError) -> ArraySlice<UInt8> {
        if !head.isIndefinite {
            guard head.argument <= UInt64(remaining) else {
                throw CBORError(
                    .lengthExceedsInput, offset: head.offset,
                    "string declares \(head.argument) byte(s) but only \(remaining) remain")
            }
            let start = position
            position += Int(head.argument)
            return bytes[start..<position]
        }
        var joined: [UInt8] = []
        while !consumeBreak() {
            let chunk = try readHead()
            guard chunk.major == head.major, !chunk.isIndefinite else {
                throw CBORError(
                    .invalidIndefiniteChunk, offset: chunk.offset,
                    "a chunk of an indefinite-length \(head.major == 2 ? "byte" : "text") string must be a "
                        + "definite-length string of the same type")
            }
            let content = try readStringContent(chunk)
            if head.major == 3 { try validateUTF8(content, offset: chunk.offset) }
            joined.append(contentsOf: content)
        }
        return joined[...]
    }

    mutating func readByteString(_ head: Head) throws(CBORError) -> [UInt8] {
        Array(try readStringContent(head))
    }

    mutating func readText(_ head: Head) throws(CBORError) -> String {
        let content = try readStringContent(head)
        // Indefinite-length content was validated chunk by chunk; valid chunks join validly.
        if !head.isIndefinite { try validateUTF8(content, offset: head.offset) }
        // Valid input, so this never repairs anything.
        return String(decoding: content, as: UTF8.self)
    }

    /// Throws unless `content` is well-formed UTF-8 (``UTF8Check``).
    private func validateUTF8(_ content: ArraySlice<UInt8>, offset: Int) throws(CBORError) {
        let bad = content.withUnsafeBytes(UTF8Check.firstInvalid)
        if let bad {
            throw CBORError(
                .invalidUTF8, offset: offset,
                "text string is not valid UTF-8 (bad sequence at byte \(content.startIndex + bad))")
        }
    }

    // MARK: Major type 7

    /// The value of a float head (additional information 25, 26, 27), checking its width when
    /// deterministic encoding is required.
    func float(_ head: Head) throws(CBORError) -> (Double, CBORItem.FloatWidth) {
        let value: Double
        let width: CBORItem.FloatWidth
        switch head.info {
        case 25:
            value = CBORFloat.double(fromHalf: UInt16(truncatingIfNeeded: head.argument))
            width = .half
        case 26:
            value = CBORFloat.double(fromSingle: UInt32(truncatingIfNeeded: head.argument))
            width = .single
        default:
            value = Double(bitPattern: head.argument)
            width = .double
        }
        if options.requireDeterministic && CBORFloat.shortestWidth(value) != width {
            throw CBORError(
                .notDeterministic, offset: head.offset,
                "float \(value) is \(width.rawValue)-bit but fits a narrower width (RFC 8949 §4.2.1)")
        }
        return (value, width)
    }

    /// The value of a two-byte simple value (`0xf8 nn`), which must be 32 or more.
    func simpleValue(_ head: Head) throws(CBORError) -> UInt8 {
        guard head.argument >= 32 else {
            throw CBORError(
                .invalidSimpleValue, offset: head.offset,
                "simple value \(head.argument) in two-byte form; values below 32 are not well-formed")
        }
        return UInt8(truncatingIfNeeded: head.argument)
    }

    func checkDepth(_ depth: Int, _ head: Head) throws(CBORError) {
        guard depth < options.maxDepth else {
            throw CBORError(
                .depthLimitExceeded, offset: head.offset,
                "arrays, maps and tags nested more than \(options.maxDepth) deep")
        }
    }

    /// Throws unless the key encoded at `current` sorts strictly after the one at `previous`
    /// by bytewise comparison of the encoded keys (RFC 8949 §4.2.1).
    func checkKeyOrder(previous: Range<Int>?, current: Range<Int>, offset: Int) throws(CBORError) {
        guard options.requireDeterministic, let previous else { return }
        guard bytes[previous].lexicographicallyPrecedes(bytes[current]) else {
            throw CBORError(
                .notDeterministic, offset: offset,
                "map key does not sort after the previous key by encoded bytes (RFC 8949 §4.2.1)")
        }
    }

    // MARK: Generic items

    mutating func readItem(depth: Int) throws(CBORError) -> CBORItem {
        let head = try readHead()
        switch head.major {
        case 0:
            return .unsigned(head.argument)
        case 1:
            return .negative(head.argument)
        case 2:
            return .byteString(try readByteString(head))
        case 3:
            return .textString(try readText(head))
        case 4:
            try checkDepth(depth, head)
            var items: [CBORItem] = []
            if head.isIndefinite {
                while !consumeBreak() { items.append(try readItem(depth: depth + 1)) }
            } else {
                let count = try checkCount(head, minimumSize: 1, what: "array")
                items.reserveCapacity(count)
                for _ in 0..<count { items.append(try readItem(depth: depth + 1)) }
            }
            return .array(items)
        case 5:
            try checkDepth(depth, head)
            var pairs: [(key: CBORItem, value: CBORItem)] = []
            var previousKey: Range<Int>?
            func readPair(_ reader: inout CBORReader) throws(CBORError) {
                let keyStart = reader.position
                let key = try reader.readItem(depth: depth + 1)
                let keyRange = keyStart..<reader.position
                try reader.checkKeyOrder(previous: previousKey, current: keyRange, offset: keyStart)
                previousKey = keyRange
                pairs.append((key, try reader.readItem(depth: depth + 1)))
            }
            if head.isIndefinite {
                while !consumeBreak() { try readPair(&self) }
            } else {
                let count = try checkCount(head, minimumSize: 2, what: "map")
                pairs.reserveCapacity(count)
                for _ in 0..<count { try readPair(&self) }
            }
            return .map(pairs)
        case 6:
            try checkDepth(depth, head)
            return .tagged(head.argument, try readItem(depth: depth + 1))
        default:
            switch head.info {
            case 20: return .bool(false)
            case 21: return .bool(true)
            case 22: return .null
            case 23: return .undefined
            case 24: return .simple(try simpleValue(head))
            case 25...27:
                let (value, width) = try float(head)
                return .float(value, width: width)
            default: return .simple(head.info)
            }
        }
    }

    // MARK: Values

    mutating func readValue(depth: Int) throws(CBORError) -> Value {
        let head = try readHead()
        switch head.major {
        case 0, 1:
            guard head.argument <= UInt64(Int64.max) else {
                throw CBORError(
                    .integerOutOfRange, offset: head.offset,
                    "integer \(head.major == 0 ? "" : "-1 - ")\(head.argument) does not fit in Int64")
            }
            let magnitude = Int64(head.argument)
            return .int(head.major == 0 ? magnitude : ~magnitude)
        case 2:
            return .bytes(try readByteString(head))
        case 3:
            return .string(try readText(head))
        case 4:
            try checkDepth(depth, head)
            var items: [Value] = []
            if head.isIndefinite {
                while !consumeBreak() { items.append(try readValue(depth: depth + 1)) }
            } else {
                let count = try checkCount(head, minimumSize: 1, what: "array")
                items.reserveCapacity(count)
                for _ in 0..<count { items.append(try readValue(depth: depth + 1)) }
            }
            return .array(items)
        case 5:
            try checkDepth(depth, head)
            // Keys are byte strings: "é" and "e" + U+0301 are two keys. Repeats are found after
            // reading, by one sort (deterministic CBOR orders keys by length first, not by bytes).
            var entries: [(String, Value)] = []
            var keyOffsets: [Int] = []
            var previousKey: Range<Int>?
            func readEntry(_ reader: inout CBORReader) throws(CBORError) {
                let keyHead = try reader.readHead()
                guard keyHead.major == 3 else {
                    throw CBORError(
                        .nonTextMapKey, offset: keyHead.offset,
                        "map key has major type \(keyHead.major); Trellis map keys are text strings")
                }
                let key = try reader.readText(keyHead)
                let keyRange = keyHead.offset..<reader.position
                let value = try reader.readValue(depth: depth + 1)
                if let previousKey, reader.bytes[previousKey].elementsEqual(reader.bytes[keyRange]) {
                    throw CBORError(.duplicateMapKey, offset: keyHead.offset, "map key \"\(key)\" appears twice")
                }
                try reader.checkKeyOrder(previous: previousKey, current: keyRange, offset: keyHead.offset)
                previousKey = keyRange
                entries.append((key, value))
                keyOffsets.append(keyHead.offset)
            }
            if head.isIndefinite {
                while !consumeBreak() { try readEntry(&self) }
            } else {
                let count = try checkCount(head, minimumSize: 2, what: "map")
                entries.reserveCapacity(count)
                keyOffsets.reserveCapacity(count)
                for _ in 0..<count { try readEntry(&self) }
            }
            do {
                return .map(try UTF8Map(checkingUniqueKeysWithValues: entries))
            } catch {
                // Report the second occurrence of the repeated key.
                let repeats = entries.indices.filter { UTF8Key.equal(entries[$0].0, error.key) }
                throw CBORError(
                    .duplicateMapKey, offset: keyOffsets[repeats.dropFirst().first ?? repeats.first ?? 0],
                    "map key \"\(error.key)\" appears twice")
            }
        case 6:
            throw CBORError(
                .unsupportedTag, offset: head.offset,
                "tag \(head.argument) has no Value equivalent; Trellis values carry no CBOR tags")
        default:
            switch head.info {
            case 20: return .bool(false)
            case 21: return .bool(true)
            case 22: return .null
            case 25...27:
                let (value, _) = try float(head)
                guard value.isFinite else {
                    throw CBORError(
                        .nonFiniteNumber, offset: head.offset,
                        "\(value) is not a finite number; Trellis stores finite numbers only")
                }
                return .double(value)
            case 23:
                throw CBORError(
                    .unsupportedSimpleValue, offset: head.offset, "undefined has no Value equivalent")
            default:
                let simple = head.info == 24 ? try simpleValue(head) : head.info
                throw CBORError(
                    .unsupportedSimpleValue, offset: head.offset,
                    "simple(\(simple)) has no Value equivalent")
            }
        }
    }
}

private func hex(_ byte: UInt8) -> String {
    let digits = Array("0123456789abcdef")
    return String([digits[Int(byte >> 4)], digits[Int(byte & 0xf)]])
}
