# shellcheck shell=bash
# Shared by scripts/gpu-e2e.sh and bench/runtime-lifecycle.sh (sourced, not run):
# a minimal root filesystem made from this host's own libraries, OCI bundles
# around it, a Gantry configuration, and container runs through runc or
# gantry-runtime with a private runc state directory.
#
# The caller sets REPO and WORK (a scratch directory it removes), then calls
# setup_env [--sim]. Everything the GPU host needs is prebuilt under bin/
# (`make gpu-e2e`): bin/gantry, bin/runc, bin/cuda-check, bin/lib/libseccomp.so.2.
# Nothing here needs gcc, Go, network or python.

: "${REPO:?}" "${WORK:?}"
GANTRY=${GANTRY:-$REPO/bin/gantry}
RUNC=${RUNC:-$REPO/bin/runc}
CUDA_CHECK=${CUDA_CHECK:-$REPO/bin/cuda-check}
STATE=$WORK/runc-state        # runc --root: containers of this run only
GANTRY_RUNTIME=$WORK/gantry-runtime
ROOTFS=$WORK/rootfs
SIM=0
SIM_PROFILE=${SIM_PROFILE:-h100x8}

die() { echo "error: $*" >&2; exit 2; }

# setup_env [--sim]: checks the prerequisites, writes the Gantry config,
# the gantry-runtime link and (with --sim) a fake driver root, and builds the rootfs.
setup_env() {
  [ "${1:-}" = --sim ] && SIM=1
  [ "$(id -u)" = 0 ] || die "run as root (runc needs it to create containers)"
  local f
  for f in "$GANTRY" "$RUNC" "$CUDA_CHECK"; do
    [ -x "$f" ] || die "$f missing: build it on a machine with Go and gcc (make gpu-e2e) and carry bin/ here"
  done
  command -v ldd >/dev/null || die "ldd not found (it comes with glibc's libc-bin package)"
  # runc links libseccomp.so.2; a copy rides along in bin/lib for hosts without it.
  if ldd "$RUNC" | grep -q 'not found'; then
    [ -e "$REPO/bin/lib/libseccomp.so.2" ] || die "$RUNC: $(ldd "$RUNC" | grep 'not found' | head -1 | tr -s '\t ' ' ')"
    export LD_LIBRARY_PATH=$REPO/bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  "$RUNC" --version >/dev/null || die "$RUNC does not run on this host"
  mkdir -p "$STATE" "$WORK/cache"
  # The lean per-container binary when built (make build), else gantry itself.
  if [ -x "$REPO/bin/gantry-runtime" ] && [ "$GANTRY" = "$REPO/bin/gantry" ]; then
    ln -sf "$REPO/bin/gantry-runtime" "$GANTRY_RUNTIME"
  else
    ln -sf "$GANTRY" "$GANTRY_RUNTIME"
  fi

  local gpus=nvml driver_root=${DRIVER_ROOT:-/}
  if [ $SIM = 1 ]; then
    gpus=sim:$SIM_PROFILE driver_root=$WORK/driver
    "$GANTRY" --gpus "$gpus" sim driver-root "$driver_root" >"$WORK/sim-driver.log" 2>&1 ||
      die "gantry sim driver-root failed (it needs gcc and ldconfig): $(cat "$WORK/sim-driver.log")"
  fi
  export GANTRY_CONFIG=$WORK/gantry.toml
  cat >"$GANTRY_CONFIG" <<EOF
gpus = "$gpus"
driver-root = "$driver_root"

[runtime]
low-level = "$RUNC"
cache-dir = "$WORK/cache"
log-file = "$WORK/gantry.log"
EOF
  # runtime.driver-layout: unset, the default (tree); DRIVER_LAYOUT=tree,
  # said explicitly; either way the trees are kept in $WORK/trees, not in
  # the host's driver-tree-dir. DRIVER_LAYOUT=files, a mount per driver file.
  case ${DRIVER_LAYOUT:-} in
    '') printf 'driver-tree-dir = "%s"\n' "$WORK/trees" >>"$GANTRY_CONFIG" ;;
    files) printf 'driver-layout = "files"\n' >>"$GANTRY_CONFIG" ;;
    tree) printf 'driver-layout = "tree"\ndriver-tree-dir = "%s"\n' "$WORK/trees" >>"$GANTRY_CONFIG" ;;
    *) die "DRIVER_LAYOUT=$DRIVER_LAYOUT: use files or tree" ;;
  esac
  build_rootfs "$ROOTFS"
}

