// QuickStart: two Trellis nodes in one process replicate over encrypted loopback TCP.
//
//   swift run QuickStart
//
// Node "north" writes cars; node "south" subscribes to the Japanese ones and prints what arrives.
import Foundation
import Trellis

let base = FileManager.default.temporaryDirectory.appendingPathComponent("trellis-quickstart-\(UUID().uuidString)")
defer { try? FileManager.default.removeItem(at: base) }

let meshKey = MeshKey.generate()
let north = try TrellisNode(directory: base.appendingPathComponent("north"), meshKey: meshKey)
let south = try TrellisNode(directory: base.appendingPathComponent("south"), meshKey: meshKey)

// Local writes and queries, Ditto-style.
let cars = north.store.collection("cars")
try cars.upsert(["_id": "corolla", "Name": "toyota corolla", "Origin": "Japan", "Cylinders": 4])
try cars.upsert(["_id": "civic", "Name": "honda civic", "Origin": "Japan", "Cylinders": 4])
try cars.upsert(["_id": "mustang", "Name": "ford mustang", "Origin": "USA", "Cylinders": 8])
let eights = try cars.find("Cylinders >= $args.min", args: ["min": 8]).exec()
print("north: \(eights.count) car(s) with 8 or more cylinders: \(eights.map(\.id))")

// South subscribes to the Japanese cars; keep the subscription alive while replicating.
let subscription = try south.store.collection("cars").find("Origin == 'Japan'").subscribe()
let port = try north.listen(on: Endpoint(host: "127.0.0.1", port: 0))
south.connect(to: Endpoint(host: "127.0.0.1", port: port))

let deadline = Date().addingTimeInterval(10)
while try south.store.collection("cars").findAll().exec().count < 2 && Date() < deadline {
    usleep(10_000)
}
for car in try south.store.collection("cars").findAll().exec() {
    print("south: \(car.json)")
}
// A change on north reaches south live: a live query on south sees it arrive. Callbacks run on a
// dedicated serial queue (on Linux nothing drains the main queue without dispatchMain()).
let sixCylinders = DispatchSemaphore(value: 0)
let live = try south.store.collection("cars").find("Origin == 'Japan'").observeLocal { docs, event in
    guard case .update(let update) = event else { return }
    print("south live query: \(update.updates.count) updated, \(docs.count) Japanese cars")
    if update.updates.contains(where: { docs[$0].id == "civic" && docs[$0]["Cylinders"] == 6 }) {
        sixCylinders.signal()
    }
}
try cars.upsert(["_id": "civic", "Cylinders": 6])
_ = sixCylinders.wait(timeout: .now() + 10)
live.stop()
let civic = try south.store.collection("cars").findByID("civic").exec()
print("south: civic now has \(civic?["Cylinders"] ?? .null) cylinders")
subscription.cancel()
north.stop()
south.stop()
