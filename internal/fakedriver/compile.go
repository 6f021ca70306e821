package fakedriver

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// compiler builds C sources with gcc into a content-addressed cache
// directory, so each distinct object is compiled once per machine and every
// later Build only copies files.
type compiler struct {
	cacheDir string
}

// build compiles src with the gcc arguments args (without -o) and returns
// the cached output's path. The cache key is the source and the arguments.
func (c *compiler) build(src string, args []string) (string, error) {
	h := sha256.New()
	io.WriteString(h, src)
	for _, a := range args {
		io.WriteString(h, "\x00"+a)
	}
	out := filepath.Join(c.cacheDir, hex.EncodeToString(h.Sum(nil))[:24])
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(c.cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("creating the compile cache %s: %w", c.cacheDir, err)
	}
	tmp, err := os.MkdirTemp(c.cacheDir, "build-")
	if err != nil {
		return "", fmt.Errorf("creating a build directory in %s: %w", c.cacheDir, err)
	}
	defer os.RemoveAll(tmp)
	srcPath := filepath.Join(tmp, "src.c")
	if err := os.WriteFile(srcPath, []byte(src), 0o644); err != nil {
		return "", err
	}
	obj := filepath.Join(tmp, "out")
	cmd := exec.Command("gcc", append(append([]string{}, args...), "-o", obj, srcPath)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("gcc %s: %w: %s", strings.Join(args, " "), err, firstLine(stderr.String()))
	}
	// Rename is atomic, so concurrent builders (parallel test binaries)
	// never see a half-written object.
	if err := os.Rename(obj, out); err != nil {
		return "", fmt.Errorf("storing %s: %w", out, err)
	}
	return out, nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// copyFile copies src to dst with mode perm, replacing dst.
func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	os.Remove(dst)
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
