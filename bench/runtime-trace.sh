#!/usr/bin/env bash
# Where one gantry-runtime create of a GPU container spends its time, for
# deciding what to cut: the Go package initialisation (GODEBUG=inittrace=1),
# and every system call with its time and the gaps between them (strace -f
# -tt -T), of a create with low-level /bin/true after a few warm-up creates
# (inventory cache filled), for each driver layout.
#
#   bench/runtime-trace.sh [--sim] [--out DIR]   (root; bin/ from `make gpu-e2e`, strace in PATH or bin/)
#
# Writes DIR/inittrace-LAYOUT.txt and DIR/strace-LAYOUT.txt (default: a new
# directory under /tmp, printed) and prints, per layout, the slowest package
# inits, the 15 longest gaps between system calls (user-space work) and the
# 15 slowest system calls.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
sim= out=
while [ $# -gt 0 ]; do
  case $1 in
    --sim) sim=--sim ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    -h | --help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (use --sim, --out DIR)" >&2; exit 2 ;;
  esac
  shift
done
WORK=$(mktemp -d /tmp/gantry-trace.XXXXXX)
out=${out:-$WORK/out}
mkdir -p "$out"
# shellcheck source=scripts/lib/bundle.sh
. "$REPO/scripts/lib/bundle.sh"
trap 'cleanup_containers; rm -rf "$WORK/b" "$WORK/rootfs"' EXIT
setup_env $sim >/dev/null || die "setup failed"
strace_bin=$(command -v "$REPO/bin/strace" strace 2>/dev/null | head -1)
[ -n "$strace_bin" ] || die "no strace (bin/strace from make gpu-e2e, or in PATH)"
sed -i 's|^low-level = .*|low-level = "/bin/true"|' "$GANTRY_CONFIG"
cp "$GANTRY_CONFIG" "$WORK/files.toml"
sed 's/^\[runtime\]$/[runtime]\ndriver-layout = "tree"\ndriver-tree-dir = "'"${WORK//\//\\/}"'\/trees"/' "$GANTRY_CONFIG" >"$WORK/tree.toml"
make_bundle "$WORK/tpl" NVIDIA_VISIBLE_DEVICES=all -- /bin/true

for layout in files tree; do
  export GANTRY_CONFIG=$WORK/$layout.toml
  for i in 1 2 3 4 5; do
    rm -rf "$WORK/b" && cp -a "$WORK/tpl" "$WORK/b"
    "$GANTRY_RUNTIME" --root "$STATE" create --bundle "$WORK/b" "w$i" </dev/null >/dev/null 2>&1 || die "create failed ($layout)"
  done
  rm -rf "$WORK/b" && cp -a "$WORK/tpl" "$WORK/b"
  GODEBUG=inittrace=1 "$GANTRY_RUNTIME" --root "$STATE" create --bundle "$WORK/b" i1 </dev/null >/dev/null 2>"$out/inittrace-$layout.txt"
  rm -rf "$WORK/b" && cp -a "$WORK/tpl" "$WORK/b"
  LD_LIBRARY_PATH=$REPO/bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$strace_bin" -f -tt -T -o "$out/strace-$layout.txt" \
    "$GANTRY_RUNTIME" --root "$STATE" create --bundle "$WORK/b" s1 </dev/null >/dev/null 2>&1
  echo "== $layout: package inits (total, and the slowest)"
  awk '/^init /{n++; t+=$5} END {printf "%d inits, %.2f ms of init clock, the last at %s\n", n, t, last} /^init /{last=$3" ms"}' "$out/inittrace-$layout.txt"
  sort -k5 -g -r "$out/inittrace-$layout.txt" | grep '^init ' | head -8
  echo "== $layout: strace of the create (strace slows each call; compare gaps, not totals)"
  awk '{ split($2, a, ":"); t = a[1]*3600 + a[2]*60 + a[3]; if (NR == 1) t0 = t
         if (prev != "") printf "%.3f gap before: %s\n", (t - pt) * 1000, substr($0, 1, 150)
         pt = t; prev = $0; last = t }
       END { printf "%.3f ms first to last call\n", (last - t0) * 1000 > "/dev/stderr" }' "$out/strace-$layout.txt" 2>"$WORK/span" |
    sort -g -r | head -15
  cat "$WORK/span"
  echo "-- slowest calls"
  sed -n 's/.*<\([0-9.]*\)>$/\1 &/p' "$out/strace-$layout.txt" | sort -g -r | head -15 | cut -c1-170
  echo "-- calls by name"
  sed -n 's/^[0-9]* *[0-9:.]* \([a-z_0-9]*\)(.*/\1/p' "$out/strace-$layout.txt" | sort | uniq -c | sort -n -r | head -12 | tr '\n' ' '
  echo
done
echo "traces in $out"
