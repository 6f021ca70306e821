package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/engineconfig"
)

// runtimeBinaries are the programs a registered runtime may run for GPU
// containers: ours, or NVIDIA's (which gantry installs under that name too).
var runtimeBinaries = map[string]bool{"gantry-runtime": true, "nvidia-container-runtime": true}

// registered is one runtime entry in an engine's configuration, as
// engineconfig reads it.
type registered = engineconfig.Runtime

// judgeRuntimes fails when no entry runs a GPU runtime (configure is the
// fix) or its program is missing (reinstall is).
//
// A registered gantry-runtime links no NVML and asks the gantry binary for
// NVML's GPUs (MIG devices): with no gantry to ask, that fails when MIG
// instances exist on this host (opts.Proc), and is a note otherwise.
func judgeRuntimes(opts Options, name, file, configure, reinstall string, all []registered) Check {
	var names, gpuRuntimes, missing, noHelper, gantryRuntimes, fixes []string
	// The engine runs the program: judged with its PATH and the file's mode.
	enginePath, source := enginePATH(opts.Proc, opts.ServicePATH, engineFor(opts, name))
	for _, r := range all {
		names = append(names, r.Name)
		if !runtimeBinaries[filepath.Base(r.Program)] {
			continue
		}
		pr := judgeProgram(r.Program, enginePath, source)
		if pr.path == "" {
			missing = append(missing, fmt.Sprintf("runtime %q runs %s: %s", r.Name, r.Program, pr.problem))
			switch {
			case pr.chmod != "":
				fixes = append(fixes, fix(fixProgramMode, "FILE", pr.chmod))
			case pr.onDoctorPath != "":
				fixFile := file
				if strings.HasPrefix(file, "the running containerd") {
					fixFile = "the file containerd was started with (its --config, default " + DefaultContainerdConfig + "), as its BinaryName"
				}
				fixes = append(fixes, fix(fixRuntimeAbsPath, "NAME", r.Name, "FILE", fixFile, "ABSPATH", pr.onDoctorPath,
					"DIR", filepath.Dir(pr.onDoctorPath), "ENGINE", engineFor(opts, name).comm, "RESTART", restartFor(name)))
			}
			continue
		}
		p := pr.path
		gpuRuntimes = append(gpuRuntimes, fmt.Sprintf("%q -> %s", r.Name, p))
		if prob := nvmlHelperProblem(opts.Config, p); prob != "" {
			noHelper = append(noHelper, fmt.Sprintf("runtime %q (%s): %s", r.Name, p, prob))
		}
		if gantryProgram(p) {
			gantryRuntimes = append(gantryRuntimes, p)
		}
	}
	if len(missing) > 0 {
		if len(fixes) > 0 {
			reinstall = strings.Join(fixes, "; ")
		}
		return fail(name, reinstall, "%s: %s", file, strings.Join(missing, "; "))
	}
	var notes []string
	if len(noHelper) > 0 && len(gpuRuntimes) > 0 {
		if migInstances(opts.Proc) {
			return fail(name, fix(fixNVMLHelper), "%s: MIG instances exist, and %s", file, strings.Join(noHelper, "; "))
		}
		notes = append(notes, strings.Join(noHelper, "; ")+"; containers given MIG devices would fail")
	}
	if len(gpuRuntimes) == 0 {
		return fail(name, configure, "%s registers no runtime that runs gantry-runtime or nvidia-container-runtime (runtimes: %s)",
			file, listOrNone(names))
	}
	good, bad := createServerNotes(opts, gantryRuntimes)
	notes = append(notes, bad...)
	evidence := fmt.Sprintf("%s: runtime %s", file, strings.Join(gpuRuntimes, ", "))
	for _, g := range good {
		evidence += "; " + g
	}
	if len(notes) > 0 {
		evidence += " (note: " + strings.Join(notes, "; ") + ")"
	}
	return pass(name, "%s", evidence)
}

