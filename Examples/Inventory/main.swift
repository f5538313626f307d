// Inventory: the cars inventory in a terminal UI, redrawn by a live query.
//
//   swift run Inventory                      keys: q quits, / filters (a query, Return applies it)
//   swift run Inventory --cars cars.json     the 406 cars of vega_datasets (README.md says how)
//   swift run Inventory --script             plays a fixed script, prints each frame as plain text
//
// Two nodes in one process, connected over encrypted loopback: the office shows the inventory,
// the lot changes it (arrivals, sales, new weights). The office's live query fires when a change
// from the lot is merged, and the table is drawn again.
import Foundation
import Synchronization
import Trellis

// MARK: - The data

/// A few cars of vega_datasets' cars.json, with the same field names, when no --cars is given.
let sample: [(name: String, mpg: Double, cylinders: Int, horsepower: Int, weight: Int, origin: String)] = [
    ("chevrolet chevelle malibu", 18, 8, 130, 3504, "USA"), ("buick skylark 320", 15, 8, 165, 3693, "USA"),
    ("plymouth satellite", 18, 8, 150, 3436, "USA"), ("ford torino", 17, 8, 140, 3449, "USA"),
    ("ford galaxie 500", 15, 8, 198, 4341, "USA"), ("chevrolet impala", 14, 8, 220, 4354, "USA"),
    ("pontiac catalina", 14, 8, 225, 4425, "USA"), ("amc ambassador dpl", 15, 8, 190, 3850, "USA"),
    ("toyota corona mark ii", 24, 4, 95, 2372, "Japan"), ("datsun pl510", 27, 4, 88, 2130, "Japan"),
    ("toyota corolla 1200", 31, 4, 65, 1773, "Japan"), ("datsun 1200", 35, 4, 69, 1613, "Japan"),
    ("mazda rx2 coupe", 19, 3, 97, 2330, "Japan"), ("honda civic", 24, 4, 97, 2489, "Japan"),
    ("volkswagen 1131 deluxe sedan", 26, 4, 46, 1835, "Europe"), ("peugeot 504", 25, 4, 87, 2672, "Europe"),
    ("audi 100 ls", 24, 4, 90, 2430, "Europe"), ("saab 99e", 25, 4, 95, 2375, "Europe"),
    ("bmw 2002", 26, 4, 113, 2234, "Europe"), ("volvo 145e (sw)", 18, 4, 112, 2933, "Europe"),
]

/// Loads the cars into `cars` in one transaction: the `--cars` file (a JSON array or JSON
/// lines, as `trellis import` reads) or the sample. Returns how many.
func loadCars(into cars: TrellisCollection, from file: String?) throws -> Int {
    guard let file else {
        let documents = sample.map { car -> Value in
            let id = car.name.replacingOccurrences(of: " ", with: "-")
            return [
                "_id": .string(id), "Name": .string(car.name), "Miles_per_Gallon": .double(car.mpg),
                "Cylinders": .int(Int64(car.cylinders)), "Horsepower": .int(Int64(car.horsepower)),
                "Weight_in_lbs": .int(Int64(car.weight)), "Origin": .string(car.origin),
            ]
        }
        return try cars.upsert(documents).count
    }
    // Documents without `_id` (vega's cars have none) get a new UUID each.
    let reader = try DocumentFileReader(path: file)
    var documents: [Value] = []
    while let document = try reader.next() { documents.append(document) }
    return try cars.upsert(documents).count
}

// MARK: - The screen

/// Draws frames: on a terminal in place (ANSI escapes), otherwise one plain block per frame.
final class Screen: Sendable {
    let isTerminal: Bool
    private struct State {
        var filter = "true"
        var typing: String?  // the filter being typed after `/`, or nil
        var message = ""
        var documents: [Document] = []
        var changed: Set<Value> = []  // `_id`s the last event inserted or updated
        var summary = "initial results"
        var frames = 0
    }
    private let state = Mutex(State())

    init(isTerminal: Bool) { self.isTerminal = isTerminal }

