package request

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gantry-gpu/gantry/internal/driver"
)

// ParseCapabilities parses a NVIDIA_DRIVER_CAPABILITIES value: a comma
// list of capability names or "all" (which wins over anything beside it).
// Spaces around items and empty items are ignored; an empty list gives
// driver.DefaultCapabilities. The result is deduplicated and in the order of
// driver.AllCapabilities.
//
// An unknown name is an ErrInvalid error, as in NVIDIA's legacy hook; with
// lenient (NVIDIA's CDI mode, which never looks at most names) unknown names
// are dropped and returned in ignored instead.
func ParseCapabilities(value string, lenient bool) (caps []driver.Capability, ignored []string, err error) {
	want := map[driver.Capability]bool{}
	all := false
	for item := range strings.SplitSeq(value, ",") {
		item = strings.TrimSpace(item)
		switch {
		case item == "":
			continue
		case item == "all":
			all = true
			continue
		}
		c, perr := driver.ParseCapability(item)
		if perr != nil {
			if lenient {
				ignored = append(ignored, item)
				continue
			}
			return nil, nil, fmt.Errorf("%w: NVIDIA_DRIVER_CAPABILITIES=%q: %v", ErrInvalid, value, perr)
		}
		want[c] = true
	}
	switch {
	case all:
		return slices.Clone(driver.AllCapabilities), ignored, nil
	case len(want) == 0:
		return ordered(driver.DefaultCapabilities), ignored, nil
	}
	var out []driver.Capability
	for _, c := range driver.AllCapabilities {
		if want[c] {
			out = append(out, c)
		}
	}
	return out, ignored, nil
}

func ordered(caps []driver.Capability) []driver.Capability {
	var out []driver.Capability
	for _, c := range driver.AllCapabilities {
		if slices.Contains(caps, c) {
			out = append(out, c)
		}
	}
	return out
}
