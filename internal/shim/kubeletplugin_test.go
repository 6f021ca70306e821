package shim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestKubeletPluginPod: under runtime.kubernetes-env = "allocated", an
// unprivileged pod container shaped like NVIDIA's static device plugin
// DaemonSet (its image's NVIDIA_VISIBLE_DEVICES=all, no GPU allocated, the
// kubelet's device-plugins directory bound writable from the host) gets
// every GPU, through gantry-runtime and real runc, and the runtime's log
// line says which rule let it through; so does a DRA plugin's bind of
// plugins_registry and a bind of the kubelet's root. Hostile pods stay
// without a GPU: one that only names the directory in its env, binds a
// lookalike tree (with a kubelet.sock) at the same container path, binds
// the real one read-only, a subdirectory of it, or a sibling.
func TestKubeletPluginPod(t *testing.T) {
	kdir := t.TempDir()
	for _, d := range []string{"device-plugins/sub", "plugins_registry", "device-plugins-old"} {
		if err := os.MkdirAll(filepath.Join(kdir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The kubelet's checkpoint: GPUs for another pod, none for the plugin's.
	ckpt, err := os.ReadFile("../kubeletckpt/testdata/kubelet-v1.37.2.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(kdir, "device-plugins", "kubelet_internal_checkpoint"), ckpt, 0o644); err != nil {
		t.Fatal(err)
	}
	look := filepath.Join(t.TempDir(), "var", "lib", "kubelet", "device-plugins")
	if err := os.MkdirAll(look, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(look, "kubelet.sock"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	conf := "kubernetes-env = \"allocated\"\nkubelet-dir = \"" + kdir + "\"\n"
	dp := "/var/lib/kubelet/device-plugins"
	bind := func(src, dst string, ro bool) ocispecs.Mount {
		o := []string{"rbind", "rprivate", "rw"}
		if ro {
			o = []string{"rbind", "rprivate", "ro"}
		}
		return ocispecs.Mount{Destination: dst, Type: "bind", Source: src, Options: o}
	}
	all := []string{"nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidia4", "nvidia5", "nvidia6", "nvidia7", "nvidiactl"}
	for _, tc := range []struct {
		name   string
		env    []string
		mounts []ocispecs.Mount
		plugin bool
	}{
		{"NVIDIA's static DaemonSet", nil, []ocispecs.Mount{bind(filepath.Join(kdir, "device-plugins"), dp, false)}, true},
		{"DRA plugin", nil, []ocispecs.Mount{bind(filepath.Join(kdir, "plugins_registry"), "/var/lib/kubelet/plugins_registry", false)}, true},
		{"kubelet root", nil, []ocispecs.Mount{bind(kdir, "/var/lib/kubelet", false)}, true},
		{"path in the env only", []string{"KUBELET_DIR=" + kdir, "DP=" + filepath.Join(kdir, "device-plugins")}, nil, false},
		{"lookalike tree", nil, []ocispecs.Mount{bind(look, dp, false)}, false},
		{"read-only", nil, []ocispecs.Mount{bind(filepath.Join(kdir, "device-plugins"), dp, true)}, false},
		{"subdirectory", nil, []ocispecs.Mount{bind(filepath.Join(kdir, "device-plugins", "sub"), dp, false)}, false},
		{"sibling", nil, []ocispecs.Mount{bind(filepath.Join(kdir, "device-plugins-old"), dp, false)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newContainer(t, opts{
				env:         append([]string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}, tc.env...),
				args:        []string{"sh", "-c", gpuScript},
				config:      conf,
				annotations: criAnnotations("plugin-pod-uid", "nvidia-device-plugin-ctr"),
				mounts:      tc.mounts,
			})
			out, stderr, err := c.run()
			if err != nil {
				t.Fatalf("gantry-runtime run: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr)
			}
			got := strings.Join(devNodes(out), " ")
			log, _ := os.ReadFile(filepath.Join(filepath.Dir(c.config), "gantry.log"))
			if tc.plugin {
				if got != strings.Join(all, " ") {
					t.Errorf("device nodes %q, want every GPU: %q\nlog: %s", got, all, log)
				}
				if src := tc.mounts[0].Source; !strings.Contains(string(log), "the container binds "+src+" writable") {
					t.Errorf("the runtime's log does not name the rule and the bind %s:\n%s", src, log)
				}
				return
			}
			if got != "" {
				t.Errorf("device nodes %q in a pod that is no kubelet plugin, want none\nlog: %s", got, log)
			}
			if !strings.Contains(string(log), "allocated no GPU") {
				t.Errorf("the runtime's log does not say why the variable was ignored:\n%s", log)
			}
		})
	}
}
