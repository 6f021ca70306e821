package health

import (
	"slices"
	"strings"
	"testing"
)

func TestDefaultPolicy(t *testing.T) {
	p := DefaultPolicy()
	for _, x := range []uint64{13, 31, 43, 45, 68, 109} {
		if !p.Ignores(x) {
			t.Errorf("DefaultPolicy does not ignore application XID %d", x)
		}
	}
	for _, x := range []uint64{48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120} {
		if p.Ignores(x) {
			t.Errorf("DefaultPolicy ignores critical XID %d", x)
		}
	}
	if len(p.IgnoredXIDs) != 6 {
		t.Errorf("DefaultPolicy ignores %d XIDs, want the 6 of NVIDIA's list", len(p.IgnoredXIDs))
	}
	if p.RecoveryQuiet != DefaultRecoveryQuiet {
		t.Errorf("RecoveryQuiet = %v", p.RecoveryQuiet)
	}
	// Each call gets its own map.
	p.IgnoredXIDs[79] = true
	if DefaultPolicy().Ignores(79) {
		t.Error("DefaultPolicy shares its map between calls")
	}
}

func TestParseDisable(t *testing.T) {
	tests := []struct {
		in       string
		disabled bool
		extra    []uint64
		err      string
	}{
		{in: ""},
		{in: " , "},
		{in: "all", disabled: true},
		{in: "ALL", disabled: true},
		{in: "xids", disabled: true},
		{in: "48,xids", disabled: true},
		{in: "79", extra: []uint64{79}},
		{in: " 48 , 79,48 ", extra: []uint64{48, 79}},
		{in: "48,,79", extra: []uint64{48, 79}},
		{in: "48;79", err: `"48;79" is not an XID`},
		{in: "0", err: `"0" is not an XID`},
		{in: "-1", err: `"-1" is not an XID`},
		{in: "none", err: `DP_DISABLE_HEALTHCHECKS="none": "none" is not an XID`},
		{in: "99999999999999999999", err: "is not an XID"},
	}
	for _, tt := range tests {
		disabled, extra, err := ParseDisable(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ParseDisable(%q) error = %v, want one containing %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || disabled != tt.disabled || !slices.Equal(extra, tt.extra) {
			t.Errorf("ParseDisable(%q) = %v, %v, %v; want %v, %v", tt.in, disabled, extra, err, tt.disabled, tt.extra)
		}
	}
}

func TestParseEnable(t *testing.T) {
	all, xids, err := ParseEnable("13, 43")
	if err != nil || all || !slices.Equal(xids, []uint64{13, 43}) {
		t.Errorf("ParseEnable(13, 43) = %v, %v, %v", all, xids, err)
	}
	if all, _, err := ParseEnable("all"); err != nil || !all {
		t.Errorf("ParseEnable(all) = %v, %v", all, err)
	}
	if _, _, err := ParseEnable("x"); err == nil || !strings.Contains(err.Error(), EnvEnableHealthChecks) {
		t.Errorf("ParseEnable(x) error = %v, want one naming %s", err, EnvEnableHealthChecks)
	}
}

func TestPolicyFromEnv(t *testing.T) {
	tests := []struct {
		disable, enable string
		disabled        bool
		ignored         []uint64
		err             bool
	}{
		{ignored: DefaultIgnoredXIDs},
		{disable: "all", disabled: true},
		{disable: "all", enable: "79", disabled: true}, // as NVIDIA's plugin
		{disable: "48,79", ignored: []uint64{13, 31, 43, 45, 48, 68, 79, 109}},
		{enable: "13,43", ignored: []uint64{31, 45, 68, 109}},
		{disable: "48", enable: "48,109", ignored: []uint64{13, 31, 43, 45, 68}},
		{disable: "48", enable: "all", ignored: nil},
		{disable: "4x", err: true},
		{enable: "4x", err: true},
	}
	for _, tt := range tests {
		p, disabled, err := PolicyFromEnv(tt.disable, tt.enable)
		if (err != nil) != tt.err {
			t.Errorf("PolicyFromEnv(%q, %q) error = %v", tt.disable, tt.enable, err)
			continue
		}
		if err != nil {
			continue
		}
		if disabled != tt.disabled {
			t.Errorf("PolicyFromEnv(%q, %q) disabled = %v", tt.disable, tt.enable, disabled)
		}
		if disabled {
			continue
		}
		var got []uint64
		for x, on := range p.IgnoredXIDs {
			if on {
				got = append(got, x)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, tt.ignored) {
			t.Errorf("PolicyFromEnv(%q, %q) ignores %v, want %v", tt.disable, tt.enable, got, tt.ignored)
		}
		if p.RecoveryQuiet != DefaultRecoveryQuiet {
			t.Errorf("RecoveryQuiet = %v", p.RecoveryQuiet)
		}
	}
}

func TestDescribeXID(t *testing.T) {
	if got := DescribeXID(79); got != "XID 79 (GPU has fallen off the bus)" {
		t.Errorf("DescribeXID(79) = %q", got)
	}
	if got := DescribeXID(999); got != "XID 999" {
		t.Errorf("DescribeXID(999) = %q", got)
	}
	for _, x := range []uint64{13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120} {
		if !strings.Contains(DescribeXID(x), "(") {
			t.Errorf("XID %d has no description", x)
		}
	}
}

func FuzzParseDisable(f *testing.F) {
	for _, s := range []string{"", "all", "48,79", " xids ", "1,a", "18446744073709551615"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		disabled, extra, err := ParseDisable(s)
		if err != nil && (disabled || extra != nil) {
			t.Fatalf("ParseDisable(%q) returned results with error %v", s, err)
		}
		if disabled && extra != nil {
			t.Fatalf("ParseDisable(%q) disabled with extra XIDs %v", s, extra)
		}
		for _, x := range extra {
			if x == 0 {
				t.Fatalf("ParseDisable(%q) returned XID 0", s)
			}
		}
	})
}
