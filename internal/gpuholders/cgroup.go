package gpuholders

import (
	"os"
	"path/filepath"
	"strings"
)

// maxDepth bounds the search for a pod's cgroup below the cgroup root:
// v1 controller, an optional --cgroup-root, kubepods, QoS class, pod.
const maxDepth = 6

// podRunning reports whether the pod uid has a process in its cgroup. A
// pod whose cgroup is not found is not running, unless no kubepods cgroup
// was found at all (pods without cgroups of their own, or cgroups not
// visible here): then nothing can be told and it counts as running.
func podRunning(root, uid string) bool {
	names := map[string]bool{"pod" + uid: true}
	// The systemd driver's kubepods-<qos>-pod<uid with _>.slice.
	under := "pod" + strings.ReplaceAll(uid, "-", "_") + ".slice"
	sawKubepods := false
	var found []string
	var walk func(dir string, depth int, inKubepods bool)
	walk = func(dir string, depth int, inKubepods bool) {
		if depth > maxDepth || len(found) > 0 {
			return
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			name := e.Name()
			p := filepath.Join(dir, name)
			if names[name] || strings.HasSuffix(name, "-"+under) {
				found = append(found, p)
				return
			}
			kp := inKubepods || strings.HasPrefix(name, "kubepods")
			sawKubepods = sawKubepods || kp
			// Below kubepods every level is searched; above it only the
			// first levels (a v1 controller, a --cgroup-root).
			if kp || depth < 2 {
				if walk(p, depth+1, kp); len(found) > 0 {
					return
				}
			}
		}
	}
	walk(root, 0, false)
	if len(found) == 0 {
		return !sawKubepods
	}
	return populated(found[0], 0)
}

// populated reports whether the cgroup dir or one below it has a process:
// cgroup v2's cgroup.events says so at once; v1 has only cgroup.procs.
func populated(dir string, depth int) bool {
	if b, err := os.ReadFile(filepath.Join(dir, "cgroup.events")); err == nil {
		return strings.Contains(string(b), "populated 1")
	}
	if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return true
	}
	if depth > 3 {
		return false
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() && populated(filepath.Join(dir, e.Name()), depth+1) {
			return true
		}
	}
	return false
}
