#!/usr/bin/env bash
# The live-cluster test on a host with NVIDIA GPUs and no compiler: unpacks
# the archive test/cluster/build.sh --pack made (if given), then runs one pass
# per cluster mode the host allows, each bringing the cluster up on the host's
# real GPUs (NVML), running its scenario tests there (pods run nvidia-smi -L
# and a CUDA kernel) and tearing it down:
#   a  up.sh --nvml: the device plugin with every GPU; every scenario but the
#      DRA ones; then pod start times with and without a GPU
#      (bench/cluster-pod-start.sh, ROUNDS rounds, default 10)
#   b  up.sh --nvml --dra (2 GPUs or more): the device plugin keeps the first
#      half, the DRA plugin the rest; the DRA scenarios (TestDRA*) and
#      TestPluginsRefuseOverlap
#   c  up.sh --nvml --dra-only (2 GPUs or more): the DRA plugin with every GPU;
#      TestDRAClaimTwoGPUsCEL (a claim for 2 GPUs)
# It ends with a summary per pass (PASS/FAIL/SKIP counts and names) and exits
# non-zero on any failed test, bring-up or teardown.
#
#   test/cluster/build.sh --pack                          # on the build machine
#   sudo test/cluster/gpu-e2e.sh [bin/cluster.tar.xz] [--passes a,b,c] [--budget SECONDS] [UP.SH ARGS...]
#
# --passes picks passes (default: a, and b,c on 2 GPUs or more; a pass asked
# for runs whatever the GPU count). --budget SECONDS (GANTRY_E2E_BUDGET): for
# a call with a time limit, counted from the start, unpacking included. A
# pass starts only with enough of it left (a and b 300 s, c 100 s: one that
# does not fit is passed over, a later one that fits still runs), its tests
# stop 60 s before the end (-test.timeout; the tests then running are FAILs,
# "timed out") so that the teardown and the summary still come, and the bench
# is left out with under 120 s left. A pass left out is NOT RUN in the
# summary (exit 1): run it next with --passes.
# The remaining arguments go to every pass's up.sh (e.g. --driver-root
# /run/nvidia/driver; --sim PROFILE runs it all on simulated GPUs). As before,
# --dra alone means --passes b and --dra-only --passes c.
# GANTRY_CLUSTER_RUN=REGEX replaces the tests of every pass run.
# TestCheckpointGPUPod (pass a) needs CRIU 4.x (criu in PATH:
# scripts/install-criu.sh) and iptables-restore and ip6tables-restore where
# containerd runs: CRIU locks the pod's network namespace with them. On a host
# without iptables it checks that gantry-runtime refuses, then skips. A host
# with no iptables and no network gets the build machine's through
# test/cluster/iptables-carry.sh (pack there, install here): on the H200 test
# hosts Debian 12's, nft backend, did the lock (2026-11-29).
# Every pod's containers carry NCCL_NVLS_ENABLE=0,
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 (NVLink
# multicast off: on a shared multi-GPU host it can take the GPUs out of
# service), and so does this script's own environment.
#
# Measured with --sim h100x8 (8 simulated GPUs) on the shared 2-core build
# machine, 2026-11-29, one pass a call:
#   pass a  330 s: up 27, tests 231 (14 PASS, 2 SKIP), bench 54 (10 rounds), down 18
#   pass b  543 s: up 25, tests 486 (11 PASS, 1 FAIL), down 32; of the tests,
#           TestDRAMPSSharedClaim failed after its 180 s wait (this machine's /
#           is a private mount, and the MPS daemon's shm needs propagation):
#           about 375 s where it passes
#   pass c   48 s: up 19, tests 11 (TestDRAClaimTwoGPUsCEL), down 18
# All three, some 12.5 minutes, do not fit one 10-minute call: on a 2-GPU
# host (bring-up about a minute there) run
#   gpu-e2e.sh bin/cluster.tar.xz --budget 570   # a, then c; b NOT RUN
#   gpu-e2e.sh bin/cluster.tar.xz --passes b --budget 570
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$(date +%s)
if [ $# -gt 0 ] && [ -f "$1" ]; then
  test/cluster/unpack.sh "$1" || exit 1
  shift
fi
passes= up_args=() sim= driver_root= budget=${GANTRY_E2E_BUDGET:-0}
while [ $# -gt 0 ]; do
  case "$1" in
    --passes) passes=${2:?--passes needs a list, e.g. a,b,c}; shift 2 ;;
    --budget) budget=${2:?--budget needs seconds}; shift 2 ;;
    --dra) passes=${passes:-b}; shift ;;
    --dra-only) passes=${passes:-c}; shift ;;
    --sim) sim=${2:?--sim needs a profile}; up_args+=("$1" "$2"); shift 2 ;;
    --driver-root) driver_root=${2:?--driver-root needs a directory}; up_args+=("$1" "$2"); shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) up_args+=("$1"); shift ;;
  esac
