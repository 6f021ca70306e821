package cdispec

import (
	"testing"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/edits/editstest"
	"github.com/gantry-gpu/gantry/internal/gpu"
)

const (
	majNvidia = editstest.MajNvidia
	majUVM    = editstest.MajUVM
	majCaps   = editstest.MajCaps
)

func testSystem() *gpu.System          { return editstest.System() }
func testInventory() *driver.Inventory { return editstest.Inventory() }

func makeDevRoot(t testing.TB, sys *gpu.System) string { return editstest.MakeDevRoot(t, sys) }
