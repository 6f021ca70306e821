package containerhook

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The hooks a spec of NVIDIA's nvidia-ctk names, run by real runc as
// createContainer hooks of a busybox container, with the static binary
// installed as nvidia-cdi-hook: chmod, enable-cuda-compat, update-ldcache,
// disable-device-node-modification (a no-op without a driver), the hidden
// noop, and a hook this version does not know, which must not stop the
// container. The container then sees what the hooks did.
func TestNVHooksUnderRunc(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: runc needs root")
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Skip("skipping: runc not installed")
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("skipping: busybox not installed (busybox-static)")
	}
	if out, _ := exec.Command("file", "-L", busybox).Output(); strings.Contains(string(out), "dynamically") {
		t.Skip("skipping: busybox is dynamically linked (install busybox-static)")
	}
	hook := buildHook(t)
	nv := filepath.Join(t.TempDir(), "nvidia-cdi-hook")
	if err := os.Symlink(hook, nv); err != nil {
		t.Fatal(err)
	}

	bundle := t.TempDir()
	root := filepath.Join(bundle, "rootfs")
	mkdirs(t, root, "bin", "etc", "proc", "dev", "sys", "opt/data", CompatDir, "usr/lib")
	copyFile(t, busybox, filepath.Join(root, "bin/busybox"))
	if err := os.Symlink("busybox", filepath.Join(root, "bin/sh")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "opt/data"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, CompatDir, "libcuda.so.999.1.1"), "not an ELF file: the version decides")

	hooks := func(args ...[]string) []specs.Hook {
		var out []specs.Hook
		for _, a := range args {
			out = append(out, specs.Hook{Path: nv, Args: append([]string{"nvidia-cdi-hook"}, a...), Env: []string{"PATH=/usr/bin:/bin"}})
		}
		return out
	}
	spec := specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: "rootfs"},
		Process: &specs.Process{
			Args: []string{"/bin/busybox", "sh", "-c", "/bin/busybox stat -c %a /opt/data; /bin/busybox cat /etc/ld.so.conf.d/00-compat-*.conf; /bin/busybox head -c 17 /etc/ld.so.cache; echo"},
			Cwd:  "/",
			Env:  []string{"PATH=/bin"},
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755"}},
		},
		Hooks: &specs.Hooks{CreateContainer: hooks(
			[]string{"chmod", "--mode", "755", "--path", "/opt/data", "--path", "/dev/dri"},
			[]string{"enable-cuda-compat", "--host-driver-version", "580.159.04"},
			[]string{"update-ldcache", "--folder", "/usr/lib"},
			[]string{"disable-device-node-modification"},
			[]string{"noop"},
			[]string{"some-hook-of-nvidia-ctk-1.30", "--with-a-flag"},
		)},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.MountNamespace}, {Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}}},
	}
	b, _ := json.MarshalIndent(spec, "", " ")
	writeFile(t, filepath.Join(bundle, "config.json"), string(b))
	state := filepath.Join(t.TempDir(), "runc-state")
	id := "nvhooks-" + filepath.Base(bundle)
	cmd := exec.Command(runc, "--root", state, "run", "--bundle", bundle, id)
	out, err := cmd.CombinedOutput()
	t.Cleanup(func() { exec.Command(runc, "--root", state, "delete", "--force", id).Run() })
	if err != nil {
		t.Fatalf("runc run: %v\n%s", err, out)
	}
	got := string(out)
	for _, want := range []string{"755\n", CompatDir + "\n", "glibc-ld.so.cache"} {
		if !strings.Contains(got, want) {
			t.Errorf("container output lacks %q:\n%s", want, got)
		}
	}
}
