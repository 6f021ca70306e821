package config

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// want is one expected note: the kind and, for a mapped key, the Gantry key.
type want struct {
	kind NoteKind
	to   string
}

func m(to string) want { return want{Mapped, to} }

var (
	ign = want{kind: Ignored}
	uns = want{kind: Unsupported}
	unk = want{kind: Unknown}
)

// TestMigrateNVIDIAFiles migrates NVIDIA config files in the shapes the
// toolkit has written: nvidia-ctk config default of 1.14 and of 1.18 (keys
// sorted, defaults commented out), the config.toml the 1.x packages
// installed (with comments and an indented table), and a GPU-operator-like
// host that sets every key.
func TestMigrateNVIDIAFiles(t *testing.T) {
	ctkNotes := map[string]want{
		"disable-require":                                        m("runtime.disable-require"),
		"supported-driver-capabilities":                          ign,
		"nvidia-container-cli.environment":                       ign,
		"nvidia-container-cli.ldconfig":                          ign,
		"nvidia-container-cli.load-kmods":                        ign,
		"nvidia-container-runtime.log-level":                     m("log-level"),
		"nvidia-container-runtime.mode":                          ign,
		"nvidia-container-runtime.runtimes":                      m("runtime.low-level"),
		"nvidia-container-runtime.modes.cdi.annotation-prefixes": m("cdi.annotation-prefixes"),
		"nvidia-container-runtime.modes.cdi.default-kind":        m("cdi.kind"),
		"nvidia-container-runtime.modes.cdi.spec-dirs":           m("cdi.spec-dirs"),
		"nvidia-container-runtime.modes.csv.mount-spec-path":     ign,
		"nvidia-container-runtime-hook.path":                     ign,
		"nvidia-container-runtime-hook.skip-mode-detection":      ign,
		"nvidia-ctk.path":                                        ign,
	}
	ctk118 := maps(ctkNotes, map[string]want{"nvidia-container-runtime.modes.legacy.cuda-compat-mode": ign})
	defaults := func(c *Config) {
		c.LogLevel = "info" // NVIDIA's default log level, carried over
	}
	tests := []struct {
		file  string
		path  []string // executables on PATH for the runtimes lookup
		cfg   func(*Config)
		notes map[string]want
		// substrings of the reasons that must be there
		reasons map[string]string
	}{
		{
			file:  "ctk-1.14.toml",
			path:  []string{"runc"},
			cfg:   defaults,
			notes: ctkNotes,
			reasons: map[string]string{
				"nvidia-container-cli.ldconfig":     "never runs ldconfig",
				"nvidia-container-cli.load-kmods":   "never loads kernel modules",
				"nvidia-container-runtime.runtimes": "docker-runc dropped",
			},
		},
		{
			file: "ctk-1.18.toml",
			path: []string{"crun"}, // runc missing: crun is the first found
			cfg: func(c *Config) {
				defaults(c)
				c.Runtime.LowLevel = "crun"
			},
			notes:   ctk118,
			reasons: map[string]string{"nvidia-container-runtime.runtimes": "found on this host; Gantry execs one runtime, not a list: runc dropped"},
		},
		{
			file: "legacy-1x.toml",
			path: nil, // nothing found: the first candidate
			cfg: func(c *Config) {
				defaults(c)
				c.Runtime.LowLevel = "docker-runc"
			},
			notes: map[string]want{
				"disable-require":                                    m("runtime.disable-require"),
				"nvidia-container-cli.environment":                   ign,
				"nvidia-container-cli.load-kmods":                    ign,
				"nvidia-container-cli.ldconfig":                      ign,
				"nvidia-container-runtime.log-level":                 m("log-level"),
				"nvidia-container-runtime.runtimes":                  m("runtime.low-level"),
				"nvidia-container-runtime.mode":                      ign,
				"nvidia-container-runtime.modes.csv.mount-spec-path": ign,
			},
			reasons: map[string]string{"nvidia-container-runtime.runtimes": "none is found on this host"},
		},
		{
			file: "operator.toml",
			path: []string{"runc"}, // /usr/bin/crun does not exist here: runc is taken
			cfg: func(c *Config) {
				c.DriverRoot = "/run/nvidia/driver"
				c.LogLevel = "debug"
				c.Runtime.AcceptEnvUnprivileged = false
				c.Runtime.AcceptVolumeMounts = true
				c.Runtime.LogFile = "/var/log/nvidia-container-runtime.log"
				c.Runtime.LowLevel = "runc"
				c.CDI.Kind = "management.nvidia.com/gpu"
				c.CDI.SpecDirs = []string{"/var/run/cdi"}
				c.CDI.AnnotationPrefixes = []string{"cdi.k8s.io/", "nvidia.cdi.k8s.io/"}
				c.Runtime.DisableRequire = true
				c.Runtime.SwarmResource = []string{"DOCKER_RESOURCE_GPU"}
				c.Runtime.NoCgroups = true
			},
			notes: map[string]want{
				"accept-nvidia-visible-devices-as-volume-mounts":         m("runtime.accept-volume-mounts"),
				"accept-nvidia-visible-devices-envvar-when-unprivileged": m("runtime.accept-env-unprivileged"),
				"disable-require":                                        m("runtime.disable-require"),
				"supported-driver-capabilities":                          uns,
				"swarm-resource":                                         m("runtime.swarm-resource"),
				"nvidia-container-cli.debug":                             ign,
				"nvidia-container-cli.environment":                       ign,
				"nvidia-container-cli.ldcache":                           ign, // the driver root's cache, which Gantry reads
				"nvidia-container-cli.ldconfig":                          ign,
				"nvidia-container-cli.load-kmods":                        ign,
				"nvidia-container-cli.no-cgroups":                        m("runtime.no-cgroups"),
				"nvidia-container-cli.path":                              ign,
				"nvidia-container-cli.root":                              m("driver-root"),
				"nvidia-container-cli.user":                              ign,
				"nvidia-container-runtime.debug":                         m("runtime.log-file"),
				"nvidia-container-runtime.log-level":                     m("log-level"),
				"nvidia-container-runtime.mode":                          uns,
				"nvidia-container-runtime.runtimes":                      m("runtime.low-level"),
				"nvidia-container-runtime.modes.cdi.annotation-prefixes": m("cdi.annotation-prefixes"),
				"nvidia-container-runtime.modes.cdi.default-kind":        m("cdi.kind"),
				"nvidia-container-runtime.modes.cdi.spec-dirs":           m("cdi.spec-dirs"),
				"nvidia-container-runtime.modes.legacy.cuda-compat-mode": uns,
				"nvidia-container-runtime-hook.path":                     ign,
				"nvidia-container-runtime-hook.skip-mode-detection":      ign,
				"nvidia-ctk.path":                                        ign,
				"features.allow-ldconfig-from-container":                 ign,
				"features.ignore-imex-channel-requests":                  ign,
				"features.allow-cuda-compat-libs-from-container":         uns,
				"features.disable-imex-channel-creation":                 ign,
				"nvidia-container-runtimes.typo":                         unk,
			},
			reasons: map[string]string{
				"supported-driver-capabilities":     "compat32, display, graphics, ngx, video",
				"nvidia-container-cli.no-cgroups":   "rootless engines",
				"nvidia-container-cli.debug":        "taken from nvidia-container-runtime.debug",
				"nvidia-container-cli.root":         "dev-root = '/'",
				"nvidia-container-runtime.mode":     "CSV mode",
				"nvidia-container-runtime.runtimes": "/usr/bin/crun dropped", // the NVIDIA runtime itself is skipped, not listed
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			bin := t.TempDir()
			for _, name := range tt.path {
				if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			t.Setenv("PATH", bin)
			b, err := os.ReadFile(filepath.Join("testdata/nvidia", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			// Only the test's bin directory exists: an absolute candidate
			// (/usr/bin/crun) is looked for under it, not on this host.
			lookPath := func(name string) (string, error) {
				if filepath.IsAbs(name) {
					p := filepath.Join(bin, name)
					if _, err := os.Stat(p); err != nil {
						return "", err
					}
					return name, nil
				}
				return exec.LookPath(name)
			}
			mg, err := MigrateNVIDIA(b, MigrateOptions{LookPath: lookPath})
			if err != nil {
				t.Fatalf("MigrateNVIDIA: %v", err)
			}
			wantCfg := Default()
			tt.cfg(&wantCfg)
			if !reflect.DeepEqual(mg.Config, wantCfg) {
				t.Errorf("config:\n got %+v\nwant %+v", mg.Config, wantCfg)
			}
			got := map[string]want{}
			for _, n := range mg.Notes {
				if _, dup := got[n.Key]; dup {
					t.Errorf("two notes for %s", n.Key)
				}
				got[n.Key] = want{n.Kind, n.To}
				if n.Value == "" {
					t.Errorf("%s: note without the value", n.Key)
				}
				if n.Kind != Mapped && n.Reason == "" {
					t.Errorf("%s (%s): no reason given", n.Key, n.Kind)
				}
			}
			for k, w := range tt.notes {
				if g, ok := got[k]; !ok {
					t.Errorf("%s: no note (want %s %s)", k, w.kind, w.to)
				} else if g != w {
					t.Errorf("%s: %s %s, want %s %s", k, g.kind, g.to, w.kind, w.to)
				}
			}
			for k, g := range got {
				if _, ok := tt.notes[k]; !ok {
					t.Errorf("%s: unexpected note %s %s", k, g.kind, g.to)
				}
			}
			for k, sub := range tt.reasons {
				i := slices.IndexFunc(mg.Notes, func(n Note) bool { return n.Key == k })
				if i < 0 || !strings.Contains(mg.Notes[i].Reason, sub) {
					t.Errorf("%s: reason does not say %q: %+v", k, sub, mg.Notes)
				}
			}

			// The output is a Gantry config file the strict loader takes,
			// with the same values, and names every NVIDIA key.
			out, err := mg.Encode("/etc/nvidia-container-runtime/config.toml")
			if err != nil {
				t.Fatal(err)
			}
			back, err := Parse(out)
			if err != nil {
				t.Fatalf("migrated file does not load: %v\n%s", err, out)
			}
			if !sameConfig(back, mg.Config) {
				t.Errorf("loaded back:\n got %+v\nwant %+v", back, mg.Config)
			}
			if !strings.HasPrefix(string(out), header) {
				t.Errorf("output does not start like gantry config default:\n%s", out)
			}
			for k := range tt.notes {
				if !strings.Contains(string(out), "#   "+k+" = ") {
					t.Errorf("output has no comment for %s:\n%s", k, out)
				}
			}
		})
	}
}

// sameConfig compares two configurations, an empty list equal to none
// (TOML writes both as []).
func sameConfig(a, b Config) bool {
	for _, c := range []*Config{&a, &b} {
		if len(c.LibrarySearchPaths) == 0 {
			c.LibrarySearchPaths = nil
		}
		if len(c.CDI.SpecDirs) == 0 {
			c.CDI.SpecDirs = nil
		}
	}
	return reflect.DeepEqual(a, b)
}

func maps(a, b map[string]want) map[string]want {
	out := map[string]want{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

func TestMigrateNVIDIAErrors(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"not toml", "disable-require = false\n[nvidia-container-cli\nroot = \"/\"\n", "line 2"},
		{"unterminated string", "[nvidia-container-cli]\nroot = \"/run/nvidia\n", "line 2"},
		{"duplicate key", "disable-require = false\ndisable-require = true\n", "line 2"},
		{"bool as string", "disable-require = \"yes\"\n", `key disable-require = 'yes': want true or false`},
		{"list as string", "[nvidia-container-runtime]\nruntimes = \"runc\"\n", "key nvidia-container-runtime.runtimes = 'runc': want a list of strings"},
		{"list of numbers", "[nvidia-container-runtime.modes.cdi]\nspec-dirs = [1]\n", "want a list of strings"},
		{"relative root", "[nvidia-container-cli]\nroot = \"run/nvidia/driver\"\n", "nvidia-container-cli.root"},
		{"bad level", "[nvidia-container-runtime]\nlog-level = \"loud\"\n", `log-level = "loud": not a log level`},
		{"bad kind", "[nvidia-container-runtime.modes.cdi]\ndefault-kind = \"gpu\"\n", "not a CDI kind"},
		{"relative log", "[nvidia-container-runtime]\ndebug = \"runtime.log\"\n", "not an absolute path"},
		{"feature not bool", "[features]\nallow-ldconfig-from-container = \"on\"\n", "want true or false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := MigrateNVIDIA([]byte(tt.in), MigrateOptions{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}

func TestMigrateNVIDIAEdgeCases(t *testing.T) {
	// An empty file (every line commented out) migrates to the defaults.
	mg, err := MigrateNVIDIA([]byte("#disable-require = false\n\n"), MigrateOptions{})
	if err != nil || !reflect.DeepEqual(mg.Config, Default()) || len(mg.Notes) != 0 {
		t.Fatalf("empty file: %+v %v", mg, err)
	}
	// Runtimes naming only GPU runtimes keep runc; without a lookup the first
	// candidate is taken.
	mg, err = MigrateNVIDIA([]byte("[nvidia-container-runtime]\nruntimes = [\"nvidia-container-runtime\", \"/usr/bin/gantry-runtime\"]\n"), MigrateOptions{})
	if err != nil || mg.Config.Runtime.LowLevel != "runc" || mg.Notes[0].Kind != Ignored {
		t.Fatalf("GPU runtimes only: %+v %v", mg, err)
	}
	mg, err = MigrateNVIDIA([]byte("[nvidia-container-runtime]\nruntimes = [\"crun\", \"runc\"]\n"), MigrateOptions{})
	if err != nil || mg.Config.Runtime.LowLevel != "crun" {
		t.Fatalf("no lookup: %+v %v", mg, err)
	}
	// "all" covers every capability; a missing one is named.
	for in, kind := range map[string]NoteKind{"all": Ignored, "compute,utility,graphics,video,display,compat32,ngx": Ignored, "compute,utility,video": Unsupported} {
		mg, err := MigrateNVIDIA([]byte("supported-driver-capabilities = \""+in+"\"\n"), MigrateOptions{})
		if err != nil || mg.Notes[0].Kind != kind {
			t.Errorf("supported-driver-capabilities %q: %+v %v, want %s", in, mg, err, kind)
		}
	}
	// The CLI's debug file is the log file when the runtime's is /dev/null.
	mg, err = MigrateNVIDIA([]byte("[nvidia-container-cli]\ndebug = \"/var/log/cli.log\"\n[nvidia-container-runtime]\ndebug = \"/dev/null\"\n"), MigrateOptions{})
	if err != nil || mg.Config.Runtime.LogFile != "/var/log/cli.log" {
		t.Fatalf("cli debug: %+v %v", mg, err)
	}
	// An ld.so.cache other than the driver root's is one Gantry does not read.
	for in, kind := range map[string]NoteKind{"/run/nvidia/driver/etc/ld.so.cache": Ignored, "/etc/ld.so.cache": Unsupported, "": Ignored} {
		mg, err := MigrateNVIDIA([]byte("[nvidia-container-cli]\nroot = \"/run/nvidia/driver\"\nldcache = \""+in+"\"\n"), MigrateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(mg.Notes, func(n Note) bool { return n.Key == "nvidia-container-cli.ldcache" })
		if i < 0 || mg.Notes[i].Kind != kind {
			t.Errorf("ldcache %q under root /run/nvidia/driver: %+v, want %s", in, mg.Notes, kind)
		}
	}
	// Every log level NVIDIA's logger knows.
	for in, out := range map[string]string{"trace": "debug", "debug": "debug", "info": "info", "warning": "warn", "warn": "warn", "error": "error", "fatal": "error", "panic": "error"} {
		mg, err := MigrateNVIDIA([]byte("[nvidia-container-runtime]\nlog-level = \""+in+"\"\n"), MigrateOptions{})
		if err != nil || mg.Config.LogLevel != out {
			t.Errorf("log-level %q: %v %v, want %s", in, mg.Config.LogLevel, err, out)
		}
	}
	// Values that would break the TOML comments stay on one line.
	mg, err = MigrateNVIDIA([]byte("odd = \"a\\nb\"\n"), MigrateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := mg.Encode("x")
	if err != nil || !strings.Contains(string(out), `#   odd = 'a\nb'`) && !strings.Contains(string(out), `#   odd = "a\nb"`) {
		t.Fatalf("odd value:\n%s\n%v", out, err)
	}
}

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "etc", "gantry", "config.toml") // directories are made
	if err := WriteFile(p, []byte("a = 1\n"), false); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(p, []byte("b = 2\n"), false); !errors.Is(err, ErrExists) {
		t.Fatalf("second write without overwrite: %v, want ErrExists", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "a = 1\n" {
		t.Fatalf("refused write changed the file: %q", b)
	}
	if err := WriteFile(p, []byte("b = 2\n"), true); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "b = 2\n" {
		t.Fatalf("overwrite: %q", b)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v %v, want 0644", st.Mode(), err)
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
}

// FuzzMigrateNVIDIA: any input either fails with a one-line error or gives
// a configuration that the strict loader takes back unchanged.
func FuzzMigrateNVIDIA(f *testing.F) {
	files, _ := filepath.Glob("testdata/nvidia/*.toml")
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("[features]\nx = true\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		mg, err := MigrateNVIDIA(b, MigrateOptions{})
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error is not one line: %q", err)
			}
			return
		}
		out, err := mg.Encode("fuzz")
		if err != nil {
			t.Fatalf("Encode: %v", err)
		}
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("does not load back: %v\n%s", err, out)
		}
		if !sameConfig(back, mg.Config) {
			t.Fatalf("loaded back differently:\n got %+v\nwant %+v", back, mg.Config)
		}
	})
}
