package shim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/edits"
)

// runtime.driver-layout = "tree": the driver's programs and libraries reach
// the container as one read-only mount of the driver tree, and the image
// still finds libcuda through its ld.so.cache at the usual path, nvidia-smi
// in /usr/bin, and the tree at /usr/local/nvidia, under real runc.
func TestDriverTreeLayout(t *testing.T) {
	trees := filepath.Join(t.TempDir(), "trees")
	script := `probe; echo ---; ` +
		`readlink ` + treeLibDir + `/libcuda.so.1; ls ` + libDir + `/libcuda.so.1 2>/dev/null || echo perfile=none; ` +
		`test -e ` + libDir + `/libcuda.so && echo devlink=$(readlink ` + libDir + `/libcuda.so); ` +
		`ls /usr/local/nvidia/lib64 | grep -c '^libcuda.so'; ` +
		`/usr/bin/nvidia-smi -L >/dev/null && echo smi=ok || echo smi=missing; readlink /usr/bin/nvidia-smi; ` +
		`touch /usr/local/nvidia/lib64/x 2>/dev/null && echo tree=writable || echo tree=readonly; ` +
		`echo gl=$(ls -R /usr/local/nvidia | grep -c -e EGL_nvidia -e GLX_nvidia)`
	var first string // the first container's tree
	for round := 1; round <= 2; round++ {
		c := newContainer(t, opts{
			env:    []string{"NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"},
			args:   []string{"sh", "-c", script},
			config: fmt.Sprintf("driver-layout = \"tree\"\ndriver-tree-dir = %q\n", trees),
		})
		if round == 2 {
			// The second container finds the tree through the cache.
			if err := os.MkdirAll(filepath.Join(filepath.Dir(c.config), "cache"), 0o700); err != nil {
				t.Fatal(err)
			}
		}
		out, stderr, err := c.run()
		if err != nil {
			t.Fatalf("round %d: gantry-runtime run: %v\nstdout:\n%s\nstderr:\n%s", round, err, out, stderr)
		}
		wantProbe := fmt.Sprintf("cuda=%d path=%s/libcuda.so.1", c.f.driver.CUDAVersion, treeLibDir)
		// compute,utility: no graphics library anywhere in the tree; the
		// loader finds libcuda in the tree (no link per library).
		// The development link stays in the library folder (gcc -lcuda,
		// dlopen("libcuda.so")), pointing into the tree.
		for _, want := range []string{wantProbe, "perfile=none", "devlink=" + treeLibDir + "/libcuda.so", "smi=ok", "tree=readonly", "gl=0\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("round %d: want %q in the container's output:\n%s", round, want, out)
			}
		}
		var spec ocispecs.Spec
		if err := json.Unmarshal(c.configJSON(), &spec); err != nil {
			t.Fatal(err)
		}
		var tree []ocispecs.Mount
		for _, m := range spec.Mounts {
			if strings.HasPrefix(m.Source, c.f.driver.Root) && !strings.HasPrefix(m.Source, filepath.Join(c.f.driver.Root, "dev")) &&
				strings.Contains(m.Source, "lib") && strings.HasSuffix(m.Source, ".so") || strings.Contains(m.Source, ".so.") {
				t.Errorf("round %d: a library still has a mount of its own: %s -> %s", round, m.Source, m.Destination)
			}
			if m.Destination == edits.DefaultTreePath {
				tree = append(tree, m)
			}
		}
		if len(tree) != 1 || !strings.HasPrefix(tree[0].Source, trees+"/") {
			t.Fatalf("round %d: mounts at %s: %+v, want one from %s", round, edits.DefaultTreePath, tree, trees)
		}
		if first == "" {
			first = tree[0].Source
		} else if tree[0].Source != first {
			t.Errorf("round %d: two compute,utility containers got two trees: %s and %s", round, first, tree[0].Source)
		}
		logged, err := os.ReadFile(filepath.Join(filepath.Dir(c.config), "gantry.log"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(logged), `"layout":"tree"`) {
			t.Errorf("round %d: log line %s: want layout tree", round, logged)
		}
	}
	if d := config.Default().Runtime.DriverTreeDir; d != "/var/lib/nvidia-docker/volumes/nvidia_driver" {
		t.Errorf("default driver-tree-dir %s: want nvidia-docker-plugin's volume directory", d)
	}
}