    /// Takes a live query's results and event, and draws.
    func show(_ documents: [Document], _ event: LiveQueryEvent, filter: String) {
        state.withLock { state in
            state.filter = filter
            state.documents = documents
            switch event {
            case .initial:
                state.changed = []
                state.summary = "initial results"
            case .update(let update):
                // Indexes: insertions and updates into the new results, deletions into the old.
                state.changed = Set((update.insertions + update.updates).map { documents[$0].id })
                state.summary =
                    "\(update.insertions.count) in, \(update.deletions.count) out, \(update.updates.count) updated, "
                    + "\(update.moves.count) moved"
            }
            draw(&state)
        }
    }

    /// Changes the status line (the filter being typed, an error) and draws.
    func status(typing: String?, message: String = "") {
        state.withLock { state in
            state.typing = typing
            state.message = message
            draw(&state)
        }
    }

    private func draw(_ state: inout State) {
        state.frames += 1
        let docs = state.documents
        let origins = Dictionary(grouping: docs) { $0["Origin"]?.stringValue ?? "?" }
            .map { "\($0.key) \($0.value.count)" }.sorted().joined(separator: "   ")
        var lines = [
            "Trellis inventory: \(docs.count) cars where \(state.filter)",
            "by origin: \(origins.isEmpty ? "none" : origins)",
            "",
            "   " + ["weight", "hp", "cyl", "mpg"].map { $0.leftPadded(6) }.joined() + "  origin  name",
        ]
        for doc in docs.prefix(10) {
            func number(_ key: String) -> String {
                guard let n = doc[key]?.numberValue else { return "-".leftPadded(6) }
                return (n == n.rounded() ? String(Int(n)) : String(n)).leftPadded(6)
            }
            let mark = state.changed.contains(doc.id) ? " * " : "   "
            let origin = (doc["Origin"]?.stringValue ?? "?").padding(toLength: 8, withPad: " ", startingAt: 0)
            lines.append(
                mark + ["Weight_in_lbs", "Horsepower", "Cylinders", "Miles_per_Gallon"].map(number).joined()
                    + "  \(origin)\(doc["Name"]?.stringValue ?? "")")
        }
        lines.append("")
        lines.append("last change: \(state.summary)   (* = inserted or updated)")
        if let typing = state.typing {
            lines.append("filter: \(typing)_")
        } else {
            lines.append("[q] quit  [/] filter   \(state.message)")
        }
        if isTerminal {
            // Home the cursor and clear the screen, then draw.
            output("\u{1B}[H\u{1B}[2J" + lines.joined(separator: "\n"))
        } else {
            output("--- frame \(state.frames)\n" + lines.joined(separator: "\n") + "\n")
        }
    }
}

/// The office's live query: the cars matching the filter, heaviest first. Changing the filter
/// stops it and starts a new one.
final class View: Sendable {
    let cars: TrellisCollection
    let screen: Screen
    private let live = Mutex<LiveQuery?>(nil)

    init(cars: TrellisCollection, screen: Screen) {
        self.cars = cars
        self.screen = screen
    }

    /// Shows `filter`'s cars. Throws (and keeps the old view) when the query does not parse.
    func show(filter: String) throws {
        let query = try cars.find(filter).sort("Weight_in_lbs", direction: .descending).observeLocal {
            [screen] docs, event in screen.show(docs, event, filter: filter)
        }
        live.withLock {
            $0?.stop()
            $0 = query
        }
    }

    func stop() { live.withLock { $0?.stop() } }
}

// MARK: - The lot: changes made on the other node

/// Waits until `condition` holds (every 10 ms, up to 30 s).
func waitUntil(_ what: String, _ condition: () throws -> Bool) throws {
    let deadline = Date().addingTimeInterval(30)
    while try !condition() {
        guard Date() < deadline else { throw InventoryError("timed out waiting until \(what)") }
        usleep(10_000)
    }
}

