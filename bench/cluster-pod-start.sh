#!/usr/bin/env bash
# Pod start time on the live test cluster (test/cluster/up.sh): from
# `kubectl apply` of a pod to its container running (the kubelet's
# ContainersReady), for a pod asking for GPUs under Gantry's runtime class
# beside the same pod asking for none under plain runc, interleaved, so the
# two compare within one run. Reports min / median / p90 / max in ms.
#
#   bench/cluster-pod-start.sh [--rounds N] [--gpus N]     (default 10 rounds, 1 GPU)
# Needs the cluster up (KUBECONFIG defaults to /etc/gantry-k8s/admin.conf).
# Its pods carry NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# NVSHMEM_DISABLE_NVLS=1, as the scenario tests' do: NVLink multicast off on
# the shared multi-GPU hosts.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=10 gpus=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?}; shift 2 ;;
    --gpus) gpus=${2:?}; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "cluster-pod-start.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
export KUBECONFIG=${KUBECONFIG:-/etc/gantry-k8s/admin.conf}
k=${GANTRY_CLUSTER_BIN:-bin/cluster}/kubectl
ns=bench-pod-start
"$k" delete namespace $ns --ignore-not-found --wait=true >/dev/null
"$k" create namespace $ns >/dev/null
trap '"$k" delete namespace $ns --wait=false >/dev/null 2>&1 || true' EXIT

pod() { # NAME GPUS
  local res="" rc=""
  if [ "$2" -gt 0 ]; then
    res="    resources: {limits: {nvidia.com/gpu: $2}}"
    rc="  runtimeClassName: nvidia"
  fi
  cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: $ns}
spec:
  terminationGracePeriodSeconds: 0
$rc
  containers:
  - name: main
    image: localhost/gantry-k8s/probe:1
    imagePullPolicy: Never
    command: ["sleep", "3600"]
    env: [{name: NCCL_NVLS_ENABLE, value: "0"}, {name: TORCH_SYMM_MEM_DISABLE_MULTICAST, value: "1"}, {name: NVSHMEM_DISABLE_NVLS, value: "1"}]
$res
YAML
}

# time_one NAME GPUS: ms from apply to ContainersReady=True.
time_one() {
  local t0 t1
  t0=$(date +%s%N)
  pod "$1" "$2" | "$k" apply -f - >/dev/null
  "$k" wait -n $ns --for=condition=ContainersReady "pod/$1" --timeout=120s >/dev/null
  t1=$(date +%s%N)
  "$k" delete pod -n $ns "$1" --grace-period=0 --force --wait=true >/dev/null 2>&1
  echo $(((t1 - t0) / 1000000))
}

stats() { # label values...
  local label=$1; shift
  printf '%s\n' "$@" | sort -n | awk -v l="$label" '{v[NR]=$1} END {
    printf "%-34s n=%d min %d median %d p90 %d max %d ms\n", l, NR, v[1], v[int((NR+1)/2)], v[int(NR*0.9+0.999)], v[NR] }'
}

gpu=() plain=()
for i in $(seq "$rounds"); do
  gpu+=("$(time_one gpu-$i "$gpus")")
  plain+=("$(time_one plain-$i 0)")
done
echo "pod apply -> container running, $rounds rounds, interleaved"
stats "runtimeClass nvidia, $gpus GPU(s)" "${gpu[@]}"
stats "no GPU, plain runc" "${plain[@]}"
