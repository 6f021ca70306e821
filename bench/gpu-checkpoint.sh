#!/usr/bin/env bash
# Checkpoint and restore of a PyTorch GPU container mid-computation, through
# gantry-runtime (runc checkpoint/restore with the CUDA steps), beside the
# manual sequence (gantry cuda-checkpoint lock+checkpoint, runc checkpoint;
# runc restore, gantry cuda-checkpoint restore+unlock) in the same run.
# On a GPU host, as root:
#   bench/gpu-checkpoint.sh [SIZE_GB[xGPUS]...]     default: 1 8
# SIZE_GB is the GPU memory the container's tensors hold, spread over its
# first GPUS GPUs (default 1): "16x4" is 4 GiB on each of 4 GPUs.
# Environment: BIN (gantry, gantry-runtime; default bin/), RUNC (default runc in
# PATH), PYTHON (a python with torch, default /opt/torch/.venv/bin/python3),
# CRIU_DIR (an unpacked scripts/install-criu.sh prefix to use when criu is missing),
# LEAVE (sizes for the --leave-running runs, default the first size; "" none),
# MIGRATE=0 (no restore onto another GPU), ORDER=manual-first (the manual
# sequence before gantry-runtime at each size), SETTLE=drop (drop the page
# cache as well as sync before each timed checkpoint; default sync only),
# PASSES=N (every size N times, in the same order).
# For each size and each way: checkpoint time, restore time, image size, and a
# correctness check: the container's computation (an exact integer recurrence
# on the GPU, and the ballast tensors summed every 50 steps) goes on after
# the restore from the step it was checkpointed at, every step's value as an
# uninterrupted run computes it. With --leave-running, the GPU idle time: the
# longest gap between two steps of the computation, which the checkpoint stops.
# Prints a PASS/FAIL line per check and a table.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$REPO/bin}
PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3}
RUNC=${RUNC:-$(command -v runc)}
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1 8)
WORK=$(mktemp -d /tmp/gantry-ckpt.XXXXXX)
STATE=$WORK/state
fails=0
PASS() { echo "PASS: $*"; }
FAIL() { echo "FAIL: $*"; fails=$((fails + 1)); }
die() { echo "error: $*" >&2; exit 2; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", b - a}'; }

[ "$(id -u)" = 0 ] || die "run as root"
[ -x "$BIN/gantry" ] && [ -x "$BIN/gantry-runtime" ] || die "$BIN/gantry and gantry-runtime missing"
[ -x "$RUNC" ] || die "runc missing"
if ! command -v criu >/dev/null && [ -n "${CRIU_DIR:-}" ]; then
  ln -sfn "$CRIU_DIR/bin/criu" /usr/local/sbin/criu
fi
command -v criu >/dev/null || die "criu missing (scripts/install-criu.sh)"
echo "== criu: $(criu --version | head -1), check: $(criu check 2>&1 | tail -1)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/== GPU: /'
echo "== host: $(nproc) CPUs, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r)"
mkdir -p "$STATE" "$WORK/cache"
ln -sf "$BIN/gantry-runtime" "$WORK/gantry-runtime"
RT=$WORK/gantry-runtime
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export GANTRY_CONFIG=$WORK/gantry.toml
cat >"$GANTRY_CONFIG" <<EOF
[runtime]
low-level = "$RUNC"
cache-dir = "$WORK/cache"
log-file = "$WORK/gantry.log"
driver-tree-dir = "$WORK/trees"
EOF

# The container: the host's /usr and the torch environment, read-only, and
# /out, where the computation logs each step.
cat >"$WORK/train.py" <<'EOF'
import os, time, torch
ngpu = torch.cuda.device_count()
# int64 ones: their sum needs no wider copy, so the GPU memory in use is the
# ballast (and the CUDA contexts)
n = int(float(os.environ["SIZE_GB"]) * (1 << 30)) // 8 // ngpu
ballast = [torch.ones(n, dtype=torch.int64, device=f"cuda:{g}") for g in range(ngpu)]
x = torch.arange(1 << 20, dtype=torch.int64, device="cuda:0")
out = open("/out/log", "a", buffering=1)
i = 0
while True:
    i += 1
    x = (x * 3 + 1) % 1000003
    cs = int(x.sum().item())
    ok = all(int(b.sum().item()) == n for b in ballast) if i % 50 == 0 else True
    out.write(f"{i} {cs} {ok} {time.time():.4f}\n")
    time.sleep(0.005)
EOF
cat >"$WORK/check.py" <<'EOF'
import sys, torch
lines = [l.split() for l in open(sys.argv[1])]
x = torch.arange(1 << 20, dtype=torch.int64)
for want, (i, cs, ok, _) in enumerate(lines, 1):
    x = (x * 3 + 1) % 1000003
    if int(i) != want or int(cs) != int(x.sum()) or ok != "True":
        print(f"step {want}: logged {i} {cs} {ok}, want {want} {int(x.sum())} True"); sys.exit(1)
print(f"{len(lines)} steps exact")
EOF
# the longest gap between two logged steps after step FROM (seconds)
cat >"$WORK/gap.py" <<'EOF'
import sys
t = [float(l.split()[3]) for l in open(sys.argv[1])][int(sys.argv[2]):]
print(f"{max(b - a for a, b in zip(t, t[1:])):.2f}")
EOF

make_bundle() { # DIR SIZE_GB[xGPUS]
  local d=$1 gpus=0 g
  # usr/lib etc. exist for what gantry-runtime links into the root (the /usr
  # bind then covers them: the driver's firmware is the kernel's business)
  mkdir -p "$d/rootfs"/{proc,sys,dev,tmp,etc,usr/lib,usr/lib64,usr/bin,usr/sbin,opt/torch,out,work} "$d/out"
  for l in bin sbin lib lib64; do ln -s usr/$l "$d/rootfs/$l"; done
  cp /etc/ld.so.cache "$d/rootfs/etc/" 2>/dev/null
  cp -r /etc/ld.so.conf /etc/ld.so.conf.d "$d/rootfs/etc/" 2>/dev/null
  case "$2" in *x*) for g in $(seq 1 $((${2#*x} - 1))); do gpus=$gpus,$g; done ;; esac
  "$RUNC" spec --bundle "$d"
  "$PYTHON" - "$d" "${2%x*}" "$WORK" "$PYTHON" "$gpus" <<'EOF'
import json, sys
d, size, work, py, gpus = sys.argv[1:]
p = d + "/config.json"
s = json.load(open(p))
s["process"]["terminal"] = False
s["process"]["args"] = [py, "/work/train.py"]
s["process"]["env"] += ["NVIDIA_VISIBLE_DEVICES=" + gpus, "NVIDIA_DRIVER_CAPABILITIES=compute,utility", "SIZE_GB=" + size,
    "NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "NVSHMEM_DISABLE_NVLS=1"]
s["root"] = {"path": "rootfs"}
# The host's network: CRIU locks a container's own network namespace with
# iptables-restore, which GPU hosts may lack (it then fails the dump).
s["linux"]["namespaces"] = [n for n in s["linux"]["namespaces"] if n["type"] != "network"]
for src, dst, opt in [("/usr", "/usr", "ro"), ("/opt/torch", "/opt/torch", "ro"), (work, "/work", "ro"), (d + "/out", "/out", "rw")]:
    s["mounts"].append({"destination": dst, "type": "bind", "source": src, "options": ["rbind", opt]})
json.dump(s, open(p, "w"), indent=1)
EOF
}

steps() { { wc -l <"$1/out/log"; } 2>/dev/null || echo 0; }
wait_steps() { # BUNDLE N
  local i=0
  while [ "$(steps "$1")" -lt "$2" ]; do
    sleep 0.1; i=$((i + 1)); [ $i -lt 1800 ] || return 1
  done
}
pidof_ct() { "$RUNC" --root "$STATE" state "$1" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["pid"])'; }
# the container's processes that map libcuda (the manual way: by hand)
cuda_pids() {
  local p ns
  ns=$(readlink /proc/"$1"/ns/mnt)
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$ns" ] && grep -q libcuda.so "$p/maps" 2>/dev/null && echo "${p#/proc/}"
  done
  return 0 # under pipefail, the last /proc entry's miss would fail the caller's && chain
}

table=()
one() { # WAY SIZE
  local way=$1 size=$2 p=${3:+-p$3} id b img t0 t1 t2 t3 tc= at pid
  id=ck-$1-$2$p b=$WORK/b-$1-$2$p img=$WORK/img-$1-$2$p
  make_bundle "$b" "$size" >/dev/null
  # The container's stdout and stderr are a pipe, as an engine's shim gives
  # it: CRIU cannot dump a descriptor of a host file outside the
  # container's mounts ("Can't lookup mount"), which a plain redirection
  # of runc's output to a file would hand it.
  if ! "$RT" --root "$STATE" run --detach --bundle "$b" "$id" </dev/null > >(cat >"$WORK/$id.run") 2>&1; then
    FAIL "$way ${size}G: run: $(tail -3 "$WORK/$id.run")"; return
  fi
  wait_steps "$b" 100 || { FAIL "$way ${size}G: the container did not compute 100 steps"; "$RUNC" --root "$STATE" delete -f "$id"; return; }
  pid=$(pidof_ct "$id")
  local gpumem
  gpumem=$(nvidia-smi --query-compute-apps=used_memory --format=csv,noheader,nounits | awk '{s += $1} END {print s}')
  # Each way starts with no dirty pages of an earlier run's image waiting to
  # be written back (the disk's write-back would otherwise fall on the next)
  settle
  t0=$(now)
  if [ "$way" = gantry ]; then
    "$RT" --root "$STATE" checkpoint --image-path "$img" --work-path "$img.work" "$id" >"$WORK/$id.ckpt" 2>&1
  else
    local cp
    cp=$(cuda_pids "$pid" | tr '\n' ' ')
    "$BIN/gantry" cuda-checkpoint --timeout-ms 30000 lock $cp >"$WORK/$id.ckpt" 2>&1 &&
      "$BIN/gantry" cuda-checkpoint checkpoint $cp >>"$WORK/$id.ckpt" 2>&1 &&
      tc=$(now) &&
      "$RUNC" --root "$STATE" checkpoint --image-path "$img" --work-path "$img.work" "$id" >>"$WORK/$id.ckpt" 2>&1
  fi
  local rc=$?
  t1=$(now)
  [ "$way" = manual ] && [ -n "${tc:-}" ] &&
    echo "   manual ${size}G checkpoint phases (s): CUDA lock+checkpoint $(secs "$t0" "$tc"), runc checkpoint $(secs "$tc" "$t1")"
  [ $rc = 0 ] || { FAIL "$way ${size}G: checkpoint: $(tail -5 "$WORK/$id.ckpt"; grep Error "$img.work/dump.log" | tail -5)"; "$RUNC" --root "$STATE" delete -f "$id"; return; }
  "$RUNC" --root "$STATE" delete "$id" 2>/dev/null
  at=$(steps "$b")
  local size_img
  size_img=$(du -sb "$img" | awk '{printf "%.2f", $1/1e9}')
  [ "$way" = gantry ] && [ -e "$img/gantry-gpus.json" ] &&
    echo "   gantry ${size}G checkpoint phases (ms): $("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("timings"))' "$img/gantry-gpus.json")"
  local modes
  modes=$(find "$img" \( -type f ! -perm 0600 \) -o \( -type d ! -perm 0700 \) | wc -l)
  sleep 1
  [ "$(steps "$b")" = "$at" ] || FAIL "$way ${size}G: the log grew after the checkpoint stopped the container"
  t2=$(now)
  if [ "$way" = gantry ]; then
    "$RT" --root "$STATE" restore --detach --bundle "$b" --image-path "$img" --work-path "$img.work" "$id" </dev/null >"$WORK/$id.rst" 2>&1
  else
    "$RUNC" --root "$STATE" restore --detach --bundle "$b" --image-path "$img" --work-path "$img.work" "$id" </dev/null >"$WORK/$id.rst" 2>&1 &&
      cp=$(cuda_pids "$(pidof_ct "$id")" | tr '\n' ' ') &&
      "$BIN/gantry" cuda-checkpoint restore $cp >>"$WORK/$id.rst" 2>&1 &&
      "$BIN/gantry" cuda-checkpoint unlock $cp >>"$WORK/$id.rst" 2>&1
  fi
  rc=$?
  t3=$(now)
  [ $rc = 0 ] || { FAIL "$way ${size}G: restore: $(tail -5 "$WORK/$id.rst"; grep Error "$img.work/restore.log" | tail -5)"; "$RUNC" --root "$STATE" delete -f "$id"; return; }
  if wait_steps "$b" $((at + 120)); then
    "$RUNC" --root "$STATE" kill "$id" KILL; sleep 0.5
    if r=$("$PYTHON" "$WORK/check.py" "$b/out/log"); then
      PASS "$way ${size}G: checkpointed at step $at, restored, went on: $r"
    else
      FAIL "$way ${size}G: wrong computation after restore: $r"
    fi
  else
    FAIL "$way ${size}G: no progress after restore (at $(steps "$b"), checkpointed at $at)"
  fi
  [ "$way" = gantry ] && { [ "$modes" = 0 ] && PASS "gantry ${size}G: image files 0600, directories 0700" || FAIL "gantry ${size}G: $modes image entries not 0600/0700"; }
  "$RUNC" --root "$STATE" delete -f "$id" 2>/dev/null
  table+=("$(printf '%-9s %5s GiB  GPU mem %6s MiB  checkpoint %6s s  restore %6s s  image %6s GB  %5s GB/s written' "$way${3:+ #$3}" "$size" "$gpumem" "$(secs "$t0" "$t1")" "$(secs "$t2" "$t3")" "$size_img" "$(awk -v g="$size_img" -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", g / (b - a)}')")")
  rm -rf "$img" "$img.work"
}

# A checkpoint with --leave-running: the container goes on; the GPU idle time
# is the longest gap between two steps of its computation around the
# checkpoint (the CUDA lock to the unlock, as the computation sees it).
leave() { # WAY SIZE
  local way=$1 size=$2 id=lr-$1-$2 b=$WORK/lb-$1-$2 img=$WORK/limg-$1-$2 t0 t1 at pid cp rc
  make_bundle "$b" "$size" >/dev/null
  "$RT" --root "$STATE" run --detach --bundle "$b" "$id" </dev/null > >(cat >"$WORK/$id.run") 2>&1 ||
    { FAIL "leave $way ${size}G: run: $(tail -3 "$WORK/$id.run")"; return; }
  wait_steps "$b" 100 || { FAIL "leave $way ${size}G: no progress"; "$RUNC" --root "$STATE" delete -f "$id"; return; }
  pid=$(pidof_ct "$id")
  at=$(steps "$b")
  t0=$(now)
  if [ "$way" = gantry ]; then
    "$RT" --root "$STATE" checkpoint --leave-running --image-path "$img" --work-path "$img.work" "$id" >"$WORK/$id.ckpt" 2>&1
  else
    cp=$(cuda_pids "$pid" | tr '\n' ' ')
    "$BIN/gantry" cuda-checkpoint --timeout-ms 30000 lock $cp >"$WORK/$id.ckpt" 2>&1 &&
      "$BIN/gantry" cuda-checkpoint checkpoint $cp >>"$WORK/$id.ckpt" 2>&1 &&
      "$RUNC" --root "$STATE" checkpoint --leave-running --image-path "$img" --work-path "$img.work" "$id" >>"$WORK/$id.ckpt" 2>&1 &&
      "$BIN/gantry" cuda-checkpoint restore $cp >>"$WORK/$id.ckpt" 2>&1 &&
      "$BIN/gantry" cuda-checkpoint unlock $cp >>"$WORK/$id.ckpt" 2>&1
  fi
  rc=$?
  t1=$(now)
  [ $rc = 0 ] || { FAIL "leave $way ${size}G: checkpoint: $(tail -5 "$WORK/$id.ckpt")"; "$RUNC" --root "$STATE" delete -f "$id"; rm -rf "$img" "$img.work"; return; }
  local size_img gap
  size_img=$(du -sb "$img" | awk '{printf "%.2f", $1/1e9}')
  [ "$way" = gantry ] && [ -e "$img/gantry-gpus.json" ] &&
    echo "   leave gantry ${size}G phases (ms, gpuIdleMs: the CUDA lock to the unlock): $("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("timings"))' "$img/gantry-gpus.json")"
  rm -rf "$img" "$img.work"
  if wait_steps "$b" $((at + 100)); then
    "$RUNC" --root "$STATE" kill "$id" KILL; sleep 0.5
    gap=$("$PYTHON" "$WORK/gap.py" "$b/out/log" $((at - 1)))
    if r=$("$PYTHON" "$WORK/check.py" "$b/out/log"); then
      PASS "leave $way ${size}G: checkpointed with --leave-running at step $at, went on: $r"
    else
      FAIL "leave $way ${size}G: wrong computation after the checkpoint: $r"
    fi
  else
    FAIL "leave $way ${size}G: no progress after a --leave-running checkpoint (at $(steps "$b"), checkpointed at $at)"
  fi
  "$RUNC" --root "$STATE" delete -f "$id" 2>/dev/null
  table+=("$(printf '%-7s %4s GiB  --leave-running: checkpoint %6s s  GPU idle (longest step gap) %6s s  image %6s GB' "$way" "$size" "$(secs "$t0" "$t1")" "${gap:-?}" "$size_img")")
}

# Migration: checkpointed on GPU 0, restored with the request changed to GPU
# 1 (the restore's request decides: gantry-runtime maps GPU 0's UUID to GPU
# 1's in the CUDA restore). Hosts with 2+ GPUs; MIGRATE=0 leaves it out.
migrate() { # SIZE
  local size=$1 id=ck-migrate-$1 b=$WORK/b-migrate-$1 img=$WORK/img-migrate-$1 at pid uuid1 on
  make_bundle "$b" "$size" >/dev/null
  # The restore gets the container's own spec again, as an engine hands it
  # (config.json as gantry-runtime changed it at the create holds GPU 0's
  # edits already), with the request changed.
  cp "$b/config.json" "$b/config.orig.json"
  "$RT" --root "$STATE" run --detach --bundle "$b" "$id" </dev/null > >(cat >"$WORK/$id.run") 2>&1 ||
    { FAIL "migrate ${size}G: run: $(tail -3 "$WORK/$id.run")"; return; }
  wait_steps "$b" 100 || { FAIL "migrate ${size}G: no progress"; "$RUNC" --root "$STATE" delete -f "$id"; return; }
  "$RT" --root "$STATE" checkpoint --image-path "$img" --work-path "$img.work" "$id" >"$WORK/$id.ckpt" 2>&1 ||
    { FAIL "migrate ${size}G: checkpoint: $(tail -5 "$WORK/$id.ckpt")"; "$RUNC" --root "$STATE" delete -f "$id"; return; }
  "$RUNC" --root "$STATE" delete "$id" 2>/dev/null
  at=$(steps "$b")
  "$PYTHON" - "$b/config.orig.json" "$b/config.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); p = sys.argv[2]
s["process"]["env"] = [e if not e.startswith("NVIDIA_VISIBLE_DEVICES=") else "NVIDIA_VISIBLE_DEVICES=1" for e in s["process"]["env"]]
json.dump(s, open(p, "w"), indent=1)
PY
  echo "== the driver's verdict on restoring onto other GPUs: $("$BIN/gantry" checkpoint --probe-remap 2>&1 | tail -1)"
  local t0 t1
  t0=$(now)
  if ! "$RT" --root "$STATE" restore --detach --bundle "$b" --image-path "$img" --work-path "$img.work" "$id" </dev/null >"$WORK/$id.rst" 2>&1; then
    if ! "$RUNC" --root "$STATE" state "$id" >/dev/null 2>&1 && [ ! -e "$img.work/restore.log" ]; then
      # a driver that cannot: refused before runc restore, nothing changed
      PASS "migrate ${size}G: refused before anything changed: $(tail -1 "$WORK/$id.rst")"
    else
      FAIL "migrate ${size}G: restore onto GPU 1 failed after runc restore ran: $(tail -5 "$WORK/$id.rst"; grep Error "$img.work/restore.log" | grep -v rlimit | tail -5)"
    fi
    "$RUNC" --root "$STATE" delete -f "$id"; rm -rf "$img" "$img.work"; return
  fi
  t1=$(now)
  table+=("$(printf 'migrate %5s GiB  GPU 0 -> GPU 1: restore %6s s' "$size" "$(secs "$t0" "$t1")")")
  pid=$(pidof_ct "$id")
  uuid1=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 1)
  if wait_steps "$b" $((at + 120)); then
    on=$(nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader | tr -d ' ')
    "$RUNC" --root "$STATE" kill "$id" KILL; sleep 0.5
    if r=$("$PYTHON" "$WORK/check.py" "$b/out/log"); then
      PASS "migrate ${size}G: checkpointed on GPU 0 at step $at, restored onto GPU 1, went on: $r"
    else
      FAIL "migrate ${size}G: wrong computation after restore onto GPU 1: $r"
    fi
    case "$on" in *"$uuid1"*) PASS "migrate ${size}G: the restored process computes on GPU 1 ($uuid1)";;
      *) FAIL "migrate ${size}G: GPU 1 ($uuid1) runs none of the restored processes: $on";; esac
  else
    FAIL "migrate ${size}G: no progress after restore onto GPU 1 (at $(steps "$b"), checkpointed at $at): $(tail -3 "$WORK/$id.rst")"
  fi
  "$RUNC" --root "$STATE" delete -f "$id" 2>/dev/null
  rm -rf "$img" "$img.work"
}

# settle: write back dirty pages (and with SETTLE=drop, drop the page cache)
# before a timed checkpoint, so no way pays for the one before it.
settle() {
  sync
  [ "${SETTLE:-sync}" = drop ] && echo 3 >/proc/sys/vm/drop_caches
  return 0
}
# ORDER=manual-first runs the manual sequence before gantry-runtime at each
# size (default gantry first): run both to see what the order costs.
# PASSES=N times over every size (rows numbered #1..#N): the first pass of a
# fresh machine may pay for first touches of host memory the later ones reuse.
for pass in $(seq "${PASSES:-1}"); do
  [ "${PASSES:-1}" = 1 ] && pass=
  for s in "${sizes[@]}"; do
    [ "${ONLY_MIGRATE:-0}" = 1 ] && break
    if [ "${ORDER:-gantry-first}" = manual-first ]; then
      one manual "$s" $pass
      one gantry "$s" $pass
    else
      one gantry "$s" $pass
      one manual "$s" $pass
    fi
  done
done
for s in ${LEAVE-${sizes[0]}}; do
  [ "${ONLY_MIGRATE:-0}" = 1 ] && break
  leave gantry "$s"
  leave manual "$s"
done
if [ "${MIGRATE:-1}" = 1 ] && [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  migrate "${sizes[0]%x*}"
fi
echo "== figures (checkpoint: CUDA lock+checkpoint and runc checkpoint; restore: runc restore and CUDA restore+unlock)"
printf '%s\n' "${table[@]}"
dd if=/dev/zero of="$WORK/dd" bs=16M count=128 oflag=direct 2>&1 | tail -1 | sed 's/^/== dd write, 2 GiB, same disk: /'
rm -f "$WORK/dd"
grep -h '"command":"\(checkpoint\|restore\)"' "$WORK/gantry.log" | tail -12 | sed 's/^/   log: /'
echo "== $fails failure(s); scratch $WORK"
[ $fails = 0 ]
