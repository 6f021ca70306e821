// Command bundlesplit takes a GPU container's config.json apart, for
// bench/runtime-lifecycle.sh --split: which part of runc's time on a GPU
// bundle is the driver's mounts and which the device nodes.
//
//	bundlesplit BASE GPU OUT {mounts|devices|onemount SRC DEST}
//
// BASE is the config.json of the same container without a GPU request, GPU
// the one gantry-runtime wrote. OUT gets GPU's config.json less what Gantry
// added of one kind: "mounts" drops the added mounts (the devices stay),
// "devices" drops the added device nodes and their cgroup rules (the mounts
// stay), "onemount" drops the added mounts and binds the directory SRC
// read-only at DEST instead: the cost of handing runc the driver as one mount.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bundlesplit:", err)
		os.Exit(2)
	}
}

func load(path string) (*specs.Spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &s, nil
}

func run(args []string) error {
	if len(args) < 4 {
		return fmt.Errorf("usage: bundlesplit BASE GPU OUT {mounts|devices|onemount SRC DEST}")
	}
	base, err := load(args[0])
	if err != nil {
		return err
	}
	gpu, err := load(args[1])
	if err != nil {
		return err
	}
	had := map[string]bool{}
	for _, m := range base.Mounts {
		had[m.Destination] = true
	}
	var kept []specs.Mount
	for _, m := range gpu.Mounts {
		if had[m.Destination] {
			kept = append(kept, m)
		}
	}
	switch mode := args[3]; mode {
	case "mounts":
		gpu.Mounts = kept
	case "onemount":
		if len(args) != 6 {
			return fmt.Errorf("onemount needs SRC and DEST")
		}
		gpu.Mounts = append(kept, specs.Mount{Source: args[4], Destination: args[5], Type: "bind",
			Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	case "devices":
		if gpu.Linux != nil {
			gpu.Linux.Devices = nil
			if base.Linux != nil {
				gpu.Linux.Devices = base.Linux.Devices
				if gpu.Linux.Resources != nil && base.Linux.Resources != nil {
					gpu.Linux.Resources.Devices = base.Linux.Resources.Devices
				}
			}
		}
	default:
		return fmt.Errorf("unknown part %q (mounts, devices or onemount)", mode)
	}
	out, err := json.Marshal(gpu)
	if err != nil {
		return err
	}
	return os.WriteFile(args[2], out, 0o644)
}
