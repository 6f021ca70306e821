package driver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseVersion(t *testing.T) {
	tests := []struct {
		name, in, want string
		wantErr        bool
	}{
		{name: "proprietary module", in: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n", want: "550.54.15"},
		{name: "open module", in: "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n", want: "580.159.04"},
		{name: "aarch64 open module", in: "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  535.104.05  Release Build  (dvs-builder@U16-I3-B03-4-3)  Sat Aug 19 01:13:15 UTC 2023\n", want: "535.104.05"},
		{name: "two-part version", in: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  390.157  Wed Oct 12 09:19:07 UTC 2022\n", want: "390.157"},
		{name: "sysfs bare", in: "550.54.15\n", want: "550.54.15"},
		{name: "sysfs no newline", in: "580.159.04", want: "580.159.04"},
		{name: "sysfs spaces", in: "  550.54.15  \n", want: "550.54.15"},
		{name: "empty", in: "", wantErr: true},
		{name: "NVRM without number", in: "NVRM version: NVIDIA UNIX x86_64 Kernel Module\n", wantErr: true},
		{name: "gcc line only", in: "GCC version:  gcc version 12.3.0\n", wantErr: true},
		{name: "version on second line only", in: "hello\n550.54.15\n", wantErr: true},
		{name: "single number", in: "550\n", wantErr: true},
		{name: "letters", in: "550.54.1a\n", wantErr: true},
		{name: "trailing dot", in: "550.54.\n", wantErr: true},
		{name: "five parts", in: "1.2.3.4.5\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseVersion([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseVersion(%q) error = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("ParseVersion(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}

func FuzzVersionFile(f *testing.F) {
	f.Add([]byte("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"))
	f.Add([]byte("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n"))
	f.Add([]byte("550.54.15\n"))
	f.Add([]byte("NVRM version:"))
	f.Add([]byte{0xff, '\n', '1', '.', '2'})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := ParseVersion(b)
		if err != nil {
			if v != "" {
				t.Fatalf("error %v with version %q", err, v)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		if !IsVersion(v) {
			t.Fatalf("ParseVersion(%q) = %q, not a version", b, v)
		}
		line, _, _ := strings.Cut(string(b), "\n")
		if !strings.Contains(line, v) {
			t.Fatalf("version %q not on the first line of %q", v, b)
		}
	})
}

func TestVersionFromFiles(t *testing.T) {
	root := t.TempDir()
	host := filepath.Join(t.TempDir(), "sys-version")
	SetHostVersionFiles(t, host)

	if v, _, err := versionFromFiles(root); err != nil || v != "" {
		t.Fatalf("no files: got %q, %v; want nothing", v, err)
	}
	if err := os.WriteFile(host, []byte("535.104.05\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, src, err := versionFromFiles(root); err != nil || v != "535.104.05" || src != host {
		t.Fatalf("host file: got %q from %q, %v", v, src, err)
	}
	proc := filepath.Join(root, "proc/driver/nvidia/version")
	os.MkdirAll(filepath.Dir(proc), 0o755)
	if err := os.WriteFile(proc, []byte("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, src, err := versionFromFiles(root); err != nil || v != "550.54.15" || src != proc {
		t.Fatalf("root file wins: got %q from %q, %v", v, src, err)
	}
	if err := os.WriteFile(proc, []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := versionFromFiles(root); err == nil || !strings.Contains(err.Error(), proc) {
		t.Fatalf("unparsable root file: err = %v, want one naming %s", err, proc)
	}
}
