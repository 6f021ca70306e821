package deviceplugin

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// gpuDevRoot is imexRoot with the GPUs' and the driver's device nodes of
// the h100x8 profile, as character devices.
func gpuDevRoot(t *testing.T) string {
	t.Helper()
	root := imexRoot(t)
	names := []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
	for i := range 8 {
		names = append(names, fmt.Sprintf("nvidia%d", i))
	}
	for i, n := range names {
		if err := unix.Mknod(filepath.Join(root, "dev", n), unix.S_IFCHR|0o666, int(unix.Mkdev(195, uint32(i)))); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestOwnCDISpec: with the cdi-cri strategy and no CDI kind of the
// admin's, the plugin writes its own spec as NVIDIA's does
// (k8s.device-plugin.nvidia.com-gpu.json, and -imex-channel.json for the
// imex section); the names of its Allocate answers (over the real gRPC
// socket) resolve in it with the CDI library, as containerd and CRI-O load
// it; a removed file is written again; on exit the files are removed,
// unless another writer replaced one, which is then left to them.
func TestOwnCDISpec(t *testing.T) {
	t.Setenv("GANTRY_CONFIG", "")
	defer func(d time.Duration) { ownSpecRecheck = d }(ownSpecRecheck)
	ownSpecRecheck = 100 * time.Millisecond
	devRoot := gpuDevRoot(t)
	noenv := func(string) string { return "" }
	sys := loadSim(t, "h100x8")
	for _, replaced := range []bool{false, true} {
		t.Run(fmt.Sprintf("replaced=%v", replaced), func(t *testing.T) {
			dir := shortTempDir(t)
			specDir := filepath.Join(t.TempDir(), "cdi")
			cfgFile := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(cfgFile, []byte("version: v1\nimex: {channelIDs: [0]}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			k := startKubelet(t, dir)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan int, 1)
			var out, errb bytes.Buffer
			go func() {
				done <- run(ctx, []string{"--config", cfgFile, "--gpus=sim:h100x8", "--kubelet-dir=" + dir, "--device-list-strategy=cdi-cri",
					"--nvidia-dev-root=" + devRoot, "--cdi-spec-dir=" + specDir, "--cdi-hook-path=/opt/gantry/gantry-cdi-hook",
					"--sim-health-socket=" + filepath.Join(dir, "h.sock"), "--log-level=error"}, noenv, &out, &errb)
			}()
			k.registration()
			gpuFile := filepath.Join(specDir, "k8s.device-plugin.nvidia.com-gpu.json")
			imexFile := filepath.Join(specDir, "k8s.device-plugin.nvidia.com-imex-channel.json")
			resp, err := allocate(t, k.client("nvidia-gpu.sock"), []string{sys.Devices[3].UUID})
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, d := range resp.ContainerResponses[0].CdiDevices {
				names = append(names, d.Name)
			}
			want := []string{"k8s.device-plugin.nvidia.com/gpu=" + sys.Devices[3].UUID, "k8s.device-plugin.nvidia.com/imex-channel=0"}
			if !slices.Equal(names, want) {
				t.Fatalf("CDI devices %v, want %v", names, want)
			}
			cache, err := cdi.NewCache(cdi.WithSpecDirs(specDir), cdi.WithAutoRefresh(false))
			if err != nil {
				t.Fatal(err)
			}
			if errs := cache.GetErrors(); len(errs) > 0 {
				t.Fatalf("the CDI library rejected the plugin's spec: %v", errs)
			}
			oci := &ocispecs.Spec{Process: &ocispecs.Process{}, Linux: &ocispecs.Linux{}}
			if unresolved, err := cache.InjectDevices(oci, names...); err != nil {
				t.Fatalf("injecting %v: %v (unresolved %v)", names, err, unresolved)
			}
			var paths []string
			for _, d := range oci.Linux.Devices {
				paths = append(paths, d.Path)
			}
			if !slices.Contains(paths, "/dev/nvidia3") || !slices.Contains(paths, "/dev/nvidia-caps-imex-channels/channel0") || slices.Contains(paths, "/dev/nvidia2") {
				t.Errorf("injected device nodes %v: want /dev/nvidia3 and the IMEX channel, not another GPU", paths)
			}
			if err := os.Remove(gpuFile); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "the removed spec written again", func() bool { _, err := os.Stat(gpuFile); return err == nil })
			theirs := []byte(`{"cdiVersion":"0.5.0","kind":"k8s.device-plugin.nvidia.com/gpu","devices":[]}` + "\n")
			if replaced {
				tmp := gpuFile + ".theirs"
				if err := os.WriteFile(tmp, theirs, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, gpuFile); err != nil {
					t.Fatal(err)
				}
				time.Sleep(3 * ownSpecRecheck) // the plugin sees it; it must not write over it
			}
			cancel()
			if code := <-done; code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			if _, err := os.Stat(imexFile); err == nil {
				t.Errorf("%s left after the plugin stopped", imexFile)
			}
			got, err := os.ReadFile(gpuFile)
			switch {
			case replaced && !bytes.Equal(got, theirs):
				t.Errorf("another writer's %s: %q (%v) after the plugin stopped, want it left as they wrote it", gpuFile, got, err)
			case !replaced && err == nil:
				t.Errorf("%s left after the plugin stopped", gpuFile)
			}
		})
	}
}

// waitUntil polls cond for up to waitFor.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", waitFor, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
