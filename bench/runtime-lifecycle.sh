#!/usr/bin/env bash
# Container lifecycle cost of gantry-runtime against plain runc: create, start,
# wait for exit, delete of a trivial container (/bin/true), the sequence an
# engine drives, timed end to end from this script.
#
#   bench/runtime-lifecycle.sh [--sim] [--runs N] [--cpus LIST] [--split] [--trace] [--no-server]
#   (root; bin/ from `make gpu-e2e`)
#
# Variants, interleaved round by round (order rotated each round, after 3 untimed
# warm-up rounds that also fill gantry's inventory cache):
#   runc          plain runc
#   gantry-none   gantry-runtime, no GPU requested (config.json left alone)
#   gantry-all    gantry-runtime, NVIDIA_VISIBLE_DEVICES=all, runtime.driver-layout = "files"
#                 (a mount per driver file, NVIDIA's layout)
#   gantry-tree   gantry-runtime, NVIDIA_VISIBLE_DEVICES=all, runtime.driver-layout = "tree"
#                 (the default: the driver as one mount of its tree)
#   server-all, server-tree  gantry-all and gantry-tree with gantry-runtime's create
#                 server running (gantry-runtime --create-server, started by this
#                 script on a socket of its own; make install enables it on a systemd
#                 host); --no-server leaves out the server variants; every other
#                 variant is given a socket that does not exist
#   hook-server   hook-tree's bundle (Docker's --gpus path, default layout) with
#                 the hook's work done by the create server
#   hook-all      plain runc with Gantry's prestart hook (Docker's --gpus path),
#                 NVIDIA_VISIBLE_DEVICES=all; hook-tree the same in the tree layout
#   runc-tree     plain runc on the bundle gantry-tree hands to runc
#   runc-gpu      plain runc on the bundle gantry-all hands to runc (the GPU container's
#                 mounts and nodes without Gantry): gantry-all - runc-gpu is Gantry's own cost
#   nvidia-all    NVIDIA's runtime, NVIDIA_VISIBLE_DEVICES=all, when NVIDIA_RUNTIME=PATH
#                 is given (it finds runc in PATH: bin/runc is put first); with
#                 NVIDIA_CTK=PATH too, in CDI mode with a spec its nvidia-ctk writes
# Every run starts from a fresh bundle made outside the timed window: its root
# filesystem an overlay mount of the template's, as an engine mounts an image
# (a hard-linked copy where overlayfs cannot be mounted). Reports median, 10%-trimmed mean, p90,
# min, max of the whole lifecycle and the median of each step, in ms; then
# gantry-all minus runc. The timings of a many-core host are bimodal (the
# scheduler moving runc's processes between cores): --cpus LIST pins the whole
# run (this script, the runtimes, the containers) to those CPUs with taskset,
# e.g. --cpus 2-3, and the minimum and trimmed mean show the steady cost.
# --split adds three variants of runc-gpu made by bin/bundlesplit, to tell where
# runc's own time on a GPU bundle goes: runc-nomounts (the GPU bundle less the
# driver mounts Gantry added), runc-nodevs (less the device nodes and their
# cgroup rules) and runc-onemount (the driver mounts replaced by one read-only
# bind of a directory at /usr/local/nvidia).
# --trace: after the rounds, one runc run of the runc and runc-gpu bundles each under
# strace -f -c (bin/strace or strace in PATH): the syscalls' count and time.
# --sim: simulated GPUs (SIM_PROFILE, default h100x8) and a fake driver root, for
# trying it without a GPU (the numbers then say nothing about a GPU host).
#
# Environment: RUNS (default 30), DRIVER_ROOT, NVIDIA_RUNTIME, NVIDIA_CTK, GANTRY, RUNC,
# COMPARE_RUNTIME (another gantry-runtime build: variant compare-all, all GPUs, and
# compare-tree, that build in the tree layout, and runc-cmp-tree, plain runc on the
# bundle compare-tree produced: a before/after of the tree's bundle).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
runs=${RUNS:-30} sim= cpus= split= trace= tree=--tree server=--server
while [ $# -gt 0 ]; do
  case $1 in
    --sim) sim=--sim ;;
    --split) split=--split ;;
    --trace) trace=--trace ;;
    --tree) tree=--tree ;;
    --server) server=--server ;;
    --no-server) server= ;;
    --cpus) cpus=${2:?--cpus needs a CPU list, e.g. 2-3}; shift ;;
    --runs) runs=${2:?--runs needs a number}; shift ;;
    -h | --help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (use --sim, --runs N, --cpus LIST, --split, --trace, --no-server)" >&2; exit 2 ;;
  esac
  shift
