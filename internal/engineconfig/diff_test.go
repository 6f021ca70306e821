package engineconfig

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestUnifiedDiffText(t *testing.T) {
	cases := []struct {
		name, a, b, want string
	}{
		{"equal", "x\n", "x\n", ""},
		{"create", "", "a\nb\n", "--- A\n+++ B\n@@ -0,0 +1,2 @@\n+a\n+b\n"},
		{"replace middle", "1\n2\n3\n4\n5\n6\n7\n8\n9\n", "1\n2\n3\n4\nfive\n6\n7\n8\n9\n",
			"--- A\n+++ B\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"},
		{"two hunks", "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n", "one\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\ntwelve\n",
			"--- A\n+++ B\n@@ -1,4 +1,4 @@\n-1\n+one\n 2\n 3\n 4\n@@ -9,4 +9,4 @@\n 9\n 10\n 11\n-12\n+twelve\n"},
		{"no newline", "a\nb", "a\nb\n", "--- A\n+++ B\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := unifiedDiff("A", "B", []byte(tc.a), []byte(tc.b)); got != tc.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

// TestUnifiedDiffAppliesWithPatch feeds our diffs to GNU patch: whatever
// patch reconstructs from the original must be the new file.
func TestUnifiedDiffAppliesWithPatch(t *testing.T) {
	patch, err := exec.LookPath("patch")
	if err != nil {
		t.Skip("patch not installed: cannot check diffs with a real consumer")
	}
	inputs, _ := filepath.Glob(filepath.Join("testdata", "in", "*"))
	pairs := [][2]string{
		{"a\nb\nc\n", "c\nb\na\n"},
		{"x\ny", "x\nz"},
		{strings.Repeat("same\n", 20) + "old\n" + strings.Repeat("same\n", 20), strings.Repeat("same\n", 21) + "new\n" + strings.Repeat("same\n", 19)},
	}
	for _, in := range inputs {
		e := Containerd
		switch {
		case strings.HasSuffix(in, ".json"):
			e = Docker
		case strings.Contains(in, "crio"):
			e = CRIO
		}
		a, _ := os.ReadFile(in)
		b, _, err := Plan(e, a, withDefault(gantryOpts))
		if err == nil {
			pairs = append(pairs, [2]string{string(a), string(b)})
		}
	}
	for i, p := range pairs {
		dir := t.TempDir()
		file := filepath.Join(dir, "f")
		if err := os.WriteFile(file, []byte(p[0]), 0o644); err != nil {
			t.Fatal(err)
		}
		d := unifiedDiff("f", "f", []byte(p[0]), []byte(p[1]))
		if d == "" {
			continue
		}
		cmd := exec.Command(patch, "--quiet", "--force", file)
		cmd.Stdin = strings.NewReader(d)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("pair %d: patch: %v\n%s\ndiff:\n%s", i, err, out, d)
		}
		got, _ := os.ReadFile(file)
		if string(got) != p[1] {
			t.Errorf("pair %d: patched file differs:\n%q\nwant\n%q\ndiff:\n%s", i, got, p[1], d)
		}
	}
}

func BenchmarkUnifiedDiff(b *testing.B) {
	a := readInput(b, "containerd-1.6-default.toml")
	after, _, err := Plan(Containerd, a, withDefault(gantryOpts))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		unifiedDiff("a", "b", a, after)
	}
}
