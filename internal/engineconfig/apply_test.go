package engineconfig

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// listDir returns the names in dir, to spot stray temp files.
func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestApplyCreatesAndIsIdempotent(t *testing.T) {
	for _, e := range Engines() {
		t.Run(string(e), func(t *testing.T) {
			dir := t.TempDir()
			// A missing parent directory (e.g. /etc/crio/crio.conf.d) is made.
			path := filepath.Join(dir, "etc", filepath.Base(DefaultPath(e)))
			diff, changes, err := Apply(e, path, withDefault(gantryOpts), false)
			if err != nil {
				t.Fatal(err)
			}
			if len(changes) == 0 || !strings.HasPrefix(diff, "--- /dev/null\n+++ "+path+"\n") {
				t.Fatalf("changes %q, diff:\n%s", changes, diff)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			want, _, _ := Plan(e, nil, withDefault(gantryOpts))
			if !bytes.Equal(got, want) {
				t.Errorf("file differs from Plan:\n%s", got)
			}
			if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o644 {
				t.Errorf("new file mode %v, want 0644", fi.Mode().Perm())
			}
			diff, changes, err = Apply(e, path, withDefault(gantryOpts), false)
			if err != nil || diff != "" || len(changes) != 0 {
				t.Errorf("second Apply: diff %q changes %q err %v", diff, changes, err)
			}
			if names := listDir(t, filepath.Dir(path)); len(names) != 1 {
				t.Errorf("stray files: %v", names)
			}
		})
	}
}

func TestApplyDryRunWritesNothing(t *testing.T) {
	dir := t.TempDir()
	absent := filepath.Join(dir, "sub", "daemon.json")
	diff, changes, err := Apply(Docker, absent, gantryOpts, true)
	if err != nil || diff == "" || len(changes) == 0 {
		t.Fatalf("dry run: %q %q %v", diff, changes, err)
	}
	if _, err := os.Stat(filepath.Dir(absent)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dry run created the directory: %v", err)
	}

	existing := filepath.Join(dir, "config.toml")
	in := readInput(t, "containerd-1.7-kubeadm.toml")
	if err := os.WriteFile(existing, in, 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(existing, old, old); err != nil {
		t.Fatal(err)
	}
	diff, _, err = Apply(Containerd, existing, gantryOpts, true)
	if err != nil || !strings.Contains(diff, "+        [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]") {
		t.Fatalf("dry run diff %v:\n%s", err, diff)
	}
	got, _ := os.ReadFile(existing)
	fi, _ := os.Stat(existing)
	if !bytes.Equal(got, in) || !fi.ModTime().Equal(old) {
		t.Error("dry run touched the file")
	}
	if names := listDir(t, dir); len(names) != 1 {
		t.Errorf("dry run left files: %v", names)
	}
}

func TestApplyPreservesModeAndFollowsSymlink(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real.json")
	if err := os.WriteFile(real, []byte(`{"debug": true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "daemon.json")
	if err := os.Symlink("real.json", link); err != nil {
		t.Fatal(err)
	}
	diff, _, err := Apply(Docker, link, gantryOpts, false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(diff, "--- "+link+"\n") {
		t.Errorf("diff names %q", strings.SplitN(diff, "\n", 2)[0])
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("symlink replaced: %v", err)
	}
	fi, err := os.Stat(real)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	got, _ := os.ReadFile(real)
	if !bytes.Contains(got, []byte(`"debug": true`)) || !bytes.Contains(got, []byte(`"nvidia"`)) {
		t.Errorf("content:\n%s", got)
	}
}

func TestApplyDanglingSymlinkCreatesTarget(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "99-nvidia.toml")
	if err := os.Symlink("managed/crio.toml", link); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Apply(CRIO, link, gantryOpts, false); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("link replaced: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "managed", "crio.toml")); err != nil || !bytes.Contains(b, []byte("runtime_path")) {
		t.Errorf("target: %q, %v", b, err)
	}
}

func TestApplyMalformedLeavesFileUntouched(t *testing.T) {
	cases := []struct {
		engine  Engine
		content string
		want    string
	}{
		{Docker, "{\n  \"debug\": true\n  \"x\": 1\n}\n", "line 3"},
		{Containerd, "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"\n", "line 2"},
		{Containerd, string(readInput(t, "containerd-v1.toml")), "version 1"},
		{CRIO, "[crio.runtime\n", "line 1"},
	}
	for _, tc := range cases {
		t.Run(string(tc.engine), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "conf")
			if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			_, _, err := Apply(tc.engine, path, gantryOpts, false)
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %s and %q", err, path, tc.want)
			}
			got, _ := os.ReadFile(path)
			if string(got) != tc.content {
				t.Error("file changed")
			}
			if names := listDir(t, dir); len(names) != 1 {
				t.Errorf("stray files: %v", names)
			}
		})
	}
}

func TestApplyLossyKeepsBackup(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	in := readInput(t, "containerd-dotted.toml")
	if err := os.WriteFile(path, in, 0o640); err != nil {
		t.Fatal(err)
	}
	// Setting the default needs a [...containerd] header, which the dotted
	// keys already define: only a full re-encode can do it.
	if _, _, err := Apply(Containerd, path, withDefault(gantryOpts), false); err != nil {
		t.Fatal(err)
	}
	backup, err := os.ReadFile(path + BackupSuffix)
	if err != nil || !bytes.Equal(backup, in) {
		t.Fatalf("backup %q, %v", backup, err)
	}
	if fi, _ := os.Stat(path + BackupSuffix); fi.Mode().Perm() != 0o640 {
		t.Errorf("backup mode %v", fi.Mode().Perm())
	}
	// Lossless edits keep one too: every replaced file is kept, as it was
	// before the latest change.
	path2 := filepath.Join(dir, "other.toml")
	in2 := readInput(t, "containerd-1.7-kubeadm.toml")
	if err := os.WriteFile(path2, in2, 0o644); err != nil {
		t.Fatal(err)
	}
	_, changes, err := Apply(Containerd, path2, gantryOpts, false)
	if err != nil {
		t.Fatal(err)
	}
	if backup, err := os.ReadFile(path2 + BackupSuffix); err != nil || !bytes.Equal(backup, in2) {
		t.Errorf("no backup of a lossless edit: %v", err)
	}
	if last := changes[len(changes)-1]; last != "kept the old file as "+path2+BackupSuffix {
		t.Errorf("last change %q does not name the backup", last)
	}
	// A second run changes nothing and leaves the backup alone.
	if _, ch, err := Apply(Containerd, path2, gantryOpts, false); err != nil || len(ch) != 0 {
		t.Errorf("second Apply: %q %v", ch, err)
	}
	if backup, _ := os.ReadFile(path2 + BackupSuffix); !bytes.Equal(backup, in2) {
		t.Error("a no-op run replaced the backup")
	}
}

func TestWriteFileAtomicFailureLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	// Renaming a file over a non-empty directory fails after the temp file
	// has been written and synced: the last step that can go wrong.
	target := filepath.Join(dir, "daemon.json")
	if err := os.MkdirAll(filepath.Join(target, "keep"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeFileAtomic(target, []byte("{}\n"), 0o644, -1, -1); err == nil {
		t.Fatal("expected an error")
	}
	if names := listDir(t, dir); len(names) != 1 || names[0] != "daemon.json" {
		t.Errorf("temp file left behind: %v", names)
	}
	// A directory that does not exist fails at the first step.
	if err := writeFileAtomic(filepath.Join(dir, "missing", "x"), nil, 0o644, -1, -1); err == nil {
		t.Error("expected an error")
	}
}

func TestApplyReadErrorNamesFile(t *testing.T) {
	dir := t.TempDir()
	_, _, err := Apply(Docker, dir, gantryOpts, false) // a directory
	if err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("err = %v", err)
	}
}

// TestContainerdAcceptsGeneratedConfig runs the real containerd over the
// generated file: its config dump must show our runtime with BinaryName.
func TestContainerdAcceptsGeneratedConfig(t *testing.T) {
	bin, err := exec.LookPath("containerd")
	if err != nil {
		t.Skip("containerd not installed (apt-get install containerd): cannot check the generated config with the real parser")
	}
	for _, input := range []string{"", "containerd-1.6-default.toml", "containerd-1.7-kubeadm.toml", "containerd-nvidia.toml", "containerd-dotted.toml", "containerd-crlf.toml"} {
		for _, setDefault := range []bool{false, true} {
			opts := gantryOpts
			opts.SetAsDefault = setDefault
			t.Run(fmt.Sprintf("%s/default=%v", input, setDefault), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "config.toml")
				if input != "" {
					if err := os.WriteFile(path, readInput(t, input), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				if _, _, err := Apply(Containerd, path, opts, false); err != nil {
					t.Fatal(err)
				}
				out, err := exec.Command(bin, "--config", path, "config", "dump").CombinedOutput()
				if err != nil {
					t.Fatalf("containerd config dump: %v\n%s", err, out)
				}
				dump, err := decodeTOML(out)
				if err != nil {
					t.Fatalf("dump does not parse: %v\n%s", err, out)
				}
				for _, name := range []string{"nvidia", "gantry"} {
					v, ok, _ := lookup(dump, []string{"plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes", name, "options", "BinaryName"})
					if !ok || v != "/usr/bin/gantry-runtime" {
						t.Errorf("containerd sees runtimes.%s BinaryName = %v\n%s", name, v, out)
					}
				}
				if setDefault {
					v, _, _ := lookup(dump, []string{"plugins", "io.containerd.grpc.v1.cri", "containerd", "default_runtime_name"})
					if v != "nvidia" {
						t.Errorf("containerd sees default_runtime_name = %v", v)
					}
				}
			})
		}
	}
}
