package doctor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// runtimeBinaries are the programs a registered runtime may run for GPU
// containers: ours, or NVIDIA's (which gantry installs under that name too).
var runtimeBinaries = map[string]bool{"gantry-runtime": true, "nvidia-container-runtime": true}

// registered is one runtime entry in an engine's configuration.
type registered struct{ name, path string }

// judgeRuntimes fails when no entry runs a GPU runtime or its program is missing.
func judgeRuntimes(name, file, fix string, all []registered) Check {
	var names, gpuRuntimes, missing []string
	for _, r := range all {
		names = append(names, r.name)
		if !runtimeBinaries[filepath.Base(r.path)] {
			continue
		}
		p := r.path
		if !filepath.IsAbs(p) {
			lp, err := exec.LookPath(p)
			if err != nil {
				missing = append(missing, fmt.Sprintf("runtime %q runs %s, which is not on PATH", r.name, p))
				continue
			}
			p = lp
		}
		if st, err := os.Stat(p); err != nil || st.IsDir() {
			missing = append(missing, fmt.Sprintf("runtime %q runs %s, which does not exist", r.name, p))
			continue
		}
		gpuRuntimes = append(gpuRuntimes, fmt.Sprintf("%q -> %s", r.name, p))
	}
	if len(missing) > 0 {
		return fail(name, "install gantry-runtime there, or re-register it: "+fix, "%s: %s", file, strings.Join(missing, "; "))
	}
	if len(gpuRuntimes) == 0 {
		return fail(name, fix, "%s registers no runtime that runs gantry-runtime or nvidia-container-runtime (runtimes: %s)",
			file, listOrNone(names))
	}
	return pass(name, "%s: runtime %s", file, strings.Join(gpuRuntimes, ", "))
}

func dockerInstalled(opts Options) bool {
	if _, err := os.Stat(opts.DockerConfig); err == nil {
		return true
	}
	_, err := exec.LookPath("dockerd")
	return err == nil
}

func checkDocker(opts Options, installed bool) Check {
	const fix = "gantry runtime configure --runtime docker, then systemctl restart docker"
	file := opts.DockerConfig
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		if !installed {
			return skip(CheckDocker, "Docker is not installed (no dockerd on PATH, no %s)", file)
		}
		return fail(CheckDocker, fix, "dockerd is installed but %s does not exist: no GPU runtime is registered (docker --runtime nvidia fails)", file)
	}
	if err != nil {
		return fail(CheckDocker, "make the file readable", "%v", err)
	}
	var doc struct {
		Runtimes       map[string]struct{ Path string } `json:"runtimes"`
		DefaultRuntime string                           `json:"default-runtime"`
	}
	if len(strings.TrimSpace(string(b))) > 0 {
		if err := json.Unmarshal(b, &doc); err != nil {
			return fail(CheckDocker, "correct the JSON (dockerd will not start with it), then: "+fix, "%s: %v", file, err)
		}
	}
	var all []registered
	for name, r := range doc.Runtimes {
		all = append(all, registered{name, r.Path})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].name < all[j].name })
	c := judgeRuntimes(CheckDocker, file, fix, all)
	if c.OK && doc.DefaultRuntime != "" {
		c.Evidence += fmt.Sprintf(" (default runtime %q)", doc.DefaultRuntime)
	}
	return c
}

// containerdRuntimeTables are where the CRI plugin keeps its runtimes in
// config versions 2 and 3 (and the version 1 name).
var containerdRuntimeTables = []string{"io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "cri"}

func checkContainerd(opts Options) Check {
	const fix = "gantry runtime configure --runtime containerd, then systemctl restart containerd"
	file := opts.ContainerdConfig
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return skip(CheckContainerd, "%s does not exist (containerd not installed, or running on defaults without GPU support)", file)
	}
	if err != nil {
		return fail(CheckContainerd, "make the file readable", "%v", err)
	}
	var doc map[string]any
	if err := toml.Unmarshal(b, &doc); err != nil {
		return fail(CheckContainerd, "correct the TOML (containerd will not start with it)", "%s: %v", file, err)
	}
	var all []registered
	plugins, _ := doc["plugins"].(map[string]any)
	for _, t := range containerdRuntimeTables {
		runtimes := table(plugins, t, "containerd", "runtimes")
		for name, v := range runtimes {
			rt, _ := v.(map[string]any)
			bin, _ := table(rt, "options")["BinaryName"].(string)
			if bin == "" {
				bin = "runc"
			}
			all = append(all, registered{name, bin})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].name < all[j].name })
	return judgeRuntimes(CheckContainerd, file, fix, all)
}

func table(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil
		}
		m = next
	}
	return m
}

// checkCRIO reads crio.conf and its drop-ins (every file in crio.conf.d, in
// name order, as CRI-O does).
func checkCRIO(opts Options) Check {
	const fix = "gantry runtime configure --runtime crio, then systemctl restart crio"
	files := []string{}
	if _, err := os.Stat(opts.CRIOConfig); err == nil {
		files = append(files, opts.CRIOConfig)
	}
	entries, _ := os.ReadDir(opts.CRIODropins)
	for _, e := range entries {
		if !e.IsDir() {
			files = append(files, filepath.Join(opts.CRIODropins, e.Name()))
		}
	}
	if len(files) == 0 {
		return skip(CheckCRIO, "neither %s nor %s exist (CRI-O not installed)", opts.CRIOConfig, opts.CRIODropins)
	}
	byName := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return fail(CheckCRIO, "make the file readable", "%v", err)
		}
		var doc map[string]any
		if err := toml.Unmarshal(b, &doc); err != nil {
			return fail(CheckCRIO, "correct the TOML (CRI-O will not start with it)", "%s: %v", f, err)
		}
		for name, v := range table(doc, "crio", "runtime", "runtimes") {
			rt, _ := v.(map[string]any)
			p, _ := rt["runtime_path"].(string)
			if p == "" {
				p = name // CRI-O looks the runtime's name up in PATH
			}
			byName[name] = p
		}
	}
	var all []registered
	for n, p := range byName {
		all = append(all, registered{n, p})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].name < all[j].name })
	return judgeRuntimes(CheckCRIO, opts.CRIOConfig+" and "+opts.CRIODropins, fix, all)
}

// checkHook: docker run --gpus asks containerd to run a prestart hook found
// on dockerd's PATH under NVIDIA's name.
func checkHook(docker bool) Check {
	const name = "nvidia-container-runtime-hook"
	p, err := exec.LookPath(name)
	if err == nil {
		return pass(CheckHook, "%s", p)
	}
	if !docker {
		return skip(CheckHook, "%s is not on PATH; only docker --gpus needs it and Docker is not installed", name)
	}
	return fail(CheckHook, "ln -s gantry-runtime /usr/bin/"+name+" (gantry-runtime runs as the hook under that name; make install links it)",
		"%s is not on PATH (%s): docker run --gpus fails with \"could not select device driver\"", name, os.Getenv("PATH"))
}
