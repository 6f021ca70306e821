#!/usr/bin/env bash
# gantry-device-plugin's footprint, so that it cannot creep back: the binary's
# size (unstripped and stripped) and package count, then its memory (VmRSS and
# VmHWM from /proc, with the file-backed and anonymous parts) after it started
# and registered with a fake kubelet (bench/fakekubelet) and again after
# N Allocate calls, with every feature on: simulated GPUs, health checks,
# Prometheus metrics (scraped once), GPU Feature Discovery labels (as a feature
# file), passDeviceSpecs and the envvar and cdi-annotations strategies.
#
#   bench/device-plugin-footprint.sh [--gpus sim:h100x8] [--allocations N]
#       [--bin FILE] [--max-rss-mib M] [--max-stripped-mb S]
#       [--anchor NVIDIA-PLUGIN] [--fakekubelet FILE]
#
# --bin measures that binary instead of building one (its size and packages are
# then not reported). It fails (exit 1) when the RSS after the allocations is
# over --max-rss-mib (default 25) or the stripped binary over --max-stripped-mb
# (default 20, in 10^6 bytes); 0 turns a check off. No root, no GPU, no cluster.
#
# --anchor runs NVIDIA's k8s-device-plugin (nvidia-device-plugin, built from
# source) through the same fake kubelet and the same Allocate calls right
# after, for figures that compare (on a GPU host, with --gpus nvml). NVIDIA's
# plugin puts its socket in /var/lib/kubelet/device-plugins whatever the
# kubelet's, so that needs root and a host without a kubelet. It runs with
# --pass-device-specs and the envvar strategy (its cdi-annotations strategy
# needs nvidia-ctk). --fakekubelet takes a prebuilt bench/fakekubelet (for a
# host without Go). With --gpus nvml and bin/nvmlrss (make gpu-e2e) it also
# prints what NVML alone holds once initialised: the floor under both plugins.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
gpus=sim:h100x8 allocations=200 bin= max_rss=25 max_stripped=20 anchor= fakekubelet=
while [ $# -gt 0 ]; do
  case $1 in
    --gpus) gpus=${2:?--gpus needs a value}; shift ;;
    --allocations) allocations=${2:?--allocations needs a number}; shift ;;
    --bin) bin=${2:?--bin needs a file}; shift ;;
    --max-rss-mib) max_rss=${2:?--max-rss-mib needs a number}; shift ;;
    --max-stripped-mb) max_stripped=${2:?--max-stripped-mb needs a number}; shift ;;
    --anchor) anchor=${2:?--anchor needs the nvidia-device-plugin binary}; shift ;;
    --fakekubelet) fakekubelet=${2:?--fakekubelet needs a file}; shift ;;
    -h | --help) sed -n '2,/^set -eu/{/^set -eu/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for v in allocations max_rss max_stripped; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "$v=${!v}: need a number" >&2; exit 2; }
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gantry-dp-footprint.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$anchor" ]; then
    rm -f /var/lib/kubelet/device-plugins/{kubelet.sock,kubelet.log,nvidia-gpu.sock}
    # Leave no kubelet directory behind where there was none (doctor reads it).
    [ -z "${made_kubelet_dir:-}" ] || rm -rf "$made_kubelet_dir"
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
export CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations"
cd "$REPO"

fail=0
if [ -z "$bin" ]; then
  bin=$WORK/gantry-device-plugin
  # As make build-device-plugin and the image build it.
  go build -tags grpcnotrace -trimpath -o "$bin" ./cmd/gantry-device-plugin
  go build -tags grpcnotrace -trimpath -ldflags "-s -w" -o "$bin.stripped" ./cmd/gantry-device-plugin
  size=$(stat -c %s "$bin") ssize=$(stat -c %s "$bin.stripped")
  pkgs=$(go list -tags grpcnotrace -deps ./cmd/gantry-device-plugin | wc -l)
  nonstd=$(go list -tags grpcnotrace -deps -f '{{if not .Standard}}{{.ImportPath}}{{end}}' ./cmd/gantry-device-plugin | grep -c .)
  mods=$(go list -tags grpcnotrace -deps -f '{{with .Module}}{{.Path}}{{end}}' ./cmd/gantry-device-plugin | sort -u | grep -vc '^github.com/gantry-gpu/gantry$')
  echo "== gantry-device-plugin binary ($(go env GOVERSION), $(go env GOOS)/$(go env GOARCH))"
  printf '%-28s %6.1f MB\n' "unstripped" "$(awk -v n="$size" 'BEGIN { print n / 1e6 }')"
  printf '%-28s %6.1f MB   (goal <= %s MB)\n' "stripped (-s -w)" "$(awk -v n="$ssize" 'BEGIN { print n / 1e6 }')" "$max_stripped"
  printf '%-28s %6d       (%d outside the standard library, from %d modules)\n' "packages linked" "$pkgs" "$nonstd" "$mods"
  if [ "$max_stripped" -gt 0 ] && [ "$ssize" -gt $((max_stripped * 1000000)) ]; then
    echo "FAIL: stripped binary over $max_stripped MB"; fail=1
  fi
