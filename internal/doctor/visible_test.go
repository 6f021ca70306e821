package doctor

import "testing"

// NVIDIA_VISIBLE_DEVICES as the contract reads it: void, none and empty
// (any case, spaces, empty items) ask for no device.
func TestVisibleAsks(t *testing.T) {
	for v, want := range map[string]bool{
		"": false, "void": false, "VOID": false, " void ": false, "none": false, "None": false, ",": false, "0,void": false,
		"all": true, "0": true, "0,1": true, "GPU-0f00": true, "nvidia.com/gpu=0": true, "0;1": true,
	} {
		if got := visibleAsks(v); got != want {
			t.Errorf("visibleAsks(%q) = %v, want %v", v, got, want)
		}
	}
}
