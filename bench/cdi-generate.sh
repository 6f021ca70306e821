#!/usr/bin/env bash
# Times `cdi generate` end to end (process start to spec written), the
# variants interleaved round by round (the order rotating), so that a noisy
# machine slows them alike:
#
#   nvidia-ctk (gantry)  gantry-runtime run as nvidia-ctk, as `make install` links it
#   gantry               gantry cdi generate: the same spec from the full CLI binary
#   nvidia-ctk (NVIDIA)  NVIDIA's nvidia-ctk cdi generate, when NVIDIA_CTK names it
#
#   bench/cdi-generate.sh [BIN]          BIN: the directory holding gantry, gantry-runtime and
#                                        gantry-cdi-hook (make build), or its gantry (default bin)
#   bench/cdi-generate.sh --sim [BIN]    without a GPU: simulated 8x H100 GPUs over a driver root
#                                        made by gantry sim driver-root (NVIDIA's is not run)
#
# On a GPU host, as root:
#   RUNS=200 NVIDIA_CTK=/usr/bin/nvidia-ctk bench/cdi-generate.sh bin
#
# Environment: RUNS (rounds, default 100), NVIDIA_CTK (path of NVIDIA's nvidia-ctk,
# optional), DRIVER_ROOT (default /), OUT_DIR (where the specs are written, default a
# new directory under /tmp; every variant writes to the same directory).
# Prints median, p10, p90, min and the mean of the middle 80% in ms, and checks
# that Gantry's two command lines wrote the same spec byte for byte.
# Goal (issue 12): 5 ms on a 1-GPU H100 host.
set -euo pipefail
sim=0
if [ "${1:-}" = "--sim" ]; then sim=1; shift; fi
bin=${1:-bin}
[ -f "$bin" ] && bin=$(dirname "$bin")
bin=$(cd "$bin" && pwd)
for b in gantry gantry-runtime gantry-cdi-hook; do
  [ -x "$bin/$b" ] || { echo "$bin/$b missing: run make build" >&2; exit 2; }
done
runs=${RUNS:-100}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=${OUT_DIR:-$work/out}
mkdir -p "$out"
root=${DRIVER_ROOT:-/}
nvidia=${NVIDIA_CTK:-}
if [ $sim = 1 ]; then
  root=$work/driver
  "$bin/gantry" sim driver-root "$root" >/dev/null
  printf 'gpus = "sim:h100x8"\n' >"$work/gantry.toml"
  export GANTRY_CONFIG=$work/gantry.toml
  [ -n "$nvidia" ] && echo "--sim: NVIDIA's nvidia-ctk is not timed (it needs NVML)" >&2
  nvidia=
fi
# The name nvidia-ctk, linked to gantry-runtime as make install links it:
# gantry-runtime then finds gantry-cdi-hook (and gantry) beside its target.
mkdir -p "$work/links"
ln -s "$bin/gantry-runtime" "$work/links/nvidia-ctk"

variants=("nvidia-ctk (gantry)" "$work/links/nvidia-ctk cdi generate --driver-root=$root --output=$out/ctk-gantry.yaml"
  "gantry" "$bin/gantry --driver-root $root cdi generate --output $out/gantry.yaml")
if [ -n "$nvidia" ]; then
  variants+=("nvidia-ctk (NVIDIA)" "$nvidia cdi generate --driver-root=$root --output=$out/ctk-nvidia.yaml")
fi
python3 - "$runs" "${variants[@]}" <<'PY'
import subprocess, sys, time, statistics
runs = int(sys.argv[1])
names, cmds = sys.argv[2::2], [c.split(" ") for c in sys.argv[3::2]]
for c in cmds:  # once each: warms the page cache, and stops on a failure
    r = subprocess.run(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if r.returncode:
        sys.exit(f"failed ({r.returncode}): {' '.join(c)}: {r.stderr.decode().strip()}")
ts = [[] for _ in cmds]
for i in range(runs):
    for k in range(len(cmds)):
        j = (i + k) % len(cmds)
        t = time.perf_counter()
        subprocess.run(cmds[j], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        ts[j].append((time.perf_counter() - t) * 1000)
print(f"{'':22} {'median':>7} {'p10':>7} {'p90':>7} {'min':>7} {'mean80':>7}  (ms, {runs} interleaved rounds)")
for n, t in zip(names, ts):
    t.sort()
    cut = len(t) // 10
    mid = t[cut:len(t) - cut] or t
    print(f"{n:22} {statistics.median(t):7.2f} {t[len(t) // 10]:7.2f} {t[len(t) * 9 // 10]:7.2f} {t[0]:7.2f} {statistics.mean(mid):7.2f}")
PY
if cmp -s "$out/ctk-gantry.yaml" "$out/gantry.yaml"; then
  echo "nvidia-ctk (gantry) and gantry cdi generate wrote the same spec ($(wc -c <"$out/gantry.yaml") bytes)"
else
  echo "FAIL: nvidia-ctk (gantry) and gantry cdi generate wrote different specs" >&2
  diff "$out/ctk-gantry.yaml" "$out/gantry.yaml" | head -20 >&2
  exit 1
fi