done
case "$budget" in ''|*[!0-9]*) echo "gpu-e2e.sh: --budget $budget: want whole seconds (0: none)" >&2; exit 2 ;; esac
[ -x bin/cluster/cluster.test ] || { echo "gpu-e2e.sh: bin/cluster is not built: test/cluster/build.sh --pack, then pass the archive" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "gpu-e2e.sh: run as root (sudo test/cluster/gpu-e2e.sh)" >&2; exit 1; }

# The host's GPUs, as up.sh counts them.
if [ -n "$sim" ]; then
  gpus=$(bin/cluster/gantry --gpus "sim:$sim" info --json 2>/dev/null | grep -c '"uuid": *"GPU-')
else
  gpus=$(bin/cluster/gantry --gpus nvml ${driver_root:+--driver-root "$driver_root"} info --json 2>/dev/null | grep -c '"uuid": *"GPU-')
  [ "$gpus" -gt 0 ] || gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi
if [ -z "$passes" ]; then
  passes=a
  [ "$gpus" -lt 2 ] || passes=a,b,c
fi
for p in ${passes//,/ }; do
  case "$p" in a|b|c) ;; *) echo "gpu-e2e.sh: unknown pass $p in --passes $passes (a, b or c; see --help)" >&2; exit 2 ;; esac
done
echo "gpu-e2e.sh: $gpus GPU(s)${sim:+ (sim:$sim)}; passes $passes"

real=1
[ -z "$sim" ] || real=
export KUBECONFIG=/etc/gantry-k8s/admin.conf
summary=() st=0

# With --budget: a pass starts only with at least its need seconds left
# (about what it took on sim:h100x8 here, less its tail: a pass cut short
# has to run again whole), its tests stop (-test.timeout) reserve seconds
# before the end, which leaves the teardown and the summary their time, and
# bench only runs with min_bench seconds left.
declare -A need=([a]=300 [b]=300 [c]=100)
reserve=60 min_bench=120
left() { echo $((budget - ($(date +%s) - start))); }
not_run=()

