package nvcli

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/request"
)

func TestParse(t *testing.T) {
	opts := []option{
		{long: "flag", short: 'f'},
		{long: "other", short: 'o'},
		{long: "value", short: 'v', arg: requiredArg, metavar: "V"},
		{long: "user", short: 'u', arg: optionalArg, metavar: "U"},
	}
	for _, tc := range []struct {
		name     string
		args     []string
		inOrder  bool
		sets     []setting
		operands []string
		err      string
	}{
		{name: "long with =", args: []string{"--value=x", "a"}, sets: []setting{{"value", "x", true}}, operands: []string{"a"}},
		{name: "long with next word", args: []string{"--value", "x"}, sets: []setting{{"value", "x", true}}},
		{name: "empty value kept", args: []string{"--value="}, sets: []setting{{"value", "", true}}},
		{name: "short attached", args: []string{"-vx"}, sets: []setting{{"value", "x", true}}},
		{name: "short next word", args: []string{"-v", "x"}, sets: []setting{{"value", "x", true}}},
		{name: "cluster", args: []string{"-fo"}, sets: []setting{{name: "flag"}, {name: "other"}}},
		{name: "cluster ending in value", args: []string{"-fvx"}, sets: []setting{{name: "flag"}, {"value", "x", true}}},
		{name: "optional absent", args: []string{"--user", "a"}, sets: []setting{{name: "user"}}, operands: []string{"a"}},
		{name: "optional present", args: []string{"--user=1:2"}, sets: []setting{{"user", "1:2", true}}},
		{name: "short optional attached", args: []string{"-u7"}, sets: []setting{{"user", "7", true}}},
		{name: "interleaved", args: []string{"a", "--flag", "b"}, sets: []setting{{name: "flag"}}, operands: []string{"a", "b"}},
		{name: "in order stops at operand", args: []string{"--flag", "cmd", "--other"}, inOrder: true, sets: []setting{{name: "flag"}}, operands: []string{"cmd", "--other"}},
		{name: "double dash", args: []string{"--", "--flag"}, operands: []string{"--flag"}},
		{name: "dash alone is an operand", args: []string{"-"}, operands: []string{"-"}},
		{name: "unknown long", args: []string{"--nope"}, err: "unknown option --nope"},
		{name: "unknown long with value", args: []string{"--nope=1"}, err: "unknown option --nope"},
		{name: "unknown short", args: []string{"-x"}, err: "unknown option -x"},
		{name: "flag with value", args: []string{"--flag=1"}, err: "option --flag takes no value"},
		{name: "missing value", args: []string{"--value"}, err: "option --value needs a value: --value=V"},
		{name: "missing short value", args: []string{"-v"}, err: "option -v (--value) needs a value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sets, operands, err := parse(tc.args, opts, tc.inOrder)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				if !errors.As(err, new(usageError)) {
					t.Fatalf("error %T is not a usage error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(sets, tc.sets) || !reflect.DeepEqual(operands, tc.operands) {
				t.Fatalf("got %+v %q, want %+v %q", sets, operands, tc.sets, tc.operands)
			}
		})
	}
	for _, a := range []string{"--help", "-?", "--usage"} {
		if _, _, err := parse([]string{a}, opts, false); !errors.As(err, new(helpRequested)) {
			t.Errorf("%s: %v, want help", a, err)
		}
	}
	for _, a := range []string{"--version", "-V"} {
		if _, _, err := parse([]string{a}, opts, false); !errors.As(err, new(versionRequested)) {
			t.Errorf("%s: %v, want version", a, err)
		}
	}
}

// The exact command line Debian 12's /usr/share/lxc/hooks/nvidia builds for an
// unprivileged container with NVIDIA_VISIBLE_DEVICES=1,
// NVIDIA_DRIVER_CAPABILITIES=compute,utility and one requirement.
var lxcHookArgs = []string{
	"--user", "configure", "--no-cgroups", "--ldconfig=@/usr/sbin/ldconfig", "--device=1",
	"--compute", "--utility", "--require=cuda>=12.0 brand=tesla", "/usr/lib/x86_64-linux-gnu/lxc/rootfs",
}

