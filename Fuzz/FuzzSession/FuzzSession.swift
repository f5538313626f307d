// libFuzzer entry point for a sync session fed a peer's messages (SyncHost, Replicator, the
// store): `scripts/fuzz.sh FuzzSession SECONDS`. What it checks is `FuzzChecks.session` in
// TrellisTestKit, which the test suite also replays.
import TrellisTestKit

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzSession(_ data: UnsafeRawPointer?, _ count: Int) -> CInt {
    FuzzChecks.run(FuzzChecks.session, data, count)
}
