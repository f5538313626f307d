public import TrellisCore

/// What a node tells an authenticated peer about itself inside the handshake: the payload of
/// Noise messages 2 (the listener's) and 3 (the dialer's), encrypted and authenticated under the
/// handshake's keys, never sent in clear (docs/PROTOCOL.md §1).
///
/// On the wire: empty (nothing advertised, as protocol 3 nodes before device names send), or a
/// CBOR map with text keys; `name` (text, a ``DeviceName``) is the device name. Unknown keys are
/// ignored so later versions can add fields. At most ``maxBytes`` bytes.
public enum HandshakePayload {
    /// Largest payload accepted, bytes.
    public static let maxBytes = 1024

    /// The payload advertising `deviceName` (empty for `nil`).
    ///
    /// - Parameter deviceName: a name that passed ``DeviceName/check(_:)``, or `nil`.
    /// - Returns: the payload bytes.
    public static func encode(deviceName: String?) -> [UInt8] {
        guard let deviceName else { return [] }
        var writer = CBORWriter()
        writer.writeMapHeader(count: 1)
        writer.writeText("name")
        writer.writeText(deviceName)
        return writer.bytes
    }

    /// Reads a peer's payload.
    ///
    /// - Parameter bytes: the decrypted payload of message 2 or 3.
    /// - Returns: the advertised device name, or `nil` when none is advertised.
    /// - Throws: ``DeviceNameError`` when the payload is larger than ``maxBytes``, is not a CBOR
    ///   map with text keys, or its `name` is not text or not a valid ``DeviceName``.
    public static func decodeDeviceName(_ bytes: [UInt8]) throws(DeviceNameError) -> String? {
        guard !bytes.isEmpty else { return nil }
        guard bytes.count <= maxBytes else {
            throw DeviceNameError(
                "the peer's handshake payload is \(bytes.count) bytes, above the \(maxBytes)-byte limit")
        }
        let item: CBORItem
        do { item = try CBOR.decodeItem(bytes, options: .init(maxDepth: 4)) } catch {
            throw DeviceNameError("the peer's handshake payload is not CBOR: \(error)")
        }
        guard case .map(let pairs) = item else {
            throw DeviceNameError("the peer's handshake payload is not a CBOR map")
        }
        var name: String?
        for (key, value) in pairs {
            guard case .textString(let field) = key else {
                throw DeviceNameError("the peer's handshake payload has a key that is not text")
            }
            guard field == "name" else { continue }
            guard name == nil else { throw DeviceNameError("the peer's handshake payload names it twice") }
            guard case .textString(let text) = value else {
                throw DeviceNameError("the peer's device name is not text")
            }
            try DeviceName.check(text)
            name = text
        }
        return name
    }
}

/// A device name that cannot be used, with the reason.
public struct DeviceNameError: Error, Sendable, Equatable, CustomStringConvertible {
    public let description: String

    /// - Parameter description: what is wrong, in one line.
    public init(_ description: String) { self.description = description }
}

/// The rules for a device name (``HandshakePayload``, trust on first use): it is printed in logs
/// and written to the pins file, one per line.
public enum DeviceName {
    /// Longest device name, UTF-8 bytes.
    public static let maxBytes = 64

    /// Checks a device name: 1 to ``maxBytes`` UTF-8 bytes, no control characters (C0, DEL,
    /// C1, line and paragraph separators), no leading or trailing white space.
    ///
    /// - Parameter name: the name.
    /// - Throws: ``DeviceNameError`` naming the rule broken.
    public static func check(_ name: String) throws(DeviceNameError) {
        let bytes = name.utf8.count
        guard bytes > 0 else { throw DeviceNameError("a device name cannot be empty") }
        guard bytes <= maxBytes else {
            throw DeviceNameError("a device name is at most \(maxBytes) bytes of UTF-8; this one has \(bytes)")
        }
        for scalar in name.unicodeScalars {
            let value = scalar.value
            if value < 0x20 || (0x7F...0x9F).contains(value) || value == 0x2028 || value == 0x2029 {
                throw DeviceNameError(
                    "a device name cannot hold control characters (U+\(String(value, radix: 16, uppercase: true)))")
            }
        }
        if let first = name.unicodeScalars.first, let last = name.unicodeScalars.last,
            first.properties.isWhitespace || last.properties.isWhitespace
        {
            throw DeviceNameError("a device name cannot start or end with white space")
        }
    }
}
