#!/usr/bin/env bash
# gantry-runtime's own cost on `create`, without runc's noise: the low-level
# runtime is set to /bin/true, so each timed call is exactly gantry-runtime
# (exec, Go start, reading the request, the edits, the rootfs changes, the
# config.json rewrite) plus one exec of /bin/true, which is timed alone too.
#
#   bench/runtime-overhead.sh [--sim] [--runs N] [--compare RUNTIME]   (root; bin/ from `make gpu-e2e`)
#
# Prints the median, minimum and trimmed mean in microseconds for a container
# asking for all GPUs, one asking for none, the low-level runtime run the same
# way without gantry-runtime ("plain runc"), the per-round difference between
# the no-request create and plain (issue 12's goal: at most 500 us), and
# /bin/true by itself; then gantry-runtime's log line for the last GPU create
# (startup and per-phase times). The variants are interleaved round by round.
# --compare RUNTIME adds another gantry-runtime binary (a build of another
# commit, say) as one more variant of the all-GPU create, with its own log
# line, so two builds are compared in the same rounds on a shared machine.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
runs=60 sim= compare=
while [ $# -gt 0 ]; do
  case $1 in
    --sim) sim=--sim ;;
    --runs) runs=${2:?--runs needs a number}; shift ;;
    --compare) compare=${2:?--compare needs a gantry-runtime binary}; shift ;;
    -h | --help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (use --sim, --runs N, --compare RUNTIME)" >&2; exit 2 ;;
  esac
  shift
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "--runs $runs: need a positive number" >&2; exit 2; }
if [ -n "$compare" ]; then
  [ -x "$compare" ] || { echo "--compare $compare: not an executable" >&2; exit 2; }
  compare=$(cd "$(dirname "$compare")" && pwd)/$(basename "$compare")
fi
WORK=$(mktemp -d /tmp/gantry-overhead.XXXXXX)
# shellcheck source=scripts/lib/bundle.sh
. "$REPO/scripts/lib/bundle.sh"
trap 'rm -rf "$WORK"' EXIT
setup_env $sim >/dev/null || die "setup failed"
sed -i 's|^low-level = .*|low-level = "/bin/true"|' "$GANTRY_CONFIG"
make_bundle "$WORK/tpl-all" NVIDIA_VISIBLE_DEVICES=all -- /bin/true
make_bundle "$WORK/tpl-none" -- /bin/true

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
variants="all none plain"
[ -n "$compare" ] && variants="all compare none plain"
for ((i = 0; i < runs + 3; i++)); do
  for v in $variants; do
    b=$WORK/b-$v
    tpl=${v/plain/none}
    rm -rf "$b" && cp -a "$WORK/tpl-${tpl/compare/all}" "$b"
    rt=$GANTRY_RUNTIME
    [ $v = plain ] && rt=/bin/true
    [ $v = compare ] && rt=$compare
    s=${EPOCHREALTIME/[.,]/}
    "$rt" --root "$STATE" create --bundle "$b" "c$v$i" </dev/null >/dev/null 2>&1 ||
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
[ -n "$compare" ] && printf '%-38s %s\n' "all GPUs, --compare runtime" "$(stat "$WORK/compare.us")"
printf '%-38s %s\n' "no GPU request" "$(stat "$WORK/none.us")"
printf '%-38s %s\n' "plain: /bin/true, same command line" "$(stat "$WORK/plain.us")"
printf '%-38s %s\n' "no GPU request - plain, per round" "$(stat "$WORK/gap.us")"
printf '%-38s %s\n' "/bin/true alone" "$(stat "$WORK/true.us")"
echo "last GPU create, as logged:"
grep '"changed":true' "$WORK/gantry.log" | grep '"container":"call' | tail -1
if [ -n "$compare" ]; then
  echo "last GPU create of the --compare runtime, as logged:"
  grep '"changed":true' "$WORK/gantry.log" | grep '"container":"ccompare' | tail -1
fi
