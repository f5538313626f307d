import TrellisCore

/// Trellis's version, as `trellis --version` prints it, and the sync protocol it speaks.
public enum TrellisVersion {
    /// The release this build is (semantic versioning; `-dev` until the first release).
    public static let current = "0.1.0-dev"
    /// The protocol version a node announces in its `hello` and beacons (docs/PROTOCOL.md).
    public static var protocolVersion: Int { WireMessage.protocolVersion }
}
