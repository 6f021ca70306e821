#!/usr/bin/env bash
# GPU end to end through gantry-runtime and runc: real containers on a rootfs
# made from this host's C library, checked against the host's own view.
#
#   scripts/gpu-e2e.sh           on a GPU host (root); needs bin/ from `make gpu-e2e`
#   scripts/gpu-e2e.sh --sim     anywhere (root, gcc, ldconfig): simulated GPUs (SIM_PROFILE,
#                                default h100x8) and a fake driver root from `gantry sim driver-root`
#   --keep                       keep the scratch directory (bundles, configs, gantry.log)
#
# Checks (PASS/FAIL/SKIP each, summary, exit 1 on any FAIL, 2 when it cannot start):
#   a  NVIDIA_VISIBLE_DEVICES=0: exactly GPU 0's device node; nvidia-smi -L shows exactly
#      GPU 0's UUID (as the host's nvidia-smi names it); cuda-check runs a PTX kernel on it
#   b  NVIDIA_VISIBLE_DEVICES=1 (2+ GPUs): only GPU 1
#   c  NVIDIA_VISIBLE_DEVICES=all: every GPU; cuda-check on each
#   d  no NVIDIA_VISIBLE_DEVICES: config.json byte-identical, no /dev/nvidia*, no
#      nvidia-smi, cuda-check fails cleanly (cannot load libcuda.so.1)
#   e  NVIDIA_VISIBLE_DEVICES=99: create fails with a one-line error, no container
#      left (runc list), config.json untouched
#   f  `gantry-runtime run` (foreground, as `docker run`-style callers use): GPU 0 again
#   g  plain runc with gantry as nvidia-container-runtime-hook (Docker's --gpus path):
#      GPU 0 through the prestart hook (mount namespace entry, device cgroup)
#   h  `gantry doctor --container` on a running GPU container (runc state): its request
#      and injected nodes PASS, and a probe process placed in its cgroup opens
#      /dev/nvidiactl (the device cgroup allows the GPU)
#   i  a CDI spec from `gantry cdi generate`, consumed the way CDI engines do (its
#      createContainer hooks run by runc inside the container's mount namespace), for
#      an image whose environment is hostile: LD_PRELOAD of a library in the image,
#      LD_LIBRARY_PATH, GCONV_PATH, GANTRY_CONFIG=/dev/zero (the CVE-2025-23266
#      class). GPU 0 as in a, the hooks ran, and the preload library never ran on
#      the host (bin/e2e-preload.so marks a host file if it does)
#   j  MPS (skipped without nvidia-cuda-mps-control): `gantry-device-plugin
#      mps-control-daemon` runs the real control daemon for GPU 0 with 2 replicas;
#      two containers given what Allocate gives a replica (pipe directory, the
#      daemon's /dev/shm; one with the CUDA_MPS_* limits, one relying on the
#      daemon's defaults) run cuda-check at the same time: each allocates 3/4 of
#      the limit (must work), then 5/4 (must fail); the MPS server log must exist;
#      SIGTERM must quit the daemon
#   k  `nvidia-container-cli info` through gantry-runtime, which links no NVML (a static
#      binary) and asks `gantry gpus-json`, the gantry beside it, for NVML's GPUs:
#      the host's GPU UUIDs, each with a brand and an architecture (NVML's fields)
#   l  graphics: a graphics,compute,utility container's own EGL (libglvnd) and Vulkan
#      loader find NVIDIA's driver (GPU hosts; bin/gfx-check)
#   m  the create server (gantry-runtime --create-server on a socket of this run): a
#      gantry-runtime create it makes (m1) and Docker's --gpus prestart hook whose work it
#      does (m2), each GPU 0 as in a, each logged with "server":true
#   n  checkpoint and restore (GPU hosts with criu and PyTorch, PYTHON): a PyTorch container
#      checkpointed mid-computation through gantry-runtime and restored goes on exactly
#      (bench/gpu-checkpoint.sh 1, beside the manual CUDA API + CRIU sequence); on 2+
#      GPUs also checkpointed on GPU 0 and restored onto GPU 1 (or refused before runc
#      restore where the driver cannot), going on exactly, on GPU 1
#   o  NCCL across GPUs (2+ GPUs, PyTorch at PYTHON): torch.distributed all-reduce and a DDP
#      step, one process per GPU, in one container given all GPUs, one given a subset by
#      index and one by UUID, the host's driver whited out; exact sums, the containers'
#      GPUs exactly those asked for, NVLS off, P2P; busbw and step time beside the host's
#      (bench/gpu-nccl.sh; NCCL_NVLS_ENABLE=0 and the other multicast switches set)
# In --sim mode nvidia-smi is the fake driver's (it lists the /dev/nvidiaN nodes it sees)
# and cuda-check only loads libcuda.so.1 and calls cuInit (--load-only): no kernel.
#
# Environment: DRIVER_ROOT (default /), GANTRY, RUNC, CUDA_CHECK, DEVICE_PLUGIN (default bin/...),
# DRIVER_LAYOUT=tree (the default: runtime.driver-layout = "tree", the driver as one mount of a
# tree of the container's driver files, kept in the work directory) or files (a mount per file).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
mode=gpu keep=0
for arg; do
  case $arg in
    --sim) mode=sim ;;
    --keep) keep=1 ;;
    -h | --help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $arg (use --sim, --keep)" >&2; exit 2 ;;
  esac
