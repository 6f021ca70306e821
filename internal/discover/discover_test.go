package discover

import (
	"errors"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

func TestGPUsBackends(t *testing.T) {
	c := config.Default()
	c.GPUs = "sim:a100x2-mig"
	sys, err := GPUs(c, true)
	if err != nil || sys.Backend != "sim:a100x2-mig" || len(sys.Devices) != 2 {
		t.Fatalf("GPUs(sim:a100x2-mig) = %+v, %v", sys, err)
	}
	c.GPUs = "opencl"
	if _, err := GPUs(c, true); err == nil {
		t.Fatal("unknown backend accepted")
	}
}

func TestDriver(t *testing.T) {
	c := config.Default()
	c.DriverRoot = filepath.Join(t.TempDir(), "none")
	if _, err := Driver(c); !errors.Is(err, driver.ErrNoDriver) {
		t.Fatalf("Driver(empty root) = %v, want ErrNoDriver", err)
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: cannot build a fake driver root")
	}
	c.DriverRoot = filepath.Join(t.TempDir(), "driver")
	if _, err := fakedriver.Build(c.DriverRoot, fakedriver.Options{Version: "550.54.15", GPUs: 2}); err != nil {
		t.Fatal(err)
	}
	inv, err := Driver(c)
	if err != nil || inv.Version != "550.54.15" || len(inv.Libraries) == 0 {
		t.Fatalf("Driver(fake root) = %+v, %v", inv, err)
	}
}
