import Foundation

/// A command-line error: one line naming the problem.
struct UsageError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Flags and positional arguments of one command.
struct Arguments {
    var positional: [String] = []
    var values: [String: [String]] = [:]
    var switches: Set<String> = []

    /// The value flags that may be given more than once (read with ``all(_:)``); any other value
    /// flag given twice is an error rather than one of its values silently winning.
    static let repeatable: Set<String> = ["peer", "subscribe", "allow-peer"]

    /// Parses `args` given which flags take a value and which are switches.
    ///
    /// - Throws: ``UsageError`` for an unknown flag, a value flag without its value, or a flag that
    ///   is not ``repeatable`` given twice.
    init(_ args: [String], valueFlags: Set<String>, switchFlags: Set<String> = []) throws {
        var i = 0
        while i < args.count {
            let arg = args[i]
            if arg == "--" {
                positional += args[(i + 1)...]
                break
            }
            if arg.hasPrefix("--") {
                var name = String(arg.dropFirst(2))
                var inline: String?
                if let eq = name.firstIndex(of: "=") {
                    inline = String(name[name.index(after: eq)...])
                    name = String(name[..<eq])
                }
                if valueFlags.contains(name) {
                    if let inline {
                        values[name, default: []].append(inline)
                    } else {
                        guard i + 1 < args.count else { throw UsageError("flag --\(name) needs a value") }
                        values[name, default: []].append(args[i + 1])
                        i += 1
                    }
                } else if switchFlags.contains(name) || name == "help" {
                    switches.insert(name)
                } else {
                    throw UsageError("unknown flag --\(name)")
                }
            } else if arg == "-h" {
                switches.insert("help")
            } else {
                positional.append(arg)
            }
            i += 1
        }
        for (name, given) in values.sorted(by: { $0.key < $1.key })
        where given.count > 1 && !Self.repeatable.contains(name) {
            throw UsageError(
                "--\(name) is given \(given.count) times ('\(given.joined(separator: "', '"))'); give it once")
        }
    }

    func value(_ name: String) -> String? { values[name]?.last }
    func all(_ name: String) -> [String] { values[name] ?? [] }

    func require(_ name: String) throws -> String {
        guard let v = value(name) else { throw UsageError("missing --\(name)") }
        return v
    }
}
