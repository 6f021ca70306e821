package nsmount

import (
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/containerhook"
	"github.com/gantry-gpu/gantry/internal/edits"
)

// hookEnv names, in the environment runc gives the hook, the file holding
// what the hook applies. Set, the test binary is the prestart hook.
const hookEnv = "NSMOUNT_TEST_HOOK"

// hookInput is what a test asks the hook to apply.
type hookInput struct {
	Edits   edits.Edits
	Options Options
}

func TestMain(m *testing.M) {
	if p := os.Getenv(hookEnv); p != "" {
		os.Exit(runHook(p))
	}
	os.Exit(m.Run())
}

// runHook is the test binary acting as a runc prestart hook: the container
// state on stdin, Apply, one line on stderr and exit 1 on failure.
func runHook(input string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "nsmount test hook:", err)
		return 1
	}
	b, err := os.ReadFile(input)
	if err != nil {
		return fail(err)
	}
	var in hookInput
	if err := json.Unmarshal(b, &in); err != nil {
		return fail(err)
	}
	stdin, err := io.ReadAll(os.Stdin)
	if err != nil {
		return fail(err)
	}
	var st specs.State
	if err := json.Unmarshal(stdin, &st); err != nil {
		return fail(err)
	}
	_, root, err := containerhook.ReadState(strings.NewReader(string(stdin)))
	if err != nil {
		return fail(err)
	}
	if err := Apply(st.Pid, root, &in.Edits, in.Options); err != nil {
		return fail(err)
	}
	return 0
}

// busyboxApplets are the commands the container scripts use.
var busyboxApplets = []string{"sh", "cat", "stat", "head", "mknod", "test", "grep", "echo", "ls", "touch"}

// staticBusybox finds a statically linked busybox (Debian's busybox-static),
// which runs in a root filesystem without a C library.
func staticBusybox(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		static := true
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				static = false
			}
		}
		f.Close()
		if static {
			return p
		}
	}
	t.Skip("skipping: no statically linked busybox (apt-get install busybox-static; scripts/deps.sh --test does)")
	return ""
}

// needRunc skips unless the test can run real runc containers.
func needRunc(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: running runc containers needs root")
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Skip("skipping: runc not installed (apt-get install runc)")
	}
	return runc
}

// busyboxRoot makes a root filesystem holding only busybox and its applets.
func busyboxRoot(t *testing.T, dir string) {
	t.Helper()
	bb := staticBusybox(t)
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp", "etc", "usr/lib", "run"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range busyboxApplets {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
}

// writeBundle writes config.json (runc's default spec, adjusted) into bundle,
// whose rootfs/ must exist: the process runs script with sh, the rootfs is
// writable, CAP_MKNOD lets the script make nodes the cgroup should still
// refuse, and hooks are the prestart hooks.
func writeBundle(t *testing.T, runc, bundle, script string, env []string, hooks []specs.Hook) {
	t.Helper()
	os.Remove(filepath.Join(bundle, "config.json"))
	if out, err := exec.Command(runc, "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		t.Fatalf("runc spec: %v\n%s", err, out)
	}
	p := filepath.Join(bundle, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	s.Process.Terminal = false
	s.Process.Args = []string{"sh", "-c", script}
	s.Process.Env = append(s.Process.Env, env...)
	for _, set := range []*[]string{&s.Process.Capabilities.Bounding, &s.Process.Capabilities.Effective, &s.Process.Capabilities.Permitted} {
		*set = append(*set, "CAP_MKNOD")
	}
	s.Root.Readonly = false
	s.Hooks = &specs.Hooks{Prestart: hooks} //nolint:staticcheck // Docker uses prestart
	b, err = json.MarshalIndent(&s, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// cgroupMode says how a test container's device cgroup is run.
type cgroupMode string

const (
	cgroupV1 cgroupMode = "v1"
	cgroupV2 cgroupMode = "v2"
)

func isCgroup2(p string) bool {
	out, err := exec.Command("stat", "-f", "-c", "%T", p).Output()
	return err == nil && strings.TrimSpace(string(out)) == "cgroup2fs"
}

// cgroupModes lists the cgroup versions runc can be run under here. On a
// hybrid host (v1 controllers, cgroup2 at /sys/fs/cgroup/unified) runc uses
// v1; v2 is then had by running runc in a private mount namespace where the
// unified hierarchy is bind-mounted over /sys/fs/cgroup, which is exactly
// what runc checks to pick v2.
func cgroupModes() []cgroupMode {
	if isCgroup2("/sys/fs/cgroup") {
		return []cgroupMode{cgroupV2}
	}
	modes := []cgroupMode{cgroupV1}
	if _, err := exec.LookPath("unshare"); err == nil && isCgroup2("/sys/fs/cgroup/unified") {
		modes = append(modes, cgroupV2)
	}
	return modes
}

// runContainer runs the bundle's container to completion with runc and
// returns its output (and runc's errors).
func runContainer(t *testing.T, runc, bundle, id string, mode cgroupMode) (string, error) {
	t.Helper()
	state := filepath.Join(t.TempDir(), "runc-state")
	args := []string{runc, "--root", state, "run", "--bundle", bundle, id}
	var cmd *exec.Cmd
	if mode == cgroupV2 && !isCgroup2("/sys/fs/cgroup") {
		script := `mount --make-rprivate / && mount --bind /sys/fs/cgroup/unified /sys/fs/cgroup && exec "$@"`
		cmd = exec.Command("unshare", append([]string{"-m", "sh", "-c", script, "sh"}, args...)...)
	} else {
		cmd = exec.Command(args[0], args[1:]...)
	}
	out, err := cmd.CombinedOutput()
	exec.Command(runc, "--root", state, "delete", "--force", id).Run()
	return string(out), err
}
