#!/usr/bin/env bash
# Installs what Trellis needs on a Debian machine, idempotently:
#   - apt: libsodium-dev, libsqlite3-dev, pkg-config (only those missing)
#   - a Python virtual environment in .venv with the packages given as arguments
# Usage: scripts/setup.sh [PYPI-PACKAGE...]
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for pkg in libsodium-dev libsqlite3-dev pkg-config python3-venv; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
# python3-venv is only needed when the system python lacks venv (pyenv builds have it).
if [ "${#missing[@]}" -gt 0 ] && python3 -c 'import venv, ensurepip' 2>/dev/null; then
    missing=("${missing[@]/python3-venv}")
fi
wanted=()
for pkg in "${missing[@]}"; do [ -n "$pkg" ] && wanted+=("$pkg"); done
if [ "${#wanted[@]}" -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    echo "setup: installing ${wanted[*]}"
    $sudo apt-get -o DPkg::Lock::Timeout=300 update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -qq "${wanted[@]}" >/dev/null
fi

if ! command -v swift >/dev/null 2>&1; then
    echo "setup: swift is not on PATH; install the Swift 6 toolchain from swift.org first" >&2
    exit 1
fi

if [ "$#" -gt 0 ]; then
    if [ ! -x .venv/bin/python ]; then
        python3 -m venv .venv
    fi
    for pkg in "$@"; do
        mod="$pkg"
        case "$pkg" in
            noiseprotocol) mod=noise ;;
            vega_datasets) mod=vega_datasets ;;
        esac
        .venv/bin/python -c "import $mod" 2>/dev/null || .venv/bin/pip install -q --disable-pip-version-check "$pkg"
    done
fi
