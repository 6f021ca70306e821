//go:build linux

package engines

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

// gpuScript is what every test container runs (busybox sh): the device
// nodes it sees, the numbers of the two it should get, the probe's dlopen of
// libcuda.so.1 and libnvidia-ml.so.1, the injected nvidia-smi's GPU list and
// the NVIDIA_ env. Each part has a "== name" header so that checks can tell
// them apart; "== end" shows the script ran to its end. It has no "$", which
// Compose would interpolate.
const gpuScript = `exec 2>&1
echo '== dev'; ls -1 /dev
echo '== nodes'; stat -c '%n %F %t:%T' /dev/nvidia1 /dev/nvidiactl
echo '== probe'; probe
echo '== smi'; nvidia-smi -L
echo '== env'; env | grep '^NVIDIA_' | sort
echo '== end'`

// sections splits gpuScript's output by its headers. Lines before the
// first header (an engine's own messages) go under "".
func sections(out string) map[string][]string {
	sec := map[string][]string{}
	name := ""
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimRight(line, "\r")
		if h, ok := strings.CutPrefix(line, "== "); ok {
			name = h
			sec[name] = sec[name][:0:0]
			continue
		}
		if line != "" {
			sec[name] = append(sec[name], line)
		}
	}
	return sec
}

var gpuNode = regexp.MustCompile(`^nvidia[0-9]+$`)

// nvidiaNodes lists the nvidia* names under the container's /dev.
func nvidiaNodes(dev []string) (gpus, all []string) {
	for _, n := range dev {
		if strings.HasPrefix(n, "nvidia") {
			all = append(all, n)
			if gpuNode.MatchString(n) {
				gpus = append(gpus, n)
			}
		}
	}
	sort.Strings(gpus)
	sort.Strings(all)
	return gpus, all
}

// checkOnlyGPU1 checks gpuScript's output from a container that asked for
// GPU 1 with the default driver capabilities (utility, compute): exactly
// that GPU's node and the control node with the fake driver's numbers, the
// driver libraries found by SONAME and answering, and nvidia-smi listing
// GPU 1 alone. It returns the problems found; none means all held.
func checkOnlyGPU1(f *fixture, out string) []string {
	sec := sections(out)
	var bad []string
	if _, ok := sec["end"]; !ok {
		bad = append(bad, "the container script did not run to its end")
	}
	gpus, all := nvidiaNodes(sec["dev"])
	if strings.Join(gpus, ",") != "nvidia1" {
		bad = append(bad, fmt.Sprintf("GPU device nodes in /dev: %v, want exactly [nvidia1]", gpus))
	}
	if !contains(all, "nvidiactl") {
		bad = append(bad, fmt.Sprintf("no /dev/nvidiactl (nvidia nodes: %v)", all))
	}
	// Fake driver nodes are major 195 (0xc3); nvidiactl is minor 255.
	for _, want := range []string{
		fmt.Sprintf("/dev/nvidia1 character special file %x:1", 195),
		fmt.Sprintf("/dev/nvidiactl character special file %x:ff", 195),
	} {
		if !contains(sec["nodes"], want) {
			bad = append(bad, fmt.Sprintf("stat: want %q, got %q", want, sec["nodes"]))
		}
	}
	cuda, nvml := false, false
	for _, line := range sec["probe"] {
		fields := strings.Fields(line)
		if len(fields) >= 3 && fields[0] == "cuda" && fields[1] == strconv.Itoa(f.driver.CUDAVersion) {
			cuda = true
		}
		if len(fields) >= 3 && fields[0] == "nvml" && fields[1] == f.driver.Version {
			nvml = true
		}
	}
	if !cuda || !nvml {
		bad = append(bad, fmt.Sprintf("probe: want cuda %d and nvml %s, got %q", f.driver.CUDAVersion, f.driver.Version, sec["probe"]))
	}
	var listed []string
	for _, line := range sec["smi"] {
		if strings.HasPrefix(line, "GPU ") {
			listed = append(listed, line)
		}
	}
	if len(listed) != 1 || !strings.HasPrefix(listed[0], "GPU 1:") {
		bad = append(bad, fmt.Sprintf("nvidia-smi -L: want GPU 1 alone, got %q", sec["smi"]))
	}
	return bad
}