func TestParseConfigure(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want configureRequest
		err  string
	}{
		{
			name: "LXC hook",
			args: lxcHookArgs[2:],
			want: configureRequest{
				rootfs: "/usr/lib/x86_64-linux-gnu/lxc/rootfs",
				req: request.Request{
					Devices:      request.Selection{Mode: request.List, IDs: []string{"1"}},
					Capabilities: []driver.Capability{driver.Compute, driver.Utility},
					Requirements: []request.Requirement{mustReq(t, "cuda>=12.0 brand=tesla")},
					MIGConfig:    request.Selection{Mode: request.Void},
					MIGMonitor:   request.Selection{Mode: request.Void},
				},
				noCgroups: true,
				compat:    true,
			},
		},
		{
			name: "no device is none; every capability flag; pid; repeated devices join",
			args: []string{"-p", "42", "-cuvgDn", "--compat32", "/r/"},
			want: configureRequest{
				pid: 42, rootfs: "/r", compat: true,
				req: request.Request{
					Devices:      request.Selection{Mode: request.None},
					Capabilities: driver.AllCapabilities,
					MIGConfig:    request.Selection{Mode: request.Void},
					MIGMonitor:   request.Selection{Mode: request.Void},
				},
			},
		},
		{
			name: "devices joined, MIG, sockets, compat off, no-devbind",
			args: []string{"--device=0", "-d", "GPU-abc,1:0", "--mig-config=all", "--mig-monitor", "all", "--no-persistenced",
				"--no-fabricmanager", "--cuda-compat-mode=disabled", "--no-devbind", "/rootfs"},
			want: configureRequest{
				rootfs: "/rootfs", noDevbind: true, noPersistenced: true, noFabricmanager: true,
				req: request.Request{
					Devices:    request.Selection{Mode: request.List, IDs: []string{"0", "GPU-abc", "1:0"}},
					MIGConfig:  request.Selection{Mode: request.All},
					MIGMonitor: request.Selection{Mode: request.All},
				},
			},
		},
		{
			name: "void",
			args: []string{"--device=void", "/r"},
			want: configureRequest{rootfs: "/r", compat: true, req: request.Request{
				Devices: request.Selection{Mode: request.Void}, MIGConfig: request.Selection{Mode: request.Void}, MIGMonitor: request.Selection{Mode: request.Void}}},
		},
		{
			// NVIDIA's runtime hook passes NVIDIA_IMEX_CHANNELS on as
			// --imex-channel=LIST: the channels are asked for, not refused.
			name: "imex channels, repeated and joined",
			args: []string{"--imex-channel=0,2", "--imex-channel", "2", "/r"},
			want: configureRequest{rootfs: "/r", compat: true, req: request.Request{
				Devices: request.Selection{Mode: request.None}, MIGConfig: request.Selection{Mode: request.Void}, MIGMonitor: request.Selection{Mode: request.Void},
				IMEXChannels: request.Selection{Mode: request.List, IDs: []string{"0", "2"}}}},
		},
		{
			name: "all imex channels",
			args: []string{"--imex-channel=all", "/r"},
			want: configureRequest{rootfs: "/r", compat: true, req: request.Request{
				Devices: request.Selection{Mode: request.None}, MIGConfig: request.Selection{Mode: request.Void}, MIGMonitor: request.Selection{Mode: request.Void},
				IMEXChannels: request.Selection{Mode: request.All}}},
		},
		{name: "missing rootfs", args: []string{"--compute"}, err: "missing ROOTFS"},
		{name: "relative rootfs", args: []string{"rootfs"}, err: `ROOTFS "rootfs": want the container root's absolute path`},
		{name: "root rootfs", args: []string{"//"}, err: `ROOTFS "//"`},
		{name: "two rootfs", args: []string{"/a", "/b"}, err: "one ROOTFS expected"},
		{name: "bad pid", args: []string{"--pid=abc", "/r"}, err: "--pid=abc: want a process id"},
		{name: "zero pid", args: []string{"--pid=0", "/r"}, err: "--pid=0"},
		{name: "bad device", args: []string{"--device=0;1", "/r"}, err: "--device"},
		{name: "CDI name", args: []string{"--device=nvidia.com/gpu=0", "/r"}, err: "is a CDI name"},
		{name: "bad requirement", args: []string{"--require=cuda>>12", "/r"}, err: "--require"},
		{name: "empty ldconfig", args: []string{"--ldconfig=@", "/r"}, err: "--ldconfig=@"},
		{name: "bad compat mode", args: []string{"--cuda-compat-mode=yes", "/r"}, err: "want ldconfig, mount or disabled"},
		{name: "bad MIG list", args: []string{"--mig-config=0", "/r"}, err: "--mig-config"},
		{name: "bad imex", args: []string{"--imex-channel=x", "/r"}, err: `--imex-channel="x": "x" is not a channel number`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sets, operands, err := parse(tc.args, configureOptions, false)
			if err != nil {
				t.Fatal(err)
			}
			got, err := parseConfigure(sets, operands)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Fatalf("error is not one line: %q", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func mustReq(t *testing.T, expr string) request.Requirement {
	t.Helper()
	r, err := request.ParseRequirement("--require", expr)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParseList(t *testing.T) {
	all := listRequest{devices: request.Selection{Mode: request.All}, listDevices: true,
		libs: true, bins: true, ipcs: true, firmware: true, compat32: true}
	void := request.Selection{Mode: request.Void}
	for _, tc := range []struct {
		name string
		args []string
		want listRequest
		err  string
	}{
		{name: "nothing lists everything", want: all},
		{name: "libraries only", args: []string{"--libraries"}, want: listRequest{libs: true, migConfig: void, migMonitor: void}},
		{name: "short cluster", args: []string{"-lbif", "--compat32"}, want: listRequest{libs: true, bins: true, ipcs: true, firmware: true, compat32: true, migConfig: void, migMonitor: void}},
		{name: "devices", args: []string{"-d", "0", "--device=1"}, want: listRequest{listDevices: true, devices: request.Selection{Mode: request.List, IDs: []string{"0", "1"}}, migConfig: void, migMonitor: void}},
		{name: "sockets", args: []string{"--ipcs", "--no-persistenced", "--no-fabricmanager"}, want: listRequest{ipcs: true, noPersistenced: true, noFabricmanager: true, migConfig: void, migMonitor: void}},
		{name: "MIG", args: []string{"--mig-config=all"}, want: listRequest{migConfig: request.Selection{Mode: request.All}, migMonitor: void}},
		{name: "operand", args: []string{"x"}, err: `unexpected argument "x"`},
		{name: "imex", args: []string{"--imex-channel=1"}, err: "IMEX"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sets, operands, err := parse(tc.args, listOptions, false)
			if err != nil {
				t.Fatal(err)
			}
			got, err := parseList(sets, operands)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestGlobals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want globals
		err  string
	}{
		{args: []string{"--user", "--debug=/tmp/x", "-k", "-n", "--root=/run/nvidia/driver", "--no-create-imex-channels"},
			want: globals{debug: "/tmp/x", root: "/run/nvidia/driver"}},
		{args: []string{"--user=1000:1000", "--ldcache=/etc/ld.so.cache"}, want: globals{user: "1000:1000", ldcache: "/etc/ld.so.cache"}},
		{args: []string{"--user=1000"}, want: globals{user: "1000"}},
		{args: []string{"--user=root"}, err: "--user=root: want UID or UID:GID"},
		{args: []string{"--user=1:"}, err: "--user=1:"},
		{args: []string{"--root=driver"}, err: "--root=driver: the driver root must be an absolute path"},
	} {
		sets, _, err := parse(tc.args, globalOptions, true)
		if err != nil {
			t.Fatal(err)
		}
		got, err := parseGlobals(sets)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: got %+v, %v; want %+v", tc.args, got, err, tc.want)
		}
	}
}
