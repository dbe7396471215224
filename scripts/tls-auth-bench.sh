#!/usr/bin/env bash
# What STOMP over TLS and JWT authentication cost stompgate, against plain in the same run
# (issue 14's benchmark: TLS fan-out and connections/s vs plain; auth on must not cost more
# than 5 % of fan-out throughput). perf/README.md describes it.
#
#   scripts/tls-auth-bench.sh                  build (incremental), run, print the table
#   scripts/tls-auth-bench.sh --summarize FILE print the table for an earlier results file
#
# Each round runs every case once in every mode, the order of the modes rotating round by round,
# each run on a freshly started gateway (`--cores 2 --grpc-addr off`), so drift on the machine
# falls on every mode alike. Modes:
#   plain     --stomp-addr 127.0.0.1:PORT
#   tls       --stomp-addr off --tls-cert/--tls-key --stomp-tls-addr 127.0.0.1:PORT+1;
#             the harness with --tls --tls-ca (full handshakes: no session resumption)
#   auth      --stomp-addr 127.0.0.1:PORT+2 --auth-jwt-key (HS256); every harness connection
#             sends the JWT as passcode
#   authz     auth plus --authz-file: 20 rules naming other clients, then the one that allows
#             the harness's client id every pattern and channel (the cached decision per
#             channel is what a SEND pays; not in the default MODES)
#   tls-auth  both TLS and auth (not in the default MODES)
# Certificates (a CA and a server certificate for 127.0.0.1 and localhost) are made with
# openssl, the HMAC secret from /dev/urandom, the token (ClientID stompgate-load, exp in 1 day)
# with python3's hmac; all in a temporary directory removed at the end.
#
# Settings (environment):
#   ROUNDS=5                 rounds (the table shows medians and min-max per mode)
#   CASES="fanout connect"   fanout 1->4 unbounded (receipt every 1000), connect (4 workers);
#                            also: queue (2->2, receipt every 1000), fanout-rate (1->4 at 2000/s)
#   MODES="plain tls auth"   the modes above; ratios are against plain
#   DURATION_S=8 WARMUP_S=2  measured window and warm-up per run
#   PORT=61663               the modes listen on PORT, PORT+1, PORT+2, PORT+3, PORT+4 (plain,
#                            tls, auth, tls-auth, authz), each its own port across rounds
#   STOMPGATE_BIN            the gateway to measure [default: this tree's target/release/stompgate]
#   SKIP_BUILD=1             do not run cargo build first
#   ARGS=""                  extra flags for every gateway
# Raw results: perf/results/tls-auth-<UTC time>.jsonl, one line per run:
#   {"round":N,"case":"...","mode":"...","commit":"<git>[-dirty]","sha256":"<of the gateway>",
#    "loadavg":"<1 5 15 min before the run>","exit":RC,"result":<stompgate-load --json or null>}
# The machine should be otherwise idle: the gateway, the harness and anything else share its cores.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source "$ROOT/scripts/bench-lib.sh"

summarize() {
    python3 "$ROOT/perf/summarize.py" "$1" --by mode --base plain
}

if [ "${1:-}" = --summarize ]; then
    summarize "$2"
    exit 0
fi
if [ $# -ne 0 ]; then
    sed -n '2,7p' "$0" >&2
    exit 2
fi
ROUNDS="${ROUNDS:-5}"
DURATION_S="${DURATION_S:-8}"
WARMUP_S="${WARMUP_S:-2}"
PORT="${PORT:-61663}"
ARGS="${ARGS:-}"
# shellcheck disable=SC2206
CASES=(${CASES:-fanout connect})
# shellcheck disable=SC2206
MODES=(${MODES:-plain tls auth})

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
if [ "${SKIP_BUILD:-}" != 1 ]; then
    nice -n 5 cargo build --release --bin stompgate --bin stompgate-load >&2
fi
GATEWAY="$(realpath "${STOMPGATE_BIN:-$TARGET/release/stompgate}")"
LOAD="$TARGET/release/stompgate-load"
SHA="$(sha256sum "$GATEWAY" | cut -d' ' -f1)"
# The in-memory array: --store-dir off (the default is ./store), if the binary knows the flag.
STORE_OFF="$("$GATEWAY" --help 2>/dev/null | grep -q -- --store-dir && echo "--store-dir off" || true)"
COMMIT="$(git rev-parse --short HEAD)"
git diff --quiet HEAD -- src perf/load scripts/tls-auth-bench.sh || COMMIT="$COMMIT-dirty"

WORK="$(mktemp -d -t stompgate-tls-auth.XXXXXX)"
trap 'stop_gateway; rm -rf "$WORK"' EXIT

# A CA, and a server certificate it signs for 127.0.0.1 and localhost.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=tls-auth-bench CA" \
    -keyout "$WORK/ca.key" -out "$WORK/ca.pem" -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
    -keyout "$WORK/server.key" -out "$WORK/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$WORK/server.ext"
openssl x509 -req -in "$WORK/server.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" -CAcreateserial -days 2 \
    -extfile "$WORK/server.ext" -out "$WORK/server.pem" 2>/dev/null
# The HMAC secret (the key file's bytes; stompgate drops one trailing newline) and an HS256 JWT.
head -c 32 /dev/urandom | base64 >"$WORK/jwt.key"
python3 - "$WORK/jwt.key" >"$WORK/token" <<'PY'
import base64, hashlib, hmac, json, sys, time
secret = open(sys.argv[1], "rb").read().removesuffix(b"\n")
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=")
head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
claims = b64(json.dumps({"ClientID": "stompgate-load", "sub": "stompgate-load", "exp": int(time.time()) + 86400}).encode())
signing_input = head + b"." + claims
print((signing_input + b"." + b64(hmac.new(secret, signing_input, hashlib.sha256).digest())).decode())
PY

# The authz mode's rules: 20 for other clients, then the harness's.
python3 - >"$WORK/rules.json" <<'PY'
import json
rules = [{"ClientID": f"tenant-{i}", "Events": True, "Queues": True, "Channel": f"tenant-{i}\\..*", "Read": True, "Write": True}
         for i in range(20)]
rules.append({"ClientID": "stompgate-load", "Events": True, "EventsStore": True, "Queues": True, "Commands": True,
              "Queries": True, "Channel": ".*", "Read": True, "Write": True})
print(json.dumps(rules))
PY

mode_port() {
    case "$1" in
    plain) echo "$PORT" ;;
    tls) echo "$((PORT + 1))" ;;
    auth) echo "$((PORT + 2))" ;;
    tls-auth) echo "$((PORT + 3))" ;;
    authz) echo "$((PORT + 4))" ;;
    *) echo "tls-auth-bench.sh: unknown mode $1" >&2; exit 2 ;;
    esac
}

