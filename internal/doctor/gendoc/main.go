// Command gendoc writes docs/troubleshooting.md from internal/doctor's
// Checks: go generate ./internal/doctor runs it.
package main

import (
	"fmt"
	"os"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
	"github.com/gantry-gpu/gantry/internal/doctor"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gendoc FILE (docs/troubleshooting.md)")
		os.Exit(2)
	}
	if err := atomicfile.Write(os.Args[1], []byte(doctor.Troubleshooting()), atomicfile.Options{Mode: 0o644}); err != nil {
		fmt.Fprintln(os.Stderr, "gendoc:", err)
		os.Exit(1)
	}
}
