#!/usr/bin/env bash
# stompgate vs. peer brokers, same harness, same scenarios, interleaved.
#
#   scripts/compare.sh                      build, start everything, run, print the table
#   scripts/compare.sh --summarize FILE     print the table for an earlier results file
#
# Settings (environment):
#   RUNS=3                      runs per scenario and broker (the table shows medians)
#   PEERS="rabbitmq activemq"   peers to start with scripts/peers.sh (a peer that cannot be
#                               installed or started is skipped with a warning)
#   DURATION_S=10 WARMUP_S=2    measured window and warm-up per scenario run
#   IDLE_CONNECTIONS=5000       connections held by the idle scenario
#   STOMPGATE_PORT=61613        stompgate's STOMP port (peers: see scripts/peers.sh)
#   STOMPGATE_ARGS=""           extra flags for stompgate (it gets --cores 2, and --store-dir off unless these name a --store-dir)
#   STORE_PARENT=""             also measure a second stompgate, labelled stompgate-store, on
#                               STOMPGATE_PORT+3 with its store on (--store-dir, default
#                               --store-sync fsync) in a fresh directory made under STORE_PARENT
#                               (put it on the disk to be measured, not a tmpfs) and removed at the end
#   STORE_ARGS=""               extra flags for stompgate-store (e.g. --store-sync-interval-us 500)
#   SUMMARY_BASE=stompgate      the broker the table's ratio columns divide (BASE/other)
#   CASES="fanout fanout-rate2k queue connect idle"   scenarios to run (a subset for a quick look;
#                               fanout-rate50k, not in the default, runs fanout 1->4 at 50,000/s
#                               against stompgate and the relay only: it is beyond both peers'
#                               capacity, and its p99 is read against the peers' p99 at 2,000/s;
#                               queue-persistent and queue-persistent-rate2k, not in the default,
#                               are the persistent-queue cases of scripts/store-bench.sh)
#   KEEP_PEERS=0                1 = leave the peers running afterwards
#   SKIP_BUILD=0                1 = measure the release binaries as they are (no cargo build;
#                               each raw line's stompgate_sha256 says which binary that was)
#   BASELINE=relay              also measure stompgate-relay (perf/relay/), a bare
#                               single-threaded relay that validates and stores nothing: the
#                               machine's floor, measured in the same run; BASELINE= to skip
#   RELAY_PORT=61643            its STOMP port
#   TRANSPORTS=tcp              the transports every broker is measured over, where it has them
#                               (tcp, tls, ws; e.g. TRANSPORTS="tcp tls ws"). stompgate is always
#                               measured over tcp too, the base of every ratio; it serves tls on
#                               STOMPGATE_PORT+1 (the certificate scripts/peers.sh makes, as the
#                               peers') and ws on STOMPGATE_PORT+2 (path /ws). A broker measured
#                               over tls or ws is labelled BROKER-tls / BROKER-ws. RabbitMQ has all
#                               three (Web-STOMP), ActiveMQ tcp and tls, the relay tcp only.
#
# Scenarios: fanout 1->4 unbounded (receipt every 1000); fanout 1->4 at --rate 2000 (latency);
# queue 2->2; connect (4 workers); idle; queue-persistent 2->2 with every SEND receipted (64
# outstanding per producer) and persistent:true, unbounded and at --rate 2000 (bench-lib.sh
# has each case's harness arguments). Every broker is loopback-only.
# Raw results: perf/results/compare-<UTC time>.jsonl, one line per run:
#   {"run":N,"case":"...","broker":"...","exit":RC,"commit":"<git rev-parse HEAD>[-dirty]",
#    "stompgate_sha256":"<sha256 of target/release/stompgate>","loadavg":"<1 5 15 min before the run>",
#    "result":<stompgate-load --json line or null>}
#   (commit and stompgate_sha256 say which code and which binary stompgate's figures came from;
#   they are on every line, the peers' too, so a line is self-describing.)
# Exit 3 from the harness (loss or duplicates) is recorded, not fatal. The machine running
# this should be otherwise idle: every broker here shares its cores with the harness.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source "$ROOT/scripts/bench-lib.sh"

SUMMARY_BASE="${SUMMARY_BASE:-stompgate}"
summarize() {
    python3 "$ROOT/perf/summarize.py" "$1" --by broker --base "$SUMMARY_BASE" --base-first --ok-exits 0,3
    echo
    echo "lost/duplicated count window messages; delivered_per_s counts only what arrived inside the" \
        "window. idle rss_per_conn_bytes of a JVM broker (activemq) only shows heap growth beyond what" \
        "the JVM had already mapped. Source: $1"
}

