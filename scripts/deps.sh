#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages Gantry needs, if missing:
#   scripts/deps.sh          what the build and `make demo` need
#   scripts/deps.sh --test   also the real engines the tests drive (containerd)
set -euo pipefail
tests=false
[ "${1:-}" = "--test" ] && tests=true
need=()
command -v gcc >/dev/null || need+=(gcc libc6-dev)
command -v ldconfig >/dev/null || [ -x /sbin/ldconfig ] || need+=(libc-bin)
[ -e /usr/include/stdio.h ] || need+=(libc6-dev)
command -v git >/dev/null || need+=(git)
command -v chroot >/dev/null || need+=(coreutils)
# Real engines the tests drive when present (they skip with a reason otherwise).
if $tests; then
  command -v containerd >/dev/null || need+=(containerd)
fi
if ! command -v go >/dev/null && [ ! -x /usr/local/go/bin/go ]; then
  need+=(golang-go)
fi
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
echo "installing: ${need[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
