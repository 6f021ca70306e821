package cli

import (
	"github.com/gantry-gpu/gantry/internal/cdicmd"
	"github.com/gantry-gpu/gantry/internal/engineconfig"
)

func init() {
	nvCommands = append(nvCommands,
		&nvCommand{
			words: "runtime configure",
			texts: func(c *nvCommand) {
				c.summary = "register the GPU runtime with " + engineconfig.EngineList() + " (gantry runtime configure)"
				for i, f := range c.flags {
					if f.Names[0] == "runtime" {
						c.flags[i].Help = engineconfig.EngineList() + " (default docker)"
					}
				}
			},
			help: `Runs gantry runtime configure: registers gantry-runtime under the name nvidia
(--nvidia-runtime-name) in the engine's configuration, keeping everything else in
the file, replacing it atomically and printing the change as a diff. Restart the
engine afterwards (systemctl restart docker / containerd / crio).

  sudo nvidia-ctk runtime configure --runtime=docker
  sudo nvidia-ctk runtime configure --runtime=docker --config=/etc/docker/daemon.json --set-as-default
  sudo nvidia-ctk runtime configure --runtime=containerd --dry-run
  sudo nvidia-ctk runtime configure --runtime=crio

Default files: docker /etc/docker/daemon.json; containerd the drop-in
/etc/containerd/conf.d/99-nvidia.toml (--drop-in-config), imported by
/etc/containerd/config.toml (--config), which gets an imports entry
"/etc/containerd/conf.d/*.toml" (--drop-in-config="" edits config.toml in place,
as gantry runtime configure does); crio the drop-in
/etc/crio/crio.conf.d/99-nvidia.toml (--drop-in-config names another; CRI-O's
--config, /etc/crio/crio.conf, is edited in place only with --drop-in-config="").
docker's entry is NVIDIA's: {"path": "nvidia-container-runtime", "args": []}
(--nvidia-runtime-path names another). Before a file is replaced the engine's own
program reads the result (containerd config dump, dockerd --validate where it exists,
crio config; --executable-path names it) and a result it would not load is refused;
the old file is kept as FILE.gantry-backup. --config-source=command starts from
containerd config dump instead of the file (file is the default, as NVIDIA's).`,
			flags: []nvFlag{
				{Names: []string{"runtime"}, Help: "docker, containerd or crio (default docker)"},
				{Names: []string{"config"}, Help: "the engine's configuration file"},
				{Names: []string{"dry-run"}, Bool: true, Help: "print the change; write nothing"},
				{Names: []string{"nvidia-set-as-default", "set-as-default"}, Bool: true, Help: "make the runtime the engine's default"},
				{Names: []string{"nvidia-runtime-name"}, Help: "the runtime's name (default nvidia)"},
				{Names: []string{"nvidia-runtime-path", "runtime-path"}, Help: "the runtime binary (default /usr/bin/gantry-runtime; /usr/bin/nvidia-container-runtime is the same program)"},
				{Names: []string{"drop-in-config"}, Help: "containerd and crio: the drop-in file the runtime goes to (default /etc/containerd/conf.d/99-nvidia.toml, /etc/crio/crio.conf.d/99-nvidia.toml); containerd's --config then imports it; \"\" edits containerd's --config in place; not for docker"},
				{Names: []string{"config-source"}, Help: "where the current configuration is read: file (the default) or command (containerd config dump, crio config; docker reads the file)"},
				{Names: []string{"config-mode"}, Help: "config (the only mode)"},
				{Names: []string{"cdi.enabled", "cdi.enable", "enable-cdi"}, Bool: true, Help: "also turn on the engine's CDI support (docker features.cdi, containerd enable_cdi; CRI-O has it always)"},
				{Names: []string{"executable-path"}, Help: "the engine's program (containerd, crio) that --config-source=command runs and that checks the result (default: found on PATH)"},
				{Names: []string{"oci-hook-path"}, Unsupported: "Gantry has no oci-hook config mode: the runtime is registered in the engine's file; Docker's --gpus uses gantry-hook (see docs/guide.md)"},
				{Names: []string{"nvidia-runtime-hook-path"}, Unsupported: "Gantry has no oci-hook config mode: the runtime is registered in the engine's file"},
			},
			run: runNVRuntimeConfigure,
		},
		&nvCommand{
			words:   "cdi generate",
			summary: "write a CDI spec for the host's GPUs (gantry cdi generate)",
			help: `Runs gantry cdi generate: a CDI spec with a device per GPU by index and by UUID,
MIG devices, and "all", validated and written atomically (stdout without --output).
gantry-runtime answers it itself under the name nvidia-ctk (make install links it):
the same spec, without the start-up of the gantry CLI.

  sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml
  nvidia-ctk cdi generate --device-id=0 --no-all-device

Its hooks run gantry-cdi-hook (--nvidia-cdi-hook-path names another, e.g.
/usr/bin/nvidia-cdi-hook, which make install NVIDIA_NAMES=1 links to it).`,
			flags: cdicmd.GenerateFlags,
			run: func(c *nvCtx, f nvValues) error {
				return cdicmd.NVGenerate(f, c.debug, c.stdout, c.stderr)
			},
		},
		&nvCommand{
			words:   "cdi list",
			summary: "list the CDI device names in the spec directories (gantry cdi list)",
			help: `Runs gantry cdi list: the fully qualified device names of every CDI spec in
/etc/cdi and /var/run/cdi (--spec-dir names others), one per line. gantry-runtime
answers it itself under the name nvidia-ctk, as cdi generate.

  nvidia-ctk cdi list`,
			flags: cdicmd.ListFlags,
			run: func(c *nvCtx, f nvValues) error {
				return cdicmd.NVList(f, c.debug, c.stdout, c.stderr)
			},
		},
		&nvCommand{
			words:   "cdi transform root",
			summary: "rewrite a CDI spec's paths from one root to another (gantry cdi transform root)",
			help: `Runs gantry cdi transform root with the same flags: replaces the leading
--from with --to in the spec's host paths (--relative-to host, the default) or
container paths (--relative-to container).

  nvidia-ctk cdi transform root --from=/run/nvidia/driver --to=/ --input=spec.yaml --output=/etc/cdi/nvidia.yaml`,
			flags: []nvFlag{
				{Names: []string{"from"}, Help: "the root the spec's paths are under"},
				{Names: []string{"to"}, Help: "the root they move to"},
				{Names: []string{"input"}, Help: "the spec to read (default -: stdin)"},
				{Names: []string{"output"}, Help: "where to write it (default stdout)"},
				{Names: []string{"relative-to"}, Help: "host (default) or container"},
			},
			run: func(c *nvCtx, f nvValues) error {
				args := []string{"cdi", "transform", "root"}
				for _, n := range []string{"from", "to", "input", "output", "relative-to"} {
					if v, ok := f.Str(n); ok {
						args = append(args, "--"+n, v)
					}
				}
				return c.gantry(args...)
			},
		},
		&nvCommand{
			words:   "info",
			summary: "the host's GPUs, driver and Gantry version (gantry info)",
			help:    `Runs gantry info.`,
			run:     func(c *nvCtx, f nvValues) error { return c.gantry("info") },
		},
	)
}

