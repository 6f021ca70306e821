package fakedriver

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// CopyLoaderDeps copies the shared libraries the host program bin needs (as
// the host's ldd lists them, the dynamic loader included) into the image
// directory root, each at the same path, so that bin runs in root with the
// image's own loader. It returns the directories it copied into, in the
// order ldd named them: an image's /etc/ld.so.conf lists them. Test images
// in every package that runs a real container build on it.
func CopyLoaderDeps(bin, root string) ([]string, error) {
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %v", bin, err)
	}
	var dirs []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
		// "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
		f := strings.Fields(sc.Text())
		var p string
		switch {
		case len(f) >= 3 && f[1] == "=>":
			p = f[2]
		case len(f) >= 1 && filepath.IsAbs(f[0]):
			p = f[0]
		}
		if !filepath.IsAbs(p) {
			continue
		}
		dst := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return nil, err
		}
		b, err := os.ReadFile(p) // follows links: the image gets the file itself
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(dst, b, 0o755); err != nil {
			return nil, err
		}
		if d := filepath.Dir(p); !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	return dirs, sc.Err()
}