struct InventoryError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// The heaviest car of `cars` matching `query` (or the lightest), if any.
func car(_ cars: TrellisCollection, _ query: String = "true", heaviest: Bool = true) throws -> Document? {
    try cars.find(query).sort("Weight_in_lbs", direction: heaviest ? .descending : .ascending).limit(1).exec().first
}

/// The lot's scripted changes; each waits until the office holds it and has drawn it.
func playScript(lot: TrellisCollection, office: TrellisNode, view: View) throws {
    let officeCars = office.store.collection("cars")
    func reached(_ what: String, _ condition: () throws -> Bool) throws {
        try waitUntil(what, condition)
        office.store.flushLiveQueries()  // the frame for this change is printed before the next
    }
    let top = try car(lot)?["Weight_in_lbs"]?.intValue ?? 4000
    output("lot: a new arrival, heavier than all: gmc suburban, \(top + 300) lbs\n")
    try lot.upsert([
        "_id": "arrival-1", "Name": "gmc suburban", "Origin": "USA", "Cylinders": 8, "Horsepower": 210,
        "Weight_in_lbs": .int(top + 300),
    ])
    try reached("the arrival reached the office") { try officeCars.findByID("arrival-1").exec() != nil }

    guard let sold = try car(lot, "_id != 'arrival-1'") else { throw InventoryError("no car to sell") }
    output("lot: sold the \(sold["Name"]?.stringValue ?? "?")\n")
    try lot.findByID(sold.id).remove()
    try reached("the sale reached the office") { try officeCars.findByID(sold.id).exec() == nil }

    guard let light = try car(lot, "Origin == 'Japan'", heaviest: false) else {
        throw InventoryError("no Japanese car to weigh")
    }
    output("lot: weighed the \(light["Name"]?.stringValue ?? "?") again with its trailer: \(top + 100) lbs\n")
    try lot.findByID(light.id).update { $0?["Weight_in_lbs"].set(.int(top + 100)) }
    try reached("the new weight reached the office") {
        try officeCars.findByID(light.id).exec()?["Weight_in_lbs"]?.intValue == top + 100
    }

    output("office: / Origin == 'Japan'\n")
    try view.show(filter: "Origin == 'Japan'")
    office.store.flushLiveQueries()

    output("lot: a new arrival from Japan: toyota land cruiser, 4500 lbs\n")
    try lot.upsert([
        "_id": "arrival-2", "Name": "toyota land cruiser", "Origin": "Japan", "Cylinders": 6, "Horsepower": 125,
        "Weight_in_lbs": 4500,
    ])
    try reached("the second arrival reached the office") { try officeCars.findByID("arrival-2").exec() != nil }
}

/// Interactive: a random change from the lot every 2 seconds, until `stop` is signalled.
func keepChanging(_ lot: TrellisCollection, until stop: DispatchSemaphore) {
    var arrivals = 0
    while stop.wait(timeout: .now() + 2) == .timedOut {
        guard let cars = try? lot.findAll().exec(), let pick = cars.randomElement() else { continue }
        switch Int.random(in: 0..<3) {
        case 0:  // sold
            _ = try? lot.findByID(pick.id).remove()
        case 1:  // a copy of some car arrives
            arrivals += 1
            var copy = pick.value.mapValue ?? [:]
            copy["_id"] = .string("arrival-\(arrivals)-\(UUID().uuidString.prefix(4))")
            _ = try? lot.upsert(.map(copy))
        default:  // weighed again
            let weight = (pick["Weight_in_lbs"]?.intValue ?? 3000) + Int64.random(in: -300...300)
            _ = try? lot.findByID(pick.id).update { $0?["Weight_in_lbs"].set(.int(weight)) }
        }
    }
}

