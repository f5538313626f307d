#!/usr/bin/env bash
# scripts/lan-netns.sh N — N Trellis nodes as separate hosts on one LAN, found by discovery alone.
#
# Needs root. Creates, all named with a per-run prefix:
#   - bridge B0 with N network namespaces, each with one veth interface (10.231.0.I/24);
#   - bridge B1 and a namespace "dual" with two interfaces, one on each bridge (10.231.0.200/24 and
#     10.231.1.200/24), plus a namespace "far" on B1 only (10.231.1.1/24).
# Starts `trellis node` in each (no --peer, default discovery: IPv4 broadcast and IPv6 ff02::1 on
# every interface, default listening port 4040), all subscribed to `cars`. Checks that every node on
# B0 and "dual" discover each other and form a full mesh, that "far" and "dual" discover each other
# (and only each other), then writes one document on the first node and waits for every node to hold
# it ("far" through "dual"). Prints the time from start to full mesh and to convergence.
# Removes every namespace, bridge and veth it made, also on failure or Ctrl-C.
#
# Environment: TRELLIS (the binary; default .build/debug/trellis), IDLE=SECONDS (after convergence,
# measure the idle traffic a node receives for that long and print bytes per second per peer),
# LOGS=DIR (keep the node logs there), VANISH=1 (then kill -9 one node and print how long until
# another's discovery cache drops it).
# Exit status: 0 on success, 1 on failure, 2 when not run as root or namespaces cannot be made.
set -euo pipefail
cd "$(dirname "$0")/.."

N=${1:-3}
[[ "$N" =~ ^[0-9]+$ ]] && [ "$N" -ge 2 ] && [ "$N" -le 50 ] || { echo "usage: $0 N (2 to 50 nodes)" >&2; exit 1; }
if [ "$(id -u)" -ne 0 ]; then
    echo "lan-netns.sh needs root (it creates network namespaces and bridges); skipped" >&2
    exit 2
fi
if ! ip netns add "tlprobe$$" 2>/dev/null; then
    echo "lan-netns.sh cannot create network namespaces here (no CAP_SYS_ADMIN/CAP_NET_ADMIN?); skipped" >&2
    exit 2
fi
ip netns del "tlprobe$$"
T=${TRELLIS:-$PWD/.build/debug/trellis}
[ -x "$T" ] || { echo "no trellis binary at $T; run swift build" >&2; exit 1; }
T=$(readlink -f "$T")

P="tl$$"  # prefix of every name this run creates (interface names stay within 15 characters)
WORK=$(mktemp -d /tmp/trellis-netns.XXXXXX)
namespaces=()
links=()
pids=()
cleanup() {
    status=$?
    exec 3>&- 2>/dev/null || true
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ "$status" -ne 0 ]; then
        echo "lan-netns failed (exit $status); node logs:"
        for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -15 "$f"; }; done
    fi
    if [ -n "${LOGS:-}" ]; then mkdir -p "$LOGS" && cp "$WORK"/*.log "$LOGS"/ 2>/dev/null || true; fi
    for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    for link in "${links[@]}"; do ip link del "$link" 2>/dev/null || true; done
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for b in 0 1; do
    ip link add "${P}b$b" type bridge
    links+=("${P}b$b")
    ip link set "${P}b$b" up
done

# host NAME BRIDGE ADDRESS [BRIDGE2 ADDRESS2]: a namespace with one interface per bridge.
host() {
    local name=$1 ns="$P-$1"
    ip netns add "$ns"
    namespaces+=("$ns")
    ip -n "$ns" link set lo up
    shift
    local i=0
    while [ $# -ge 2 ]; do
        local veth="${P}${name:0:4}$i"
        ip link add "$veth" type veth peer name "eth$i" netns "$ns"
        links+=("$veth")
        ip link set "$veth" master "${P}b$1" up
        ip -n "$ns" addr add "$2/24" dev "eth$i"
        ip -n "$ns" link set "eth$i" up
        shift 2
        i=$((i + 1))
    done
}

names=()
for i in $(seq 1 "$N"); do
    host "n$i" 0 "10.231.0.$i"
    names+=("n$i")
done
host dual 0 10.231.0.200 1 10.231.1.200
host far 1 10.231.1.1
lan=("${names[@]}" dual)  # the nodes on bridge 0

"$T" keygen "$WORK/mesh.key" >/dev/null
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

start=$(now)
mkfifo "$WORK/n1.in"
ip netns exec "$P-n1" "$T" shell --data "$WORK/n1" --mesh-key "$WORK/mesh.key" \
    <"$WORK/n1.in" >"$WORK/n1.out" 2>"$WORK/n1.log" &
pids+=($!)
exec 3>"$WORK/n1.in"
echo "subscribe cars" >&3
for name in "${names[@]:1}" dual far; do
    ip netns exec "$P-$name" "$T" node --data "$WORK/$name" --mesh-key "$WORK/mesh.key" --subscribe cars \
        2>"$WORK/$name.log" &
    pids+=($!)
done

# The peer keys, from each node's "listening on ..., peer key HEX" line.
declare -A key
for name in "${lan[@]}" far; do
    for _ in $(seq 1 200); do
        k=$(sed -n 's/.*peer key \([0-9a-f]\{16\}\).*/\1/p' "$WORK/$name.log" | head -1)
        [ -n "$k" ] && break
        sleep 0.05
    done
    [ -n "$k" ] || { echo "$name did not start"; exit 1; }
    key[$name]=$k
