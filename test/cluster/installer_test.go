package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The node installer scenario's paths on the node (up.sh --no-gantry).
const (
	noGantryMarker   = "/run/gantry-k8s/no-gantry"
	containerdConfig = "/etc/gantry-k8s/containerd.toml"
	installerDropIn  = "/etc/gantry-k8s/conf.d/99-nvidia.toml"
	installerBinDir  = "/var/lib/gantry-k8s/gantry/bin"
	installerState   = "/var/lib/gantry-k8s/node-install"
	installerSpec    = "/var/run/cdi/gantry-k8s.yaml"
	readyLabel       = "gantry.dev/runtime-ready"
)

// installerManifest is deployments/static/installer's manifest with the
// flags this node needs: its containerd's files, socket and program, the
// supervisor's restart (up.sh --no-gantry), the simulated GPUs' Gantry
// configuration, and directories that down.sh removes.
func installerManifest(t *testing.T, bin string) string {
	t.Helper()
	b, err := os.ReadFile("../../deployments/static/installer/gantry-node-installer.yaml")
	if err != nil {
		t.Fatal(err)
	}
	old := "            - --bin-dir=/usr/local/gantry/bin\n            - --cdi-spec=/var/run/cdi/gantry.yaml\n"
	if !bytes.Contains(b, []byte(old)) {
		t.Fatalf("the static installer manifest no longer has the lines\n%s", old)
	}
	var args strings.Builder
	for _, a := range []string{
		"--bin-dir=" + installerBinDir, "--cdi-spec=" + installerSpec, "--state-dir=" + installerState,
		"--config-file=" + containerdConfig, "--drop-in=" + installerDropIn, "--cri-socket=" + criSocket,
		"--executable-path=" + filepath.Join(bin, "containerd"), "--gantry-config=" + gantryConfig,
		"--restart-command=kill $(cat /run/gantry-k8s/containerd-daemon.pid)", "--timeout=150s",
	} {
		q, _ := json.Marshal(a)
		fmt.Fprintf(&args, "            - %s\n", q)
	}
	return string(bytes.Replace(b, []byte(old), []byte(args.String()), 1))
}

