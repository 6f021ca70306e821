package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func goTool(t *testing.T) string {
	t.Helper()
	g := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(g); err == nil {
		return g
	}
	g, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool")
	}
	return g
}

// The hook binary's dependency graph holds no configuration, no NVML and
// no cgo, even with cgo enabled: it stays static however it is built, and
// nothing it links can read a configuration file named by the image.
func TestDependencies(t *testing.T) {
	cmd := exec.Command(goTool(t), "list", "-deps", "-f", "{{.ImportPath}} {{len .CgoFiles}}", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 20 || !strings.Contains(string(out), "internal/containerhook 0") {
		t.Fatalf("go list -deps gave %d lines without containerhook: the check proves nothing\n%s", len(lines), out)
	}
	for _, l := range lines {
		pkg, cgo, _ := strings.Cut(l, " ")
		switch {
		case pkg == "github.com/gantry-gpu/gantry/internal/config",
			strings.HasPrefix(pkg, "github.com/NVIDIA/go-nvml"),
			strings.HasPrefix(pkg, "github.com/gantry-gpu/gantry/internal/gpu/nvml"),
			strings.HasPrefix(pkg, "github.com/pelletier/go-toml"):
			t.Errorf("gantry-cdi-hook links %s", pkg)
		case pkg == "runtime/cgo", cgo != "0":
			t.Errorf("gantry-cdi-hook links cgo: %s (%s cgo files)", pkg, cgo)
		}
	}
}

// Built as make build builds it, the binary has no program interpreter and
// needs no shared library: no dynamic loader ever runs for it, so an
// image's LD_PRELOAD or LD_LIBRARY_PATH has nothing to act on.
func TestStaticBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "gantry-cdi-hook")
	cmd := exec.Command(goTool(t), "build", "-trimpath", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("gantry-cdi-hook has a %v program header: it is dynamically linked", p.Type)
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("gantry-cdi-hook needs shared libraries %v (%v)", libs, err)
	}
	// And it runs: --help answers on stdout whatever name it has.
	for _, name := range []string{"gantry-cdi-hook", "nvidia-cdi-hook"} {
		out, err := (&exec.Cmd{Path: bin, Args: []string{name, "--help"}}).Output()
		if err != nil || !strings.Contains(string(out), "create-symlinks") || !strings.Contains(string(out), "update-ldcache") {
			t.Errorf("%s --help: %v\n%s", name, err, out)
		}
	}
}
