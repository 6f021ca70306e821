package cluster

import (
	"archive/tar"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/internal/ctrckpt"
	"github.com/gantry-gpu/gantry/internal/discover"
)

const (
	kubeletAPI       = "https://10.199.0.1:10250" // GK_NODE_IP (lib.sh)
	kubeletPKI       = "/etc/gantry-k8s/pki"
	kubeletCkptDir   = "/var/lib/kubelet/checkpoints"
	runtimeLogFile   = "/var/lib/gantry-k8s/log/gantry-runtime.log"
	ckptCounterPod   = "ckpt"
	ckptRecordInTar  = "checkpoint/gantry-gpus.json"
	ckptCounterShell = `cuda-check --load-only --hold 100000 & i=0; while :; do i=$((i+1)); echo $i >/tmp/count; sleep 0.1; done`
)

// kubeletCheckpoint asks the kubelet's API to checkpoint a container
// (feature ContainerCheckpoint, on by default since 1.30) as the cluster's
// admin, and returns the archive it names.
func kubeletCheckpoint(t *testing.T, ns, pod, container string) (string, error) {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(filepath.Join(kubeletPKI, "admin.crt"), filepath.Join(kubeletPKI, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(filepath.Join(kubeletPKI, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	c := &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{cert}, RootCAs: pool}}}
	resp, err := c.Post(fmt.Sprintf("%s/checkpoint/%s/%s/%s", kubeletAPI, ns, pod, container), "", nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("kubelet: %s: %s", resp.Status, body)
	}
	var r struct{ Items []string }
	if err := json.Unmarshal(body, &r); err != nil || len(r.Items) != 1 {
		return "", fmt.Errorf("kubelet's answer %s: %v", body, err)
	}
	return r.Items[0], nil
}

// TestCheckpointGPUPod checkpoints a running GPU pod's container through
// the kubelet's checkpoint API (POST /checkpoint/NS/POD/CONTAINER on port
// 10250): the kubelet asks containerd 2.x's CRI CheckpointContainer, which
// pauses the task and runs the runc shim's checkpoint with --leave-running
// through the nvidia runtime handler's BinaryName, gantry-runtime. The
// container (a process that keeps the fake libcuda loaded, and a shell
// counting) goes on counting; gantry-runtime's log shows the CUDA lock and
// checkpoint and the restore and unlock of that process; the archive under
// /var/lib/kubelet/checkpoints is root's alone and holds CRIU's image with
// Gantry's record of the GPU. containerd 2.4's CRI has no restore (CRI-O
// restores a container whose image is an OCI image made of the archive): a
// pod naming the archive's path as its image does not run (the kubelet
// answers InvalidImageName), and the test logs the answer.
func TestCheckpointGPUPod(t *testing.T) {
	k := newKube(t)
	shell, ready := ckptCounterShell, "cuda-check: OK"
	if os.Getenv("GANTRY_CLUSTER_REAL_GPU") != "" {
		// On real GPUs a CUDA context that ran a kernel, held: what the
		// checkpoint's CUDA lock and checkpoint act on.
		shell = strings.Replace(shell, "cuda-check --load-only --hold", "cuda-check --mem 256 --hold", 1)
		ready = "alloc 256 MiB: ok"
	}
	k.apply(podSpec{name: ckptCounterPod, image: probeImage, gpus: 1, runtimeClass: true, script: shell}.yaml())
	k.logsUntil(ckptCounterPod, ready, 120*time.Second)
	count := func() int {
		out, err := k.run("exec", "-n", k.ns, ckptCounterPod, "--", "cat", "/tmp/count")
		if err != nil {
			return -1
		}
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n
	}
	k.eventually(60*time.Second, "the pod counts", func() string {
		if n := count(); n < 3 {
			return fmt.Sprintf("count %d", n)
		}
		return ""
	})
	logBefore, _ := os.ReadFile(runtimeLogFile)

	archive, err := kubeletCheckpoint(t, k.ns, ckptCounterPod, "main")
	missing := containerdLacksNetworkLock(t)
	switch {
	case err != nil && len(missing) > 0 && strings.Contains(err.Error(), "ip6tables-restore"):
		// A GPU host without iptables: gantry-runtime refused, as it
		// should, before the CUDA lock; the rest needs iptables.
		t.Skipf("this host lacks %s in containerd's PATH, and gantry-runtime refused the checkpoint as it should: %v (install iptables to run the rest)", strings.Join(missing, " and "), err)
	case err == nil && len(missing) > 0:
		t.Errorf("checkpointed, though %s is not in containerd's PATH: gantry-runtime should have refused (CRIU's network lock of the pod's network namespace)", strings.Join(missing, " and "))
	}
	if err != nil {
		diag := ""
		if _, rest, ok := strings.Cut(err.Error(), "of process "); ok {
			pid := strings.TrimRight(strings.Fields(rest)[0], ":")
			st, _ := os.ReadFile("/proc/" + pid + "/status")
			maps, _ := os.ReadFile("/proc/" + pid + "/maps")
			var cuda []string
			for _, l := range strings.Split(string(maps), "\n") {
				if strings.Contains(l, "libcuda") {
					cuda = append(cuda, l)
				}
			}
			diag = fmt.Sprintf("process %s: %.400s\nlibcuda mappings: %s", pid, st, strings.Join(cuda, "\n"))
		}
		// containerd names CRIU's log of a failed dump ("path= FILE"):
		// its errors, while the task (and the file) are still there.
		if _, rest, ok := strings.Cut(err.Error(), "path= "); ok {
			if f := strings.Fields(strings.TrimRight(rest, ")")); len(f) > 0 {
				log, _ := os.ReadFile(strings.TrimRight(f[0], ")"))
				var errs []string
				for _, l := range strings.Split(string(log), "\n") {
					if strings.Contains(l, "Error") {
						errs = append(errs, l)
					}
				}
				diag += fmt.Sprintf("\nCRIU's errors in %s:\n%s", f[0], strings.Join(errs, "\n"))
			}
		}
		t.Fatalf("checkpoint through the kubelet: %v\n%s\n%s", err, diag, tailFile(runtimeLogFile, 3000))
	}
	t.Cleanup(func() { os.Remove(archive) })
	t.Logf("kubelet checkpoint archive: %s", archive)
	if filepath.Dir(archive) != kubeletCkptDir {
		t.Errorf("archive %s is not under %s", archive, kubeletCkptDir)
	}
	for _, p := range []string{archive, kubeletCkptDir} {
		if fi, err := os.Stat(p); err != nil {
			t.Fatal(err)
		} else if fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: mode %v, open to others", p, fi.Mode().Perm())
		}
	}

	// gantry-runtime did the CUDA steps around runc's checkpoint.
	logAfter, _ := os.ReadFile(runtimeLogFile)
	newLog := string(logAfter[min(len(logBefore), len(logAfter)):])
	var lock, resume bool
	for _, l := range strings.Split(newLog, "\n") {
		if !strings.Contains(l, `"command":"checkpoint"`) {
			continue
		}
		t.Logf("gantry-runtime: %s", l)
		lock = lock || strings.Contains(l, "CUDA lock and checkpoint of processes [")
		resume = resume || strings.Contains(l, "CUDA restore and unlock of processes [")
	}
	if !lock || !resume {
		t.Errorf("gantry-runtime's log lacks the CUDA lock and checkpoint (%v) or the restore and unlock (%v) of the pod's process:\n%s", lock, resume, newLog)
	}

	// The archive: CRIU's image with Gantry's record of one CUDA process
	// on one GPU.
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var names []string
	var rec struct {
		GPUs          []struct{ UUID string }
		CUDAProcesses int
	}
	found := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		if h.Typeflag == tar.TypeReg && strings.HasPrefix(name, "checkpoint/") {
			names = append(names, fmt.Sprintf("%s %v", name, h.FileInfo().Mode().Perm()))
		}
		if name == ckptRecordInTar {
			found = true
			if err := json.NewDecoder(tr).Decode(&rec); err != nil {
				t.Errorf("%s in %s: %v", ckptRecordInTar, archive, err)
			}
		}
	}
	t.Logf("CRIU's files in the archive (name, mode as containerd wrote them): %s", strings.Join(names, ", "))
	if !found || rec.CUDAProcesses != 1 || len(rec.GPUs) != 1 {
		t.Errorf("%s in the archive: found %v, %+v; want one CUDA process on one GPU", ckptRecordInTar, found, rec)
	}

	// The pod goes on.
	if s := k.podState(ckptCounterPod); !strings.Contains(s, "Running") {
		t.Fatalf("after the checkpoint: %s", s)
	}
	at := count()
	k.eventually(60*time.Second, "the pod counts on after the checkpoint", func() string {
		if n := count(); n < at+5 {
			return fmt.Sprintf("count %d, was %d", n, at)
		}
		return ""
	})

	// Restore: CRI-O restores a container whose image is an OCI image made
	// of a checkpoint archive; containerd 2.4's CRI has no such path, and
	// the archive's path is no image name. The original pod goes first, as
	// before a restore elsewhere: it holds the GPU (a 1-GPU host has no
	// other, and the restore pod would wait unscheduled).
	k.must("delete", "pod", "-n", k.ns, ckptCounterPod, "--grace-period=2", "--wait=true", "--timeout=120s")
	restore := fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata:\n  name: restored\nspec:\n  restartPolicy: Never\n  runtimeClassName: nvidia\n"+
		"  containers:\n  - name: main\n    image: %s\n    imagePullPolicy: Never\n    resources:\n      limits:\n        nvidia.com/gpu: 1\n", archive) +
		multicastOffEnv("    ")
	k.apply(restore)
	var why string
	k.eventually(120*time.Second, "the restore pod's state", func() string {
		out, _ := k.run("get", "pod", "-n", k.ns, "restored", "-o", "jsonpath={.status.containerStatuses[0].state.waiting.reason}: {.status.containerStatuses[0].state.waiting.message}")
		if r, _, _ := strings.Cut(out, ":"); r == "" || r == "ContainerCreating" {
			return "no verdict yet: " + k.podState("restored")
		}
		why = out
		return ""
	})
	t.Logf("containerd's CRI and a pod whose image is the checkpoint archive: %s", why)
	if s := k.podState("restored"); strings.Contains(s, "Running") {
		t.Errorf("a pod whose image is the archive runs: %s (containerd restores now? check and update the guide)", s)
	}
}

// containerdLacksNetworkLock is which of CRIU's network lock programs
// (iptables-restore, ip6tables-restore) the PATH of the cluster's containerd
// lacks: its shims hand that PATH to gantry-runtime, runc and CRIU. Nil
// when a CRIU configuration file picks the lock, or containerd's
// environment cannot be read.
func containerdLacksNetworkLock(t *testing.T) []string {
	pid, _ := os.ReadFile("/run/gantry-k8s/containerd.pid")
	env, err := os.ReadFile("/proc/" + strings.TrimSpace(string(pid)) + "/environ")
	if err != nil {
		t.Logf("containerd's environment: %v", err)
		return nil
	}
	var path string
	for _, kv := range strings.Split(string(env), "\x00") {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	look := func(prog string) (string, error) {
		if p, ok := discover.LookPathIn(prog, path); ok {
			return p, nil
		}
		return "", os.ErrNotExist
	}
	return ctrckpt.NetworkLockMissing(look, ctrckpt.CRIUNetworkLockSet(ctrckpt.CRIUConfigs))
}

func tailFile(p string, n int) string {
	b, _ := os.ReadFile(p)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
