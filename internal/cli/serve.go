package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gantry-gpu/gantry/internal/dockervol"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/drivervol"
	"github.com/gantry-gpu/gantry/internal/gpu/readings"
	"github.com/gantry-gpu/gantry/internal/legacyapi"
)

// DefaultServeAddr is where nvidia-docker-plugin listened (localhost:3476):
// both loopbacks, 127.0.0.1 and [::1] (listenAPI).
const DefaultServeAddr = "localhost:3476"

func init() {
	register(&command{
		name:    "serve",
		summary: "Serve nvidia-docker 1.0's REST API (/docker/cli, /gpu/info, /gpu/status) on port 3476, and its volume plugin",
		help: `Answers the REST API of nvidia-docker-plugin for the tools of that generation:
/docker/cli and /docker/cli/json (the docker run arguments that give a
container the GPUs without any runtime: the device nodes and read-only binds
of the driver at /usr/local/nvidia; ?dev=0+1 picks GPUs by index or UUID),
/gpu/info(/json) and /gpu/status(/json). Every path also answers under /v1.0.

The server is read-only (GET only) and listens on the loopback addresses unless
--allow-remote is given: the API tells anyone who asks what the host's GPUs
and driver are. The default, localhost:3476, is both loopbacks, 127.0.0.1
and [::1]: clients of localhost try [::1] first, so a port left free there
would let any local user answer them in Gantry's place; if another program
holds either, serve refuses to start and names it. It stops on SIGINT or
SIGTERM.

Clients are bounded: a request header must arrive within 5 s and fit in
16 KiB (else 431), an idle connection is closed after 30 s, and at most 256
connections are held: past that the one idle the longest is closed, so idle
clients cannot lock out one with a request (bench/serve-idle.sh).

With --volume-plugin it is nvidia-docker-plugin whole: it also serves
Docker's volume plugin nvidia-docker on the unix socket
<plugin-dir>/nvidia-docker.sock, whose volume nvidia_driver_<driver version>
holds the driver's programs and libraries (bin/, lib/, lib64/, gathered once
per driver version under <volumes-dir>/nvidia_driver/<version>, hard links
of the driver's files where they share a filesystem, and a read-only mount
of its own, so that no container can write to them even without :ro), and
/docker/cli answers as the original did:
--volume-driver=nvidia-docker --volume=nvidia_driver_<version>:/usr/local/nvidia:ro
and the --device flags. Run as root (the socket directory is Docker's):

  sudo gantry serve --volume-plugin &
  docker run $(curl -s localhost:3476/docker/cli?dev=0) IMAGE nvidia-smi

The same binary run as nvidia-docker-plugin serves both with the original's
flags (-l ADDR, -d VOLUMES-DIR, -s PLUGIN-DIR, -v).`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			listen := fs.String("listen", DefaultServeAddr, "address to listen on, HOST:PORT (localhost: both 127.0.0.1 and [::1])")
			allowRemote := fs.Bool("allow-remote", false, "allow a --listen address other than loopback")
			volumePlugin := fs.Bool("volume-plugin", false, "also serve the Docker volume plugin nvidia-docker (nvidia_driver_<version>)")
			pluginDir := fs.String("plugin-dir", dockervol.DefaultSocketDir, "directory of the volume plugin's socket, nvidia-docker.sock")
			volumesDir := fs.String("volumes-dir", dockervol.DefaultVolumesDir, "directory of the volume plugin's volumes")
			return func(e *env, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				if err := checkListen(*listen, *allowRemote); err != nil {
					return usagef("%v", err)
				}
				sys, inv, err := e.host(false)
				if err != nil {
					return err
				}
				var reader legacyapi.Reader
				if strings.HasPrefix(e.cfg.GPUs, "sim") {
					reader = readings.NewSim(sys)
				} else {
					r, unload, err := readings.NewNVML(e.cfg.DriverRoot)
					if err != nil {
						fmt.Fprintf(e.stderr, "gantry serve: warning: GPU readings unavailable, /gpu/status reports N/A: %v\n", err)
					} else {
						reader = r
						defer unload()
					}
				}
				srv := legacyapi.New(legacyapi.Options{
					System: sys, Driver: inv, Reader: reader,
					DevRoot: e.cfg.EffectiveDevRoot(), Logger: e.log,
					VolumePlugin: *volumePlugin,
				})
				ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
				defer stop()
				errc := make(chan error, 2)
				if *volumePlugin {
					ps, err := serveVolumePlugin(e, inv, srv, *pluginDir, *volumesDir, errc)
					if err != nil {
						return err
					}
					defer ps.Close()
				}
				lns, err := listenAPI(*listen)
				if err != nil {
					return err
				}
				hs := legacyapi.NewHTTPServer(srv, legacyapi.DefaultLimits())
				for _, ln := range lns {
					fmt.Fprintf(e.stderr, "gantry serve: listening on http://%s\n", ln.Addr())
					go func() { errc <- fmt.Errorf("serving on %s: %w", ln.Addr(), hs.Serve(ln)) }()
				}
				select {
				case err := <-errc:
					return err
				case <-ctx.Done():
				}
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
					return fmt.Errorf("stopping the server: %w", err)
				}
				return nil
			}
		},
	})
}