// checkNoGPU checks gpuScript's output from a container that asked for no
// GPU: no NVIDIA node, and nothing for the probe to load (the image has no
// driver library of its own).
func checkNoGPU(out string) []string {
	sec := sections(out)
	var bad []string
	if _, ok := sec["end"]; !ok {
		bad = append(bad, "the container script did not run to its end")
	}
	if _, all := nvidiaNodes(sec["dev"]); len(all) > 0 {
		bad = append(bad, fmt.Sprintf("NVIDIA device nodes in a container that asked for none: %v", all))
	}
	if len(sec["probe"]) == 0 || !strings.HasPrefix(sec["probe"][0], "probe: libcuda.so.1") {
		bad = append(bad, fmt.Sprintf("the probe should fail to load libcuda.so.1, got %q", sec["probe"]))
	}
	return bad
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// report fails t with the problems, the container's output and the
// runtime's log.
func report(t *testing.T, f *fixture, what string, bad []string, out string) {
	t.Helper()
	if len(bad) == 0 {
		t.Logf("%s: container output:\n%s", what, out)
		return
	}
	t.Errorf("%s:\n  %s\ncontainer output:\n%s\n%s", what, strings.Join(bad, "\n  "), out, f.runtimeLogTail())
}

// TestChecksCanFail runs the checks on outputs that must not pass, so that a
// container test passing means something.
func TestChecksCanFail(t *testing.T) {
	good := "== dev\nnvidia1\nnvidiactl\n== nodes\n/dev/nvidia1 character special file c3:1\n" +
		"/dev/nvidiactl character special file c3:ff\n== probe\ncuda 12040 /usr/lib/libcuda.so.1\n" +
		"nvml 550.54.15 /usr/lib/libnvidia-ml.so.1\n== smi\nGPU 1: Fake\n== env\n== end\n"
	withDriver := func() *fixture {
		return &fixture{driver: &fakedriver.Result{CUDAVersion: 12040, Version: "550.54.15"}}
	}
	if bad := checkOnlyGPU1(withDriver(), good); len(bad) > 0 {
		t.Fatalf("a good output fails the check: %v", bad)
	}
	for name, out := range map[string]string{
		"extra GPU":       strings.Replace(good, "nvidia1\n", "nvidia0\nnvidia1\n", 1),
		"wrong GPU":       strings.Replace(good, "nvidia1\n", "nvidia2\n", 1),
		"no ctl":          strings.Replace(good, "nvidiactl\n", "", 1),
		"wrong minor":     strings.Replace(good, "c3:1\n", "c3:0\n", 1),
		"no libcuda":      strings.Replace(good, "cuda 12040", "probe: libcuda.so.1: cannot open", 1),
		"wrong driver":    strings.Replace(good, "nvml 550.54.15", "nvml 535.1", 1),
		"smi sees two":    strings.Replace(good, "GPU 1: Fake\n", "GPU 0: Fake\nGPU 1: Fake\n", 1),
		"script cut off":  strings.Replace(good, "== end\n", "", 1),
		"empty":           "",
		"engine error":    "docker: Error response from daemon: ...\n",
		"smi wrong index": strings.Replace(good, "GPU 1:", "GPU 0:", 1),
	} {
		if bad := checkOnlyGPU1(withDriver(), out); len(bad) == 0 {
			t.Errorf("%s: checkOnlyGPU1 passed %q", name, out)
		}
	}
	none := "== dev\nnull\nzero\n== nodes\nstat: can't stat\n== probe\nprobe: libcuda.so.1: cannot open shared object file\n== smi\nsh: nvidia-smi: not found\n== env\n== end\n"
	if bad := checkNoGPU(none); len(bad) > 0 {
		t.Fatalf("a good no-GPU output fails the check: %v", bad)
	}
	for name, out := range map[string]string{
		"a node":       strings.Replace(none, "null\n", "null\nnvidiactl\n", 1),
		"probe loaded": strings.Replace(none, "probe: libcuda.so.1: cannot open shared object file", "cuda 12040 /x", 1),
		"cut off":      strings.Replace(none, "== end\n", "", 1),
	} {
		if bad := checkNoGPU(out); len(bad) == 0 {
			t.Errorf("%s: checkNoGPU passed %q", name, out)
		}
	}
}