done
if [ -n "$cpus" ] && [ -z "${GANTRY_BENCH_PINNED:-}" ]; then
  command -v taskset >/dev/null || { echo "--cpus needs taskset (util-linux)" >&2; exit 2; }
  GANTRY_BENCH_PINNED=$cpus exec taskset -c "$cpus" "$0" $sim $split $trace ${server:---no-server} --runs "$runs" --cpus "$cpus"
fi
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "--runs $runs: need a positive number" >&2; exit 2; }
[[ ${EPOCHREALTIME:-} =~ ^[0-9]+[.,][0-9]{6}$ ]] || { echo "bash 5 or newer needed (EPOCHREALTIME)" >&2; exit 2; }
WORK=$(mktemp -d /tmp/gantry-bench.XXXXXX)
# shellcheck source=scripts/lib/bundle.sh
. "$REPO/scripts/lib/bundle.sh"
SERVER_PID=
# unmount_bundles: the overlay root filesystems of this run's bundles.
unmount_bundles() {
  local m
  for m in "$WORK"/b-*/rootfs "$WORK/ovl-probe/mnt"; do mountpoint -q "$m" 2>/dev/null && umount "$m"; done
  return 0
}
trap '[ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null; cleanup_containers; unmount_bundles; [ -n "${KEEP_LOG:-}" ] && cp "$WORK/gantry.log" "$KEEP_LOG"; rm -rf "$WORK"' EXIT
# The base configuration is the per-file layout (gantry-all); the tree
# variants get a configuration of their own.
DRIVER_LAYOUT=files setup_env $sim
# No create server for any variant but the server-* ones (not even one
# running on this host at the default socket).
export GANTRY_RUNTIME_SOCKET=$WORK/no-server.sock

variants=(runc gantry-none gantry-all)
declare -A RT=([runc]=$RUNC [gantry-none]=$GANTRY_RUNTIME [gantry-all]=$GANTRY_RUNTIME)
make_bundle "$WORK/tpl-runc" -- /bin/true
make_bundle "$WORK/tpl-gantry-none" -- /bin/true
make_bundle "$WORK/tpl-gantry-all" NVIDIA_VISIBLE_DEVICES=all -- /bin/true
# COMPARE_RUNTIME=PATH: another gantry-runtime build (another commit's) as
# one more all-GPU variant in the same rounds, for a before/after.
if [ -n "${COMPARE_RUNTIME:-}" ]; then
  [ -x "$COMPARE_RUNTIME" ] || die "COMPARE_RUNTIME=$COMPARE_RUNTIME: not an executable file"
  variants+=(compare-all)
  RT[compare-all]=$(cd "$(dirname "$COMPARE_RUNTIME")" && pwd)/$(basename "$COMPARE_RUNTIME")
  make_bundle "$WORK/tpl-compare-all" NVIDIA_VISIBLE_DEVICES=all -- /bin/true
