// libFuzzer entry point for `WireMessage` decoding: `scripts/fuzz.sh FuzzWireMessage SECONDS`.
// What it checks is `FuzzChecks.wireMessage` in TrellisTestKit, which the test suite also replays.
import TrellisTestKit

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzWireMessage(_ data: UnsafeRawPointer?, _ count: Int) -> CInt {
    FuzzChecks.run(FuzzChecks.wireMessage, data, count)
}
