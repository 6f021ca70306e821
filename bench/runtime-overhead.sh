#!/usr/bin/env bash
# gantry-runtime's own cost on `create`, without runc's noise: the low-level
# runtime is set to /bin/true, so each timed call is exactly gantry-runtime
# (exec, Go start, reading the request, the edits, the rootfs changes, the
# config.json rewrite) plus one exec of /bin/true, which is timed alone too.
#
#   bench/runtime-overhead.sh [--sim] [--runs N] [--compare RUNTIME]
#                                       (root; bin/ from `make gpu-e2e`)
#
# Prints the median, minimum and trimmed mean in microseconds for a container
# asking for all GPUs (the default driver layout, tree), the same with
# gantry-runtime's create server running (--create-server, on a socket of
# this run), one asking for none, the low-level runtime run the same
# way without gantry-runtime ("plain runc"), the per-round difference between
# the no-request create and plain (issue 12's goal: at most 500 us), and
# /bin/true by itself, and the start-up time gantry-runtime logged for the
# GPU creates (startup_ms: from its C constructor to the request read); then
# its log line for the last GPU create (startup and per-phase times). The
# variants are interleaved round by round. --compare RUNTIME times another
# gantry-runtime binary (an older build, kept with the gantry it needs beside
# it) in the same rounds: its all-GPU and no-request creates, its gap and its
# startup_ms, for an A/B on a noisy host.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
runs=60 sim= other=
while [ $# -gt 0 ]; do
  case $1 in
    --sim) sim=--sim ;;
    --runs) runs=${2:?--runs needs a number}; shift ;;
    --compare) other=${2:?--compare needs a gantry-runtime binary}; shift ;;
    -h | --help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (use --sim, --runs N, --compare RUNTIME)" >&2; exit 2 ;;
  esac
  shift
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "--runs $runs: need a positive number" >&2; exit 2; }
[ -z "$other" ] || [ -x "$other" ] || { echo "--compare $other: not an executable file" >&2; exit 2; }
WORK=$(mktemp -d /tmp/gantry-overhead.XXXXXX)
# shellcheck source=scripts/lib/bundle.sh
. "$REPO/scripts/lib/bundle.sh"
trap 'rm -rf "$WORK"' EXIT
# The default layout (tree), its trees kept in $WORK.
DRIVER_LAYOUT=tree setup_env $sim >/dev/null || die "setup failed"
sed -i 's|^low-level = .*|low-level = "/bin/true"|' "$GANTRY_CONFIG"
# all-server: the same create with gantry-runtime's create server running
# (its own socket); every other variant gets a socket that does not exist.
export GANTRY_RUNTIME_SOCKET=$WORK/no-server.sock
"$GANTRY_RUNTIME" --create-server --socket "$WORK/runtime.sock" >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
trap 'kill $SERVER_PID 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do [ -S "$WORK/runtime.sock" ] && break; sleep 0.05; done
[ -S "$WORK/runtime.sock" ] || die "the create server did not start: $(cat "$WORK/server.log")"
make_bundle "$WORK/tpl-all" NVIDIA_VISIBLE_DEVICES=all -- /bin/true
make_bundle "$WORK/tpl-none" -- /bin/true
# The other build runs under the name gantry-runtime (its fast path acts on
# that name only), through a link, so it still finds the gantry beside it.
if [ -n "$other" ]; then
  mkdir "$WORK/other" && ln -s "$(readlink -f "$other")" "$WORK/other/gantry-runtime"
  other=$WORK/other/gantry-runtime
fi

# stat FILE: median, minimum and 20%-trimmed mean of the microsecond values in FILE.
stat() {
  sort -n "$1" | awk '{ v[NR] = $1 } END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    lo = int(NR * 0.2) + 1; hi = NR - int(NR * 0.2); s = 0
    for (i = lo; i <= hi; i++) s += v[i]
    printf "median %6d us, min %6d us, trimmed mean %6d us", m, v[1], s / (hi - lo + 1) }'
}

