package cdispec

import (
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/edits"
)

// IMEXKind is the CDI kind of IMEX channels (NVIDIA's name).
const IMEXKind = "nvidia.com/imex-channel"

// imexDir holds the IMEX channel nodes the IMEX daemon creates.
const imexDir = "/dev/nvidia-caps-imex-channels"

// GenerateIMEX builds the spec of the host's IMEX channels: one device per
// /dev/nvidia-caps-imex-channels/channelN under devRoot, named N, as
// NVIDIA's nvidia-ctk cdi generate --mode=imex names them
// (nvidia.com/imex-channel=N), with NVIDIA_VISIBLE_DEVICES=void spec-wide
// so the channel alone gives no GPU. No channel is an error.
func GenerateIMEX(devRoot string) (*specs.Spec, error) {
	matches, err := filepath.Glob(filepath.Join(devRoot, imexDir, "channel*"))
	if err != nil {
		return nil, err
	}
	type channel struct {
		n    int
		path string
	}
	var chans []channel
	for _, m := range matches {
		n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(m), "channel"))
		if err != nil || n < 0 {
			continue
		}
		chans = append(chans, channel{n, imexDir + "/channel" + strconv.Itoa(n)})
	}
	if len(chans) == 0 {
		return nil, fmt.Errorf("%w: no IMEX channel under %s (the IMEX daemon creates them, or: nvidia-modprobe -i 0)", ErrNoDevices, filepath.Join(devRoot, imexDir))
	}
	sort.Slice(chans, func(i, j int) bool { return chans[i].n < chans[j].n })
	spec := &specs.Spec{Kind: IMEXKind}
	for _, c := range chans {
		f, err := driver.StatDevice(devRoot, c.path)
		if err != nil {
			return nil, fmt.Errorf("IMEX channel %d: %w", c.n, err)
		}
		host := f.HostPath
		if host == "" {
			host = filepath.Join(devRoot, c.path)
		}
		major, minor := f.Major, f.Minor
		spec.Devices = append(spec.Devices, specs.Device{
			Name: strconv.Itoa(c.n),
			ContainerEdits: specs.ContainerEdits{DeviceNodes: []*specs.DeviceNode{{
				Path: c.path, HostPath: host, Type: "c", Major: major, Minor: minor, Permissions: edits.CgroupAccess,
			}}},
		})
	}
	spec.ContainerEdits = specs.ContainerEdits{Env: []string{edits.VisibleDevicesVoid}}
	v, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, err
	}
	spec.Version = v
	if err := Validate(spec); err != nil {
		return nil, err
	}
	return spec, nil
}
