#!/usr/bin/env bash
# Interleaved A/B of two stompgate binaries under the same load harness: the check a change to a
# hot path comes with (README, Performance).
#
#   scripts/ab.sh A_BINARY B_BINARY            run, then print medians and spreads
#   scripts/ab.sh --summarize FILE             print the table for an earlier results file
#
# Each round runs every case once on A and once on B, the order alternating round by round, each
# on a freshly started gateway (`--cores $CORES --grpc-addr off --store-dir off`), so drift on the machine (thermal,
# other load) falls on both alike. The harness is target/release/stompgate-load of this tree
# (built if missing): both binaries are measured by the same client.
#
# Settings (environment):
#   ROUNDS=5                     rounds (the table shows medians and min-max per side)
#   CASES="fanout queue connect" scenarios, as in scripts/compare.sh: fanout 1->4 unbounded
#                                (receipt every 1000), queue 2->2 (receipt every 1000), connect
#                                (4 workers); amqp-fanout and amqp-queue are the same loads over
#                                AMQP 1.0 (scripts/amqp-bench.sh), to each gateway's AMQP
#                                listener on PORT+20 (A) / PORT+21 (B); amqp-store-fanout is
#                                amqp-fanout to an Events-Store channel (events-store/); idle holds
#                                IDLE_CONNECTIONS connections and reports the gateway's RSS per
#                                connection (e.g. IDLE_CONNECTIONS=19000 CASES=idle)
#   DURATION_S=8 WARMUP_S=2      measured window and warm-up per run
#   PORT=61653                   A listens on PORT, B on PORT+1 (each side its own port: a
#                                gateway's start-up refuses a port with another process's
#                                sockets, and an older binary's stopped connections in TIME_WAIT
#                                count as such for up to 60 s)
#   ARGS=""                      extra flags for both gateways
#   CORES=2                      the gateways' --cores (1: no cross-core hops, and no spread
#                                from where SO_REUSEPORT places each connection)
#   TRANSPORT=tcp                tcp, or ws: the harness speaks STOMP over WebSocket to each
#                                gateway's --ws-addr (PORT+10 for A, PORT+11 for B)
#   PLACEMENT=""                 1: each gateway also serves its operator views (--metrics-addr on
#                                PORT+30 / PORT+31) and each raw line records where the run's
#                                connections and channel sat, halfway through the window
#                                (scripts/placement.py), and the summary adds the table split by
#                                that placement: at --cores 2 throughput depends on it
#   STORE_PARENT=""              persistent A/B: each run's gateway gets its store on, in a fresh
#                                directory under STORE_PARENT (removed after the run), instead of
#                                --store-dir off; with CASES="queue-persistent queue-persistent-rate2k"
# Raw results: perf/results/ab-<UTC time>.jsonl, one line per run:
#   {"round":N,"case":"...","side":"A|B","binary":"<path>","sha256":"<of the binary>",
#    "exit":RC,"result":<stompgate-load --json line or null>}
# The machine should be otherwise idle.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source "$ROOT/scripts/bench-lib.sh"

