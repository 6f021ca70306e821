// Package cluster holds the end-to-end tests that run against the live
// single-node Kubernetes cluster of test/cluster/up.sh: a real kubelet turns
// a pod's nvidia.com/gpu limit into an Allocate call on Gantry's device
// plugin (a DaemonSet pod), hands the answer to containerd through CRI, and
// containerd runs the container through gantry-runtime. The tests assert on
// what the pods saw (their logs), on the Node object, on Events and on the
// plugin's /metrics.
//
// They skip unless GANTRY_CLUSTER is set (make e2e-cluster and make
// e2e-cluster-ci set it after bringing the cluster up):
//
//	GANTRY_CLUSTER=1 go test -count=1 -v ./test/cluster
//
// The DRA scenarios (TestDRA*, dra_test.go) need the DRA plugin beside the
// device plugin (up.sh --dra) and skip without it:
//
//	make e2e-cluster-dra
//
// With up.sh --dra-only the DRA plugin publishes every GPU and there is no
// device plugin: the device plugin scenarios (newKube) skip, and
// TestDRAClaimTwoGPUsCEL finds its two GPUs on a 2-GPU node.
//
// Every container the tests start carries NCCL_NVLS_ENABLE=0,
// TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 (NVLink
// multicast off on the shared multi-GPU hosts): podSpec adds them, and
// kube.apply refuses a manifest with a container without them.
//
// The multi-GPU scenarios (multigpu_test.go) need 3 or 4 GPUs offered by
// the device plugin (8 simulated); TestNCCLPodTwoGPUs runs torch with NCCL in
// a pod on real GPUs only (GANTRY_CLUSTER_REAL_GPU, a torch python at
// GANTRY_CLUSTER_TORCH, default /opt/torch/.venv/bin/python3), or its
// plumbing alone with GANTRY_CLUSTER_NCCL_SMOKE=1
// GANTRY_CLUSTER_TORCH=/usr/bin/python3 on simulated GPUs.
//
// KUBECONFIG defaults to /etc/gantry-k8s/admin.conf and the binaries to
// bin/cluster (GANTRY_CLUSTER_BIN).
package cluster
