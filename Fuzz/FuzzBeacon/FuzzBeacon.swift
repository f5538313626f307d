// libFuzzer entry point for LAN discovery beacons (BeaconSeal, Beacon, Discovery):
// `scripts/fuzz.sh FuzzBeacon SECONDS`. What it checks is `FuzzChecks.beacon` in TrellisTestKit,
// which the test suite also replays.
import TrellisTestKit

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzBeacon(_ data: UnsafeRawPointer?, _ count: Int) -> CInt {
    FuzzChecks.run(FuzzChecks.beacon, data, count)
}
