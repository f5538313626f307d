// libFuzzer entry point for the link framing (FrameDecoder, MessageAssembler):
// `scripts/fuzz.sh FuzzFrames SECONDS`. What it checks is `FuzzChecks.frames` in TrellisTestKit,
// which the test suite also replays.
import TrellisTestKit

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzFrames(_ data: UnsafeRawPointer?, _ count: Int) -> CInt {
    FuzzChecks.run(FuzzChecks.frames, data, count)
}