gateway_args() { # mode port
    local tls="--stomp-addr off --tls-cert $WORK/server.pem --tls-key $WORK/server.key --stomp-tls-addr 127.0.0.1:$2"
    local auth="--auth-jwt-key $WORK/jwt.key --auth-jwt-alg HS256"
    case "$1" in
    plain) echo "--stomp-addr 127.0.0.1:$2 --stomp-tls-addr off" ;;
    tls) echo "$tls" ;;
    auth) echo "--stomp-addr 127.0.0.1:$2 --stomp-tls-addr off $auth" ;;
    tls-auth) echo "$tls $auth" ;;
    authz) echo "--stomp-addr 127.0.0.1:$2 --stomp-tls-addr off $auth --authz-file $WORK/rules.json" ;;
    esac
}

harness_args() { # mode
    local tls="--tls --tls-ca $WORK/ca.pem"
    local auth="--login stompgate-load --passcode-file $WORK/token"
    case "$1" in
    plain) echo "" ;;
    tls) echo "$tls" ;;
    auth) echo "$auth" ;;
    tls-auth) echo "$tls $auth" ;;
    authz) echo "$auth" ;;
    esac
}

# CONNECT (with the token, over TLS where the mode says) answered by CONNECTED.
stomp_ready() { # mode port
    python3 - "$1" "$2" "$WORK" <<'PY' 2>/dev/null
import socket, ssl, sys
mode, port, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = socket.create_connection(("127.0.0.1", port), timeout=1)
if mode.startswith("tls"):
    ctx = ssl.create_default_context(cafile=f"{work}/ca.pem")
    s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
token = open(f"{work}/token").read().strip() if mode.endswith(("auth", "authz")) else "guest"
s.sendall(f"CONNECT\naccept-version:1.2\nhost:x\nlogin:ready\npasscode:{token}\n\n\0".encode())
s.settimeout(2)
sys.exit(0 if s.recv(9).startswith(b"CONNECTED") else 1)
PY
}


ulimit -n "$(ulimit -Hn)" || true
for m in "${MODES[@]}"; do
    if stomp_ready plain "$(mode_port "$m")"; then
        echo "tls-auth-bench.sh: something already answers STOMP on 127.0.0.1:$(mode_port "$m"); set PORT" >&2
        exit 1
    fi
done
mkdir -p perf/results
OUT="perf/results/tls-auth-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
LOG="$WORK/gateway.log"
echo "tls-auth-bench.sh: $GATEWAY; $ROUNDS round(s) of ${CASES[*]} x ${MODES[*]}; results: $OUT" >&2
for round in $(seq 1 "$ROUNDS"); do
    # Rotate the order of the modes by one each round.
    n=${#MODES[@]}
    order=()
    for i in $(seq 0 $((n - 1))); do order+=("${MODES[$(((i + round - 1) % n))]}"); done
    for case in "${CASES[@]}"; do
        for mode in "${order[@]}"; do
            port="$(mode_port "$mode")"
            # shellcheck disable=SC2046
            "$GATEWAY" $(gateway_args "$mode" "$port") --grpc-addr off --ws-addr off --amqp-addr off --cores 2 $STORE_OFF $ARGS >"$LOG" 2>&1 &
            GW_PID=$!
            for _ in $(seq 1 100); do stomp_ready "$mode" "$port" && break; sleep 0.1; done
            stomp_ready "$mode" "$port" || { echo "tls-auth-bench.sh: the $mode gateway did not start:" >&2; cat "$LOG" >&2; exit 1; }
            echo "== round $round/$ROUNDS: $case, $mode" >&2
            loadavg="$(cut -d' ' -f1-3 /proc/loadavg)"
            rc=0
            # shellcheck disable=SC2046
            line="$(timeout 300 "$LOAD" $(bench_case_args "$case") $(harness_args "$mode") --host 127.0.0.1 --port "$port" \
                --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" --name "tls-auth-$case-$round-$$" \
                --label "$mode" --json --quiet --server-pid "$GW_PID")" || rc=$?
            [ -n "$line" ] || line=null
            printf '{"round":%d,"case":"%s","mode":"%s","commit":"%s","sha256":"%s","loadavg":"%s","exit":%d,"result":%s}\n' \
                "$round" "$case" "$mode" "$COMMIT" "$SHA" "$loadavg" "$rc" "$line" >>"$OUT"
            stop_gateway
            sleep 1
        done
    done
done
summarize "$OUT"
