#!/usr/bin/env bash
# Times `gantry cdi generate` end to end (process start to spec written), and
# optionally NVIDIA's `nvidia-ctk cdi generate` side by side.
#
#   bench/cdi-generate.sh [GANTRY_BINARY] [-- EXTRA GANTRY FLAGS]
#
#   On a GPU host:   bench/cdi-generate.sh bin/gantry
#   Without a GPU:   bench/cdi-generate.sh bin/gantry -- --gpus sim:h100x8 --driver-root /tmp/driver
#
# Environment: RUNS (default 30), NVIDIA_CTK (path of nvidia-ctk to compare, optional),
# DRIVER_ROOT (for nvidia-ctk, default /). Prints median, min and max in ms.
# Goal (issue 2): at most 30 ms on a 1-GPU H100 host.
set -euo pipefail
g=${1:-bin/gantry}
shift || true
[ "${1:-}" = "--" ] && shift
runs=${RUNS:-30}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
timeit() {
  python3 - "$runs" "$@" <<'PY'
import subprocess, sys, time, statistics
n = int(sys.argv[1]); cmd = sys.argv[2:]
r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # warm the page cache
if r.returncode:
    sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}: {r.stderr.decode().strip()}")
ts = []
for _ in range(n):
    t = time.perf_counter(); subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True); ts.append((time.perf_counter() - t) * 1000)
print(f"{statistics.median(ts):7.1f} {min(ts):7.1f} {max(ts):7.1f}  {' '.join(cmd)}")
PY
}
echo " median     min     max  (ms, $runs runs)"
timeit "$g" "$@" cdi generate --output "$work/gantry.yaml"
if [ -n "${NVIDIA_CTK:-}" ]; then
  timeit "$NVIDIA_CTK" cdi generate --driver-root "${DRIVER_ROOT:-/}" --output "$work/nvidia.yaml"
fi
