#!/usr/bin/env bash
# The main job: three real `trellis` nodes on loopback replicate the 406 cars of vega_datasets.
#   A imports the cars; B (a shell peer driven from this script) subscribes to Origin == 'Japan';
#   C subscribes to all cars. B then changes one Japanese car and the change reaches A and C.
# Exits 0 only when every node holds exactly what its subscription asks. Stops every process it
# started, also on failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh vega_datasets
echo "== building trellis (release)"
mkdir -p .build
swift build -c release --product trellis >.build/demo-build.log 2>&1 || {
    tail -30 .build/demo-build.log
    exit 1
}
T="$PWD/.build/release/trellis"
PY="$PWD/.venv/bin/python"
CARS=$("$PY" -c 'import os, vega_datasets; print(os.path.join(os.path.dirname(vega_datasets.__file__), "_data", "cars.json"))')

WORK=$(mktemp -d /tmp/trellis-demo.XXXXXX)
pids=()
cleanup() {
    status=$?
    exec 3>&- 2>/dev/null || true
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ "$status" -ne 0 ]; then
        echo "demo failed (exit $status); node logs:"
        for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done
    fi
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PA=$(free_port); PB=$(free_port); PC=$(free_port)

count() { "$T" find --data "$WORK/$1" cars "${2:-true}" --count 2>/dev/null || echo -1; }
wait_for() { # wait_for SECONDS COMMAND... : polls every 50 ms
    local deadline=$(( $(date +%s) + $1 )); shift
    until "$@"; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.05
    done
}
now() { date +%s.%N; }
elapsed() { "$PY" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$2"; }

"$T" keygen "$WORK/mesh.key" >/dev/null
"$T" import --data "$WORK/A" cars "$CARS"
TOTAL=$("$PY" -c 'import json, sys; print(len(json.load(open(sys.argv[1]))))' "$CARS")
JAPAN=$("$PY" -c 'import json, sys; print(sum(c["Origin"] == "Japan" for c in json.load(open(sys.argv[1]))))' "$CARS")

echo "== starting nodes A :$PA, B :$PB, C :$PC"
start=$(now)
"$T" node --no-discovery --data "$WORK/A" --listen "127.0.0.1:$PA" --mesh-key "$WORK/mesh.key" 2>"$WORK/A.log" &
pids+=($!)
"$T" node --no-discovery --data "$WORK/C" --listen "127.0.0.1:$PC" --peer "127.0.0.1:$PA" --mesh-key "$WORK/mesh.key" \
    --subscribe "cars" 2>"$WORK/C.log" &
pids+=($!)
mkfifo "$WORK/B.in"
"$T" shell --no-discovery --data "$WORK/B" --listen "127.0.0.1:$PB" --peer "127.0.0.1:$PA" --mesh-key "$WORK/mesh.key" \
    <"$WORK/B.in" >"$WORK/B.out" 2>"$WORK/B.log" &
pids+=($!)
exec 3>"$WORK/B.in"
echo "subscribe cars Origin == 'Japan'" >&3

has_count() { [ "$(count "$1")" = "$2" ]; }
wait_for 60 has_count B "$JAPAN" || { echo "B did not reach $JAPAN cars (has $(count B))"; exit 1; }
wait_for 60 has_count C "$TOTAL" || { echo "C did not reach $TOTAL cars (has $(count C))"; exit 1; }
converged=$(now)

# B changes one Japanese car; the change must reach A and C.
"$T" find --data "$WORK/B" cars "Origin == 'Japan'" >"$WORK/B.japan"
ID=$("$PY" -c 'import json, sys; print(json.dumps(json.loads(open(sys.argv[1]).readline())["_id"]))' "$WORK/B.japan")
NAME=$("$PY" -c 'import json, sys; print(json.loads(open(sys.argv[1]).readline())["Name"])' "$WORK/B.japan")
changed_at=$(now)
echo "upsert cars {\"_id\": $ID, \"Horsepower\": 999, \"Name\": \"$NAME (tuned on B)\"}" >&3
has_change() {
    local doc
    doc=$("$T" get --data "$WORK/$1" cars "$ID" 2>/dev/null) || return 1
    [[ "$doc" == *'"Horsepower":999'* ]]
}
wait_for 30 has_change A || { echo "the change did not reach A"; exit 1; }
wait_for 30 has_change C || { echo "the change did not reach C"; exit 1; }
propagated=$(now)

# Every node holds exactly what its subscription asks: same documents, same content.
"$T" find --data "$WORK/A" cars >"$WORK/A.all"
"$T" find --data "$WORK/A" cars "Origin == 'Japan'" >"$WORK/A.japan"
"$T" find --data "$WORK/B" cars >"$WORK/B.all"
"$T" find --data "$WORK/C" cars >"$WORK/C.all"
cmp -s "$WORK/A.all" "$WORK/C.all" || { echo "C differs from A"; exit 1; }
cmp -s "$WORK/A.japan" "$WORK/B.all" || { echo "B differs from A's Japanese cars"; exit 1; }
[ "$(wc -l <"$WORK/A.all")" -eq "$TOTAL" ] || { echo "A does not hold $TOTAL cars"; exit 1; }

echo
echo "Trellis demo — vega_datasets cars.json ($TOTAL cars, $JAPAN from Japan), 3 nodes on loopback, Noise XXpsk0 links"
printf '  %-3s %-34s %5s documents\n' "A" "imported all cars" "$(wc -l <"$WORK/A.all")"
printf '  %-3s %-34s %5s documents\n' "B" "subscribed: Origin == 'Japan'" "$(wc -l <"$WORK/B.all")"
printf '  %-3s %-34s %5s documents\n' "C" "subscribed: all cars" "$(wc -l <"$WORK/C.all")"
echo "  converged in $(elapsed "$start" "$converged") s after start (processes, handshakes and initial sync)"
echo "  B changed car $ID: Horsepower 999, Name \"$NAME (tuned on B)\""
for n in A B C; do
    printf '    on %s: %s\n' "$n" "$("$T" get --data "$WORK/$n" cars "$ID")"
done
echo "  the change reached A and C in $(elapsed "$changed_at" "$propagated") s"
echo "OK: every node holds exactly what its subscription asks"
