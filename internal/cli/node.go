package cli

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gantry-gpu/gantry/internal/engineconfig"
	"github.com/gantry-gpu/gantry/internal/kubeapi"
	"github.com/gantry-gpu/gantry/internal/nodeinstall"
)

// nodeFlags are the flags node install and node uninstall share.
type nodeFlags struct {
	o                               nodeinstall.Options
	engine, nodeName, label, onStop string
	wait                            bool
}

func (f *nodeFlags) register(fs *flag.FlagSet, install bool) {
	fs.StringVar(&f.o.HostRoot, "host-root", nodeinstall.DefaultHostRoot, "where this process sees the host's / (a hostPath volume of /); / when run on the host itself")
	fs.StringVar(&f.engine, "runtime", "containerd", "the node's engine: containerd or crio")
	fs.StringVar(&f.o.BinDir, "bin-dir", nodeinstall.DefaultBinDir, "host directory of Gantry's binaries (GKE: a writable one such as /home/kubernetes/bin/gantry)")
	fs.StringVar(&f.o.ConfigFile, "config-file", "", "the engine's main configuration on the host (containerd: "+engineconfig.DefaultPath(engineconfig.Containerd)+")")
	fs.StringVar(&f.o.DropIn, "drop-in", "", "the drop-in the runtime is written to (containerd: "+engineconfig.DefaultContainerdDropIn+"; crio: "+engineconfig.DefaultPath(engineconfig.CRIO)+")")
	fs.StringVar(&f.o.CDISpec, "cdi-spec", nodeinstall.DefaultCDISpec, "host path of the CDI spec to generate (\"\" for none)")
	fs.StringVar(&f.o.StateDir, "state-dir", nodeinstall.DefaultStateDir, "host directory of the install record (the originals uninstall puts back)")
	fs.StringVar(&f.o.CRISocket, "cri-socket", "", "the engine's CRI socket on the host (containerd: /run/containerd/containerd.sock; crio: /var/run/crio/crio.sock)")
	fs.StringVar(&f.o.RestartCommand, "restart-command", "", "shell command that restarts the engine, run in the host's root (default: systemctl restart containerd|crio)")
	fs.DurationVar(&f.o.Timeout, "timeout", nodeinstall.DefaultTimeout, "how long the engine may take to answer CRI after a restart")
	fs.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "the Node to label and report Events on (default $NODE_NAME; none: no API calls)")
	fs.StringVar(&f.label, "ready-label", nodeinstall.DefaultReadyLabel, "the Node label set to true once the node is set up (the device plugin DaemonSets select on it)")
	if install {
		fs.StringVar(&f.o.SourceDir, "source-dir", nodeinstall.DefaultSourceDir, "where the binaries to install are (the image's /usr/bin)")
		fs.StringVar(&f.o.EngineBinary, "executable-path", "", "the engine's program on the host, which checks the configuration before it is written (default: found on the host's PATH)")
		fs.BoolVar(&f.o.EnableCDI, "enable-cdi", false, "also turn on containerd's CDI support (enable_cdi)")
		fs.StringVar(&f.o.GantryConfig, "gantry-config", "", "host path of the Gantry configuration the installed gantry reads for cdi generate (default: the host's "+"/etc/gantry/config.toml)")
		fs.StringVar(&f.o.DriverRoot, "driver-root", "", "where the driver is on the host: /, /usr/local/nvidia's parent layout, /run/nvidia/driver (default: the Gantry configuration's, else /)")
		fs.BoolVar(&f.wait, "wait", false, "after installing, stay until SIGTERM, then act as --on-stop says (the DaemonSet's container)")
		fs.StringVar(&f.onStop, "on-stop", "auto", "with --wait, on SIGTERM: uninstall, keep, or auto (uninstall when the pod's DaemonSet is deleted, keep on a rolling update)")
	}
}

// node is the Kubernetes side, nil without a node name.
func (f *nodeFlags) node() (*nodeinstall.Node, *kubeapi.Client, error) {
	if f.nodeName == "" {
		return nil, nil, nil
	}
	c, err := kubeapi.FromEnvironment()
	if err != nil {
		return nil, nil, fmt.Errorf("--node-name %s: %w", f.nodeName, err)
	}
	return &nodeinstall.Node{Client: c, Name: f.nodeName, Label: f.label}, c, nil
}

