//go:build cgo

package shim

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/createproto"
)

// hookBin is this tree's gantry under the name Docker's --gpus runs (a
// symlink beside gantry-runtime): the same file, so the create server
// started from gantry-runtime serves it.
func hookBin(t *testing.T, f *fixture) string {
	t.Helper()
	p := filepath.Join(filepath.Dir(f.runtime), "nvidia-container-runtime-hook")
	if err := os.Symlink("gantry", p); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	return p
}

// withHook gives c's config.json the prestart hook Docker's --gpus adds,
// with c's configuration and sock (a path that does not exist for none) as
// the create server in the hook's own env, and edit applied to the spec.
func withHook(t *testing.T, c *container, sock string, edit func(*ocispecs.Spec)) {
	t.Helper()
	var spec ocispecs.Spec
	if err := json.Unmarshal(c.configJSON(), &spec); err != nil {
		t.Fatal(err)
	}
	if sock == "" {
		sock = filepath.Join(c.f.dir, "no-create-server.sock")
	}
	spec.Hooks = &ocispecs.Hooks{Prestart: []ocispecs.Hook{{ //nolint:staticcheck // what Docker adds
		Path: hookBin(t, c.f),
		Args: []string{"nvidia-container-runtime-hook", "prestart"},
		Env:  []string{"GANTRY_CONFIG=" + c.config, createproto.ServerSocketEnv + "=" + sock},
	}}}
	if edit != nil {
		edit(&spec)
	}
	b, err := json.MarshalIndent(&spec, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.bundle, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// lowRun runs c with the low-level runtime itself (Docker's --gpus path:
// no gantry-runtime), to completion.
func (c *container) lowRun() (string, error) {
	c.t.Cleanup(func() { exec.Command(c.low, "--root", c.state, "delete", "--force", c.id).Run() })
	out, err := outputToFile(c.t, exec.Command(c.low, "--root", c.state, "run", "--bundle", c.bundle, c.id))
	return string(out), err
}

// hookRecords are c's log records written by the hook.
func hookRecords(t *testing.T, c *container) []map[string]any {
	var out []map[string]any
	for _, r := range logLines(t, c) {
		if r["front-end"] == "gantry-hook" {
			out = append(out, r)
		}
	}
	return out
}

// TestHookServer: Docker's --gpus path with the create server running.
// The hook's C start sends the state to the server, which does the hook's
// work for it (one log record, "server":true), and the container sees
// what the hook's own Go code gives it without a server.
func TestHookServer(t *testing.T) {
	f := need(t)
	sock, _, _ := startServer(t, f.runtime)
	env := []string{"NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}
	args := []string{"sh", "-c", gpuScript}
	served := newContainer(t, opts{env: env, args: args})
	withHook(t, served, sock, nil)
	out, err := served.lowRun()
	if err != nil {
		t.Fatalf("runc run with the hook through the server: %v\n%s", err, out)
	}
	if want := fmt.Sprintf("cuda=%d path=%s/libcuda.so.1", f.driver.CUDAVersion, treeLibDir); !strings.Contains(out, want) {
		t.Errorf("probe in the container: want %q in\n%s", want, out)
	}
	recs := hookRecords(t, served)
	if len(recs) != 1 || recs[0]["server"] != true || recs[0]["changed"] != true {
		t.Fatalf("want one record of the hook's work by the server, got %v", logLines(t, served))
	}
	local := newContainer(t, opts{env: env, args: args})
	withHook(t, local, "", nil)
	out2, err := local.lowRun()
	if err != nil {
		t.Fatalf("runc run with the hook in-process: %v\n%s", err, out2)
	}
	if out2 != out {
		t.Errorf("container output differs:\nserver:\n%s\nin-process:\n%s", out, out2)
	}
	if recs := hookRecords(t, local); len(recs) != 1 || recs[0]["server"] == true {
		t.Errorf("want one in-process record, got %v", recs)
	}
}

// TestHookServerRefusalInProcess: a request the server cannot serve (GPU
// 99 of 8) is the hook's Go code's, which refuses it with its one-line
// error: runc fails the container, and only the in-process refusal is
// logged.
func TestHookServerRefusalInProcess(t *testing.T) {
	f := need(t)
	sock, _, _ := startServer(t, f.runtime)
	c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=99"}, args: []string{"true"}})
	withHook(t, c, sock, nil)
	out, err := c.lowRun()
	if err == nil {
		t.Fatalf("a container asking for GPU 99 of 8 ran:\n%s", out)
	}
	if !strings.Contains(out, "gantry-hook: ") || !strings.Contains(out, "99") {
		t.Errorf("want the hook's error naming 99, got:\n%s", out)
	}
	recs := hookRecords(t, c)
	if len(recs) != 1 || recs[0]["error"] == nil || recs[0]["server"] == true {
		t.Errorf("want one record of the in-process refusal, got %v", recs)
	}
}

// TestHookServerLargeState: a state too large to send (runc copies the
// annotations into it) stays with the hook's Go code, which reads on
// stdin every byte runc wrote, and the container gets its GPUs.
func TestHookServerLargeState(t *testing.T) {
	f := need(t)
	sock, _, _ := startServer(t, f.runtime)
	c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=1"}, args: []string{"sh", "-c", gpuScript}})
	big := strings.Repeat("x", createproto.MaxHookState)
	withHook(t, c, sock, func(s *ocispecs.Spec) { s.Annotations = map[string]string{"example.com/big": big} })
	out, err := c.lowRun()
	if err != nil {
		t.Fatalf("runc run: %v\n%s", err, out)
	}
	if want := fmt.Sprintf("cuda=%d", f.driver.CUDAVersion); !strings.Contains(out, want) {
		t.Errorf("probe in the container: want %q in\n%s", want, out)
	}
	recs := hookRecords(t, c)
	if len(recs) != 1 || recs[0]["server"] == true || recs[0]["changed"] != true {
		t.Errorf("want one in-process record of the change, got %v", recs)
	}
}

// TestHookServerChecksCaller: the server checks the state's process
// against its caller (the hook), not against itself. The victim is a
// process in a mount namespace of its own that sees the host's tree (so
// the bundle's root filesystem) and whose parent is the server's parent;
// the hook runs two shells down from there. A server that took its own
// parent for the runtime would mount the driver into the victim's
// namespace; it must refuse, and so must the hook's own Go code.
func TestHookServerChecksCaller(t *testing.T) {
	f := need(t)
	sock, _, _ := startServer(t, f.runtime)
	c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=1"}, args: []string{"true"}})
	withHook(t, c, sock, nil)
	victim := exec.Command("unshare", "-m", "--propagation", "private", "sleep", "60")
	if err := victim.Start(); err != nil {
		t.Skipf("unshare -m: %v", err)
	}
	t.Cleanup(func() { victim.Process.Kill(); victim.Wait() })
	pid := victim.Process.Pid
	for i := 0; ; i++ {
		a, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		b, _ := os.Readlink("/proc/self/ns/mnt")
		if a != "" && a != b {
			break
		}
		if i == 3000 { // a minute: unshare may take long to start on a busy machine
			t.Fatal("the victim never entered a mount namespace of its own")
		}
		time.Sleep(20 * time.Millisecond)
	}
	before, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	state := fmt.Sprintf(`{"ociVersion":"1.0.2","id":"forged","status":"creating","pid":%d,"bundle":%q}`, pid, c.bundle)
	script := `sh -c '"$0" prestart; exit $?' "$0"; exit $?`
	cmd := exec.Command("sh", "-c", script, hookBin(t, f))
	cmd.Stdin = strings.NewReader(state)
	cmd.Env = []string{"GANTRY_CONFIG=" + c.config, createproto.ServerSocketEnv + "=" + sock}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the hook accepted a state naming process %d, a child of the server's parent:\n%s", pid, out)
	}
	if !strings.Contains(string(out), "not the init of the container being created") {
		t.Errorf("want the parent check's refusal, got:\n%s", out)
	}
	after, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if string(before) != string(after) {
		t.Errorf("process %d's mounts changed:\n%s", pid, after)
	}
	for _, r := range hookRecords(t, c) {
		if r["server"] == true {
			t.Errorf("the server logged work for the forged state: %v", r)
		}
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
		t.Fatalf("the victim died: %v", err)
	}
}

// TestHookServerRefusesRestrictedCallers: a root caller that could not do
// the hook's work itself is not served: one stripped of its capabilities
// (setpriv --bounding-set=-all), one in another cgroup namespace (the
// container's cgroup would read differently). Its hook runs in-process,
// with whatever that can do; the server logs no work for it.
func TestHookServerRefusesRestrictedCallers(t *testing.T) {
	f := need(t)
	sock, _, out := startServer(t, f.runtime)
	for _, tc := range []struct {
		name string
		wrap []string
		why  string
	}{
		{"no capabilities", []string{"setpriv", "--bounding-set=-all", "--inh-caps=-all"}, "capabilities"},
		{"cgroup namespace", []string{"unshare", "-C"}, "cgroup namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wrapper, err := exec.LookPath(tc.wrap[0])
			if err != nil {
				t.Skipf("%s: %v", tc.wrap[0], err)
			}
			c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=1"}, args: []string{"true"}})
			withHook(t, c, sock, func(s *ocispecs.Spec) {
				h := s.Hooks.Prestart[0]
				h.Args = append(append([]string{}, tc.wrap...), h.Path, "prestart")
				h.Path = wrapper
				s.Hooks.Prestart[0] = h
			})
			runOut, _ := c.lowRun()
			for _, r := range hookRecords(t, c) {
				if r["server"] == true {
					t.Errorf("the server did the hook's work for a caller %s: %v\n%s", tc.name, r, runOut)
				}
			}
			if len(hookRecords(t, c)) == 0 && !strings.Contains(runOut, "gantry-hook") {
				t.Errorf("the hook did not run:\n%s", runOut)
			}
			b, _ := os.ReadFile(out)
			if !strings.Contains(string(b), tc.why) {
				t.Errorf("the server's log does not say why (%q):\n%s", tc.why, b)
			}
		})
	}
}

// TestHookMarkedDone: a second prestart of a container whose hook is done
// (the in-process hook after the server finished the work it stopped
// waiting for) finds the first one's mark and changes nothing: no second
// set of mounts, exit 0, a note in its record.
func TestHookMarkedDone(t *testing.T) {
	f := need(t)
	c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=1"}, args: []string{"true"}})
	withHook(t, c, "", nil)
	t.Cleanup(func() { exec.Command(c.low, "--root", c.state, "delete", "--force", c.id).Run() })
	if out, err := outputToFile(t, exec.Command(c.low, "--root", c.state, "create", "--bundle", c.bundle, c.id)); err != nil {
		t.Fatalf("runc create: %v\n%s", err, out)
	}
	st, err := exec.Command(c.low, "--root", c.state, "state", c.id).Output()
	if err != nil {
		t.Fatal(err)
	}
	var state struct{ Pid int }
	if err := json.Unmarshal(st, &state); err != nil || state.Pid <= 0 {
		t.Fatalf("runc state: %v %s", err, st)
	}
	before, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", state.Pid))
	cmd := exec.Command(hookBin(t, f), "prestart")
	cmd.Stdin = strings.NewReader(fmt.Sprintf(`{"ociVersion":"1.0.2","id":%q,"status":"created","pid":%d,"bundle":%q}`, c.id, state.Pid, c.bundle))
	cmd.Env = []string{"GANTRY_CONFIG=" + c.config, createproto.ServerSocketEnv + "=" + filepath.Join(c.f.dir, "no-create-server.sock")}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("a second prestart of a done container: %v\n%s", err, out)
	}
	after, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", state.Pid))
	if string(before) != string(after) {
		t.Errorf("the second prestart changed the container's mounts")
	}
	recs := hookRecords(t, c)
	if len(recs) != 2 || !strings.Contains(fmt.Sprint(recs[1]["notes"]), "already") {
		t.Errorf("want the second record to say it was done already, got %v", recs)
	}
}

