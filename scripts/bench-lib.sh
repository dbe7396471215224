# Sourced by the benchmark scripts (ab.sh, amqp-bench.sh, compare.sh, remote-hop.sh, tls-auth-bench.sh): the
# load-harness arguments of the scenarios they share, and stopping the gateway a script started,
# so every script measures a named case the same way.

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
    connect) echo "connect --workers 4" ;;
    idle) echo "idle --connections ${IDLE_CONNECTIONS:?} --workers 4" ;;
    *) echo "$(basename "$0"): unknown case $1" >&2; exit 2 ;;
    esac
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
