package request

import (
	"fmt"
	"strconv"
	"strings"
)

// Feature is a device class beside the GPUs that an image switches on with
// an environment variable set to "enabled" (NVIDIA's gated modifiers), for
// a container that asks for GPUs.
type Feature string

const (
	// FeatureGDS is GPUDirect Storage: /dev/nvidia-fs*, /etc/cufile.json, /run/udev.
	FeatureGDS Feature = "gds"
	// FeatureMOFED is RDMA through Mellanox OFED: /dev/infiniband/uverbs*, rdma_cm.
	FeatureMOFED Feature = "mofed"
	// FeatureGDRCopy is GDRCopy: /dev/gdrdrv.
	FeatureGDRCopy Feature = "gdrcopy"
	// FeatureNVSwitch is the NVSwitch nodes: /dev/nvidia-nvswitchctl, /dev/nvidia-nvswitch*.
	FeatureNVSwitch Feature = "nvswitch"
)

// FeatureEnv maps each feature to its variable, in the order features are
// reported.
var FeatureEnv = []struct {
	Feature Feature
	Env     string
}{
	{FeatureGDS, "NVIDIA_GDS"},
	{FeatureMOFED, "NVIDIA_MOFED"},
	{FeatureGDRCopy, "NVIDIA_GDRCOPY"},
	{FeatureNVSwitch, "NVIDIA_NVSWITCH"},
}

// EnvIMEXChannels lists the IMEX channels a container asks for.
const EnvIMEXChannels = "NVIDIA_IMEX_CHANNELS"

// featuresFrom reads the gated features: exactly "enabled" switches one on,
// as in NVIDIA's runtime; any other value leaves it off.
func featuresFrom(env map[string]string) []Feature {
	var out []Feature
	for _, f := range FeatureEnv {
		if env[f.Env] == "enabled" {
			out = append(out, f.Feature)
		}
	}
	return out
}

// ParseIMEXChannels reads NVIDIA_IMEX_CHANNELS: a comma list of channel
// numbers, "all", or "none"/"void"/"" for none.
func ParseIMEXChannels(value string) (Selection, error) {
	switch v := strings.TrimSpace(value); v {
	case "", "none", "void":
		return Selection{Mode: Void}, nil
	case "all":
		return Selection{Mode: All}, nil
	}
	sel := Selection{Mode: List}
	seen := map[string]bool{}
	for item := range strings.SplitSeq(value, ",") {
		item = strings.TrimSpace(item)
		n, err := strconv.ParseUint(item, 10, 31)
		if err != nil {
			return Selection{}, fmt.Errorf("%w: %s=%q: %q is not a channel number (give numbers such as 0,1, or all)", ErrInvalid, EnvIMEXChannels, value, item)
		}
		id := strconv.FormatUint(n, 10)
		if !seen[id] {
			seen[id] = true
			sel.IDs = append(sel.IDs, id)
		}
	}
	return sel, nil
}