fi
# hook-all: Docker's --gpus path, plain runc with Gantry's prestart hook
# (nvidia-container-runtime-hook: the same binary as the runtime) in config.json.
HOOK=$WORK/nvidia-container-runtime-hook
ln -sf "$(readlink "$GANTRY_RUNTIME")" "$HOOK"
# add_hook DIR CONFIG [SOCKET]: the prestart hook Docker adds, with CONFIG as its
# GANTRY_CONFIG and SOCKET as its create server (default: none).
add_hook() {
  local hooks="\"hooks\": {\"prestart\": [{\"path\": \"$HOOK\", \"args\": [\"nvidia-container-runtime-hook\", \"prestart\"], \"env\": [\"GANTRY_CONFIG=$2\", \"GANTRY_RUNTIME_SOCKET=${3:-$GANTRY_RUNTIME_SOCKET}\"]}]},"
  HOOKS=$hooks awk '{ print } /"ociVersion"/ && !done { print ENVIRON["HOOKS"]; done = 1 }' "$1/config.json" >"$1/config.json.new" &&
    mv "$1/config.json.new" "$1/config.json"
}
variants+=(hook-all)
RT[hook-all]=$RUNC
make_bundle "$WORK/tpl-hook-all" NVIDIA_VISIBLE_DEVICES=all -- /bin/true
add_hook "$WORK/tpl-hook-all" "$GANTRY_CONFIG"
# CFG[variant]: a Gantry configuration of its own, SOCK[variant] the create
# server's socket (set by bash prefix assignments: no process in the timed
# window).
declare -A CFG=() SOCK=()
if [ -n "$tree" ] || [ -n "$server" ]; then
  TREE_CFG=$WORK/gantry-tree.toml
  sed '/^driver-layout = /d; s/^\[runtime\]$/[runtime]\ndriver-layout = "tree"\ndriver-tree-dir = "'"${WORK//\//\\/}"'\/trees"/' "$GANTRY_CONFIG" >"$TREE_CFG"
  grep -q 'driver-layout = "tree"' "$TREE_CFG" || die "could not write $TREE_CFG"
fi
if [ -n "$tree" ]; then
  variants+=(gantry-tree)
  RT[gantry-tree]=$GANTRY_RUNTIME
  CFG[gantry-tree]=$TREE_CFG
  grep -q 'driver-layout = "tree"' "${CFG[gantry-tree]}" || die "could not write ${CFG[gantry-tree]}"
  make_bundle "$WORK/tpl-gantry-tree" NVIDIA_VISIBLE_DEVICES=all -- /bin/true
  variants+=(hook-tree)
  RT[hook-tree]=$RUNC
  make_bundle "$WORK/tpl-hook-tree" NVIDIA_VISIBLE_DEVICES=all -- /bin/true
  add_hook "$WORK/tpl-hook-tree" "${CFG[gantry-tree]}"
  if [ -n "${COMPARE_RUNTIME:-}" ]; then
    variants+=(compare-tree)
    RT[compare-tree]=${RT[compare-all]}
    CFG[compare-tree]=$TREE_CFG
    make_bundle "$WORK/tpl-compare-tree" NVIDIA_VISIBLE_DEVICES=all -- /bin/true
  fi
fi
if [ -n "$server" ]; then
  "$GANTRY_RUNTIME" --create-server --socket "$WORK/runtime.sock" >"$WORK/server.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 100); do [ -S "$WORK/runtime.sock" ] && break; sleep 0.05; done
  [ -S "$WORK/runtime.sock" ] || die "the create server did not start: $(cat "$WORK/server.log")"
  variants+=(server-all server-tree)
  RT[server-all]=$GANTRY_RUNTIME RT[server-tree]=$GANTRY_RUNTIME
  # hook-server: Docker's --gpus path (plain runc and the prestart hook) in the
  # default layout, the hook's work done by the create server.
  variants+=(hook-server)
  RT[hook-server]=$RUNC
  make_bundle "$WORK/tpl-hook-server" NVIDIA_VISIBLE_DEVICES=all -- /bin/true
  add_hook "$WORK/tpl-hook-server" "$TREE_CFG" "$WORK/runtime.sock"
  SOCK[server-all]=$WORK/runtime.sock SOCK[server-tree]=$WORK/runtime.sock
  CFG[server-tree]=$TREE_CFG
  make_bundle "$WORK/tpl-server-all" NVIDIA_VISIBLE_DEVICES=all -- /bin/true
  make_bundle "$WORK/tpl-server-tree" NVIDIA_VISIBLE_DEVICES=all -- /bin/true
