// Command gantry inspects GPU hosts and generates CDI specs. See `gantry --help`.
package main

import (
	"os"

	"github.com/gantry-gpu/gantry/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
