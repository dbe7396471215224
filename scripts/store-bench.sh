#!/usr/bin/env bash
# The persistent-queue benchmark of issue 15: queue 2->2 with every SEND receipted (at most 64
# outstanding per producer, --receipt-window 64) and persistent:true, acking consumers, over
#   stompgate-store   stompgate with its store on (default --store-sync fsync), in a fresh
#                     directory under STORE_PARENT
#   stompgate         stompgate in memory (--store-dir off; it ignores persistent:true)
#   activemq-kahadb   ActiveMQ 5.17, persistent (KahaDB), scripts/peers.sh
#   rabbitmq          RabbitMQ 3.10: /queue/ destinations are durable queues, persistent:true
#                     makes the message persistent and its RECEIPT waits for the confirm
# in one interleaved run of scripts/compare.sh (its round loop, raw results and table), with two
# cases: queue-persistent (unbounded: throughput) and queue-persistent-rate2k (2,000 msg/s over
# both producers: SEND -> RECEIPT latency, receipt_p99_us). The table's ratio columns are
# stompgate-store/other: the goals are >= 20 against activemq-kahadb and >= 0.5 against
# stompgate (delivered_per_s of queue-persistent).
#
#   scripts/store-bench.sh                      build, start everything, run, print the table
#   scripts/store-bench.sh --summarize FILE     the table of an earlier results file
#
# Settings (environment; anything else compare.sh reads passes through):
#   ROUNDS=3 DURATION_S=8 WARMUP_S=2   rounds (every broker once per case per round, the order
#                               rotated), measured window and warm-up per run
#   STORE_PARENT=<repo>/target/store-bench   where stompgate-store's directory is made (the disk
#                               measured; check it is not a tmpfs: compare.sh prints its device)
#   STORE_ARGS=""               extra stompgate-store flags (e.g. --store-sync-interval-us 500)
#   PEERS="rabbitmq activemq-kahadb"   CASES="queue-persistent queue-persistent-rate2k"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export RUNS="${ROUNDS:-3}"
export DURATION_S="${DURATION_S:-8}"
export CASES="${CASES:-queue-persistent queue-persistent-rate2k}"
export PEERS="${PEERS-rabbitmq activemq-kahadb}"
export BASELINE=""
export STORE_PARENT="${STORE_PARENT:-$ROOT/target/store-bench}"
export SUMMARY_BASE=stompgate-store
exec "$ROOT/scripts/compare.sh" "$@"