fi
if [ -n "${NVIDIA_RUNTIME:-}" ]; then
  [ -x "$NVIDIA_RUNTIME" ] || die "NVIDIA_RUNTIME=$NVIDIA_RUNTIME is not an executable"
  # NVIDIA's runtime finds runc in PATH (every variant but it names its runtime by path).
  mkdir -p "$WORK/path" && ln -s "$RUNC" "$WORK/path/runc"
  export PATH=$WORK/path:$PATH
  RT[nvidia-all]=$NVIDIA_RUNTIME
  # NVIDIA_CTK=PATH: set NVIDIA's runtime up in CDI mode for this run only (its
  # config under XDG_CONFIG_HOME, a spec from its nvidia-ctk with nvidia-cdi-hook
  # beside it); without it, NVIDIA's runtime uses the host's own configuration.
  if [ -n "${NVIDIA_CTK:-}" ]; then
    [ -x "$NVIDIA_CTK" ] || die "NVIDIA_CTK=$NVIDIA_CTK is not an executable"
    export XDG_CONFIG_HOME=$WORK/nvcfg
    mkdir -p "$XDG_CONFIG_HOME/nvidia-container-runtime" "$WORK/nvcdi"
    "$NVIDIA_CTK" cdi generate --driver-root "${DRIVER_ROOT:-/}" --nvidia-cdi-hook-path "$(dirname "$NVIDIA_CTK")/nvidia-cdi-hook" \
      --output "$WORK/nvcdi/nvidia.yaml" >"$WORK/nvctk.log" 2>&1 || die "nvidia-ctk cdi generate failed: $(tail -3 "$WORK/nvctk.log")"
    cat >"$XDG_CONFIG_HOME/nvidia-container-runtime/config.toml" <<EOF
[nvidia-container-runtime]
mode = "cdi"
runtimes = ["$RUNC"]
[nvidia-container-runtime.modes.cdi]
spec-dirs = ["$WORK/nvcdi"]
EOF
  fi
  variants+=(nvidia-all)
  make_bundle "$WORK/tpl-nvidia-all" NVIDIA_VISIBLE_DEVICES=all -- /bin/true
fi

# fresh_bundle VARIANT DIR: DIR as an engine hands a new container to its
# runtime: VARIANT's config.json, and as its root filesystem an overlay mount
# of the template's (read-only below, a new empty upper directory), as
# Docker, containerd and CRI-O mount an image; where overlayfs cannot be
# mounted, a hard-linked copy (Gantry and runc add and rename entries, never
# write through a file). Not a full copy per round: writing it back to disk
# would go on during the timed rounds.
OVERLAY=
fresh_bundle() {
  local v=$1 b=$2
  mountpoint -q "$b/rootfs" 2>/dev/null && umount "$b/rootfs"
  rm -rf "$b" "$WORK/ovl-$v" && mkdir -p "$b" "$WORK/ovl-$v/upper" "$WORK/ovl-$v/work" || die "$b: cannot make it"
  cp "$WORK/tpl-$v/config.json" "$b/config.json"
  if [ -z "$OVERLAY" ]; then
    mkdir -p "$WORK/ovl-probe/mnt"
    if mount -t overlay overlay -o "lowerdir=$WORK/tpl-$v/rootfs,upperdir=$WORK/ovl-$v/upper,workdir=$WORK/ovl-$v/work" "$WORK/ovl-probe/mnt" 2>/dev/null; then
      umount "$WORK/ovl-probe/mnt"
      OVERLAY=yes
    else
      OVERLAY=no
      echo "== overlayfs cannot be mounted here: each round's root filesystem is a hard-linked copy"
    fi
    rm -rf "$WORK/ovl-$v" && mkdir -p "$WORK/ovl-$v/upper" "$WORK/ovl-$v/work"
  fi
  if [ "$OVERLAY" = yes ]; then
    mkdir "$b/rootfs" && mount -t overlay overlay -o "lowerdir=$WORK/tpl-$v/rootfs,upperdir=$WORK/ovl-$v/upper,workdir=$WORK/ovl-$v/work" "$b/rootfs" ||
      die "$b/rootfs: cannot mount the overlay"
  else
    cp -al "$WORK/tpl-$v/rootfs" "$b/rootfs" || die "$b/rootfs: cannot copy"
  fi
}

# ms A B: the time from A to B (microseconds) in ms.
ms() { echo "$((($2 - $1) / 1000)).$((($2 - $1) % 1000 / 100))"; }

