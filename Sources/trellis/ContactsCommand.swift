import ContactProvider
import Foundation
import Synchronization
import Trellis
import TrellisContacts
import TrellisNet
import TrellisStore

/// `trellis contacts import|list|export|mirror`.
enum ContactsCommand {
    static let help = """
        trellis contacts import --data DIR FILE.vcf [--collection NAME]
          Imports the vCards (3.0 or 4.0) of FILE.vcf, one contact per card, its UID as _id. A card
          that cannot be read is reported with its line and skipped.
        trellis contacts list   --data DIR [--collection NAME]
          Lists the contacts: UID, then the formatted name.
        trellis contacts export --data DIR [--collection NAME]
          Writes every contact as vCard 4.0 to standard output.
        trellis contacts mirror --data DIR --to VDIR [--collection NAME] [--mesh-key FILE --peer HOST:PORT…]
          Mirrors the contacts into VDIR (one UID.vcf per contact, as khard and vdirsyncer read) and
          follows changes until SIGINT or SIGTERM. Without --mesh-key it reads the store (a running
          node may own it) and polls; with it, it runs a node that subscribes to the collection.
        """

    static func run(_ args: [String]) throws {
        let parsed = try Arguments(
            args, valueFlags: ["data", "collection", "to", "mesh-key", "peer", "listen", "state"],
            switchFlags: ["quiet"])
        if parsed.switches.contains("help") || parsed.positional.isEmpty {
            print(help)
            if parsed.positional.isEmpty && !parsed.switches.contains("help") { throw UsageError("missing subcommand") }
            return
        }
        let data = try parsed.require("data")
        let collection = parsed.value("collection") ?? "contacts"
        let storePath = URL(fileURLWithPath: data).appendingPathComponent("store.sqlite").path
        switch parsed.positional[0] {
        case "import":
            guard parsed.positional.count == 2 else {
                throw UsageError("usage: trellis contacts import --data DIR FILE.vcf")
            }
            let file = parsed.positional[1]
            let bytes = try Files.read(file)
            guard let text = String(bytes: bytes, encoding: .utf8) else {
                throw UsageError("\(file) is not UTF-8 text")
            }
            try Files.makeDirectory(data)
            let lock = try DataDirectoryLock(directory: data)
            defer { withExtendedLifetime(lock) {} }
            let store = try DocumentStore(path: storePath)
            let (imported, errors) = try ContactImport.importVCards(text, into: store, collection: collection)
            for error in errors {
                FileHandle.standardError.write(Data("trellis: warning: \(file): \(error)\n".utf8))
            }
            print(
                "imported \(imported.count) contact\(imported.count == 1 ? "" : "s") into \(collection)"
                    + (errors.filter(\.skipsCard).isEmpty ? "" : ", skipped \(errors.filter(\.skipsCard).count)"))
        case "list", "export":
            var options = StoreOptions()
            options.readOnly = true
            let store = try DocumentStore(path: storePath, options: options)
            if parsed.positional[0] == "export" {
                print(try ContactImport.exportVCards(from: store, collection: collection), terminator: "")
                return
            }
            for doc in try store.documents(in: collection) {
                guard let id = doc["_id"] else { continue }
                let identifier = ContactDocument.identifier(for: id)
                print(
                    "\(identifier.value)\t\(VCard.displayName(ContactDocument.contact(from: doc), uid: identifier.value))"
                )
            }
        case "mirror":
            try mirror(parsed, data: data, storePath: storePath, collection: collection)
        default:
            throw UsageError("unknown contacts subcommand '\(parsed.positional[0])'; run `trellis contacts --help`")
        }
    }

