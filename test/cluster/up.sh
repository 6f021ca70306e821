#!/usr/bin/env bash
# Brings up a single-node Kubernetes cluster (v1.37.2, containerd v2.4.2)
# with Gantry installed the way a cluster admin installs it: `gantry runtime
# configure --runtime containerd`, then the RuntimeClass and the device plugin
# DaemonSet of deployments/static, its image imported into containerd. With
# --sim (the default on a machine without /dev/nvidiactl) the node gets a fake
# driver root and simulated GPUs; with --nvml the host's driver and GPUs.
#
#   sudo test/cluster/build.sh          # once: the binaries and images, into bin/cluster
#   sudo test/cluster/up.sh [--sim PROFILE | --nvml] [--driver-root DIR] [--bin DIR]
#   export KUBECONFIG=/etc/gantry-k8s/admin.conf PATH=$PWD/bin/cluster:$PATH
#   kubectl get nodes
#   sudo test/cluster/down.sh           # stops everything and removes the state
#
# Options:
#   --sim PROFILE      simulated GPUs (gantry sim profiles; default h100x8 without a GPU)
#   --nvml             the host's GPUs through NVML (default when /dev/nvidiactl exists)
#   --driver-root DIR  where the driver is (--nvml; default /, or /usr/local/nvidia's
#                      parent layout is found by Gantry itself)
#   --bin DIR          the binaries (default bin/cluster)
#   --dra              also Gantry's DRA plugin (deployments/static/gantry-dra-plugin.yaml,
#                      its DeviceClasses), side by side with the device plugin on
#                      the node: the device plugin keeps the first half of the GPUs,
#                      the DRA plugin publishes the rest (--devices); on a one-GPU
#                      host the DRA plugin gets the GPU and the device plugin is not
#                      installed; on simulated GPUs the node also has two IMEX
#                      channels (imex.nvidia.com). GANTRY_CLUSTER_DRA=1 does the same.
#   --dra-only         the DRA plugin alone, publishing every GPU; no device plugin
#                      (nvidia.com/gpu) on the node, and the device plugin scenarios
#                      skip. For claims of more GPUs than the --dra split leaves the
#                      DRA plugin (TestDRAClaimTwoGPUsCEL on a 2-GPU host).
#                      GANTRY_CLUSTER_DRA=only does the same.
#   --no-gantry        the node as it is before Gantry: containerd without Gantry's
#                      runtime and no CDI spec, for the node installer DaemonSet to set
#                      up (TestNodeInstaller); the device plugin DaemonSet selects on
#                      the installer's label gantry.dev/runtime-ready=true. containerd
#                      runs under a supervisor that starts it again when it exits, as
#                      a service manager does: the installer's restart command kills
#                      the pid in $GK_RUN/containerd-daemon.pid. GANTRY_CLUSTER_NO_GANTRY=1
#                      does the same.
#   --set-as-default   runtime configure --set-as-default: nvidia is containerd's
#                      default runtime, and pods without runtimeClassName use it
# Everything lives under /var/lib/gantry-k8s, /run/gantry-k8s, /etc/gantry-k8s and
# /var/lib/kubelet; logs in /var/lib/gantry-k8s/log. The node's address
# (10.199.0.1) and the kubernetes Service's (10.96.0.1) are added to lo, pods
# get 10.244.0.0/24 on the bridge gk8s0. There is no kube-proxy and no DNS.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
. test/cluster/lib.sh

mode= profile=h100x8 driver_root= bin=$repo/bin/cluster dra=${GANTRY_CLUSTER_DRA:-} no_gantry=${GANTRY_CLUSTER_NO_GANTRY:-} set_default=
dra_only=
[ "$dra" != only ] || dra_only=1
while [ $# -gt 0 ]; do
  case "$1" in
    --sim) mode=sim; profile=${2:?--sim needs a profile (gantry sim profiles)}; shift 2 ;;
    --nvml) mode=nvml; shift ;;
    --driver-root) driver_root=${2:?--driver-root needs a directory}; shift 2 ;;
    --bin) bin=$(cd "${2:?--bin needs a directory}" && pwd); shift 2 ;;
    --dra) dra=1; shift ;;
    --dra-only) dra=1 dra_only=1; shift ;;
    --no-gantry) no_gantry=1; shift ;;
    --set-as-default) set_default=--set-as-default; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) gk_die "up.sh: unknown argument $1 (see test/cluster/up.sh --help)" ;;
  esac
