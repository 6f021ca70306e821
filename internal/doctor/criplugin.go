package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// A CRI socket that does not answer CRI: containerd answers its own
// services there, but its CRI plugin failed to load (a configuration it
// cannot use: containerd 1.6 with no runtime named by
// default_runtime_name, say) or is disabled. The kubelet then has no
// container runtime. containerd says which through its introspection
// service (what `ctr plugins ls` shows): the CRI plugin with its init
// error, or no CRI plugin at all. It is asked without containerd's client
// library: one unary call, its answer read with protowire.

// introspectionPlugins is containerd's introspection method
// (api/services/introspection/v1: PluginsRequest{filters=1} ->
// PluginsResponse{plugins=1}; Plugin{type=1, id=2, init_err=7};
// google.rpc.Status{code=1, message=2}).
const introspectionPlugins = "/containerd.services.introspection.v1.Introspection/Plugins"

// criPlugin is what containerd says of its CRI plugin.
type criPlugin struct {
	// Listed: containerd has a CRI plugin (it is not disabled).
	Listed bool
	// ID is the failed plugin, "TYPE ID"; InitErr its error ("" when it
	// loaded).
	ID, InitErr string
}

// rawCodec passes messages through as bytes, for a call made without
// generated types.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}

// containerdCRIPlugin asks the containerd at socket about its CRI plugin
// (containerd 1.x: io.containerd.grpc.v1 cri; 2.x also io.containerd.cri.v1
// runtime and images).
func containerdCRIPlugin(socket string) (criPlugin, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return criPlugin{}, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, resp := []byte{}, []byte{}
	if err := conn.Invoke(ctx, introspectionPlugins, &req, &resp, grpc.ForceCodec(rawCodec{})); err != nil {
		return criPlugin{}, fmt.Errorf("containerd's introspection service: %s", status.Convert(err).Message())
	}
	var out criPlugin
	err = eachField(resp, func(num protowire.Number, b []byte) error {
		if num != 1 {
			return nil
		}
		var typ, id, initErr string
		if err := eachField(b, func(num protowire.Number, b []byte) error {
			switch num {
			case 1:
				typ = string(b)
			case 2:
				id = string(b)
			case 7:
				return eachField(b, func(num protowire.Number, b []byte) error {
					if num == 2 {
						initErr = string(b)
					}
					return nil
				})
			}
			return nil
		}); err != nil {
			return err
		}
		if typ == "io.containerd.grpc.v1" && id == "cri" || strings.HasPrefix(typ, "io.containerd.cri.v1") {
			out.Listed = true
			if initErr != "" && out.InitErr == "" {
				out.ID, out.InitErr = typ+" "+id, initErr
			}
		}
		return nil
	})
	return out, err
}

// eachField calls fn with each length-delimited field of the protobuf
// message b (the only kind read here), skipping the others.
func eachField(b []byte, fn func(protowire.Number, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if err := fn(num, v); err != nil {
				return err
			}
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}

// criSocketProblem judges a CRI socket that did not answer CRI's Status
// (liveErr): a FAIL when containerd answers there with its CRI plugin
// failed, or disabled where CRI is needed (a Kubernetes node, or
// --cri-socket naming it), or when --cri-socket names a socket that does
// not answer at all; nil to go on with containerd's file.
func criSocketProblem(opts Options, socket string, liveErr error) *Check {
	if liveErr == nil {
		return nil
	}
	explicit := opts.CRISocket != ""
	failed := func(f, format string, a ...any) *Check {
		c := fail(CheckContainerd, f, format, a...)
		return &c
	}
	if st, err := os.Stat(socket); socket == "" || err != nil || st.Mode()&os.ModeSocket == 0 {
		if explicit {
			return failed(fix(fixCRISocket), "--cri-socket %s: not a socket (%v)", socket, err)
		}
		return nil
	}
	if errors.Is(liveErr, errNotContainerd) || status.Code(liveErr) == codes.Unknown && !explicit {
		// Not a gRPC error: the answer was not containerd's (CRI-O's
		// status), which the file check covers.
		return nil
	}
	p, err := containerdCRIPlugin(socket)
	kubelet := isDir(opts.KubeletDir)
	switch {
	case err == nil && p.InitErr != "":
		return failed(fix(fixCRIPluginFailed),
			"the containerd at %s answers, but its CRI plugin (%s) failed to load: %q; CRI calls (the kubelet's, crictl's) get: %s",
			socket, p.ID, p.InitErr, status.Convert(liveErr).Message())
	case err == nil && !p.Listed && (explicit || kubelet):
		why := "--cri-socket names it"
		if kubelet {
			why = "this is a Kubernetes node (" + opts.KubeletDir + ")"
		}
		return failed(fix(fixCRIDisabled, "CONFIG", opts.ContainerdConfig),
			"the containerd at %s answers, but has no CRI plugin (disabled: disabled_plugins), and %s: the kubelet has no container runtime (%s)",
			socket, why, status.Convert(liveErr).Message())
	case err != nil && explicit && !errors.Is(err, context.Canceled):
		return failed(fix(fixCRISocket), "--cri-socket %s does not answer CRI: %s (and %v)", socket, status.Convert(liveErr).Message(), err)
	}
	return nil
}

// containerdStateDir is containerd's state directory from its CRI status
// config: the CRI plugin's stateDir is STATE/io.containerd.grpc.v1.cri
// (containerd 1.x; 2.x: STATE/io.containerd.cri.v1...).
func containerdStateDir(config string) string {
	var c struct {
		StateDir string `json:"stateDir"`
	}
	if json.Unmarshal([]byte(config), &c) != nil || !filepath.IsAbs(c.StateDir) {
		return ""
	}
	if !strings.HasPrefix(filepath.Base(c.StateDir), "io.containerd.") {
		return ""
	}
	return filepath.Dir(c.StateDir)
}