    static func mirror(_ parsed: Arguments, data: String, storePath: String, collection: String) throws {
        let target = URL(fileURLWithPath: try parsed.require("to"))
        let sink = try VdirMirror(directory: target)
        var node: TrellisNode?
        let store: DocumentStore
        if let keyFile = parsed.value("mesh-key") {
            let key = try MeshKey(contentsOf: URL(fileURLWithPath: keyFile))
            var options = NodeOptions()
            if !parsed.switches.contains("quiet") {
                options.log = { FileHandle.standardError.write(Data("[mirror] \($0)\n".utf8)) }
            }
            let n = try TrellisNode(directory: URL(fileURLWithPath: data), meshKey: key, options: options)
            node = n
            if let listen = try parsed.value("listen").map({ try Endpoint(parsing: $0) }) {
                _ = try n.listen(on: listen)
            }
            for peer in try parsed.all("peer").map({ try Endpoint(parsing: $0) }) { n.connect(to: peer) }
            store = n.store.documents
        } else {
            var options = StoreOptions()
            options.readOnly = true
            store = try DocumentStore(path: storePath, options: options)
        }
        let subscription = try node?.store.collection(collection).findAll().subscribe()
        let stateFile = URL(
            fileURLWithPath: parsed.value("state") ?? target.appendingPathComponent(".trellis-host.json").path)
        let host = ContactProviderHost(
            provider: TrellisContactProvider(store: store, collection: collection), sink: sink, stateFile: stateFile)
        let progress: @Sendable (ContactHostProgress) -> Void = { event in
            switch event {
            case .contentPage(let items, let pages):
                FileHandle.standardError.write(
                    Data("contacts: enumerating: \(items) contacts in \(pages) pages\n".utf8))
            case .contentFinished(let items, let pages):
                FileHandle.standardOutput.write(
                    Data(
                        "contacts: full enumeration done: \(items) contacts in \(pages) pages into \(target.path)\n"
                            .utf8))
            case .changes(let updates, let deletes) where updates + deletes > 0:
                FileHandle.standardOutput.write(Data("contacts: \(updates) updated, \(deletes) deleted\n".utf8))
            case .changes: break
            }
        }
        let done = DispatchSemaphore(value: 0)
        let wake = DispatchSemaphore(value: 0)
        let token = store.addObserver { event in if event.collections.contains(UTF8Key(collection)) { wake.signal() } }
        let stopping = StopFlag()
        Signals.onTermination {
            stopping.set()
            done.signal()
            wake.signal()
        }
        let failure = Failure()
        let loopFinished = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            defer { loopFinished.signal() }
            let run = DispatchSemaphore(value: 0)
            Task {
                await host.setProgressHandler(progress)
                do { try await host.enable() } catch { failure.set("\(error)") }
                run.signal()
            }
            run.wait()
            // Follow: on a store event, or every second (another process may write the store).
            while !stopping.isSet {
                _ = wake.wait(timeout: .now() + 1)
                if stopping.isSet { break }
                let step = DispatchSemaphore(value: 0)
                Task {
                    do { try await host.signalEnumerator() } catch { failure.set("\(error)") }
                    step.signal()
                }
                step.wait()
            }
        }
        done.wait()
        // The store closes only once the loop is out of its last step: a step still reading it
        // would fail with "store closed" and turn a clean stop into an error.
        _ = loopFinished.wait(timeout: .now() + 30)
        store.removeObserver(token)
        node?.close()
        withExtendedLifetime(subscription) {}
        if let message = failure.message { throw UsageError("contacts mirror: \(message)") }
    }
}

/// Set once SIGINT or SIGTERM arrived.
final class StopFlag: Sendable {
    private let value = Atomic<Bool>(false)
    func set() { value.store(true, ordering: .releasing) }
    var isSet: Bool { value.load(ordering: .acquiring) }
}

/// The last error of the mirror loop, reported when it stops.
final class Failure: Sendable {
    private let text = Mutex<String?>(nil)
    func set(_ message: String) {
        text.withLock { $0 = message }
        FileHandle.standardError.write(Data("trellis: warning: \(message)\n".utf8))
    }
    var message: String? { text.withLock { $0 } }
}
