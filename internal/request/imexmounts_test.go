package request

import (
	"errors"
	"slices"
	"testing"
)

// TestIMEXFromVolumeMounts: with runtime.accept-volume-mounts, a container
// given GPUs by the device plugin's volume-mounts strategy also gets the
// IMEX channels its imex section mounts at .../imex/N (as NVIDIA's runtime
// reads them), merged with NVIDIA_IMEX_CHANNELS; without the setting they
// are not read; a bad channel name is an error naming the mount.
func TestIMEXFromVolumeMounts(t *testing.T) {
	opts := DefaultOptions()
	opts.AcceptVolumeMounts = true
	in := Input{
		Env:               []string{"NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices", "NVIDIA_IMEX_CHANNELS=3"},
		MountDestinations: []string{"/var/run/nvidia-container-devices/0", "/var/run/nvidia-container-devices/imex/0", "/var/run/nvidia-container-devices/imex/3"},
	}
	req, err := Parse(in, opts)
	if err != nil {
		t.Fatal(err)
	}
	if req.Source != SourceMounts || req.IMEXChannels.Mode != List || !slices.Equal(req.IMEXChannels.IDs, []string{"3", "0"}) {
		t.Errorf("source %s, IMEX %+v: want mounts, channels 3,0", req.Source, req.IMEXChannels)
	}
	in.Env = in.Env[:1]
	in.MountDestinations = append(in.MountDestinations, "/var/run/nvidia-container-devices/imex/x")
	if _, err := Parse(in, opts); !errors.Is(err, ErrInvalid) {
		t.Errorf("imex/x: %v, want ErrInvalid", err)
	}
	in.MountDestinations = in.MountDestinations[:2]
	opts.AcceptVolumeMounts = false
	in.Env = []string{"NVIDIA_VISIBLE_DEVICES=0"}
	if req, err := Parse(in, opts); err != nil || req.IMEXChannels.Mode != Void {
		t.Errorf("without accept-volume-mounts: %v, IMEX %+v, want none", err, req.IMEXChannels)
	}
}
