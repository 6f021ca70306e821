#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages Gantry needs, if missing:
#   scripts/deps.sh          what the build and `make demo` need (runc included; failure is fatal)
#   scripts/deps.sh --test   also the real engines the tests drive (containerd, lxc, docker.io);
#                            best effort: those tests skip with a reason without them
set -euo pipefail
tests=false
[ "${1:-}" = "--test" ] && tests=true
need=() optional=()
command -v gcc >/dev/null || need+=(gcc libc6-dev)
command -v ldconfig >/dev/null || [ -x /sbin/ldconfig ] || need+=(libc-bin)
[ -e /usr/include/stdio.h ] || need+=(libc6-dev)
command -v git >/dev/null || need+=(git)
command -v chroot >/dev/null || need+=(coreutils)
# make demo runs a GPU container through gantry-runtime and runc; so do the tests
command -v runc >/dev/null || need+=(runc)
if ! command -v go >/dev/null && [ ! -x /usr/local/go/bin/go ]; then
  need+=(golang-go)
fi
if $tests; then
  command -v containerd >/dev/null || optional+=(containerd)
  # LXC and its nvidia hook (internal/nvcli)
  [ -x /usr/share/lxc/hooks/nvidia ] || optional+=(lxc)
  # a static busybox is the image of the hook and nsmount tests' runc containers
  dpkg -s busybox-static >/dev/null 2>&1 || optional+=(busybox-static)
  # test/engines: a private dockerd (the runtime, --gpus through the hook) and
  # Compose GPU reservations (docker-compose 1.29 has deploy.resources devices)
  command -v dockerd >/dev/null || [ -x /usr/sbin/dockerd ] || optional+=(docker.io)
  command -v docker-compose >/dev/null || optional+=(docker-compose)
  # test/engines: a private rootful podman (CDI, hooks.d, --runtime); ~18 MB, ~15 s
  command -v podman >/dev/null || optional+=(podman)
  # engineconfig checks its diffs with GNU patch; nsmount/hook run runc under unshare
  command -v patch >/dev/null || optional+=(patch)
  command -v unshare >/dev/null || optional+=(util-linux)
  # nvdocker's impostor tests: the attacker as nobody (setpriv), the wrapper in
  # a network namespace of its own with its loopback up (ip)
  command -v setpriv >/dev/null || optional+=(util-linux)
  command -v ip >/dev/null || [ -x /usr/sbin/ip ] || optional+=(iproute2)
  # CRIU locks a checkpointed container's own network namespace with
  # iptables-restore and ip6tables-restore (the checkpoint tests)
  command -v iptables-restore >/dev/null || [ -x /usr/sbin/iptables-restore ] || optional+=(iptables)
  # containerhook's compat32 tests build i386 programs and libraries (gcc -m32:
  # libc6-dev-i386, lib32gcc; about 20 MB of small packages)
  [ "$(uname -m)" != x86_64 ] || dpkg -s gcc-multilib >/dev/null 2>&1 || optional+=(gcc-multilib)
  # docs: the guide's health and :3476 examples, run by go test ./docs
  command -v socat >/dev/null || optional+=(socat)
  command -v curl >/dev/null || optional+=(curl)
  # internal/shim's escape tests also run under crun and the newest runc release,
  # built with libseccomp by scripts/build-runc.sh
  command -v crun >/dev/null || optional+=(crun)
  [ -e /usr/include/seccomp.h ] || optional+=(libseccomp-dev)
  # make gpu-e2e: libglvnd's EGL and the Vulkan loader for check l's image
  # (bin/gfxlibs), for GPU hosts that lack them
  /sbin/ldconfig -p 2>/dev/null | grep -q 'libEGL.so.1 ' || optional+=(libegl1)
  /sbin/ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1 ' || optional+=(libvulkan1)
  # test/cluster: the pods' network (bridge, host-local, loopback CNI plugins)
  [ -x /usr/lib/cni/bridge ] || optional+=(containernetworking-plugins)
fi
# build-runc.sh after the packages, best effort: without it those subtests skip;
# install-criu.sh likewise (a CRIU 4.x for the checkpoint tests: Debian 12's 3.17
# fails on current kernels), which says which CRIU it found
build_runc() {
  $tests || return 0
  "$(dirname "$0")/build-runc.sh" >/dev/null ||
    echo "warning: scripts/build-runc.sh failed; the escape tests skip that runc"
  "$(dirname "$0")/install-criu.sh" >/dev/null ||
    echo "warning: scripts/install-criu.sh failed; the checkpoint tests skip"
}
if [ ${#need[@]} -eq 0 ] && [ ${#optional[@]} -eq 0 ]; then
  build_runc
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq || [ ${#need[@]} -eq 0 ]
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
if [ ${#optional[@]} -gt 0 ]; then
  echo "installing for the tests: ${optional[*]}"
  $sudo apt-get install -y -qq --no-install-recommends "${optional[@]}" ||
    echo "warning: could not install ${optional[*]}; the tests that drive them will skip"
fi
build_runc
