#!/usr/bin/env bash
# Runs Go tests twice in private mount namespaces (unshare -m): once on a
# host with none of the state a GPU node has, once on a host where a kubelet
# runs and Gantry and NVIDIA's container toolkit are installed (fake but
# realistic files and listening sockets at the real paths). Tests must be
# hermetic: they pass, with the same verdicts, in both.
#
#   scripts/hermetic-check.sh [-m with|without|both] [GO TEST ARGS] [PACKAGES]
#
# Default packages: the doctor checks and every test that runs gantry doctor
# (./internal/doctor ./internal/cli ./cmd/gantry ./docs). Default -m both.
# Needs root, unshare (util-linux), overlayfs and socat.
#
# What the host sees is never touched: in the namespace /etc, /usr/bin,
# /var/lib and /run (so /var/run) are overlays of themselves whose writes go
# to a temporary directory, and the state is written there (or, for
# "without", the paths are removed there). The tests' own temporary
# directories (/tmp) and the Go caches are the host's. "with" also sets the
# environment of a pod (KUBERNETES_SERVICE_HOST, NODE_NAME) and Gantry's
# (GANTRY_CONFIG, GANTRY_RUNTIME_SOCKET) to that state; "without" unsets it.
# A real containerd (where installed) serves /run/containerd/containerd.sock
# with the nvidia runtime registered; socat stands in for the other daemons.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

# The paths the fake host state covers; "without" removes them all.
state_paths=(
  /var/lib/kubelet /var/lib/containerd /var/lib/containers
  /etc/cdi /run/cdi /etc/gantry /run/gantry /run/nvidia /run/nvidia-persistenced
  /etc/nvidia-container-runtime /etc/containerd /etc/docker/daemon.json
  /run/containerd/containerd.sock /run/docker.sock /run/secrets
  /usr/bin/nvidia-container-runtime /usr/bin/nvidia-container-runtime-hook
  /usr/bin/nvidia-ctk /usr/bin/nvidia-cdi-hook /usr/bin/nvidia-container-cli
  /usr/bin/gantry /usr/bin/gantry-runtime /usr/bin/gantry-cdi-hook
)

# The sockets a running node has, each with a listener (socat, accepting and
# closing every connection, as a peer that speaks another protocol would).
sockets=(
  /var/lib/kubelet/device-plugins/kubelet.sock
  /var/lib/kubelet/device-plugins/nvidia-gpu.sock
  /var/lib/kubelet/pod-resources/kubelet.sock
  /var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock
  /run/gantry/runtime.sock
  /run/containerd/containerd.sock
  /run/docker.sock
  /run/nvidia-persistenced/socket
)

scratch="" pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for d in /run /var/lib /usr/bin /etc; do umount -l "$d" 2>/dev/null || true; done
  [ -z "$scratch" ] || rm -rf "$scratch"
}

