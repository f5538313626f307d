import Foundation
public import TrellisCore
import TrellisCrypto
public import TrellisNet

extension MeshNetwork {
    /// Starts LAN discovery: binds the discovery port, sends sealed beacons on the engine's
    /// schedule and feeds the beacons of this mesh it receives to the engine, which dials the
    /// peers found (docs/MESH.md, "Discovery").
    ///
    /// - Parameters:
    ///   - port: the UDP discovery port (shared by every node of the LAN; default 4041).
    ///   - scope: where beacons go: every interface, or loopback only.
    ///   - configuration: timings; `nil` for the defaults.
    /// - Throws: ``SocketError`` when the port cannot be bound.
    public func startDiscovery(
        port: UInt16 = 4041, scope: DiscoveryScope = .allInterfaces, configuration: DiscoveryConfiguration? = nil
    ) throws {
        let socket = try DiscoverySocket(port: port, scope: scope, log: log)
        let previous = discoverySocket.withLock { held in
            defer { held = socket }
            return held
        }
        previous?.close()
        let seal = BeaconSeal(meshKey: meshKey)
        engine.startDiscovery(
            configuration: configuration ?? DiscoveryConfiguration(peerKey: identity.publicKey), port: listeningPort
        ) { beacon in
            socket.send(seal.seal(beacon.encoded()))
        }
        let engine = self.engine
        let thread = Thread {
            while true {
                let datagram: (bytes: [UInt8], host: String)?
                do {
                    datagram = try socket.receive()
                } catch {
                    engine.discoveryRejected("receiving failed: \(error)")
                    Thread.sleep(forTimeInterval: 0.25)
                    continue
                }
                guard let datagram else { return }  // closed
                do {
                    let beacon = try Beacon(decoding: try seal.open(datagram.bytes))
                    engine.discoveryReceived(beacon, from: datagram.host)
                } catch {
                    engine.discoveryRejected("from \(datagram.host): \(error)")
                }
            }
        }
        thread.name = "trellis.discovery"
        thread.start()
        log("discovery on UDP port \(port), \(scope)")
    }

    /// Stops discovery (open sessions stay).
    public func stopDiscovery() {
        discoverySocket.withLock { held in
            held?.close()
            held = nil
        }
        engine.stopDiscovery()
    }
}