summarize() {
    python3 "$ROOT/perf/summarize.py" "$1" --by side --base A
    # Runs that recorded their placement: the same table per placement class.
    if grep -q '"placement":{' "$1"; then
        echo
        echo "By placement (scripts/placement.py):"
        python3 "$ROOT/perf/summarize.py" "$1" --by side --base A --split placement.class
    fi
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


ulimit -n "$(ulimit -Hn)" || true
trap stop_gateway EXIT

if stomp_ready "$PORT" || stomp_ready "$((PORT + 1))"; then
    echo "ab.sh: something already answers STOMP on 127.0.0.1:$PORT or the port after it; set PORT" >&2
    exit 1
fi
mkdir -p perf/results
OUT="perf/results/ab-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
LOG="$(mktemp -t stompgate-ab.XXXXXX.log)"
declare -A BIN SHA STORE_OFF
BIN[A]="$A"
BIN[B]="$B"
# The in-memory array on both sides: `--store-dir off` (the default is ./store since issue 15),
# for a binary that knows the flag (an older one has no store).
STORE_OFF[A]="$("$A" --help 2>/dev/null | grep -q -- --store-dir && echo "--store-dir off" || true)"
STORE_OFF[B]="$("$B" --help 2>/dev/null | grep -q -- --store-dir && echo "--store-dir off" || true)"
# The AMQP listener on 127.0.0.1 (PORT+20 / PORT+21, not the default 0.0.0.0:5672, which two
# gateways in turn or another user of the machine could hold), for a binary that has one.
declare -A HAS_AMQP
HAS_AMQP[A]="$("$A" --help 2>/dev/null | grep -q -- --amqp-addr && echo 1 || true)"
HAS_AMQP[B]="$("$B" --help 2>/dev/null | grep -q -- --amqp-addr && echo 1 || true)"
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
            via=(--port "$port")
            listen=(--ws-addr off)
            amqp=()
            [ -n "${HAS_AMQP[$side]}" ] && amqp=(--amqp-addr "127.0.0.1:$((port + 20))")
            case "$case" in
            amqp-store-*) via=(--port "$((port + 20))" --amqp-topic-prefix events-store/ --amqp-queue-prefix queues/) ;;
            amqp-*) via=(--port "$((port + 20))" --amqp-topic-prefix events/ --amqp-queue-prefix queues/) ;;
            esac
            if [ "${TRANSPORT:-tcp}" = ws ]; then
                via=(--ws --port "$((port + 10))")
                listen=(--ws-addr "127.0.0.1:$((port + 10))")
            fi
            store=${STORE_OFF[$side]}
            run_store=""
            if [ -n "${STORE_PARENT:-}" ]; then
                mkdir -p "$STORE_PARENT"
                run_store="$(mktemp -d "$STORE_PARENT/ab-store.XXXXXX")"
                store="--store-dir $run_store"
            fi
            views=()
            [ -n "${PLACEMENT:-}" ] && views=(--metrics-addr "127.0.0.1:$((port + 30))")
            # shellcheck disable=SC2086
            "${BIN[$side]}" --stomp-addr "127.0.0.1:$port" --grpc-addr off --cores "${CORES:-2}" "${listen[@]}" "${amqp[@]}" "${views[@]}" $store $ARGS >"$LOG" 2>&1 &
            GW_PID=$!
            for _ in $(seq 1 100); do stomp_ready "$port" && break; sleep 0.1; done
            stomp_ready "$port" || { echo "ab.sh: ${BIN[$side]} did not start (log: $LOG)" >&2; exit 1; }
            echo "== round $round/$ROUNDS: $case on $side" >&2
            # The harness's run name is also its channel's name (placement.py looks it up).
            name="ab-$case-$round-$$"
            place="$(mktemp -t stompgate-place.XXXXXX)"
            echo null >"$place"
            place_pid=""
            if [ -n "${PLACEMENT:-}" ]; then
                (sleep "$(python3 -c "print($WARMUP_S + $DURATION_S / 2)")"
                 python3 "$ROOT/scripts/placement.py" "127.0.0.1:$((port + 30))" "$name" >"$place.new" 2>/dev/null \
                     && mv "$place.new" "$place") &
                place_pid=$!
            fi
            rc=0
            # shellcheck disable=SC2046
            line="$(timeout 300 "$LOAD" $(bench_case_args "$case") --host 127.0.0.1 "${via[@]}" \
                --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" --name "$name" \
                --label "$side" --json --quiet --server-pid "$GW_PID")" || rc=$?
            [ -n "$line" ] || line=null
            [ -n "$place_pid" ] && wait "$place_pid"
            printf '{"round":%d,"case":"%s","side":"%s","binary":"%s","sha256":"%s","exit":%d,"placement":%s,"result":%s}\n' \
                "$round" "$case" "$side" "${BIN[$side]}" "${SHA[$side]}" "$rc" "$(cat "$place")" "$line" >>"$OUT"
            rm -f "$place" "$place.new"
            stop_gateway
            [ -n "$run_store" ] && rm -rf "$run_store"
            sleep 1
        done
    done
done
summarize "$OUT"
