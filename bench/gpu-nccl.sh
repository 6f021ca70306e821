#!/usr/bin/env bash
# PyTorch torch.distributed with NCCL, one process per GPU (torchrun --standalone),
# inside ONE gantry-runtime container given all GPUs, one given a subset by index
# and one given a subset by UUID, each beside the same program on the host (all
# GPUs, and CUDA_VISIBLE_DEVICES=the subset) in the same run.
# On a multi-GPU host (2+ GPUs), as root, from the repository with bin/ from
# `make gpu-e2e`:
#   bench/gpu-nccl.sh [--keep]
# Per run: all-reduce correctness (exact integer sums, two sizes), all-reduce
# bus bandwidth (SIZE_MIB float32, default 256, 20 timed iterations after 5
# warmup; busbw = bytes * 2(n-1)/n / time), a DDP training step time (an MLP,
# 20 timed steps after 5 warmup; the ranks' weights must agree afterwards),
# and the NCCL transports from NCCL_DEBUG=INFO (P2P expected, P2P over NVLink
# where NCCL's graph says NVL; NVLS must be off). Each container's
# nvidia-smi -L (the driver Gantry injected) must list exactly the requested
# UUIDs.
# The containers: a bundle whose root binds the host's /usr and /opt/torch
# read-only, with the host's driver whited out: every driver file under /usr
# outside /usr/local/nvidia (libcuda*, libnvidia-*, nvidia-* programs) is a
# masked path, and /usr/local/nvidia is covered by the tree Gantry binds there
# (driver-layout tree; a container without its own mount at /usr/local/nvidia
# fails the check). The host's network namespace (torchrun's rendezvous on
# localhost), a private IPC and PID namespace, /dev/shm a 2 GiB tmpfs.
# NVLink multicast stays off everywhere: NCCL_NVLS_ENABLE=0,
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 in the host
# runs and in every container's environment; the program refuses to start
# without them.
# Two more containers take the other roads into a container: plain runc with
# Gantry as Docker's --gpus prestart hook (nvidia-container-runtime-hook,
# NVIDIA_VISIBLE_DEVICES=all, as `docker run --gpus all` writes it), and a CDI
# spec from `gantry cdi generate` (kind e2e.example.com/gpu, the UUID subset
# named in a cdi.k8s.io annotation, applied by gantry-runtime through the
# CNCF CDI library as CDI engines do), where an empty tmpfs covers the host's
# /usr/local/nvidia so the driver can only come from the spec's mounts. Those
# two write into the image's /usr (the hook's links, the spec's mount points),
# so their /usr is an overlay: the host's /usr below, a tmpfs above, each host
# driver file a whiteout in it (the host's /usr is never written).
# Environment: BIN (gantry, gantry-runtime, runc; default bin/), RUNC (default
# BIN/runc, else runc in PATH), PYTHON (a python with torch, default
# /opt/torch/.venv/bin/python3), SIZE_MIB, SUBSET_INDEX (default: 1,3 with 4+
# GPUs, 1,2 with 3, 1,0 with 2), SUBSET_UUID (GPU indices whose UUIDs the third
# container asks for; default 2,0 with 3+ GPUs, 1,0 with 2), RUN_TIMEOUT
# (seconds per run, default 120), RUNS (the runs to do, default all: host-all ct-all
# host-idx ct-idx host-uuid ct-uuid ct-hook-all ct-cdi-uuid). Exit 0 when every check passed, 1 on a
# failure, 2 when it cannot start.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
keep=0
for arg; do
  case $arg in
    --keep) keep=1 ;;
    -h | --help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $arg (use --keep)" >&2; exit 2 ;;
  esac
done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MCAST_ENV=(NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1)
BIN=${BIN:-$REPO/bin}
PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3}
RUNC=${RUNC:-$BIN/runc}
[ -x "$RUNC" ] || RUNC=$(command -v runc)
SIZE_MIB=${SIZE_MIB:-256}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
fails=0
PASS() { echo "PASS: $*"; }
FAIL() { echo "FAIL: $*"; fails=$((fails + 1)); }
die() { echo "error: $*" >&2; exit 2; }
show() { sed 's/^/     | /' "$@" | tail -40; }

