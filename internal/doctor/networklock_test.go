package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// CRIU's default network lock runs iptables-restore and ip6tables-restore
// from the engine's PATH: WARN (never FAIL) naming what is missing there,
// PASS with both or with a CRIU configuration choosing the lock, SKIP
// without criu on that PATH.
func TestNetworkLock(t *testing.T) {
	h := newHost(t)
	// The PATH judged is the engine's: doctor's own has everything.
	for _, prog := range []string{"criu", "iptables-restore", "ip6tables-restore"} {
		h.write(t, filepath.Join(h.bin, prog), "#!/bin/sh\n")
	}
	sbin, bin := filepath.Join(h.dir, "service/sbin"), filepath.Join(h.dir, "service/bin")
	expect(t, Run(h.opts), CheckNetworkLock, Skip, []string{"no criu in the engine's PATH", "not set up"}, "")

	h.write(t, filepath.Join(sbin, "criu"), "#!/bin/sh\n")
	checks := Run(h.opts)
	if Failed(checks) {
		t.Fatalf("a missing network lock fails doctor:\n%s", dump(checks))
	}
	expect(t, checks, CheckNetworkLock, Warn,
		[]string{"iptables-restore and ip6tables-restore are not in the engine's PATH \"" + h.opts.ServicePATH + "\"", "systemd's default service PATH", "every Kubernetes pod", "bridged Podman or Docker", "criu/runc.conf"},
		"apt-get install iptables")
	c := find(t, checks, CheckNetworkLock)
	if !strings.Contains(c.Fix, "network-lock") {
		t.Errorf("fix %q does not name the network-lock line", c.Fix)
	}

	h.write(t, filepath.Join(sbin, "iptables-restore"), "#!/bin/sh\n")
	c = expect(t, Run(h.opts), CheckNetworkLock, Warn, []string{"ip6tables-restore is not in the engine's PATH"}, "apt-get install iptables")
	if !strings.HasPrefix(c.Evidence, "ip6tables-restore is not") {
		t.Errorf("evidence does not name ip6tables-restore alone as missing: %q", c.Evidence)
	}

	// A network-lock line in CRIU's default configuration: CRIU's choice.
	h.write(t, h.opts.CRIUConfigs[1], "# network-lock iptables\n")
	expect(t, Run(h.opts), CheckNetworkLock, Warn, nil, "")
	h.write(t, h.opts.CRIUConfigs[1], "tcp-established\nnetwork-lock nftables\n")
	expect(t, Run(h.opts), CheckNetworkLock, Pass, []string{"chooses the network lock"}, "")
	if err := os.Remove(h.opts.CRIUConfigs[1]); err != nil {
		t.Fatal(err)
	}

	h.write(t, filepath.Join(bin, "ip6tables-restore"), "#!/bin/sh\n")
	expect(t, Run(h.opts), CheckNetworkLock, Pass,
		[]string{filepath.Join(sbin, "iptables-restore") + " and " + filepath.Join(bin, "ip6tables-restore")}, "")

	// A running containerd's PATH is the engine's, not systemd's default.
	empty := filepath.Join(h.dir, "containerd-bin")
	h.write(t, filepath.Join(empty, "criu"), "#!/bin/sh\n")
	fakeDaemon(t, h.opts.Proc, "300", "containerd", empty, "", "")
	expect(t, Run(h.opts), CheckNetworkLock, Warn,
		[]string{"iptables-restore and ip6tables-restore are not in the engine's PATH \"" + empty + "\"", "/proc/300/environ"}, "apt-get install iptables")
}