# pass NAME: up, tests, (bench), down; appends its line to summary.
pass() {
  local name=$1 up run skip="" what log t0 t1 t2 t3 pst=0 down_st=0 timeout=()
  case "$name" in
    a) up=(--nvml) what="device plugin"; run=. skip='^(TestDRA|TestPluginsRefuseOverlap$)' ;;
    b) up=(--nvml --dra) what="DRA beside the device plugin"; run='^(TestDRA|TestPluginsRefuseOverlap$)' ;;
    c) up=(--nvml --dra-only) what="DRA alone"; run='^TestDRAClaimTwoGPUsCEL$' ;;
  esac
  if [ "$budget" -gt 0 ] && [ "$(left)" -lt "${need[$name]}" ]; then
    summary+=("pass $name ($what): NOT RUN: $(left) s of the --budget $budget s left (it needs ${need[$name]}): run it next with --passes $name")
    not_run+=("$name")
    return
  fi
  run=${GANTRY_CLUSTER_RUN:-$run}
  log=/tmp/cluster-test-$name.log
  : >"$log"
  echo "=== pass $name ($what): up.sh ${up[*]} ${up_args[*]-}; tests $run${skip:+, not $skip}"
  test/cluster/down.sh >/dev/null 2>&1
  t0=$(date +%s)
  if ! test/cluster/up.sh "${up[@]}" ${up_args[@]+"${up_args[@]}"}; then
    # The logs up.sh kept (down.sh --keep-logs) from this bring-up.
    for d in $(find /tmp -maxdepth 1 -name 'gantry-k8s-logs.*' -newermt "@$t0" 2>/dev/null); do
      for f in "$d"/kubelet.log "$d"/containerd.log; do
        [ -f "$f" ] || continue
        echo "== $f"; grep -E '^E|level=error' "$f" | tail -8 | cut -c1-400
      done
    done
    test/cluster/down.sh >/dev/null 2>&1
    summary+=("pass $name ($what): FAIL: up.sh ${up[*]} failed after $(($(date +%s) - t0)) s")
    st=1
    return
  fi
  t1=$(date +%s)
  echo "cluster up in $((t1 - t0)) s"
  bin/cluster/kubectl get nodes -o wide
  bin/cluster/kubectl get node gantry-node -o jsonpath='{.status.allocatable.nvidia\.com/gpu}{" nvidia.com/gpu allocatable\n"}'
  [ "$budget" = 0 ] || timeout=(-test.timeout "$(($(left) - reserve > 30 ? $(left) - reserve : 30))s")
  # In the package's directory, as go test runs it (the tests read files
  # of the tree by relative paths).
  (cd test/cluster && GANTRY_CLUSTER=1 GANTRY_CLUSTER_REAL_GPU=$real GANTRY_CLUSTER_BIN=$OLDPWD/bin/cluster \
    ../../bin/cluster/cluster.test -test.v -test.count=1 -test.run "$run" ${skip:+-test.skip "$skip"} ${timeout[@]+"${timeout[@]}"}) 2>&1 | tee "$log"
  pst=${PIPESTATUS[0]}
  grep -E '^(--- |ok|FAIL|PASS)' "$log"
  t2=$(date +%s)
  # Pod start times, with the device plugin only.
  local bench=""
  if [ "$name" = a ] && [ "$budget" -gt 0 ] && [ "$(left)" -lt "$min_bench" ]; then
    bench=", bench/cluster-pod-start.sh NOT RUN ($(left) s of the budget left)"
  elif [ "$name" = a ] && [ -n "$(bin/cluster/kubectl get node gantry-node -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')" ]; then
    if bench/cluster-pod-start.sh --rounds "${ROUNDS:-10}"; then
      bench=", bench $(($(date +%s) - t2)) s"
    else
      bench=", bench/cluster-pod-start.sh FAILED"; pst=1
    fi
  fi
  t3=$(date +%s)
  test/cluster/down.sh || down_st=1
  local passed failed skipped n_p n_f n_s verdict=PASS
  passed=$(sed -n 's/^--- PASS: \([^ ]*\).*/\1/p' "$log" | tr '\n' ' ')
  failed=$(sed -n 's/^--- FAIL: \([^ ]*\).*/\1/p' "$log" | tr '\n' ' ')
  skipped=$(sed -n 's/^--- SKIP: \([^ ]*\).*/\1/p' "$log" | tr '\n' ' ')
  # Tests still running when -test.timeout (the budget) ran out.
  if grep -q '^panic: test timed out' "$log"; then
    failed="$failed$(sed -n '/running tests:/,/^$/s/^[[:space:]]*\(Test[^ ]*\).*/\1 (timed out)/p' "$log" | tr '\n' ' ')"
  fi
  n_p=$(echo $passed | wc -w) n_f=$(echo "$failed" | grep -o 'Test[^ ]*' | wc -l) n_s=$(echo $skipped | wc -w)
  # A test binary that failed with no --- FAIL line (a panic, a timeout)
  # fails the pass too.
  if [ "$pst" != 0 ] || [ "$n_f" -gt 0 ] || [ "$down_st" != 0 ]; then verdict=FAIL st=1; fi
  [ "$down_st" = 0 ] || bench="$bench, down.sh FAILED"
  summary+=("pass $name ($what): $verdict: $n_p PASS, $n_f FAIL, $n_s SKIP in $(($(date +%s) - t0)) s (up $((t1 - t0)) s, tests $((t2 - t1)) s, down $(($(date +%s) - t3)) s)$bench
    PASS: ${passed:--}
    FAIL: ${failed:--}
    SKIP: ${skipped:--}")
}

for p in ${passes//,/ }; do pass "$p"; done
echo
echo "=== gpu-e2e.sh summary ($gpus GPU(s)${sim:+, sim:$sim}; logs /tmp/cluster-test-PASS.log)"
printf '%s\n' "${summary[@]}"
echo "total $(($(date +%s) - start)) s${not_run[*]:+; not run for lack of time: ${not_run[*]} (a failure)}"
[ ${#not_run[@]} = 0 ] || st=1
exit $st