// nvmlHelperProblem is why the program p, when it is Gantry's static
// gantry-runtime (which links no NVML), could not ask a gantry binary for
// NVML's GPUs; "" when it can, and for any other program (the gantry
// binary itself, which links NVML, or NVIDIA's runtime).
func nvmlHelperProblem(cfg config.Config, p string) string {
	real, err := filepath.EvalSymlinks(p)
	if err != nil || filepath.Base(real) != "gantry-runtime" {
		return ""
	}
	if _, err := discover.HelperPath(cfg, real); err != nil {
		return err.Error()
	}
	return ""
}

// migInstances reports whether a GPU of this host has MIG instances (the
// driver's capability directories under proc), when GPU containers need
// NVML.
func migInstances(proc string) bool {
	m, _ := filepath.Glob(filepath.Join(proc, "driver/nvidia/capabilities/gpu*/mig/gi*"))
	return len(m) > 0
}

func noGPURuntime(all []registered) bool {
	for _, r := range all {
		if runtimeBinaries[filepath.Base(r.Program)] {
			return false
		}
	}
	return true
}

func dockerInstalled(opts Options) bool {
	if _, err := os.Stat(opts.DockerConfig); err == nil {
		return true
	}
	_, err := exec.LookPath("dockerd")
	return err == nil
}

// checkDocker judges daemon.json. hookOK says docker run --gpus works
// (the hook is on dockerd's PATH): then a file that registers no GPU
// runtime is not a failure, only --runtime nvidia is unavailable.
func checkDocker(opts Options, installed, hookOK bool) Check {
	configure := fix(fixDockerConfigure)
	file := opts.DockerConfig
	reg, err := engineconfig.Read(engineconfig.Docker, file)
	if errors.Is(err, fs.ErrNotExist) {
		if !installed {
			return skip(CheckDocker, "Docker is not installed (no dockerd on PATH, no %s)", file)
		}
		if hookOK {
			return info(CheckDocker, "%s does not exist, so no GPU runtime is registered (docker run --runtime nvidia is not available); docker run --gpus uses the hook (see %s)", file, CheckHook)
		}
		// Neither Docker GPU path is set up: Docker is not used for GPU
		// containers here (a Kubernetes node's CRI runtime, or Docker for
		// other work). Not a failure of the paths in use.
		return info(CheckDocker, "Docker is installed but not set up for GPU containers: %s does not exist (no GPU runtime) and the hook for docker --gpus is not on dockerd's PATH (see %s); to use Docker with GPUs: %s", file, CheckHook, configure)
	}
	if errors.Is(err, engineconfig.ErrMalformed) {
		return fail(CheckDocker, fix(fixDockerJSON), "%v", err)
	}
	if err != nil {
		return fail(CheckDocker, fix(fixReadable), "%v", err)
	}
	all := reg.Runtimes
	live, liveErr := askDockerd(opts.DockerSocket)
	if liveErr == nil {
		if problems := compareDockerd(file, all, reg.DefaultRuntime, live); len(problems) > 0 {
			return fail(CheckDocker, fix(fixDockerRestart),
				"%s: dockerd was not restarted after the file changed", strings.Join(problems, "; "))
		}
	}
	c := judgeRuntimes(opts, CheckDocker, file, configure, fix(fixDockerReinstall), all)
	if c.Status == Fail && hookOK && noGPURuntime(all) {
		return info(CheckDocker, "%s registers no GPU runtime (docker run --runtime nvidia is not available); docker run --gpus uses the hook (see %s)", file, CheckHook)
	}
	if c.Status == Fail && noGPURuntime(all) && reg.DefaultRuntime == "" {
		return info(CheckDocker, "Docker is not set up for GPU containers: %s registers no GPU runtime (runtimes: %s) and the hook for docker --gpus is not on dockerd's PATH (see %s); to use Docker with GPUs: %s",
			file, runtimeNames(all), CheckHook, configure)
	}
	if c.OK && reg.DefaultRuntime != "" {
		c.Evidence += fmt.Sprintf(" (default runtime %q)", reg.DefaultRuntime)
	}
	if c.OK {
		if liveErr != nil {
			c.Evidence += fmt.Sprintf("; no dockerd answers on %s (%v), so this is the file only", opts.DockerSocket, liveErr)
		} else {
			c.Evidence += fmt.Sprintf("; the running dockerd (%s) has it (default runtime %q, CDI spec dirs %s)", opts.DockerSocket, live.DefaultRuntime, listOrNone(live.CDISpecDirs))
		}
	}
	return c
}

