//go:build linux

package engines

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/doctor"
)

// generateFix is the gantry cdi generate command line of a printed fix.
var generateFix = regexp.MustCompile(`gantry [^;]*?cdi generate [^;]*?--output \S+`)

// TestDoctorPodmanCDI runs a real podman on CDI specs broken the ways
// specs break on real hosts, with gantry doctor in the same view of
// /etc/cdi and /var/run/cdi: no spec at all while Podman is in use, a file
// the spec mounts deleted after the spec was generated, and two spec
// files that define the same devices. Each time podman run --device
// fails, doctor's cdi specs check fails naming the file and the path or
// devices, and the fix it prints, run as printed, makes podman run work.
func TestDoctorPodmanCDI(t *testing.T) {
	e := startPodman(t)
	f := e.f
	const spec = "/var/run/cdi/nvidia.yaml" // as the namespace of withCDI sees it
	hostSpec := filepath.Join(e.specDir, "nvidia.yaml")
	errFile := filepath.Join(e.dir, "doctor.err")
	diagnose := func() doctor.Check {
		t.Helper()
		out, err := e.withCDI("sh", "-c", `exec "$@" 2>`+errFile, "sh", f.gantry, "doctor", "--json",
			"--kubelet-dir", filepath.Join(e.dir, "no-kubelet"), "--podman-storage", filepath.Join(e.dir, "root"))
		var checks []doctor.Check
		if jerr := json.Unmarshal([]byte(out), &checks); jerr != nil {
			t.Fatalf("gantry doctor: %v %v\n%s\n%s", err, jerr, out, tail(errFile, 4000))
		}
		return one(t, checks, doctor.CheckCDISpecs)
	}
	podmanGPU1 := func() (string, error) {
		return e.withCDI(e.runArgs(nil, []string{"--device", "nvidia.com/gpu=1"})...)
	}
	works := func(after string) {
		t.Helper()
		out, err := podmanGPU1()
		if err != nil {
			t.Fatalf("podman run --device nvidia.com/gpu=1 after %s: %v\n%s", after, err, out)
		}
		report(t, f, "podman run --device nvidia.com/gpu=1 after "+after, checkOnlyGPU1(f, out), out)
		if c := diagnose(); c.Status != doctor.Pass {
			t.Fatalf("cdi specs after %s: %+v", after, c)
		}
	}
	fails := func(what string) {
		t.Helper()
		if out, err := podmanGPU1(); err == nil {
			t.Fatalf("podman run --device nvidia.com/gpu=1 with %s succeeded:\n%s", what, out)
		} else {
			t.Logf("podman with %s: %v (%s)", what, err, lastLine(out))
		}
	}
	runGenerate := func(c doctor.Check) {
		t.Helper()
		cmd := generateFix.FindString(c.Fix)
		if cmd == "" || !strings.HasSuffix(cmd, "--output "+spec) {
			t.Fatalf("the fix has no gantry cdi generate --output %s: %q", spec, c.Fix)
		}
		// As printed, with gantry found on PATH as an admin's shell would.
		if out, err := e.withCDI("sh", "-c", cmd); err != nil {
			t.Fatalf("the fix %q: %v\n%s", cmd, err, out)
		}
	}

	// fresh leaves the good spec alone in the spec directory, so that each
	// case stands on its own.
	fresh := func() {
		t.Helper()
		entries, _ := os.ReadDir(e.specDir)
		for _, d := range entries {
			if err := os.Remove(filepath.Join(e.specDir, d.Name())); err != nil {
				t.Fatal(err)
			}
		}
		if out, err := e.withCDI(f.gantry, "cdi", "generate", "--output", spec); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}

	t.Run("NoSpec", func(t *testing.T) {
		fails("no CDI spec")
		c := diagnose()
		if c.Status != doctor.Fail || !strings.Contains(c.Evidence, "Podman is in use here (podman is on PATH") ||
			!strings.Contains(c.Evidence, "unresolvable CDI devices") {
			t.Fatalf("no spec, podman installed: %+v", c)
		}
		t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
		runGenerate(c)
		works("the generate command doctor printed")
	})

	t.Run("HostPathDeleted", func(t *testing.T) {
		fresh()
		// An ICD file the spec mounts, removed after generation (a driver
		// package's file list changed; a cleanup).
		icd := filepath.Join(e.dir, "vendor-icd", "nvidia_icd.json")
		if err := os.MkdirAll(filepath.Dir(icd), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(icd, []byte(`{"file_format_version":"1.0.0"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(hostSpec)
		if err != nil {
			t.Fatal(err)
		}
		var s cdispecs.Spec
		if err := yaml.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		s.ContainerEdits.Mounts = append(s.ContainerEdits.Mounts, &cdispecs.Mount{
			HostPath: icd, ContainerPath: "/etc/vulkan/icd.d/nvidia_icd.json", Options: []string{"ro", "nosuid", "nodev", "bind"}})
		if b, err = yaml.Marshal(&s); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(hostSpec, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if c := diagnose(); c.Status != doctor.Pass {
			t.Fatalf("the spec with its ICD file there: %+v", c)
		}
		if err := os.Remove(icd); err != nil {
			t.Fatal(err)
		}
		fails("a mounted file deleted")
		c := diagnose()
		if c.Status != doctor.Fail || !strings.Contains(c.Evidence, spec) || !strings.Contains(c.Evidence, "mount hostPath "+icd+" does not exist") {
			t.Fatalf("hostPath deleted: %+v", c)
		}
		t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
		runGenerate(c)
		works("regenerating the spec")
	})

	t.Run("TwoSpecsSameDevices", func(t *testing.T) {
		fresh()
		other := filepath.Join(e.specDir, "nvidia-old.yaml")
		b, err := os.ReadFile(hostSpec)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(other, b, 0o644); err != nil {
			t.Fatal(err)
		}
		past := time.Now().Add(-time.Hour)
		if err := os.Chtimes(other, past, past); err != nil {
			t.Fatal(err)
		}
		fails("two specs defining the same devices")
		c := diagnose()
		if c.Status != doctor.Fail || !strings.Contains(c.Evidence, "both define") || !strings.Contains(c.Evidence, "nvidia.com/gpu=1") ||
			!strings.Contains(c.Fix, "rm /var/run/cdi/nvidia-old.yaml") {
			t.Fatalf("two specs: %+v", c)
		}
		t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
		if out, err := e.withCDI("rm", "/var/run/cdi/nvidia-old.yaml"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		works("removing the older spec")
	})

	t.Run("StaleShadowsGood", func(t *testing.T) {
		fresh()
		if !f.overlay {
			t.Skip("overlayfs does not work here: /etc/cdi cannot be made in a private view of /etc")
		}
		// The good spec in /etc/cdi; in /var/run/cdi, which CDI ranks
		// higher, the spec of a driver whose libcuda is gone.
		etcDir := filepath.Join(e.dir, "etc-cdi")
		if err := os.MkdirAll(etcDir, 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(hostSpec)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(etcDir, "nvidia.yaml"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		lib := filepath.Join(f.driver.Root, f.driver.LibDir, "libcuda.so.")
		stale := strings.ReplaceAll(string(b), lib+f.driver.Version, lib+"535.104.05")
		if stale == string(b) {
			t.Fatalf("the spec does not mount %s", lib+f.driver.Version)
		}
		if err := os.WriteFile(hostSpec, []byte(stale), 0o644); err != nil {
			t.Fatal(err)
		}
		e.etcSpecDir = etcDir
		defer func() { e.etcSpecDir = "" }()
		fails("a stale spec in /var/run/cdi")
		c := diagnose()
		if c.Status != doctor.Fail || !strings.Contains(c.Evidence, spec) || !strings.Contains(c.Evidence, lib+"535.104.05 does not exist") ||
			!strings.Contains(c.Evidence, "it shadows /etc/cdi/nvidia.yaml, which is intact") || c.Fix == "" || !strings.Contains(c.Fix, "rm "+spec) {
			t.Fatalf("stale spec shadowing a good one: %+v", c)
		}
		t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
		if out, err := e.withCDI("rm", spec); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		works("removing the stale spec")
	})
}
