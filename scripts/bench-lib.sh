# Sourced by the benchmark scripts (ab.sh, amqp-bench.sh, compare.sh, conn-cost.sh, remote-hop.sh, tls-auth-bench.sh, uring-trace.sh): the
# load-harness arguments of the scenarios they share, the interleaved round loop over brokers,
# and stopping the gateway a script started, so every script measures a named case the same way.

# stompgate-load's arguments for a case (idle needs IDLE_CONNECTIONS).
bench_case_args() {
    case "$1" in
    fanout) echo "fanout --subscribers 4 --rate 0 --receipt-every 1000" ;;
    fanout-rate | fanout-rate2k) echo "fanout --subscribers 4 --rate 2000" ;;
    fanout-rate50k) echo "fanout --subscribers 4 --rate 50000" ;;
    queue) echo "queue --producers 2 --consumers 2 --rate 0 --receipt-every 1000" ;;
    # Persistent messages (ActiveMQ, RabbitMQ: persistent:true; stompgate: its store, if on),
    # every SEND receipted, at most 64 outstanding per producer; unbounded, and paced for the
    # SEND -> RECEIPT latency.
    queue-persistent) echo "queue --producers 2 --consumers 2 --rate 0 --receipt-window 64 --send-header persistent:true" ;;
    queue-persistent-rate2k) echo "queue --producers 2 --consumers 2 --rate 2000 --receipt-window 64 --send-header persistent:true" ;;
    # AMQP 1.0: the same loads; add the broker's --amqp-topic-prefix/--amqp-queue-prefix.
    amqp-fanout) echo "fanout --protocol amqp --subscribers 4 --rate 0" ;;
    amqp-queue) echo "queue --protocol amqp --producers 2 --consumers 2 --rate 0 --receipt-every 1000" ;;
    # amqp-fanout to an Events-Store channel (ab.sh gives the events-store/ prefix).
    amqp-store-fanout) echo "fanout --protocol amqp --subscribers 4 --rate 0" ;;
    connect) echo "connect --workers 4" ;;
    idle) echo "idle --connections ${IDLE_CONNECTIONS:?} --workers 4" ;;
    *) echo "$(basename "$0"): unknown case $1" >&2; exit 2 ;;
    esac
}

# bench_rounds OUT ROUNDS TAG EXTRA: every case of CASES once on every broker of BROKERS per
# round, the brokers' order rotated round by round so none always goes first, each run one raw
# line appended to OUT: {"run","case","broker","exit","commit","stompgate_sha256","loadavg",
# "result": the harness's --json line or null}. Reads LOAD, DURATION_S, WARMUP_S, COMMIT,
# SG_SHA256 and, per broker, PORT[b] and PID[b] (for --server-pid, may be unset); EXTRA names an
# associative array of per-broker harness arguments (transport, address prefixes). TAG starts
# each run's --name. A script may define bench_skip CASE BROKER (status 0 = skip that pair).
bench_rounds() {
    local out="$1" rounds="$2" tag="$3"
    local -n bench_extra="$4"
    local n=${#BROKERS[@]} run case i b rc line loadavg pid_args
    for run in $(seq 1 "$rounds"); do
        for case in "${CASES[@]}"; do
            for ((i = 0; i < n; i++)); do
                b="${BROKERS[$(((i + run) % n))]}"
                if declare -F bench_skip >/dev/null && bench_skip "$case" "$b"; then continue; fi
                pid_args=()
                [ -n "${PID[$b]:-}" ] && pid_args=(--server-pid "${PID[$b]}")
                echo "== round $run/$rounds: $case on $b (127.0.0.1:${PORT[$b]})" >&2
                rc=0
                loadavg="$(cut -d' ' -f1-3 /proc/loadavg)"
                # shellcheck disable=SC2046,SC2086
                line="$(timeout 300 "$LOAD" $(bench_case_args "$case") ${bench_extra[$b]:-} --host 127.0.0.1 --port "${PORT[$b]}" \
                    --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" --name "$tag-$case-$run-$$" \
                    --label "$b" --json --quiet "${pid_args[@]}")" || rc=$?
                [ -n "$line" ] || line=null
                printf '{"run":%d,"case":"%s","broker":"%s","exit":%d,"commit":"%s","stompgate_sha256":"%s","loadavg":"%s","result":%s}\n' \
                    "$run" "$case" "$b" "$rc" "$COMMIT" "$SG_SHA256" "$loadavg" "$line" >>"$out"
                sleep 1
            done
        done
    done
}

# Waits (up to 5 s) until a STOMP server on 127.0.0.1:$1 completes a connect cycle, using the
# load harness $2 (stompgate-load).
wait_for_stomp() {
    for _ in $(seq 1 50); do
        "$2" connect --workers 1 --port "$1" --duration-s 0.2 --warmup-s 0 --quiet >/dev/null 2>&1 && return 0
        sleep 0.1
    done
}

# Stops the gateway whose pid is in GW_PID: TERM, up to 5 s to exit, then KILL.
GW_PID=""
stop_gateway() {
    if [ -n "$GW_PID" ] && kill -0 "$GW_PID" 2>/dev/null; then
        kill -TERM "$GW_PID" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$GW_PID" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$GW_PID" 2>/dev/null && kill -KILL "$GW_PID" 2>/dev/null || true
    fi
    GW_PID=""
}
