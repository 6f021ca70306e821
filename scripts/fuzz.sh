#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a short time each: scripts/fuzz.sh 30s
set -euo pipefail
cd "$(dirname "$0")/.."
t=${1:-20s}
for pkg in $(go list ./...); do
  for f in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "== $pkg $f ($t)"
    go test -run='^$' -fuzz="^$f\$" -fuzztime="$t" "$pkg"
  done
done
