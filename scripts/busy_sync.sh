#!/bin/bash
# A first sync between two `trellis node` processes on loopback while other programs keep the
# cores busy: how long it takes, and whether a session closed for silence (docs/BENCHMARKS.md,
# "Replication as background work").
#
# Usage: scripts/busy_sync.sh [DOCUMENTS [BUSY [NODE FLAGS...]]]
#   DOCUMENTS  documents of about 190 bytes node A holds (default 50000)
#   BUSY       shell loops that never sleep, at nice 0, beside the nodes (default 2)
#   NODE FLAGS passed to both nodes, e.g. --priority default
# TRELLIS=PATH picks the binary (default .build/release/trellis). Traffic stays on 127.0.0.1.
set -u
cd "$(dirname "$0")/.."
T=${TRELLIS:-$PWD/.build/release/trellis}
N=${1:-50000}
BUSY=${2:-2}
shift $(($# < 2 ? $# : 2))
W=$(mktemp -d /tmp/trellis-busy.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$W"
}
trap cleanup EXIT
python3 -c "
import json, sys
with open(sys.argv[1], 'w') as f:
    for i in range(int(sys.argv[2])):
        f.write(json.dumps({'_id': 'd%06d' % i, 'n': i, 'pad': 'x' * 150}) + '\n')" "$W/docs.jsonl" "$N"
"$T" keygen "$W/mesh.key" >/dev/null
"$T" import --data "$W/A" items "$W/docs.jsonl" >/dev/null
PA=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
for _ in $(seq "$BUSY"); do
    (while :; do :; done) &
    pids+=($!)
done
"$T" node --no-discovery --data "$W/A" --listen "127.0.0.1:$PA" --mesh-key "$W/mesh.key" "$@" 2>"$W/A.log" &
pids+=($!)
start=$(date +%s.%N)
"$T" node --no-discovery --data "$W/B" --peer "127.0.0.1:$PA" --mesh-key "$W/mesh.key" --subscribe items "$@" \
    2>"$W/B.log" &
pids+=($!)
deadline=$(($(date +%s) + 600))
until [ "$("$T" find --data "$W/B" items true --count 2>/dev/null)" = "$N" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "not synced after 600 s"; exit 1; }
    sleep 0.2
done
end=$(date +%s.%N)
echo "documents=$N busy=$BUSY flags='$*': first sync $(python3 -c "print(round($end - $start, 1))") s;" \
    "sessions closed for silence: $(cat "$W/A.log" "$W/B.log" | grep -c 'no message from the peer')"