// kubectlStdin runs kubectl ARGS with stdin (no namespace of the test's).
func (k *kube) kubectlStdin(stdin string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(k.bin, "kubectl"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+k.kubeconfig)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (k *kube) installerLogs() string {
	out, _ := k.run("logs", "-n", "kube-system", "-l", "app.kubernetes.io/name=gantry-node-installer", "--tail=80", "--prefix")
	return out
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return !errors.Is(err, fs.ErrNotExist)
}

// TestNodeInstaller: the node comes up with containerd and without Gantry
// (up.sh --no-gantry) and a pod without GPUs runs. The node installer
// DaemonSet (deployments/static/installer) sets the node up: containerd
// restarted with the runtime, the node labelled, the device plugin then
// advertising the GPUs, and a GPU pod runs with them. Deleting the
// DaemonSet uninstalls: containerd's config byte for byte as before, the
// drop-in, binaries, spec and record gone, the label off; the pod without
// GPUs still runs in the same container. Then install and uninstall again.
func TestNodeInstaller(t *testing.T) {
	k := newKube(t)
	if !exists(noGantryMarker) {
		t.Skip("the cluster's node has Gantry configured by hand: bring it up with test/cluster/up.sh --no-gantry (GANTRY_CLUSTER_NO_GANTRY=1)")
	}
	orig, err := os.ReadFile(containerdConfig)
	if err != nil {
		t.Fatal(err)
	}
	origInfo, _ := os.Stat(containerdConfig)
	if bytes.Contains(orig, []byte("gantry-runtime")) || exists(installerDropIn) {
		t.Fatalf("%s already names Gantry's runtime (or %s exists): not a node without Gantry", containerdConfig, installerDropIn)
	}
	manifest := installerManifest(t, k.bin)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("installer logs:\n%s", k.installerLogs())
			out, _ := k.run("get", "events", "-n", "default", "--field-selector", "involvedObject.kind=Node")
			t.Logf("Node events:\n%s", out)
		}
		// Leave no installer behind for the next test.
		k.kubectlStdin(manifest, "delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=200s")
	})

	k.apply(podSpec{name: "plain", image: probeImage, script: "echo started; sleep 3600"}.yaml())
	k.logsUntil("plain", "started", 90*time.Second)
	plainID := func() string {
		out, _ := k.run("get", "pod", "-n", k.ns, "plain", "-o", "jsonpath={.status.phase} {.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount}")
		return out
	}
	plainBefore := plainID()
	if !strings.HasPrefix(plainBefore, "Running ") {
		t.Fatalf("pod plain: %s", plainBefore)
	}

	install := func(round int) time.Duration {
		t.Helper()
		start := time.Now()
		if out, err := k.kubectlStdin(manifest, "apply", "-f", "-"); err != nil {
			t.Fatalf("kubectl apply the installer: %v\n%s", err, out)
		}
		k.eventually(240*time.Second, "node labelled "+readyLabel+"=true by the new installer pod", func() string {
			v := k.node().Metadata.Labels[readyLabel]
			if logs := k.installerLogs(); v != "true" || !strings.Contains(logs, "labelled "+readyLabel+"=true") {
				return fmt.Sprintf("label %q; installer: %s", v, lastLine(logs))
			}
			return ""
		})
		took := time.Since(start)
		logs := k.installerLogs()
		if !strings.Contains(logs, "Gantry installed in "+installerBinDir) || !strings.Contains(logs, "answers CRI on "+criSocket) {
			t.Errorf("installer log lacks the install and CRI lines:\n%s", logs)
		}
		cur, _ := os.ReadFile(containerdConfig)
		if !bytes.Contains(cur, []byte("/etc/gantry-k8s/conf.d/*.toml")) || !exists(installerDropIn) || !exists(installerSpec) ||
			!exists(filepath.Join(installerBinDir, "nvidia-container-runtime-hook")) {
			t.Errorf("after install: containerd.toml imports the drop-in %v, drop-in %v, spec %v, hook %v", bytes.Contains(cur, []byte("conf.d")),
				exists(installerDropIn), exists(installerSpec), exists(filepath.Join(installerBinDir, "nvidia-container-runtime-hook")))
		}
		k.eventually(180*time.Second, "nvidia.com/gpu allocatable (the device plugin, started by the label)", func() string {
			if a := k.allocatable(); a == "" || a == "0" {
				return "allocatable " + a
			}
			return ""
		})
		name := fmt.Sprintf("gpu%d", round)
		k.apply(podSpec{name: name, image: probeImage, gpus: 1, runtimeClass: true, script: gpuScript}.yaml())
		sec := sections(k.logsUntil(name, "== end", 120*time.Second))
		if g := gpuNodes(sec["dev"]); len(g) != 1 {
			t.Errorf("round %d: GPU pod sees GPU nodes %v, want 1", round, g)
		}
		if len(sec["probe"]) < 1 || !strings.HasPrefix(sec["probe"][0], "cuda ") {
			t.Errorf("round %d: probe in the GPU pod: %q", round, sec["probe"])
		}
		k.must("delete", "pod", "-n", k.ns, name, "--wait=true")
		return took
	}
	uninstall := func(round int) time.Duration {
		t.Helper()
		start := time.Now()
		// As the guide says to remove it: the DaemonSet first, waiting for
		// its pods (each uninstalls on SIGTERM, with its account still
		// there to take the label off), then the rest of the manifest.
		if out, err := k.run("delete", "daemonset", "-n", "kube-system", "gantry-node-installer", "--cascade=foreground", "--wait=true", "--timeout=300s"); err != nil {
			t.Fatalf("kubectl delete the installer DaemonSet: %v\n%s", err, out)
		}
		if out, err := k.kubectlStdin(manifest, "delete", "-f", "-", "--ignore-not-found", "--wait=true"); err != nil {
			t.Fatalf("kubectl delete the installer: %v\n%s", err, out)
		}
		k.eventually(300*time.Second, "the installer's pod gone", func() string {
			out, _ := k.run("get", "pods", "-n", "kube-system", "-l", "app.kubernetes.io/name=gantry-node-installer", "-o", "name")
			if strings.TrimSpace(out) != "" {
				return out
			}
			return ""
		})
		took := time.Since(start)
		if v := k.node().Metadata.Labels[readyLabel]; v != "" {
			t.Errorf("round %d: label %s=%q after uninstall", round, readyLabel, v)
		}
		cur, _ := os.ReadFile(containerdConfig)
		if !bytes.Equal(cur, orig) {
			t.Errorf("round %d: %s after uninstall differs from before install:\n%s\nwant:\n%s", round, containerdConfig, cur, orig)
		}
		if fi, _ := os.Stat(containerdConfig); fi == nil || fi.Mode() != origInfo.Mode() {
			t.Errorf("round %d: %s mode %v, was %v", round, containerdConfig, fi.Mode(), origInfo.Mode())
		}
		for _, p := range []string{filepath.Dir(installerDropIn), containerdConfig + ".gantry-backup", installerSpec, filepath.Dir(installerBinDir), installerState} {
			if exists(p) {
				t.Errorf("round %d: %s still there after uninstall", round, p)
			}
		}
		if got := plainID(); got != plainBefore {
			t.Errorf("round %d: pod plain %q after uninstall, was %q (want the same container still running)", round, got, plainBefore)
		}
		return took
	}
	i1 := install(1)
	u1 := uninstall(1)
	i2 := install(2)
	u2 := uninstall(2)
	t.Logf("node installer: install (apply to node labelled) %.1f s, uninstall (delete to pod gone) %.1f s; again %.1f s and %.1f s",
		i1.Seconds(), u1.Seconds(), i2.Seconds(), u2.Seconds())
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