# One round times each variant once, interleaved, so that the load of a
# shared machine falls on all of them alike: gantry-runtime with all GPUs,
# gantry-runtime without a request, and the low-level runtime itself run
# the same way (same command line, same fresh bundle): "plain runc".
# The first 3 rounds warm the caches.
# With --compare, the other binary's creates (all2, none2) join each round.
variants="all none plain all-server"
[ -n "$other" ] && variants="all none plain all-server all2 none2"
for ((i = 0; i < runs + 3; i++)); do
  for v in $variants; do
    b=$WORK/b-$v
    rm -rf "$b" && cp -a "$WORK/tpl-$(case $v in all*) echo all ;; *) echo none ;; esac)" "$b"
    rt=$GANTRY_RUNTIME sock=$GANTRY_RUNTIME_SOCKET
    [ $v = plain ] && rt=/bin/true
    [ "${v%2}" != "$v" ] && rt=$other
    [ $v = all-server ] && sock=$WORK/runtime.sock
    s=${EPOCHREALTIME/[.,]/}
    GANTRY_RUNTIME_SOCKET=$sock "$rt" --root "$STATE" create --bundle "$b" "c$v-$i" </dev/null >/dev/null 2>&1 ||
      die "gantry-runtime create failed ($v)"
    e=${EPOCHREALTIME/[.,]/}
    [ $i -ge 3 ] && echo $((e - s)) >>"$WORK/$v.us"
  done
done
for ((i = 0; i < runs; i++)); do
  s=${EPOCHREALTIME/[.,]/}; /bin/true; e=${EPOCHREALTIME/[.,]/}
  echo $((e - s)) >>"$WORK/true.us"
done
# Per round, no request minus plain: the fast path's own cost.
paste "$WORK/none.us" "$WORK/plain.us" | awk '{ print $1 - $2 }' >"$WORK/gap.us"
echo "== gantry-runtime create with low-level /bin/true, $runs interleaved rounds"
printf '%-38s %s\n' "all GPUs (NVIDIA_VISIBLE_DEVICES=all)" "$(stat "$WORK/all.us")"
printf '%-38s %s\n' "all GPUs, create server running" "$(stat "$WORK/all-server.us")"
printf '%-38s %s\n' "no GPU request" "$(stat "$WORK/none.us")"
printf '%-38s %s\n' "plain: /bin/true, same command line" "$(stat "$WORK/plain.us")"
printf '%-38s %s\n' "no GPU request - plain, per round" "$(stat "$WORK/gap.us")"
printf '%-38s %s\n' "/bin/true alone" "$(stat "$WORK/true.us")"
# startup_ms of every timed GPU create (the log's time from the C
# constructor to the request read: Go's start, package inits, the config).
startup() {
  grep "\"container\":\"c$1-[0-9]" "$WORK/gantry.log" | grep '"changed":true' | tail -n "$runs" |
    grep -o '"startup_ms":[0-9.]*' | awk -F: '{ printf "%d\n", $2 * 1000 }' >"$WORK/startup-$1.us"
  stat "$WORK/startup-$1.us"
}
printf '%-38s %s\n' "startup_ms of the GPU creates" "$(startup all)"
printf '%-38s %s\n' "the same, create server (to the server)" "$(startup all-server)"
if [ -n "$other" ]; then
  paste "$WORK/none2.us" "$WORK/plain.us" | awk '{ print $1 - $2 }' >"$WORK/gap2.us"
  echo "== the same rounds with --compare $(readlink "$other")"
  printf '%-38s %s\n' "all GPUs (NVIDIA_VISIBLE_DEVICES=all)" "$(stat "$WORK/all2.us")"
  printf '%-38s %s\n' "no GPU request" "$(stat "$WORK/none2.us")"
  printf '%-38s %s\n' "no GPU request - plain, per round" "$(stat "$WORK/gap2.us")"
  printf '%-38s %s\n' "startup_ms of the GPU creates" "$(startup all2)"
fi
echo "last GPU create, as logged:"
grep '"container":"call-' "$WORK/gantry.log" | grep '"changed":true' | tail -1
if [ -n "$other" ]; then
  echo "last GPU create of the --compare runtime, as logged:"
  grep '"container":"call2-' "$WORK/gantry.log" | grep '"changed":true' | tail -1
fi