fi
if [ -n "$fakekubelet" ]; then
  cp "$fakekubelet" "$WORK/fakekubelet"
else
  go build -o "$WORK/fakekubelet" ./bench/fakekubelet
fi

# status PID KEY: a process's /proc status value in KiB.
status() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
report() {
  printf '%-28s VmRSS %6s MiB  VmHWM %6s MiB  (file %s MiB, anon %s MiB)\n' "$2" \
    "$(mib "$(status "$1" VmRSS)")" "$(mib "$(status "$1" VmHWM)")" "$(mib "$(status "$1" RssFile)")" "$(mib "$(status "$1" RssAnon)")"
}

# measure NAME KUBELET-DIR SOCKET LOG: waits for the plugin (the last
# background job) to register with the fake kubelet serving KUBELET-DIR,
# reports its memory, makes the Allocate calls on SOCKET, reports again.
# Sets rss (KiB, after the calls).
measure() {
  local name=$1 dir=$2 sock=$3 log=$4 pid=$! i alloc addr lines
  pids+=("$pid")
  for ((i = 0; i < 300; i++)); do
    grep -q "^registered nvidia.com/gpu" "$dir/kubelet.log" && break
    kill -0 "$pid" 2>/dev/null || { cat "$log" "$dir/kubelet.log"; echo "FAIL: $name exited" >&2; exit 1; }
    sleep 0.1
  done
  grep -q '^registered nvidia.com/gpu' "$dir/kubelet.log" || { cat "$log" "$dir/kubelet.log"; echo "FAIL: $name: no registration in 30s" >&2; exit 1; }
  sleep 1 # labels written, metrics listening, health checks started
  echo "== $name: memory, $gpus"
  report "$pid" "after start"
  addr=$(sed -n 's/.*serving metrics addr=\([^ ]*\).*/\1/p' "$log" | head -1)
  if [ -n "$addr" ] && command -v curl >/dev/null; then
    lines=$(curl -fsS "http://$addr/metrics" | grep -c '^gantry_' || true)
    echo "metrics scraped: $lines gantry_ series"
  fi
  alloc=$("$WORK/fakekubelet" allocate "$sock" "$allocations")
  report "$pid" "after $allocations allocations"
  echo "Allocate RPC: $alloc"
  rss=$(status "$pid" VmRSS)
  kill "$pid" 2>/dev/null || true
}

mkdir "$WORK/kubelet"
"$WORK/fakekubelet" serve "$WORK/kubelet" >"$WORK/kubelet/kubelet.log" 2>&1 &
pids+=($!)
GANTRY_LABELS=file GANTRY_FEATURE_FILE=$WORK/features GANTRY_METRICS_ADDR=127.0.0.1:0 \
  GANTRY_POD_RESOURCES_SOCKET=$WORK/pod-resources.sock \
  "$bin" --gpus "$gpus" --kubelet-dir "$WORK/kubelet" --sim-health-socket "$WORK/health.sock" \
  --pass-device-specs --device-list-strategy envvar,cdi-annotations >"$WORK/plugin.log" 2>&1 &
measure "gantry-device-plugin (every feature on)" "$WORK/kubelet" "$WORK/kubelet/nvidia-gpu.sock" "$WORK/plugin.log"
if [ "$max_rss" -gt 0 ] && [ "$rss" -gt $((max_rss * 1024)) ]; then
  echo "FAIL: VmRSS $(mib "$rss") MiB over $max_rss MiB"; fail=1
fi

# With real NVML: what NVML alone holds (bin/nvmlrss, from make gpu-e2e), the
# floor under any plugin that uses it.
if [ "$gpus" = nvml ] && [ -x "$REPO/bin/nvmlrss" ]; then
  echo "== NVML alone (bin/nvmlrss: load, init, every GPU's handle and UUID)"
  "$REPO/bin/nvmlrss" | tail -1
fi

if [ -n "$anchor" ]; then
  dir=/var/lib/kubelet/device-plugins
  [ ! -e "$dir/kubelet.sock" ] || { echo "FAIL: $dir/kubelet.sock exists: a kubelet runs here; the anchor needs a host without one" >&2; exit 1; }
  [ -d /var/lib/kubelet ] || made_kubelet_dir=/var/lib/kubelet
  mkdir -p "$dir"
  "$WORK/fakekubelet" serve "$dir" >"$dir/kubelet.log" 2>&1 &
  pids+=($!)
  KUBELET_SOCKET=$dir/kubelet.sock "$anchor" --pass-device-specs --device-list-strategy envvar \
    --fail-on-init-error >"$WORK/anchor.log" 2>&1 &
  measure "NVIDIA's nvidia-device-plugin ($("$anchor" --version 2>/dev/null | head -1 | tr -d '\n'))" "$dir" "$dir/nvidia-gpu.sock" "$WORK/anchor.log"
  echo "NVIDIA's binary: $(awk -v n="$(stat -c %s "$anchor")" 'BEGIN { printf "%.1f", n / 1e6 }') MB as given"
fi
exit $fail
