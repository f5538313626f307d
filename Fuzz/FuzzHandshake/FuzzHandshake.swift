// libFuzzer entry point for the Noise XXpsk0 handshake, both roles: `scripts/fuzz.sh FuzzHandshake SECONDS`.
// What it checks is `FuzzChecks.handshake` in TrellisTestKit, which the test suite also replays.
import TrellisTestKit

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzHandshake(_ data: UnsafeRawPointer?, _ count: Int) -> CInt {
    FuzzChecks.run(FuzzChecks.handshake, data, count)
}