// checkContainerd judges the running containerd's runtimes (live, from
// its CRI socket; liveErr when none answered), else its config.toml.
func checkContainerd(opts Options, live []registered, socket string, liveErr error) Check {
	// The running containerd's own configuration, where its CRI service
	// answers: what it registers now, whatever file it was started with.
	if liveErr == nil {
		c := judgeRuntimes(opts, CheckContainerd, "the running containerd at "+socket+" (its configuration from CRI Status)", fix(fixContainerdLive, "SOCKET", socket), fix(fixContainerdReinstall), live)
		if c.Status == Fail && noGPURuntime(live) {
			if _, err := os.Stat(opts.KubeletDir); err != nil {
				return info(CheckContainerd, "the running containerd at %s registers no GPU runtime (runtimes: %s), and this is no Kubernetes node (no %s): containerd is not used through CRI for GPU containers here", socket, runtimeNames(live), opts.KubeletDir)
			}
		}
		return c
	}
	file := opts.ContainerdConfig
	// The file and the files it imports (NVIDIA's toolkit and nvidia-ctk
	// runtime configure put the runtime in a drop-in,
	// /etc/containerd/conf.d/99-nvidia.toml).
	reg, files, err := engineconfig.ReadContainerd(file)
	if errors.Is(err, fs.ErrNotExist) && len(files) == 0 {
		return skip(CheckContainerd, "%s does not exist (containerd not installed, or running on defaults without GPU support)", file)
	}
	var imported *engineconfig.ImportError
	if errors.As(err, &imported) {
		return fail(CheckContainerd, fix(fixContainerdImport), "%v", err)
	}
	if errors.Is(err, engineconfig.ErrMalformed) || errors.Is(err, engineconfig.ErrUnsupportedVersion) {
		return fail(CheckContainerd, fix(fixContainerdTOML), "%v", err)
	}
	if err != nil {
		return fail(CheckContainerd, fix(fixReadable), "%v", err)
	}
	c := judgeRuntimes(opts, CheckContainerd, strings.Join(files, ", "), fix(fixContainerdConfigure), fix(fixContainerdReinstall), reg.Runtimes)
	if c.Status != Fail || !noGPURuntime(reg.Runtimes) {
		return c
	}
	// No GPU runtime registered. That is a failure only where containerd
	// runs GPU containers itself, through its CRI plugin for a kubelet;
	// with the plugin disabled (Docker CE's config) or no kubelet here
	// (Debian's containerd under Docker) it is Docker's backend.
	if d := reg.CRIDisabled; d != "" {
		return info(CheckContainerd, "%s disables the CRI plugin (disabled_plugins %s): containerd is not used for GPU containers here (Docker's backend); no GPU runtime needed", file, d)
	}
	if _, err := os.Stat(opts.KubeletDir); err != nil {
		return info(CheckContainerd, "%s registers no GPU runtime, and this is no Kubernetes node (no %s): containerd is not used through CRI for GPU containers here (Docker's backend, or ctr/nerdctl with --runc-binary or CDI)", file, opts.KubeletDir)
	}
	return c
}

// checkCRIO reads crio.conf and its drop-ins (every file in crio.conf.d, in
// name order, as CRI-O does).
func checkCRIO(opts Options) Check {
	reg, files, err := engineconfig.ReadCRIO(opts.CRIOConfig, opts.CRIODropins)
	if len(files) == 0 && errors.Is(err, fs.ErrNotExist) {
		return skip(CheckCRIO, "neither %s nor %s exist (CRI-O not installed)", opts.CRIOConfig, opts.CRIODropins)
	}
	if errors.Is(err, engineconfig.ErrMalformed) {
		return fail(CheckCRIO, fix(fixCRIOTOML), "%v", err)
	}
	if err != nil {
		return fail(CheckCRIO, fix(fixReadable), "%v", err)
	}
	all := reg.Runtimes
	c := judgeRuntimes(opts, CheckCRIO, opts.CRIOConfig+" and "+opts.CRIODropins, fix(fixCRIOConfigure), fix(fixCRIOReinstall), all)
	if c.Status == Fail && noGPURuntime(all) {
		// CRI-O serves only a kubelet: without one it runs no GPU containers.
		if _, err := os.Stat(opts.KubeletDir); err != nil {
			return info(CheckCRIO, "no GPU runtime registered, and this is no Kubernetes node (no %s): CRI-O is not used for GPU containers here", opts.KubeletDir)
		}
	}
	return c
}

