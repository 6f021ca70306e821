#!/usr/bin/env bash
# Shows Gantry on this host: real GPUs when the NVIDIA driver is present,
# otherwise 8 simulated H100s over a fake driver root built on the spot.
set -euo pipefail
cd "$(dirname "$0")/.."
g=bin/gantry
work=${GANTRY_DEMO_DIR:-${TMPDIR:-/tmp}/gantry-demo}
mkdir -p "$work"
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

if [ -e /proc/driver/nvidia/version ] && $g info >/dev/null 2>&1; then
  echo "NVIDIA driver found: using the real GPUs."
  args=()
else
  echo "No NVIDIA GPU here: simulating an 8x H100 NVSwitch node over a generated driver root."
  args=(--gpus sim:h100x8 --driver-root "$work/driver")
  rm -rf "$work/driver"
  step $g "${args[@]}" sim driver-root "$work/driver"
fi
step $g "${args[@]}" info
printf '\n\033[1m$ %s\033[0m\n' "$g ${args[*]} list | head -20"
# Through a file: with pipefail, head closing the pipe early would fail the demo.
$g "${args[@]}" list >"$work/list.txt"
head -20 "$work/list.txt"
mkdir -p "$work/cdi"
step $g "${args[@]}" cdi generate --output "$work/cdi/nvidia.yaml"
step $g cdi list --spec-dirs "$work/cdi"
printf '\n\033[1m$ %s\033[0m\n' "head -40 $work/cdi/nvidia.yaml"
head -40 "$work/cdi/nvidia.yaml"
echo "..."

# The main job: a container asks for GPUs 0 and 1 and gets exactly them,
# through gantry-runtime in front of runc, as Docker's --runtime=nvidia or a
# Kubernetes RuntimeClass would run it. Needs root (runc) and runc itself.
container_demo() {
  local runc
  runc=$(command -v runc || true)
  if [ "$(id -u)" != 0 ] || [ -z "$runc" ]; then
    echo
    echo "(A container with GPUs needs root and runc: sudo make demo shows one.)"
    return 0
  fi
  # bin/cuda-check: loads libcuda.so.1 the way CUDA programs do.
  [ -x bin/cuda-check ] || gcc -O2 -Wall -o bin/cuda-check scripts/cuda-check.c -ldl
  REPO=$PWD WORK=$work/container RUNC=$runc CUDA_CHECK=$PWD/bin/cuda-check GANTRY=$PWD/$g
  rm -rf "$WORK" && mkdir -p "$WORK"
  # shellcheck source=scripts/lib/bundle.sh
  . scripts/lib/bundle.sh
  local load=""
  if [ ${#args[@]} -gt 0 ]; then setup_env --sim; load=--load-only; else setup_env; fi
  make_bundle "$WORK/bundle" NVIDIA_VISIBLE_DEVICES=0,1 -- /bin/sh -c \
    "echo '# inside the container:'; for f in /dev/nvidia*; do echo \"  \$f\"; done; nvidia-smi -L; cuda-check $load; echo NVIDIA_VISIBLE_DEVICES=\$NVIDIA_VISIBLE_DEVICES"
  printf '\n\033[1m$ %s\033[0m\n' "NVIDIA_VISIBLE_DEVICES=0,1: gantry-runtime create/start, then runc runs it (OCI bundle in $WORK/bundle)"
  if run_container "$GANTRY_RUNTIME" gantry-demo "$WORK/bundle" "$WORK/out"; then
    cat "$WORK/out"
    echo
    echo "# what gantry-runtime logged for it ($WORK/gantry.log):"
    tail -1 "$WORK/gantry.log"
  else
    cat "$WORK/out"
    cleanup_containers
    echo "the container failed: see above" >&2
    return 1
  fi
  cleanup_containers
}
container_demo
echo
if [ ${#args[@]} -gt 0 ]; then
  echo "To run an installed Gantry (sudo make install) on simulated GPUs: sudo gantry sim driver-root /var/lib/gantry/sim-driver,"
  echo "then the two lines it prints in /etc/gantry/config.toml: gpus = \"sim:h100x8\" and driver-root = \"/var/lib/gantry/sim-driver\"."
fi
echo "Next: make test (the test suite), $g --help (every command)."
