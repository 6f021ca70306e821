package request

import (
	"errors"
	"strings"
	"testing"
)

// NVIDIA_REQUIRE_CUDA of official nvidia/cuda images (x86_64), as published
// in NVIDIA's container-images repository.
const (
	// nvidia/cuda:11.8.0-base-ubuntu22.04
	requireCUDA118 = "cuda>=11.8 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 brand=nvidia,driver>=470,driver<471 brand=nvidiartx,driver>=470,driver<471 brand=geforce,driver>=470,driver<471 brand=geforcertx,driver>=470,driver<471 brand=quadro,driver>=470,driver<471 brand=quadrortx,driver>=470,driver<471 brand=titan,driver>=470,driver<471 brand=titanrtx,driver>=470,driver<471"
	// nvidia/cuda:12.2.2-base-ubuntu22.04
	requireCUDA122 = "cuda>=12.2 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 brand=nvidia,driver>=470,driver<471 brand=nvidiartx,driver>=470,driver<471 brand=geforce,driver>=470,driver<471 brand=geforcertx,driver>=470,driver<471 brand=quadro,driver>=470,driver<471 brand=quadrortx,driver>=470,driver<471 brand=titan,driver>=470,driver<471 brand=titanrtx,driver>=470,driver<471 brand=tesla,driver>=525,driver<526 brand=unknown,driver>=525,driver<526 brand=nvidia,driver>=525,driver<526 brand=nvidiartx,driver>=525,driver<526 brand=geforce,driver>=525,driver<526 brand=geforcertx,driver>=525,driver<526 brand=quadro,driver>=525,driver<526 brand=quadrortx,driver>=525,driver<526 brand=titan,driver>=525,driver<526 brand=titanrtx,driver>=525,driver<526"
	// nvidia/cuda:12.2.2-base-ubuntu22.04 on arm64 (sbsa)
	requireCUDA122arm = "cuda>=12.2"
	// nvidia/cuda:12.4.1-base-ubuntu22.04
	requireCUDA124 = "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 brand=nvidia,driver>=470,driver<471 brand=nvidiartx,driver>=470,driver<471 brand=geforce,driver>=470,driver<471 brand=geforcertx,driver>=470,driver<471 brand=quadro,driver>=470,driver<471 brand=quadrortx,driver>=470,driver<471 brand=titan,driver>=470,driver<471 brand=titanrtx,driver>=470,driver<471 brand=tesla,driver>=525,driver<526 brand=unknown,driver>=525,driver<526 brand=nvidia,driver>=525,driver<526 brand=nvidiartx,driver>=525,driver<526 brand=geforce,driver>=525,driver<526 brand=geforcertx,driver>=525,driver<526 brand=quadro,driver>=525,driver<526 brand=quadrortx,driver>=525,driver<526 brand=titan,driver>=525,driver<526 brand=titanrtx,driver>=525,driver<526 brand=tesla,driver>=535,driver<536 brand=unknown,driver>=535,driver<536 brand=nvidia,driver>=535,driver<536 brand=nvidiartx,driver>=535,driver<536 brand=geforce,driver>=535,driver<536 brand=geforcertx,driver>=535,driver<536 brand=quadro,driver>=535,driver<536 brand=quadrortx,driver>=535,driver<536 brand=titan,driver>=535,driver<536 brand=titanrtx,driver>=535,driver<536"
)

var (
	// H100 80GB HBM3 as NVML reports it (brand NVIDIA, compute capability 9.0).
	h100 = GPU{ID: "0 (GPU-9d1d48bf-04bc-2c4f-d59d-2ead2773c340)", Arch: "9.0", Brand: "nvidia"}
	t4   = GPU{ID: "0 (GPU-t4)", Arch: "7.5", Brand: "tesla"}
	v100 = GPU{ID: "1 (GPU-v100)", Arch: "7.0", Brand: "tesla"}
	rtx  = GPU{ID: "0 (GPU-3090)", Arch: "8.6", Brand: "geforcertx"}
	grid = GPU{ID: "1 (GPU-grid)", Arch: "7.5", Brand: "grid"}

	host550 = Host{CUDA: "12.4", Driver: "550.54.15"}
	host580 = Host{CUDA: "13.0", Driver: "580.159.04"} // the H100 test machine
	host535 = Host{CUDA: "12.2", Driver: "535.104.05"}
	host545 = Host{CUDA: "12.3", Driver: "545.23.08"}
	host520 = Host{CUDA: "11.8", Driver: "520.61.05"}
	host470 = Host{CUDA: "11.4", Driver: "470.256.02"}
)

