// libFuzzer entry point for the vCard 3.0/4.0 importer: `scripts/fuzz.sh FuzzVCard SECONDS`.
// What it checks is `FuzzChecks.vCard` in TrellisTestKit, which the test suite also replays.
import TrellisTestKit

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzVCard(_ data: UnsafeRawPointer?, _ count: Int) -> CInt {
    FuzzChecks.run(FuzzChecks.vCard, data, count)
}
