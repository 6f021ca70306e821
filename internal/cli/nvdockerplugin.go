package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/gantry-gpu/gantry/internal/dockervol"
	"github.com/gantry-gpu/gantry/internal/version"
)

// NVIDIADockerPluginMain is nvidia-docker-plugin (nvidia-docker 1.0): gantry
// serve --volume-plugin under the original's flags, -l ADDR (the REST API,
// localhost:3476), -d DIR (the volumes, /var/lib/nvidia-docker/volumes),
// -s DIR (the plugin socket's directory, /run/docker/plugins) and -v (the
// version). Other flags are gantry serve's (--driver-root, --gpus,
// --allow-remote, ...).
func NVIDIADockerPluginMain(args []string, stdout, stderr io.Writer) int {
	serve := []string{"serve", "--volume-plugin"}
	for i := 0; i < len(args); i++ {
		name, val, hasVal := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		target := map[string]string{"l": "--listen", "d": "--volumes-dir", "s": "--plugin-dir"}[name]
		switch {
		case !strings.HasPrefix(args[i], "-"):
			// The value of one of gantry serve's flags: its parser checks.
			serve = append(serve, args[i])
		case name == "v" || name == "version":
			fmt.Fprintf(stdout, "NVIDIA Docker plugin: %s (gantry)\n", version.Version)
			return 0
		case name == "h" || name == "help":
			fmt.Fprintf(stdout, `nvidia-docker-plugin: nvidia-docker 1.0's plugin, served by Gantry (gantry serve --volume-plugin).

  -l ADDR   the REST API's address (default localhost:3476; loopback unless --allow-remote)
  -d DIR    where the volumes are kept (default %s)
  -s DIR    the directory of the plugin socket nvidia-docker.sock (default %s)
  -v        print the version

Other flags are gantry serve's: see gantry serve --help.
`, dockervol.DefaultVolumesDir, dockervol.DefaultSocketDir)
			return 0
		case target != "":
			if !hasVal {
				if i+1 >= len(args) {
					fmt.Fprintf(stderr, "nvidia-docker-plugin: %s needs a value\n", args[i])
					return 2
				}
				i++
				val = args[i]
			}
			if name == "l" && strings.HasPrefix(val, ":") {
				// The original took ":3476" as every interface; Gantry
				// listens on loopback unless told otherwise.
				val = "localhost" + val
			}
			serve = append(serve, target, val)
		default:
			serve = append(serve, args[i])
		}
	}
	return mainAs(serve, stdout, stderr, map[string]string{"--plugin-dir": "-s", "--volumes-dir": "-d", "--listen": "-l"})
}