# lifecycle VARIANT: one timed create+start+wait+delete on a fresh bundle;
# appends the times of the whole and of each step (ms) to the variant's files.
lifecycle() {
  local v=$1 rt=${RT[$1]} b=$WORK/b-$1 id=bench-$1 pid st t0 t1 t2 t3 t4
  fresh_bundle "$v" "$b"
  # Clock readings are EPOCHREALTIME without its point: microseconds, read by
  # bash itself (a $(...) would fork a subshell inside the timed window).
  t0=${EPOCHREALTIME/[.,]/}
  GANTRY_CONFIG=${CFG[$v]:-$GANTRY_CONFIG} GANTRY_RUNTIME_SOCKET=${SOCK[$v]:-$GANTRY_RUNTIME_SOCKET} "$rt" --root "$STATE" create --bundle "$b" --pid-file "$b/pid" "$id" </dev/null >"$WORK/$v.err" 2>&1 ||
    { echo "$v: create failed: $(cat "$WORK/$v.err")" >&2; return 1; }
  t1=${EPOCHREALTIME/[.,]/}
  "$rt" --root "$STATE" start "$id" 2>>"$WORK/$v.err" || { echo "$v: start failed" >&2; return 1; }
  t2=${EPOCHREALTIME/[.,]/}
  read -r pid <"$b/pid"
  # Wait for the container's process to exit: gone, or a zombie nobody reaped yet.
  while read -r _ _ st _ <"/proc/$pid/stat"; do [ "$st" = Z ] && break; done 2>/dev/null
  t3=${EPOCHREALTIME/[.,]/}
  "$rt" --root "$STATE" delete "$id" 2>>"$WORK/$v.err" || { echo "$v: delete failed: $(cat "$WORK/$v.err")" >&2; return 1; }
  t4=${EPOCHREALTIME/[.,]/}
  ms "$t0" "$t4" >>"$WORK/$v.total"
  ms "$t0" "$t1" >>"$WORK/$v.create"
  ms "$t1" "$t2" >>"$WORK/$v.start"
  ms "$t2" "$t3" >>"$WORK/$v.wait"
  ms "$t3" "$t4" >>"$WORK/$v.delete"
}

echo "== warm-up (3 rounds, untimed)"
for _ in 1 2 3; do
  for v in "${variants[@]}"; do lifecycle "$v" || exit 1; done
done
# The variants must do what they claim: gantry-all edited config.json, gantry-none did not.
cmp -s "$WORK/b-gantry-none/config.json" "$WORK/tpl-gantry-none/config.json" ||
  die "gantry-none: config.json was changed for a container without a GPU request"
grep -q '"/dev/nvidia' "$WORK/b-gantry-all/config.json" ||
  die "gantry-all: config.json has no /dev/nvidia device: gantry-runtime did not add the GPUs"
if [ -n "$server" ]; then
  n_served=$(grep -c '"server":true' "$WORK/gantry.log")
  [ "$n_served" -ge 9 ] || die "server-*, hook-server: $n_served of 9 warm-up creates were made by the create server (see $WORK/server.log)"
  [ "$(grep '"server":true' "$WORK/gantry.log" | grep -c '"front-end":"gantry-hook"')" -ge 3 ] ||
    die "hook-server: the create server did not do the hook's work (see $WORK/server.log and $WORK/gantry.log)"
  grep -q '"/usr/local/nvidia"' "$WORK/b-server-tree/config.json" || die "server-tree: the tree layout was not used"
