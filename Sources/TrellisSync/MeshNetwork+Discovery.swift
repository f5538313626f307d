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
        let parameters = DiscoveryParameters(port: port, scope: scope, configuration: configuration)
        discoveryParameters.withLock { $0 = parameters }
        guard isRunning else { return }  // ``start()`` runs it
        try runDiscovery(parameters)
    }

    /// Stops discovery (open sessions stay); ``start()`` does not run it again.
    public func stopDiscovery() {
        discoveryParameters.withLock { $0 = nil }
        pauseDiscovery()
    }

    /// Stops discovery until ``resumeDiscovery()``, for ``stop()``: the socket closes and the
    /// discovered peers are forgotten (no longer dialed).
    func pauseDiscovery() {
        discoverySocket.withLock { held in
            held?.close()
            held = nil
        }
        engine.stopDiscovery()
    }

    /// Runs discovery again after ``pauseDiscovery()``, if it was started; a port that cannot be
    /// bound again is logged (sync runs without discovery then).
    func resumeDiscovery() {
        guard let parameters = discoveryParameters.withLock({ $0 }) else { return }
        do {
            try runDiscovery(parameters)
        } catch {
            log("discovery: cannot bind UDP port \(parameters.port) again: \(error); running without discovery")
        }
    }

    private func runDiscovery(_ parameters: DiscoveryParameters) throws {
        let (port, scope) = (parameters.port, parameters.scope)
        let socket = try DiscoverySocket(port: port, scope: scope, log: log)
        let previous = discoverySocket.withLock { held in
            defer { held = socket }
            return held
        }
        previous?.close()
        let seal = BeaconSeal(meshKey: meshKey)
        engine.startDiscovery(
            configuration: parameters.configuration ?? DiscoveryConfiguration(peerKey: identity.publicKey),
            port: listeningPort
        ) { beacon in
            socket.send(seal.seal(beacon.encoded()))
        }
        let engine = self.engine
        let thread = Thread {
            Thread.nameCurrent("trellis.beacons")
            engine.adoptThreadNice()
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
        thread.start()
        log("discovery on UDP port \(port), \(scope)")
    }

}

/// How ``MeshNetwork/startDiscovery(port:scope:configuration:)`` was called.
struct DiscoveryParameters: Sendable {
    var port: UInt16
    var scope: DiscoveryScope
    var configuration: DiscoveryConfiguration?
}