done
WORK=$(mktemp -d /tmp/gantry-e2e.XXXXXX)
DRIVER_LAYOUT=${DRIVER_LAYOUT:-tree}
# shellcheck source=scripts/lib/bundle.sh
. "$REPO/scripts/lib/bundle.sh"
SERVER_PID=
finish() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
  cleanup_containers
  if [ $keep = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap finish EXIT

pass=0 fail=0 skip=0
PASS() { echo "PASS $*"; pass=$((pass + 1)); }
FAIL() { echo "FAIL $*"; fail=$((fail + 1)); }
SKIP() { echo "SKIP $*"; skip=$((skip + 1)); }
# show FILE: the container's output, indented, for the log.
show() { sed 's/^/     | /;40q' "$1"; }

if [ $mode = sim ]; then setup_env --sim; else setup_env; fi
echo "== $mode mode, scratch $WORK"
"$GANTRY" --version

# What the host says: per GPU index, its UUID and device node.
declare -a UUID NODE
if [ $mode = gpu ]; then
  command -v nvidia-smi >/dev/null || die "nvidia-smi not found: run on a GPU host, or use --sim"
  nvidia-smi -L | sed 's/^/host: /'
  while IFS=', ' read -r idx uuid bus; do
    UUID[idx]=$uuid
    # The device node follows the kernel module's minor number, which need
    # not equal nvidia-smi's index; the driver's procfs says which it is.
    bus=${bus,,}
    minor=$(awk '/^Device Minor:/{print $3}' "/proc/driver/nvidia/gpus/${bus#0000}/information" 2>/dev/null)
    NODE[idx]=/dev/nvidia${minor:-$idx}
  done < <(nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader)
else
  for ((i = 0; i < 64; i++)); do [ -e "$WORK/driver/dev/nvidia$i" ] && NODE[i]=/dev/nvidia$i; done
  # The simulated profile's UUIDs, which the fake nvidia-smi -L names too.
  while read -r minor uuid; do UUID[minor]=$uuid; done < <("$GANTRY" info | awk '/^Device Minor:/ {m = $3} /^GPU UUID:/ {print m, $3}')
fi
ngpu=${#NODE[@]}
# The driver version the injected libcuda must carry (a stale libcuda of another
# driver, as some hosts have in /lib, must not be the one containers get).
if [ $mode = gpu ]; then
  drv=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
else
  drv=$("$GANTRY" info --json | sed -n 's/^  "driverVersion": "\(.*\)",$/\1/p')
fi
[ -n "$drv" ] || die "could not read the driver version"
[ "$ngpu" -gt 0 ] || die "no GPUs found on this host"
echo "== $ngpu GPU(s), driver $drv"

# The command every GPU container runs: its device nodes, nvidia-smi -L and cuda-check,
# each tool's exit status on a line of its own.
cc_args=
[ $mode = sim ] && cc_args=--load-only
probe="for f in /dev/nvidia*; do [ -e \"\$f\" ] && echo \"dev \$f\"; done
nvidia-smi -L; echo \"smi-exit=\$?\"
cuda-check $cc_args; echo \"cuda-exit=\$?\""

# sanity: plain runc can run a container on this host at all.
make_bundle "$WORK/b-sanity" -- /bin/sh -c 'echo hello from runc'
if run_container "$RUNC" e2e-sanity "$WORK/b-sanity" "$WORK/sanity.out" && grep -q 'hello from runc' "$WORK/sanity.out"; then
  PASS "plain runc runs a container on this host"
else
  FAIL "plain runc cannot run a container here (not Gantry's fault; fix runc first):"
  show "$WORK/sanity.out"
  exit 1
fi

# check_gpus NAME OUT INDEX...: the container saw exactly the GPUs INDEX...
check_gpus() {
  local name=$1 out=$2 ok=1 i want got
  shift 2
  want=$(for i in "$@"; do echo "${NODE[i]}"; done | sort)
  got=$(sed -n 's/^dev \(\/dev\/nvidia[0-9][0-9]*\)$/\1/p' "$out" | sort)
  if [ "$want" != "$got" ]; then
    FAIL "$name: device nodes ${got//$'\n'/ } (want ${want//$'\n'/ })"; ok=0
  fi
  grep -qx 'dev /dev/nvidiactl' "$out" || { FAIL "$name: no /dev/nvidiactl"; ok=0; }
  grep -qx 'smi-exit=0' "$out" || { FAIL "$name: nvidia-smi -L failed in the container"; ok=0; }
  if [ $mode = gpu ]; then
    grep -qx 'dev /dev/nvidia-uvm' "$out" || { FAIL "$name: no /dev/nvidia-uvm"; ok=0; }
    want=$(for i in "$@"; do echo "${UUID[i]}"; done | sort)
    got=$(grep '^GPU [0-9]*:' "$out" | sed -n 's/.*(UUID: \(GPU-[^)]*\)).*/\1/p' | sort)
    [ "$want" = "$got" ] || { FAIL "$name: nvidia-smi -L shows ${got//$'\n'/ } (want ${want//$'\n'/ })"; ok=0; }
    got=$(sed -n 's/^cuda-check: device [0-9]*: .*(UUID: \(GPU-[^)]*\)).*/\1/p' "$out" | sort)
    [ "$want" = "$got" ] || { FAIL "$name: CUDA sees ${got//$'\n'/ } (want ${want//$'\n'/ })"; ok=0; }
  else
    want=$(for i in "$@"; do echo "GPU ${NODE[i]#/dev/nvidia}: ${UUID[i]}"; done | sort)
    got=$(sed -n 's/^\(GPU [0-9]*\): .*(UUID: \(GPU-[^)]*\)).*/\1: \2/p' "$out" | sort)
    [ "$want" = "$got" ] || { FAIL "$name: fake nvidia-smi -L lists ${got//$'\n'/ } (want ${want//$'\n'/ })"; ok=0; }
  fi
  grep -qx 'cuda-exit=0' "$out" || { FAIL "$name: cuda-check failed in the container"; ok=0; }
  grep -q "^cuda-check: OK .*libcuda.so.$drv\$" "$out" ||
    { FAIL "$name: the container's libcuda.so.1 is not driver $drv's"; ok=0; }
  if [ $ok = 1 ]; then
    PASS "$name: $(grep -c '^dev /dev/nvidia[0-9]' "$out") GPU node(s), nvidia-smi, cuda-check $(sed -n 's/^cuda-check: OK //p' "$out" | head -1)"
  else
    show "$out"
  fi
}

# gpu_case NAME VALUE INDEX...: a container with NVIDIA_VISIBLE_DEVICES=VALUE through
# gantry-runtime create/start/delete must see exactly GPUs INDEX...
gpu_case() {
  local name=$1 value=$2 id b
  shift 2
  id=e2e-$name b=$WORK/b-$name
  make_bundle "$b" "NVIDIA_VISIBLE_DEVICES=$value" -- /bin/sh -c "$probe"
  if ! run_container "$GANTRY_RUNTIME" "$id" "$b" "$WORK/$name.out"; then
    FAIL "$name: gantry-runtime could not run the container (NVIDIA_VISIBLE_DEVICES=$value)"
    show "$WORK/$name.out"
    return
  fi
  check_gpus "$name (NVIDIA_VISIBLE_DEVICES=$value)" "$WORK/$name.out" "$@"
}

echo "== a: one GPU"
gpu_case a 0 0

echo "== b: the second GPU only"
if [ "$ngpu" -ge 2 ]; then gpu_case b 1 1; else SKIP "b: one GPU on this host"; fi

echo "== c: all GPUs"
gpu_case c all $(seq 0 $((ngpu - 1)))

echo "== d: no GPU requested"
b=$WORK/b-d
make_bundle "$b" -- /bin/sh -c "$probe"
cp "$b/config.json" "$WORK/d.config.json"
if run_container "$GANTRY_RUNTIME" e2e-d "$b" "$WORK/d.out"; then
  ok=1
  cmp -s "$b/config.json" "$WORK/d.config.json" || { FAIL "d: config.json was changed for a container without a GPU request"; ok=0; }
  ! grep -q '^dev /dev/nvidia' "$WORK/d.out" || { FAIL "d: the container has $(sed -n 's/^dev //p' "$WORK/d.out" | tr '\n' ' ')"; ok=0; }
  ! grep -qx 'smi-exit=0' "$WORK/d.out" || { FAIL "d: nvidia-smi ran in a container without a GPU request"; ok=0; }
  if ! grep -qx 'cuda-exit=1' "$WORK/d.out" || ! grep -q 'cuda-check: FAIL: cannot load libcuda.so.1' "$WORK/d.out"; then
    FAIL "d: cuda-check did not fail cleanly with 'cannot load libcuda.so.1'"; ok=0
  fi
  if [ $ok = 1 ]; then PASS "d: untouched container: same config.json, no /dev/nvidia*, no nvidia-smi, no libcuda"; else show "$WORK/d.out"; fi
else
  FAIL "d: gantry-runtime could not run a container without a GPU request"
  show "$WORK/d.out"
fi

echo "== e: a GPU that does not exist"
b=$WORK/b-e
make_bundle "$b" NVIDIA_VISIBLE_DEVICES=99 -- /bin/sh -c "$probe"
cp "$b/config.json" "$WORK/e.config.json"
if "$GANTRY_RUNTIME" --root "$STATE" create --bundle "$b" e2e-e </dev/null >"$WORK/e.out" 2>&1; then
  FAIL "e: create succeeded for NVIDIA_VISIBLE_DEVICES=99"
  show "$WORK/e.out"
else
  ok=1
  "$RUNC" --root "$STATE" list -q | grep -qx e2e-e && { FAIL "e: container e2e-e left behind after the failed create"; ok=0; }
  cmp -s "$b/config.json" "$WORK/e.config.json" || { FAIL "e: config.json changed by the failed create"; ok=0; }
  grep -q 99 "$WORK/e.out" || { FAIL "e: the error does not name the device 99"; ok=0; show "$WORK/e.out"; }
  [ $ok = 1 ] && PASS "e: refused, no container left, config.json untouched: $(head -1 "$WORK/e.out")"
fi

echo "== f: gantry-runtime run (foreground)"
b=$WORK/b-f
make_bundle "$b" NVIDIA_VISIBLE_DEVICES=0 -- /bin/sh -c "$probe"
if "$GANTRY_RUNTIME" --root "$STATE" run --bundle "$b" e2e-f </dev/null >"$WORK/f.out" 2>&1; then
  check_gpus "f (run, NVIDIA_VISIBLE_DEVICES=0)" "$WORK/f.out" 0
else
  FAIL "f: gantry-runtime run failed"
  show "$WORK/f.out"
fi
"$RUNC" --root "$STATE" list -q | grep -qx e2e-f && FAIL "f: run left container e2e-f behind"

echo "== g: Docker's --gpus path: plain runc with the prestart hook (nvidia-container-runtime-hook)"
# Docker's --gpus adds exactly this hook to config.json and runs plain runc; the
# hook enters the container's mount namespace and grants the device cgroup.
HOOK=$WORK/nvidia-container-runtime-hook
ln -sf "$(readlink "$GANTRY_RUNTIME")" "$HOOK"  # the same binary as the runtime
b=$WORK/b-g
make_bundle "$b" NVIDIA_VISIBLE_DEVICES=0 -- /bin/sh -c "$probe"
HOOKS="\"hooks\": {\"prestart\": [{\"path\": \"$HOOK\", \"args\": [\"nvidia-container-runtime-hook\", \"prestart\"], \"env\": [\"GANTRY_CONFIG=$GANTRY_CONFIG\"]}]},"
HOOKS=$HOOKS awk '{ print } /"ociVersion"/ && !done { print ENVIRON["HOOKS"]; done = 1 }' "$b/config.json" >"$b/config.json.new" && mv "$b/config.json.new" "$b/config.json"
if run_container "$RUNC" e2e-g "$b" "$WORK/g.out"; then
  check_gpus "g (prestart hook, NVIDIA_VISIBLE_DEVICES=0)" "$WORK/g.out" 0
else
  FAIL "g: plain runc with the gantry prestart hook failed"
  show "$WORK/g.out"
fi

echo "== h: gantry doctor on a running GPU container"
b=$WORK/b-h
make_bundle "$b" NVIDIA_VISIBLE_DEVICES=0 -- /usr/bin/sleep 300
if "$GANTRY_RUNTIME" --root "$STATE" create --bundle "$b" e2e-h </dev/null >"$WORK/h.out" 2>&1 &&
  "$GANTRY_RUNTIME" --root "$STATE" start e2e-h >>"$WORK/h.out" 2>&1; then
  "$GANTRY" doctor --container e2e-h --runc-root "$STATE" >"$WORK/h.doctor" 2>&1
  req=$(grep '^[A-Z]* container request:' "$WORK/h.doctor")
  acc=$(grep '^[A-Z]* container device access:' "$WORK/h.doctor")
  if [[ $req == PASS* ]] && [[ $acc == PASS* ]]; then
    PASS "h: doctor: ${req#PASS } | ${acc#PASS }"
  else
    FAIL "h: doctor on a healthy GPU container: ${req:-no request check} | ${acc:-no device access check}"
    show "$WORK/h.doctor"
  fi
  "$RUNC" --root "$STATE" delete --force e2e-h >/dev/null 2>&1
else
  FAIL "h: gantry-runtime could not start a long-running GPU container"
  show "$WORK/h.out"
fi

echo "== i: a CDI spec's hooks, an image with a hostile environment (CVE-2025-23266 class)"
# A spec of another kind than Gantry's own (whose names gantry-runtime handles in
# process) goes through the CNCF CDI library into config.json, hooks and all, as
# in Podman, CRI-O, containerd and Docker: runc then runs the spec's
# createContainer hooks from inside the container's mount namespace, before
# pivot_root, in the root filesystem's directory.
PRELOAD=${E2E_PRELOAD:-$REPO/bin/e2e-preload.so}
if [ ! -e "$PRELOAD" ]; then
  SKIP "i: $PRELOAD missing (make gpu-e2e builds it)"
elif ! mkdir -p "$WORK/cdi" || ! "$GANTRY" cdi generate --kind e2e.example.com/gpu --output "$WORK/cdi/e2e.yaml" >"$WORK/i.gen" 2>&1; then
  FAIL "i: gantry cdi generate failed"
  show "$WORK/i.gen"
else
  cfg_i=$WORK/gantry-i.toml
  { cat "$GANTRY_CONFIG"; printf '\n[cdi]\nspec-dirs = ["%s"]\n' "$WORK/cdi"; } >"$cfg_i"
  marker=$WORK/i.marker
  b=$WORK/b-i
  make_bundle "$b" "LD_PRELOAD=/proc/self/cwd/e2e-preload.so" "E2E_MARKER=$marker" \
    "LD_LIBRARY_PATH=/proc/self/cwd" "GCONV_PATH=/proc/self/cwd" "GANTRY_CONFIG=/dev/zero" -- /bin/sh -c "$probe"
  cp "$PRELOAD" "$b/rootfs/e2e-preload.so"
  ANN='"annotations": {"cdi.k8s.io/e2e": "e2e.example.com/gpu=0"},'
  ANN=$ANN awk '{ print } /"ociVersion"/ && !done { print ENVIRON["ANN"]; done = 1 }' "$b/config.json" >"$b/config.json.new" && mv "$b/config.json.new" "$b/config.json"
  if GANTRY_CONFIG=$cfg_i run_container "$GANTRY_RUNTIME" e2e-i "$b" "$WORK/i.out"; then
    hooks=$(grep -o '"createContainer"' "$b/config.json" | wc -l)
    if [ -e "$marker" ]; then
      FAIL "i: the image's LD_PRELOAD library ran on the host in: $(tr '\n' ' ' <"$marker")"
    elif [ "$hooks" -lt 1 ]; then
      FAIL "i: config.json has no createContainer hook: the spec's hooks were not exercised"
    else
      check_gpus "i (CDI e2e.example.com/gpu=0, hostile image env)" "$WORK/i.out" 0
      echo "     | the spec's createContainer hooks ran with their own environment; no preload on the host"
    fi
  else
    FAIL "i: gantry-runtime could not run the container with the CDI device"
    show "$WORK/i.out"
  fi
  [ -e "$marker" ] && [ -s "$marker" ] && show "$marker"
fi

echo "== j: MPS: gantry-device-plugin mps-control-daemon runs nvidia-cuda-mps-control, two containers share GPU 0"
# What Allocate gives an MPS replica (internal/deviceplugin/mps.go; the CI tests
# check that over gRPC): the daemon's pipe directory (read-only) and its /dev/shm mounted,
# CUDA_MPS_PIPE_DIRECTORY, and the replica's memory and thread share. Here the
# real control daemon runs on this host, in a mount namespace of its own whose
# /dev/shm is <root>/shm, as the DaemonSet's pod has it.
DEVICE_PLUGIN=${DEVICE_PLUGIN:-$REPO/bin/gantry-device-plugin}
mps_ctl=$(command -v nvidia-cuda-mps-control || ls "${DRIVER_ROOT:-/}"/usr/bin/nvidia-cuda-mps-control 2>/dev/null)
if [ $mode = sim ]; then
  SKIP "j: MPS needs a real GPU"
elif [ -z "$mps_ctl" ]; then
  SKIP "j: nvidia-cuda-mps-control not found on this host"
elif [ ! -x "$DEVICE_PLUGIN" ]; then
  SKIP "j: $DEVICE_PLUGIN missing (make gpu-e2e builds it)"
elif ! command -v unshare >/dev/null; then
  SKIP "j: unshare (util-linux) not found"
else
  mps_root=$WORK/mps res=nvidia.com/gpu
  mkdir -p "$mps_root/shm"
  printf 'version: v1\nflags: {mpsRoot: %s}\nsharing:\n  mps:\n    resources:\n    - name: %s\n      devices: [0]\n      replicas: 2\n' \
    "$mps_root" "$res" >"$WORK/mps.yaml"
  mode0=$(nvidia-smi -i 0 --query-gpu=compute_mode --format=csv,noheader 2>/dev/null)
  mem0=$(nvidia-smi -i 0 --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  # shellcheck disable=SC2016
  unshare -m --propagation private sh -c 'mount --bind "$1/shm" /dev/shm && shift && exec "$@"' sh "$mps_root" \
    env MPS_CONTROL="$mps_ctl" "$DEVICE_PLUGIN" mps-control-daemon --config "$WORK/mps.yaml" >"$WORK/j.daemon.log" 2>&1 &
  mps_pid=$!
  stop_mps() {
    [ -n "${mps_pid:-}" ] || return 0
    kill -TERM "$mps_pid" 2>/dev/null && wait "$mps_pid" 2>/dev/null
    mps_pid=
    case ${mode0:-} in Default | "") nvidia-smi -i 0 -c DEFAULT >/dev/null 2>&1 ;; esac
  }
  trap 'stop_mps; finish' EXIT
  for _ in $(seq 300); do [ -e "$mps_root/$res/.ready" ] && break; sleep 0.1; done
  if [ ! -e "$mps_root/$res/.ready" ]; then
    FAIL "j: the MPS control daemon did not become ready in 30 s"
    show "$WORK/j.daemon.log"
  else
    limit=$((mem0 / 2))
    echo "     | daemon ready: $(tr '\n' ' ' <"$mps_root/$res/.ready"); GPU 0 memory ${mem0} MiB, limit ${limit} MiB per replica"
    pipe=/mps/$res/pipe
    lo=$((limit * 3 / 4)) hi=$((limit * 5 / 4))
    # mps_bundle NAME [VAR=VALUE...]: a container with one replica that allocates
    # 3/4 of the limit, then 5/4, and holds its context 5 s, so that both
    # clients are connected at once.
    mps_bundle() {
      local b=$WORK/b-$1
      shift
      make_bundle "$b" NVIDIA_VISIBLE_DEVICES=0 "CUDA_MPS_PIPE_DIRECTORY=$pipe" "$@" \
        -- /bin/sh -c "cuda-check --mem $lo,$hi --hold 5; echo \"cuda-exit=\$?\""
      MNT1=$(printf '{"destination": "%s", "type": "bind", "source": "%s", "options": ["rbind", "ro"]}' "$pipe" "$mps_root/$res/pipe") \
        MNT2=$(printf '{"destination": "/dev/shm", "type": "bind", "source": "%s", "options": ["rbind", "rw"]}' "$mps_root/shm") \
        awk '/"mounts": *\[/ { m = 1 } m && /^\t\]/ { print "\t\t," ENVIRON["MNT1"] ", " ENVIRON["MNT2"]; m = 0 } { print }' \
        "$b/config.json" >"$b/config.json.new" && mv "$b/config.json.new" "$b/config.json"
      grep -q "$mps_root/shm" "$b/config.json" || FAIL "j: could not add the MPS mounts to $b/config.json"
    }
    # j1 has Allocate's limits in its environment; j2 only the daemon's defaults
    # (set_default_device_pinned_mem_limit), what replicas of several GPUs get.
    mps_bundle j1 "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=${limit}M" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50
    mps_bundle j2
    run_container "$GANTRY_RUNTIME" e2e-j1 "$WORK/b-j1" "$WORK/j1.out" & p1=$!
    run_container "$GANTRY_RUNTIME" e2e-j2 "$WORK/b-j2" "$WORK/j2.out" & p2=$!
    wait $p1; r1=$?
    wait $p2; r2=$?
    show "$WORK/j1.out"
    show "$WORK/j2.out"
    if [ $r1 != 0 ] || [ $r2 != 0 ]; then
      FAIL "j: gantry-runtime could not run the MPS client containers"
    elif ! grep -qx 'cuda-exit=0' "$WORK/j1.out" || ! grep -qx 'cuda-exit=0' "$WORK/j2.out"; then
      FAIL "j: cuda-check failed in an MPS client container"
    elif ! grep -q "alloc $lo MiB: ok" "$WORK/j1.out" || ! grep -q "alloc $lo MiB: ok" "$WORK/j2.out"; then
      FAIL "j: an allocation under the replica's limit (${lo} of ${limit} MiB) failed"
    elif grep -q "alloc $hi MiB: ok" "$WORK/j1.out"; then
      FAIL "j: with Allocate's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, ${hi} MiB (over the ${limit} MiB limit) was allocated"
    elif grep -q "alloc $hi MiB: ok" "$WORK/j2.out"; then
      FAIL "j: with the daemon's default limit only, ${hi} MiB (over the ${limit} MiB limit) was allocated"
    elif [ ! -s "$mps_root/$res/log/server.log" ]; then
      FAIL "j: no MPS server log: the containers did not go through the daemon"
    else
      PASS "j: two MPS clients on GPU 0 at once, each held to ${limit} MiB ($(sed -n 's/^cuda-check: device 0: \(memory .*\)/\1/p' "$WORK/j1.out" | head -1))"
    fi
    echo "     | control.log:"; tail -8 "$mps_root/$res/log/control.log" 2>/dev/null | sed 's/^/     | /'
  fi
  stop_mps
  if grep -q "MPS control daemon stopped" "$WORK/j.daemon.log"; then
    PASS "j: SIGTERM quit the MPS control daemon"
  else
    FAIL "j: the MPS control daemon was not stopped cleanly"
    show "$WORK/j.daemon.log"
  fi
fi

echo "== k: gantry-runtime's NVML answer through gantry (nvidia-container-cli info)"
ln -sf "$(readlink -f "$GANTRY_RUNTIME")" "$WORK/nvidia-container-cli"
if "$WORK/nvidia-container-cli" info >"$WORK/k.out" 2>&1; then
  got=$(awk '/^GPU UUID:/ {print $3}' "$WORK/k.out" | sort | tr '\n' ' ')
  want=$(printf '%s\n' "${UUID[@]}" | sort | tr '\n' ' ')
  blank=$(grep -cE '^(Brand|Architecture): *$' "$WORK/k.out")
  if [ "$got" = "$want" ] && [ "$blank" = 0 ]; then
    PASS "k: nvidia-container-cli info lists the host's $ngpu GPU(s) with brand and architecture ($(awk '/^Brand:/ {print $2}' "$WORK/k.out" | sort -u | tr '\n' ' '))"
  else
    FAIL "k: nvidia-container-cli info: UUIDs '$got', want '$want'; $blank blank brand or architecture lines"
    show "$WORK/k.out"
  fi
else
  FAIL "k: nvidia-container-cli info failed (gantry-runtime asking gantry for the GPUs)"
  show "$WORK/k.out"
fi

if [ "$DRIVER_LAYOUT" = tree ]; then
  echo "== the driver tree layout (DRIVER_LAYOUT=tree)"
  # Every GPU create above logged which layout it got; a fall back to the
  # per-file layout says why in its notes.
  # (check i's container asks for another vendor's CDI device only: no driver files)
  n=$(grep '"front-end":"gantry-runtime"' "$WORK/gantry.log" | grep '"changed":true' | grep -c '"devices":\[')
  t=$(grep '"front-end":"gantry-runtime"' "$WORK/gantry.log" | grep '"devices":\[' | grep -c '"layout":"tree"')
  sets=$(find "$WORK/trees/.sets" -mindepth 2 -maxdepth 2 -type d 2>/dev/null | wc -l)
  if [ "$n" -gt 0 ] && [ "$t" -eq "$n" ]; then
    PASS "tree layout: all $n GPU creates of gantry-runtime got the driver as one mount ($sets trees, one per set of driver files: $(ls "$WORK/trees/.sets" | head -3 | tr '\n' ' '))"
  else
    FAIL "tree layout: $t of $n GPU creates used it: $(grep -o '"notes":\[[^]]*driver tree[^]]*\]' "$WORK/gantry.log" | sort -u | head -2)"
  fi
  # The containers above ask for the default capabilities (compute,utility):
  # their trees hold no graphics library.
  gl=$(find "$WORK/trees/.sets" \( -name 'libGLX_nvidia*' -o -name 'libEGL_nvidia*' -o -name 'libnvidia-glcore*' \) 2>/dev/null | head -3)
  if [ -z "$gl" ] && [ "$sets" -gt 0 ]; then
    PASS "tree layout: no graphics library in the trees of compute,utility containers"
  else
    FAIL "tree layout: graphics libraries in a compute,utility tree (or no tree at all): ${gl:-$sets trees}"
  fi
fi
# (after the tree checks: this container's capabilities select graphics files)
echo "== l: graphics: the image's EGL (libglvnd) and Vulkan loader find NVIDIA's driver (graphics,compute,utility)"
GFX_CHECK=${GFX_CHECK:-$REPO/bin/gfx-check}
# host_lib NAME: the host's 64-bit NAME, from its loader cache or the
# driver's own folders (a driver installed with libglvnd, GKE's layout), else
# the copy make gpu-e2e took from the build machine (bin/gfxlibs).
host_lib() {
  local p d
  p=$(ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n && /x86-64/ {print $NF; exit}')
  for d in "${DRIVER_ROOT:-}/usr/local/nvidia/lib64" /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 "$REPO/bin/gfxlibs"; do
    [ -n "$p" ] && break
    [ -e "$d/$1" ] && p=$d/$1
  done
  echo "$p"
}
egl=$(host_lib libEGL.so.1)
if [ "$mode" != gpu ]; then
  SKIP "l: needs a GPU host"
elif [ ! -x "$GFX_CHECK" ]; then
  SKIP "l: no $GFX_CHECK (make gpu-e2e builds it)"
elif [ -z "$egl" ]; then
  SKIP "l: no libEGL.so.1 (libglvnd) on this host or in bin/gfxlibs to put in the image"
else
  b=$WORK/b-l
  make_bundle "$b" NVIDIA_VISIBLE_DEVICES=0 NVIDIA_DRIVER_CAPABILITIES=graphics,compute,utility VK_LOADER_DEBUG=error -- /usr/bin/gfx-check
  # The image: gfx-check, libglvnd's EGL and the Vulkan loader (when the host
  # has them) in its library folder, with their dependencies; its loader cache.
  ROOTFS=$b/rootfs copy_with_deps "$GFX_CHECK" /usr/bin/gfx-check
  # (NVIDIA's Vulkan ICD, libGLX_nvidia, links libX11 and libXext, which an
  # image with a Vulkan application has.)
  for lib in libEGL.so.1 libGLdispatch.so.0 libvulkan.so.1 libX11.so.6 libXext.so.6; do
    p=$(host_lib $lib)
    [ -n "$p" ] && ROOTFS=$b/rootfs copy_with_deps "$p" "/usr/lib/x86_64-linux-gnu/$lib"
  done
  ldconfig -r "$b/rootfs" 2>/dev/null
  if run_container "$GANTRY_RUNTIME" e2e-l "$b" "$WORK/l.out" && grep -q '^egl vendor=NVIDIA' "$WORK/l.out" &&
    ! grep -q '^vulkan: [^n]' "$WORK/l.out"; then
    PASS "l ($DRIVER_LAYOUT layout): $(grep -h '^egl\|^vulkan' "$WORK/l.out" | paste -sd ';' -)"
  else
    FAIL "l: EGL or Vulkan did not find NVIDIA's driver in a graphics container"
    show "$WORK/l.out"
  fi
fi
echo "== m: the create server (gantry-runtime --create-server): a create, and Docker's --gpus hook"
# The server makes the changes for gantry-runtime's create and does the
# prestart hook's work; each must be logged as the server's ("server":true)
# and give the container GPU 0 as in a and g.
SOCK=$WORK/runtime.sock
"$GANTRY_RUNTIME" --create-server --socket "$SOCK" >"$WORK/m.server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done
if [ ! -S "$SOCK" ]; then
  FAIL "m: the create server did not start"
  show "$WORK/m.server.log"
else
  b=$WORK/b-m1
  make_bundle "$b" NVIDIA_VISIBLE_DEVICES=0 -- /bin/sh -c "$probe"
  if GANTRY_RUNTIME_SOCKET=$SOCK run_container "$GANTRY_RUNTIME" e2e-m1 "$b" "$WORK/m1.out"; then
    if grep '"container":"e2e-m1"' "$WORK/gantry.log" | grep -q '"server":true'; then
      check_gpus "m1 (create by the server, NVIDIA_VISIBLE_DEVICES=0)" "$WORK/m1.out" 0
    else
      FAIL "m1: the create was not made by the server (no \"server\":true record for e2e-m1)"
      show "$WORK/m.server.log"
    fi
  else
    FAIL "m1: gantry-runtime with the create server could not run the container"
    show "$WORK/m1.out"
  fi
  b=$WORK/b-m2
  make_bundle "$b" NVIDIA_VISIBLE_DEVICES=0 -- /bin/sh -c "$probe"
  HOOKS="\"hooks\": {\"prestart\": [{\"path\": \"$HOOK\", \"args\": [\"nvidia-container-runtime-hook\", \"prestart\"], \"env\": [\"GANTRY_CONFIG=$GANTRY_CONFIG\", \"GANTRY_RUNTIME_SOCKET=$SOCK\"]}]},"
  HOOKS=$HOOKS awk '{ print } /"ociVersion"/ && !done { print ENVIRON["HOOKS"]; done = 1 }' "$b/config.json" >"$b/config.json.new" && mv "$b/config.json.new" "$b/config.json"
  if run_container "$RUNC" e2e-m2 "$b" "$WORK/m2.out"; then
    if grep '"container":"e2e-m2"' "$WORK/gantry.log" | grep '"front-end":"gantry-hook"' | grep -q '"server":true'; then
      check_gpus "m2 (prestart hook by the server, NVIDIA_VISIBLE_DEVICES=0)" "$WORK/m2.out" 0
    else
      FAIL "m2: the hook's work was not done by the server (no \"server\":true hook record for e2e-m2)"
      show "$WORK/m.server.log"
    fi
  else
    FAIL "m2: plain runc with the prestart hook and the create server failed"
    show "$WORK/m2.out"
  fi
  kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=
fi
echo "== n: checkpoint and restore of a PyTorch container mid-computation"
# bench/gpu-checkpoint.sh through gantry-runtime (CUDA checkpoint, runc and CRIU)
# beside the manual sequence, 1 GiB of GPU memory; it checks every step's value.
torch_py=${PYTHON:-/opt/torch/.venv/bin/python3}
if [ $mode = sim ]; then
  SKIP "n: simulated GPUs (the CUDA steps run against the fake driver in internal/shim's TestCheckpointRestoreGPUContainer)"
elif ! command -v criu >/dev/null; then
  SKIP "n: no criu (scripts/install-criu.sh installs CRIU 4.x)"
elif ! "$torch_py" -c 'import torch' 2>/dev/null; then
  SKIP "n: no python with torch at $torch_py (set PYTHON)"
elif BIN=$(dirname "$GANTRY") RUNC=$RUNC PYTHON=$torch_py "$REPO/bench/gpu-checkpoint.sh" 1 >"$WORK/n.out" 2>&1; then
  PASS "n: $(grep -c '^PASS' "$WORK/n.out") checks: $(grep '^gantry ' "$WORK/n.out" | head -1 | tr -s ' ')"
else
  FAIL "n: bench/gpu-checkpoint.sh 1 failed"
  grep -E '^(FAIL|PASS|gantry|manual)' "$WORK/n.out" | sed 's/^/     | /'
fi

echo "== o: NCCL all-reduce and DDP across GPUs in one container (all, subset by index, by UUID)"
# bench/gpu-nccl.sh: host beside container in the same run; NVLink multicast off.
if [ $mode = sim ]; then
  SKIP "o: simulated GPUs (NCCL needs real ones)"
elif [ "$ngpu" -lt 2 ]; then
  SKIP "o: $ngpu GPU on this host (NCCL across GPUs needs 2 or more)"
elif ! "$torch_py" -c 'import torch' 2>/dev/null; then
  SKIP "o: no python with torch at $torch_py (set PYTHON)"
else
  BIN=$(dirname "$GANTRY") RUNC=$RUNC PYTHON=$torch_py "$REPO/bench/gpu-nccl.sh" >"$WORK/o.out" 2>&1
  o_rc=$?
fi
if [ -z "${o_rc:-}" ]; then
  :
elif [ "$o_rc" = 2 ]; then
  SKIP "o: bench/gpu-nccl.sh cannot run here: $(sed -n 's/^error: //p' "$WORK/o.out" | head -1)"
elif [ "$o_rc" = 0 ]; then
  PASS "o: $(grep -c '^PASS' "$WORK/o.out") checks; busbw GB/s host-all $(awk '$1 == "host-all" {print $7}' "$WORK/o.out"), container-all $(awk '$1 == "ct-all" {print $7}' "$WORK/o.out")"
  sed -n '/^== figures/,/^== [0-9]* failure/p' "$WORK/o.out" | sed 's/^/     | /'
else
  FAIL "o: bench/gpu-nccl.sh failed"
  grep -E '^(FAIL|PASS|error)' "$WORK/o.out" | sed 's/^/     | /'
  sed -n '/^== figures/,/^== [0-9]* failure/p' "$WORK/o.out" | sed 's/^/     | /'
fi

echo "== summary: $pass passed, $fail failed, $skip skipped ($mode mode, $ngpu GPUs)"
if [ $fail -gt 0 ] && [ -s "$WORK/gantry.log" ]; then
  echo "== gantry.log (last 20 lines)"
  tail -20 "$WORK/gantry.log"
fi
[ $fail -eq 0 ]