// The tree holds what the container's capabilities select: a container
// asking for graphics finds the EGL and GLX vendor libraries in it (through
// its ld.so.cache too), in a tree of its own, not the compute containers';
// one asking for compute,utility finds none. Under real runc, with the
// default layout (no driver-layout key).
func TestDriverTreePerCapabilities(t *testing.T) {
	trees := filepath.Join(t.TempDir(), "trees")
	script := `echo gl=$(ls -R /usr/local/nvidia | grep -c -e '^libEGL_nvidia' -e '^libGLX_nvidia'); ` +
		`readlink -f ` + treeLibDir + `/libEGL_nvidia.so.0 || echo egl=none`
	source := map[string]string{}
	for _, caps := range []string{"compute,utility", "graphics,compute,utility"} {
		c := newContainer(t, opts{
			env:    []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=" + caps},
			args:   []string{"sh", "-c", script},
			config: fmt.Sprintf("driver-tree-dir = %q\n", trees),
		})
		out, stderr, err := c.run()
		if err != nil {
			t.Fatalf("%s: gantry-runtime run: %v\nstdout:\n%s\nstderr:\n%s", caps, err, out, stderr)
		}
		graphics := strings.HasPrefix(caps, "graphics")
		if has := !strings.Contains(out, "gl=0\n"); has != graphics {
			t.Errorf("%s: graphics libraries under /usr/local/nvidia: %v, want %v:\n%s", caps, has, graphics, out)
		}
		if graphics && !strings.Contains(out, "/usr/local/nvidia/lib64/libEGL_nvidia.so.") {
			t.Errorf("%s: %s/libEGL_nvidia.so.0 does not lead into the tree:\n%s", caps, libDir, out)
		}
		var spec ocispecs.Spec
		if err := json.Unmarshal(c.configJSON(), &spec); err != nil {
			t.Fatal(err)
		}
		for _, m := range spec.Mounts {
			if m.Destination == edits.DefaultTreePath {
				source[caps] = m.Source
			}
		}
		if !strings.HasPrefix(source[caps], trees+"/") {
			t.Fatalf("%s: no tree mount from %s: %+v", caps, trees, spec.Mounts)
		}
	}
	if source["compute,utility"] == source["graphics,compute,utility"] {
		t.Errorf("compute and graphics containers share the tree %s", source["compute,utility"])
	}
}

// An image whose /usr/local/nvidia is a symlink pointing out of its root
// filesystem: the tree's mount (and the links into it) stay inside the
// container's root; nothing appears at the host path the link names.
func TestDriverTreeHostileMountPoint(t *testing.T) {
	escape := filepath.Join(t.TempDir(), "escape")
	if err := os.MkdirAll(escape, 0o755); err != nil {
		t.Fatal(err)
	}
	trees := filepath.Join(t.TempDir(), "trees")
	c := newContainer(t, opts{
		env:    []string{"NVIDIA_VISIBLE_DEVICES=0"},
		args:   []string{"sh", "-c", "probe"},
		config: fmt.Sprintf("driver-layout = \"tree\"\ndriver-tree-dir = %q\n", trees),
		mutate: func(rootfs string) {
			if err := os.MkdirAll(filepath.Join(rootfs, "usr/local"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("/../../../../../../../.."+escape, filepath.Join(rootfs, "usr/local/nvidia")); err != nil {
				t.Fatal(err)
			}
		},
	})
	out, stderr, err := c.run()
	if err != nil {
		t.Logf("refused (acceptable): %v\n%s\n%s", err, out, stderr)
	}
	ents, err := os.ReadDir(escape)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("the host directory the image's link names got %d entries: the tree was mounted or linked outside the container", len(ents))
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), escape) {
		t.Fatalf("a mount at %s on the host", escape)
	}
}

