package gpu

import (
	"errors"
	"testing"
)

func TestParsePCIAddress(t *testing.T) {
	tests := []struct {
		in, nvml, sysfs string
	}{
		{"00000000:18:00.0", "00000000:18:00.0", "0000:18:00.0"},
		{"0000:9d:00.0", "00000000:9D:00.0", "0000:9d:00.0"},
		{"3b:00.0", "00000000:3B:00.0", "0000:3b:00.0"},
		{"0001:C3:1F.7", "00000001:C3:1F.7", "0001:c3:1f.7"},
		{"0:0:0.0", "00000000:00:00.0", "0000:00:00.0"},
	}
	for _, tt := range tests {
		a, err := ParsePCIAddress(tt.in)
		if err != nil || a.String() != tt.nvml || a.SysfsName() != tt.sysfs {
			t.Errorf("ParsePCIAddress(%q) = %s %s %v, want %s %s", tt.in, a, a.SysfsName(), err, tt.nvml, tt.sysfs)
		}
	}
	for _, bad := range []string{"", "18:00", "18.0", "000000000:18:00.0", "0000:100:00.0", "0000:18:20.0", "0000:18:00.8", "0000:18:00.", "a:b:c:d.0", "0000:zz:00.0", "0000:-1:00.0", "0000:+1:00.0"} {
		if a, err := ParsePCIAddress(bad); !errors.Is(err, ErrBadPCIAddress) {
			t.Errorf("ParsePCIAddress(%q) = %s, %v; want ErrBadPCIAddress", bad, a, err)
		}
	}
	x, _ := ParsePCIAddress("0000:1b:00.0")
	y, _ := ParsePCIAddress("0000:9d:00.0")
	z, _ := ParsePCIAddress("0001:00:00.0")
	if x.Compare(y) != -1 || y.Compare(z) != -1 || z.Compare(x) != 1 || x.Compare(x) != 0 {
		t.Error("Compare does not order by domain, bus, device, function")
	}
}

func TestMIGCapMinors(t *testing.T) {
	// From a real /proc/driver/nvidia-caps/mig-minors: gpu0/gi0/access 3,
	// gpu0/gi0/ci0/access 4, gpu0/gi0/ci1/access 5, then gpu0/gi1/access 12
	// (after ci0..ci7 of gi0); each GPU has 15 GIs x 9 entries = 135 minors.
	tests := []struct{ gpu, gi, ci, giMinor, ciMinor int }{
		{0, 0, 0, 3, 4},
		{0, 0, 1, 3, 5},
		{0, 0, 7, 3, 11},
		{0, 1, 0, 12, 13},
		{1, 0, 0, 138, 139},
		{31, 14, 7, 3 + 31*135 + 14*9, 3 + 31*135 + 14*9 + 8},
	}
	for _, tt := range tests {
		g, c, err := MIGCapMinors(tt.gpu, tt.gi, tt.ci)
		if err != nil || g != tt.giMinor || c != tt.ciMinor {
			t.Errorf("MIGCapMinors(%d, %d, %d) = %d, %d, %v; want %d, %d", tt.gpu, tt.gi, tt.ci, g, c, err, tt.giMinor, tt.ciMinor)
		}
	}
	for _, bad := range [][3]int{{32, 0, 0}, {0, 15, 0}, {0, 0, 8}, {-1, 0, 0}} {
		if _, _, err := MIGCapMinors(bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("MIGCapMinors%v accepted", bad)
		}
	}
	if MIGCapPath(21) != "/dev/nvidia-caps/nvidia-cap21" {
		t.Error(MIGCapPath(21))
	}
}

func TestComputeCapability(t *testing.T) {
	for in, arch := range map[string]string{"9.0": "Hopper", "8.0": "Ampere", "8.6": "Ampere", "8.9": "Ada Lovelace", "7.0": "Volta", "7.5": "Turing", "10.0": "Blackwell", "12.0": "Blackwell", "6.1": "Pascal", "5.2": "Maxwell", "3.7": "Kepler", "99.0": ""} {
		maj, min, err := ParseComputeCapability(in)
		if err != nil || ArchitectureOf(maj, min) != arch {
			t.Errorf("%s: %d.%d %v -> %q, want %q", in, maj, min, err, ArchitectureOf(maj, min), arch)
		}
	}
	for _, bad := range []string{"", "9", "9.", ".0", "9.0.1", "x.0", "-1.0", "+9.0", "9.-0", "100.0", " 9.0"} {
		if _, _, err := ParseComputeCapability(bad); err == nil {
			t.Errorf("ParseComputeCapability(%q) accepted", bad)
		}
	}
}

func TestBrands(t *testing.T) {
	if len(Brands) != 17 || Brands[0] != "unknown" || Brands[14] != "nvidia" || !IsBrand("tesla") || IsBrand("Tesla") {
		t.Errorf("Brands = %v", Brands)
	}
}

func FuzzParsePCIAddress(f *testing.F) {
	for _, s := range []string{"00000000:18:00.0", "0000:9d:00.0", "3b:00.0", "0:0:0.0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParsePCIAddress(s)
		if err != nil {
			return
		}
		// Both printed forms must read back as the same address.
		for _, form := range []string{a.String(), a.SysfsName()} {
			b, err := ParsePCIAddress(form)
			if err != nil || b != a {
				t.Fatalf("%q -> %+v -> %q -> %+v, %v", s, a, form, b, err)
			}
		}
	})
}