// DefaultServicePATH is systemd's PATH for services, which dockerd gets
// when it is started by its unit without an Environment= line.
const DefaultServicePATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// dockerdPATH returns the PATH of the running dockerd that listens on
// the socket doctor was pointed at (enginePATH), and where it came from.
// docker run --gpus makes dockerd put the hook's path in the spec after a
// lookup in dockerd's own PATH, so doctor's PATH proves nothing. Without a
// running dockerd it is Options.ServicePATH (systemd's default service PATH).
func dockerdPATH(opts Options) (path, source string) {
	return enginePATH(opts.Proc, opts.ServicePATH, dockerdProcess(opts))
}

const hookName = "nvidia-container-runtime-hook"

// hookUsable says whether docker run --gpus finds the hook.
func hookUsable(opts Options) bool {
	path, _ := dockerdPATH(opts)
	_, ok := discover.LookPathIn(hookName, path)
	return ok
}

// checkHook: docker run --gpus asks containerd to run a prestart hook found
// on dockerd's PATH under NVIDIA's name.
// runtimeOK says Docker's other GPU path, --runtime nvidia, works: then a
// missing hook is INFO (only --gpus is unavailable), not a failure.
func checkHook(opts Options, docker, runtimeOK bool) Check {
	path, source := dockerdPATH(opts)
	if c, broken := brokenHook(opts, path, source); broken {
		if !docker {
			return skip(CheckHook, "Docker is not installed, so only docker --gpus's hook is unchecked; note: %s", c.Evidence)
		}
		return c
	}
	if p, ok := discover.LookPathIn(hookName, path); ok {
		evidence := fmt.Sprintf("%s (on %s)", p, source)
		if gantryProgram(p) {
			// Gantry's hook: the create server does its work too.
			good, bad := createServerNotes(opts, []string{p})
			for _, g := range good {
				evidence += "; " + g
			}
			if len(bad) > 0 {
				evidence += " (note: " + strings.Join(bad, "; ") + ")"
			}
		}
		return pass(CheckHook, "%s", evidence)
	}
	if !docker {
		return skip(CheckHook, "%s is not on PATH; only docker --gpus needs it and Docker is not installed", hookName)
	}
	if runtimeOK {
		return info(CheckHook, "%s is not on dockerd's PATH %q (%s), so docker run --gpus is not available; docker run --runtime nvidia is (see %s). For --gpus: ln -s gantry-runtime /usr/bin/%s",
			hookName, path, source, CheckDocker, hookName)
	}
	if p, err := exec.LookPath(hookName); err == nil {
		// Installed, but where dockerd does not look: --gpus is meant to
		// work here and fails.
		return fail(CheckHook, fix(fixHookPath, "DIR", filepath.Dir(p)),
			"%s is installed (%s) but not on dockerd's PATH %q (%s): docker run --gpus fails with \"could not select device driver\"", hookName, p, path, source)
	}
	// Neither Docker path is set up: Docker is not a GPU path on this host
	// (docker config says so); --gpus would fail with "could not select
	// device driver", so say how to set it up, without failing the host.
	return info(CheckHook, "%s is not on PATH %q (%s): docker run --gpus is not set up here (it would fail with \"could not select device driver\"); to set it up: ln -s gantry-runtime /usr/bin/%s (make install links it), or add its directory to dockerd's PATH, then systemctl restart docker",
		hookName, path, source, hookName)
}

// runtimeNames lists registered runtimes by name, or "none".
func runtimeNames(all []registered) string {
	if len(all) == 0 {
		return "none"
	}
	names := make([]string, len(all))
	for i, r := range all {
		names[i] = r.Name
	}
	return strings.Join(names, ", ")
}
