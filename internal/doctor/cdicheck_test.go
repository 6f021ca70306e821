package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runFix carries out the rm commands of a printed fix, as an admin
// pasting them would.
func runFix(t *testing.T, fix string) {
	t.Helper()
	ran := 0
	for _, part := range strings.Split(fix, "; ") {
		i := strings.Index(part, "rm ")
		if i < 0 {
			continue
		}
		cmd := strings.Fields(part[i:])
		// the command ends at the first word that is not a path or rm
		end := 1
		for end < len(cmd) && strings.HasPrefix(cmd[end], "/") {
			end++
		}
		// PATH is the test's own: rm done here, as rm does it
		for _, p := range cmd[1:end] {
			if err := os.Remove(p); err != nil {
				t.Fatalf("the fix %q: %v", strings.Join(cmd[:end], " "), err)
			}
		}
		ran++
	}
	if ran == 0 {
		t.Fatalf("no command to run in the fix %q", fix)
	}
}

// A file the spec mounts is deleted after the spec was generated: an ICD
// file, a library, the persistenced socket. Doctor names the spec, who
// uses the path and the path, and the regenerate command; regenerating
// from the driver as it now is clears it.
func TestCDISpecHostPathDeleted(t *testing.T) {
	for _, rel := range []string{"etc/OpenCL/vendors/nvidia.icd", "run/nvidia-persistenced/socket", "LIB/libnvidia-opencl.so.VERSION", "dev/nvidia3"} {
		t.Run(filepath.Base(rel), func(t *testing.T) {
			h := newHost(t)
			spec := filepath.Join(h.opts.Config.CDI.SpecDirs[0], "nvidia.yaml")
			expect(t, Run(h.opts), CheckCDISpecs, Pass, []string{spec, "every path they name exists"}, "")
			matches, _ := filepath.Glob(filepath.Join(h.res.Root, strings.NewReplacer("LIB", h.res.LibDir, "VERSION", h.res.Version).Replace(rel)))
			if len(matches) != 1 {
				t.Fatalf("%s in the fake driver: %v", rel, matches)
			}
			gone := matches[0]
			if b, err := os.ReadFile(spec); err != nil || !strings.Contains(string(b), gone) {
				t.Fatalf("the spec does not mount %s (%v)", gone, err)
			}
			if err := os.Remove(gone); err != nil {
				t.Fatal(err)
			}
			want := []string{spec, gone, "does not exist"}
			if rel == "dev/nvidia3" {
				want = append(want, "device node", "device nvidia.com/gpu=3")
			} else {
				want = append(want, "mount hostPath", "spec-wide, for every device")
			}
			c := expect(t, Run(h.opts), CheckCDISpecs, Fail, want, "cdi generate --output "+spec)
			t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
			if rel == "dev/nvidia3" {
				return // the driver's own node: the device nodes check says how to make it
			}
			// The fix: the spec generated again from the driver as it is.
			h.writeSpec(t)
			expect(t, Run(h.opts), CheckCDISpecs, Pass, []string{spec}, "")
		})
	}
}

// A hook program the spec runs is gone.
func TestCDISpecHookProgramGone(t *testing.T) {
	h := newHost(t)
	hook := filepath.Join(h.dir, "hookbin", "gantry-cdi-hook")
	h.write(t, hook, "#!/bin/sh\n")
	h.writeSpecWith(t, hook)
	spec := filepath.Join(h.opts.Config.CDI.SpecDirs[0], "nvidia.yaml")
	expect(t, Run(h.opts), CheckCDISpecs, Pass, []string{spec}, "")
	if err := os.Remove(hook); err != nil {
		t.Fatal(err)
	}
	expect(t, Run(h.opts), CheckCDISpecs, Fail, []string{spec, "hook createContainer program " + hook + " does not exist"}, "cdi generate --output "+spec)
}

