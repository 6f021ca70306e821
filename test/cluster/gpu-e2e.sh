#!/usr/bin/env bash
# The live-cluster test on a host with NVIDIA GPUs and no compiler: unpacks
# the archive test/cluster/build.sh --pack made (if given), brings the cluster
# up on the host's real GPUs (NVML), runs the scenario tests there (pods run
# nvidia-smi -L and a CUDA kernel), times pod starts with and without a GPU
# (bench/cluster-pod-start.sh), and tears everything down.
#
#   test/cluster/build.sh --pack                          # on the build machine
#   sudo test/cluster/gpu-e2e.sh [bin/cluster.tar.xz]     # on the GPU host
# Extra arguments after the archive go to up.sh (e.g. --driver-root /run/nvidia/driver,
# or --dra with GANTRY_CLUSTER_RUN=^TestDRA for the DRA scenarios).
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ $# -gt 0 ] && [ -f "$1" ]; then
  test/cluster/unpack.sh "$1" || exit 1
  shift
fi
[ -x bin/cluster/cluster.test ] || { echo "gpu-e2e.sh: bin/cluster is not built: test/cluster/build.sh --pack, then pass the archive" >&2; exit 1; }
st=0
t0=$(date +%s%N)
if ! test/cluster/up.sh --nvml "$@"; then
  for f in /tmp/gantry-k8s-logs.*/{kubelet,containerd}.log; do echo "== $f"; grep -E '^E|level=error' "$f" | tail -8 | cut -c1-400; done
  exit 1
fi
echo "cluster up in $((($(date +%s%N) - t0) / 1000000)) ms"
export KUBECONFIG=/etc/gantry-k8s/admin.conf
bin/cluster/kubectl get nodes -o wide
bin/cluster/kubectl get node gantry-node -o jsonpath='{.status.allocatable.nvidia\.com/gpu}{" nvidia.com/gpu allocatable\n"}'
GANTRY_CLUSTER=1 GANTRY_CLUSTER_REAL_GPU=1 GANTRY_CLUSTER_BIN=$PWD/bin/cluster \
  bin/cluster/cluster.test -test.v -test.count=1 -test.run "${GANTRY_CLUSTER_RUN:-.}" 2>&1 | tee /tmp/cluster-test.log || st=1
grep -E '^(--- |ok|FAIL|PASS)' /tmp/cluster-test.log
# (Not with up.sh --dra on a one-GPU host: the DRA plugin has the GPU.)
if [ -n "$(bin/cluster/kubectl get node gantry-node -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')" ]; then
  bench/cluster-pod-start.sh --rounds "${ROUNDS:-10}" || st=1
fi
test/cluster/down.sh || st=1
exit $st