done
if [ -z "$mode" ]; then
  if [ -e /dev/nvidiactl ]; then mode=nvml; else mode=sim; fi
fi
[ -z "$no_gantry" ] || [ -z "$dra" ] || gk_die "up.sh: --no-gantry and --dra do not go together (yet)"
[ "$(id -u)" = 0 ] || gk_die "run as root (sudo test/cluster/up.sh)"
for f in gantry-k8s containerd-shim-runc-v2 runc gantry gantry-runtime gantry-cdi-hook cni/bridge images/gantry.tar images/pause.tar; do
  [ -e "$bin/$f" ] || gk_die "$bin/$f is missing: run test/cluster/build.sh first"
done
if [ -e "$GK_RUN/up" ]; then
  gk_die "a cluster is already up (since $(cat "$GK_RUN/up")): test/cluster/down.sh first"
fi
for port in 443 2379 2380 10250 10257 10259; do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    gk_die "port $port is in use (another Kubernetes on this machine?): stop it first"
  fi
done

# The kubelet's directory is the one the manifests name (/var/lib/kubelet).
# One that is not ours belongs to a kubelet of this machine: never touch it.
if [ -e /var/lib/kubelet ] && [ ! -e /var/lib/kubelet/.gantry-k8s ]; then
  gk_die "/var/lib/kubelet exists and is not this test cluster's: is a kubelet installed here? (remove it only if it is a leftover)"
fi
export PATH=$bin:$bin/cni:$PATH
# CRIU where scripts/install-criu.sh puts it, for containerd's CRI checkpoint
# (it looks criu up in its PATH) and runc under the shims.
case ":$PATH:" in *:/usr/local/sbin:*) ;; *) PATH=$PATH:/usr/local/sbin ;; esac
export LD_LIBRARY_PATH=$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$GK_STATE" "$GK_RUN" "$GK_ETC" "$GK_LOG" "$GK_ETC/cni"
date -u +%FT%TZ >"$GK_RUN/up"
# The host directories this cluster may create (up.sh itself, the
# DaemonSets' DirectoryOrCreate hostPaths) that do not exist yet, deepest
# first: down.sh removes each one that is then empty, and no other.
for d in /run/nvidia/mps /run/nvidia /var/run/cdi; do
  [ -e "$d" ] || echo "$d" >>"$GK_RUN/made-dirs"
done
mkdir -p /var/lib/kubelet && touch /var/lib/kubelet/.gantry-k8s
# From here on, a failure tears down what was started.
# (GK_KEEP=1 leaves it up, to look at.)
trap 'st=$?; if [ $st -ne 0 ]; then gk_log "bring-up failed (exit $st): logs in $GK_LOG"; pods_log; [ -n "${GK_KEEP:-}" ] || test/cluster/down.sh --keep-logs || true; fi' EXIT
# pods_log: what the pods did, into $GK_LOG/pods.log and its tail to stderr.
pods_log() {
  [ -e "$GK_KUBECONFIG" ] || return 0
  {
    KUBECONFIG=$GK_KUBECONFIG "$bin/kubectl" get pods -A -o wide
    KUBECONFIG=$GK_KUBECONFIG "$bin/kubectl" describe pods -n kube-system | tail -40
    for prev in --previous ""; do
      KUBECONFIG=$GK_KUBECONFIG "$bin/kubectl" logs -n kube-system -l app.kubernetes.io/name=gantry --tail=40 $prev
      [ -z "$dra" ] || KUBECONFIG=$GK_KUBECONFIG "$bin/kubectl" logs -n kube-system -l app.kubernetes.io/name=gantry-dra --tail=40 $prev
    done
  } >"$GK_LOG/pods.log" 2>&1
  tail -60 "$GK_LOG/pods.log" >&2
}

# start NAME CMD...: runs CMD in the background in its own session, logs to
# $GK_LOG/NAME.log, pid in $GK_RUN/NAME.pid.
start() {
  local name=$1; shift
  setsid "$@" </dev/null >>"$GK_LOG/$name.log" 2>&1 &
  echo $! >"$GK_RUN/$name.pid"
}

