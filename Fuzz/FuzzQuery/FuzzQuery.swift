// libFuzzer entry point for the query lexer, parser, binder, evaluator and SQL translation: `scripts/fuzz.sh FuzzQuery SECONDS`.
// What it checks is `FuzzChecks.query` in TrellisTestKit, which the test suite also replays.
import TrellisTestKit

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzQuery(_ data: UnsafeRawPointer?, _ count: Int) -> CInt {
    FuzzChecks.run(FuzzChecks.query, data, count)
}
