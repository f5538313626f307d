public import ContactProvider
// TrellisContacts stands in for Apple's Contacts module, which brings Foundation with it: a
// provider written for iOS uses `NSString` and `Data` after `import Contacts` alone.
@_exported public import Foundation

extension ContactProviderExtension {
    /// The entry point `@main` gives a contact provider extension
    /// (`@main class Provider: ContactProviderExtension`), as ExtensionFoundation gives one on iOS:
    /// runs the provider the way the system runs it, on a ``ContactProviderHost`` registered for
    /// the default domain, with the host's contact database a vdir (one vCard per file, as khard
    /// and vdirsyncer read it).
    ///
    /// Command line: `[--vdir DIR] [--state FILE] [--watch SECONDS]`.
    /// - `--vdir DIR`: the vdir the contacts go to (default `contacts`; created if missing).
    /// - `--state FILE`: where the host keeps its page and anchor between runs (JSON), so a
    ///   restarted extension resumes with a change enumeration; without it every run enumerates
    ///   the content again.
    /// - `--watch SECONDS`: after the content, ask for changes every SECONDS (as an app's
    ///   `ContactProviderManager.signalEnumerator()` would) until stopped; without it the run
    ///   ends once caught up.
    ///
    /// Prints one line per enumeration (`N contacts in DIR`). Exit status 2 for bad arguments, 1
    /// when the provider fails (a broken ContactProvider rule is named, see
    /// ``ContactProviderRuleViolation``).
    public static func main() async {
        let options: ExtensionOptions
        do {
            options = try ExtensionOptions(Array(CommandLine.arguments.dropFirst()))
        } catch {
            FileHandle.standardError.write(Data("\(error)\n\(ExtensionOptions.usage)\n".utf8))
            exit(2)
        }
        do {
            let sink = try VdirMirror(directory: options.vdir)
            let host = ContactProviderHost(provider: Self(), sink: sink, stateFile: options.state)
            ContactProviderManager.register(host)
            let manager = try ContactProviderManager()
            // After each enumeration: a broken rule ends the run, else the count is printed.
            func report() async throws {
                if let violation = await host.lastViolation { throw violation }
                print("\(try sink.files().count) contacts in \(options.vdir.path)")
            }
            try await manager.enable()
            try await report()
            guard let seconds = options.watch else { return }
            while true {
                try await Task.sleep(for: .seconds(seconds))
                try await manager.signalEnumerator()
                try await report()
            }
        } catch {
            FileHandle.standardError.write(Data("error: \(error)\n".utf8))
            exit(1)
        }
    }
}

/// The command line of ``ContactProvider/ContactProviderExtension/main()``.
struct ExtensionOptions {
    static let usage = "usage: PROVIDER [--vdir DIR] [--state FILE] [--watch SECONDS]"

    struct BadArgument: Error, CustomStringConvertible {
        let description: String
    }

    var vdir = URL(fileURLWithPath: "contacts")
    var state: URL?
    var watch: Double?

    init(_ arguments: [String]) throws {
        var rest = arguments[...]
        func value(_ name: String) throws -> String {
            guard let v = rest.popFirst() else { throw BadArgument(description: "\(name) needs a value") }
            return v
        }
        while let argument = rest.popFirst() {
            switch argument {
            case "--vdir": vdir = URL(fileURLWithPath: try value(argument))
            case "--state": state = URL(fileURLWithPath: try value(argument))
            case "--watch":
                let text = try value(argument)
                guard let seconds = Double(text), seconds > 0, seconds.isFinite else {
                    throw BadArgument(description: "--watch takes a positive number of seconds, not '\(text)'")
                }
                watch = seconds
            default: throw BadArgument(description: "unknown argument '\(argument)'")
            }
        }
    }
}
