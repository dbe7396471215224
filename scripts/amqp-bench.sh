#!/usr/bin/env bash
# AMQP 1.0 throughput: stompgate vs. RabbitMQ (rabbitmq_amqp1_0) and ActiveMQ 5 (amqp+nio), same
# harness (stompgate-load --protocol amqp), same scenarios, interleaved (issue 16's benchmark).
#
#   scripts/amqp-bench.sh                   build, start everything, run, print the table
#   scripts/amqp-bench.sh --summarize FILE  print the table for an earlier results file
#
# Settings (environment):
#   ROUNDS=3                    rounds; each runs every case once on every broker, the broker
#                               order rotating by one each round
#   DURATION_S=8 WARMUP_S=2     measured window and warm-up per run
#   CASES="amqp-fanout amqp-queue"   fanout 1->4 pre-settled; queue 2->2, unsettled producers
#                               (counted when accepted, at most 1,000 unsettled each), consumers
#                               accepting every delivery (scripts/bench-lib.sh)
#   PEERS="rabbitmq activemq"   started with scripts/peers.sh (AMQP ports: peers.sh port PEER amqp);
#                               a peer that cannot be started is skipped with a warning
#   STOMPGATE_AMQP_PORT=5672    stompgate's AMQP listener (STOMP on STOMPGATE_PORT, 61613)
#   STOMPGATE_ARGS=""           extra flags for stompgate (it gets --cores 2, and --store-dir off
#                               unless these name a --store-dir: the peers are measured in memory)
#   SKIP_BUILD=0                1 = use the release binaries as they are
#   KEEP_PEERS=0                1 = leave the peers running afterwards
#
# Addresses: stompgate events/<name> and queues/<name>; RabbitMQ 3.x /topic/<name> and
# /queue/<name>; ActiveMQ topic://<name> and queue://<name>.
# Raw results: perf/results/amqp-bench-<UTC time>.jsonl, one line per run, as compare.sh's:
#   {"run":N,"case":"...","broker":"...","exit":RC,"commit":"<HEAD>[-dirty]",
#    "stompgate_sha256":"...","loadavg":"<1 5 15 min before the run>","result":<harness JSON or null>}
# The table: per case and metric the median (min-max, count) per broker and stompgate/peer.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source "$ROOT/scripts/bench-lib.sh"

summarize() {
    python3 "$ROOT/perf/summarize.py" "$1" --by broker --base stompgate --base-first --ok-exits 0,3
    echo
    echo "lost/duplicated count window messages; delivered_per_s counts only what arrived inside the window. Source: $1"
}

if [ "${1:-}" = "--summarize" ]; then
    [ $# -eq 2 ] || { echo "usage: $0 --summarize FILE" >&2; exit 2; }
    summarize "$2"
    exit 0
fi

ROUNDS="${ROUNDS:-3}"
DURATION_S="${DURATION_S:-8}"
WARMUP_S="${WARMUP_S:-2}"
PEERS="${PEERS-rabbitmq activemq}"
STOMPGATE_PORT="${STOMPGATE_PORT:-61613}"
STOMPGATE_AMQP_PORT="${STOMPGATE_AMQP_PORT:-5672}"
STOMPGATE_ARGS="${STOMPGATE_ARGS:-}"
KEEP_PEERS="${KEEP_PEERS:-0}"
PEERS_DIR="${PEERS_DIR:-/tmp/stompgate-peers}"
export PEERS_DIR
# shellcheck disable=SC2206
CASES=(${CASES:-amqp-fanout amqp-queue})

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    echo "== cargo build --release" >&2
    cargo build --release --bin stompgate --bin stompgate-load >&2
fi
LOAD="$ROOT/target/release/stompgate-load"

# amqp_ready PORT: true when something answers an AMQP 1.0 (or SASL) protocol header with one.
amqp_ready() {
    timeout 3 bash -c '
        exec 3<>/dev/tcp/127.0.0.1/'"$1"' || exit 1
        printf "AMQP\3\1\0\0" >&3
        head -c 4 <&3 | grep -q AMQP
    ' 2>/dev/null
}

ulimit -n "$(ulimit -Hn)" || true
STARTED_PEERS=()
cleanup() {
    stop_gateway
    if [ "$KEEP_PEERS" != 1 ]; then
        for p in "${STARTED_PEERS[@]}"; do scripts/peers.sh stop "$p" || true; done
    fi
}
trap cleanup EXIT

if amqp_ready "$STOMPGATE_AMQP_PORT"; then
    echo "amqp-bench.sh: something already answers AMQP on 127.0.0.1:$STOMPGATE_AMQP_PORT; set STOMPGATE_AMQP_PORT" >&2
    exit 1
fi
mkdir -p "$PEERS_DIR"
# The in-memory array (the default is ./store since issue 15), unless STOMPGATE_ARGS names a store.
STORE_OFF="--store-dir off"
case " $STOMPGATE_ARGS " in *" --store-dir"*) STORE_OFF="" ;; esac
# shellcheck disable=SC2086
"$ROOT/target/release/stompgate" --stomp-addr "127.0.0.1:$STOMPGATE_PORT" --amqp-addr "127.0.0.1:$STOMPGATE_AMQP_PORT" \
    --grpc-addr off --ws-addr off $STORE_OFF --cores 2 $STOMPGATE_ARGS >"$PEERS_DIR/stompgate-amqp.log" 2>&1 &
