// libFuzzer entry point for the strict JSON parser: `scripts/fuzz.sh FuzzJSON SECONDS`.
// What it checks is `FuzzChecks.json` in TrellisTestKit, which the test suite also replays.
import TrellisTestKit

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzJSON(_ data: UnsafeRawPointer?, _ count: Int) -> CInt {
    FuzzChecks.run(FuzzChecks.json, data, count)
}