fi
# handed VARIANT DEST: VARIANT's bundle as gantry-runtime hands it to runc
# (edited config.json, links and loader cache in the rootfs), before runc ran
# on it (no mount target, node or file runc makes): a create by VARIANT's
# runtime and configuration with a low-level runtime that does nothing.
handed() {
  local v=$1 dest=$2 cfg=$WORK/handed-$1.toml
  sed 's|^low-level = .*|low-level = "/bin/true"|' "${CFG[$v]:-$GANTRY_CONFIG}" >"$cfg"
  grep -q '^low-level = "/bin/true"$' "$cfg" || die "$v: its configuration names no low-level runtime to replace ($cfg)"
  rm -rf "$dest" && cp -a "$WORK/tpl-$v" "$dest"
  GANTRY_CONFIG=$cfg "${RT[$v]}" --root "$STATE" create --bundle "$dest" "handed-$v" </dev/null >"$WORK/handed-$v.err" 2>&1 ||
    die "$v: could not make its bundle for runc alone: $(cat "$WORK/handed-$v.err")"
  grep -q '"/dev/nvidia' "$dest/config.json" || die "$v: the bundle for runc alone has no GPU: $(cat "$WORK/handed-$v.err")"
}
# runc-gpu: plain runc on the bundle exactly as gantry-runtime hands it over:
# what runc itself spends on the GPU container's mounts and device nodes
# (and their targets in the rootfs). gantry-all minus runc-gpu is the cost of
# Gantry alone.
handed gantry-all "$WORK/tpl-runc-gpu"
# count FILE KEY: how many times "KEY" appears in a config.json.
count() { grep -o "\"$2\"" "$1" | wc -l; }
echo "== bundles: plain $(count "$WORK/tpl-runc/config.json" destination) mounts; GPU (gantry-all)" \
  "$(count "$WORK/b-gantry-all/config.json" destination) mounts, $(count "$WORK/b-gantry-all/config.json" major) device entries" \
  "(nodes and cgroup rules)"

