package request

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
)

// imexMountChannels reads the IMEX channels of the volume-mount list:
// mounts at VolumeMountsRoot/imex/N, which NVIDIA's device plugin adds for
// its imex section with the volume-mounts strategy (and NVIDIA's runtime
// reads). A name that is not a channel number is an error naming it.
func imexMountChannels(dests []string) ([]string, error) {
	root := VolumeMountsRoot + "/imex/"
	var ids []string
	for _, d := range dests {
		d = path.Clean(d)
		item, ok := strings.CutPrefix(d, root)
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(item, 10, 31)
		if err != nil {
			return nil, fmt.Errorf("%w: mount %s: %q is not an IMEX channel number; mount at %sN", ErrInvalid, d, item, root)
		}
		if id := strconv.FormatUint(n, 10); !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// addIMEXMounts adds the channels of the volume-mount list to the request's.
func (req *Request) addIMEXMounts(dests []string) error {
	ids, err := imexMountChannels(dests)
	if err != nil || len(ids) == 0 || req.IMEXChannels.Mode == All {
		return err
	}
	req.IMEXChannels.Mode = List
	for _, id := range ids {
		if !slices.Contains(req.IMEXChannels.IDs, id) {
			req.IMEXChannels.IDs = append(req.IMEXChannels.IDs, id)
		}
	}
	return nil
}