gk_log "addresses: node $GK_NODE_IP, kubernetes Service $GK_SERVICE_IP (on lo)"
for a in $GK_NODE_IP $GK_SERVICE_IP; do gk_net addr-add "$a"; done
"$bin/gantry-k8s" pki --dir "$GK_ETC/pki" --kubeconfig-dir "$GK_ETC" --node "$GK_NODE" --ip "$GK_NODE_IP" \
  --service-ip "$GK_SERVICE_IP" --server "https://$GK_NODE_IP:443"
P=$GK_ETC/pki

# Gantry's own configuration for the runtime: the GPUs and the driver.
case "$mode" in
  sim)
    driver_root=${driver_root:-$GK_STATE/driver}
    if [ ! -e "$driver_root/etc/ld.so.cache" ]; then
      gk_log "fake driver root in $driver_root (gantry sim driver-root)"
      # With the DRA plugin, two IMEX channels (the class imex.nvidia.com).
      "$bin/gantry" --gpus "sim:$profile" sim driver-root ${dra:+--imex-channels 2} "$driver_root" >/dev/null
    fi
    printf 'gpus = "sim:%s"\ndriver-root = "%s"\n' "$profile" "$driver_root" >"$GK_ETC/gantry.toml" ;;
  nvml)
    printf 'gpus = "nvml"\n' >"$GK_ETC/gantry.toml"
    [ -z "$driver_root" ] || printf 'driver-root = "%s"\n' "$driver_root" >>"$GK_ETC/gantry.toml" ;;
esac
# One line per container the runtime handles (containerd keeps its stderr).
# The runtime's caches in $GK_RUN, not the default /run/gantry: that is the
# host's own Gantry's (an installed one reads and writes it).
printf '[runtime]\nlog-file = "%s"\ndriver-tree-dir = "%s"\ncache-dir = "%s"\n' "$GK_LOG/gantry-runtime.log" "$GK_STATE/driver-trees" "$GK_RUN/cache" >>"$GK_ETC/gantry.toml"