func (f *nodeFlags) options(e *env) (nodeinstall.Options, error) {
	eng, err := engineconfig.ParseEngine(f.engine)
	if err != nil {
		return f.o, usagef("--runtime: %v", err)
	}
	f.o.Engine = eng
	f.o.Log = e.stderr
	return f.o, f.o.Defaults()
}

func init() {
	register(&command{
		name:     "node install",
		summary:  "Set this Kubernetes node up for GPU containers (the installer DaemonSet's command)",
		noConfig: true,
		help: `Does on a node what make install and gantry runtime configure do by hand, from a
privileged pod that sees the host's / at --host-root:
  - records the original bytes of every file it may change (--state-dir), once;
  - copies gantry, gantry-runtime, gantry-cdi-hook and NVIDIA's names (links) into
    --bin-dir, each through a temporary file renamed into place (an upgrade replaces
    them in place; a create running meanwhile sees the old binary or the new);
  - runs that gantry in the host's root: runtime configure (containerd: --drop-in;
    CRI-O: its crio.conf.d drop-in), which has the host's engine program check what
    it writes, and cdi generate --output --cdi-spec;
  - restarts the engine (--restart-command, in the host's root; PID 1's when the pod
    has hostPID, so that systemctl works) and waits until it answers CRI with the
    runtime loaded (containerd's CRI Status shows "nvidia" running the new path);
  - labels the Node --ready-label=true.
If the engine does not come back healthy, the old files go back, the engine is
restarted again, and the reason goes to stderr and to a Warning Event on the Node.
Run again, it replaces the binaries and restarts nothing when the configuration is
already in place.

  gantry node install --host-root /host --wait          (the DaemonSet's container)
  gantry node install --host-root / --runtime crio      (on the host itself)`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			var f nodeFlags
			f.register(fs, true)
			return func(e *env, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				o, err := f.options(e)
				if err != nil {
					return err
				}
				switch f.onStop {
				case "auto", "uninstall", "keep":
				default:
					return usagef("--on-stop %q: use auto, uninstall or keep", f.onStop)
				}
				node, client, err := f.node()
				if err != nil {
					return err
				}
				ctx := context.Background()
				start := time.Now()
				res, err := nodeinstall.Install(ctx, o)
				if err == nil {
					err = node.SetReady(ctx, true)
				}
				if err != nil {
					if node != nil {
						if eerr := node.Event(ctx, "Warning", "GantryInstallFailed", err.Error()); eerr != nil {
							fmt.Fprintf(e.stderr, "gantry node install: posting the Event: %v\n", eerr)
						}
					}
					return err
				}
				msg := fmt.Sprintf("Gantry installed in %s for %s in %.1f s", o.BinDir, o.Engine, time.Since(start).Seconds())
				if res.Changed {
					msg += fmt.Sprintf(" (%s restarted, answered after %.1f s)", o.Engine, res.Restart.Seconds())
				}
				fmt.Fprintln(e.stderr, msg)
				if node != nil {
					_ = node.Event(ctx, "Normal", "GantryInstalled", msg)
					fmt.Fprintf(e.stderr, "node %s labelled %s=true\n", node.Name, node.Label)
				}
				if !f.wait {
					return nil
				}
				sig := make(chan os.Signal, 1)
				signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
				s := <-sig
				uninstall := f.onStop == "uninstall"
				if f.onStop == "auto" {
					ns, pod := os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME")
					if client == nil || ns == "" || pod == "" {
						fmt.Fprintf(e.stderr, "%s: --on-stop auto needs NODE_NAME, POD_NAMESPACE and POD_NAME to find the DaemonSet; keeping the node set up\n", s)
					} else if gone, err := nodeinstall.OwnerGone(ctx, client, ns, pod); err != nil && !gone {
						fmt.Fprintf(e.stderr, "%s: cannot tell whether the DaemonSet is deleted (%v); keeping the node set up\n", s, err)
					} else {
						if err != nil {
							fmt.Fprintf(e.stderr, "%s: the installer's access is revoked (%v): its release is being deleted\n", s, err)
						}
						uninstall = gone
					}
				}
				if !uninstall {
					fmt.Fprintf(e.stderr, "%s: keeping the node set up (the next install replaces the binaries in place)\n", s)
					return nil
				}
				fmt.Fprintf(e.stderr, "%s: the DaemonSet is gone: uninstalling\n", s)
				return runUninstall(ctx, e, o, node)
			}
		},
	})
	register(&command{
		name:     "node uninstall",
		summary:  "Undo gantry node install: the engine's files back byte for byte, binaries and spec removed",
		noConfig: true,
		help: `Reads the record gantry node install kept in --state-dir: takes the Node's
--ready-label off, writes every file it changed back as it was (or removes it when
it did not exist), restarts the engine and waits until it answers CRI without the
runtime, then removes the binaries, the CDI spec and the record. Running containers
keep running. Without a record there is nothing to undo. Give the same --host-root,
--runtime and --state-dir as the install.

  gantry node uninstall --host-root /host`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			var f nodeFlags
			f.register(fs, false)
			return func(e *env, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				o, err := f.options(e)
				if err != nil {
					return err
				}
				node, _, err := f.node()
				if err != nil {
					return err
				}
				return runUninstall(context.Background(), e, o, node)
			}
		},
	})
}

