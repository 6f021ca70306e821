#!/usr/bin/env bash
# gantry-runtime's own cost on `create`, without runc's noise: the low-level
# runtime is set to /bin/true, so each timed call is exactly gantry-runtime
# (exec, Go start, reading the request, the edits, the rootfs changes, the
# config.json rewrite) plus one exec of /bin/true, which is timed alone too.
#
#   bench/runtime-overhead.sh [--sim] [--runs N]   (root; bin/ from `make gpu-e2e`)
#
# Prints the median and minimum in microseconds for a container asking for all
# GPUs, one asking for none, and /bin/true by itself, then gantry-runtime's log
# line for the last GPU create (startup and per-phase times).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
runs=60 sim=
while [ $# -gt 0 ]; do
  case $1 in
    --sim) sim=--sim ;;
    --runs) runs=${2:?--runs needs a number}; shift ;;
    -h | --help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (use --sim, --runs N)" >&2; exit 2 ;;
  esac
  shift
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "--runs $runs: need a positive number" >&2; exit 2; }
WORK=$(mktemp -d /tmp/gantry-overhead.XXXXXX)
# shellcheck source=scripts/lib/bundle.sh
. "$REPO/scripts/lib/bundle.sh"
trap 'rm -rf "$WORK"' EXIT
setup_env $sim >/dev/null || die "setup failed"
sed -i 's|^low-level = .*|low-level = "/bin/true"|' "$GANTRY_CONFIG"
make_bundle "$WORK/tpl-all" NVIDIA_VISIBLE_DEVICES=all -- /bin/true
make_bundle "$WORK/tpl-none" -- /bin/true

# stat FILE: median and minimum of the microsecond values in FILE.
stat() { sort -n "$1" | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "median %6d us, min %6d us", m, v[1] }'; }

for v in all none; do
  for ((i = 0; i < runs + 3; i++)); do
    rm -rf "$WORK/b" && cp -a "$WORK/tpl-$v" "$WORK/b"
    s=${EPOCHREALTIME/[.,]/}
    "$GANTRY_RUNTIME" --root "$STATE" create --bundle "$WORK/b" "c$i" </dev/null >/dev/null 2>&1 ||
      die "gantry-runtime create failed ($v)"
    e=${EPOCHREALTIME/[.,]/}
    [ $i -ge 3 ] && echo $((e - s)) >>"$WORK/$v.us" # the first 3 warm the caches
  done
done
for ((i = 0; i < runs; i++)); do
  s=${EPOCHREALTIME/[.,]/}; /bin/true; e=${EPOCHREALTIME/[.,]/}
  echo $((e - s)) >>"$WORK/true.us"
done
echo "== gantry-runtime create with low-level /bin/true, $runs runs each"
printf '%-34s %s\n' "all GPUs (NVIDIA_VISIBLE_DEVICES=all)" "$(stat "$WORK/all.us")"
printf '%-34s %s\n' "no GPU request" "$(stat "$WORK/none.us")"
printf '%-34s %s\n' "/bin/true alone" "$(stat "$WORK/true.us")"
echo "last GPU create, as logged:"
grep '"changed":true' "$WORK/gantry.log" | tail -1
