package cudackpt

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

// TestMain lets the test binary be the probe's CUDA process, as the gantry
// binary is (the probe runs /proc/self/exe cuda-checkpoint probe-child).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == HelperCommand {
		os.Exit(HelperMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

var probeIDs = []fakedriver.Identity{
	{Minor: 0, UUID: "GPU-aaaaaaaa-0000-4000-8000-000000000000", Name: "NVIDIA H200"},
	{Minor: 1, UUID: "GPU-bbbbbbbb-0000-4000-8000-000000000001", Name: "NVIDIA L4"},
	{Minor: 2, UUID: "GPU-cccccccc-0000-4000-8000-000000000002", Name: "NVIDIA H200"},
}

func hexOf(uuid string) string {
	return strings.ReplaceAll(strings.TrimPrefix(uuid, "GPU-"), "-", "")
}

// probeDriver builds a fake driver whose libcuda knows ids as its GPUs.
func probeDriver(t *testing.T, ids []fakedriver.Identity) (lib, ck string) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: the fake libcuda is built with it")
	}
	dir := t.TempDir()
	ck = filepath.Join(dir, "ckpt")
	if err := os.Mkdir(ck, 0o755); err != nil {
		t.Fatal(err)
	}
	res, err := fakedriver.Build(filepath.Join(dir, "driver"), fakedriver.Options{Version: "580.159.04", GPUs: len(ids), CheckpointDir: ck, Identities: ids})
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(res.Root, res.LibDir, "libcuda.so.1"), ck
}

func readCalls(t *testing.T, ck string) string {
	b, _ := os.ReadFile(filepath.Join(ck, "calls"))
	os.Remove(filepath.Join(ck, "calls"))
	// The probe's process has a PID of its own: drop it.
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 {
			out = append(out, strings.Join(append([]string{f[0]}, f[2:]...), " "))
		}
	}
	return strings.Join(out, "\n")
}

// The probe against the fake driver: on a host with two H200s and an L4,
// the probe's process is checkpointed on the first H200 and restored onto
// the other with pairs naming every GPU it sees (the two swapped, the L4
// onto itself); its context is then on the second H200 with its memory
// intact: supported, kept in the cache (root's, 0644), and the next probe
// reads it without a CUDA call. A driver that cannot remap (the fake's
// switch) is unsupported, with its CUresult, and the probe's process is
// restored onto its own GPU and unlocked. A host without two GPUs of one
// model probes pairs onto the same GPU: identity-only.
func TestProbeAgainstFakeDriver(t *testing.T) {
	lib, ck := probeDriver(t, probeIDs)
	cache := t.TempDir()
	r := probeMain(lib, cache, "580.159.04", false)
	if r.Probe == nil || r.Error != "" {
		t.Fatalf("probe: %+v", r)
	}
	v := *r.Probe
	if v.Remap != RemapSupported || v.From != probeIDs[0].UUID || v.To != probeIDs[2].UUID || v.Model != "NVIDIA H200" || v.DriverVersion != "580.159.04" || v.CUDAVersion != 13000 {
		t.Errorf("verdict %+v: want supported, %s -> %s", v, probeIDs[0].UUID, probeIDs[2].UUID)
	}
	a, b, c := hexOf(probeIDs[0].UUID), hexOf(probeIDs[1].UUID), hexOf(probeIDs[2].UUID)
	want := "lock ok timeout=10000\ncheckpoint ok\nrestore ok pairs=" + a + ">" + c + "," + b + ">" + b + "," + c + ">" + a + "\nunlock ok"
	if got := readCalls(t, ck); got != want {
		t.Errorf("the probe's calls:\n%s\nwant:\n%s", got, want)
	}
	st, err := os.Stat(CacheFile(cache, "580.159.04"))
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("the kept verdict: %v %v, want mode 0644", st, err)
	}
	if r := probeMain(lib, cache, "580.159.04", false); r.Probe == nil || r.Probe.Remap != RemapSupported || r.Probe.At != v.At {
		t.Errorf("second probe: %+v, want the kept verdict", r)
	}
	if got := readCalls(t, ck); got != "" {
		t.Errorf("a kept verdict made CUDA calls:\n%s", got)
	}

	if err := os.WriteFile(filepath.Join(ck, "fail"), []byte("remap\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = probeMain(lib, cache, "580.159.04", true)
	if r.Probe == nil || r.Probe.Remap != RemapUnsupported || r.Probe.Code != 801 || !strings.Contains(r.Probe.Error, "CUDA_ERROR_NOT_SUPPORTED") {
		t.Fatalf("probe of a driver that cannot remap: %+v", r)
	}
	if !strings.Contains(r.Probe.String(), "580.159.04") || r.Probe.Allows() {
		t.Errorf("verdict %q allows %v", r.Probe.String(), r.Probe.Allows())
	}
	want = "lock ok timeout=10000\ncheckpoint ok\nrestore fail not-supported remap\nrestore ok\nunlock ok"
	if got := readCalls(t, ck); got != want {
		t.Errorf("the failed probe's calls:\n%s\nwant:\n%s", got, want)
	}
	if v, found, err := ReadCache(cache, "580.159.04"); err != nil || !found || v.Remap != RemapUnsupported {
		t.Errorf("kept after a fresh probe: %+v %v %v", v, found, err)
	}

	lib1, _ := probeDriver(t, probeIDs[:2])
	r = probeMain(lib1, "", "580.159.04", false)
	if r.Probe == nil || r.Probe.Remap != RemapIdentityOnly || r.Probe.From != r.Probe.To || !r.Probe.Allows() {
		t.Errorf("probe with no two GPUs of one model: %+v", r)
	}
}

// A kept verdict a restore trusts must be root's own regular file: a link,
// a file others may write or one of another user is refused, not followed.
func TestReadCacheRefusesHostileFiles(t *testing.T) {
	dir := t.TempDir()
	if err := WriteCache(dir, Verdict{DriverVersion: "580.1", Remap: RemapSupported}); err != nil {
		t.Fatal(err)
	}
	if v, found, err := ReadCache(dir, "580.1"); err != nil || !found || !v.Allows() {
		t.Fatalf("a good file: %+v %v %v", v, found, err)
	}
	p := CacheFile(dir, "580.1")
	other := filepath.Join(dir, "other.json")
	if err := os.Rename(p, other); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, p); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadCache(dir, "580.1"); err == nil {
		t.Error("a link was followed")
	}
	os.Remove(p)
	if err := os.Rename(other, p); err != nil {
		t.Fatal(err)
	}
	os.Chmod(p, 0o666)
	if _, _, err := ReadCache(dir, "580.1"); err == nil {
		t.Error("a world-writable file was trusted")
	}
	os.Chmod(p, 0o644)
	if os.Getuid() == 0 {
		os.Chown(p, 1000, 1000)
		if _, _, err := ReadCache(dir, "580.1"); err == nil {
			t.Error("a file of another user was trusted")
		}
	}
	if _, found, err := ReadCache(dir, "999.9"); found || err != nil {
		t.Errorf("another driver's version: %v %v", found, err)
	}
}