func init() {
	register(&command{
		name:     "node remove-installer",
		usage:    "NAMESPACE/DAEMONSET",
		summary:  "Delete the node installer DaemonSet and wait while each node uninstalls (the chart's pre-delete hook)",
		noConfig: true,
		help: `Deletes the DaemonSet with foreground propagation and waits until it is gone, that
is until each of its pods has uninstalled on SIGTERM (gantry node install --wait) and
exited. Run before the rest of the installer's objects go (its ServiceAccount and
ClusterRole, which the pods need to take the Node's label off): the chart's
pre-delete hook Job runs it on helm uninstall. Without Helm, kubectl does the same:
kubectl delete daemonset -n kube-system gantry-node-installer --cascade=foreground.

  gantry node remove-installer kube-system/gantry-node-installer`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			timeout := fs.Duration("timeout", 10*time.Minute, "how long to wait for the pods to uninstall")
			return func(e *env, args []string) error {
				if len(args) != 1 || !strings.Contains(args[0], "/") {
					return usagef("give the DaemonSet as NAMESPACE/NAME")
				}
				ns, name, _ := strings.Cut(args[0], "/")
				c, err := kubeapi.FromEnvironment()
				if err != nil {
					return err
				}
				return nodeinstall.RemoveDaemonSet(context.Background(), c, ns, name, *timeout, func(s string) { fmt.Fprintln(e.stderr, s) })
			}
		},
	})
}

func runUninstall(ctx context.Context, e *env, o nodeinstall.Options, node *nodeinstall.Node) error {
	start := time.Now()
	// The label first, so that the plugins stop before the runtime goes; an
	// API server that no longer lets us in (the release being deleted)
	// does not stop the node's uninstall.
	if err := node.SetReady(ctx, false); err != nil {
		fmt.Fprintf(e.stderr, "gantry node uninstall: %v; uninstalling anyway\n", err)
	}
	res, err := nodeinstall.Uninstall(ctx, o)
	if err != nil {
		if node != nil {
			_ = node.Event(ctx, "Warning", "GantryUninstallFailed", err.Error())
		}
		return err
	}
	msg := fmt.Sprintf("Gantry uninstalled from %s in %.1f s", o.BinDir, time.Since(start).Seconds())
	if res.Changed {
		msg += fmt.Sprintf(" (%s restarted with its original configuration, answered after %.1f s)", o.Engine, res.Restart.Seconds())
	}
	if len(res.KeptFor) > 0 {
		msg += fmt.Sprintf("; the binaries in %s stay for pods still running with the runtime (%s): run gantry node uninstall again once they are gone", o.BinDir, strings.Join(res.KeptFor, ", "))
		fmt.Fprintln(e.stderr, msg)
		if node != nil {
			_ = node.Event(ctx, "Warning", "GantryBinariesKept", msg)
		}
		return nil
	}
	fmt.Fprintln(e.stderr, msg)
	if node != nil {
		_ = node.Event(ctx, "Normal", "GantryUninstalled", msg)
	}
	return nil
}