/// Interactive keys, read byte by byte in raw mode: q quits, / types a filter.
func readKeys(view: View, screen: Screen) {
    var saved = termios()
    tcgetattr(STDIN_FILENO, &saved)
    var raw = saved
    raw.c_lflag &= ~tcflag_t(ICANON | ECHO)  // bytes as typed, not echoed; output processing stays
    tcsetattr(STDIN_FILENO, TCSANOW, &raw)
    defer { tcsetattr(STDIN_FILENO, TCSANOW, &saved) }
    var typing: String?
    var byte: UInt8 = 0
    while read(STDIN_FILENO, &byte, 1) == 1 {
        switch (typing, byte) {
        case (nil, UInt8(ascii: "q")): return
        case (nil, UInt8(ascii: "/")): typing = ""
        case (nil, _): continue
        case (let text?, 0x0A), (let text?, 0x0D):  // Return: apply
            typing = nil
            do { try view.show(filter: text.isEmpty ? "true" : text) } catch {
                screen.status(typing: nil, message: "\(error)")
                continue
            }
        case (_, 0x1B): typing = nil  // Esc: cancel
        case (let text?, 0x7F): typing = String(text.dropLast())  // Backspace
        case (let text?, _): typing = text + String(UnicodeScalar(byte))
        }
        screen.status(typing: typing)
    }
}

// MARK: - Main

func run(_ arguments: [String]) throws {
    var carsFile: String?
    var script = isatty(STDOUT_FILENO) == 0 || isatty(STDIN_FILENO) == 0
    var rest = arguments[...]
    while let argument = rest.popFirst() {
        switch argument {
        case "--cars":
            guard let file = rest.popFirst() else { throw InventoryError("--cars needs a file") }
            carsFile = file
        case "--script": script = true
        default: throw InventoryError("unknown argument '\(argument)'; usage: Inventory [--cars FILE] [--script]")
        }
    }
    let base = FileManager.default.temporaryDirectory.appendingPathComponent("trellis-inventory-\(UUID().uuidString)")
    defer { try? FileManager.default.removeItem(at: base) }
    // Both nodes share a mesh key; a library node runs no LAN discovery (NodeOptions.discovery is nil).
    let key = MeshKey.generate()
    let office = try TrellisNode(directory: base.appendingPathComponent("office"), meshKey: key)
    let lot = try TrellisNode(directory: base.appendingPathComponent("lot"), meshKey: key)
    defer {
        office.close()
        lot.close()
    }
    let count = try loadCars(into: office.store.collection("cars"), from: carsFile)
    let screen = Screen(isTerminal: !script)
    let view = View(cars: office.store.collection("cars"), screen: screen)
    try view.show(filter: "true")
    defer { view.stop() }

    // Each node subscribes to every car: the lot gets the office's, the office the lot's changes.
    let subscriptions = try [office, lot].map { try $0.store.collection("cars").findAll().subscribe() }
    defer { subscriptions.forEach { $0.cancel() } }
    let port = try office.listen(on: Endpoint(host: "127.0.0.1", port: 0))
    lot.connect(to: Endpoint(host: "127.0.0.1", port: port))
    let lotCars = lot.store.collection("cars")
    try waitUntil("the lot has the \(count) cars") { try lotCars.findAll().count() == count }

    if script {
        office.store.flushLiveQueries()
        try playScript(lot: lotCars, office: office, view: view)
        return
    }
    let stop = DispatchSemaphore(value: 0)
    let stopped = DispatchSemaphore(value: 0)
    Thread {
        keepChanging(lotCars, until: stop)
        stopped.signal()
    }.start()
    readKeys(view: view, screen: screen)
    stop.signal()
    stopped.wait()
    output("\u{1B}[H\u{1B}[2J")
}

/// Writes to standard output at once (unbuffered), from any thread; a reader that went away
/// (`| head`) is not an error here.
func output(_ text: String) {
    try? FileHandle.standardOutput.write(contentsOf: Data(text.utf8))
}

extension String {
    func leftPadded(_ width: Int) -> String {
        count >= width ? self : String(repeating: " ", count: width - count) + self
    }
}

do {
    try run(Array(CommandLine.arguments.dropFirst()))
} catch {
    FileHandle.standardError.write(Data("Inventory: \(error)\n".utf8))
    exit(1)
}
