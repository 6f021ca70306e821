package doctor

import "github.com/gantry-gpu/gantry/internal/request"

// visibleAsks reports whether NVIDIA_VISIBLE_DEVICES=v asks for GPU
// devices, as package request reads it: "void", "none" and empty (or only
// commas and spaces) ask for none, in any case; "none" still has the
// driver files injected, but no device node and no device rule, so there
// is nothing to lose to a daemon-reload. A value request refuses counts
// as asking: the runtime fails on it, and that is worth a look.
func visibleAsks(v string) bool {
	sel, cdi, err := request.ParseSelection(request.EnvVisibleDevices, v)
	if err != nil {
		return true
	}
	return len(cdi) > 0 || sel.Mode == request.All || sel.Mode == request.List
}

// nothingAsked explains a set NVIDIA_VISIBLE_DEVICES that asks for no
// device, for the evidence.
func nothingAsked(v string) string {
	if v == "" || visibleAsks(v) {
		return ""
	}
	return " (NVIDIA_VISIBLE_DEVICES void, none or empty asks for no GPU device)"
}
