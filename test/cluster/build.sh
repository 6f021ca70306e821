#!/usr/bin/env bash
# Builds everything the test cluster runs into bin/cluster (about 325 MB;
# `--pack` also writes bin/cluster.tar.xz, about 60 MB, to carry to a GPU host
# with no compiler and no network):
#   gantry-k8s                Kubernetes v1.37.2 (etcd, kube-apiserver, -controller-manager,
#                             -scheduler, kubelet, kubectl), containerd v2.4.2 and ctr,
#                             one static binary (test/cluster/k8s), and a symlink per name
#   containerd-shim-runc-v2   containerd's runc shim, from the same release
#   runc                      runc 1.5.2 (scripts/build-runc.sh), with the libseccomp it links
#   cni/{bridge,host-local,loopback}   this machine's (Debian's) CNI plugins
#   gantry, gantry-runtime, gantry-cdi-hook  Gantry, as make build builds them
#   cluster.test              the scenario tests (./test/cluster) as a binary
#   images/*.tar              the Gantry image (make image), a pause image and the
#                             probe workload image (busybox, a libcuda probe, cuda-check)
#
#   test/cluster/build.sh [--pack]
# On the GPU host: test/cluster/unpack.sh bin/cluster.tar.xz, then up.sh.
# The first build compiles over 3000 Go packages: over an hour on a busy
# 2-core machine (README); later ones reuse Go's build cache (about 40 s).
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/cluster/lib.sh
. scripts/lib/oci.sh
pack=
for a in "$@"; do
  case "$a" in
    --pack) pack=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) gk_die "build.sh: unknown argument $a (see test/cluster/build.sh --help)" ;;
  esac
done
export PATH=$PATH:/usr/local/go/bin
out=bin/cluster
mkdir -p "$out/cni" "$out/images"

gk_log "building gantry-k8s (Kubernetes, etcd, containerd)"
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v1.37.2 -X k8s.io/component-base/version.gitMajor=1
 -X k8s.io/component-base/version.gitMinor=37 -X k8s.io/component-base/version.gitTreeState=clean
 -X github.com/containerd/containerd/v2/version.Version=v2.4.2"
(cd test/cluster/k8s && CGO_ENABLED=0 go build -trimpath -ldflags "$k8s_ldflags" -o "../../../$out/gantry-k8s" . &&
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "../../../$out/containerd-shim-runc-v2" ./cmd/containerd-shim-runc-v2)
for c in $GK_COMPONENTS; do ln -sfn gantry-k8s "$out/$c"; done

gk_log "building Gantry"
make -s build
for b in gantry gantry-runtime gantry-cdi-hook; do cp bin/$b "$out/$b"; strip "$out/$b" 2>/dev/null || true; done
# containerd 2.4's sandboxes fail under Debian 12's runc 1.1.5 ("can't get
# final child's PID from pipe: EOF"); containerd 2.4 is tested with runc 1.5.
runc=$(scripts/build-runc.sh)
cp -L "$runc" "$out/runc"
strip "$out/runc" 2>/dev/null || true
mkdir -p "$out/lib"
lib=$(ldd "$out/runc" | awk '$1 == "libseccomp.so.2" {print $3}')
[ -z "$lib" ] || cp -L "$lib" "$out/lib/"
for p in bridge host-local loopback; do
  [ -x /usr/lib/cni/$p ] || gk_die "/usr/lib/cni/$p not found: apt-get install containernetworking-plugins"
  cp /usr/lib/cni/$p "$out/cni/$p"
done

# The scenario tests as a binary, for hosts without Go (test/cluster/gpu-e2e.sh).
go test -c -o "$out/cluster.test" ./test/cluster

gk_log "building the images"
make -s image
cp bin/gantry-image.tar "$out/images/gantry.tar"
busybox=/bin/busybox
# ldd fails on a static binary, which the images need (they carry no libc for it).
if [ ! -x $busybox ] || ldd $busybox >/dev/null 2>&1; then
  gk_die "a static $busybox is needed: apt-get install busybox-static"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# pause: busybox sleeping. containerd stops sandboxes with SIGKILL, so PID 1
# need not handle SIGTERM.
mkdir -p "$work/pause/bin"
cp "$busybox" "$work/pause/bin/busybox"
oci_archive "$work/pause" "$GK_PAUSE_IMAGE" "$out/images/pause.tar" \
  '{"Entrypoint":["/bin/busybox","sleep","2147483647"]}' test/cluster/build.sh
# probe: a merged-/usr tree with busybox, test/engines/testdata/probe.c (loads
# libcuda.so.1 and libnvidia-ml.so.1 by SONAME and prints where from) and
# scripts/cuda-check.c, both with this machine's glibc, and an ld.so.cache.
# It carries no NVIDIA file: what the probe finds, Gantry put there.
r=$work/probe
mkdir -p "$r"/usr/bin "$r"/usr/lib "$r"/usr/lib64 "$r"/etc "$r"/tmp "$r"/root
for d in bin lib lib64 sbin; do ln -s "usr/$d" "$r/$d" 2>/dev/null || ln -s usr/bin "$r/$d"; done
cp "$busybox" "$r/usr/bin/busybox"
for a in sh ls cat echo env grep stat test true head wc readlink sleep sort tr cut; do ln -s busybox "$r/usr/bin/$a"; done
gcc -O2 -Wall -o "$r/usr/bin/probe" test/engines/testdata/probe.c -ldl
gcc -O2 -Wall -o "$r/usr/bin/cuda-check" scripts/cuda-check.c -ldl
for p in probe cuda-check; do
  ldd "$r/usr/bin/$p" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | while read -r l; do
    mkdir -p "$r$(dirname "$l")"; cp -L "$l" "$r$l"
  done
done
# glibc whole, as CUDA images have it: the real libcuda.so.1 needs libm,
# libpthread, libdl and librt.
oci_copy_glibc "$r"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
printf 'root:x:0:\n' >"$r/etc/group"
ldconfig -r "$r" 2>/dev/null || /sbin/ldconfig -r "$r"
path='"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"'
oci_archive "$r" "$GK_PROBE_IMAGE" "$out/images/probe.tar" "{\"Env\":[$path],\"Cmd\":[\"/bin/sh\"]}" test/cluster/build.sh
# The same files with NVIDIA_VISIBLE_DEVICES=all in the image's environment, as
# the CUDA images set it: a pod that asks for no GPU must still get none.
oci_archive "$r" "$GK_PROBE_ALL_IMAGE" "$out/images/probe-all.tar" \
  "{\"Env\":[$path,\"NVIDIA_VISIBLE_DEVICES=all\",\"NVIDIA_DRIVER_CAPABILITIES=compute,utility\"],\"Cmd\":[\"/bin/sh\"]}" test/cluster/build.sh

if [ -n "$pack" ]; then
  # Without Gantry's own binaries, which the image holds too: unpack.sh takes
  # them from it. That keeps the archive under the 64 MiB a GPU host call carries.
  gk_log "packing bin/cluster.tar.xz"
  tar -C bin --exclude=cluster/gantry --exclude=cluster/gantry-runtime --exclude=cluster/gantry-cdi-hook \
    -cf - cluster | xz -T0 -9 >bin/cluster.tar.xz.tmp && mv bin/cluster.tar.xz.tmp bin/cluster.tar.xz
  ls -la bin/cluster.tar.xz
fi
du -sh "$out"
gk_log "built $out: now sudo test/cluster/up.sh"
