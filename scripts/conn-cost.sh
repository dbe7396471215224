#!/usr/bin/env bash
# Where a connection's server CPU goes: user against kernel time, context switches (voluntary,
# involuntary) and system calls per connection, for stompgate and the bare relay, interleaved.
# The load is the issue-19 connect case (`stompgate-load connect --workers 4`: TCP connect,
# CONNECT, CONNECTED, DISCONNECT + receipt, close); stompgate runs `--cores N --store-dir off`
# for each N in CORES (default 2; e.g. CORES="1 2" measures both, interleaved with the relay).
#
#   ROUNDS=3 DURATION_S=6 [CORES="1 2"] scripts/conn-cost.sh [STOMPGATE_BIN]
#
# Per thread of the server, from /proc/<pid>/task/*/{stat,status} sampled around the middle
# DURATION_S - 2 seconds of each run; system calls from `perf stat -e raw_syscalls:sys_enter`
# over the same seconds (no PMU needed: a tracepoint). One line per run and server, then the
# same as JSON lines in perf/results/conn-cost-<UTC>.jsonl. Needs perf; run on an idle machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
. scripts/bench-lib.sh
SG="${1:-target/release/stompgate}"
RELAY="target/release/stompgate-relay"
LOAD="target/release/stompgate-load"
ROUNDS="${ROUNDS:-3}"
DURATION_S="${DURATION_S:-6}"
PORT="${PORT:-61694}"
CORES="${CORES:-2}"
OUT="perf/results/conn-cost-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
HZ="$(getconf CLK_TCK)"

# Sums over the server's threads: user ticks, system ticks, voluntary, involuntary switches.
snapshot() {
    local pid="$1" t
    for t in /proc/"$pid"/task/*; do
        awk '{printf "%s %s ", $14, $15}' "$t/stat" 2>/dev/null || continue
        awk '/^voluntary_ctxt_switches/ {v=$2} /^nonvoluntary_ctxt_switches/ {n=$2} END {print v, n}' "$t/status" 2>/dev/null
    done | awk '{u+=$1; s+=$2; v+=$3; n+=$4} END {print u, s, v, n}'
}

one_run() {
    local server="$1" round="$2" pid load_pid a b calls n
    if [ "$server" = relay ]; then
        "$RELAY" --listen "127.0.0.1:$PORT" >/dev/null 2>&1 &
    else
        # server is stompgate-cN
        "$SG" --stomp-addr "127.0.0.1:$PORT" --grpc-addr off --metrics-addr off --store-dir off --cores "${server#stompgate-c}" >/dev/null 2>&1 &
    fi
    pid=$!
    wait_for_stomp "$PORT" "$LOAD"
    "$LOAD" connect --workers 4 --port "$PORT" --duration-s "$DURATION_S" --warmup-s 0 --json --quiet --name conn-cost >/tmp/conn-cost.$$.json 2>/dev/null &
    load_pid=$!
    sleep 1
    a="$(snapshot "$pid")"
    calls="$(perf stat -x, -e raw_syscalls:sys_enter -p "$pid" -- sleep $((DURATION_S - 2)) 2>&1 >/dev/null | awk -F, '/raw_syscalls/ {print $1}')"
    b="$(snapshot "$pid")"
    wait "$load_pid"
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    # Connections in the sampled seconds: the run's rate times their length.
    n="$(python3 -c "import json,sys; print(json.load(open('/tmp/conn-cost.$$.json'))['connections_per_s'] * $((DURATION_S - 2)))")"
    python3 - "$server" "$round" "$n" "$HZ" "$a" "$b" "$calls" <<'EOF' | tee -a "$OUT"
import json, sys
server, rnd, n, hz = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
a, b = [list(map(float, s.split())) for s in sys.argv[5:7]]
d = [y - x for x, y in zip(a, b)]
calls = float(sys.argv[7] or "nan")
print(json.dumps({"server": server, "round": rnd, "connections": round(n),
    "user_us_per_conn": round(d[0] / hz * 1e6 / n, 1), "sys_us_per_conn": round(d[1] / hz * 1e6 / n, 1),
    "voluntary_per_conn": round(d[2] / n, 3), "involuntary_per_conn": round(d[3] / n, 3),
    "syscalls_per_conn": round(calls / n, 2)}))
EOF
    sleep 1
}

mkdir -p perf/results
for round in $(seq 1 "$ROUNDS"); do
    order="relay"
    for c in $CORES; do order="$order stompgate-c$c"; done
    # Alternate the order round by round, so drift falls on every server alike.
    if [ $((round % 2)) = 0 ]; then order="$(echo "$order" | tr ' ' '\n' | tac | tr '\n' ' ')"; fi
    for server in $order; do one_run "$server" "$round"; done
done
rm -f /tmp/conn-cost.$$.json
echo "raw: $OUT"
