package shim

import "testing"

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want Invocation
	}{
		{"containerd's create", []string{"--root", "/run/containerd/runc/k8s.io", "--log", "/run/x/log.json", "--log-format", "json", "create", "--bundle", "/run/b", "--pid-file", "/run/b/init.pid", "abc"},
			Invocation{Command: "create", Bundle: "/run/b", ContainerID: "abc", Log: "/run/x/log.json", LogFormat: "json", Globals: 6}},
		{"equals forms", []string{"--log=/l", "--systemd-cgroup", "create", "--bundle=/b/", "--console-socket=/s", "id1"},
			Invocation{Command: "create", Bundle: "/b", ContainerID: "id1", Log: "/l", Globals: 2}},
		{"short bundle flag, relative", []string{"create", "-b", "bundle", "id"},
			Invocation{Command: "create", Bundle: "/work/bundle", ContainerID: "id"}},
		{"no bundle: the working directory", []string{"run", "-d", "id"},
			Invocation{Command: "run", Bundle: "/work", ContainerID: "id"}},
		{"flags after the ID", []string{"create", "id", "--bundle", "/b"},
			Invocation{Command: "create", Bundle: "/b", ContainerID: "id"}},
		{"single-dash long flag", []string{"-root", "/r", "create", "-bundle", "/b", "id"},
			Invocation{Command: "create", Bundle: "/b", ContainerID: "id", Globals: 2}},
		{"value that looks like a subcommand", []string{"--root", "create", "start", "id"},
			Invocation{Command: "start", Globals: 2}},
		{"pass-through", []string{"--root", "/r", "delete", "--force", "id"},
			Invocation{Command: "delete", Globals: 2}},
		{"containerd's checkpoint", []string{"--root", "/r", "--log", "/l", "checkpoint", "--image-path", "/img", "--work-path", "/w", "--leave-running", "id"},
			Invocation{Command: "checkpoint", ContainerID: "id", Log: "/l", Globals: 4, ImagePath: "/img", LeaveRunning: true}},
		{"checkpoint's default image path, pre-dump", []string{"checkpoint", "--pre-dump", "--parent-path", "p", "id"},
			Invocation{Command: "checkpoint", ContainerID: "id", ImagePath: "/work/checkpoint", LeaveRunning: true}},
		{"leave-running=false", []string{"checkpoint", "--leave-running=false", "--image-path=i", "id"},
			Invocation{Command: "checkpoint", ContainerID: "id", ImagePath: "/work/i"}},
		{"restore", []string{"--root", "/r", "restore", "--detach", "--bundle", "b", "--image-path", "/img", "--pid-file", "p", "--work-path", "/w", "id"},
			Invocation{Command: "restore", Bundle: "/work/b", ContainerID: "id", Globals: 2, ImagePath: "/img", Detach: true, PIDFile: "/work/p"}},
		{"version only", []string{"--version"}, Invocation{}},
		{"nothing", nil, Invocation{}},
		{"double dash before ID", []string{"create", "--bundle", "/b", "--", "-weird"},
			Invocation{Command: "create", Bundle: "/b", ContainerID: "-weird"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseArgs(tt.args, "/work")
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("ParseArgs(%q)\n got %+v\nwant %+v", tt.args, got, tt.want)
			}
		})
	}
}

func TestParseArgsErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--root"},
		{"create", "--bundle"},
		{"--log"},
	} {
		if _, err := ParseArgs(args, "/"); err == nil {
			t.Errorf("ParseArgs(%q): no error", args)
		}
	}
}

func FuzzParseArgs(f *testing.F) {
	f.Add("--root\x00/r\x00create\x00--bundle\x00/b\x00id")
	f.Add("run\x00-b=x\x00--\x00id")
	f.Fuzz(func(t *testing.T, s string) {
		var args []string
		for _, a := range splitNUL(s) {
			args = append(args, a)
		}
		inv, err := ParseArgs(args, "/cwd")
		if err == nil && inv.Modifies() && (inv.Bundle == "" || inv.Bundle[0] != '/') {
			t.Fatalf("create without an absolute bundle: %+v", inv)
		}
	})
}

func splitNUL(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}
