package cli

import (
	"strings"

	"github.com/gantry-gpu/gantry/internal/engineconfig"
)

func init() {
	nvCommands = append(nvCommands,
		&nvCommand{
			words:   "runtime configure",
			summary: "register the GPU runtime with docker, containerd or crio (gantry runtime configure)",
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
Gantry reads and writes the files itself: the engine's own "config dump" is not
consulted (--config-source=file).`,
			flags: []nvFlag{
				{names: []string{"runtime"}, help: "docker, containerd or crio (default docker)"},
				{names: []string{"config"}, help: "the engine's configuration file"},
				{names: []string{"dry-run"}, bool: true, help: "print the change; write nothing"},
				{names: []string{"nvidia-set-as-default", "set-as-default"}, bool: true, help: "make the runtime the engine's default"},
				{names: []string{"nvidia-runtime-name"}, help: "the runtime's name (default nvidia)"},
				{names: []string{"nvidia-runtime-path", "runtime-path"}, help: "the runtime binary (default /usr/bin/gantry-runtime; /usr/bin/nvidia-container-runtime is the same program)"},
				{names: []string{"drop-in-config"}, help: "containerd and crio: the drop-in file the runtime goes to (default /etc/containerd/conf.d/99-nvidia.toml, /etc/crio/crio.conf.d/99-nvidia.toml); containerd's --config then imports it; \"\" edits containerd's --config in place; not for docker"},
				{names: []string{"config-source"}, help: "where the current configuration is read: file (command is not supported)"},
				{names: []string{"config-mode"}, help: "config (the only mode)"},
				{names: []string{"cdi.enabled", "cdi.enable", "enable-cdi"}, bool: true, help: "also turn on the engine's CDI support (docker features.cdi, containerd enable_cdi; CRI-O has it always)"},
				{names: []string{"executable-path"}, unsupported: "it serves --config-source=command, which Gantry does not have: name the file with --config"},
				{names: []string{"oci-hook-path"}, unsupported: "Gantry has no oci-hook config mode: the runtime is registered in the engine's file; Docker's --gpus uses gantry-hook (see docs/guide.md)"},
				{names: []string{"nvidia-runtime-hook-path"}, unsupported: "Gantry has no oci-hook config mode: the runtime is registered in the engine's file"},
			},
			run: runNVRuntimeConfigure,
		},
		&nvCommand{
			words:   "cdi generate",
			summary: "write a CDI spec for the host's GPUs (gantry cdi generate)",
			help: `Runs gantry cdi generate: a CDI spec with a device per GPU by index and by UUID,
MIG devices, and "all", validated and written atomically (stdout without --output).

  sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml
  nvidia-ctk cdi generate --device-id=0 --no-all-device

Its hooks run gantry-cdi-hook (--nvidia-cdi-hook-path names another, e.g.
/usr/bin/nvidia-cdi-hook, which make install NVIDIA_NAMES=1 links to it).`,
			flags: []nvFlag{
				{names: []string{"output"}, help: "the spec file to write (default stdout)"},
				{names: []string{"format"}, help: "yaml or json (default: from --output's extension, else yaml)"},
				{names: []string{"mode", "discovery-mode"}, help: "auto, nvml, or imex for the IMEX channels' spec (the others are not supported)"},
				{names: []string{"device-name-strategy"}, multi: true, help: "index and uuid: Gantry always writes both names"},
				{names: []string{"driver-root"}, help: "where the driver is installed (default /)"},
				{names: []string{"dev-root"}, help: "where dev/nvidia* are (default: the driver root)"},
				{names: []string{"nvidia-cdi-hook-path", "nvidia-ctk-path"}, help: "absolute path of the hook binary the spec runs"},
				{names: []string{"vendor", "cdi-vendor"}, help: "the spec's vendor (default nvidia.com)"},
				{names: []string{"class", "cdi-class"}, help: "the spec's class (default gpu)"},
				{names: []string{"no-all-device"}, bool: true, help: "leave out the \"all\" device"},
				{names: []string{"device-id", "device-ids", "device", "devices"}, multi: true, help: "only these devices: GPUs by index or UUID, MIG devices by GPU:INSTANCE or MIG UUID (default all)"},
				{names: []string{"library-search-path"}, multi: true, help: "a further directory searched for the driver's libraries (repeatable; inside --driver-root)"},
				{names: []string{"config-search-path"}, unsupported: "Gantry finds the driver's configuration files under --driver-root itself"},
				{names: []string{"ldconfig-path"}, unsupported: "Gantry's update-ldcache hook runs no ldconfig (it writes the container's cache itself): leave it out"},
				{names: []string{"csv.file"}, unsupported: "CSV mode (Jetson/Tegra) is not supported"},
				{names: []string{"csv.ignore-pattern"}, unsupported: "CSV mode (Jetson/Tegra) is not supported"},
				{names: []string{"csv.compat-container-root"}, unsupported: "CSV mode (Jetson/Tegra) is not supported"},
				{names: []string{"disable-hook", "disable-hooks"}, unsupported: "Gantry's spec has the hooks its devices need and no others: leave it out"},
				{names: []string{"enable-hook", "enable-hooks"}, unsupported: "Gantry's spec has the hooks its devices need and no others: leave it out"},
				{names: []string{"feature-flag", "feature-flags"}, unsupported: "Gantry has no spec feature flags: leave it out"},
			},
			run: runNVCDIGenerate,
		},
		&nvCommand{
			words:   "cdi list",
			summary: "list the CDI device names in the spec directories (gantry cdi list)",
			help: `Runs gantry cdi list: the fully qualified device names of every CDI spec in
/etc/cdi and /var/run/cdi (--spec-dir names others), one per line.

  nvidia-ctk cdi list`,
			flags: []nvFlag{
				{names: []string{"spec-dir"}, multi: true, help: "a directory of CDI specs (repeatable)"},
			},
			run: func(c *nvCtx, f nvValues) error {
				args := []string{"cdi", "list"}
				if dirs, ok := f["spec-dir"]; ok {
					args = append(args, "--spec-dirs", strings.Join(dirs, ","))
				}
				return c.gantry(args...)
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
				{names: []string{"from"}, help: "the root the spec's paths are under"},
				{names: []string{"to"}, help: "the root they move to"},
				{names: []string{"input"}, help: "the spec to read (default -: stdin)"},
				{names: []string{"output"}, help: "where to write it (default stdout)"},
				{names: []string{"relative-to"}, help: "host (default) or container"},
			},
			run: func(c *nvCtx, f nvValues) error {
				args := []string{"cdi", "transform", "root"}
				for _, n := range []string{"from", "to", "input", "output", "relative-to"} {
					if v, ok := f.str(n); ok {
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

func runNVRuntimeConfigure(c *nvCtx, f nvValues) error {
	engine := "docker"
	if v, ok := f.str("runtime"); ok {
		engine = v
	}
	args := []string{"runtime", "configure", "--runtime", engine, "--also-name", ""}
	file, _ := f.str("config")
	dropIn, dropSet := f.str("drop-in-config")
	switch strings.ToLower(engine) {
	case "crio", "cri-o":
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
	case "containerd":
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
	if f.on("dry-run") {
		args = append(args, "--dry-run")
	}
	if f.on("cdi.enabled") {
		args = append(args, "--enable-cdi")
	}
	if f.on("nvidia-set-as-default") {
		args = append(args, "--set-as-default")
	}
	if v, ok := f.str("nvidia-runtime-name"); ok {
		args = append(args, "--name", v)
	}
	if v, ok := f.str("nvidia-runtime-path"); ok {
		args = append(args, "--runtime-path", v)
	}
	if v, ok := f.str("config-source"); ok && !strings.Contains(v, "file") {
		return usagef("--config-source=%s: Gantry reads the engine's configuration file only: use --config-source=file (and --config PATH)", v)
	}
	if v, ok := f.str("config-mode"); ok && v != "config" {
		return usagef("--config-mode=%s: Gantry registers the runtime in the engine's file only: use --config-mode=config; Docker's --gpus uses gantry-hook (see docs/guide.md)", v)
	}
	return c.gantry(args...)
}

func runNVCDIGenerate(c *nvCtx, f nvValues) error {
	var global []string
	args := []string{"cdi", "generate"}
	if v, ok := f.str("output"); ok {
		args = append(args, "--output", v)
	}
	if v, ok := f.str("format"); ok {
		args = append(args, "--format", v)
	}
	if v, ok := f.str("mode"); ok && v == "imex" {
		args = append(args, "--imex")
	} else if ok && v != "auto" && v != "nvml" {
		return usagef("--mode=%s: Gantry discovers GPUs with NVML only: use --mode=auto, --mode=nvml or --mode=imex (the IMEX channels)", v)
	}
	for _, s := range f["device-name-strategy"] {
		if s != "index" && s != "uuid" {
			return usagef("--device-name-strategy=%s: Gantry names devices by index and by UUID (both, always): use index or uuid", s)
		}
	}
	if v, ok := f.str("driver-root"); ok {
		global = append(global, "--driver-root", v)
	}
	if v, ok := f.str("dev-root"); ok {
		global = append(global, "--dev-root", v)
	}
	if v, ok := f.str("nvidia-cdi-hook-path"); ok {
		args = append(args, "--hook-path", v)
	}
	vendor, vok := f.str("vendor")
	class, cok := f.str("class")
	if vok || cok {
		if !vok {
			vendor = "nvidia.com"
		}
		if !cok {
			class = "gpu"
		}
		args = append(args, "--kind", vendor+"/"+class)
	}
	if f.on("no-all-device") {
		args = append(args, "--no-all-device")
	}
	for _, p := range f["library-search-path"] {
		args = append(args, "--library-search-path", p)
	}
	if ids, ok := f["device-id"]; ok {
		args = append(args, "--device-id", strings.Join(ids, ","))
	}
	return c.gantry(append(global, args...)...)
}
