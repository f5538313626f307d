#!/usr/bin/env bash
# Builds one libFuzzer target (or all of them) with the fuzzer and address sanitizers and runs it.
#
# Usage: scripts/fuzz.sh TARGET|all SECONDS [LIBFUZZER-OPTION...]
#   TARGET    a directory under Fuzz/, e.g. FuzzJSON (`scripts/fuzz.sh list` lists them)
#   SECONDS   how long to run each target
#   options   passed on to libFuzzer, e.g. -max_len=65536 or -jobs=2
#
# The build goes to its own scratch path (.build-fuzz) so the normal .build stays uninstrumented.
# The working corpus grows in .build-fuzz/corpus/TARGET, seeded from Fuzz/TARGET/Corpus (which is
# only read). A crashing input is written to crashes/TARGET/ and the script exits with status 1
# after all targets ran; keep the input as Fuzz/TARGET/Regressions/<what-it-shows> once fixed.
# A target's default libFuzzer options, if any, are in Fuzz/TARGET/options (whitespace-separated,
# `#` starts a comment); they come before the options given here, and libFuzzer takes the last.
# Prints one line per target: executions, executions per second, corpus size, crashed or not.
#
# FUZZ_ASAN=0 builds without AddressSanitizer (coverage only, in .build-fuzz-noasan, sharing the
# corpus): three to five times the executions per second, for long runs. Swift's own checks
# (bounds, overflow, exclusivity) still trap; what is lost is ASan's view of the C libraries'
# memory (SQLite, libsodium) and of unsafe pointers.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=()
for dir in Fuzz/Fuzz*/; do
    dir=${dir%/}
    targets+=("${dir#Fuzz/}")
done

usage() {
    echo "usage: scripts/fuzz.sh TARGET|all SECONDS [LIBFUZZER-OPTION...]" >&2
    echo "targets: ${targets[*]}" >&2
    exit 2
}

[ "$#" -ge 1 ] || usage
if [ "$1" = list ]; then
    printf '%s\n' "${targets[@]}"
    exit 0
fi
[ "$#" -ge 2 ] || usage
which=$1
seconds=$2
shift 2
[[ "$seconds" =~ ^[0-9]+$ ]] && [ "$seconds" -gt 0 ] || { echo "fuzz: SECONDS must be a positive integer" >&2; usage; }

if [ "$which" = all ]; then
    selected=("${targets[@]}")
else
    [ -d "Fuzz/$which" ] || { echo "fuzz: no target '$which'" >&2; usage; }
    selected=("$which")
fi

scratch=.build-fuzz
sanitizers=fuzzer,address
build_scratch=$scratch
if [ "${FUZZ_ASAN:-1}" = 0 ]; then
    sanitizers=fuzzer
    build_scratch=.build-fuzz-noasan
fi
status=0
for target in "${selected[@]}"; do
    echo "== $target: building (release, -sanitize=$sanitizers; log in $build_scratch/build-$target.log)"
    mkdir -p "$scratch" "$build_scratch"
    # --sanitize=fuzzer makes SwiftPM link libFuzzer's main; swiftc keeps only its last -sanitize=
    # flag, so coverage and ASan come together in one -Xswiftc flag (Fuzz/README.md).
    if ! swift build -c release --product "$target" --scratch-path "$build_scratch" \
        --sanitize=fuzzer -Xswiftc -sanitize="$sanitizers" >"$build_scratch/build-$target.log" 2>&1; then
        grep -E 'error' "$build_scratch/build-$target.log" | head -20 || tail -20 "$build_scratch/build-$target.log"
        echo "fuzz: building $target failed" >&2
        exit 1
    fi
    binary="$build_scratch/release/$target"
    corpus="$scratch/corpus/$target"
    crashes="crashes/$target"
    log="$scratch/run-$target.log"
    mkdir -p "$corpus" "$crashes"

    defaults=()
    if [ -f "Fuzz/$target/options" ]; then
        read -r -a defaults <<<"$(sed 's/#.*//' "Fuzz/$target/options" | tr '\n' ' ')"
    fi

    echo "== $target: running for $seconds s${defaults[*]:+ with ${defaults[*]}} (log in $log)"
    started=$(date +%s)
    set +e
    SWIFT_BACKTRACE=enable=no "$binary" "$corpus" "Fuzz/$target/Corpus" -max_total_time="$seconds" -timeout=30 \
        -artifact_prefix="$crashes/" -print_final_stats=1 ${defaults[@]+"${defaults[@]}"} "$@" >"$log" 2>&1
    code=$?
    set -e
    elapsed=$(($(date +%s) - started))

    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    size=$(find "$corpus" -type f | wc -l)
    if [ "$code" -eq 0 ]; then
        verdict="no crash"
    else
        status=1
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
        verdict="CRASHED (exit $code): ${artifact:-see $log}"
        grep -m 3 -E 'Fatal error|ERROR: AddressSanitizer|ERROR: libFuzzer|SUMMARY' "$log" | sed 's/^/    /' || true
    fi
    echo "$target: ${runs:-?} executions in $elapsed s (${speed:-?}/s), corpus $size inputs, $verdict"
done
exit "$status"