[ "$(id -u)" = 0 ] || die "run as root (runc needs it)"
[ -x "$BIN/gantry" ] || die "$BIN/gantry missing (make gpu-e2e)"
# The image's /usr is the host's, read-only: the mount point of Gantry's
# driver tree must exist in it.
[ -d /usr/local/nvidia ] || die "no /usr/local/nvidia on this host: the containers bind the host's /usr read-only, and Gantry's driver tree needs that mount point"
[ -n "$RUNC" ] && [ -x "$RUNC" ] || die "no runc (bin/runc from make gpu-e2e, or RUNC)"
# bin/runc links libseccomp.so.2; a copy rides along in bin/lib for hosts without it.
if ldd "$RUNC" 2>/dev/null | grep -q 'not found' && [ -e "$BIN/lib/libseccomp.so.2" ]; then
  export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
"$RUNC" --version >/dev/null || die "$RUNC does not run on this host"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: run on a GPU host"
"$PYTHON" -c 'import torch, torch.distributed' 2>/dev/null || die "no torch in $PYTHON (set PYTHON)"

declare -a UUID
while IFS=', ' read -r idx uuid; do UUID[idx]=$uuid; done < <(nvidia-smi --query-gpu=index,uuid --format=csv,noheader)
ngpu=${#UUID[@]}
# ONE_GPU=1: a smoke run of the container paths on a one-GPU host (one rank)
[ "$ngpu" -ge 2 ] || [ "${ONE_GPU:-0}" = 1 ] || die "$ngpu GPU(s): NCCL across GPUs needs 2 or more (ONE_GPU=1 for a one-rank smoke run)"
case $ngpu in
  1) SUBSET_INDEX=${SUBSET_INDEX:-0} SUBSET_UUID=${SUBSET_UUID:-0} ;;
  2) SUBSET_INDEX=${SUBSET_INDEX:-1,0} SUBSET_UUID=${SUBSET_UUID:-1,0} ;;
  3) SUBSET_INDEX=${SUBSET_INDEX:-1,2} SUBSET_UUID=${SUBSET_UUID:-2,0} ;;
  *) SUBSET_INDEX=${SUBSET_INDEX:-1,3} SUBSET_UUID=${SUBSET_UUID:-2,0} ;;