// nvidiaDockerRuntime is the path NVIDIA's nvidia-ctk writes into
// daemon.json by default: a name dockerd looks up on its PATH.
const nvidiaDockerRuntime = "nvidia-container-runtime"

func runNVRuntimeConfigure(c *nvCtx, f nvValues) error {
	engine := "docker"
	if v, ok := f.Str("runtime"); ok {
		engine = v
	}
	// The engine as gantry runtime configure will read it (an alias such
	// as cri-o is crio); an unknown one is refused there.
	eng, _ := engineconfig.ParseEngine(engine)
	args := []string{"runtime", "configure", "--runtime", engine, "--also-name", ""}
	file, _ := f.Str("config")
	dropIn, dropSet := f.Str("drop-in-config")
	switch eng {
	case engineconfig.CRIO:
		// The drop-in is the file Gantry writes (CRI-O merges drop-ins
		// over crio.conf, which is not read); --drop-in-config="" edits
		// --config, crio.conf, in place.
		switch {
		case dropSet && dropIn == "":
			if file == "" {
				file = "/etc/crio/crio.conf"
			}
		case dropSet:
			file = dropIn
		default:
			file = engineconfig.DefaultPath(engineconfig.CRIO)
		}
	case engineconfig.Containerd:
		// NVIDIA's toolkit 1.17+ writes containerd's runtime to a drop-in
		// by default; --drop-in-config="" edits config.toml in place.
		if !dropSet {
			dropIn = engineconfig.DefaultContainerdDropIn
		}
		if dropIn != "" {
			args = append(args, "--drop-in", dropIn)
		}
	default:
		if dropSet && dropIn != "" {
			return usagef("--drop-in-config: %s has no drop-in files: leave it out (or give --drop-in-config=\"\"), and --config PATH for another file", engine)
		}
	}
	if file != "" {
		args = append(args, "--config-file", file)
	}
	if f.On("dry-run") {
		args = append(args, "--dry-run")
	}
	if f.On("cdi.enabled") {
		args = append(args, "--enable-cdi")
	}
	if f.On("nvidia-set-as-default") {
		args = append(args, "--set-as-default")
	}
	if v, ok := f.Str("nvidia-runtime-name"); ok {
		args = append(args, "--name", v)
	}
	runtimePath, pathSet := f.Str("nvidia-runtime-path")
	if eng == engineconfig.Docker {
		// NVIDIA's form under NVIDIA's name: {"path":
		// "nvidia-container-runtime", "args": []}, the path looked up on
		// dockerd's PATH (make install links that name to gantry-runtime).
		args = append(args, "--nvidia-form")
		if !pathSet {
			runtimePath, pathSet = nvidiaDockerRuntime, true
		}
	}
	if pathSet {
		args = append(args, "--runtime-path", runtimePath)
	}
	if v, ok := f.Str("config-source"); ok {
		// NVIDIA's values: file, command, or command,file (the command
		// where it runs); for docker the file is read, as NVIDIA's does.
		args = append(args, "--config-source", v)
	}
	if v, ok := f.Str("executable-path"); ok && eng != engineconfig.Docker {
		args = append(args, "--executable-path", v)
	}
	if v, ok := f.Str("config-mode"); ok && v != "config" {
		return usagef("--config-mode=%s: Gantry registers the runtime in the engine's file only: use --config-mode=config; Docker's --gpus uses gantry-hook (see docs/guide.md)", v)
	}
	return c.gantry(args...)
}
