// libFuzzer entry point for the CBOR decoders (`CBOR.decode`, `CBOR.decodeItem`): `scripts/fuzz.sh FuzzCBOR SECONDS`.
// What it checks is `FuzzChecks.cbor` in TrellisTestKit, which the test suite also replays.
import TrellisTestKit

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzCBOR(_ data: UnsafeRawPointer?, _ count: Int) -> CInt {
    FuzzChecks.run(FuzzChecks.cbor, data, count)
}