esac
all_idx=$(seq -s, 0 $((ngpu - 1)))
uuid_list=
for i in ${SUBSET_UUID//,/ }; do
  [ -n "${UUID[i]:-}" ] || die "SUBSET_UUID=$SUBSET_UUID: no GPU $i"
  uuid_list+=${uuid_list:+,}${UUID[i]}
done
for i in ${SUBSET_INDEX//,/ }; do [ -n "${UUID[i]:-}" ] || die "SUBSET_INDEX=$SUBSET_INDEX: no GPU $i"; done

WORK=$(mktemp -d /tmp/gantry-nccl.XXXXXX)
STATE=$WORK/state
finish() {
  local id
  for id in $("$RUNC" --root "$STATE" list -q 2>/dev/null); do "$RUNC" --root "$STATE" delete --force "$id" >/dev/null 2>&1; done
  # the hook and CDI runs' overlays (a run cut short)
  for id in "$WORK"/b-*/usr-overlay; do [ -f "$id" ] && { umount "${id%/*}/rootfs/usr"; umount "${id%/*}/ovl"; } 2>/dev/null; done
  if [ $keep = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap finish EXIT
mkdir -p "$STATE" "$WORK/cache" "$WORK/prog"
# the lean per-container binary when built, else gantry itself (by this name)
if [ -x "$BIN/gantry-runtime" ]; then ln -sf "$BIN/gantry-runtime" "$WORK/gantry-runtime"; else ln -sf "$BIN/gantry" "$WORK/gantry-runtime"; fi
RT=$WORK/gantry-runtime
export GANTRY_CONFIG=$WORK/gantry.toml
cat >"$GANTRY_CONFIG" <<EOF
gpus = "nvml"
driver-root = "${DRIVER_ROOT:-/}"

[runtime]
low-level = "$RUNC"
cache-dir = "$WORK/cache"
log-file = "$WORK/gantry.log"
driver-layout = "tree"
driver-tree-dir = "$WORK/trees"
EOF

echo "== $ngpu GPU(s): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sort -u | tr '\n' ' ')"
echo "== host: $(nproc) CPUs, kernel $(uname -r), torch $("$PYTHON" -c 'import torch; v = torch.cuda.nccl.version(); print(torch.__version__, "nccl", ".".join(map(str, v)) if isinstance(v, tuple) else v)' 2>&1 | tail -1)"
echo "== nvidia-smi topo -m"
nvidia-smi topo -m 2>&1 | sed 's/^/   /' | head -20

# gantry info --json against nvidia-smi topo -m: per GPU pair the link type
# and count (NV# = # NVLinks, through NVSwitch on these hosts), and each GPU's
# CPU and NUMA affinity columns.
nvidia-smi topo -m >"$WORK/topo.txt" 2>&1
if "$BIN/gantry" info --gpus nvml --json >"$WORK/info.json" 2>"$WORK/info.err"; then
  "$PYTHON" - "$WORK/topo.txt" "$WORK/info.json" <<'PY' >"$WORK/topo.cmp"
import json, re, sys
rows = [re.sub(r"\x1b\[[0-9;]*m", "", l).rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
head = [c.strip() for c in rows[0]]
info = json.load(open(sys.argv[2]))["devices"]
gpus = [c for c in head if re.fullmatch(r"GPU\d+", c)]
uuid = {d["index"]: d["uuid"] for d in info}
col = {c: i for i, c in enumerate(head)}
bad = 0
for r in rows[1:]:
    name = r[0].strip()
    if not re.fullmatch(r"GPU\d+", name):
        continue
    i = int(name[3:])
    cells = [c.strip() for c in r[1:]]
    cells = dict(zip(head[1:] if head[0] == "" else head, cells)) if len(cells) >= len(head) - 1 else {}
    g = next(d for d in info if d["index"] == i)
    links = sum(l.get("links", 0) for l in g.get("nvlinks") or [])
    sw = any(l.get("switch") for l in g.get("nvlinks") or [])
    for o in gpus:
        if o == name:
            continue
        t = cells.get(o, "?")
        m = re.fullmatch(r"NV(\d+)", t)
        if m:
            ok = sw and links == int(m.group(1)) or sum(l.get("links", 0) for l in g.get("nvlinks") or [] if l.get("peerUUID") == uuid[int(o[3:])]) == int(m.group(1))
        else:
            ok = links == 0
        bad += not ok
        print(f"{'OK ' if ok else 'BAD'} {name}-{o}: topo {t}; gantry nvlinks {g.get('nvlinks')}")
    for key, k in (("CPU Affinity", "cpuAffinity"), ("NUMA Affinity", "numaAffinity")):
        t = cells.get(key, "?")
        v = g.get(k, "")
        ok = t == v or (t == "N/A" and v == "")
        bad += not ok
        print(f"{'OK ' if ok else 'BAD'} {name} {key}: topo {t}; gantry {k} {v!r} (numaNode {g.get('numaNode')})")
print(f"MISMATCHES {bad}")
PY
  sed 's/^/     | /' "$WORK/topo.cmp"
  if grep -q '^MISMATCHES 0$' "$WORK/topo.cmp"; then PASS "gantry info agrees with nvidia-smi topo -m: links per pair, CPU and NUMA affinity"
  else FAIL "gantry info and nvidia-smi topo -m differ: $(grep -c '^BAD' "$WORK/topo.cmp") cell(s)"; fi
else
  FAIL "gantry info --json: $(tail -2 "$WORK/info.err")"
fi

# The program (bench/gpu-nccl.py, also what test/cluster's TestNCCLPodTwoGPUs
# runs in a pod): every rank checks the multicast switches, then all-reduce
# correctness, bandwidth and DDP; rank 0 prints one RESULT line.
cp "$REPO/bench/gpu-nccl.py" "$WORK/prog/nccl.py" || die "cannot copy bench/gpu-nccl.py"

# The command every run executes: nvidia-smi -L, then torchrun with one process per GPU.
# (torchrun's --standalone rendezvous: localhost, a free port.)
torchrun_cmd() { # NPROC
  echo "\"$PYTHON\" -m torch.distributed.run --standalone --nproc_per_node=$1 /work/nccl.py"
}
run_env=(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,GRAPH OMP_NUM_THREADS=4 "SIZE_MIB=$SIZE_MIB")

# host_run NAME VISIBLE: the program on the host, CUDA_VISIBLE_DEVICES=VISIBLE.
host_run() {
  local name=$1 vis=$2 n
  n=$(tr ',' '\n' <<<"$vis" | wc -l)
  echo "== $name: host, CUDA_VISIBLE_DEVICES=$vis, $n processes"
  (cd "$WORK/prog" && env "${MCAST_ENV[@]}" "${run_env[@]}" CUDA_VISIBLE_DEVICES="$vis" HOME="$WORK" \
    timeout "$RUN_TIMEOUT" "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$n" "$WORK/prog/nccl.py") >"$WORK/$name.out" 2>&1
  echo "rc=$?" >>"$WORK/$name.out"
}

# make_bundle DIR VISIBLE NPROC: the container's bundle, the driver whited out.
make_bundle() {
  local d=$1
  # usr/lib and the rest exist for what gantry-runtime links into the root at
  # the create, before runc binds the host's /usr over them (lib -> usr/lib)
  mkdir -p "$d/rootfs"/{proc,sys,dev,tmp,etc,usr/lib,usr/lib64,usr/bin,usr/sbin,opt/torch,work,root}
  for l in bin sbin lib lib64; do ln -s usr/$l "$d/rootfs/$l"; done
  if [ "${MODE:-}" = hook ] || [ "${MODE:-}" = cdi ]; then
    # The hook links programs into /usr/bin and the driver's firmware into
    # /lib/firmware, and a CDI spec mounts files under /usr/share: the image's
    # /usr must be writable, as an image's is. So /usr is an overlay here, the
    # host's /usr below and a tmpfs above (the host's /usr is never written),
    # with every host driver file whited out (an image without the driver),
    # mounted before the create instead of runc's read-only bind.
    mkdir -p "$d/ovl" && mount -t tmpfs -o mode=755 tmpfs "$d/ovl" && mkdir -p "$d/ovl/upper" "$d/ovl/work" ||
      die "could not mount a tmpfs at $d/ovl for the overlay's upper layer"
    local m rel
    while read -r m; do
      rel=${m#/usr/}
      mkdir -p "$d/ovl/upper/$(dirname "$rel")" && mknod "$d/ovl/upper/$rel" c 0 0 || die "could not white out $m"
    done <"$WORK/masks"
    mount -t overlay overlay -o "lowerdir=/usr,upperdir=$d/ovl/upper,workdir=$d/ovl/work" "$d/rootfs/usr" ||
      die "could not mount an overlay of the host's /usr at $d/rootfs/usr (the hook and CDI runs need a writable /usr)"
    echo overlay >"$d/usr-overlay"
  fi
  cp /etc/ld.so.cache "$d/rootfs/etc/" 2>/dev/null
  cp -r /etc/ld.so.conf /etc/ld.so.conf.d "$d/rootfs/etc/" 2>/dev/null
  printf 'root:x:0:0:root:/root:/bin/sh\n' >"$d/rootfs/etc/passwd"
  printf 'root:x:0:\n' >"$d/rootfs/etc/group"
  # runc's spec names the container's host "runc": torchrun --standalone
  # resolves its own host name for the rendezvous
  printf '127.0.0.1 localhost runc\n::1 localhost runc\n' >"$d/rootfs/etc/hosts"
  cp /etc/resolv.conf "$d/rootfs/etc/" 2>/dev/null
  "$RUNC" spec --bundle "$d" || die "runc spec failed"
  "$PYTHON" - "$d" "$2" "$WORK" "$3" "$PYTHON" "${MCAST_ENV[@]}" "${run_env[@]}" <<'PY' 3<"$WORK/masks"
import json, os, sys
d, vis, work, nproc, py, *envs = sys.argv[1:]
masks = [l.strip() for l in os.fdopen(3) if l.strip()]
p = d + "/config.json"
s = json.load(open(p))
pr = s["process"]
pr["terminal"] = False
pr["cwd"] = "/work"
pr["args"] = ["/bin/sh", "-c",
    'echo "ns-net=$(readlink /proc/self/ns/net)"; grep " /usr/local/nvidia " /proc/self/mountinfo | sed "s/^/mnt: /"; '
    # a host driver file at its path: masked (a bind of /dev/null, empty) or,
    # under the overlay, a whiteout; what is there now is Gantry's (a link into
    # its tree at /usr/local/nvidia, or a mount the hook or spec made)
    'for f in $MASKS; do [ -s "$f" ] || continue; case "$(readlink "$f")" in /usr/local/nvidia/*) continue;; esac; '
    'grep -q " $f " /proc/self/mountinfo && continue; echo "visible: $f"; done; '
    'command -v nvidia-smi; nvidia-smi -L 2>&1; echo "smi-exit=$?"; '
    f'"{py}" -m torch.distributed.run --standalone --nproc_per_node={nproc} /work/nccl.py; echo "rc=$?"']
mode = os.environ.get("MODE", "runtime")
pr["env"] = ["PATH=/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root", "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
    "MASKS=" + " ".join(masks)] + envs
if mode != "cdi":
    pr["env"].append("NVIDIA_VISIBLE_DEVICES=" + vis)
# as many open files as this host allows (runc may not raise the hard limit)
import resource
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
pr["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": hard, "soft": hard}]
s["root"] = {"path": "rootfs", "readonly": False}
# The host's network (torchrun's rendezvous on localhost); the rest private.
s["linux"]["namespaces"] = [n for n in s["linux"]["namespaces"] if n["type"] != "network"]
# /dev/shm big enough for NCCL's buffers (runc's template gives 64 MiB).
s["mounts"] = [m for m in s["mounts"] if m["destination"] != "/dev/shm"]
s["mounts"].append({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                    "options": ["nosuid", "nodev", "mode=1777", "size=2g"]})
binds = [("/opt/torch", "/opt/torch", "ro"), (work + "/prog", "/work", "ro")]
if not os.path.exists(d + "/usr-overlay"):
    binds.insert(0, ("/usr", "/usr", "ro"))
for src, dst, opt in binds:
    s["mounts"].append({"destination": dst, "type": "bind", "source": src, "options": ["rbind", opt]})
if mode == "hook":
    # what `docker run --gpus` adds to config.json (dockerd then runs plain runc)
    s["hooks"] = {"prestart": [{"path": os.environ["HOOK"], "args": ["nvidia-container-runtime-hook", "prestart"],
                                "env": ["GANTRY_CONFIG=" + os.environ["GANTRY_CONFIG"]]}]}
if mode == "cdi":
    # the host's driver under /usr/local/nvidia hidden: only the spec's mounts bring one
    s["mounts"].append({"destination": "/usr/local/nvidia", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=755"]})
    s["annotations"] = {"cdi.k8s.io/nccl": ",".join("e2e.example.com/gpu=" + v for v in vis.split(","))}
# The host's driver files under /usr (outside /usr/local/nvidia, which Gantry's
# tree covers) masked: the driver can only come from Gantry.
# (Under the overlay they are whiteouts already, and a mask would cover what
# the hook or the spec puts there.)
if not os.path.exists(d + "/usr-overlay"):
    s["linux"]["maskedPaths"] = s["linux"].get("maskedPaths", []) + masks
json.dump(s, open(p, "w"), indent=1)
PY
}

# ct_run NAME VISIBLE NPROC: the program in one gantry-runtime container (foreground run).
# runs NAME: whether RUNS asks for run NAME.
runs() { [ -z "${RUNS:-}" ] || [[ " $RUNS " == *" $1 "* ]]; }

ct_run() {
  local name=$1 vis=$2 n=$3 b=$WORK/b-$1
  echo "== $name: container, NVIDIA_VISIBLE_DEVICES=$vis, $n processes"
  make_bundle "$b" "$vis" "$n" >"$WORK/$name.bundle" 2>&1 || { cat "$WORK/$name.bundle"; die "could not write the bundle $b"; }
  local rt=$RT
  [ "${MODE:-}" = hook ] && rt=$RUNC
  timeout "$RUN_TIMEOUT" "$rt" --root "$STATE" run --bundle "$b" "nccl-$name" </dev/null >"$WORK/$name.out" 2>&1
  echo "runtime-rc=$?" >>"$WORK/$name.out"
  "$RUNC" --root "$STATE" delete --force "nccl-$name" >/dev/null 2>&1
  if [ -f "$b/usr-overlay" ]; then umount "$b/rootfs/usr"; umount "$b/ovl"; fi
}

# The host's driver files under /usr, outside /usr/local/nvidia: masked in every container.
# (libraries up to three folders below the library folders: Debian's
# x86_64-linux-gnu/nvidia/current/ and the like, a file four levels down)
{
  find /usr/bin /usr/sbin /usr/local/bin -maxdepth 1 -type f -name 'nvidia-*' 2>/dev/null
  find /usr/lib /usr/lib64 /usr/lib32 /usr/local/lib -maxdepth 4 -type f \
  \( -name 'libcuda.so*' -o -name 'libcudadebugger.so*' -o -name 'libnvidia-*.so*' -o -name 'libnvcuvid.so*' \
  -o -name 'libnvoptix.so*' -o -name 'nvidia-smi' -o -name 'nvidia-debugdump' -o -name 'nvidia-persistenced' \
  \) 2>/dev/null
} | sort -u >"$WORK/masks"
echo "== host driver files under /usr masked in the containers: $(wc -l <"$WORK/masks") ($(head -3 "$WORK/masks" | tr '\n' ' ')...)"

rows=()
# report NAME KIND GPUS [WANT_UUIDS]: checks and a table row for one run.
report() {
  local name=$1 kind=$2 gpus=$3 want=${4:-} out=$WORK/$1.out r got tr nvl nvls
  r=$(grep -m1 '^RESULT ' "$out")
  if [ -z "$r" ]; then
    FAIL "$name: no result (the run failed)"; show "$out"
    rows+=("$(printf '%-16s %-9s %-40s %s' "$name" "$kind" "$gpus" "failed")"); return
  fi
  val() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$r"; }
  grep -qx 'rc=0' "$out" || FAIL "$name: torchrun exited $(sed -n 's/^rc=//p' "$out" | tail -1)"
  grep -q '^runtime-rc=[1-9]' "$out" && FAIL "$name: gantry-runtime run exited $(sed -n 's/^runtime-rc=//p' "$out")"
  if [ "$(val allreduce_ok)" = 1 ]; then PASS "$name: all-reduce sums exact on $(val world) ranks"; else FAIL "$name: all-reduce gave wrong sums"; fi
  if [ "$(val ddp_same)" = 1 ]; then PASS "$name: DDP ranks' weights agree after the steps"; else FAIL "$name: DDP ranks' weights differ"; fi
  # NCCL's transports: "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"
  tr=$(grep -o ' via [A-Za-z0-9/_]*' "$out" | sed 's/^ via //' | sort | uniq -c | awk '{printf "%s%s x%s", s, $2, $1; s=", "}')
  nvl=$(grep -o 'type [A-Z]*/[A-Z]*' "$out" | sort -u | tr '\n' ' ')
  nvls=$(grep -c 'via NVLS\|Connected NVLS\|NVLS multicast support is available' "$out")
  local seen="NCCL logged NCCL_NVLS_ENABLE=0 from the environment"
  grep -q 'NCCL_NVLS_ENABLE set by environment to 0' "$out" || seen="NCCL did not log NCCL_NVLS_ENABLE (older NCCL?)"
  if [ "$nvls" != 0 ]; then FAIL "$name: NVLS in use or available: $(grep -m2 'NVLS' "$out" | tr '\n' ' ')"
  else PASS "$name: NVLS off: no NVLS channel; $seen"; fi
  if [ "$ngpu" = 1 ]; then echo "     | one GPU: no transport between ranks to judge"
  else case $tr in *P2P*) PASS "$name: transport $tr; graph ${nvl:-?}" ;; *) FAIL "$name: transport '${tr:-none logged}', not P2P; graph ${nvl:-?}" ;; esac; fi
  grep -m4 ' via \| type [A-Z]*/' "$out" | sed 's/^/     | /'
  if [ -n "$want" ]; then
    got=$(sed -n 's/^GPU [0-9]*:.*(UUID: \(GPU-[^)]*\)).*/\1/p' "$out" | sort | tr '\n' ' ')
    local w
    w=$(tr ',' '\n' <<<"$want" | sort | tr '\n' ' ')
    if [ "$got" = "$w" ]; then PASS "$name: nvidia-smi -L in the container lists exactly $got"
    else FAIL "$name: nvidia-smi -L in the container lists '$got', want '$w' ($(sed -n 's/^smi-exit=//p' "$out" | sed 's/^/exit /'): $(grep -v '^\(ns-net=\|mnt: \|visible: \)' "$out" | sed -n '1,/^smi-exit=/p' | head -4 | tr '\n' ' ')"; fi
    echo "     | torch.cuda in the container: $(sed -n 's/^TORCH-GPUS //p' "$out" | head -1)"
    if [ "$(sed -n 's/^ns-net=//p' "$out")" = "$(readlink /proc/self/ns/net)" ]; then
      echo "     | network: the host's namespace (torchrun's rendezvous on localhost)"
    else
      echo "     | network: a namespace of its own: $(sed -n 's/^ns-net=//p' "$out")"
    fi
    # the whiteout: Gantry's own mount at /usr/local/nvidia, no host driver file visible
    # (mountinfo after "mnt: ": id, parent, dev, root, mount point; the last line is the top mount)
    local top
    top=$(awk '/^mnt: /{r = $5} END {print r}' "$out")
    if [ "${5:-}" = cdi ]; then
      if grep -q '^visible: ' "$out"; then FAIL "$name: host driver files visible in the container: $(grep '^visible: ' "$out" | head -3 | tr '\n' ' ')"
      elif [ "$(awk '/^mnt: /{for (i = 1; i <= NF; i++) if ($i == "-") t = $(i + 1)} END {print t}' "$out")" != tmpfs ]; then FAIL "$name: no empty tmpfs over /usr/local/nvidia: the host's driver may be visible"
      else PASS "$name: driver whited out: a tmpfs over /usr/local/nvidia, the driver only from the CDI spec's mounts under it, $(wc -l <"$WORK/masks") host files masked"; fi
    elif [[ $top != *.sets/* ]]; then FAIL "$name: the mount at /usr/local/nvidia is not Gantry's tree (root '${top:-none}'): the host's driver is visible"
    elif grep -q '^visible: ' "$out"; then FAIL "$name: host driver files visible in the container: $(grep '^visible: ' "$out" | head -3 | tr '\n' ' ')"
    else PASS "$name: driver whited out: only Gantry's tree at /usr/local/nvidia (${top#*/trees/}), $(wc -l <"$WORK/masks") host files masked"; fi
  fi
  rows+=("$(printf '%-16s %-9s %-40s %5s %9s %9s %9s %9s  %s' "$name" "$kind" "$gpus" "$(val world)" "$(val time_ms)" "$(val algbw)" "$(val busbw)" "$(val ddp_step_ms)" "$tr")")
}

t0=$(date +%s)
if runs host-all; then
  host_run host-all "$all_idx"
  report host-all host "$all_idx"
fi
if runs ct-all; then
  ct_run ct-all all "$ngpu"
  report ct-all container "all" "$(printf '%s\n' "${UUID[@]}" | paste -sd,)"
fi
n_idx=$(tr ',' '\n' <<<"$SUBSET_INDEX" | wc -l)
if runs host-idx; then
  host_run host-idx "$SUBSET_INDEX"
  report host-idx host "$SUBSET_INDEX"
fi
want=
for i in ${SUBSET_INDEX//,/ }; do want+=${want:+,}${UUID[i]}; done
if runs ct-idx; then
  ct_run ct-idx "$SUBSET_INDEX" "$n_idx"
  report ct-idx container "$SUBSET_INDEX" "$want"
fi
n_uuid=$(tr ',' '\n' <<<"$uuid_list" | wc -l)
if runs host-uuid; then
  host_run host-uuid "$uuid_list"
  report host-uuid host "UUIDs of $SUBSET_UUID"
fi
if runs ct-uuid; then
  ct_run ct-uuid "$uuid_list" "$n_uuid"
  report ct-uuid container "UUIDs of $SUBSET_UUID" "$uuid_list"
fi

# Docker's --gpus road: plain runc, Gantry as the prestart hook
HOOK=$WORK/nvidia-container-runtime-hook
ln -sf "$(readlink -f "$RT")" "$HOOK"
if runs ct-hook-all; then
  MODE=hook HOOK=$HOOK ct_run ct-hook-all all "$ngpu"
  report ct-hook-all hook "all (--gpus all)" "$(printf '%s\n' "${UUID[@]}" | paste -sd,)"
fi
# The CDI road: a spec of another kind, applied through the CDI library
mkdir -p "$WORK/cdi"
if ! runs ct-cdi-uuid; then
  :
elif "$BIN/gantry" cdi generate --kind e2e.example.com/gpu --output "$WORK/cdi/e2e.yaml" >"$WORK/cdi.gen" 2>&1; then
  printf '\n[cdi]\nspec-dirs = ["%s"]\n' "$WORK/cdi" >>"$GANTRY_CONFIG"
  MODE=cdi ct_run ct-cdi-uuid "$uuid_list" "$n_uuid"
  report ct-cdi-uuid cdi "UUIDs of $SUBSET_UUID" "$uuid_list" cdi
else
  FAIL "ct-cdi-uuid: gantry cdi generate failed: $(tail -3 "$WORK/cdi.gen")"
fi

echo "== layout: $(grep -o '"layout":"[a-z]*"' "$WORK/gantry.log" 2>/dev/null | sort | uniq -c | tr -s ' ' | tr '\n' ' ')"
echo "== figures ($SIZE_MIB MiB float32 all-reduce, 20 iterations after 5 warmup; DDP: MLP 4x4096 + 1000, batch 256 per rank; $(($(date +%s) - t0)) s in all)"
printf '%-16s %-9s %-40s %5s %9s %9s %9s %9s  %s\n' run where GPUs ranks 'ar ms' 'algbw' 'busbw' 'ddp ms' 'NCCL transports'
printf '%s\n' "${rows[@]}"
echo "== $fails failure(s); scratch $WORK"
[ $fails = 0 ]