func TestCheckRealImages(t *testing.T) {
	tests := []struct {
		name    string
		expr    string
		host    Host
		gpus    []GPU
		wantErr string // "" for satisfied; else a substring of the error
	}{
		{"12.4 on 550 H100", requireCUDA124, host550, []GPU{h100}, ""},
		{"12.4 on 580 H100", requireCUDA124, host580, []GPU{h100}, ""},
		{"11.8 on 580 H100", requireCUDA118, host580, []GPU{h100}, ""},
		{"12.2 on 550 H100", requireCUDA122, host550, []GPU{h100}, ""},
		// Forward compatibility: 12.4 images run on the 535 branch of
		// data-center GPUs (brand nvidia for H100) through cuda-compat.
		{"12.4 on 535 H100 (compat)", requireCUDA124, host535, []GPU{h100}, ""},
		{"12.4 on 535 T4 (compat)", requireCUDA124, host535, []GPU{t4}, ""},
		{"12.4 on 545 T4: no compat branch", requireCUDA124, host545, []GPU{t4}, "host CUDA driver supports 12.3 (driver 545.23.08)"},
		{"12.4 on 545 H100", requireCUDA124, host545, []GPU{h100}, "GPU 0 (GPU-9d1d48bf-04bc-2c4f-d59d-2ead2773c340) is brand nvidia"},
		{"12.2 on 545", requireCUDA122, host545, []GPU{t4}, ""},
		{"11.8 on 470 T4 (compat)", requireCUDA118, host470, []GPU{t4}, ""},
		{"12.4 on 470 T4 (compat)", requireCUDA124, host470, []GPU{t4}, ""},
		{"11.8 on 470 GeForce RTX", requireCUDA118, host470, []GPU{rtx}, ""},
		{"11.8 on 470: GRID brand not listed", requireCUDA118, host470, []GPU{t4, grid}, "GPU 1 (GPU-grid) is brand grid"},
		{"11.8 on 520", requireCUDA118, host520, []GPU{t4}, ""},
		{"12.2 on 520 tesla", requireCUDA122, host520, []GPU{t4}, "supports 11.8 (driver 520.61.05)"},
		{"12.2 arm on 535", requireCUDA122arm, host535, []GPU{h100}, ""},
		{"12.2 arm on 520", requireCUDA122arm, host520, []GPU{h100}, `NVIDIA_REQUIRE_CUDA "cuda>=12.2"`},
		// No GPU selected (NVIDIA_VISIBLE_DEVICES=none): brand holds.
		{"12.4 on 535, no GPU", requireCUDA124, host535, nil, ""},
		{"12.4 on 545, no GPU", requireCUDA124, host545, nil, "(31 alternatives)"},
		{"12.4, host CUDA unknown", requireCUDA124, Host{Driver: "545.23.08"}, []GPU{t4}, ""},
		{"every GPU judged", "arch>=8.0", host550, []GPU{h100, v100}, "GPU 1 (GPU-v100) is brand tesla, arch 7.0"},
		{"arch on H100", "arch>=9.0", host550, []GPU{h100}, ""},
		{"arch without GPU holds", "arch>=10.0", host550, nil, ""},
		{"brand case-insensitive", "brand=NVIDIA", host550, []GPU{h100}, ""},
		{"brand !=", "brand!=geforcertx", host550, []GPU{rtx}, "brand geforcertx"},
		{"key case-insensitive", "CUDA>=12.4", host550, nil, ""},
		{"driver three numbers", "driver>=535.104.5", host535, nil, ""},
		{"driver leading zero equal", "driver=535.104.5", host535, nil, ""},
		{"driver upper bound", "driver<535.104", host535, nil, "NVIDIA_DISABLE_REQUIRE=true"},
		{"empty expression holds", "  ", host550, nil, ""},
		{"commas only hold", ", ,", host550, nil, ""},
		{"tab separates terms", "cuda>=99\tdriver>=1", host550, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Check([]Requirement{{Var: "NVIDIA_REQUIRE_CUDA", Expr: tt.expr}}, tt.host, tt.gpus)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Check = %v, want satisfied", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Check = nil, want error containing %q", tt.wantErr)
			}
			if !errors.Is(err, ErrUnsatisfied) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Check = %v, want ErrUnsatisfied containing %q", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err)
			}
		})
	}
}

func TestCheckErrorMessage(t *testing.T) {
	err := Check([]Requirement{{Var: "NVIDIA_REQUIRE_CUDA", Expr: "cuda>=12.6"}}, host550, nil)
	want := `NVIDIA_REQUIRE_CUDA "cuda>=12.6": host CUDA driver supports 12.4 (driver 550.54.15); upgrade the driver, use an image built for an older CUDA, or set NVIDIA_DISABLE_REQUIRE=true`
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v\nwant  %s", err, want)
	}
	var ue *UnsatisfiedError
	if !errors.As(err, &ue) || ue.Requirement.Var != "NVIDIA_REQUIRE_CUDA" || ue.GPU != nil {
		t.Errorf("errors.As = %+v", ue)
	}
}

func TestCheckStopsAtFirstFailingRequirement(t *testing.T) {
	reqs := []Requirement{
		{Var: "NVIDIA_REQUIRE_A", Expr: "cuda>=1.0"},
		{Var: "NVIDIA_REQUIRE_B", Expr: "driver>=999"},
		{Var: "NVIDIA_REQUIRE_C", Expr: "cuda>=99"},
	}
	err := Check(reqs, host550, []GPU{h100})
	if err == nil || !strings.HasPrefix(err.Error(), "NVIDIA_REQUIRE_B ") {
		t.Fatalf("err = %v", err)
	}
}