// An image that carries its own libcuda.so.1 in the library folder (a
// driver package installed at build time) gets it replaced by a link into
// the tree, as the per-file layout replaced it: LD_LIBRARY_PATH naming the
// folder finds the host's driver, not a stale one.
func TestDriverTreeReplacesImageDriverLib(t *testing.T) {
	c := newContainer(t, opts{
		env:  []string{"NVIDIA_VISIBLE_DEVICES=0"},
		args: []string{"sh", "-c", "readlink " + libDir + "/libcuda.so.1 || echo not-a-link; LD_LIBRARY_PATH=" + libDir + " probe"},
		mutate: func(rootfs string) {
			if err := os.WriteFile(filepath.Join(rootfs, libDir, "libcuda.so.1"), []byte("stale driver library"), 0o644); err != nil {
				t.Fatal(err)
			}
		},
	})
	out, stderr, err := c.run()
	if err != nil {
		t.Fatalf("gantry-runtime run: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr)
	}
	if !strings.Contains(out, treeLibDir+"/libcuda.so.1\n") {
		t.Errorf("the image's own libcuda.so.1 was not replaced by a link into the tree:\n%s", out)
	}
	if want := fmt.Sprintf("cuda=%d path=%s/libcuda.so.1", c.f.driver.CUDAVersion, libDir); !strings.Contains(out, want) {
		t.Errorf("probe with LD_LIBRARY_PATH=%s: want %q in\n%s", libDir, want, out)
	}
}

// The driver's firmware and configuration files (GSP firmware, the Vulkan
// ICD and EGL vendor files, the OpenCL ICD, ...) in the tree layout: no
// mount each, a link at the usual path into the tree's mount, which the
// container reads through real runc with the host file's bytes. The image's
// /lib/firmware is an absolute link that, followed on the host, leads out
// of its root filesystem: the firmware's links are made inside the root
// all the same (package rootfs), nothing on the host.
func TestDriverTreeFiles(t *testing.T) {
	f := need(t)
	inv, err := driver.Discover(driver.Options{Root: f.driver.Root})
	if err != nil {
		t.Fatal(err)
	}
	library := map[string]bool{}
	for _, l := range inv.Libraries {
		library[l.HostPath] = true
	}
	caps := []driver.Capability{"", driver.Graphics, driver.Compute, driver.Utility}
	host := map[string]string{} // container path: host path
	var script strings.Builder
	for _, x := range slices.Concat(inv.Firmware, inv.Configs) {
		if st, err := os.Stat(x.HostPath); err != nil || !st.Mode().IsRegular() || library[x.HostPath] || !slices.Contains(caps, x.Capability) {
			continue
		}
		host[x.ContainerPath] = x.HostPath
		fmt.Fprintf(&script, "echo '== %s'; readlink %s; cat %s; ", x.ContainerPath, x.ContainerPath, x.ContainerPath)
	}
	for _, want := range []string{"/etc/OpenCL/vendors/nvidia.icd", "/usr/share/vulkan/icd.d/nvidia_icd.json", "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"} {
		if host[want] == "" {
			t.Fatalf("the fake driver has no %s: %v", want, host)
		}
	}
	if len(inv.Firmware) == 0 {
		t.Fatal("the fake driver has no firmware")
	}
	escape := t.TempDir()
	c := newContainer(t, opts{
		env:  []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=graphics,compute,utility"},
		args: []string{"sh", "-c", script.String()},
		mutate: func(rootfs string) {
			// The link's target exists inside the root (followed in the
			// root, it leads there) and on the host (followed on the host,
			// it would lead out).
			for _, d := range []string{filepath.Join(rootfs, "lib"), filepath.Join(rootfs, escape)} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Symlink("/../../../../../../../.."+escape, filepath.Join(rootfs, "lib/firmware")); err != nil {
				t.Fatal(err)
			}
		},
	})
	out, stderr, err := c.run()
	if err != nil {
		t.Fatalf("gantry-runtime run: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr)
	}
	for cp, hp := range host {
		b, err := os.ReadFile(hp)
		if err != nil {
			t.Fatal(err)
		}
		want := "== " + cp + "\n" + edits.DefaultTreePath + "/files" + cp + "\n" + string(b)
		if !strings.Contains(out, want) {
			t.Errorf("%s in the container: want a link into the tree with the bytes of %s:\n%s\nin the output:\n%s", cp, hp, want, out)
		}
	}
	var spec ocispecs.Spec
	if err := json.Unmarshal(c.configJSON(), &spec); err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Mounts {
		if _, ok := host[m.Destination]; ok || strings.HasPrefix(m.Destination, "/lib/firmware") {
			t.Errorf("%s still has a mount of its own (from %s)", m.Destination, m.Source)
		}
	}
	if ents, err := os.ReadDir(escape); err != nil || len(ents) != 0 {
		t.Errorf("the host directory the image's /lib/firmware names got %d entries (%v): links made outside the container", len(ents), err)
	}
}
