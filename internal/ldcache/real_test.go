package ldcache

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.cache from the caches ldconfig writes")

// fixture is a root filesystem with a few real shared objects and the
// entries ldconfig is expected to list for them, in cache order.
type fixture struct {
	root  string
	want  []Entry // as the new format lists them
	has32 bool
}

func needTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not found in PATH (%v); install it to run this test", name, err)
	}
	return p
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// sharedObject builds a shared object with the given SONAME at root+path.
func sharedObject(t testing.TB, root, path, soname string, extra ...string) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "x.c")
	writeFile(t, src, "int gantry_fixture(void) { return 42; }\n")
	out := filepath.Join(root, path)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-shared", "-fPIC", "-Wl,-soname," + soname, "-o", out, src}, extra...)
	run(t, "gcc", args...)
}

// gcc32Works reports whether gcc can build a 32-bit shared object. Without
// a 32-bit libc only -nostdlib links, which is all a fixture needs.
func gcc32Works(t testing.TB) bool {
	dir := t.TempDir()
	src := filepath.Join(dir, "x.c")
	writeFile(t, src, "int f(void) { return 1; }\n")
	return exec.Command("gcc", "-m32", "-shared", "-nostdlib", "-o", filepath.Join(dir, "x.so"), src).Run() == nil
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	needTool(t, "gcc")
	needTool(t, "ldconfig")
	root := t.TempDir()
	const multi = "/usr/lib/x86_64-linux-gnu"
	sharedObject(t, root, multi+"/libfoo.so.1.2.3", "libfoo.so.1")
	sharedObject(t, root, multi+"/glibc-hwcaps/x86-64-v3/libfoo.so.1", "libfoo.so.1")
	sharedObject(t, root, "/opt/gantry/lib/libbar.so.10", "libbar.so.10")
	sharedObject(t, root, "/opt/gantry/lib/libbar.so.9", "libbar.so.9")
	f := &fixture{root: root}
	if gcc32Works(t) {
		sharedObject(t, root, "/usr/lib32/libthirty.so.1", "libthirty.so.1", "-m32", "-nostdlib")
		f.has32 = true
	}
	writeFile(t, filepath.Join(root, "etc/ld.so.conf"), "/opt/gantry/lib\n/usr/lib32\n")

	x := FlagsX8664
	if f.has32 {
		// Without a libc dependency ldconfig can only say "ELF".
		f.want = append(f.want, Entry{Name: "libthirty.so.1", Path: "/usr/lib32/libthirty.so.1", Flags: FlagELF})
	}
	f.want = append(f.want,
		Entry{Name: "libfoo.so.1", Path: multi + "/glibc-hwcaps/x86-64-v3/libfoo.so.1", Flags: x, HWCap: HWCapExtension, HWCapsSubdir: "x86-64-v3"},
		Entry{Name: "libfoo.so.1", Path: multi + "/libfoo.so.1", Flags: x},
		Entry{Name: "libbar.so.10", Path: "/opt/gantry/lib/libbar.so.10", Flags: x},
		Entry{Name: "libbar.so.9", Path: "/opt/gantry/lib/libbar.so.9", Flags: x},
	)
	return f
}

// ldconfigFormats returns the -c values this ldconfig accepts ("" is its
// default).
func ldconfigFormats(t testing.TB) []string {
	help, _ := exec.Command("ldconfig", "--help").CombinedOutput()
	if !bytes.Contains(help, []byte("--format")) {
		return []string{""}
	}
	return []string{"", "old", "compat", "new"}
}

