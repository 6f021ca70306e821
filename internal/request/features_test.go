package request

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// featureCase is one row of TestFeaturesAndIMEX's table.
type featureCase struct {
	name       string
	env        []string
	privileged bool
	noEnv      bool // accept-env-unprivileged = false
	features   []Feature
	imex       string
	err        string
}

// featureTable is TestFeaturesAndIMEX's table (also read by the fast path's agreement test).
func featureTable() []featureCase {
	return []featureCase{
		{name: "all four", env: []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_GDS=enabled", "NVIDIA_MOFED=enabled", "NVIDIA_GDRCOPY=enabled", "NVIDIA_NVSWITCH=enabled"},
			features: []Feature{FeatureGDS, FeatureMOFED, FeatureGDRCopy, FeatureNVSwitch}},
		{name: "only enabled counts", env: []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_GDS=true", "NVIDIA_MOFED=Enabled", "NVIDIA_GDRCOPY=1"}},
		{name: "no GPU, no features", env: []string{"NVIDIA_GDS=enabled", "NVIDIA_IMEX_CHANNELS=0"}},
		{name: "imex list", env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_IMEX_CHANNELS=2, 0,2"}, imex: "list 2,0"},
		{name: "imex all", env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_IMEX_CHANNELS=all"}, imex: "all"},
		{name: "imex none", env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_IMEX_CHANNELS=none"}},
		{name: "imex bad", env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_IMEX_CHANNELS=0,x"}, err: `NVIDIA_IMEX_CHANNELS="0,x"`},
		{name: "imex path", env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_IMEX_CHANNELS=../../../etc/shadow"}, err: "not a channel number"},
		{name: "imex negative", env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_IMEX_CHANNELS=-1"}, err: "not a channel number"},
		{name: "imex unprivileged without env trust", env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_IMEX_CHANNELS=0"}, privileged: true, noEnv: true, imex: "list 0"},
	}
}

func (tc featureCase) input() (Input, Options) {
	opts := DefaultOptions()
	opts.AcceptEnvWhenUnprivileged = !tc.noEnv
	return Input{Env: tc.env, Privileged: tc.privileged}, opts
}

func TestFeaturesAndIMEX(t *testing.T) {
	for _, tc := range featureTable() {
		t.Run(tc.name, func(t *testing.T) {
			req, err := Parse(tc.input())
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrInvalid) {
					t.Fatalf("err %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(req.Features, tc.features) {
				t.Errorf("features %v, want %v", req.Features, tc.features)
			}
			imex := ""
			switch req.IMEXChannels.Mode {
			case All:
				imex = "all"
			case List:
				imex = "list " + strings.Join(req.IMEXChannels.IDs, ",")
			}
			if imex != tc.imex {
				t.Errorf("IMEX channels %q, want %q", imex, tc.imex)
			}
		})
	}
}
