#!/usr/bin/env bash
# Runs every Trellis test: installs what is missing (apt: libsodium-dev, libsqlite3-dev, libedit-dev,
# faketime, pkg-config, tmux; PyPI into .venv: noiseprotocol, cbor2, khard and vobject for the interoperability tests), checks formatting,
# builds, and runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh noiseprotocol cbor2 khard vobject
export TRELLIS_PYTHON="$PWD/.venv/bin/python"

echo "== swift format lint"
swift format lint --strict -r Sources Tests Fuzz Examples Package.swift

echo "== swift build (with tests)"
mkdir -p .build
if ! swift build --build-tests >.build/build.log 2>&1; then
    grep -E 'error|warning' .build/build.log | head -50 || tail -50 .build/build.log
    echo "build failed; full log in .build/build.log"
    exit 1
fi

# Two runs, one after the other: the tests that drive real `trellis` processes load both cores for
# minutes (50 kills of a pulling node, 50 of an import), and beside them an in-process test that
# waits up to 10 s for a task of its own could starve (a CI run failed that way). Apart, the two
# runs take about as long as one run of both together.
echo "== swift test (in-process: libraries, simulator, interop, fuzz replay)"
swift test --skip-build --skip TrellisCLITests
echo "== swift test (real trellis processes)"
swift test --skip-build --filter TrellisCLITests
