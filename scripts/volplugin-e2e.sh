#!/usr/bin/env bash
# nvidia-docker 1.0's way on a GPU host, without Docker: gantry serve --volume-plugin
# builds the volume nvidia_driver_<driver version>, /docker/cli names it and GPU 0's
# device nodes, and a runc container gets exactly that (the volume bound read-only at
# /usr/local/nvidia, the nodes bound as docker --device would), then runs nvidia-smi -L
# and cuda-check from /usr/local/nvidia (PATH and LD_LIBRARY_PATH as CUDA images set them).
#
#   scripts/volplugin-e2e.sh          on a GPU host (root); needs bin/ from `make gpu-e2e`
#   scripts/volplugin-e2e.sh --sim    anywhere (root, gcc, ldconfig): simulated GPUs and a
#                                     fake driver root from `gantry sim driver-root`
#   --keep                            keep the scratch directory
#
# Checks (PASS/FAIL each, exit 1 on any FAIL, 2 when it cannot start):
#   a  /docker/cli?dev=0 is --volume-driver=nvidia-docker
#      --volume=nvidia_driver_<driver version>:/usr/local/nvidia:ro and the --device flags
#   b  the volume's tree has bin/nvidia-smi and lib64/libcuda.so.1, and nothing but
#      files and links into its own directories
#   c  in the container: exactly GPU 0's node, nvidia-smi -L shows GPU 0 alone,
#      cuda-check loads libcuda.so.<driver version> from /usr/local/nvidia/lib64 (on a
#      GPU: runs a kernel), and /usr/local/nvidia is read-only although the container's
#      bind of the volume is not (the plugin made the volume a read-only mount)
#
# Environment: DRIVER_ROOT (default /), GANTRY, RUNC, CUDA_CHECK (default bin/...),
# PORT (the REST API's, default 3477, loopback).
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
WORK=$(mktemp -d /tmp/gantry-volplugin.XXXXXX)
PORT=${PORT:-3477}
# shellcheck source=scripts/lib/bundle.sh
. "$REPO/scripts/lib/bundle.sh"
server=
finish() {
  cleanup_containers
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  # The plugin made each volume a read-only mount of its own.
  for d in "$WORK"/volumes/nvidia_driver/*/; do
    [ -d "$d" ] && while umount -l "$d" 2>/dev/null; do :; done
  done
  if [ $keep = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap finish EXIT
pass=0 fail=0
PASS() { echo "PASS $*"; pass=$((pass + 1)); }
FAIL() { echo "FAIL $*"; fail=$((fail + 1)); }
show() { sed 's/^/     | /;40q' "$1"; }

if [ $mode = sim ]; then setup_env --sim; else setup_env; fi
drv=$("$GANTRY" info --json | sed -n 's/^  "driverVersion": "\(.*\)",$/\1/p')
[ -n "$drv" ] || die "could not read the driver version (gantry info)"
echo "== $mode mode, driver $drv, scratch $WORK"

"$GANTRY" serve --volume-plugin --listen "127.0.0.1:$PORT" --plugin-dir "$WORK/plugins" \
  --volumes-dir "$WORK/volumes" 2>"$WORK/serve.log" &
server=$!
for _ in $(seq 300); do grep -q 'listening on' "$WORK/serve.log" && break; sleep 0.1; done
grep -q 'listening on' "$WORK/serve.log" || { cat "$WORK/serve.log"; die "gantry serve --volume-plugin did not start"; }
sed 's/^/serve: /' "$WORK/serve.log"

# GET PATH from the REST API, body only (bash's /dev/tcp: no curl needed).
get() {
  exec 3<>"/dev/tcp/127.0.0.1/$PORT" || return 1
  printf 'GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n' "$1" >&3
  sed '1,/^\r\{0,1\}$/d' <&3
  exec 3<&-
}

# a: the arguments.
args=$(get '/docker/cli?dev=0')
echo "/docker/cli?dev=0: $args"
read -r -a words <<<"$args"
if [ "${words[0]:-}" = --volume-driver=nvidia-docker ] &&
  [ "${words[1]:-}" = "--volume=nvidia_driver_$drv:/usr/local/nvidia:ro" ] &&
  [ "${#words[@]}" -ge 4 ]; then
  PASS "a: /docker/cli names the volume nvidia_driver_$drv and $((${#words[@]} - 2)) device flags"
else
  FAIL "a: /docker/cli?dev=0 answered: $args"
fi

# b: the tree.
tree=$WORK/volumes/nvidia_driver/$drv
if [ -x "$tree/bin/nvidia-smi" ] && [ -e "$tree/lib64/libcuda.so.1" ] &&
  [ -z "$(find "$tree" ! -type f ! -type d ! -type l)" ] &&
  [ -z "$(find "$tree" -type l -lname '*/*')" ]; then
  PASS "b: the volume $tree: $(find "$tree" -type f | wc -l) files, $(find "$tree" -type l | wc -l) SONAME links"
else
  FAIL "b: the volume's tree $tree:"
  find "$tree" -printf '%y %P %l\n' | head -40
fi

# c: a container made as Docker would from those arguments.
# The volume bound as Docker binds a volume given without :ro (rbind alone): the
# plugin's read-only mount must hold.
mounts="			{\"destination\": \"/usr/local/nvidia\", \"type\": \"bind\", \"source\": $(json_str "$tree"), \"options\": [\"rbind\"]}"
for w in "${words[@]:2}"; do
  spec=${w#--device=}
  src=${spec%%:*} dst=${spec#*:}
  mounts+=",
			{\"destination\": $(json_str "$dst"), \"type\": \"bind\", \"source\": $(json_str "$src"), \"options\": [\"bind\"]}"
done
probe='export PATH=/usr/local/nvidia/bin:$PATH LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib
for f in /dev/nvidia*; do [ -e "$f" ] && echo "dev $f"; done
nvidia-smi -L; echo "smi-exit=$?"
cuda-check '"$([ $mode = sim ] && echo --load-only)"'; echo "cuda-exit=$?"
if (: >/usr/local/nvidia/lib64/written) 2>/dev/null; then echo writable; else echo read-only; fi'
b=$WORK/b-volume
make_bundle "$b" -- /bin/sh -c "$probe"
# The mounts after runc's own (its /dev tmpfs first); the device cgroup open, as the
# nodes bound are the only NVIDIA nodes the container has.
EXTRA=$mounts awk '
  inm && /^\t\],$/ { print prev ","; print ENVIRON["EXTRA"]; print; inm = 0; held = 0; next }
  { if (held) print prev; prev = $0; held = 1 }
  /"mounts": \[/ { inm = 1 }
  END { if (held) print prev }' "$b/config.json" | sed 's/"allow": false/"allow": true/' >"$b/config.json.new" &&
  mv "$b/config.json.new" "$b/config.json"
grep -q '"/usr/local/nvidia"' "$b/config.json" || die "could not add the mounts to $b/config.json"
if run_container "$RUNC" volplugin-e2e "$b" "$WORK/c.out"; then
  ok=1
  gpus=$(grep -c '^dev /dev/nvidia[0-9][0-9]*$' "$WORK/c.out")
  [ "$gpus" = 1 ] || { FAIL "c: $gpus GPU nodes in the container (want GPU 0's alone)"; ok=0; }
  grep -qx 'smi-exit=0' "$WORK/c.out" || { FAIL "c: nvidia-smi -L failed"; ok=0; }
  [ "$(grep -c '^GPU [0-9]*:' "$WORK/c.out")" = 1 ] || { FAIL "c: nvidia-smi -L does not list one GPU"; ok=0; }
  grep -qx 'cuda-exit=0' "$WORK/c.out" || { FAIL "c: cuda-check failed"; ok=0; }
  grep -q "^cuda-check: OK .*libcuda=/usr/local/nvidia/lib64/libcuda.so" "$WORK/c.out" ||
    { FAIL "c: libcuda did not load from /usr/local/nvidia/lib64"; ok=0; }
  grep -qx 'read-only' "$WORK/c.out" || { FAIL "c: /usr/local/nvidia is writable"; ok=0; }
  if [ $ok = 1 ]; then
    PASS "c: GPU 0 alone, $(grep '^GPU ' "$WORK/c.out"), $(sed -n 's/^cuda-check: OK //p' "$WORK/c.out" | head -1)"
  fi
  show "$WORK/c.out"
else
  FAIL "c: runc could not run the container"
  show "$WORK/c.out"
fi

echo "== $pass passed, $fail failed"
[ $fail = 0 ]
