#!/usr/bin/env bash
# Interleaved A/B of two stompgate binaries under the same load harness: the check a change to a
# hot path comes with (README, Performance).
#
#   scripts/ab.sh A_BINARY B_BINARY            run, then print medians and spreads
#   scripts/ab.sh --summarize FILE             print the table for an earlier results file
#
# Each round runs every case once on A and once on B, the order alternating round by round, each
# on a freshly started gateway (`--cores 2 --grpc-addr off`), so drift on the machine (thermal,
# other load) falls on both alike. The harness is target/release/stompgate-load of this tree
# (built if missing): both binaries are measured by the same client.
#
# Settings (environment):
#   ROUNDS=5                     rounds (the table shows medians and min-max per side)
#   CASES="fanout queue connect" scenarios, as in scripts/compare.sh: fanout 1->4 unbounded
#                                (receipt every 1000), queue 2->2 (receipt every 1000), connect
#                                (4 workers)
#   DURATION_S=8 WARMUP_S=2      measured window and warm-up per run
#   PORT=61653                   A listens on PORT, B on PORT+1 (each side its own port: a
#                                gateway's start-up refuses a port with another process's
#                                sockets, and an older binary's stopped connections in TIME_WAIT
#                                count as such for up to 60 s)
#   ARGS=""                      extra flags for both gateways
# Raw results: perf/results/ab-<UTC time>.jsonl, one line per run:
#   {"round":N,"case":"...","side":"A|B","binary":"<path>","sha256":"<of the binary>",
#    "exit":RC,"result":<stompgate-load --json line or null>}
# The machine should be otherwise idle.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

summarize() {
    python3 - "$1" <<'PY'
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
METRICS = {
    "fanout": [("delivered_per_s", True), ("p99_us", False), ("server_cpu_us_per_msg", False)],
    "queue": [("delivered_per_s", True), ("p99_us", False), ("server_cpu_us_per_msg", False)],
    "connect": [("connections_per_s", True), ("p99_us", False)],
}
cases = []
for r in rows:
    if r["case"] not in cases:
        cases.append(r["case"])
sides = {}
for r in rows:
    sides.setdefault(r["side"], (r["binary"], r["sha256"][:12]))
for side, (binary, sha) in sorted(sides.items()):
    print(f"{side}: {binary} (sha256 {sha}...)")
print()
print(f"| case | metric | A median (min-max) | B median (min-max) | B/A |")
print(f"|---|---|---|---|---|")
for case in cases:
    kind = case.split("-")[0]
    for metric, _higher in METRICS.get(kind, []):
        cells = []
        medians = []
        for side in ("A", "B"):
            vals = [r["result"][metric] for r in rows
                    if r["case"] == case and r["side"] == side and r["result"] and metric in r["result"]]
            if not vals:
                cells.append("-")
                medians.append(None)
                continue
            m = statistics.median(vals)
            medians.append(m)
            cells.append(f"{m:,.2f} ({min(vals):,.2f}-{max(vals):,.2f}), n={len(vals)}")
        ratio = f"{medians[1] / medians[0]:.3f}" if all(medians) else "-"
        print(f"| {case} | {metric} | {cells[0]} | {cells[1]} | {ratio} |")
bad = [r for r in rows if r["exit"] != 0]
if bad:
    print()
    print(f"{len(bad)} run(s) exited non-zero: " + ", ".join(f'{r["case"]}/{r["side"]}/round {r["round"]}: {r["exit"]}' for r in bad))
PY
}

if [ "${1:-}" = --summarize ]; then
    summarize "$2"
    exit 0
fi
if [ $# -ne 2 ]; then
    sed -n '2,8p' "$0" >&2
    exit 2
fi
A="$(realpath "$1")"
B="$(realpath "$2")"
ROUNDS="${ROUNDS:-5}"
DURATION_S="${DURATION_S:-8}"
WARMUP_S="${WARMUP_S:-2}"
PORT="${PORT:-61653}"
ARGS="${ARGS:-}"
# shellcheck disable=SC2206
CASES=(${CASES:-fanout queue connect})

LOAD="$ROOT/target/release/stompgate-load"
[ -x "$LOAD" ] || cargo build --release --bin stompgate-load >&2

stomp_ready() {
    python3 - "$1" <<'PY' 2>/dev/null
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1)
s.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\0")
s.settimeout(2)
sys.exit(0 if s.recv(9).startswith(b"CONNECTED") else 1)
PY
}

case_args() {
    case "$1" in
    fanout) echo "fanout --subscribers 4 --rate 0 --receipt-every 1000" ;;
    queue) echo "queue --producers 2 --consumers 2 --rate 0 --receipt-every 1000" ;;
    connect) echo "connect --workers 4" ;;
    *) echo "ab.sh: unknown case $1" >&2; exit 2 ;;
    esac
}

ulimit -n "$(ulimit -Hn)" || true
GW_PID=""
stop_gateway() {
    if [ -n "$GW_PID" ] && kill -0 "$GW_PID" 2>/dev/null; then
        kill -TERM "$GW_PID" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$GW_PID" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$GW_PID" 2>/dev/null && kill -KILL "$GW_PID" 2>/dev/null || true
    fi
    GW_PID=""
}
trap stop_gateway EXIT

if stomp_ready "$PORT" || stomp_ready "$((PORT + 1))"; then
    echo "ab.sh: something already answers STOMP on 127.0.0.1:$PORT or the port after it; set PORT" >&2
    exit 1
fi
mkdir -p perf/results
OUT="perf/results/ab-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
LOG="$(mktemp -t stompgate-ab.XXXXXX.log)"
declare -A BIN SHA
BIN[A]="$A"
BIN[B]="$B"
SHA[A]="$(sha256sum "$A" | cut -d' ' -f1)"
SHA[B]="$(sha256sum "$B" | cut -d' ' -f1)"
echo "ab.sh: A=$A B=$B; $ROUNDS round(s) of ${CASES[*]}; results: $OUT" >&2
for round in $(seq 1 "$ROUNDS"); do
    order=(A B)
    [ $((round % 2)) -eq 0 ] && order=(B A)
    for case in "${CASES[@]}"; do
        for side in "${order[@]}"; do
            port=$PORT
            [ "$side" = B ] && port=$((PORT + 1))
            # shellcheck disable=SC2086
            "${BIN[$side]}" --stomp-addr "127.0.0.1:$port" --grpc-addr off --cores 2 $ARGS >"$LOG" 2>&1 &
            GW_PID=$!
            for _ in $(seq 1 100); do stomp_ready "$port" && break; sleep 0.1; done
            stomp_ready "$port" || { echo "ab.sh: ${BIN[$side]} did not start (log: $LOG)" >&2; exit 1; }
            echo "== round $round/$ROUNDS: $case on $side" >&2
            rc=0
            # shellcheck disable=SC2046
            line="$(timeout 300 "$LOAD" $(case_args "$case") --host 127.0.0.1 --port "$port" \
                --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" --name "ab-$case-$round-$$" \
                --label "$side" --json --quiet --server-pid "$GW_PID")" || rc=$?
            [ -n "$line" ] || line=null
            printf '{"round":%d,"case":"%s","side":"%s","binary":"%s","sha256":"%s","exit":%d,"result":%s}\n' \
                "$round" "$case" "$side" "${BIN[$side]}" "${SHA[$side]}" "$rc" "$line" >>"$OUT"
            stop_gateway
            sleep 1
        done
    done
done
summarize "$OUT"
