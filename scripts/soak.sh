#!/usr/bin/env bash
# Soak (issue 13): every abuse at once against the release gateway for DURATION_S seconds
# (default 600), beside a normal fan-out and queue load and a canary. Not part of scripts/test.
#
#   scripts/soak.sh                  # 10 minutes
#   DURATION_S=60 scripts/soak.sh    # a short check
#
# Builds the release binaries (stompgate, stompgate-load) in $CARGO_TARGET_DIR (default
# target/), runs scripts/soak.py against them, appends one JSON line to
# perf/results/soak-<UTC date>.jsonl and prints a summary. Exit status: 0 every bound held, 1 a
# bound broke or the gateway died, 2 the run could not start. What runs and what is checked:
# perf/README.md ("Soak") and the BOUNDS table at the top of scripts/soak.py.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION_S="${DURATION_S:-600}"
TARGET="${CARGO_TARGET_DIR:-target}"
nice -n 5 cargo build --release --quiet --bin stompgate --bin stompgate-load
GATEWAY="$TARGET/release/stompgate"
LOAD="$TARGET/release/stompgate-load"

commit="$(git rev-parse --short HEAD)"
[ -z "$(git status --porcelain -- src perf/load scripts/soak.py)" ] || commit="$commit-dirty"
sha="$(sha256sum "$GATEWAY" | cut -d' ' -f1)"
mkdir -p perf/results
out="perf/results/soak-$(date -u +%Y-%m-%d).jsonl"
log="${TMPDIR:-/tmp}/stompgate-soak-$(date -u +%Y%m%dT%H%M%SZ).log"

# The harness's and the abusers' sockets, plus headroom (the hard limit is 20,000 here).
ulimit -n "$(ulimit -Hn)"
exec python3 scripts/soak.py --gateway "$GATEWAY" --load "$LOAD" --duration-s "$DURATION_S" \
  --out "$out" --log "$log" --meta "{\"commit\": \"$commit\", \"gateway_sha256\": \"$sha\"}"