if [ "${1:-}" = "--summarize" ]; then
    [ $# -eq 2 ] || { echo "usage: $0 --summarize FILE" >&2; exit 2; }
    summarize "$2"
    exit 0
fi

RUNS="${RUNS:-3}"
PEERS="${PEERS-rabbitmq activemq}"
DURATION_S="${DURATION_S:-10}"
WARMUP_S="${WARMUP_S:-2}"
IDLE_CONNECTIONS="${IDLE_CONNECTIONS:-5000}"
STOMPGATE_PORT="${STOMPGATE_PORT:-61613}"
STOMPGATE_ARGS="${STOMPGATE_ARGS:-}"
STORE_PARENT="${STORE_PARENT:-}"
STORE_ARGS="${STORE_ARGS:-}"
KEEP_PEERS="${KEEP_PEERS:-0}"
BASELINE="${BASELINE-relay}"
RELAY_PORT="${RELAY_PORT:-61643}"
PEERS_DIR="${PEERS_DIR:-/tmp/stompgate-peers}"
export PEERS_DIR
# shellcheck disable=SC2206
TRANSPORTS=(${TRANSPORTS:-tcp})
for t in "${TRANSPORTS[@]}"; do
    case "$t" in tcp | tls | ws) ;; *) echo "compare.sh: unknown transport '$t' (tcp, tls, ws)" >&2; exit 2 ;; esac
done
wants() { [[ " ${TRANSPORTS[*]} " == *" $1 "* ]]; }
TLS_DIR="$PEERS_DIR/tls"

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi

stomp_ready() { # PORT
    timeout 3 bash -c '
        exec 3<>/dev/tcp/127.0.0.1/'"$1"' || exit 1
        printf "CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\nheart-beat:0,0\n\n\0" >&3
        IFS= read -r line <&3 || exit 1
        printf "DISCONNECT\n\n\0" >&3
        [ "${line%$'"'"'\r'"'"'}" = CONNECTED ]
    ' 2>/dev/null
}

if [ "${SKIP_BUILD:-0}" != 1 ]; then
    echo "== cargo build --release" >&2
    cargo build --release --bin stompgate --bin stompgate-load --bin stompgate-relay >&2
fi
LOAD="$ROOT/target/release/stompgate-load"

ulimit -n "$(ulimit -Hn)" || true
SG_PID=""
STORE_SG_PID=""
STORE_DIR=""
RELAY_PID=""
STARTED_PEERS=()
stop_pid() { # PID: TERM, up to 5 s, then KILL
    if [ -n "$1" ] && kill -0 "$1" 2>/dev/null; then
        kill -TERM "$1" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$1" 2>/dev/null && kill -KILL "$1" 2>/dev/null || true
    fi
}
cleanup() {
    if [ -n "$RELAY_PID" ]; then kill "$RELAY_PID" 2>/dev/null || true; fi
    stop_pid "$SG_PID"
    stop_pid "$STORE_SG_PID"
    if [ -n "$STORE_DIR" ]; then rm -rf "$STORE_DIR"; fi
    if [ "$KEEP_PEERS" != 1 ]; then
        for p in "${STARTED_PEERS[@]}"; do scripts/peers.sh stop "$p" || true; done
    fi
}
trap cleanup EXIT

if stomp_ready "$STOMPGATE_PORT"; then
    echo "compare.sh: something already answers STOMP on 127.0.0.1:$STOMPGATE_PORT; set STOMPGATE_PORT" >&2
    exit 1
fi
mkdir -p "$PEERS_DIR"
SG_LISTEN=(--stomp-addr "127.0.0.1:$STOMPGATE_PORT")
if wants tls; then
    scripts/peers.sh certs >/dev/null
    SG_LISTEN+=(--tls-cert "$TLS_DIR/server.pem" --tls-key "$TLS_DIR/server.key" --stomp-tls-addr "127.0.0.1:$((STOMPGATE_PORT + 1))")
fi
if wants ws; then SG_LISTEN+=(--ws-addr "127.0.0.1:$((STOMPGATE_PORT + 2))"); else SG_LISTEN+=(--ws-addr off); fi
# shellcheck disable=SC2086
# The in-memory array (the peers run without persistence too): --store-dir off, unless
# STOMPGATE_ARGS names a store (a persistent run).
STORE_OFF="--store-dir off"
case " $STOMPGATE_ARGS " in *" --store-dir"*) STORE_OFF="" ;; esac
"$ROOT/target/release/stompgate" "${SG_LISTEN[@]}" --grpc-addr off --amqp-addr off $STORE_OFF --cores 2 $STOMPGATE_ARGS \
    >"$PEERS_DIR/stompgate.log" 2>&1 &
SG_PID=$!
for _ in $(seq 1 100); do stomp_ready "$STOMPGATE_PORT" && break; sleep 0.1; done
stomp_ready "$STOMPGATE_PORT" || { echo "compare.sh: stompgate did not start (log: $PEERS_DIR/stompgate.log)" >&2; exit 1; }