inside() {
  local mode=$1
  shift
  scratch=$(mktemp -d /tmp/hermetic-XXXXXX)
  trap cleanup EXIT
  for d in /etc /usr/bin /var/lib /run; do
    local n=${d//\//_}
    mkdir -p "$scratch/$n/upper" "$scratch/$n/work"
    mount -t overlay overlay -o "lowerdir=$d,upperdir=$scratch/$n/upper,workdir=$scratch/$n/work" "$d"
  done
  for p in "${state_paths[@]}"; do rm -rf "$p"; done
  if [ "$mode" = with ]; then
    write_state
    for s in "${sockets[@]}"; do
      mkdir -p "$(dirname "$s")"
      [ "$s" != /run/containerd/containerd.sock ] || ! command -v containerd >/dev/null || continue
      socat "UNIX-LISTEN:$s,fork,unlink-early" /dev/null 2>/dev/null &
      pids+=($!)
    done
    # A real containerd where one is installed, on the default socket, with
    # the config above (its CRI service answers with the nvidia runtime).
    if command -v containerd >/dev/null; then
      containerd --config /etc/containerd/config.toml >"$scratch/containerd.log" 2>&1 &
      pids+=($!)
    fi
    for s in "${sockets[@]}"; do
      for _ in $(seq 100); do [ -S "$s" ] && break; sleep 0.1; done
      [ -S "$s" ] || { echo "hermetic-check: nothing listens on $s" >&2; cat "$scratch/containerd.log" >&2 2>/dev/null; exit 1; }
    done
  fi
  if [ "$mode" = with ]; then
    # As where doctor runs in the device plugin's pod, and Gantry's
    # configuration and create server are named in the environment.
    export KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT=6443 NODE_NAME=gpu-node-1 \
      GANTRY_CONFIG=/etc/gantry/config.toml GANTRY_RUNTIME_SOCKET=/run/gantry/runtime.sock
  else
    unset KUBERNETES_SERVICE_HOST KUBERNETES_SERVICE_PORT NODE_NAME GANTRY_CONFIG GANTRY_RUNTIME_SOCKET
  fi
  echo "== hermetic-check ($mode host state): go test $*"
  go test "$@"
}

# write_state writes what a GPU node with a kubelet, Gantry and NVIDIA's
# toolkit has at the default paths every check reads.
write_state() {
  # The kubelet: a device checkpoint (1.37's format, sim:h100x8's UUIDs held
  # by a pod), a DRA plugin's checkpoint, Gantry's GPU owners.
  mkdir -p /var/lib/kubelet/device-plugins /var/lib/kubelet/pod-resources \
    /var/lib/kubelet/plugins/gpu.nvidia.com /var/lib/kubelet/plugins_registry \
    /var/lib/kubelet/gantry-gpu-owners /var/lib/kubelet/checkpoints
  cp internal/kubeletckpt/testdata/kubelet-v1.37.2.json /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint
  cat >/var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json <<'EOF'
{"version":1,"driver":"gpu.nvidia.com","claims":{"0b5c4d0e-1f7a-4c55-9a1e-3d0c2b7e9f10":{"namespace":"ml","name":"train-gpu","devices":[{"uuid":"GPU-e1c2ac89-1777-e0e4-375d-a728aebbaaf2","adminAccess":false}],"pods":[{"name":"train-1","uid":"6a1f9e2c-7b3d-4e8f-9c0a-1d2e3f4a5b6c"}]}}}
EOF
  # CDI: NVIDIA's toolkit's spec (nvidia-ctk cdi generate), naming the
  # host's /dev/nvidia* and its hook.
  mkdir -p /run/cdi /etc/cdi
  cat >/run/cdi/nvidia.yaml <<'EOF'
---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: GPU-4f91bcb3-3e48-9102-8e22-ab4a3e0c4bce
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  - path: /dev/nvidia-uvm
  - path: /dev/nvidia-uvm-tools
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args:
    - nvidia-cdi-hook
    - update-ldcache
    - --folder
    - /usr/lib/x86_64-linux-gnu
    env:
    - NVIDIA_CTK_DEBUG=false
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15
    options: [ro, nosuid, nodev, bind]
EOF
  cp /run/cdi/nvidia.yaml /etc/cdi/nvidia.yaml
  sed -i 's/^kind: nvidia.com\/gpu/kind: management.nvidia.com\/gpu/' /etc/cdi/nvidia.yaml
  # Gantry installed for a GPU operator's driver container.
  mkdir -p /etc/gantry /run/gantry /run/nvidia/driver /run/nvidia/validations
  cat >/etc/gantry/config.toml <<'EOF'
driver-root = "/run/nvidia/driver"
log-level = "info"

[runtime]
log-file = "/var/log/gantry-runtime.log"
kubernetes-env = "allocated"
EOF
  # NVIDIA's toolkit's own configuration (1.18's, as installed).
  mkdir -p /etc/nvidia-container-runtime
  cp internal/config/testdata/nvidia/ctk-1.18.toml /etc/nvidia-container-runtime/config.toml
  # The engines registered with NVIDIA's runtime by nvidia-ctk runtime configure.
  mkdir -p /etc/containerd /etc/docker
  cat >/etc/containerd/config.toml <<'EOF'
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd/opt"

[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
  SystemdCgroup = true
EOF
  cat >/etc/docker/daemon.json <<'EOF'
{
    "default-runtime": "nvidia",
    "runtimes": {
        "nvidia": {
            "args": [],
            "path": "nvidia-container-runtime"
        }
    }
}
EOF
  # containerd's root with its content store as containerd makes it (0755
  # directories: others may read checkpoint blobs), and Podman's storage.
  mkdir -p /var/lib/containerd/io.containerd.content.v1.content/blobs/sha256 \
    /var/lib/containers/storage/overlay-containers
  chmod 711 /var/lib/containerd
  echo '[{"id":"3f2a","names":["cuda"],"image":"nvidia/cuda"}]' >/var/lib/containers/storage/overlay-containers/containers.json
  # A service account, as in a pod.
  mkdir -p /run/secrets/kubernetes.io/serviceaccount
  echo fake-token >/run/secrets/kubernetes.io/serviceaccount/token
  echo fake-ca >/run/secrets/kubernetes.io/serviceaccount/ca.crt
  # The programs both projects install in /usr/bin: each says it is the
  # host's and fails, so a test that runs one shows.
  for b in nvidia-container-runtime nvidia-container-runtime-hook nvidia-ctk nvidia-cdi-hook \
    nvidia-container-cli gantry gantry-runtime gantry-cdi-hook; do
    printf '#!/bin/sh\necho "%s: the host'\''s installed program ran (a test is not hermetic)" >&2\nexit 1\n' "/usr/bin/$b" >"/usr/bin/$b"
    chmod 755 "/usr/bin/$b"
  done
}

if [ "${1:-}" = --inside ]; then
  shift
  inside "$@"
  exit
fi

mode=both
if [ "${1:-}" = -m ]; then
  mode=$2
  shift 2
fi
case $mode in with | without | both) ;; *) echo "hermetic-check: -m with|without|both, not $mode" >&2; exit 2 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "hermetic-check: needs root (a private mount namespace with overlays)" >&2; exit 2; }
command -v unshare >/dev/null || { echo "hermetic-check: no unshare (apt-get install util-linux)" >&2; exit 2; }
command -v socat >/dev/null || { echo "hermetic-check: no socat (apt-get install socat; scripts/deps.sh --test)" >&2; exit 2; }

args=("$@")
has_pkg=false
for a in "${args[@]}"; do case $a in ./*) has_pkg=true ;; esac; done
$has_pkg || args+=(./internal/doctor ./internal/cli ./cmd/gantry ./docs)

status=0
modes=("$mode")
[ "$mode" = both ] && modes=(without with)
for m in "${modes[@]}"; do
  start=$SECONDS
  if unshare -m --propagation private "$0" --inside "$m" -count=1 "${args[@]}"; then
    echo "== hermetic-check ($m host state): ok in $((SECONDS - start)) s"
  else
    echo "== hermetic-check ($m host state): FAILED in $((SECONDS - start)) s"
    status=1
  fi
done
exit $status