done

# sessions NAME: the peer keys (16 hex digits) NAME has established sessions with.
sessions() { sed -n 's/.*session established with .*(peer \([0-9a-f]\{16\}\)).*/\1/p' "$WORK/$1.log" | sort -u; }
has_sessions() { # has_sessions NAME PEER...
    local name=$1 got
    shift
    got=$(sessions "$name")
    for peer in "$@"; do grep -q "${key[$peer]}" <<<"$got" || return 1; done
}
full_mesh() {
    for a in "${lan[@]}"; do
        local others=()
        for b in "${lan[@]}"; do [ "$a" = "$b" ] || others+=("$b"); done
        has_sessions "$a" "${others[@]}" || return 1
    done
    has_sessions dual far && has_sessions far dual
}
wait_for() { # wait_for SECONDS COMMAND...
    local deadline=$(($(date +%s) + $1))
    shift
    until "$@"; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.05
    done
}

wait_for 20 full_mesh || { echo "no full mesh after 20 s"; exit 1; }
meshed=$(now)
far_sessions=$(sessions far | wc -l)
[ "$far_sessions" -eq 1 ] || { echo "far has $far_sessions sessions; it can only reach dual"; exit 1; }

echo 'upsert cars {"_id": "c1", "Name": "found by beacon"}' >&3
count() { "$T" find --data "$WORK/$1" cars --count 2>/dev/null || echo -1; }
all_have_it() { for name in "${lan[@]}" far; do [ "$(count "$name")" = 1 ] || return 1; done; }
wait_for 20 all_have_it || { echo "the document did not reach every node"; exit 1; }
converged=$(now)

echo "lan-netns: $N nodes on one bridge + one host on two bridges + one host behind it"
echo "  full mesh (every node on the bridge with every other; dual with far) $(elapsed "$start" "$meshed") s after start"
echo "  one document written on n1 reached all $((N + 2)) nodes $(elapsed "$meshed" "$converged") s later"

if [ "${IDLE:-0}" -gt 0 ]; then
    # Idle traffic into n2's interface (beacons of every peer on the bridge, IPv4 and IPv6, and
    # the keepalives of its sessions), after the fast period has passed.
    sleep 11
    rx() { ip netns exec "$P-n2" cat /sys/class/net/eth0/statistics/rx_bytes; }
    before=$(rx)
    sleep "$IDLE"
    after=$(rx)
    echo "  idle: n2 received $(((after - before) / IDLE)) bytes/s from $N peers ($(((after - before) / IDLE / N)) bytes/s per peer, beacons and keepalives, Ethernet frames)"
fi
if [ -n "${VANISH:-}" ]; then
    # n2 loses power (SIGKILL: no goodbye on its sessions); how long until n1's discovery cache
    # drops it?
    killed=$(now)
    { kill -9 "${pids[1]}" && wait "${pids[1]}"; } 2>/dev/null || true
    vanished() { grep -q "discovered peer ${key[n2]} vanished" "$WORK/n1.log"; }
    wait_for 30 vanished || { echo "n1 did not notice n2 vanish"; exit 1; }
    echo "  n1 noticed n2 vanish (SIGKILL) $(elapsed "$killed" "$(now)") s after it was killed"
fi
echo "lan-netns: OK"
