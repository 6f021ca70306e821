#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages Gantry's build and tests need, if missing.
set -euo pipefail
need=()
command -v gcc >/dev/null || need+=(gcc libc6-dev)
command -v ldconfig >/dev/null || [ -x /sbin/ldconfig ] || need+=(libc-bin)
[ -e /usr/include/stdio.h ] || need+=(libc6-dev)
command -v git >/dev/null || need+=(git)
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
