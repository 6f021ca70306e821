#!/usr/bin/env bash
# gantry serve under an idle-connection flood: IDLE connections (default
# 10000) that never send a byte are opened to a `gantry serve` on loopback
# (simulated GPUs), then /gpu/status is timed behind them. Goal: every
# request answered, p50 under 50 ms, the server's file descriptors bounded
# by its connection cap (256) rather than by the flood.
#
#   bench/serve-idle.sh [--idle N] [--requests N]      (needs Go; no root, no GPU)
#
# The client needs IDLE file descriptors: raise `ulimit -n` if it is lower.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
idle=10000 requests=50
while [ $# -gt 0 ]; do
  case $1 in
    --idle) idle=${2:?--idle needs a number}; shift ;;
    --requests) requests=${2:?--requests needs a number}; shift ;;
    -h | --help) sed -n '2,/^set -eu/{/^set -eu/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gantry-serve-idle.XXXXXX")
pid=
trap '[ -z "$pid" ] || kill "$pid" 2>/dev/null; rm -rf "$WORK"' EXIT
cd "$REPO"
ulimit -n "$((idle + 1000))" 2>/dev/null || echo "note: ulimit -n is $(ulimit -n); the client may run out of descriptors" >&2
go build -o "$WORK/gantry" ./cmd/gantry
go build -o "$WORK/serveload" ./bench/serveload
"$WORK/gantry" --gpus sim:h100x8 sim driver-root "$WORK/driver" >/dev/null
port=$((20000 + RANDOM % 20000))
"$WORK/gantry" --gpus sim:h100x8 --driver-root "$WORK/driver" serve --listen "127.0.0.1:$port" 2>"$WORK/serve.log" &
pid=$!
for ((i = 0; i < 100; i++)); do
  grep -q listening "$WORK/serve.log" && break
  kill -0 "$pid" 2>/dev/null || { cat "$WORK/serve.log"; exit 1; }
  sleep 0.1
done
echo "== gantry serve (sim:h100x8, pid $pid) on 127.0.0.1:$port; ulimit -n $(ulimit -n)"
"$WORK/serveload" -idle "$idle" -requests "$requests" -pid "$pid" "127.0.0.1:$port"
