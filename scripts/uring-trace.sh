#!/usr/bin/env bash
# What a gateway asks of io_uring per connection: the io_uring requests it submits (by opcode)
# and its io_uring_enter calls (split by whether each submits and whether it waits), traced with
# perf's io_uring and syscall tracepoints (no PMU needed) over 3 s of the issue-19 connect case
# (`stompgate-load connect --workers 4`), the gateway at `--cores 2 --store-dir off`.
#
#   scripts/uring-trace.sh [STOMPGATE_BIN ...]     one line per binary, in the order given
#
# Needs perf and root (tracepoints); run on an idle machine. Per connection = events divided by
# the run's connections/s times the 3 traced seconds (tracing slows the gateway a little).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
. scripts/bench-lib.sh
LOAD="target/release/stompgate-load"
PORT="${PORT:-61698}"
[ "$#" -gt 0 ] || set -- target/release/stompgate
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

for bin in "$@"; do
    "$bin" --stomp-addr "127.0.0.1:$PORT" --grpc-addr off --metrics-addr off --store-dir off --cores 2 >/dev/null 2>&1 &
    pid=$!
    wait_for_stomp "$PORT" "$LOAD"
    "$LOAD" connect --workers 4 --port "$PORT" --duration-s 6 --warmup-s 0 --json --quiet --name uring-trace >"$WORK/load.json" 2>/dev/null &
    load_pid=$!
    sleep 2
    perf record -q -e io_uring:io_uring_submit_req -e syscalls:sys_enter_io_uring_enter \
        -p "$pid" -o "$WORK/perf.data" -- sleep 3 >/dev/null 2>&1
    wait "$load_pid"
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    perf script -i "$WORK/perf.data" 2>/dev/null >"$WORK/perf.txt"
    python3 - "$bin" "$WORK/load.json" "$WORK/perf.txt" <<'EOF'
import collections, json, re, sys
binary, load, trace = sys.argv[1:4]
cps = json.load(open(load))["connections_per_s"]
n = cps * 3
enters, requests = collections.Counter(), collections.Counter()
for line in open(trace):
    if "sys_enter_io_uring_enter" in line:
        m = re.search(r"to_submit: (0x[0-9a-f]+), min_complete: (0x[0-9a-f]+)", line)
        submits, waits = int(m.group(1), 16) > 0, int(m.group(2), 16) > 0
        enters[("submits" if submits else "no-submit") + "+" + ("waits" if waits else "no-wait")] += 1
    elif "io_uring_submit_req" in line:
        requests[re.search(r"opcode (\w+)", line).group(1)] += 1
per = lambda c: {k: round(v / n, 2) for k, v in sorted(c.items())}
print(f"{binary}: {cps:.0f} connections/s; io_uring_enter {sum(enters.values()) / n:.2f} per connection "
      f"{per(enters)}; requests {per(requests)}")
EOF
done
