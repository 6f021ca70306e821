package cluster

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPluginsRefuseOverlap: one GPU, one owner, on the live cluster with
// both plugins (up.sh --dra). The DRA plugin switched to publish every GPU,
// the device plugin's too, refuses to start (its log and a GPUOwnerConflict
// Event on the Node name the device plugin's GPUs) while the device plugin
// keeps running with its GPUs; then the device plugin switched to offer
// every GPU refuses the same way while the DRA plugin, restored, keeps
// publishing. Each is restored; TestDRABesideDevicePlugin shows the
// disjoint split handing no GPU out twice.
func TestPluginsRefuseOverlap(t *testing.T) {
	k := newDRA(t)
	host := k.hostGPUs()
	dp, _ := strconv.Atoi(k.allocatable())
	draGPUs := 0
	for _, d := range k.draDevices() {
		if d.Type == "gpu" {
			draGPUs++
		}
	}
	if dp == 0 || draGPUs == 0 {
		t.Skipf("needs both plugins on the node (%d nvidia.com/gpu, %d DRA GPUs): up.sh --dra on a node of 2 GPUs or more", dp, draGPUs)
	}
	all := make([]string, len(host))
	for i := range host {
		all[i] = strconv.Itoa(i)
	}
	envOf := func(ds, name string) string {
		return k.must("get", "daemonset", "-n", "kube-system", ds, "-o",
			`jsonpath={.spec.template.spec.containers[0].env[?(@.name=="`+name+`")].value}`)
	}
	events := func() string {
		out, _ := k.run("get", "events", "-n", "default", "--field-selector", "reason=GPUOwnerConflict,involvedObject.name="+nodeName,
			"-o", `jsonpath={range .items[*]}{.source.component}: {.message}{"\n"}{end}`)
		return out
	}
	logs := func(label string) string {
		var b strings.Builder
		for _, prev := range []bool{true, false} {
			args := []string{"logs", "-n", "kube-system", "-l", "app.kubernetes.io/name=" + label, "--tail=50"}
			if prev {
				args = append(args, "--previous")
			}
			out, _ := k.run(args...)
			b.WriteString(out)
		}
		return b.String()
	}
	draDevices, dpDevices := envOf("gantry-dra", "GANTRY_DRA_DEVICES"), envOf("gantry", "GANTRY_DEVICES")
	if draDevices == "" || dpDevices == "" {
		t.Fatalf("the DaemonSets do not split the GPUs: GANTRY_DRA_DEVICES=%q GANTRY_DEVICES=%q", draDevices, dpDevices)
	}
	// GPUs only: on simulated GPUs the plugin also publishes the node's
	// IMEX channels, whatever GANTRY_DRA_DEVICES says.
	gpusOf := func(d []draDevice) int {
		n := 0
		for _, x := range d {
			if x.Type == "gpu" {
				n++
			}
		}
		return n
	}
	restoreDRA := func() {
		k.setDRAEnv(func(d []draDevice) string {
			if n := gpusOf(d); n != draGPUs {
				return strconv.Itoa(n) + " GPUs published"
			}
			return ""
		}, "GANTRY_DRA_DEVICES="+draDevices)
	}
	dpPod, _ := k.pluginPod()

	// 1. The DRA plugin asks for every GPU: refused, the device plugin runs on.
	k.must("set", "env", "-n", "kube-system", "daemonset/gantry-dra", "GANTRY_DRA_DEVICES="+strings.Join(all, ","))
	restored := false
	t.Cleanup(func() {
		if !restored {
			restoreDRA()
		}
	})
	firstDP := host[0]
	var refusal string
	k.eventually(120*time.Second, "the DRA plugin's refusal in its log", func() string {
		if refusal = logs("gantry-dra"); !strings.Contains(refusal, "already offered by gantry-device-plugin") {
			return "log: " + refusal
		}
		return ""
	})
	k.eventually(60*time.Second, "a GPUOwnerConflict Event on the Node from the DRA plugin", func() string {
		if ev := events(); !strings.Contains(ev, "gantry-dra-plugin: GPU") || !strings.Contains(ev, firstDP) {
			return "events: " + ev
		}
		return ""
	})
	t.Logf("events: %s", events())
	if !strings.Contains(refusal, "GANTRY_DRA_DEVICES") || !strings.Contains(refusal, "GANTRY_DEVICES") || !strings.Contains(refusal, firstDP) {
		t.Errorf("the refusal does not name the GPUs and the settings:\n%s", refusal)
	}
	if p, _ := k.pluginPod(); p != dpPod || k.allocatable() != strconv.Itoa(dp) {
		t.Errorf("the device plugin was disturbed: pod %s (was %s), allocatable %s (was %d)", p, dpPod, k.allocatable(), dp)
	}
	restoreDRA()
	restored = true

	// 2. The device plugin asks for every GPU: refused, the DRA plugin
	// publishes on.
	k.must("set", "env", "-n", "kube-system", "daemonset/gantry", "GANTRY_DEVICES="+strings.Join(all, ","))
	t.Cleanup(func() {
		k.must("set", "env", "-n", "kube-system", "daemonset/gantry", "GANTRY_DEVICES="+dpDevices)
		k.must("rollout", "status", "-n", "kube-system", "daemonset/gantry", "--timeout=120s")
		k.eventually(120*time.Second, "nvidia.com/gpu back", func() string {
			if a := k.allocatable(); a != strconv.Itoa(dp) {
				return "allocatable " + a
			}
			return ""
		})
	})
	k.eventually(120*time.Second, "the device plugin's refusal in its log", func() string {
		if refusal = logs("gantry"); !strings.Contains(refusal, "already offered by gantry-dra-plugin") {
			return "log: " + refusal
		}
		return ""
	})
	t.Logf("device plugin: %s", refusal)
	k.eventually(60*time.Second, "a GPUOwnerConflict Event on the Node from the device plugin", func() string {
		if ev := events(); !strings.Contains(ev, "gantry-device-plugin: GPU") || !strings.Contains(ev, host[len(host)-1]) {
			return "events: " + ev
		}
		return ""
	})
	if n := gpusOf(k.draDevices()); n != draGPUs {
		t.Errorf("the DRA plugin publishes %d GPUs, was %d", n, draGPUs)
	}
}
