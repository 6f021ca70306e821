#!/usr/bin/env bash
# Stops the test cluster test/cluster/up.sh started and removes what it left:
# its processes (pods and their shims included), mounts, cgroups, network
# namespaces, the bridge, the addresses on lo, the state directories, and
# /run/nvidia, /run/nvidia/mps and /var/run/cdi where up.sh's run made them
# and they are empty.
# Safe to run twice, or after a failed bring-up.
#
#   sudo test/cluster/down.sh [--keep-logs]
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/cluster/lib.sh
keep_logs= bin=$PWD/bin/cluster
for a in "$@"; do
  case "$a" in
    --keep-logs) keep_logs=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) gk_die "down.sh: unknown argument $a (see test/cluster/down.sh --help)" ;;
  esac
done
[ "$(id -u)" = 0 ] || gk_die "run as root (sudo test/cluster/down.sh)"
# Only what up.sh made: without its marker there is no test cluster here,
# and the kubelet's cgroups, /var/lib/kubelet and network namespaces of this
# machine are someone else's.
if [ ! -e "$GK_RUN/up" ] && [ ! -e /var/lib/kubelet/.gantry-k8s ]; then
  gk_log "down: no test cluster here (no $GK_RUN/up): nothing to do"
  exit 0
fi

# stop NAME...: SIGTERM the pid in $GK_RUN/NAME.pid, SIGKILL after 10 s.
stop() {
  local name pid
  for name in "$@"; do
    [ -f "$GK_RUN/$name.pid" ] || continue
    pid=$(cat "$GK_RUN/$name.pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null
    fi
    rm -f "$GK_RUN/$name.pid"
  done
}

# The kubelet first, so that it restarts nothing; then every pod's processes.
stop kubelet
# Processes of pods: everything in the kubelet's cgroups, then the shims
# (whose command line names this cluster's containerd socket).
pod_pids() {
  cat /sys/fs/cgroup/kubepods/cgroup.procs /sys/fs/cgroup/kubepods/*/cgroup.procs \
    /sys/fs/cgroup/kubepods/*/*/cgroup.procs /sys/fs/cgroup/kubepods/*/*/*/cgroup.procs \
    /sys/fs/cgroup/*/kubepods/cgroup.procs /sys/fs/cgroup/*/kubepods/*/cgroup.procs \
    /sys/fs/cgroup/*/kubepods/*/*/cgroup.procs /sys/fs/cgroup/*/kubepods/*/*/*/cgroup.procs 2>/dev/null | sort -u
}
for sig in TERM KILL; do
  pids=$(pod_pids)
  [ -z "$pids" ] || kill -$sig $pids 2>/dev/null
  sleep 0.5
done
stop kube-scheduler kube-controller-manager kube-apiserver etcd containerd containerd-daemon
for pid in $(gk_pgrep "containerd-shim-runc-v2 .*$GK_RUN/containerd.sock"); do kill -9 "$pid" 2>/dev/null; done

# Mounts under the state directories, the kubelet's and the containers',
# deepest first.
for root in "$GK_RUN" "$GK_STATE" /var/lib/kubelet; do
  awk -v r="$root" '$5 == r || index($5, r "/") == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
  done
done
if [ -f "$GK_RUN/run-nvidia-bind" ]; then umount /run/nvidia 2>/dev/null || umount -l /run/nvidia; fi

# cgroups: the kubelet's hierarchy in every controller, deepest first.
for top in /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods; do
  [ -d "$top" ] && find "$top" -depth -type d -exec rmdir {} + 2>/dev/null
done

gk_net link-del "$GK_BRIDGE"
for a in $GK_NODE_IP $GK_SERVICE_IP; do gk_net addr-del "$a"; done

if [ -n "$keep_logs" ] && [ -d "$GK_LOG" ]; then
  saved=/tmp/gantry-k8s-logs.$$
  mv "$GK_LOG" "$saved" && gk_log "logs kept in $saved"
fi
# The node's CDI spec up.sh wrote (only that file).
if [ -f "$GK_RUN/cdi-spec" ]; then rm -f "$(cat "$GK_RUN/cdi-spec")"; fi
# The host directories that did not exist before up.sh, once empty (a file
# put there by anything else keeps its directory).
if [ -f "$GK_RUN/made-dirs" ]; then
  while read -r d; do rmdir "$d" 2>/dev/null || true; done <"$GK_RUN/made-dirs"
fi
rm -rf "$GK_RUN" "$GK_STATE" "$GK_ETC" /var/lib/kubelet
left=$(gk_pgrep_cluster "$GK_STATE|$GK_RUN|$GK_ETC" || true)
if [ -n "$left" ]; then
  gk_log "still running: $(ps -o pid=,args= -p $(echo $left) 2>/dev/null)"
  exit 1
fi
gk_log "down: nothing of the test cluster is left"