// build runs ldconfig on the fixture and returns the cache path (outside
// the root) and its bytes.
func (f *fixture) build(t testing.TB, format string) (string, []byte) {
	t.Helper()
	name := "/etc/ld.so.cache"
	args := []string{"-r", f.root}
	if format != "" {
		name += "." + format
		args = append(args, "-c", format)
	}
	args = append(args, "-C", name)
	if out, err := exec.Command("ldconfig", args...).CombinedOutput(); err != nil {
		if format != "" {
			// Some glibc release may drop a legacy format; that is not ours to test.
			t.Skipf("this ldconfig cannot write format %q: %v\n%s", format, err, out)
		}
		t.Fatalf("ldconfig %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	path := filepath.Join(f.root, name)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, b
}

// wantFor adjusts the expected entries to what a format can hold.
func (f *fixture) wantFor(format Format) []Entry {
	want := slices.Clone(f.want)
	if format == FormatOld {
		// The old format has no hwcap field: ldconfig lists glibc-hwcaps
		// libraries there as plain entries.
		for i := range want {
			want[i].HWCap, want[i].HWCapsSubdir = 0, ""
		}
	}
	return want
}

// ldconfigList returns the entry lines of `ldconfig -p -C file`.
func ldconfigList(t testing.TB, file string) []string {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(run(t, "ldconfig", "-p", "-C", file), "\n") {
		if rest, ok := strings.CutPrefix(l, "\t"); ok {
			lines = append(lines, rest)
		}
	}
	return lines
}

func entryLines(es []Entry) []string {
	var s []string
	for _, e := range es {
		s = append(s, e.String())
	}
	return s
}

func TestRealCaches(t *testing.T) {
	f := newFixture(t)
	for _, format := range ldconfigFormats(t) {
		t.Run("format="+format, func(t *testing.T) {
			path, b := f.build(t, format)
			c, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			wantFormat := map[string]Format{"": FormatNew, "new": FormatNew, "old": FormatOld, "compat": FormatCompat}[format]
			if c.Format != wantFormat {
				t.Errorf("Format = %v, want %v", c.Format, wantFormat)
			}
			want := f.wantFor(c.Format)
			if !slices.Equal(c.Entries, want) {
				t.Errorf("entries:\n got %v\nwant %v", c.Entries, want)
			}
			if c.Format != FormatOld && !strings.HasPrefix(c.Generator, "ldconfig") {
				t.Errorf("Generator = %q, want ldconfig's", c.Generator)
			}
			if got, want := c.Lookup("libfoo.so.1"), []string{
				"/usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libfoo.so.1",
				"/usr/lib/x86_64-linux-gnu/libfoo.so.1",
			}; !slices.Equal(got, want) {
				t.Errorf("Lookup(libfoo.so.1) = %q, want %q", got, want)
			}
			if f.has32 {
				if got := c.Lookup("libthirty.so.1"); got != nil {
					t.Errorf("Lookup(libthirty.so.1) = %q, want nothing (32-bit only)", got)
				}
			}

			// ldconfig's own listing of the same file, line by line.
			wantLines := entryLines(c.Entries)
			if c.Format == FormatCompat {
				// glibc reads the hwcaps names of a compat file from the
				// wrong base and prints them empty; we read what ldconfig
				// meant to write.
				for i, e := range c.Entries {
					if e.IsHWCaps() {
						e.HWCapsSubdir = ""
						wantLines[i] = e.String()
					}
				}
			}
			if got := ldconfigList(t, path); !slices.Equal(got, wantLines) {
				t.Errorf("ldconfig -p lists\n%s\nwe parsed\n%s", strings.Join(got, "\n"), strings.Join(wantLines, "\n"))
			}

			if *update && format != "" && !f.has32 {
				t.Log("not updating testdata: this gcc lacks -m32, the fixture would differ")
			} else if *update && format != "" {
				if err := os.WriteFile(filepath.Join("testdata", format+".cache"), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestRoundTripReal writes each real cache back out and checks that we and
// ldconfig read the same entries from our file.
func TestRoundTripReal(t *testing.T) {
	f := newFixture(t)
	for _, format := range ldconfigFormats(t) {
		t.Run("format="+format, func(t *testing.T) {
			_, b := f.build(t, format)
			c, err := Parse(b)
			if err != nil {
				t.Fatal(err)
			}
			out, err := c.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			c2, err := Parse(out)
			if err != nil {
				t.Fatalf("parsing our own output: %v", err)
			}
			if !slices.Equal(c2.Entries, c.Entries) {
				t.Errorf("round trip changed entries:\n got %v\nwant %v", c2.Entries, c.Entries)
			}
			if c2.Format != FormatNew || c2.Generator != generator {
				t.Errorf("round trip: Format %v, Generator %q", c2.Format, c2.Generator)
			}
			file := filepath.Join(t.TempDir(), "ld.so.cache")
			if err := os.WriteFile(file, out, 0o644); err != nil {
				t.Fatal(err)
			}
			if got, want := ldconfigList(t, file), entryLines(c.Entries); !slices.Equal(got, want) {
				t.Errorf("ldconfig -p on our file lists\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// TestRoundTripHost does the same with this machine's own cache, which has
// hundreds of entries in ldconfig's order.
func TestRoundTripHost(t *testing.T) {
	b, err := os.ReadFile("/etc/ld.so.cache")
	if err != nil {
		t.Skipf("no readable host cache: %v", err)
	}
	c, err := Parse(b)
	if err != nil {
		t.Fatalf("parsing /etc/ld.so.cache: %v", err)
	}
	out, err := c.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	c2, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	// Equal order means our sort agrees with ldconfig's on real names.
	if !slices.Equal(c2.Entries, c.Entries) {
		for i := range min(len(c.Entries), len(c2.Entries)) {
			if c.Entries[i] != c2.Entries[i] {
				t.Fatalf("entry %d differs after round trip: ldconfig has %v, we wrote %v", i, c.Entries[i], c2.Entries[i])
			}
		}
		t.Fatalf("round trip: %d entries, want %d", len(c2.Entries), len(c.Entries))
	}
	if _, err := exec.LookPath("ldconfig"); err == nil {
		file := filepath.Join(t.TempDir(), "ld.so.cache")
		if err := os.WriteFile(file, out, 0o644); err != nil {
			t.Fatal(err)
		}
		if got, want := ldconfigList(t, file), ldconfigList(t, "/etc/ld.so.cache"); !slices.Equal(got, want) {
			t.Errorf("ldconfig -p lists our copy of the host cache differently (%d vs %d lines)", len(got), len(want))
		}
	}
}

// TestLoaderAcceptsOurCache runs a real program under the real loader in a
// chroot whose only way to find libc and the program's library is a cache we
// wrote, among a few hundred decoy names that a mis-sorted cache would trip
// over. A deliberately mis-sorted copy must fail, proving the test can.
func TestLoaderAcceptsOurCache(t *testing.T) {
	needTool(t, "gcc")
	chroot := needTool(t, "chroot")
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root; run as root to check the loader accepts our cache")
	}
	const interp = "/lib64/ld-linux-x86-64.so.2"
	loader, err := filepath.EvalSymlinks(interp)
	if err != nil {
		t.Skipf("no x86-64 loader at %s: %v", interp, err)
	}
	libc, err := filepath.EvalSymlinks(strings.TrimSpace(run(t, "gcc", "-print-file-name=libc.so.6")))
	if err != nil {
		t.Skipf("cannot find libc.so.6: %v", err)
	}

	root := t.TempDir()
	copyFile(t, loader, filepath.Join(root, interp))
	copyFile(t, libc, filepath.Join(root, "opt/c/libc.so.6"))
	sharedObject(t, root, "/opt/foo/lib/libgantryfoo.so.1.0", "libgantryfoo.so.1")
	main := filepath.Join(t.TempDir(), "main.c")
	writeFile(t, main, "#include <stdio.h>\nint gantry_fixture(void);\nint main(void) { printf(\"foo=%d\\n\", gantry_fixture()); return 0; }\n")
	run(t, "gcc", "-o", filepath.Join(root, "prog"), main,
		filepath.Join(root, "opt/foo/lib/libgantryfoo.so.1.0"), "-Wl,--no-as-needed")

	x := FlagsX8664
	c := &Cache{Entries: []Entry{
		{Name: "libgantryfoo.so.1", Path: "/opt/foo/lib/libgantryfoo.so.1.0", Flags: x},
		{Name: "libc.so.6", Path: "/opt/c/libc.so.6", Flags: x},
	}}
	for i := range 150 {
		for _, n := range []string{"libgantryfoo.so.%d", "libc.so.%d", "lib%03d.so.1", "libgantryfoo%d.so"} {
			c.Entries = append(c.Entries, Entry{Name: fmt.Sprintf(n, i+2), Path: "/nonexistent", Flags: x})
		}
	}
	good, err := c.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	runProg := func(cache []byte) (string, error) {
		writeFile(t, filepath.Join(root, "etc/ld.so.cache"), string(cache))
		out, err := exec.Command(chroot, root, "/prog").CombinedOutput()
		return string(out), err
	}
	if out, err := runProg(good); err != nil || out != "foo=42\n" {
		t.Fatalf("program under the real loader with our cache: %v\n%s", err, out)
	}

	// Control: the same entries in reverse order.
	sorted := slices.Clone(c.Entries)
	slices.SortStableFunc(sorted, compareEntries)
	slices.Reverse(sorted)
	bad, err := marshalOrdered(sorted)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := runProg(bad); err == nil {
		t.Fatalf("mis-sorted cache worked too (%q): the test cannot tell a good cache from a bad one", out)
	} else if !strings.Contains(out, "cannot open shared object file") {
		t.Fatalf("mis-sorted cache failed for another reason than a missed lookup: %v\n%s", err, out)
	}
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}