# The node's CDI spec, as a GPU node has one (NVIDIA's plugin or nvidia-ctk
# writes it; Podman, where installed, takes GPUs only through it, and gantry
# doctor fails a node with Podman and no spec): /var/run/cdi/gantry-k8s.yaml,
# unless a spec there or in /etc/cdi already defines nvidia.com/gpu (then two
# would conflict). down.sh removes the file named in $GK_RUN/cdi-spec.
if [ -z "$no_gantry" ] && ! grep -qs '^kind: *"\?nvidia.com/gpu' /etc/cdi/*.yaml /var/run/cdi/*.yaml &&
  ! grep -qs '"kind": *"nvidia.com/gpu"' /etc/cdi/*.json /var/run/cdi/*.json; then
  mkdir -p /var/run/cdi
  "$bin/gantry" --config "$GK_ETC/gantry.toml" cdi generate --output /var/run/cdi/gantry-k8s.yaml >/dev/null
  echo /var/run/cdi/gantry-k8s.yaml >"$GK_RUN/cdi-spec"
fi

# The DaemonSet mounts /run/nvidia with HostToContainer propagation, which
# containerd allows only from a shared or slave mount.
mkdir -p /run/nvidia
if ! findmnt -n /run/nvidia >/dev/null 2>&1; then
  mount --bind /run/nvidia /run/nvidia
  touch "$GK_RUN/run-nvidia-bind"
fi
mount --make-rshared /run/nvidia

cat >"$GK_ETC/cni/10-gantry-k8s.conflist" <<CNI
{"cniVersion":"1.0.0","name":"gantry-k8s","plugins":[
 {"type":"bridge","bridge":"$GK_BRIDGE","isGateway":true,"ipMasq":false,"hairpinMode":true,
  "ipam":{"type":"host-local","dataDir":"$GK_STATE/cni-ipam","ranges":[[{"subnet":"$GK_POD_CIDR"}]],"routes":[{"dst":"0.0.0.0/0"}]}},
 {"type":"loopback"}]}
CNI

gk_log "containerd"
# Without CAP_SYS_RESOURCE (some VMs and containers drop it) no process may
# lower its oom_score_adj, and runc fails every pod asking for a negative
# one; containerd then has to clamp them.
restrict_oom=false
sh -c 'echo -1 >/proc/self/oom_score_adj' 2>/dev/null || restrict_oom=true
cat >"$GK_ETC/containerd.toml" <<TOML
version = 3
root = "$GK_STATE/containerd"
state = "$GK_RUN/containerd"

[grpc]
  address = "$GK_RUN/containerd.sock"

[ttrpc]
  address = "$GK_RUN/containerd.sock.ttrpc"

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = "$GK_STATE/opt"
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '$GK_PAUSE_IMAGE'
  [plugins.'io.containerd.cri.v1.runtime']
    enable_cdi = true
    restrict_oom_score_adj = $restrict_oom
    # Pod network namespaces under our state directory, not /var/run/netns.
    netns_mounts_under_state_dir = true
    cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            BinaryName = '$bin/runc'
            SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['$bin/cni']
      conf_dir = '$GK_ETC/cni'
TOML
if [ -z "$no_gantry" ]; then
  # The step a cluster admin runs: register Gantry's runtime as "nvidia" (the
  # RuntimeClass's handler).
  GANTRY_CONFIG=$GK_ETC/gantry.toml "$bin/gantry" runtime configure --runtime containerd $set_default \
    --config-file "$GK_ETC/containerd.toml" --runtime-path "$bin/gantry-runtime" >"$GK_LOG/runtime-configure.log"
  # gantry-runtime reads GANTRY_CONFIG from the environment containerd's shims
  # hand it; PATH finds this release's shim and runc first.
  start containerd env GANTRY_CONFIG="$GK_ETC/gantry.toml" "$bin/containerd" --config "$GK_ETC/containerd.toml"
else
  # A supervisor (outside every pod's cgroup) that starts containerd again
  # whenever it exits; on SIGTERM (down.sh) it stops containerd and itself.
  start containerd sh -c 'trap "kill \$c 2>/dev/null; wait \$c; exit 0" TERM INT
    while :; do
      env GANTRY_CONFIG="$0" "$1" --config "$2" & c=$!
      echo $c >"$3"
      wait $c
      sleep 0.2
    done' "$GK_ETC/gantry.toml" "$bin/containerd" "$GK_ETC/containerd.toml" "$GK_RUN/containerd-daemon.pid"
  touch "$GK_RUN/no-gantry"
  # The spec the node installer will write (TestNodeInstaller), removed by
  # down.sh should an uninstall not have.
  echo /var/run/cdi/gantry-k8s.yaml >"$GK_RUN/cdi-spec"
fi
ctr() { "$bin/ctr" --address "$GK_RUN/containerd.sock" "$@"; }
gk_wait 60 containerd ctr version
for img in "$bin"/images/*.tar; do
  ctr -n k8s.io images import --local "$img" >>"$GK_LOG/images.log" 2>&1 ||
    gk_die "ctr images import $img failed: see $GK_LOG/images.log"
done

gk_log "etcd"
# etcd's /health, without curl (GPU hosts may lack it).
etcd_healthy() {
  exec 3<>/dev/tcp/127.0.0.1/2379 || return 1
  printf 'GET /health HTTP/1.0\r\n\r\n' >&3
  grep -q '"health":"true"' <&3
  local st=$?
  exec 3<&-
  return $st
}
start etcd "$bin/etcd" --name "$GK_NODE" --data-dir "$GK_STATE/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster "$GK_NODE=http://127.0.0.1:2380" --unsafe-no-fsync --log-level warn
gk_wait 60 etcd etcd_healthy

gk_log "kube-apiserver"
start kube-apiserver "$bin/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
  --secure-port 443 --bind-address 0.0.0.0 --advertise-address "$GK_NODE_IP" \
  --service-cluster-ip-range "$GK_SERVICE_CIDR" --allow-privileged=true \
  --client-ca-file "$P/ca.crt" --tls-cert-file "$P/apiserver.crt" --tls-private-key-file "$P/apiserver.key" \
  --kubelet-client-certificate "$P/apiserver-kubelet-client.crt" --kubelet-client-key "$P/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority "$P/ca.crt" --kubelet-preferred-address-types InternalIP \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$P/sa.pub" --service-account-signing-key-file "$P/sa.key" \
  --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction
export KUBECONFIG=$GK_KUBECONFIG
gk_wait 120 kube-apiserver "$bin/kubectl" get --raw /readyz

gk_log "kube-controller-manager, kube-scheduler"
start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig "$GK_ETC/controller-manager.conf" \
  --authentication-kubeconfig "$GK_ETC/controller-manager.conf" --authorization-kubeconfig "$GK_ETC/controller-manager.conf" \
  --root-ca-file "$P/ca.crt" --service-account-private-key-file "$P/sa.key" --use-service-account-credentials \
  --cluster-signing-cert-file "$P/ca.crt" --cluster-signing-key-file "$P/ca.key" \
  --leader-elect=false --bind-address 127.0.0.1
start kube-scheduler "$bin/kube-scheduler" --kubeconfig "$GK_ETC/scheduler.conf" \
  --authentication-kubeconfig "$GK_ETC/scheduler.conf" --authorization-kubeconfig "$GK_ETC/scheduler.conf" \
  --leader-elect=false --bind-address 127.0.0.1

gk_log "kubelet"
cgv1=false
[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] || cgv1=true
cat >"$GK_ETC/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $GK_NODE_IP
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $P/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $P/kubelet-server.crt
tlsPrivateKeyFile: $P/kubelet-server.key
cgroupDriver: cgroupfs
failCgroupV1: $( $cgv1 && echo false || echo true )
failSwapOn: false
containerRuntimeEndpoint: unix://$GK_RUN/containerd.sock
readOnlyPort: 0
protectKernelDefaults: false
rotateCertificates: false
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
YAML
start kubelet "$bin/kubelet" --config "$GK_ETC/kubelet.yaml" --kubeconfig "$GK_ETC/kubelet.conf" \
  --hostname-override "$GK_NODE" --node-ip "$GK_NODE_IP" --node-labels nvidia.com/gpu.present=true
gk_wait 120 "node $GK_NODE Ready" sh -c "$bin/kubectl get node $GK_NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"

gpus=$("$bin/gantry" --config "$GK_ETC/gantry.toml" info --json | grep -c '"uuid": *"GPU-' || true)
# With --dra the node's GPUs are split between the two plugins the way an
# admin splits them (docs/guide.md, "Beside the device plugin"): the device
# plugin offers the first half (GANTRY_DEVICES), the DRA plugin publishes
# the rest (GANTRY_DRA_DEVICES); each refuses to start on the other's GPUs.
# With --dra-only the DRA plugin publishes them all and there is no device
# plugin.
dp_gpus=$gpus
if [ -n "$dra" ]; then
  dp_gpus=$((gpus / 2))
  [ -z "$dra_only" ] || dp_gpus=0
  dra_devices=$(seq -s, "$dp_gpus" $((gpus - 1)))
fi

if [ "$dp_gpus" -gt 0 ]; then
  gk_log "Gantry: RuntimeClass and device plugin DaemonSet (deployments/static)"
  manifest=$GK_ETC/gantry-device-plugin.yaml
  cp deployments/static/gantry-device-plugin.yaml "$manifest"
  if [ "$mode" = sim ]; then
    # The manifest's own configuration, set the way a user sets it: the
    # ConfigMap's gantry section selects simulated GPUs. (Faults are injected
    # through the plugin's socket, /proc/PID/root/run/gantry/sim-health.sock.)
    # A 20 s recovery quiet period instead of 10 minutes, so that a GPU made
    # unhealthy by an injected XID comes back within a test.
    awk -v sim="sim:$profile" '
      {print} /^    version: v1$/ && !done {print "    gantry:"; print "      gpus: " sim;
        print "      health:"; print "        recoveryQuietPeriod: 20s"; done=1}' \
      deployments/static/gantry-device-plugin.yaml >"$manifest"
  fi
  if [ "$dp_gpus" != "$gpus" ]; then
    # Beside the DRA plugin: the device plugin offers only the first
    # $dp_gpus GPUs (GANTRY_DEVICES), simulated or real alike. (Not
    # NVIDIA_VISIBLE_DEVICES: the plugin's pod is privileged and sees every
    # GPU whatever the variable says.)
    awk -v list="$(seq -s, 0 $((dp_gpus - 1)))" '
      { print } /^ *env:$/ && !done { ind = $0; sub(/env:$/, "", ind)
        print ind "  - name: GANTRY_DEVICES"; print ind "    value: \"" list "\""; done = 1 }' \
      "$manifest" >"$manifest.tmp" && mv "$manifest.tmp" "$manifest"
  fi
  if [ -n "$no_gantry" ]; then
    # The plugin starts once the node installer has set the node up.
    awk '{print} /^      serviceAccountName: gantry$/ {print "      nodeSelector:"; print "        gantry.dev/runtime-ready: \"true\""}' \
      "$manifest" >"$manifest.tmp" && mv "$manifest.tmp" "$manifest"
    grep -q 'gantry.dev/runtime-ready' "$manifest" || gk_die "could not add the ready label's nodeSelector to $manifest"
  fi
  "$bin/kubectl" apply -f "$manifest" >"$GK_LOG/apply.log"
fi

if [ -n "$dra" ]; then
  gk_log "Gantry: DRA plugin DaemonSet and DeviceClasses (deployments/static/gantry-dra-plugin.yaml), devices $dra_devices"
  manifest=$GK_ETC/gantry-dra-plugin.yaml
  # The manifest's environment, set for this node: the GPUs (simulated or
  # NVML), the driver root, the hook where build.sh put it, and the devices
  # the DRA plugin publishes. The host's / is mounted with HostToContainer
  # propagation, which containerd allows only where / is a shared or slave
  # mount; on a host whose / is private (containers, some VMs) the mount is
  # made without it (driver roots mounted later would not be seen).
  private=
  [ "$(findmnt -no PROPAGATION / 2>/dev/null)" != private ] || private=1
  dra_gpus=
  [ "$mode" != sim ] || dra_gpus=sim:$profile
  awk -v gpus="$dra_gpus" -v devs="$dra_devices" -v root="${driver_root:-/}" -v hook="$bin/gantry-cdi-hook" -v private="$private" '
    private && /mountPropagation: HostToContainer/ { next }
    prev ~ /name: NVIDIA_DRIVER_ROOT$/ { sub(/value: .*/, "value: \"" root "\"") }
    prev ~ /name: GANTRY_CDI_HOOK_PATH$/ { sub(/value: .*/, "value: \"" hook "\"") }
    { print; prev = $0 }
    /^ *env:$/ { ind = $0; sub(/env:$/, "", ind)
      if (gpus != "") { print ind "  - name: GANTRY_GPUS"; print ind "    value: \"" gpus "\"" }
      print ind "  - name: GANTRY_DRA_DEVICES"; print ind "    value: \"" devs "\"" }' \
    deployments/static/gantry-dra-plugin.yaml >"$manifest"
  "$bin/kubectl" apply -f "$manifest" >"$GK_LOG/apply-dra.log"
  want_dra=$(($(echo "$dra_devices" | tr , '\n' | wc -l)))
  gk_wait "${GK_WAIT:-180}" "$want_dra DRA devices of $GK_NODE in ResourceSlices" sh -c \
    "$bin/kubectl get resourceslices --field-selector spec.nodeName=$GK_NODE -o jsonpath='{range .items[*].spec.devices[*]}{.name}{\"\\n\"}{end}' | grep -c ^gpu- | grep -qx $want_dra"
fi
if [ "$dp_gpus" -gt 0 ] && [ -z "$no_gantry" ]; then
  gk_wait "${GK_WAIT:-180}" "nvidia.com/gpu on $GK_NODE" sh -c \
    "$bin/kubectl get node $GK_NODE -o jsonpath='{.status.allocatable.nvidia\.com/gpu}' | grep -qx '[1-9][0-9]*'"
fi
trap - EXIT
gk_log "up: node $GK_NODE, $("$bin/kubectl" get node $GK_NODE -o jsonpath='{.status.allocatable.nvidia\.com/gpu}') nvidia.com/gpu${dra:+, DRA devices $dra_devices} (Gantry sees $gpus GPUs)"
echo "export KUBECONFIG=$GK_KUBECONFIG PATH=$bin:\$PATH"