func TestCheckInvalid(t *testing.T) {
	for _, tt := range []struct {
		expr string
		host Host
	}{
		{"cuda==12.4", host550},
		{"foo>=1", host550},
		{"cuda>=12.4a", host550},
		{"cuda>=12.4", Host{CUDA: "twelve"}},
	} {
		err := Check([]Requirement{{Var: "NVIDIA_REQUIRE_X", Expr: tt.expr}}, tt.host, nil)
		if !errors.Is(err, ErrInvalid) || errors.Is(err, ErrUnsatisfied) || !strings.Contains(err.Error(), "NVIDIA_REQUIRE_X") {
			t.Errorf("Check(%q, %+v) = %v, want ErrInvalid naming the variable", tt.expr, tt.host, err)
		}
	}
}

func TestParseRequirement(t *testing.T) {
	r, err := ParseRequirement("NVIDIA_REQUIRE_CUDA", requireCUDA124)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Alternatives) != 31 {
		t.Fatalf("alternatives = %d, want 31", len(r.Alternatives))
	}
	if got := r.Alternatives[0]; len(got) != 1 || got[0] != (Constraint{KeyCUDA, OpGreaterEqual, "12.4"}) {
		t.Errorf("first = %v", got)
	}
	want := []Constraint{{KeyBrand, OpEqual, "titanrtx"}, {KeyDriver, OpGreaterEqual, "535"}, {KeyDriver, OpLess, "536"}}
	if got := r.Alternatives[30]; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("last = %v, want %v", got, want)
	}

	bad := map[string]string{
		"cuda==12.4":  "use =",
		"cuda=>12.4":  "unknown operator",
		"cuda>=":      "no value",
		">=12.4":      "no key",
		"cuda":        "no key",
		"gpu>=1":      "unknown key",
		"brand>tesla": "= or != only",
		"cuda>=v12":   "start with a digit",
		"driver<4 70": "", // "70" alone is a term without an operator
		"arch>=.9":    "start with a digit",
	}
	for expr, frag := range bad {
		_, err := ParseRequirement("NVIDIA_REQUIRE_X", expr)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), frag) || !strings.Contains(err.Error(), "NVIDIA_REQUIRE_X=") {
			t.Errorf("ParseRequirement(%q) = %v, want ErrInvalid containing %q", expr, err, frag)
		}
	}
}

func TestCompareVersions(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"12.4", "12.4", 0},
		{"12.4", "12.4.0", 0},
		{"12.4.0.0", "12.4", 0},
		{"12.4", "12.4.1", -1},
		{"12.10", "12.9", 1},
		{"535.104.05", "535.104.5", 0},
		{"470.57.02", "470", 1},
		{"470.57.02", "471", -1},
		{"12..4", "12.4", 0},
		{"12.", "12", 0},
		{"007", "7", 0},
		{"99999999999999999999999", "1", 1},
	}
	for _, tt := range tests {
		got, err := CompareVersions(tt.a, tt.b)
		if err != nil || got != tt.want {
			t.Errorf("CompareVersions(%q, %q) = %d, %v; want %d", tt.a, tt.b, got, err, tt.want)
		}
		back, _ := CompareVersions(tt.b, tt.a)
		if back != -tt.want {
			t.Errorf("CompareVersions(%q, %q) = %d, not antisymmetric", tt.b, tt.a, back)
		}
	}
	for _, bad := range []string{"", ".4", "12a", "v12", "12-4", " 12"} {
		if _, err := CompareVersions(bad, "1"); err == nil {
			t.Errorf("CompareVersions(%q) accepted", bad)
		}
	}
}

func TestMajorMinor(t *testing.T) {
	good := map[string]string{"9.0.176": "9.0", "9.0": "9.0", "10": "10.0", "v11.2.1": "11.2", "12.4.1-rc1": "12.4", "8.0.61+build": "8.0"}
	for in, want := range good {
		if got, err := majorMinor(in); err != nil || got != want {
			t.Errorf("majorMinor(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "9.0.1.2", "9..0", "-1", "9.+1"} {
		if got, err := majorMinor(bad); err == nil {
			t.Errorf("majorMinor(%q) = %q, accepted", bad, got)
		}
	}
}

func BenchmarkCheckCUDA124(b *testing.B) {
	r, err := ParseRequirement("NVIDIA_REQUIRE_CUDA", requireCUDA124)
	if err != nil {
		b.Fatal(err)
	}
	reqs := []Requirement{r}
	gpus := []GPU{h100, h100, h100, h100, h100, h100, h100, h100}
	for b.Loop() {
		if err := Check(reqs, host535, gpus); err != nil {
			b.Fatal(err)
		}
	}
}