// serveVolumePlugin builds this driver's volume and makes it a read-only
// mount (a failure is reported, and Docker's Create of the volume tries
// again) and serves the plugin on its socket, with the REST API's
// /docker/cli/json for the nvidia-docker wrapper; a serving error is sent
// on errc.
func serveVolumePlugin(e *env, inv *driver.Inventory, api http.Handler, pluginDir, volumesDir string, errc chan<- error) (*http.Server, error) {
	store := drivervol.Store{Dir: filepath.Join(volumesDir, dockervol.DriverVolume)}
	if t, err := store.Serve(inv); err != nil {
		fmt.Fprintf(e.stderr, "gantry serve: warning: volume %s: %v\n", dockervol.VolumeName(inv.Version), err)
	} else {
		fmt.Fprintf(e.stderr, "gantry serve: volume %s at %s\n", dockervol.VolumeName(inv.Version), t.Path)
	}
	ln, err := dockervol.Listen(pluginDir)
	if err != nil {
		return nil, fmt.Errorf("volume plugin: %w (give another %s, or run as root)", err, e.flag("--plugin-dir"))
	}
	ps := dockervol.NewHTTPServer(dockervol.New(dockervol.Options{Store: store, Driver: inv, DockerCLI: api, Logger: e.log}))
	fmt.Fprintf(e.stderr, "gantry serve: volume plugin %s on unix://%s\n", dockervol.PluginName, ln.Addr())
	go func() {
		if err := ps.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("volume plugin: %w", err)
		}
	}()
	return ps, nil
}

// listenAPI listens on addr. A host of localhost (the default) means both
// loopbacks, 127.0.0.1 and [::1], on one port: clients of localhost:3476
// (curl, Go) try [::1] first, and any local user could listen there and
// answer them in Gantry's place if the server held 127.0.0.1 only. Where
// the host has no IPv6 loopback nobody can listen on it either, and
// 127.0.0.1 alone is served; where another program holds [::1]'s port, the
// server refuses to start and says so.
func listenAPI(addr string) ([]net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host != "localhost" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("listening on %s: %w (pick another --listen address)", addr, err)
		}
		return []net.Listener{ln}, nil
	}
	for try := 0; ; try++ {
		v4, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			return nil, fmt.Errorf("listening on 127.0.0.1:%s: %w (another program holds the port: find it with `ss -ltnp 'sport = :%s'`, or pick another --listen address)", port, err, port)
		}
		p := strconv.Itoa(v4.Addr().(*net.TCPAddr).Port)
		v6, err := net.Listen("tcp6", net.JoinHostPort("::1", p))
		switch {
		case err == nil:
			return []net.Listener{v4, v6}, nil
		case errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EAFNOSUPPORT):
			// No IPv6 loopback here: nobody else can listen on it.
			return []net.Listener{v4}, nil
		}
		v4.Close()
		if port == "0" && errors.Is(err, syscall.EADDRINUSE) && try < 10 {
			continue // the port picked for 127.0.0.1 is taken on [::1]: pick again
		}
		return nil, fmt.Errorf("listening on [::1]:%s: %w: another program holds the port on the IPv6 loopback, and clients of localhost:%s (curl and Go programs try [::1] first) would reach it instead of Gantry; find it with `ss -ltnp 'sport = :%s'`, or give --listen 127.0.0.1:%s to serve IPv4 only", p, err, p, p, p)
	}
}

// checkListen refuses an address that is not loopback unless remote access
// was asked for; a host name other than localhost counts as remote, as it
// may resolve to anything.
func checkListen(addr string, allowRemote bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q: %v (give HOST:PORT, e.g. %s)", addr, err, DefaultServeAddr)
	}
	if allowRemote {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	shown := host
	if shown == "" {
		shown = "every interface"
	}
	return fmt.Errorf("--listen %q is not a loopback address (%s): the API would be open to the network; use 127.0.0.1, or add --allow-remote", addr, shown)
}
