package labels

import (
	"strconv"
	"strings"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// engines is a row of the MIG profile tables: what `nvidia-smi mig -lgip`
// lists for a GPU instance profile (SMs, copy engines, decoders, encoders,
// JPEG and OFA engines).
type engines struct{ sm, ce, dec, enc, jpeg, ofa int }

func (e engines) attrs() MIGAttributes {
	return MIGAttributes{Multiprocessors: e.sm, CopyEngines: e.ce, Decoders: e.dec, Encoders: e.enc, JPEGs: e.jpeg, OFAs: e.ofa}
}

// ampere is the A100's GPU instance profiles (SXM4 and PCIe, 40 and 80 GB;
// 108 SMs of which MIG uses 98). 1g.10gb is the A100 40GB's double-memory
// slice (with a decoder) and the A100 80GB's smallest one (without).
var ampere = map[string]engines{
	"1g.5gb":    {14, 1, 0, 0, 0, 0},
	"1g.5gb.me": {14, 1, 1, 0, 1, 1},
	"2g.10gb":   {28, 2, 1, 0, 0, 0},
	"3g.20gb":   {42, 3, 2, 0, 0, 0},
	"4g.20gb":   {56, 4, 2, 0, 0, 0},
	"7g.40gb":   {98, 7, 5, 0, 1, 1},

	"1g.10gb.me": {14, 1, 1, 0, 1, 1},
	"1g.20gb":    {14, 1, 1, 0, 0, 0},
	"2g.20gb":    {28, 2, 1, 0, 0, 0},
	"3g.40gb":    {42, 3, 2, 0, 0, 0},
	"4g.40gb":    {56, 4, 2, 0, 0, 0},
	"7g.80gb":    {98, 7, 5, 0, 1, 1},
}

// hopper is the SXM H100/H200's GPU instance profiles (132 SMs) by shape,
// since the memory in their names differs between the 80, 94, 96, 141 and
// 144 GB parts.
var hopper = map[string]engines{
	"1g":    {16, 1, 1, 0, 1, 0},
	"1g.me": {16, 1, 1, 0, 1, 1},
	"1g.2x": {26, 1, 1, 0, 1, 0}, // the double-memory 1g slice (1g.20gb on 80 GB)
	"2g":    {32, 2, 2, 0, 2, 0},
	"3g":    {60, 3, 3, 0, 3, 0},
	"4g":    {64, 4, 4, 0, 4, 0},
	"7g":    {132, 8, 7, 0, 7, 1},
}

// lookupProfile finds a GPU instance profile ("3g.20gb", "1g.10gb.me") of
// the parent's kind in the tables.
func lookupProfile(parent gpu.Device, profile string) (MIGAttributes, bool) {
	major, minor, err := gpu.ParseComputeCapability(parent.ComputeCapability)
	if err != nil {
		return MIGAttributes{}, false
	}
	parentGB := float64(parent.MemoryMiB) / 1024
	switch {
	case major == 8 && minor == 0 && strings.Contains(parent.Name, "A100"):
		if profile == "1g.10gb" {
			if parentGB > 48 {
				return engines{14, 1, 0, 0, 0, 0}.attrs(), true
			}
			return engines{14, 1, 1, 0, 0, 0}.attrs(), true
		}
		e, ok := ampere[profile]
		return e.attrs(), ok
	case major == 9 && !strings.Contains(parent.Name, "PCIe"):
		slices, rest, _ := strings.Cut(profile, ".")
		shape := slices
		mem, me, _ := strings.Cut(rest, ".")
		switch {
		case me == "me":
			shape += ".me"
		case slices == "1g":
			gb, err := strconv.Atoi(strings.TrimSuffix(mem, "gb"))
			if err != nil {
				return MIGAttributes{}, false
			}
			// The small 1g slice has about an eighth of the memory, the
			// large one about a quarter.
			if float64(gb*7) > parentGB {
				shape += ".2x"
			}
		}
		e, ok := hopper[shape]
		return e.attrs(), ok
	}
	return MIGAttributes{}, false
}
