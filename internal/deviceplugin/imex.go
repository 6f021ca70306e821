package deviceplugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// IMEX channels, as NVIDIA's plugin hands them out (its imex section):
// each channel in imex.channelIDs whose device node exists goes to every
// container that gets a device, by the device list strategies in use —
// NVIDIA_IMEX_CHANNELS for envvar, a /dev/null mount at
// /var/run/nvidia-container-devices/imex/N for volume-mounts, the CDI
// device <vendor>/imex-channel=N for the cdi-* strategies, the device node
// itself with passDeviceSpecs. The runtime turns the first two into the
// node (request.EnvIMEXChannels).
const (
	envIMEXChannels = "NVIDIA_IMEX_CHANNELS"
	imexChannelDir  = "/dev/nvidia-caps-imex-channels"
	imexCDIClass    = "imex-channel"
	// maxIMEXChannel bounds a channel ID: the driver's nvidia-caps-imex-channels
	// major has 2048 minors (NVreg_ImexChannelCount's default and maximum).
	maxIMEXChannel = 2047
)

// ErrIMEXRequired is matched by the error of a required IMEX channel that
// does not exist: the plugin exits rather than serve GPUs without it, as
// NVIDIA's does with imex.required: true.
var ErrIMEXRequired = errors.New("required IMEX channel missing")

// imexChannel is one channel handed out.
type imexChannel struct {
	ID       string // "0"
	Path     string // in the container: /dev/nvidia-caps-imex-channels/channel0
	HostPath string // on the host: under the device root
}

// validateIMEX checks imex.channelIDs. A channel that cannot exist (a
// negative or too large ID) is an error only with imex.required; otherwise
// it is dropped with a warning, so an IMEX setting never takes the node's
// GPUs away unless the admin said it must.
func (c *Config) validateIMEX() error {
	if c.Imex == nil {
		return nil
	}
	var keep []int
	for _, id := range c.Imex.ChannelIDs {
		if id < 0 || id > maxIMEXChannel {
			msg := fmt.Sprintf("want a channel number from 0 to %d (NVIDIA's plugin takes [0] only)", maxIMEXChannel)
			if c.Imex.Required {
				return badValue(c, "imex.channelIDs", id, msg)
			}
			c.warnings = append(c.warnings, fmt.Sprintf("imex.channelIDs (%s): ignoring %d: %s; imex.required is false, so the GPUs are served without it", c.from("imex.channelIDs"), id, msg))
			continue
		}
		if !slices.Contains(keep, id) {
			keep = append(keep, id)
		}
	}
	c.Imex.ChannelIDs = keep
	return nil
}

// resolveIMEX finds the configured channels under the device root devRoot,
// as the plugin sees the host (the DaemonSet mounts it), or at their own
// path (a plugin container given the nodes by its runtime). A missing
// channel is ErrIMEXRequired with imex.required, else a warning.
func resolveIMEX(cfg *Config, devRoot string) (chans []imexChannel, warnings []string, err error) {
	if cfg.Imex == nil {
		return nil, nil, nil
	}
	for _, id := range cfg.Imex.ChannelIDs {
		ch := imexChannel{ID: strconv.Itoa(id), Path: imexChannelDir + "/channel" + strconv.Itoa(id)}
		ch.HostPath = filepath.Join(devRoot, ch.Path)
		if err := isCharDevice(ch.HostPath, ch.Path); err != nil {
			if cfg.Imex.Required {
				return nil, nil, fmt.Errorf("%w: imex.channelIDs (%s) names channel %s, required, but %v; start the IMEX daemon (it creates the channels) or nvidia-modprobe -i %s, or set imex.required: false",
					ErrIMEXRequired, cfg.from("imex.channelIDs"), ch.ID, err, ch.ID)
			}
			warnings = append(warnings, fmt.Sprintf("imex.channelIDs: not handing out IMEX channel %s: %v (imex.required is false; the GPUs are served without it)", ch.ID, err))
			continue
		}
		chans = append(chans, ch)
	}
	return chans, warnings, nil
}

// isCharDevice reports nil when one of paths is a character device.
func isCharDevice(paths ...string) error {
	var errs []string
	for _, p := range paths {
		fi, err := os.Stat(p)
		switch {
		case err != nil:
			errs = append(errs, err.Error())
		case fi.Mode()&os.ModeCharDevice == 0:
			errs = append(errs, p+" is not a character device")
		default:
			return nil
		}
	}
	return errors.New(strings.Join(errs, "; "))
}

// imexCDIName is the CDI name of channel id: the vendor of the plugin's
// CDI kind, class imex-channel (nvidia.com/imex-channel=0, the name
// gantry cdi generate --imex and NVIDIA's nvidia-ctk give it).
func imexCDIName(kind, id string) string {
	vendor, _, _ := strings.Cut(kind, "/")
	return vendor + "/" + imexCDIClass + "=" + id
}

// addIMEX adds the channels to a container's answer, in the form of each
// device list strategy in use.
func (s *server) addIMEX(r *pluginapi.ContainerAllocateResponse) {
	chans := s.p.imex
	if len(chans) == 0 {
		return
	}
	cfg := &s.p.cfg
	strategies := cfg.Flags.Plugin.DeviceListStrategy
	if strategies.anyCDI() {
		for _, ch := range chans {
			n := imexCDIName(cfg.cdiKind(), ch.ID)
			if strategies.Has(ListCDICRI) {
				r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: n})
			}
			if strategies.Has(ListCDIAnnotations) {
				for k, v := range r.Annotations {
					r.Annotations[k] = v + "," + n
				}
			}
		}
	}
	if strategies.allCDI() {
		return
	}
	ids := make([]string, len(chans))
	for i, ch := range chans {
		ids[i] = ch.ID
	}
	if strategies.Has(ListEnvVar) {
		r.Envs[envIMEXChannels] = strings.Join(ids, ",")
	}
	if strategies.Has(ListVolumeMounts) {
		for _, id := range ids {
			r.Mounts = append(r.Mounts, &pluginapi.Mount{
				HostPath: volumeMountSource, ContainerPath: volumeMountsRoot + "/imex/" + id, ReadOnly: true,
			})
		}
	}
	if cfg.Flags.Plugin.PassDeviceSpecs {
		for _, ch := range chans {
			r.Devices = append(r.Devices, &pluginapi.DeviceSpec{ContainerPath: ch.Path, HostPath: ch.HostPath, Permissions: "rw"})
		}
	}
}
