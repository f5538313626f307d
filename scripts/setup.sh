#!/usr/bin/env bash
# Installs what Trellis needs on a Debian machine, idempotently:
#   - apt: libsodium-dev, libsqlite3-dev, libedit-dev (line editing in `trellis shell`), pkg-config,
#     faketime (the clock tests preload its libfaketime), tmux (the shell's line-editing test runs
#     it in a pseudo-terminal) (only those missing; python3-venv when the system Python cannot
#     make virtual environments)
#   - a Python virtual environment in .venv with the PyPI packages given as arguments
# Usage: scripts/setup.sh [PYPI-PACKAGE...]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v swift >/dev/null 2>&1; then
    echo "setup: swift is not on PATH; install the Swift 6 toolchain (swift.org) first" >&2
    exit 1
fi

wanted=()
for pkg in libsodium-dev libsqlite3-dev libedit-dev pkg-config faketime tmux; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || wanted+=("$pkg")
done
if [ "$#" -gt 0 ] && ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    wanted+=(python3-venv)
fi

if [ "${#wanted[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        sudo=()
    elif command -v sudo >/dev/null 2>&1; then
        sudo=(sudo)
    else
        echo "setup: ${wanted[*]} must be installed, which needs root; run as root, or install sudo, or run:" >&2
        echo "  apt-get install -y ${wanted[*]}" >&2
        exit 1
    fi
    echo "setup: installing ${wanted[*]}"
    # apt may be busy right after boot (unattended upgrades): wait for its locks, up to 5 minutes.
    for attempt in $(seq 1 60); do
        if "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=300 update -qq; then break; fi
        [ "$attempt" -lt 60 ] || { echo "setup: apt-get update kept failing" >&2; exit 1; }
        sleep 5
    done
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=300 install -y -qq "${wanted[@]}" >/dev/null
fi

if [ "$#" -gt 0 ]; then
    # A virtual environment left half-made (interrupted, or made without pip) is made again.
    if [ -x .venv/bin/python ] && ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
        rm -rf .venv
    fi
    [ -x .venv/bin/python ] || python3 -m venv .venv
    for pkg in "$@"; do
        mod="$pkg"
        [ "$pkg" = noiseprotocol ] && mod=noise
        .venv/bin/python -c "import $mod" 2>/dev/null \
            || .venv/bin/python -m pip install -q --disable-pip-version-check "$pkg"
    done
fi
