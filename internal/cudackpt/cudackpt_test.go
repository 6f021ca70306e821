package cudackpt

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

// The helper against the simulated driver's libcuda (a gcc-built ELF that
// keeps each process's checkpoint state and records the calls), in this
// process: the calls, their order, a call in the wrong state, an injected
// failure, and a restore's GPU pairs.
func TestHelperAgainstFakeDriver(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: the fake libcuda is built with it")
	}
	dir := t.TempDir()
	ck := filepath.Join(dir, "ckpt")
	if err := os.Mkdir(ck, 0o755); err != nil {
		t.Fatal(err)
	}
	res, err := fakedriver.Build(filepath.Join(dir, "driver"), fakedriver.Options{Version: "580.159.04", CheckpointDir: ck})
	if err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(res.Root, res.LibDir, "libcuda.so.1")
	holder := startHolder(t, dir, lib)
	pid := strconv.Itoa(holder)

	call := func(args ...string) (Reply, int) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := HelperMain(append([]string{"--lib", lib}, args...), &out, &errOut)
		var r Reply
		if code != 2 {
			if err := json.Unmarshal(out.Bytes(), &r); err != nil {
				t.Fatalf("%v: %q (%s): %v", args, out.String(), errOut.String(), err)
			}
		}
		return r, code
	}
	state := func() State {
		t.Helper()
		r, code := call("state", pid)
		if code != 0 || len(r.Results) != 1 {
			t.Fatalf("state: exit %d, %+v", code, r)
		}
		return r.Results[0].State
	}
	if s := state(); s != Running {
		t.Fatalf("state before: %s", s)
	}
	if r, code := call("checkpoint", pid); code != 1 || r.Results[0].Code != 401 {
		t.Errorf("checkpoint of a running (unlocked) process: exit %d %+v, want CUresult 401", code, r)
	}
	if _, code := call("--timeout-ms", "5000", "lock", pid); code != 0 {
		t.Fatalf("lock failed")
	}
	if _, code := call("checkpoint", pid); code != 0 {
		t.Fatalf("checkpoint failed")
	}
	if s := state(); s != Checkpointed {
		t.Errorf("state after checkpoint: %s", s)
	}
	old, nu := "GPU-11111111-2222-3333-4444-555555555555", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
	if err := os.WriteFile(filepath.Join(ck, "fail"), []byte("restore "+pid+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r, code := call("--map", old+"="+nu, "restore", pid); code != 1 || r.Results[0].Code != 999 {
		t.Errorf("injected restore failure: exit %d %+v", code, r)
	}
	os.Remove(filepath.Join(ck, "fail"))
	if _, code := call("--map", old+"="+nu, "restore", pid); code != 0 {
		t.Fatal("restore failed")
	}
	if _, code := call("unlock", pid); code != 0 {
		t.Fatal("unlock failed")
	}
	if s := state(); s != Running {
		t.Errorf("state after: %s", s)
	}
	calls, err := os.ReadFile(filepath.Join(ck, "calls"))
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"checkpoint " + pid + " fail illegal-state",
		"lock " + pid + " ok timeout=5000",
		"checkpoint " + pid + " ok",
		"restore " + pid + " fail injected",
		"restore " + pid + " ok pairs=11111111222233334444555555555555>aaaaaaaabbbbccccddddeeeeeeeeeeee",
		"unlock " + pid + " ok",
	}, "\n") + "\n"
	if string(calls) != want {
		t.Errorf("calls recorded:\n%s\nwant:\n%s", calls, want)
	}
	// A process without libcuda has no CUDA state.
	if r, code := call("state", strconv.Itoa(os.Getppid())); code != 1 || r.Results[0].Code != 3 {
		t.Errorf("state of a process without libcuda: exit %d %+v, want CUresult 3", code, r)
	}
	if _, code := call("lock", "x"); code != 2 {
		t.Errorf("bad PID: exit %d, want 2", code)
	}
	if _, code := call("--map", old+"="+nu, "lock", pid); code != 2 {
		t.Errorf("--map with lock: exit %d, want 2", code)
	}
}

// startHolder starts a process that maps lib (its CUDA state lives there)
// and waits; it is killed when the test ends.
func startHolder(t *testing.T, dir, lib string) int {
	t.Helper()
	src := filepath.Join(dir, "holder.c")
	os.WriteFile(src, []byte(`#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
	if (argc < 2 || !dlopen(argv[1], RTLD_NOW)) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
	puts("ready");
	fflush(stdout);
	pause();
	return 0;
}
`), 0o644)
	bin := filepath.Join(dir, "holder")
	if out, err := exec.Command("gcc", "-o", bin, src, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, lib)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	buf := make([]byte, 6)
	if _, err := io.ReadFull(out, buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("holder did not start: %q %v", buf, err)
	}
	return cmd.Process.Pid
}

// A driver before r580 cannot remap GPUs: a restore with pairs is refused
// before any call, as the API's absence.
func TestPairsNeedR580(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: the fake libcuda is built with it")
	}
	dir := t.TempDir()
	res, err := fakedriver.Build(filepath.Join(dir, "driver"), fakedriver.Options{Version: "570.172.08", CheckpointDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := HelperMain([]string{"--lib", filepath.Join(res.Root, res.LibDir, "libcuda.so.1"), "--map",
		"GPU-11111111-2222-3333-4444-555555555555=GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", "restore", "1"}, &out, &errOut)
	var r Reply
	json.Unmarshal(out.Bytes(), &r)
	if code != 1 || !r.NoAPI || !strings.Contains(r.Error, "r580") {
		t.Errorf("restore with pairs on 570: exit %d %+v", code, r)
	}
	if _, err := os.Stat(filepath.Join(dir, "calls")); err == nil {
		t.Error("a call was made")
	}
}

func TestUUIDBytes(t *testing.T) {
	b, err := UUIDBytes("GPU-00112233-4455-6677-8899-aabbccddeeff")
	if err != nil || b[0] != 0 || b[15] != 0xff || b[4] != 0x44 {
		t.Errorf("UUIDBytes = %x, %v", b, err)
	}
	for _, bad := range []string{"00112233-4455-6677-8899-aabbccddeeff", "GPU-0011", "GPU-zz112233-4455-6677-8899-aabbccddeeff"} {
		if _, err := UUIDBytes(bad); err == nil {
			t.Errorf("UUIDBytes(%q) accepted", bad)
		}
	}
}
