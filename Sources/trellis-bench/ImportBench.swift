import Foundation
import Trellis
import TrellisCore
import TrellisStore

// Import figures: `trellis import` streams a JSON-lines file into one transaction. Each import
// runs in a child process (this executable with --import-child), so its peak resident memory is
// its own: an input four times larger must not need more memory.

/// Child mode: imports FILE into a new store at DATABASE as `trellis import` does, then exits.
func runImportChild(file: String, database: String) -> Never {
    do {
        let reader = DocumentReadAhead(try DocumentFileReader(path: file), preparingUpserts: true)
        let store = try DocumentStore(path: database)
        _ = try store.upsert(in: "cars", streamingPrepared: { try reader.nextPrepared() })
        store.close()
        // The peak resident size of this program since its exec (getrusage of a child would also
        // count the pages of the process that forked it).
        let status = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") } ?? ""
        print(line.split(separator: " ").dropFirst().first.map(String.init) ?? "0")  // kB
        exit(0)
    } catch {
        FileHandle.standardError.write(Data("trellis-bench --import-child: \(error)\n".utf8))
        exit(1)
    }
}

/// The import rate of `rows` (documents per second, against raw batched inserts) and the peak
/// memory of importing them against importing four times as many.
func importFigures(scratch: URL, rows: [String], baseline: Double) throws -> [Figure] {
    func write(_ name: String, copies: Int) throws -> (path: String, bytes: Int) {
        var text = ""
        for copy in 0..<copies {
            for row in rows {
                // Each copy gets its own `_id`s ("car-…", "car1-…", …): every document is new.
                text += copy == 0 ? row : row.replacingOccurrences(of: "\"_id\":\"car-", with: "\"_id\":\"car\(copy)-")
                text += "\n"
            }
        }
        let path = scratch.appendingPathComponent(name).path
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
        return (path, text.utf8.count)
    }
    /// Runs one child import; returns its seconds and its peak resident size (VmHWM) in bytes.
    func child(_ file: String, _ database: String) throws -> (seconds: Double, maxRSS: Double) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        process.arguments = ["--import-child", file, database]
        let output = Pipe()
        process.standardOutput = output
        sync()  // as `seconds` does: the input file just written reaches the disk before the clock starts
        let start = DispatchTime.now().uptimeNanoseconds
        try process.run()
        let printed = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let elapsed = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
        let kilobytes = Double(String(decoding: printed, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
        guard process.terminationStatus == 0, let kilobytes else {
            throw CocoaError(.executableLoad, userInfo: [NSLocalizedDescriptionKey: "the import child failed"])
        }
        return (elapsed, kilobytes * 1024)
    }
    let small = try write("import-1x.jsonl", copies: 1)
    let (smallSeconds, smallRSS) = try child(small.path, scratch.appendingPathComponent("import-1x.sqlite").path)
    let large = try write("import-4x.jsonl", copies: 4)
    let (_, largeRSS) = try child(large.path, scratch.appendingPathComponent("import-4x.sqlite").path)
    return [
        Figure(
            name: "import_per_s", value: Double(rows.count) / smallSeconds, unit: "docs/s", baseline: baseline,
            baselineName: "sqlite_raw_inserts_per_s"),
        Figure(name: "import_input_bytes_1x", value: Double(small.bytes), unit: "bytes"),
        Figure(
            name: "import_input_bytes_4x", value: Double(large.bytes), unit: "bytes", baseline: Double(small.bytes),
            baselineName: "import_input_bytes_1x"),
        Figure(name: "import_peak_rss_bytes_1x", value: smallRSS, unit: "bytes"),
        Figure(
            name: "import_peak_rss_bytes_4x", value: largeRSS, unit: "bytes", baseline: smallRSS,
            baselineName: "import_peak_rss_bytes_1x"),
    ]
}