# copy_with_deps FILE DEST: FILE at DEST in the rootfs, plus every library ldd
# says it needs (at the same paths as on the host), NVIDIA's excepted: those
# must come from the runtime, never from the image.
copy_with_deps() {
  local src=$1 dest=$2 lib
  install -D -m 0755 "$src" "$ROOTFS$dest"
  ldd "$src" 2>/dev/null | awk '/=> \//{print $3} /^[ \t]*\/[^ ]*ld-linux/{print $1}' |
    while read -r lib; do
      case ${lib##*/} in libcuda* | libnvidia*) continue ;; esac
      [ -e "$ROOTFS$lib" ] || { mkdir -p "$ROOTFS${lib%/*}" && cp -L "$lib" "$ROOTFS$lib"; }
    done
}

# build_rootfs DIR: a merged-/usr tree with sh, true, cuda-check, the C library
# set that nvidia-smi and libcuda need (libm, libdl, libpthread, librt), an
# /etc/ld.so.cache made by ldconfig -r as in real images, and /etc/passwd.
build_rootfs() {
  local d
  rm -rf "$ROOTFS"
  mkdir -p "$ROOTFS"/usr/{bin,sbin,lib,lib64} "$ROOTFS"/{dev,proc,sys,tmp,root,etc/ld.so.conf.d}
  for d in bin sbin lib lib64; do ln -s "usr/$d" "$ROOTFS/$d"; done
  copy_with_deps "$(readlink -f /bin/sh)" /usr/bin/sh
  copy_with_deps "$(type -P true)" /usr/bin/true
  copy_with_deps "$(type -P sleep)" /usr/bin/sleep
  copy_with_deps "$CUDA_CHECK" /usr/bin/cuda-check
  # Libraries the driver's programs and libraries need, from libc's directory.
  local libdir name
  libdir=$(ldd "$CUDA_CHECK" | awk '$1 == "libc.so.6" {print $3}')
  libdir=${libdir%/*}
  for name in libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2 libgcc_s.so.1; do
    [ -e "$libdir/$name" ] && [ ! -e "$ROOTFS$libdir/$name" ] && cp -L "$libdir/$name" "$ROOTFS$libdir/$name"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n' >"$ROOTFS/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$ROOTFS/etc/group"
  printf 'include /etc/ld.so.conf.d/*.conf\n' >"$ROOTFS/etc/ld.so.conf"
  printf '/usr/local/lib\n/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n' \
    >"$ROOTFS/etc/ld.so.conf.d/libc.conf"
  if command -v ldconfig >/dev/null; then
    ldconfig -r "$ROOTFS" || die "ldconfig -r $ROOTFS failed"
  else
    echo "note: no ldconfig here; the rootfs has no /etc/ld.so.cache" >&2
  fi
}

# json_str S: S as a JSON string.
json_str() {
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\t'/\\t}
  printf '"%s"' "$s"
}

# make_bundle DIR [VAR=VALUE...] -- ARGS...: an OCI bundle in DIR with its own
# copy of the rootfs, made by `runc spec` and edited: no terminal, ARGS as the
# process, the VAR=VALUE pairs added to its environment.
make_bundle() {
  local dir=$1 envs="" args="" a
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=", $(json_str "$1")"; shift; done
  [ "${1:-}" = -- ] && shift
  for a in "$@"; do args+="${args:+, }$(json_str "$a")"; done
  rm -rf "$dir" && mkdir -p "$dir"
  cp -a "$ROOTFS" "$dir/rootfs"
  "$RUNC" spec --bundle "$dir" || die "runc spec failed"
  # runc's template has one "args" array (multi-line) and TERM=xterm as its
  # last environment entry; the checks below catch a template that differs.
  # (awk -v would expand the backslashes of the JSON escapes; ENVIRON does not.)
  ARGS=$args ENVS=$envs awk '
    BEGIN { args = ENVIRON["ARGS"]; envs = ENVIRON["ENVS"] }
    skip { if ($0 ~ /\]/) skip = 0; next }
    /"terminal": *true/ { sub(/true/, "false") }
    /"args": *\[/ && !done {
      done = 1
      match($0, /^[ \t]*/)
      print substr($0, 1, RLENGTH) "\"args\": [" args "],"
      if ($0 !~ /\]/) skip = 1
      next
    }
    /"TERM=xterm"/ { i = index($0, "\"TERM=xterm\""); $0 = substr($0, 1, i + 11) envs substr($0, i + 12) }
    { print }' "$dir/config.json" >"$dir/config.json.new" && mv "$dir/config.json.new" "$dir/config.json"
  if ! grep -q '"terminal": false' "$dir/config.json" || ! grep -qF "\"args\": [$args]" "$dir/config.json"; then
    die "could not edit $dir/config.json (unexpected runc spec template)"
  fi
  [ -z "$envs" ] || grep -qF "\"TERM=xterm\"$envs" "$dir/config.json" ||
    die "could not add the environment to $dir/config.json"
}

# wait_stopped RUNTIME ID [SECONDS]: polls `state` until the container stopped.
wait_stopped() {
  local rt=$1 id=$2 limit=${3:-120} i=0
  while [ $i -lt $((limit * 20)) ]; do
    "$rt" --root "$STATE" state "$id" 2>/dev/null | grep -q '"status": "stopped"' && return 0
    sleep 0.05
    i=$((i + 1))
  done
  echo "container $id still running after ${limit}s" >&2
  return 1
}

# run_container RUNTIME ID BUNDLE OUT: create, start, wait, delete, the way
# engines drive a runtime; the container's stdout and stderr (and the
# runtime's own errors) go to OUT. Fails when any step fails; the container
# is gone afterwards either way.
run_container() {
  local rt=$1 id=$2 bundle=$3 out=$4
  if ! "$rt" --root "$STATE" create --bundle "$bundle" "$id" </dev/null >"$out" 2>&1; then
    "$RUNC" --root "$STATE" delete --force "$id" >/dev/null 2>&1
    return 1
  fi
  if ! "$rt" --root "$STATE" start "$id" >>"$out" 2>&1 || ! wait_stopped "$rt" "$id"; then
    "$RUNC" --root "$STATE" delete --force "$id" >/dev/null 2>&1
    return 1
  fi
  "$rt" --root "$STATE" delete "$id" >>"$out" 2>&1
}

# cleanup_containers: removes whatever this run left in its runc state directory.
cleanup_containers() {
  local id
  [ -d "$STATE" ] || return 0
  for id in $("$RUNC" --root "$STATE" list -q 2>/dev/null); do
    "$RUNC" --root "$STATE" delete --force "$id" >/dev/null 2>&1
  done
}
