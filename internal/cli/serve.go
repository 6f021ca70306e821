package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gantry-gpu/gantry/internal/gpu/readings"
	"github.com/gantry-gpu/gantry/internal/legacyapi"
)

// DefaultServeAddr is where nvidia-docker-plugin listened (localhost:3476).
const DefaultServeAddr = "127.0.0.1:3476"

func init() {
	register(&command{
		name:    "serve",
		summary: "Serve nvidia-docker 1.0's REST API (/docker/cli, /gpu/info, /gpu/status) on port 3476",
		help: `Answers the REST API of nvidia-docker-plugin for the tools of that generation:
/docker/cli and /docker/cli/json (the docker run arguments that give a
container the GPUs without any runtime: the device nodes and read-only binds
of the driver at /usr/local/nvidia; ?dev=0+1 picks GPUs by index or UUID),
/gpu/info(/json) and /gpu/status(/json). Every path also answers under /v1.0.

The server is read-only (GET only) and listens on the loopback address unless
--allow-remote is given: the API tells anyone who asks what the host's GPUs
and driver are. It stops on SIGINT or SIGTERM.

Clients are bounded: a request header must arrive within 5 s and fit in
16 KiB (else 431), an idle connection is closed after 30 s, and at most 256
connections are held: past that the one idle the longest is closed, so idle
clients cannot lock out one with a request (bench/serve-idle.sh).`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			listen := fs.String("listen", DefaultServeAddr, "address to listen on, HOST:PORT")
			allowRemote := fs.Bool("allow-remote", false, "allow a --listen address other than loopback")
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
				})
				ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
				defer stop()
				ln, err := net.Listen("tcp", *listen)
				if err != nil {
					return fmt.Errorf("listening on %s: %w (pick another --listen address)", *listen, err)
				}
				hs := legacyapi.NewHTTPServer(srv, legacyapi.DefaultLimits())
				fmt.Fprintf(e.stderr, "gantry serve: listening on http://%s\n", ln.Addr())
				errc := make(chan error, 1)
				go func() { errc <- hs.Serve(ln) }()
				select {
				case err := <-errc:
					return fmt.Errorf("serving on %s: %w", ln.Addr(), err)
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