// The fake libcuda checks a restore as the driver documents it: GPU pairs
// must name every GPU the process was checkpointed on (it sees all three
// here), each onto one of the same model; a refused restore leaves the
// process checkpointed, and a complete map of one model restores it.
func TestFakeRestoreChecksPairs(t *testing.T) {
	lib, ck := probeDriver(t, probeIDs)
	pid := strconv.Itoa(startHolder(t, t.TempDir(), lib))
	call := func(args ...string) Reply {
		t.Helper()
		var out, errOut bytes.Buffer
		HelperMain(append([]string{"--lib", lib}, args...), &out, &errOut)
		var r Reply
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("%v: %q %s", args, out.String(), errOut.String())
		}
		return r
	}
	call("lock", pid)
	call("checkpoint", pid)
	a, b, c := probeIDs[0].UUID, probeIDs[1].UUID, probeIDs[2].UUID
	for _, tc := range []struct {
		maps   []string
		code   int
		detail string
	}{
		{[]string{a + "=" + c}, 1, "pairs-miss-a-checkpointed-gpu"},
		{[]string{a + "=" + b, b + "=" + a, c + "=" + c}, 1, "other-model"},
		{[]string{a + "=" + c, c + "=" + c, b + "=" + b}, 1, "duplicate-pair"},
		{[]string{a + "=GPU-dddddddd-0000-4000-8000-000000000000", b + "=" + b, c + "=" + c}, 101, "unknown-gpu"},
	} {
		var args []string
		for _, m := range tc.maps {
			args = append(args, "--map", m)
		}
		r := call(append(args, "restore", pid)...)
		if len(r.Results) != 1 || r.Results[0].Code != tc.code {
			t.Errorf("restore %v: %+v, want CUresult %d", tc.maps, r, tc.code)
		}
		if calls := readCalls(t, ck); !strings.Contains(calls, "restore fail "+tc.detail) {
			t.Errorf("restore %v recorded %q, want %s", tc.maps, calls, tc.detail)
		}
	}
	if r := call("--map", a+"="+c, "--map", c+"="+a, "--map", b+"="+b, "restore", pid); len(r.Results) != 1 || r.Results[0].Error != "" {
		t.Errorf("a complete map of one model: %+v", r)
	}
}
