package discover

import (
	"os"
	"path/filepath"
	"testing"
)

// TestKubeletPluginDir: which bind sources give a container the kubelet's
// registration directories, on a kroot tree with links: the directory, the
// kubelet's root above it (also reached through a link, and a kubelet
// root that is itself a link), plugins_registry; not a copy elsewhere, a
// sibling with a longer name, a subdirectory, a link to a lookalike, or a
// path that does not exist, or one that is not clean.
func TestKubeletPluginDir(t *testing.T) {
	tmp := t.TempDir()
	kroot := filepath.Join(tmp, "data", "kubelet")
	for _, d := range []string{"device-plugins/sub", "plugins_registry", "device-plugins-old", "pods/uid/volumes/kubernetes.io~empty-dir/x"} {
		if err := os.MkdirAll(filepath.Join(kroot, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	look := filepath.Join(tmp, "lookalike", "var", "lib", "kubelet", "device-plugins")
	if err := os.MkdirAll(look, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(look, "kubelet.sock"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// The configured kubelet root is a link to the kroot one.
	root := filepath.Join(tmp, "kubelet")
	links := map[string]string{root: kroot, filepath.Join(tmp, "to-dp"): filepath.Join(kroot, "device-plugins"),
		filepath.Join(tmp, "to-look"): look}
	for l, target := range links {
		if err := os.Symlink(target, l); err != nil {
			t.Fatal(err)
		}
	}
	match := KubeletPluginDir(root)
	for _, tc := range []struct {
		source, want string
	}{
		{filepath.Join(root, "device-plugins"), filepath.Join(root, "device-plugins")},
		{filepath.Join(kroot, "device-plugins"), filepath.Join(root, "device-plugins")},
		// Not clean: no lexical ".." that a link on the way could redirect.
		{kroot + "/device-plugins/", ""},
		{kroot + "/device-plugins/sub/..", ""},
		{tmp + "/to-look/../../../../data/kubelet/device-plugins", ""},
		{kroot, filepath.Join(root, "device-plugins")},
		{root, filepath.Join(root, "device-plugins")},
		{filepath.Join(tmp, "data"), filepath.Join(root, "device-plugins")},
		{"/", filepath.Join(root, "device-plugins")},
		{filepath.Join(tmp, "to-dp"), filepath.Join(root, "device-plugins")},
		{filepath.Join(root, "plugins_registry"), filepath.Join(root, "plugins_registry")},
		{look, ""},
		{filepath.Join(tmp, "to-look"), ""},
		{filepath.Join(kroot, "device-plugins-old"), ""},
		{filepath.Join(kroot, "device-plugins", "sub"), ""},
		{filepath.Join(kroot, "pods", "uid", "volumes", "kubernetes.io~empty-dir", "x"), ""},
		{filepath.Join(tmp, "missing"), ""},
		{"data/kubelet", ""},
		{"", ""},
	} {
		got, ok := match(tc.source)
		if ok != (tc.want != "") || got != tc.want {
			t.Errorf("source %q: %q, %v; want %q", tc.source, got, ok, tc.want)
		}
	}
	// A kubelet root without the directories: nothing matches.
	if d, ok := KubeletPluginDir(filepath.Join(tmp, "nokubelet"))("/"); ok {
		t.Errorf("a missing kubelet root matched %q", d)
	}
}
