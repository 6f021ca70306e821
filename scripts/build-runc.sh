#!/usr/bin/env bash
# Builds the pinned runc release into bin/runtimes/runc-<ver>, a second low-level
# runtime for the container-escape tests (internal/shim: GANTRY_TEST_RUNTIMES).
# Built from its Go module (the module proxy is reachable where GitHub is not), with
# CGO and libseccomp as runc's releases are. An existing build is reused.
#   scripts/build-runc.sh           build if missing, print the path
# Needs gcc and libseccomp-dev (scripts/deps.sh --test installs them).
set -euo pipefail
# the newest non-rc release on 2026-11-23 (go list -m -versions github.com/opencontainers/runc)
ver=1.5.2
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/bin/runtimes/runc-$ver"
if [ -x "$out" ] && "$out" --version >/dev/null 2>&1; then
  echo "$out"
  exit 0
fi
if [ ! -e /usr/include/seccomp.h ]; then
  echo "build-runc: /usr/include/seccomp.h missing: install libseccomp-dev (scripts/deps.sh --test)" >&2
  exit 1
fi
go=go
command -v go >/dev/null || go=/usr/local/go/bin/go
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$(dirname "$out")"
start=$(date +%s)
# go install pkg@version builds the module exactly as pinned by its own go.mod/go.sum.
GOBIN="$tmp" CGO_ENABLED=1 GOFLAGS= nice -n 19 "$go" install -trimpath -tags "seccomp urfave_cli_no_docs" \
  -ldflags "-X main.version=$ver" "github.com/opencontainers/runc@v$ver"
"$tmp/runc" --version >/dev/null
mv "$tmp/runc" "$out.tmp" && mv "$out.tmp" "$out"
echo "build-runc: built runc $ver in $(( $(date +%s) - start )) s" >&2
echo "$out"
