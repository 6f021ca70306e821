# Shared by test/cluster/{build,up,down}.sh: where the test cluster keeps its
# files and how to reach it. One cluster per machine: fixed ports
# (443, 2379, 2380, 10250, 10257, 10259) and the kubelet's /var/lib/kubelet,
# which the device plugin's manifests name.
GK_STATE=${GK_STATE:-/var/lib/gantry-k8s}   # etcd, containerd root, driver root, logs
GK_RUN=${GK_RUN:-/run/gantry-k8s}           # sockets, pid files, containerd state
GK_ETC=${GK_ETC:-/etc/gantry-k8s}           # pki, kubeconfigs, component configs
GK_LOG=$GK_STATE/log
GK_NODE=${GK_NODE:-gantry-node}
# The node's address and the kubernetes Service's address live on lo: the
# cluster needs no network of the host's, and pods reach the API server at
# 10.96.0.1:443 through the bridge with no kube-proxy and no iptables.
GK_NODE_IP=${GK_NODE_IP:-10.199.0.1}
GK_SERVICE_IP=10.96.0.1
GK_SERVICE_CIDR=10.96.0.0/24
GK_POD_CIDR=${GK_POD_CIDR:-10.244.0.0/24}
GK_BRIDGE=gk8s0
GK_KUBECONFIG=$GK_ETC/admin.conf
GK_COMPONENTS="etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl containerd ctr"
# The images the cluster imports (built by build.sh, never pulled).
GK_PAUSE_IMAGE=localhost/gantry-k8s/pause:1
GK_PROBE_IMAGE=localhost/gantry-k8s/probe:1
GK_PROBE_ALL_IMAGE=localhost/gantry-k8s/probe-all:1

gk_log() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }
gk_die() { printf 'gantry-k8s: %s\n' "$*" >&2; exit 1; }

# gk_wait SECONDS WHAT CMD...: runs CMD every half second until it succeeds.
gk_wait() {
  local secs=$1 what=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $end ]; then
      gk_log "timed out after ${secs}s waiting for $what"
      return 1
    fi
    sleep 0.5
  done
}

# gk_net addr-add|addr-del IP, gk_net link-del NAME: through gantry-k8s's
# rtnetlink helper (hosts without iproute2), else ip.
gk_net() {
  local k8s=${bin:-bin/cluster}/gantry-k8s
  if [ -x "$k8s" ]; then
    "$k8s" net "$@"
    return
  fi
  case "$1" in
    addr-add) ip -4 addr show dev lo | grep -q " $2/" || ip addr add "$2/32" dev lo ;;
    addr-del) ip addr del "$2/32" dev lo 2>/dev/null || true ;;
    link-del) ip link del "$2" 2>/dev/null || true ;;
  esac
}

# gk_pgrep REGEX: pids whose command line matches (pgrep -f, without procps).
gk_pgrep() {
  local d
  for d in /proc/[0-9]*; do
    [ "${d#/proc/}" = "$$" ] && continue
    tr '\0' ' ' 2>/dev/null <"$d/cmdline" | grep -qE -- "$1" && echo "${d#/proc/}"
  done
}

# gk_pgrep_cluster REGEX: gk_pgrep, less the processes that only name the
# cluster's paths in their arguments (a shell, flock or make waiting to run
# up.sh or down.sh, an editor): what is left of a cluster runs a program.
gk_pgrep_cluster() {
  local pid exe
  for pid in $(gk_pgrep "$1"); do
    exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue
    case "${exe##*/}" in
      bash|sh|dash|flock|timeout|env|make|sleep|tee|grep|less|vi|vim|nano) continue ;;
    esac
    echo "$pid"
  done
}
