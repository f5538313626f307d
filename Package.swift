// swift-tools-version:6.0
import PackageDescription

// libFuzzer entry points, one per decoder of untrusted input: Fuzz/Fuzz<Name>/Fuzz<Name>.swift calls its
// check in TrellisTestKit's FuzzChecks (which the tests replay). scripts/fuzz.sh builds and runs them with
// the sanitizers; docs/TESTING.md ("Fuzzing") says how to add one. A target with default libFuzzer
// options keeps them in an `options` file beside its entry point (excluded here).
let fuzzTargets: [Target] = [
    "CBOR", "JSON", "Query", "DocumentState", "WireMessage", "Handshake", "VCard", "Frames", "Session", "Beacon",
].map {
    .executableTarget(
        name: "Fuzz\($0)", dependencies: ["TrellisTestKit"], path: "Fuzz/Fuzz\($0)",
        exclude: ["Corpus", "Regressions"] + ($0 == "Session" ? ["options"] : []))
}

let package = Package(
    name: "Trellis",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "Trellis", targets: ["Trellis"]),
        .library(name: "TrellisCore", targets: ["TrellisCore"]),
        .library(name: "ContactProvider", targets: ["ContactProvider"]),
        .library(name: "TrellisContacts", targets: ["TrellisContacts"]),
        .library(name: "TrellisSimulation", targets: ["TrellisSimulation"]),
        .executable(name: "trellis", targets: ["trellis"]),
        .executable(name: "trellis-bench", targets: ["trellis-bench"]),
    ],
    targets: [
        // C libraries from Debian packages.
        .systemLibrary(name: "CSodium", pkgConfig: "libsodium", providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "CSQLite", providers: [.apt(["libsqlite3-dev"])]),
        // BSD editline: line editing and history in `trellis shell` at a terminal.
        .systemLibrary(name: "CLibEdit", pkgConfig: "libedit", providers: [.apt(["libedit-dev"])]),

        // Pure: values, CRDT, HLC, query, wire codec, session state machines.
        .target(name: "TrellisCore"),
        // SQLite document store.
        .target(name: "TrellisStore", dependencies: ["TrellisCore", "CSQLite"]),
        // Noise_XXpsk3_25519_ChaChaPoly_SHA256 over libsodium.
        .target(name: "TrellisCrypto", dependencies: ["CSodium"]),
        // TCP listener/dialer, framing, secure channel.
        .target(name: "TrellisNet", dependencies: ["TrellisCore", "TrellisCrypto"]),
        // Sync engine shell driving TrellisCore sessions.
        .target(name: "TrellisSync", dependencies: ["TrellisCore", "TrellisStore", "TrellisNet", "TrellisCrypto"]),
        // Public, Ditto-shaped API.
        .target(
            name: "Trellis",
            dependencies: ["TrellisCore", "TrellisStore", "TrellisSync", "TrellisNet", "TrellisCrypto"]),
        // Apple's ContactProvider API surface (iOS 18), for Linux.
        .target(name: "ContactProvider"),
        // Contacts over the change log: enumerator, host, vCard, vdir mirror.
        .target(
            name: "TrellisContacts",
            dependencies: ["ContactProvider", "TrellisCore", "TrellisStore", "Trellis", "TrellisCrypto"]),
        // Deterministic simulated meshes of real nodes, for Trellis's tests and apps' own.
        .target(
            name: "TrellisSimulation",
            dependencies: [
                "Trellis", "TrellisCore", "TrellisStore", "TrellisSync", "TrellisNet", "TrellisContacts",
                "ContactProvider",
            ]),
        // Shared test helpers.
        .target(
            name: "TrellisTestKit",
            dependencies: [
                "Trellis", "TrellisCore", "TrellisStore", "TrellisCrypto", "TrellisContacts", "ContactProvider",
                "TrellisNet", "TrellisSync", "CSQLite",
            ]),

        .executableTarget(
            name: "trellis",
            dependencies: ["Trellis", "TrellisContacts", "ContactProvider", "TrellisSimulation", "CLibEdit"]),
        .executableTarget(
            name: "trellis-bench",
            dependencies: [
                "Trellis", "TrellisStore", "TrellisCore", "TrellisSync", "TrellisNet", "TrellisCrypto", "CSQLite",
                "CSodium", "ContactProvider", "TrellisContacts", "TrellisSimulation",
            ]),
        .executableTarget(name: "QuickStart", dependencies: ["Trellis"], path: "Examples/QuickStart"),
        // Examples/*: each directory holds a README.md (excluded: not a source) with its one command.
        .executableTarget(
            name: "ChatRoom", dependencies: ["Trellis"], path: "Examples/ChatRoom", exclude: ["README.md"]),
        .executableTarget(
            name: "Inventory", dependencies: ["Trellis"], path: "Examples/Inventory", exclude: ["README.md"]),
        .executableTarget(
            name: "ContactsMirror", dependencies: ["Trellis", "TrellisContacts"], path: "Examples/ContactsMirror",
            exclude: ["README.md", "contacts.vcf"]),
        // Apple's ContactProvider template, ported by changing one import.
        .executableTarget(
            name: "ContactProviderExtension", dependencies: ["ContactProvider", "TrellisContacts"],
            path: "Examples/ContactProviderExtension", exclude: ["README.md"]),

        .testTarget(name: "TrellisCoreTests", dependencies: ["TrellisCore", "TrellisTestKit"]),
        .testTarget(name: "TrellisStoreTests", dependencies: ["TrellisStore", "Trellis", "TrellisTestKit"]),
        .testTarget(name: "TrellisCryptoTests", dependencies: ["TrellisCrypto", "TrellisTestKit"]),
        .testTarget(name: "TrellisSyncTests", dependencies: ["Trellis", "TrellisSync", "TrellisTestKit"]),
        .testTarget(
            name: "TrellisCLITests", dependencies: ["Trellis", "TrellisCore", "TrellisStore", "TrellisTestKit"]),
        .testTarget(name: "TrellisSimulationTests", dependencies: ["TrellisSimulation", "Trellis", "TrellisTestKit"]),
        .testTarget(
            name: "TrellisContactsTests",
            dependencies: ["ContactProvider", "TrellisContacts", "TrellisStore", "Trellis", "TrellisTestKit"]),
    ] + fuzzTargets,
    swiftLanguageModes: [.v6]
)

// Apple's sample is compiled as Xcode compiles it: Swift 6, without these upcoming features.
for target in package.targets where target.type != .system && target.name != "ContactProviderExtension" {
    var settings = target.swiftSettings ?? []
    settings.append(.enableUpcomingFeature("ExistentialAny"))
    settings.append(.enableUpcomingFeature("InternalImportsByDefault"))
    target.swiftSettings = settings
}
