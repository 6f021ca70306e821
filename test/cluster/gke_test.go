package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Scenario 8: a GKE-style node. A driver-installer DaemonSet (as GKE's
// nvidia-driver-installer does) puts the driver on the host under a
// directory whose layout is /usr/local/nvidia/{bin,lib64}; the runtime is
// pointed at it (driver-root, as an admin sets it); a pod with the CUDA
// images' LD_LIBRARY_PATH=/usr/local/nvidia/lib64 and /usr/local/nvidia/bin
// on PATH loads libcuda from there and runs nvidia-smi. On simulated GPUs:
// the installer's payload is `gantry sim driver-root --layout gke`. (On a
// GPU host the real driver already lives under /usr/local/nvidia, as
// TestPodGetsTwoGPUs shows there.)
func TestGKEDriverInstaller(t *testing.T) {
	k := newKube(t)
	if os.Getenv("GANTRY_CLUSTER_REAL_GPU") != "" {
		t.Skip("the GPU host's own driver is GKE-style already (TestPodGetsTwoGPUs)")
	}
	payload := filepath.Join("/var/lib/gantry-k8s", "gke-installer-payload")
	node := filepath.Join("/var/lib/gantry-k8s", "gke-driver")
	os.RemoveAll(payload)
	os.RemoveAll(node)
	t.Cleanup(func() { os.RemoveAll(payload); os.RemoveAll(node) })
	if out, err := exec.Command(filepath.Join(k.bin, "gantry"), "--config", gantryConfig, "sim", "driver-root", "--layout", "gke", payload).CombinedOutput(); err != nil {
		t.Fatalf("gantry sim driver-root --layout gke: %v\n%s", err, out)
	}
	k.apply(`apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: nvidia-driver-installer
spec:
  selector:
    matchLabels: {app: nvidia-driver-installer}
  template:
    metadata:
      labels: {app: nvidia-driver-installer}
    spec:
      terminationGracePeriodSeconds: 0
      initContainers:
      - name: install
        image: ` + probeImage + `
        imagePullPolicy: Never
        securityContext: {privileged: true}
        command: ["sh", "-c", "cp -a /payload/. /root-on-host/ && echo installed > /root-on-host/.installed"]
` + multicastOffEnv("        ") + `        volumeMounts:
        - {name: payload, mountPath: /payload, readOnly: true}
        - {name: root-on-host, mountPath: /root-on-host}
      containers:
      - name: pause
        image: ` + probeImage + `
        imagePullPolicy: Never
        command: ["sleep", "3600"]
` + multicastOffEnv("        ") + `      volumes:
      - name: payload
        hostPath: {path: ` + payload + `, type: Directory}
      - name: root-on-host
        hostPath: {path: ` + node + `, type: DirectoryOrCreate}
`)
	k.eventually(90*time.Second, "the driver installer has run", func() string {
		if _, err := os.Stat(filepath.Join(node, ".installed")); err != nil {
			return err.Error()
		}
		return ""
	})
	if _, err := os.Stat(filepath.Join(node, "usr/local/nvidia/lib64")); err != nil {
		t.Fatalf("the installer left no usr/local/nvidia/lib64: %v", err)
	}

	// The admin's step: the runtime's driver root is where the installer
	// put the driver. gantry-runtime reads its configuration per container.
	orig, err := os.ReadFile(gantryConfig)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(orig), "\n") {
		if strings.HasPrefix(l, "driver-root") {
			l = `driver-root = "` + node + `"`
		}
		lines = append(lines, l)
	}
	writeConfig := func(b []byte) {
		t.Helper()
		if err := os.WriteFile(gantryConfig+".tmp", b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(gantryConfig+".tmp", gantryConfig); err != nil {
			t.Fatal(err)
		}
	}
	writeConfig([]byte(strings.Join(lines, "\n")))
	t.Cleanup(func() { writeConfig(orig) })

	script := `exec 2>&1
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64 PATH=/usr/local/nvidia/bin:$PATH
echo '== probe'; probe
echo '== smi'; nvidia-smi -L
echo '== which'; command -v nvidia-smi
echo '== end'; sleep 3600`
	k.apply(podSpec{name: "cuda-app", image: probeImage, gpus: 1, runtimeClass: true, script: script}.yaml())
	sec := sections(k.logsUntil("cuda-app", "== end", 90*time.Second))
	if len(sec["probe"]) == 0 || !strings.HasPrefix(sec["probe"][0], "cuda ") || !strings.Contains(sec["probe"][0], " /usr/local/nvidia/lib64/") {
		t.Errorf("libcuda should load from /usr/local/nvidia/lib64, the probe says %q", sec["probe"])
	}
	if len(sec["smi"]) != 1 || !strings.HasPrefix(sec["smi"][0], "GPU 0: ") {
		t.Errorf("nvidia-smi -L: %q, want one GPU", sec["smi"])
	}
	// Gantry puts the driver's programs in /usr/bin, on every image's PATH.
	if len(sec["which"]) != 1 || !strings.HasSuffix(sec["which"][0], "/nvidia-smi") {
		t.Errorf("nvidia-smi not on PATH: %q", sec["which"])
	}
}
