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
$g "${args[@]}" list | head -20
mkdir -p "$work/cdi"
step $g "${args[@]}" cdi generate --output "$work/cdi/nvidia.yaml"
step $g cdi list --spec-dirs "$work/cdi"
printf '\n\033[1m$ %s\033[0m\n' "head -40 $work/cdi/nvidia.yaml"
head -40 "$work/cdi/nvidia.yaml"
echo "..."
echo
echo "Next: make test (the test suite), $g --help (every command)."