// TestImageEnvNeverSteers: an image whose environment names Gantry's
// variables (another create server's socket, a configuration, the fast
// path off) steers neither gantry-runtime nor the --gpus hook: each reads
// only its own environment (the engine's, the hook entry's). The image's
// socket gets no connection, and the real server does the work.
func TestImageEnvNeverSteers(t *testing.T) {
	f := need(t)
	sock, _, _ := startServer(t, f.runtime)
	evil := filepath.Join(t.TempDir(), "evil.sock")
	l, err := net.Listen("unix", evil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var calls atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			calls.Add(1)
			c.Close()
		}
	}()
	env := []string{"NVIDIA_VISIBLE_DEVICES=0", createproto.ServerSocketEnv + "=" + evil, "GANTRY_CONFIG=/dev/zero", "GANTRY_NO_FASTPATH=1"}
	for _, hook := range []bool{false, true} {
		c := newContainer(t, opts{env: env, args: []string{"probe"}})
		var out string
		var err error
		if hook {
			withHook(t, c, sock, nil)
			out, err = c.lowRun()
		} else {
			c.server = sock
			var stderr string
			out, stderr, err = c.run()
			out += stderr
		}
		if err != nil || !strings.Contains(out, "cuda=") {
			t.Errorf("hook %v: the container did not get its GPU: %v\n%s", hook, err, out)
		}
		recs := logLines(t, c)
		if len(recs) != 1 || recs[0]["server"] != true {
			t.Errorf("hook %v: want the real server's one record, got %v", hook, recs)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the image's socket got %d connections", n)
	}
}
