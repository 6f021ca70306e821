#!/usr/bin/env bash
# What the driver's CUDA process checkpoint API accepts when a process is
# restored onto other GPUs (cuCheckpointProcessRestore's UUID pairs), on the
# host, no container: a PyTorch process computing on its first GPU is locked
# and checkpointed with gantry's helper (gantry cuda-checkpoint), then
# restored with one pair list per case, and either goes on (on which GPU) or
# is restored plainly and unlocked. Hosts with 2+ GPUs, as root:
#   bench/gpu-remap.sh
# Environment: BIN (gantry; default bin/), PYTHON (default
# /opt/torch/.venv/bin/python3).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$REPO/bin}
PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
WORK=$(mktemp -d /tmp/gantry-remap.XXXXXX)
mapfile -t U < <(nvidia-smi --query-gpu=uuid --format=csv,noheader)
[ ${#U[@]} -ge 2 ] || { echo "SKIP: one GPU"; exit 0; }
echo "== $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), ${#U[@]} GPUs"
cat >"$WORK/spin.py" <<'EOF'
import sys, time, torch
x = torch.arange(1 << 20, dtype=torch.int64, device="cuda")
out = open(sys.argv[1], "a", buffering=1)
i = 0
while True:
    i += 1
    x = (x * 3 + 1) % 1000003
    out.write(f"{i} {int(x.sum().item())}\n")
    time.sleep(0.01)
EOF
ck() { "$BIN/gantry" cuda-checkpoint "$@"; }
lines() { wc -l <"$1" 2>/dev/null || echo 0; }
case_() { # NAME CUDA_VISIBLE_DEVICES(or "-") MAP...
  local name=$1 cvd=$2; shift 2
  local log=$WORK/$name.log pid n on res
  if [ "$cvd" = - ]; then
    "$PYTHON" "$WORK/spin.py" "$log" & pid=$!
  else
    CUDA_VISIBLE_DEVICES=$cvd "$PYTHON" "$WORK/spin.py" "$log" & pid=$!
  fi
  for _ in $(seq 300); do [ "$(lines "$log")" -ge 20 ] && break; sleep 0.1; done
  ck --timeout-ms 10000 lock $pid >/dev/null && ck checkpoint $pid >/dev/null || { echo "FAIL $name: lock/checkpoint"; kill -9 $pid; return; }
  res=$(ck "$@" restore $pid 2>&1)
  if [ $? = 0 ]; then
    ck unlock $pid >/dev/null
    n=$(lines "$log"); sleep 1.5
    on=$(nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader | awk -F', ' -v p=$pid '$1 == p {print $2}')
    echo "RESULT $name: restore OK, steps $n -> $(lines "$log"), process on ${on:-?} (GPU0 ${U[0]}, GPU1 ${U[1]})"
  else
    echo "RESULT $name: restore refused: $res"
    ck restore $pid >/dev/null 2>&1 && ck unlock $pid >/dev/null 2>&1 && echo "       then restored plainly and unlocked"
  fi
  kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
}
case_ identity-all-visible - --map "${U[0]}=${U[0]}"
case_ 0to1-all-visible - --map "${U[0]}=${U[1]}"
case_ swap-all-visible - --map "${U[0]}=${U[1]}" --map "${U[1]}=${U[0]}"
allmap=()
for i in "${!U[@]}"; do j=$(((i + 1) % ${#U[@]})); allmap+=(--map "${U[$i]}=${U[$j]}"); done
case_ rotate-every-gpu - "${allmap[@]}"
case_ 0to1-only-gpu0-visible 0 --map "${U[0]}=${U[1]}"
case_ identity-only-gpu0-visible 0 --map "${U[0]}=${U[0]}"
rm -rf "$WORK"
