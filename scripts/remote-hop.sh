#!/usr/bin/env bash
# What the remote-array hop costs: the same load-harness scenarios run directly against
# stompgate A (embedded array) and through stompgate B (`--array grpc://A`), interleaved,
# RUNS times each, then a table of medians and B/A ratios.
#
#   scripts/remote-hop.sh                      RUNS=3 DURATION_S=8 WARMUP_S=2 by default;
#                                              CASES="fanout queue" picks scenarios
#   scripts/remote-hop.sh --summarize FILE     the table for an earlier results file
#
# Both gateways run with --cores 2 on loopback (A: STOMP 61813, gRPC 51813; B: STOMP 61814).
# For the direct runs the harness measures A's CPU (--server-pid A); through B it measures B's
# (the gateway hop), and A's CPU is left out of that column.
# Results: perf/results/remote-hop-<UTC time>.jsonl, one line per run:
#   {"run":N,"case":"...","broker":"direct|via-remote","exit":RC,"result":<--json line or null>}
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source "$ROOT/scripts/bench-lib.sh"

summarize() {
    python3 "$ROOT/perf/summarize.py" "$1" --by broker --base direct
}

if [ "${1:-}" = "--summarize" ]; then
    summarize "$2"
    exit 0
fi

RUNS="${RUNS:-3}"
DURATION_S="${DURATION_S:-8}"
WARMUP_S="${WARMUP_S:-2}"
A_STOMP=61813 A_GRPC=51813 B_STOMP=61814

cargo build --release --bin stompgate --bin stompgate-load >&2
BIN="$ROOT/target/release/stompgate"
LOAD="$ROOT/target/release/stompgate-load"
LOGS="$(mktemp -d /tmp/remote-hop.XXXXXX)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# A: the in-memory array (--store-dir off); B, in front of a remote array, keeps no store.
"$BIN" --cores 2 --ws-addr off --amqp-addr off --store-dir off --stomp-addr "127.0.0.1:$A_STOMP" --grpc-addr "127.0.0.1:$A_GRPC" >"$LOGS/a.log" 2>&1 &
A_PID=$!; PIDS+=("$A_PID")
sleep 1
"$BIN" --cores 2 --ws-addr off --amqp-addr off --stomp-addr "127.0.0.1:$B_STOMP" --array "grpc://127.0.0.1:$A_GRPC" >"$LOGS/b.log" 2>&1 &
B_PID=$!; PIDS+=("$B_PID")
sleep 1

mkdir -p perf/results
OUT="perf/results/remote-hop-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
case_args() {
    # The responder is the harness's own, on A's gRPC API in both cases.
    if [ "$1" = rpc ]; then echo "rpc --requesters 4 --inflight 16 --grpc 127.0.0.1:$A_GRPC"; else bench_case_args "$1"; fi
}
for run in $(seq 1 "$RUNS"); do
    for case in ${CASES:-fanout fanout-rate2k fanout-rate50k queue rpc}; do
        for target in direct via-remote; do
            if [ "$target" = direct ]; then port=$A_STOMP pid=$A_PID; else port=$B_STOMP pid=$B_PID; fi
            rc=0
            # shellcheck disable=SC2046
            line="$(timeout 300 "$LOAD" $(case_args "$case") --host 127.0.0.1 --port "$port" \
                --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" --name "hop-$case-$run-$$" \
                --label "$target" --json --quiet --server-pid "$pid")" || rc=$?
            [ -n "$line" ] || line=null
            printf '{"run":%d,"case":"%s","broker":"%s","exit":%d,"result":%s}\n' "$run" "$case" "$target" "$rc" "$line" >>"$OUT"
            echo "run $run $case $target exit $rc" >&2
        done
    done
done
echo "results: $OUT" >&2
summarize "$OUT"