GW_PID=$!
for _ in $(seq 1 100); do amqp_ready "$STOMPGATE_AMQP_PORT" && break; sleep 0.1; done
amqp_ready "$STOMPGATE_AMQP_PORT" || { echo "amqp-bench.sh: stompgate did not start (log: $PEERS_DIR/stompgate-amqp.log)" >&2; exit 1; }

declare -A PORT PID PREFIX
BROKERS=(stompgate)
PORT[stompgate]="$STOMPGATE_AMQP_PORT"
PID[stompgate]="$GW_PID"
PREFIX[stompgate]="--amqp-topic-prefix events/ --amqp-queue-prefix queues/"
for p in $PEERS; do
    # A peer without an AMQP 1.0 listener (peers.sh says why) is not started at all.
    if ! port="$(scripts/peers.sh port "$p" amqp)"; then
        echo "amqp-bench.sh: WARNING: $p has no AMQP 1.0 listener; measuring without it" >&2
        continue
    fi
    if ! scripts/peers.sh start "$p"; then
        echo "amqp-bench.sh: WARNING: peer $p is not available; measuring without it" >&2
        continue
    fi
    STARTED_PEERS+=("$p")
    for _ in $(seq 1 60); do amqp_ready "$port" && break; sleep 1; done
    if ! amqp_ready "$port"; then
        echo "amqp-bench.sh: WARNING: $p does not answer AMQP on 127.0.0.1:$port; measuring without it" >&2
        continue
    fi
    BROKERS+=("$p")
    PORT[$p]="$port"
    case "$p" in
    rabbitmq)
        PID[$p]="$(pgrep -u rabbitmq -o beam.smp || true)"
        PREFIX[$p]="--amqp-topic-prefix /topic/ --amqp-queue-prefix /queue/"
        ;;
    activemq)
        PID[$p]="$(cat "$PEERS_DIR/activemq.pid" 2>/dev/null || true)"
        PREFIX[$p]="--amqp-topic-prefix topic:// --amqp-queue-prefix queue://"
        ;;
    esac
done

COMMIT="$(git rev-parse HEAD)"
[ -z "$(git status --porcelain --untracked-files=no)" ] || COMMIT="$COMMIT-dirty"
SG_SHA256="$(sha256sum "$ROOT/target/release/stompgate" | cut -d' ' -f1)"
mkdir -p perf/results
OUT="perf/results/amqp-bench-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
echo "amqp-bench.sh: brokers: ${BROKERS[*]}; $ROUNDS round(s); results: $OUT" >&2
bench_rounds "$OUT" "$ROUNDS" amqp PREFIX

summarize "$OUT"
