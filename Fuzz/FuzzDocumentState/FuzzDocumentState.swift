// libFuzzer entry point for the CBOR → `DocumentState` decoder: `scripts/fuzz.sh FuzzDocumentState SECONDS`.
// What it checks is `FuzzChecks.documentState` in TrellisTestKit, which the test suite also replays.
import TrellisTestKit

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzDocumentState(_ data: UnsafeRawPointer?, _ count: Int) -> CInt {
    FuzzChecks.run(FuzzChecks.documentState, data, count)
}