# The persistent gateway: same listeners but STOMP only, its store in a fresh directory.
if [ -n "$STORE_PARENT" ]; then
    STORE_PORT=$((STOMPGATE_PORT + 3))
    if stomp_ready "$STORE_PORT"; then
        echo "compare.sh: something already answers STOMP on 127.0.0.1:$STORE_PORT; set STOMPGATE_PORT" >&2
        exit 1
    fi
    mkdir -p "$STORE_PARENT"
    STORE_DIR="$(mktemp -d "$STORE_PARENT/stompgate-store.XXXXXX")"
    echo "compare.sh: stompgate-store's store: $STORE_DIR ($(df --output=source,fstype "$STORE_DIR" | tail -1 | tr -s ' '))" >&2
    # shellcheck disable=SC2086
    "$ROOT/target/release/stompgate" --stomp-addr "127.0.0.1:$STORE_PORT" --ws-addr off --grpc-addr off --amqp-addr off \
        --cores 2 --store-dir "$STORE_DIR" $STORE_ARGS >"$PEERS_DIR/stompgate-store.log" 2>&1 &
    STORE_SG_PID=$!
    for _ in $(seq 1 100); do stomp_ready "$STORE_PORT" && break; sleep 0.1; done
    stomp_ready "$STORE_PORT" || { echo "compare.sh: stompgate-store did not start (log: $PEERS_DIR/stompgate-store.log)" >&2; exit 1; }
fi

# Each measured broker is a label (BROKER or BROKER-TRANSPORT) with a port, a server pid and
# the harness's transport flags.
declare -A PORT PID VIA
BROKERS=()
add_broker() { # LABEL PORT PID TRANSPORT
    BROKERS+=("$1")
    PORT[$1]="$2"
    PID[$1]="$3"
    case "$4" in
    tcp) VIA[$1]="" ;;
    tls) VIA[$1]="--tls --tls-ca $TLS_DIR/ca.pem" ;;
    ws) VIA[$1]="--ws" ;;
    esac
}
label() { if [ "$2" = tcp ]; then echo "$1"; else echo "$1-$2"; fi; }
add_broker stompgate "$STOMPGATE_PORT" "$SG_PID" tcp
[ -n "$STORE_SG_PID" ] && add_broker stompgate-store "$STORE_PORT" "$STORE_SG_PID" tcp
wants tls && add_broker stompgate-tls "$((STOMPGATE_PORT + 1))" "$SG_PID" tls
wants ws && add_broker stompgate-ws "$((STOMPGATE_PORT + 2))" "$SG_PID" ws
for p in $PEERS; do
    if scripts/peers.sh start "$p"; then
        STARTED_PEERS+=("$p")
        pid="$(scripts/peers.sh pid "$p" 2>/dev/null || true)"
        for t in "${TRANSPORTS[@]}"; do
            if port="$(scripts/peers.sh port "$p" "$t" 2>/dev/null)"; then
                add_broker "$(label "$p" "$t")" "$port" "$pid" "$t"
            else
                echo "compare.sh: $p has no STOMP listener over $t; measured without it" >&2
            fi
        done
    else
        echo "compare.sh: WARNING: peer $p is not available; comparing without it" >&2
    fi
done

if [ "$BASELINE" = relay ] && wants tcp; then
    if stomp_ready "$RELAY_PORT"; then
        echo "compare.sh: something already answers STOMP on 127.0.0.1:$RELAY_PORT; set RELAY_PORT" >&2
        exit 1
    fi
    "$ROOT/target/release/stompgate-relay" --listen "127.0.0.1:$RELAY_PORT" >"$PEERS_DIR/relay.log" 2>&1 &
    RELAY_PID=$!
    for _ in $(seq 1 50); do stomp_ready "$RELAY_PORT" && break; sleep 0.1; done
    stomp_ready "$RELAY_PORT" || { echo "compare.sh: stompgate-relay did not start (log: $PEERS_DIR/relay.log)" >&2; exit 1; }
    add_broker relay "$RELAY_PORT" "$RELAY_PID" tcp
fi

# shellcheck disable=SC2206
CASES=(${CASES:-fanout fanout-rate2k queue connect idle})

# Which code and which binary: every raw line records both.
COMMIT="$(git rev-parse HEAD)"
[ -z "$(git status --porcelain --untracked-files=no)" ] || COMMIT="$COMMIT-dirty"
SG_SHA256="$(sha256sum "$ROOT/target/release/stompgate" | cut -d' ' -f1)"

mkdir -p perf/results
OUT="perf/results/compare-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
echo "compare.sh: brokers: ${BROKERS[*]}; $RUNS run(s); results: $OUT" >&2
# fanout-rate50k only on stompgate and the relay (beyond both peers' capacity, see CASES above).
bench_skip() { [ "$1" = fanout-rate50k ] && [[ "$2" != stompgate* ]] && [ "$2" != relay ]; }
bench_rounds "$OUT" "$RUNS" cmp VIA

summarize "$OUT"
