#!/usr/bin/env bash
# What the driver's CUDA process checkpoint API accepts when a process is
# restored onto other GPUs (cuCheckpointProcessRestore's UUID pairs), on the
# host, no container: a PyTorch process computing on its first GPU is locked
# and checkpointed with gantry's helper (gantry cuda-checkpoint), then
# restored with one pair list per case, and either goes on (on which GPU) or
# is restored plainly and unlocked. Then the same inside a gantry-runtime
# container checkpointed on GPU 0 (runc checkpoint) and restored by runc into
# a bundle Gantry injected for GPU 1, trying each pair list in turn on the one
# restored process. Hosts with 2+ GPUs, as root:
#   bench/gpu-remap.sh
# Environment: BIN (gantry, gantry-runtime, runc; default bin/), RUNC, PYTHON (default
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
lines() { { wc -l <"$1"; } 2>/dev/null || echo 0; }
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
if [ "${REMAP_HOST:-1}" = 1 ]; then
case_ identity-all-visible - --map "${U[0]}=${U[0]}"
case_ 0to1-all-visible - --map "${U[0]}=${U[1]}"
case_ swap-all-visible - --map "${U[0]}=${U[1]}" --map "${U[1]}=${U[0]}"
allmap=()
for i in "${!U[@]}"; do j=$(((i + 1) % ${#U[@]})); allmap+=(--map "${U[$i]}=${U[$j]}"); done
case_ rotate-every-gpu - "${allmap[@]}"
case_ 0to1-only-gpu0-visible 0 --map "${U[0]}=${U[1]}"
case_ identity-only-gpu0-visible 0 --map "${U[0]}=${U[0]}"
fi

# In a container: the process sees only the GPU its container was given.
RUNC=${RUNC:-$BIN/runc}
[ -x "$RUNC" ] || RUNC=$(command -v runc)
if ldd "$RUNC" 2>/dev/null | grep -q 'not found' && [ -e "$BIN/lib/libseccomp.so.2" ]; then
  export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
STATE=$WORK/state
mkdir -p "$STATE" "$WORK/prog"
cp "$WORK/spin.py" "$WORK/prog/"
ln -sf "$BIN/gantry-runtime" "$WORK/gantry-runtime"
export GANTRY_CONFIG=$WORK/gantry.toml
printf '[runtime]\nlow-level = "%s"\ncache-dir = "%s"\nlog-file = "%s"\ndriver-tree-dir = "%s"\n' "$RUNC" "$WORK/cache" "$WORK/gantry.log" "$WORK/trees" >"$GANTRY_CONFIG"
bundle() { # DIR GPU
  local d=$1
  mkdir -p "$d/rootfs"/{proc,sys,dev,tmp,etc,usr/lib,usr/lib64,usr/bin,usr/sbin,opt/torch,out,work} "$d/out"
  for l in bin sbin lib lib64; do ln -sfn usr/$l "$d/rootfs/$l"; done
  cp /etc/ld.so.cache "$d/rootfs/etc/" 2>/dev/null
  cp -r /etc/ld.so.conf /etc/ld.so.conf.d "$d/rootfs/etc/" 2>/dev/null
  "$RUNC" spec --bundle "$d"
  "$PYTHON" - "$d" "$2" "$WORK" "$PYTHON" <<'PY'
import json, sys
d, gpu, work, py = sys.argv[1:]
p = d + "/config.json"
s = json.load(open(p))
s["process"]["terminal"] = False
s["process"]["args"] = [py, "/work/spin.py", "/shared/log"]
s["process"]["env"] += ["NVIDIA_VISIBLE_DEVICES=" + gpu, "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
s["root"] = {"path": "rootfs"}
s["linux"]["namespaces"] = [n for n in s["linux"]["namespaces"] if n["type"] != "network"]
for src, dst, opt in [("/usr", "/usr", "ro"), ("/opt/torch", "/opt/torch", "ro"), (work + "/prog", "/work", "ro"), (work + "/shared", "/shared", "rw")]:
    s["mounts"].append({"destination": dst, "type": "bind", "source": src, "options": ["rbind", opt]})
json.dump(s, open(p, "w"), indent=1)
PY
}
mkdir -p "$WORK/shared"
bundle "$WORK/a" 0 >/dev/null
bundle "$WORK/b" 1 >/dev/null
# b's config.json as Gantry injects it for GPU 1 (a create, then delete)
"$WORK/gantry-runtime" --root "$STATE" create --bundle "$WORK/b" probe-b </dev/null >/dev/null 2>"$WORK/b.err" && "$RUNC" --root "$STATE" delete -f probe-b
"$WORK/gantry-runtime" --root "$STATE" run --detach --bundle "$WORK/a" ct </dev/null > >(cat >"$WORK/a.out") 2>&1
for _ in $(seq 600); do [ "$(lines "$WORK/shared/log")" -ge 20 ] && break; sleep 0.1; done
init=$("$RUNC" --root "$STATE" state ct | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
cpids() { local p ns; ns=$(readlink /proc/"$1"/ns/mnt); for p in /proc/[0-9]*; do [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$ns" ] && grep -q libcuda.so "$p/maps" 2>/dev/null && echo "${p#/proc/}"; done; return 0; }
cp_=$(cpids "$init" | tr '\n' ' ')
echo "== container on GPU 0: CUDA processes $cp_, steps $(lines "$WORK/shared/log")"
ck --timeout-ms 10000 lock $cp_ >/dev/null && ck checkpoint $cp_ >/dev/null &&
  "$RUNC" --root "$STATE" checkpoint --image-path "$WORK/img" --work-path "$WORK/img.work" ct >"$WORK/ck.out" 2>&1 ||
  { echo "FAIL container checkpoint: $(tail -3 "$WORK/ck.out")"; exit 1; }
n0=$(lines "$WORK/shared/log")
"$RUNC" --root "$STATE" restore --detach --bundle "$WORK/b" --image-path "$WORK/img" --work-path "$WORK/img.work" ct </dev/null >"$WORK/rs.out" 2>&1 ||
  { echo "FAIL runc restore into GPU 1's bundle: $(tail -3 "$WORK/rs.out"; grep Error "$WORK/img.work/restore.log" | tail -3)"; exit 1; }
init=$("$RUNC" --root "$STATE" state ct | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
cp_=$(cpids "$init" | tr '\n' ' ')
echo "== runc restored it into GPU 1's bundle: CUDA processes $cp_ ($(ck state $cp_))"
try() { # NAME MAP...
  local name=$1; shift
  if res=$(ck "$@" restore $cp_ 2>&1); then echo "RESULT container-$name: restore OK"; return 0; fi
  echo "RESULT container-$name: restore refused: $res"; return 1
}
all=()
for i in "${!U[@]}"; do j=$(((i + 1) % ${#U[@]})); all+=(--map "${U[$i]}=${U[$j]}"); done
try 0to1 --map "${U[0]}=${U[1]}" || try swap01 --map "${U[0]}=${U[1]}" --map "${U[1]}=${U[0]}" ||
  try rotate-every-gpu "${all[@]}" || try plain
ck unlock $cp_ >/dev/null 2>&1
sleep 2
on=$(nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader | tr -d ' ' | tr '\n' ' ')
echo "RESULT container: steps $n0 -> $(lines "$WORK/shared/log") after restore; compute apps $on (GPU1 ${U[1]})"
"$RUNC" --root "$STATE" delete -f ct >/dev/null 2>&1
rm -rf "$WORK"
