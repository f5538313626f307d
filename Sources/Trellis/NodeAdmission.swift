import Foundation
import TrellisCrypto
import TrellisNet
public import TrellisSync

/// Admission: the mode, the pins of trust on first use, trusting and distrusting peers
/// (docs/SECURITY.md, "Admission").
extension TrellisNode {
    /// The pins file of trust on first use, in the data directory (``PinFile``).
    public static let pinsFileName = "known-peers"

    /// Which authenticated peers may have a session (``NodeOptions/admission``); a change applies
    /// to handshakes from now on, and sessions already open stay.
    public var admissionMode: AdmissionMode {
        get { network.admissionMode }
        set { network.admissionMode = newValue }
    }

    /// The decision timeout, the most connections waiting, whether refused peers wait for
    /// ``trust(peerKey:)`` (``NodeOptions/admissionPolicy``).
    public var admissionPolicy: AdmissionPolicy {
        get { network.admissionPolicy }
        set { network.admissionPolicy = newValue }
    }

    /// The name this node advertises to peers (``NodeOptions/deviceName``).
    public var deviceName: String? { network.deviceName }

    /// The pins of trust on first use, as in `DIR/known-peers`.
    public var pins: [PeerPin] { network.pins }

    /// Connections waiting for a decision, oldest first (``Presence/pendingConnections``).
    public var pendingConnections: [PendingConnection] { network.pendingConnections }

    /// Admits a peer: its waiting connections are allowed, and the mode remembers it (added to
    /// the allowlist; under trust on first use pinned to the name it was last seen with, replacing
    /// that name's pin, or trusted by key when no name is known). Under
    /// ``AdmissionMode/meshKey`` only waiting connections change.
    ///
    /// - Parameter key: a 32-byte peer key.
    /// - Returns: what was done, in words.
    /// - Throws: ``DeviceNameError`` when the pins file cannot be written.
    @discardableResult
    public func trust(peerKey key: [UInt8]) throws -> String { try network.trust(peerKey: key) }

    /// ``trust(peerKey:)`` for the key a device name stands for: the newest waiting connection
    /// with that name, else the newest peer seen with it, else its pin.
    ///
    /// - Throws: ``DeviceNameError`` when no peer of that name is known, or the pins file cannot
    ///   be written.
    @discardableResult
    public func trust(name: String) throws -> String { try trust(peerKey: peerKey(named: name, waitingFirst: true)) }

    /// Withdraws trust from a peer: its waiting connections are denied, it leaves the allowlist or
    /// its pins are forgotten (under trust on first use its name is pinned again to whichever key
    /// presents it next), and its sessions are closed.
    ///
    /// - Parameter key: a 32-byte peer key.
    /// - Returns: what was done, in words.
    /// - Throws: ``DeviceNameError`` when the pins file cannot be written.
    @discardableResult
    public func distrust(peerKey key: [UInt8]) throws -> String { try network.distrust(peerKey: key) }

    /// ``distrust(peerKey:)`` for the key a device name stands for: its pin, else a waiting or
    /// recently seen peer with that name.
    ///
    /// - Throws: ``DeviceNameError`` when no peer of that name is known, or the pins file cannot
    ///   be written.
    @discardableResult
    public func distrust(name: String) throws -> String {
        try distrust(peerKey: peerKey(named: name, waitingFirst: false))
    }

    /// The device name a peer key was last seen with, if any.
    public func deviceName(of key: [UInt8]) -> String? { network.deviceName(of: key) }

    private func peerKey(named name: String, waitingFirst: Bool) throws(DeviceNameError) -> [UInt8] {
        guard let key = network.peerKey(named: name, waitingFirst: waitingFirst) else {
            throw DeviceNameError("no pinned, waiting or recently seen peer is named \"\(name)\"")
        }
        return key
    }

    /// Reads the pins file; a missing one holds no pins.
    ///
    /// - Throws: ``FileError`` when others may change it or it cannot be read, ``DeviceNameError``
    ///   for a bad line.
    static func readPins(_ path: String) throws -> [PeerPin] {
        guard let text = try readPrivateText(path, what: "pins file", maxBytes: PinFile.maxBytes) else { return [] }
        return try PinFile.parse(text, path: path)
    }

    /// Writes the pins file as key files are written: mode 0600, atomically.
    static func writePins(_ pins: [PeerPin], to path: String) throws {
        try writePrivateText(PinFile.render(pins), to: path)
    }

    /// Reads a private file the node keeps in its directory (pins); `nil` when it does not exist.
    /// A leftover temporary file of an interrupted write is removed first.
    ///
    /// - Throws: ``FileError`` when others may read or change it, or it cannot be read.
    static func readPrivateText(_ path: String, what: String, maxBytes: Int) throws -> String? {
        unlink(Files.secretTemporary(path))
        var info = stat()
        guard lstat(path, &info) == 0 else { return nil }
        let bytes = try Files.readSecret(path, what: what, maxBytes: maxBytes)
        return bytes.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
    }

    /// Writes a private file as key files are written: mode 0600, atomically.
    static func writePrivateText(_ text: String, to path: String) throws {
        let bytes = Array(text.utf8)
        try bytes.withUnsafeBytes { try Files.writeSecret($0, to: path) }
    }
}