// Two spec files in one directory that both define nvidia.com/gpu
// devices: the CDI library drops those devices from both. Doctor names
// both files and the devices, and says which to remove; after that the
// devices resolve again.
func TestCDISpecConflict(t *testing.T) {
	h := newHost(t)
	dir := h.opts.Config.CDI.SpecDirs[0]
	good := filepath.Join(dir, "nvidia.yaml")
	old := filepath.Join(dir, "nvidia-old.yaml")
	b, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	h.write(t, old, string(b))
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	c := expect(t, Run(h.opts), CheckCDISpecs, Fail,
		[]string{old, good, "both define", "nvidia.com/gpu=0", "conflicting device", "unresolvable CDI devices"}, "rm "+old)
	t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
	if strings.Contains(c.Fix, "rm "+good) {
		t.Errorf("the fix removes the newer spec too: %s", c.Fix)
	}
	runFix(t, c.Fix)
	expect(t, Run(h.opts), CheckCDISpecs, Pass, []string{good}, "")
}

// A stale spec in the later directory (/var/run/cdi) shadows the good one
// in the earlier (/etc/cdi): engines use the stale one. Doctor resolves
// the priority as the library does, names the stale file, and says to
// remove it; the same stale spec in the earlier directory, shadowed by a
// good one, is only noted.
func TestCDISpecShadowed(t *testing.T) {
	h := newHost(t)
	etc := h.opts.Config.CDI.SpecDirs[0]
	run := filepath.Join(h.dir, "run-cdi")
	h.opts.Config.CDI.SpecDirs = []string{etc, run}
	good := filepath.Join(etc, "nvidia.yaml")
	b, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	// The spec of a driver whose libraries are gone: the same devices,
	// libcuda of an older version.
	lib := filepath.Join(h.res.Root, h.res.LibDir, "libcuda.so.")
	staleText := strings.ReplaceAll(string(b), lib+h.res.Version, lib+"535.104.05")
	if staleText == string(b) {
		t.Fatalf("the spec does not mount %s", lib+h.res.Version)
	}
	stale := filepath.Join(run, "nvidia.yaml")
	h.write(t, stale, staleText)
	c := expect(t, Run(h.opts), CheckCDISpecs, Fail,
		[]string{stale, lib + "535.104.05", "does not exist", "it shadows " + good + ", which is intact"}, "rm "+stale)
	if strings.Contains(c.Evidence, good+" (") || strings.Contains(c.Fix, "rm "+good) {
		t.Errorf("the good spec is blamed: %+v", c)
	}
	t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
	runFix(t, c.Fix)
	expect(t, Run(h.opts), CheckCDISpecs, Pass, []string{good}, "")

	// The other way round: the stale spec shadowed, not used.
	h.write(t, stale, string(b))
	h.write(t, good, staleText)
	expect(t, Run(h.opts), CheckCDISpecs, Pass, []string{stale, good + " is shadowed by " + stale + " and not used (it is broken"}, "")
}

// No spec at all: a SKIP, unless Podman is in use (on PATH, or with
// containers), whose only GPU path is CDI.
func TestCDIPodmanWithoutSpec(t *testing.T) {
	h := newHost(t)
	dir := h.opts.Config.CDI.SpecDirs[0]
	if err := os.Remove(filepath.Join(dir, "nvidia.yaml")); err != nil {
		t.Fatal(err)
	}
	expect(t, Run(h.opts), CheckCDISpecs, Skip, []string{"no nvidia.com/gpu CDI spec"}, "")
	out := filepath.Join(dir, "nvidia.yaml")
	h.write(t, filepath.Join(h.opts.PodmanStorage, "overlay-containers/containers.json"), `[{"id":"0123"}]`)
	expect(t, Run(h.opts), CheckCDISpecs, Fail, []string{"1 Podman containers in " + h.opts.PodmanStorage, "unresolvable CDI devices"}, "cdi generate --output "+out)
	os.RemoveAll(h.opts.PodmanStorage)
	h.write(t, filepath.Join(h.bin, "podman"), "#!/bin/sh\n")
	c := expect(t, Run(h.opts), CheckCDISpecs, Fail, []string{"podman is on PATH: " + filepath.Join(h.bin, "podman")},
		"gantry --gpus sim:h100x8 --driver-root "+h.res.Root+" cdi generate --output "+out)
	t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
	h.writeSpec(t)
	expect(t, Run(h.opts), CheckCDISpecs, Pass, []string{out}, "")
}
