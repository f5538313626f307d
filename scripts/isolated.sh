#!/usr/bin/env bash
# scripts/isolated.sh COMMAND [ARG...] — runs COMMAND in a network namespace of its own, holding
# only a loopback interface, and removes the namespace afterwards.
#
# For anything that starts Trellis nodes without confining discovery (`trellis node` and `shell`
# beacon on every interface by default): the reviewers' probes in ../shared/probes, a node tried
# by hand. Inside, every interface is the namespace's own loopback, so beacons, broadcasts and
# connections reach nothing beyond it, while 127.0.0.1 works as usual.
#
# Needs root. Exit status: COMMAND's, or 2 when not root or a namespace cannot be made.
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }
if [ "$(id -u)" -ne 0 ]; then
    echo "isolated.sh needs root (it creates a network namespace)" >&2
    exit 2
fi
NS="tliso$$"
ip netns add "$NS" 2>/dev/null || { echo "isolated.sh cannot create a network namespace here" >&2; exit 2; }
trap 'ip netns del "$NS" 2>/dev/null || true' EXIT INT TERM
ip netns exec "$NS" ip link set lo up
status=0
ip netns exec "$NS" "$@" || status=$?
exit "$status"