rm -f "$WORK/tpl-runc-gpu/pid"
RT[runc-gpu]=$RUNC
first_derived=${#variants[@]}
variants+=(runc-gpu)
if [ -n "$tree" ]; then
  grep -q '"/usr/local/nvidia"' "$WORK/b-gantry-tree/config.json" ||
    die "gantry-tree: config.json has no mount at /usr/local/nvidia: the tree layout was not used (see $WORK/gantry.log)"
  echo "== bundles: GPU (gantry-tree) $(count "$WORK/b-gantry-tree/config.json" destination) mounts"
  handed gantry-tree "$WORK/tpl-runc-tree"
  RT[runc-tree]=$RUNC
  variants+=(runc-tree)
  if [ -n "${COMPARE_RUNTIME:-}" ]; then
    echo "== bundles: GPU (compare-tree) $(count "$WORK/b-compare-tree/config.json" destination) mounts"
    handed compare-tree "$WORK/tpl-runc-cmp-tree"
    RT[runc-cmp-tree]=$RUNC
    variants+=(runc-cmp-tree)
  fi
fi
if [ -n "$split" ]; then
  split_tool=${BUNDLESPLIT:-$REPO/bin/bundlesplit}
  [ -x "$split_tool" ] || die "--split needs $split_tool (make gpu-e2e builds it)"
  mkdir -p "$WORK/onemount"
  for part in nomounts:mounts nodevs:devices onemount:onemount; do
    v=runc-${part%%:*}
    cp -a "$WORK/tpl-runc-gpu" "$WORK/tpl-$v"
    "$split_tool" "$WORK/tpl-runc/config.json" "$WORK/tpl-runc-gpu/config.json" "$WORK/tpl-$v/config.json" \
      "${part#*:}" "$WORK/onemount" /usr/local/nvidia || exit 2
    RT[$v]=$RUNC
    variants+=("$v")
  done
fi
for v in "${variants[@]:$first_derived}"; do for _ in 1 2; do lifecycle "$v" || exit 1; done; done
rm -f "$WORK"/*.total "$WORK"/*.create "$WORK"/*.start "$WORK"/*.wait "$WORK"/*.delete

echo "== $runs rounds of ${variants[*]} (order rotated each round)"
n=${#variants[@]}
for ((r = 0; r < runs; r++)); do
  for ((k = 0; k < n; k++)); do lifecycle "${variants[(r + k) % n]}" || exit 1; done
done

# stats FILE: median, mean of the middle 80% (10% cut at each end), p90
# (nearest rank), min, max.
stats() {
  sort -n "$1" | awk '{ v[NR] = $1 } END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    p = int(0.9 * NR); if (p < 0.9 * NR) p++
    cut = int(NR / 10); s = 0; for (i = cut + 1; i <= NR - cut; i++) s += v[i]
    printf "%8.1f %8.1f %8.1f %8.1f %8.1f", m, s / (NR - 2 * cut), v[p], v[1], v[NR] }'
}
median() { stats "$1" | awk '{print $1}'; }

if [ -n "$sim" ]; then
  host="simulated $SIM_PROFILE"
else
  host=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd, -)
fi
echo "== create+start+wait+delete of /bin/true, ms, $runs runs each ($host; $(nproc) CPUs${cpus:+, pinned to $cpus})"
printf '%-12s %8s %8s %8s %8s %8s   %s\n' variant median trim10 p90 min max "median of each step: create start wait delete"
for v in "${variants[@]}"; do
  printf '%-12s %s   %8.1f %5.1f %4.1f %6.1f\n' "$v" "$(stats "$WORK/$v.total")" "$(median "$WORK/$v.create")" \
    "$(median "$WORK/$v.start")" "$(median "$WORK/$v.wait")" "$(median "$WORK/$v.delete")"
done
awk -v a="$(median "$WORK/gantry-all.total")" -v r="$(median "$WORK/runc.total")" -v c="$(median "$WORK/gantry-all.create")" -v rc="$(median "$WORK/runc.create")" \
  'BEGIN { printf "gantry-all - runc: %+.1f ms median lifecycle (%+.1f ms of it in create)\n", a - r, c - rc }'
awk -v a="$(median "$WORK/gantry-all.total")" -v r="$(median "$WORK/runc-gpu.total")" -v c="$(median "$WORK/gantry-all.create")" -v rc="$(median "$WORK/runc-gpu.create")" \
  'BEGIN { printf "gantry-all - runc-gpu (Gantry alone): %+.1f ms median lifecycle (%+.1f ms of it in create)\n", a - r, c - rc }'
if [ -n "$trace" ]; then
  strace_bin=$(command -v "$REPO/bin/strace" strace 2>/dev/null | head -1)
  if [ -z "$strace_bin" ]; then
    echo "--trace: no strace (bin/strace or in PATH): skipped"
  else
    for v in runc runc-gpu; do
      b=$WORK/b-$v id=trace-$v
      rm -rf "$b" && cp -a "$WORK/tpl-$v" "$b"
      LD_LIBRARY_PATH=$REPO/bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$strace_bin" -f -c -S time -o "$WORK/$v.strace" \
        timeout 60 "$RUNC" --root "$STATE" run --bundle "$b" "$id" </dev/null >/dev/null 2>&1
      "$RUNC" --root "$STATE" delete -f "$id" >/dev/null 2>&1
      echo "== runc run (create, start, wait) under strace -f -c, $v: the syscalls taking the most time"
      head -n 14 "$WORK/$v.strace" | tail -n 13
      tail -n 1 "$WORK/$v.strace"
    done
  fi
fi
awk -v a="$(median "$WORK/hook-all.total")" -v r="$(median "$WORK/runc.total")" \
  'BEGIN { printf "hook-all - runc (--gpus path): %+.1f ms median lifecycle\n", a - r }'
if [ -n "$tree" ]; then
  awk -v a="$(median "$WORK/hook-tree.total")" -v r="$(median "$WORK/runc.total")" \
    'BEGIN { printf "hook-tree - runc (--gpus path, tree layout): %+.1f ms median lifecycle\n", a - r }'
  awk -v a="$(median "$WORK/gantry-tree.total")" -v r="$(median "$WORK/runc.total")" -v c="$(median "$WORK/gantry-tree.create")" -v rc="$(median "$WORK/runc.create")" \
    'BEGIN { printf "gantry-tree - runc: %+.1f ms median lifecycle (%+.1f ms of it in create)\n", a - r, c - rc }'
  awk -v a="$(median "$WORK/runc-tree.total")" -v r="$(median "$WORK/runc.total")" -v c="$(median "$WORK/runc-tree.create")" -v rc="$(median "$WORK/runc.create")" \
    'BEGIN { printf "runc-tree - runc (runc alone on the tree bundle): %+.1f ms median lifecycle (%+.1f ms of it in create)\n", a - r, c - rc }'
  if [ -n "${COMPARE_RUNTIME:-}" ]; then
    for pair in gantry-tree:compare-tree runc-tree:runc-cmp-tree; do
      a=${pair%%:*} b=${pair#*:}
      awk -v n="$a - $b" -v a="$(median "$WORK/$a.total")" -v b="$(median "$WORK/$b.total")" -v ta="$(stats "$WORK/$a.total" | awk '{print $2}')" -v tb="$(stats "$WORK/$b.total" | awk '{print $2}')" \
        'BEGIN { printf "%s (this build against COMPARE_RUNTIME): %+.1f ms median lifecycle, %+.1f ms trimmed mean\n", n, a - b, ta - tb }'
    done
  fi
fi
if [ -n "$server" ]; then
  for v in server-all server-tree; do
    awk -v v=$v -v a="$(median "$WORK/$v.total")" -v r="$(median "$WORK/runc.total")" -v c="$(median "$WORK/$v.create")" -v rc="$(median "$WORK/runc.create")" \
      'BEGIN { printf "%s - runc: %+.1f ms median lifecycle (%+.1f ms of it in create)\n", v, a - r, c - rc }'
  done
  awk -v a="$(median "$WORK/hook-server.total")" -v r="$(median "$WORK/runc.total")" \
    'BEGIN { printf "hook-server - runc (--gpus path, tree layout, create server): %+.1f ms median lifecycle\n", a - r }'
  [ -z "$tree" ] || awk -v a="$(median "$WORK/server-tree.total")" -v r="$(median "$WORK/runc-tree.total")" \
    'BEGIN { printf "server-tree - runc-tree (Gantry alone, tree layout, create server): %+.1f ms median lifecycle\n", a - r }'
fi
# Where gantry-runtime's own time goes on create, from its log (gantry-all runs):
# startup = exec to Main (loader, Go runtime, package init), modify = all of its work.
if [ -s "$WORK/gantry.log" ]; then
  grep '"changed":true' "$WORK/gantry.log" | grep '"front-end":"gantry-runtime"' | grep -v '"server":true' | sed -n 's/.*"startup_ms":\([0-9.]*\).*/\1/p' >"$WORK/startup.ms"
  grep '"changed":true' "$WORK/gantry.log" | grep '"front-end":"gantry-runtime"' | grep -v '"server":true' | sed -n 's/.*"took_ms":\([0-9.]*\).*/\1/p' >"$WORK/took.ms"
  if [ -s "$WORK/startup.ms" ] && [ -s "$WORK/took.ms" ]; then
    printf 'gantry-runtime create, in process (median ms): startup %s, modify %s\n' \
      "$(median "$WORK/startup.ms" | tr -d ' ')" "$(median "$WORK/took.ms" | tr -d ' ')"
    grep '"changed":true' "$WORK/gantry.log" | grep '"front-end":"gantry-runtime"' | grep -v '"server":true' | tail -1 | sed -n 's/.*"phases_ms":\({[^}]*}\).*/last create, phases (ms): \1/p'
  fi
  grep '"server":true' "$WORK/gantry.log" | grep '"changed":true' | sed -n 's/.*"startup_ms":\([0-9.]*\).*/\1/p' >"$WORK/sstartup.ms"
  grep '"server":true' "$WORK/gantry.log" | grep '"changed":true' | sed -n 's/.*"took_ms":\([0-9.]*\).*/\1/p' >"$WORK/stook.ms"
  if [ -s "$WORK/sstartup.ms" ] && [ -s "$WORK/stook.ms" ]; then
    printf 'create server (median ms): constructor to server %s, modify %s\n' \
      "$(median "$WORK/sstartup.ms" | tr -d ' ')" "$(median "$WORK/stook.ms" | tr -d ' ')"
  fi
fi
# The goal, for the default configuration (driver tree layout), with and
# without the create server: a GPU container's lifecycle within 5 ms of plain
# runc's, through gantry-runtime and through Docker's --gpus hook.
echo "== goal: a GPU container's lifecycle within 5 ms of plain runc's (medians of this run)"
for v in gantry-tree hook-tree ${server:+server-tree hook-server}; do
  awk -v v=$v -v a="$(median "$WORK/$v.total")" -v r="$(median "$WORK/runc.total")" \
    'BEGIN { d = a - r; printf "%-12s %+5.1f ms  %s\n", v, d, (d <= 5 ? "within 5 ms" : "over 5 ms") }'
done
