// Package metrics serves Prometheus metrics for the node's GPUs: utilisation
// of the GPU and of its memory bus, memory used and total, temperature, power
// draw, the XID error count and the health the device plugin sees, each
// labelled with the GPU's index, UUID and model and, while a container holds
// the GPU, with that container's pod, namespace and name.
//
// The readings come from a Reader (NVML on a real host, NewSim for simulated
// GPUs); health comes from the device plugin through a HealthFunc; which
// container holds which GPU comes from the kubelet's pod-resources API
// (k8s.io/kubelet/pkg/apis/podresources/v1, List on the kubelet's unix
// socket). Everything is read when Prometheus scrapes, so the numbers are
// never older than the scrape.
//
// A GPU held by several containers (time-slicing, MPS, MIG devices of one
// GPU) has one series per container, each with the GPU's values, as NVIDIA's
// DCGM exporter does; a GPU nobody holds has one series with empty pod,
// namespace and container labels.
package metrics
