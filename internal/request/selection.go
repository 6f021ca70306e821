package request

import (
	"errors"
	"fmt"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/parser"
)

// ErrInvalid is wrapped by every error about a malformed value in a
// container's env, annotations or mounts.
var ErrInvalid = errors.New("invalid GPU request")

const selectionHelp = "use all, none, void or a comma list of GPU indices (0), GPU UUIDs (GPU-...), PCI bus ids (0000:3b:00.0), MIG devices (0:1 or MIG-...) or CDI names (nvidia.com/gpu=0)"

// ParseSelection parses a device list such as NVIDIA_VISIBLE_DEVICES.
// name is only used in errors. Items are separated by commas; spaces around
// items and empty items are ignored. "void" anywhere, or no items at all,
// gives Void; otherwise the first "all" or "none" decides the mode; these
// three words are matched without regard to case.
//
// Fully qualified CDI names (vendor.com/class=name) are returned apart, in
// cdi; the rest must look like a device ID or the list is refused with an
// ErrInvalid error that names the variable, the value and the fix.
func ParseSelection(name, value string) (sel Selection, cdi []string, err error) {
	var ids []string
	seen := map[string]bool{}
	mode := List
	for item := range strings.SplitSeq(value, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		switch {
		case strings.EqualFold(item, "void"):
			return Selection{Mode: Void}, nil, nil
		case strings.EqualFold(item, "all"):
			if mode == List {
				mode = All
			}
			continue
		case strings.EqualFold(item, "none"):
			if mode == List {
				mode = None
			}
			continue
		}
		if strings.Contains(item, "=") {
			if _, _, _, perr := parser.ParseQualifiedName(item); perr != nil {
				return Selection{}, nil, fmt.Errorf("%w: %s=%q: %q is not a CDI device name (%v); %s", ErrInvalid, name, value, item, perr, selectionHelp)
			}
			if !seen[item] {
				seen[item] = true
				cdi = append(cdi, item)
			}
			continue
		}
		if !IsDeviceID(item) {
			return Selection{}, nil, fmt.Errorf("%w: %s=%q: %q is not a device; %s", ErrInvalid, name, value, item, selectionHelp)
		}
		if !seen[item] {
			seen[item] = true
			ids = append(ids, item)
		}
	}
	switch {
	case mode != List:
		return Selection{Mode: mode}, cdi, nil
	case len(ids) > 0:
		return Selection{Mode: List, IDs: ids}, cdi, nil
	}
	return Selection{Mode: Void}, cdi, nil
}

// IsDeviceID reports whether id has the shape of a device ID NVIDIA's tools
// accept: a GPU index, a GPU UUID, a PCI bus id, a MIG "GPU:INSTANCE" pair
// or a MIG UUID (either format). It does not say whether the device exists.
func IsDeviceID(id string) bool {
	switch {
	case id == "":
		return false
	case isDigits(id):
		return len(id) <= 9
	case hasPrefixFold(id, "GPU-"):
		return len(id) > 4 && allOf(id[4:], isUUIDChar)
	case hasPrefixFold(id, "MIG-"):
		// New MIG UUIDs are MIG-<uuid>; old ones MIG-GPU-<uuid>/<gi>/<ci>.
		return len(id) > 4 && allOf(id[4:], func(c byte) bool { return isUUIDChar(c) || c == '/' })
	}
	if a, b, ok := strings.Cut(id, ":"); ok && isDigits(a) && isDigits(b) && len(a) <= 9 && len(b) <= 9 {
		return true
	}
	return isPCIBusID(id)
}

// isPCIBusID matches DOMAIN:BUS:DEVICE.FUNCTION in hex ("0000:3b:00.0",
// NVML's "00000000:3B:00.0").
func isPCIBusID(s string) bool {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return false
	}
	dev, fn, ok := strings.Cut(parts[2], ".")
	if !ok {
		return false
	}
	for _, p := range []struct {
		s   string
		max int
	}{{parts[0], 8}, {parts[1], 2}, {dev, 2}, {fn, 1}} {
		if p.s == "" || len(p.s) > p.max || !allOf(p.s, isHex) {
			return false
		}
	}
	return true
}

func isDigits(s string) bool {
	return s != "" && allOf(s, func(c byte) bool { return c >= '0' && c <= '9' })
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func isUUIDChar(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-'
}

func allOf(s string, f func(byte) bool) bool {
	for i := 0; i < len(s); i++ {
		if !f(s[i]) {
			return false
		}
	}
	return true
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// ParseMIGSelection parses NVIDIA_MIG_CONFIG_DEVICES or
// NVIDIA_MIG_MONITOR_DEVICES. NVIDIA's container CLI accepts only "all"
// there; empty, "void" and "none" mean not asked.
func ParseMIGSelection(name, value string) (Selection, error) {
	sel, cdi, err := ParseSelection(name, value)
	if err == nil && len(cdi) == 0 && (sel.Mode == All || sel.Mode == Void || sel.Mode == None) {
		if sel.Mode == None {
			sel.Mode = Void
		}
		return sel, nil
	}
	return Selection{}, fmt.Errorf("%w: %s=%q: only \"all\" is supported (the MIG capability covers every visible MIG-capable GPU); set it to all or unset it", ErrInvalid, name, value)
}
