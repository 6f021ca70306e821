package ctrckpt

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/cudackpt"
)

func TestSpecGPUs(t *testing.T) {
	for _, tc := range []struct {
		spec   string
		gpu    bool
		minors []int
	}{
		{`{}`, false, nil},
		{`{"annotations":{"io.github.gantry-gpu.injected":"none"}}`, true, nil},
		{`{"linux":{"devices":[{"path":"/dev/nvidiactl","minor":255},{"path":"/dev/nvidia3","minor":3},{"path":"/dev/nvidia1","minor":1},{"path":"/dev/fuse","minor":229}]}}`, true, []int{1, 3}},
		// a node whose name and minor disagree names no GPU
		{`{"linux":{"devices":[{"path":"/dev/nvidia2","minor":7}]}}`, true, nil},
	} {
		gpu, minors, err := SpecGPUs([]byte(tc.spec))
		if err != nil || gpu != tc.gpu || !reflect.DeepEqual(minors, tc.minors) {
			t.Errorf("SpecGPUs(%s) = %v %v %v, want %v %v", tc.spec, gpu, minors, err, tc.gpu, tc.minors)
		}
	}
	if _, _, err := SpecGPUs([]byte(`[`)); err == nil {
		t.Error("a broken config.json accepted")
	}
}

func TestPairs(t *testing.T) {
	h := func(m int, uuid string) GPU { return GPU{Minor: m, UUID: uuid, Name: "NVIDIA H100"} }
	a, b, c := h(0, "GPU-a"), h(1, "GPU-b"), h(2, "GPU-c")
	if p, err := Pairs([]GPU{a, b}, []GPU{a, b}); err != nil || p != nil {
		t.Errorf("same GPUs: %v %v, want no pairs", p, err)
	}
	if p, err := Pairs([]GPU{a, b}, []GPU{c, b}); err != nil || !reflect.DeepEqual(p, []cudackpt.Pair{{Old: "GPU-a", New: "GPU-c"}, {Old: "GPU-b", New: "GPU-b"}}) {
		t.Errorf("other GPU: %v %v", p, err)
	}
	if _, err := Pairs([]GPU{a}, []GPU{b, c}); err == nil || !strings.Contains(err.Error(), "names 2") {
		t.Errorf("more GPUs than the checkpoint's: %v", err)
	}
	if _, err := Pairs([]GPU{a}, nil); err == nil {
		t.Error("a restore without GPUs accepted for a checkpoint that had one")
	}
	other := GPU{Minor: 1, UUID: "GPU-x", Name: "NVIDIA A100"}
	if _, err := Pairs([]GPU{a}, []GPU{other}); err == nil || !strings.Contains(err.Error(), "same model") {
		t.Errorf("another model: %v", err)
	}
}

// seal leaves the image root's alone and the record readable back.
func TestSeal(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "pages-1.img"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, "sub", "f"), []byte("x"), 0o666)
	rec := Record{GPUs: []GPU{{Minor: 1, UUID: "GPU-b", Name: "n"}}, CUDAProcesses: 2}
	if err := seal(dir, rec); err != nil {
		t.Fatal(err)
	}
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if want := os.FileMode(0o600); fi.IsDir() {
			want = 0o700
			if fi.Mode().Perm() != want {
				t.Errorf("%s: %v", p, fi.Mode().Perm())
			}
		} else if fi.Mode().Perm() != want {
			t.Errorf("%s: %v", p, fi.Mode().Perm())
		}
		return nil
	})
	got, found, err := ReadRecord(dir)
	if err != nil || !found || !reflect.DeepEqual(got, rec) {
		t.Errorf("ReadRecord = %+v %v %v", got, found, err)
	}
	if _, found, err := ReadRecord(t.TempDir()); found || err != nil {
		t.Errorf("no record: %v %v", found, err)
	}
}

// Processes refuses to list a process that shares this program's mount
// namespace: the host's processes are never a container's.
func TestProcessesRefusesTheHost(t *testing.T) {
	if _, err := Processes(os.Getpid()); err == nil || !strings.Contains(err.Error(), "mount namespace") {
		t.Errorf("Processes(self) = %v, want a refusal", err)
	}
}
