#!/usr/bin/env bash
# Builds containerd 2.x, its ctr and its runc shim into bin/containerd2, for the
# engine tests' containerd 2.x cases (test/engines TestConfigureContainerd: version 3 files and
# Debian's version 2 file read by containerd 2.x). The release is the one the test
# cluster runs (test/cluster/k8s/go.mod pins github.com/containerd/containerd/v2),
# built from its Go module with that module's go.sum, without the rest of the
# cluster (test/cluster/build.sh builds Kubernetes too). An existing build is reused.
#   scripts/build-containerd2.sh    build if missing, print the containerd path
# About 10-20 minutes on a busy 2-core machine the first time; Go's cache makes
# later builds quick.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/bin/containerd2"
ver=$(awk '$1 == "github.com/containerd/containerd/v2" {print $2; exit}' "$root/test/cluster/k8s/go.mod")
[ -n "$ver" ] || { echo "build-containerd2: no containerd/v2 in test/cluster/k8s/go.mod" >&2; exit 1; }
if [ -x "$out/containerd" ] && [ -x "$out/ctr" ] && [ -x "$out/containerd-shim-runc-v2" ] && "$out/containerd" --version 2>/dev/null | grep -q " $ver"; then
  echo "$out/containerd"
  exit 0
fi
go=go
command -v go >/dev/null || go=/usr/local/go/bin/go
mkdir -p "$out"
start=$(date +%s)
cd "$root/test/cluster/k8s"
for cmd in containerd ctr containerd-shim-runc-v2; do
  CGO_ENABLED=0 nice -n 19 "$go" build -trimpath \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$ver" \
    -o "$out/$cmd.tmp" "github.com/containerd/containerd/v2/cmd/$cmd"
  mv "$out/$cmd.tmp" "$out/$cmd"
done
"$out/containerd" --version >&2
echo "build-containerd2: built containerd $ver in $(( $(date +%s) - start )) s" >&2
echo "$out/containerd"
