package hook

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The prestart hook acts on the pid in the OCI state. A state naming any
// process but the init of the container being created (the host's, the
// caller's own, a process in a mount namespace of its own that sees the
// host's tree, another running container) is refused before anything
// changes: no mount in that process's namespace, no device rule.
func TestHookRefusesOtherProcesses(t *testing.T) {
	needSetup(t)
	dir, _ := bundle(t, gpuScript, "NVIDIA_VISIBLE_DEVICES=1")

	// A process in a mount namespace of its own, started by another parent
	// (a shell that exits), seeing the host's tree and so the bundle.
	out, err := exec.Command("sh", "-c", "unshare -m sleep 60 >/dev/null 2>&1 & echo $!").Output()
	if err != nil {
		t.Skipf("unshare -m: %v", err)
	}
	ownNS, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	t.Cleanup(func() { exec.Command("kill", strconv.Itoa(ownNS)).Run() })

	// Another running container, its own root filesystem.
	other, _ := bundle(t, "sleep 60")
	state := filepath.Join(t.TempDir(), "runc-state")
	// No pipes: the detached container would hold them open.
	if err := exec.Command("runc", "--root", state, "run", "--detach", "--bundle", other, "hook-victim").Run(); err != nil {
		t.Fatalf("runc run --detach: %v", err)
	}
	t.Cleanup(func() { exec.Command("runc", "--root", state, "delete", "--force", "hook-victim").Run() })
	out, err = exec.Command("runc", "--root", state, "state", "hook-victim").Output()
	if err != nil {
		t.Fatal(err)
	}
	var st struct{ Pid int }
	json.Unmarshal(out, &st)
	victim := st.Pid
	if victim <= 0 {
		t.Fatalf("no pid in runc state: %s", out)
	}
	// Give unshare time to enter its namespace (up to a minute on a busy
	// machine).
	for i := 0; i < 3000; i++ {
		a, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", ownNS))
		b, _ := os.Readlink("/proc/self/ns/mnt")
		if a != "" && a != b {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	for _, tc := range []struct {
		name string
		pid  int
		want string
	}{
		{"pid 1", 1, "refusing to act on process 1"},
		{"the caller", os.Getpid(), "mount namespace"},
		{"own mount namespace, another parent", ownNS, "is not the init of the container being created"},
		{"another container", victim, "refusing to act on process " + strconv.Itoa(victim)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", tc.pid))
			cmd := exec.Command(hookBin, "prestart")
			cmd.Stdin = strings.NewReader(fmt.Sprintf(`{"ociVersion":"1.0.2","id":"forged","status":"creating","pid":%d,"bundle":%q}`, tc.pid, dir))
			cmd.Env = []string{"GANTRY_CONFIG=" + cfgFile}
			msg, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the hook accepted a state naming %s (pid %d):\n%s", tc.name, tc.pid, msg)
			}
			if !strings.Contains(string(msg), tc.want) {
				t.Errorf("error %q, want it to contain %q", msg, tc.want)
			}
			after, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", tc.pid))
			if string(before) != string(after) {
				t.Errorf("process %d's mounts changed", tc.pid)
			}
		})
	}
}
