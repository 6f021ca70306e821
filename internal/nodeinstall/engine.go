package nodeinstall

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gantry-gpu/gantry/internal/engineconfig"
)

// execRoot is where host programs run (the restart command, the
// installed gantry): PID 1's root when this process shares the host's PID
// namespace and that root is HostRoot's (then systemctl sees no chroot and
// does what it is asked, and mounts made on the host since the pod started,
// such as a driver container's /run/nvidia/driver, are seen), else HostRoot.
func (o *Options) execRoot() string {
	if o.HostRoot == "/" {
		return "/"
	}
	var a, b syscall.Stat_t
	if syscall.Stat("/proc/1/root/", &a) == nil && syscall.Stat(o.HostRoot+"/", &b) == nil && a.Dev == b.Dev && a.Ino == b.Ino {
		return "/proc/1/root"
	}
	return o.HostRoot
}

// restartAndWait restarts the engine and waits until it answers CRI with
// (configured) or without Gantry's runtime.
func (o *Options) restartAndWait(ctx context.Context, configured bool) error {
	fmt.Fprintf(o.Log, "restarting %s: %s\n", o.Engine, o.RestartCommand)
	out, err := o.hostCommand(ctx, o.execRoot(), "/bin/sh", "-c", o.RestartCommand)
	if len(out) > 0 {
		fmt.Fprintf(o.Log, "%s", out)
	}
	if err != nil {
		return fmt.Errorf("restart command %q: %w", o.RestartCommand, err)
	}
	return o.waitEngine(ctx, configured, time.Now().Add(o.Timeout))
}

// waitEngine waits until the engine answers a CRI Version call on its
// socket and, for containerd, its CRI Status shows the runtime "nvidia"
// at BinDir's gantry-runtime (configured) or no runtime running it (not):
// what the engine loaded, read from the engine.
func (o *Options) waitEngine(ctx context.Context, configured bool, deadline time.Time) error {
	socket := o.host(o.CRISocket)
	want := filepath.Join(o.BinDir, "gantry-runtime")
	var last error
	for {
		last = o.probe(ctx, socket, want, configured)
		if last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %w", o.Timeout, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(time.Second):
		}
	}
}

var errNotYet = errors.New("not yet")

func (o *Options) probe(ctx context.Context, socket, want string, configured bool) error {
	if st, err := os.Stat(socket); err != nil {
		return fmt.Errorf("CRI socket %s: %w", o.CRISocket, err)
	} else if st.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("CRI socket %s is not a socket", o.CRISocket)
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	ver, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return fmt.Errorf("%s does not answer CRI on %s: %s", o.Engine, o.CRISocket, status.Convert(err).Message())
	}
	if o.Engine != engineconfig.Containerd {
		return nil
	}
	st, err := rt.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		return fmt.Errorf("%s CRI Status on %s: %s", ver.GetRuntimeName(), o.CRISocket, status.Convert(err).Message())
	}
	reg, err := engineconfig.ParseContainerdStatus([]byte(st.GetInfo()["config"]))
	if err != nil {
		return fmt.Errorf("%s on %s: reading its CRI configuration: %w", ver.GetRuntimeName(), o.CRISocket, err)
	}
	rt0, ok := reg.Runtime(engineconfig.DefaultRuntimeName)
	has := ok && rt0.Program == want
	switch {
	case configured && !has:
		return fmt.Errorf("%s %s answers on %s but has not loaded runtime %q running %s (%w: still the old process, or it ignored the drop-in)",
			ver.GetRuntimeName(), ver.GetRuntimeVersion(), o.CRISocket, engineconfig.DefaultRuntimeName, want, errNotYet)
	case !configured && has:
		return fmt.Errorf("%s %s answers on %s but still runs %s for runtime %q (%w)",
			ver.GetRuntimeName(), ver.GetRuntimeVersion(), o.CRISocket, want, engineconfig.DefaultRuntimeName, errNotYet)
	}
	fmt.Fprintf(o.Log, "%s %s answers CRI on %s\n", ver.GetRuntimeName(), ver.GetRuntimeVersion(), o.CRISocket)
	return nil
}

// runtimeHandlers are the CRI runtime handlers (RuntimeClass handlers)
// whose containers run Gantry's binaries: the names configure registers.
var runtimeHandlers = []string{engineconfig.DefaultRuntimeName, "gantry"}

// gpuSandboxes lists the ready pod sandboxes the engine runs with Gantry's
// runtime (namespace/name), whose containers' shims run BinDir's
// gantry-runtime to stop them.
func (o *Options) gpuSandboxes(ctx context.Context) ([]string, error) {
	conn, err := grpc.NewClient("unix://"+o.host(o.CRISocket), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := runtimeapi.NewRuntimeServiceClient(conn).ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{
		Filter: &runtimeapi.PodSandboxFilter{State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}}})
	if err != nil {
		return nil, fmt.Errorf("listing %s's pods on %s: %s", o.Engine, o.CRISocket, status.Convert(err).Message())
	}
	var out []string
	for _, sb := range resp.GetItems() {
		if slices.Contains(runtimeHandlers, sb.GetRuntimeHandler()) {
			out = append(out, sb.GetMetadata().GetNamespace()+"/"+sb.GetMetadata().GetName())
		}
	}
	slices.Sort(out)
	return out, nil
}

// waitGPUPodsGone waits until no ready pod runs with Gantry's runtime, or
// the deadline; it returns those still there.
func (o *Options) waitGPUPodsGone(ctx context.Context, deadline time.Time) []string {
	said := false
	for {
		pods, err := o.gpuSandboxes(ctx)
		if err != nil {
			fmt.Fprintf(o.Log, "%v: cannot tell which pods use the runtime\n", err)
			return nil
		}
		if len(pods) == 0 || time.Now().After(deadline) {
			return pods
		}
		if !said {
			fmt.Fprintf(o.Log, "waiting up to %s for the pods that run with Gantry's runtime to stop: %s\n", time.Until(deadline).Round(time.Second), strings.Join(pods, ", "))
			said = true
		}
		select {
		case <-ctx.Done():
			return pods
		case <-time.After(time.Second):
		}
	}
}
