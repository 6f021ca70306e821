package createserver

import (
	"strings"
	"testing"
)

// TestRefuseCaller: the create server serves a caller only when it could do
// the work itself; each narrower caller is refused with a reason naming
// what differs.
func TestRefuseCaller(t *testing.T) {
	server := procFacts{ns: [4]string{"mnt:[1]", "cgroup:[2]", "pid:[3]", "user:[4]"}, capEff: 0x1ffffffffff, seccomp: "2", label: "unconfined"}
	same := server
	same.seccomp = "0"
	for _, tc := range []struct {
		name string
		edit func(*procFacts)
		want string
	}{
		{"same", func(*procFacts) {}, ""},
		{"more capabilities", func(c *procFacts) { c.capEff = 0x3ffffffffff }, ""},
		{"AppArmor profile in unconfined mode", func(c *procFacts) { c.label = "runc (unconfined)" }, ""},
		{"no LSM", func(c *procFacts) { c.label = "" }, "LSM label"},
		{"fewer capabilities", func(c *procFacts) { c.capEff = 0 }, "capabilities"},
		{"one capability less", func(c *procFacts) { c.capEff &^= 1 << 21 }, "capabilities"},
		{"seccomp filter", func(c *procFacts) { c.seccomp = "2" }, "seccomp"},
		{"confined", func(c *procFacts) { c.label = "docker-default (enforce)" }, "LSM label"},
		{"cgroup namespace", func(c *procFacts) { c.ns[1] = "cgroup:[9]" }, "cgroup namespace"},
		{"pid namespace", func(c *procFacts) { c.ns[2] = "pid:[9]" }, "pid namespace"},
		{"user namespace", func(c *procFacts) { c.ns[3] = "user:[9]" }, "user namespace"},
		{"mount namespace", func(c *procFacts) { c.ns[0] = "mnt:[9]" }, "mnt namespace"},
	} {
		c := same
		tc.edit(&c)
		got := server.refuse(c)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: refuse = %q, want %q", tc.name, got, tc.want)
		}
	}
	// A server under an LSM label of its own serves callers under the same.
	selinux := server
	selinux.label = "system_u:system_r:container_runtime_t:s0"
	c := same
	c.label = selinux.label
	if got := selinux.refuse(c); got != "" {
		t.Errorf("same SELinux domain refused: %q", got)
	}
}
